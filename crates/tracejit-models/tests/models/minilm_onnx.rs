//! all-MiniLM-L6-v2 as an ONNX file through tracejit's ONNX importer:
//!
//! - against ONNX Runtime's embeddings of the same ids (the fixture in
//!   `tests/data/minilm_onnx/`, made by `scripts/make_minilm_onnx_reference.py`
//!   from PyTorch's export): each component within `1e-3 · (|ort| + rms)`,
//!   as the importer's other real-model tests compare; the JIT runs the model,
//!   each layer's attention on the flash-attention kernel;
//! - against this crate's native BERT (`SentenceEncoder` over the model's
//!   own `model.safetensors`, the same weights): the two paths are different
//!   graphs (the file's ONNX ops against tracejit's composites) over the
//!   same f32 weights, so they agree to f32 rounding: within 1e-5 per
//!   component of the unit vectors (a 6-layer encoder's error is ~1e-7 of
//!   the hidden state's scale, measured ~2e-7 here).
//!
//! The file is `minilm-onnx-0/minilm.onnx` in the test data cache
//! (`$TRACEJIT_TEST_DATA`, default `~/.cache/tracejit`), written op by op
//! from the safetensors by `scripts/make_minilm_onnx.py` (`scripts/
//! fetch_test_data.sh minilm-onnx`, as CI runs it: no PyTorch needed);
//! `TRACEJIT_MINILM_ONNX=FILE` tests another export instead, e.g. PyTorch's
//! (`minilm.onnx` of shared/peers/models/make_models.py), which passes the
//! same checks. Needs the model directory of `scripts/fetch_minilm.sh` too;
//! run with `--ignored`. Without them the tests fail with those
//! instructions; they never skip.

use std::path::PathBuf;

use tracejit::onnx;
use tracejit::Tensor;
use tracejit_models::{Bert, SentenceEncoder};

fn cache() -> PathBuf {
    std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit"))
}

fn onnx_file() -> PathBuf {
    let path = std::env::var_os("TRACEJIT_MINILM_ONNX")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache().join("minilm-onnx-0/minilm.onnx"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_test_data.sh minilm-onnx (or set TRACEJIT_MINILM_ONNX)",
        path.display()
    );
    path
}

fn model_dir() -> PathBuf {
    let dir = cache().join("all-minilm-l6-v2-0.1.0");
    assert!(
        dir.join(".complete").exists(),
        "all-MiniLM-L6-v2 is not at {}: run scripts/fetch_minilm.sh first",
        dir.display()
    );
    dir
}

fn fixture(name: &str) -> Tensor {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm_onnx").join(format!("{name}.pb"));
    onnx::load_tensor(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The importer's embeddings of the fixture's ids, checked to come from the JIT.
fn imported_embeddings() -> Vec<f32> {
    let model = onnx::import(onnx_file()).unwrap();
    let out = model.run(&[fixture("input_ids"), fixture("attention_mask")]).unwrap();
    assert_eq!(out[0].shape(), [4, 384]);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit");
    // The six layers' attention, written out as MatMul, Mul, Add, Softmax
    // and MatMul in the file, runs as the flash-attention kernel.
    let graph = cf.optimized_graph().to_string();
    assert_eq!(graph.matches("kernel[\"tracejit.nn.scaled_dot_product_attention\"]").count(), 6, "{graph}");
    out[0].to_vec::<f32>().unwrap()
}

#[test]
#[ignore = "needs minilm.onnx: scripts/fetch_test_data.sh minilm-onnx, then --ignored"]
fn imported_minilm_matches_onnx_runtime() {
    let got = imported_embeddings();
    let want = fixture("sentence_embedding").to_vec::<f32>().unwrap();
    let rms = (want.iter().map(|w| f64::from(*w).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = f64::from((g - w).abs());
        assert!(err <= 1e-3 * (f64::from(w.abs()) + rms), "component {i}: {g} vs ONNX Runtime's {w}");
    }
}

#[test]
#[ignore = "needs minilm.onnx and the model: scripts/fetch_test_data.sh minilm minilm-onnx, then --ignored"]
fn imported_minilm_matches_the_native_encoder() {
    let got = imported_embeddings();
    let encoder = SentenceEncoder::new(Bert::load(model_dir()).unwrap());
    let native = encoder.embed_ids(&fixture("input_ids"), &fixture("attention_mask")).unwrap();
    let native = native.to_vec::<f32>().unwrap();
    let worst = got.iter().zip(&native).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-5, "the importer's and the native encoder's embeddings differ by {worst:e}");
    eprintln!("importer vs native encoder: largest difference {worst:e}");
}
