//! all-MiniLM-L6-v2 exported to ONNX by PyTorch (`minilm.onnx` of
//! shared/peers/models/make_models.py), through tracejit's ONNX importer:
//!
//! - against ONNX Runtime's embeddings of the same ids (the fixture in
//!   `tests/data/minilm_onnx/`, made by `scripts/make_minilm_onnx_reference.py`):
//!   each component within `1e-3 · (|ort| + rms)`, as the importer's other
//!   real-model tests compare; the JIT runs the model;
//! - against this crate's native BERT (`SentenceEncoder` over the model's
//!   own `model.safetensors`, the same weights): the two paths are different
//!   graphs (PyTorch's exported ops against tracejit's composites) over the
//!   same f32 weights, so they agree to f32 rounding: within 1e-5 per
//!   component of the unit vectors (a 6-layer encoder's error is ~1e-7 of
//!   the hidden state's scale, measured ~2e-7 here).
//!
//! Needs `minilm.onnx` in `$TRACEJIT_PEERS_MODELS` (default
//! `~/.cache/tracejit-peers/models`, make_models.py writes it) and the model
//! directory of `scripts/fetch_minilm.sh`; run with `--ignored`. Without
//! them the tests fail with those instructions; they never skip.

use std::path::PathBuf;

use tracejit::onnx;
use tracejit::Tensor;
use tracejit_models::{Bert, SentenceEncoder};

fn onnx_file() -> PathBuf {
    let dir = std::env::var_os("TRACEJIT_PEERS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit-peers/models"));
    let path = dir.join("minilm.onnx");
    assert!(
        path.exists(),
        "{} is missing: run shared/peers/models/make_models.py (or set TRACEJIT_PEERS_MODELS)",
        path.display()
    );
    path
}

fn model_dir() -> PathBuf {
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit"));
    let dir = root.join("all-minilm-l6-v2-0.1.0");
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
    assert_eq!(model.function().concrete_functions()[0].executor_kind(), "jit");
    out[0].to_vec::<f32>().unwrap()
}

#[test]
#[ignore = "needs minilm.onnx (shared/peers/models/make_models.py), then --ignored"]
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
#[ignore = "needs minilm.onnx (shared/peers/models/make_models.py) and scripts/fetch_minilm.sh, then --ignored"]
fn imported_minilm_matches_the_native_encoder() {
    let got = imported_embeddings();
    let encoder = SentenceEncoder::new(Bert::load(model_dir()).unwrap());
    let native = encoder.embed_ids(&fixture("input_ids"), &fixture("attention_mask")).unwrap();
    let native = native.to_vec::<f32>().unwrap();
    let worst = got.iter().zip(&native).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-5, "the importer's and the native encoder's embeddings differ by {worst:e}");
    eprintln!("importer vs native encoder: largest difference {worst:e}");
}
