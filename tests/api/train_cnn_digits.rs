//! `examples/train_cnn_digits.rs` in short: the same CNN, data and
//! training step (the example's `cnn_digits` module), trained for a few
//! epochs: the loss falls and the held-out accuracy beats 95%, the
//! checkpoint holds batch norm's moving statistics and a resumed run
//! predicts as the trained one, and the exported ONNX file gives tract's
//! (and, where Python has it, ONNX Runtime's) logits equal to tracejit's
//! on the test images.

#[path = "../../examples/cnn_digits/mod.rs"]
mod cnn_digits;

// The MLP example's module, loaded once for both tests.
use crate::train_digits::digits;

use cnn_digits::{Config, Trainer};
use digits::{Dataset, DATA};
use tracejit::prelude::*;
use tract_onnx::prelude::{DatumType, Framework, InferenceFact, InferenceModelExt, IntoRunnable};

fn short(epochs: usize) -> Config {
    Config { epochs, ..Config::default() }
}

/// Logits of `x [n, 64]` from ONNX `bytes` run in tract.
fn tract_logits(bytes: &[u8], x: &[f32], n: usize) -> Vec<f32> {
    let mut model = tract_onnx::onnx().model_for_read(&mut &bytes[..]).unwrap();
    model.set_input_fact(0, InferenceFact::dt_shape(DatumType::F32, [n, 64])).unwrap();
    let plan = model.into_optimized().unwrap().into_runnable().unwrap();
    let input = tract_onnx::prelude::Tensor::from_shape(&[n, 64], x).unwrap();
    let out = plan.run(std::iter::once(input.into()).collect()).unwrap();
    out[0].to_plain_array_view::<f32>().unwrap().iter().copied().collect()
}

#[test]
fn a_short_run_learns_exports_and_resumes() {
    let data = Dataset::load(DATA).unwrap();
    let t = Trainer::new(short(3), &data, true).unwrap();
    let mut losses = Vec::new();
    while t.state.epochs_done().unwrap() < 3 {
        t.run_epoch(|s| losses.push(s.loss)).unwrap();
    }
    let first: f32 = losses[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
    assert!(last < 0.5 * first, "the loss falls: {first} -> {last}");
    let (_, accuracy) = t.evaluate(&t.test).unwrap();
    assert!(accuracy > 0.95, "held-out accuracy {accuracy}");
    assert_eq!(t.compiled.as_ref().unwrap().tracing_count(), 1, "one trace for every step");
    // Training moved the moving statistics off their initial 0 and 1.
    let mean = t.state.model.conv1.mean.value().to_vec::<f32>().unwrap();
    assert!(mean.iter().any(|&m| m != 0.0), "{mean:?}");

    // The exported net: tract's logits are tracejit's.
    let predictor = t.predictor().unwrap();
    let (x, _) = t.test.tensors();
    let want = predictor.call_flat(std::slice::from_ref(&x)).unwrap().remove(0).to_vec::<f32>().unwrap();
    let bytes = tracejit::onnx::to_bytes(&predictor).unwrap();
    let got = tract_logits(&bytes, &t.test.images, t.test.len());
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "logit {i}: tract {g} vs tracejit {w}");
    }
    onnxruntime_agrees(&predictor, &x);

    // A checkpoint restores the statistics: a fresh trainer predicts alike.
    let dir = std::env::temp_dir().join(format!("tracejit-cnn-digits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("checkpoint.safetensors");
    t.save(&path).unwrap();
    let saved = tracejit::checkpoint::read(&path).unwrap();
    assert!(saved.keys().any(|k| k.contains("conv1") && k.ends_with("mean")), "{:?}", saved.keys());
    let resumed = Trainer::new(short(3), &data, true).unwrap();
    resumed.restore(&path).unwrap();
    assert_eq!(resumed.evaluate(&resumed.test).unwrap(), t.evaluate(&t.test).unwrap());
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs the exported case in ONNX Runtime through
/// `scripts/run_onnxruntime.py` when Python has `onnxruntime`; says so
/// and returns otherwise (tract checked the file above).
fn onnxruntime_agrees(predictor: &ConcreteFunction, x: &Tensor) {
    let has_ort = std::process::Command::new("python3")
        .args(["-c", "import onnx, onnxruntime"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_ort {
        eprintln!("note: python3 with onnx and onnxruntime not found; the ONNX Runtime check is skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracejit-cnn-digits-ort-{}", std::process::id()));
    tracejit::onnx::Exporter::new(predictor).save_test_case(std::slice::from_ref(x), &dir).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/run_onnxruntime.py");
    let out = std::process::Command::new("python3").arg(script).arg(&dir).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
