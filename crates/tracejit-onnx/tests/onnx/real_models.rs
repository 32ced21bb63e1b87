//! The nine `light` ImageNet models of onnx 1.22.0 (AlexNet, DenseNet-121,
//! Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512)
//! through the importer, against ONNX Runtime's outputs on the same input.
//!
//! `scripts/make_light_models.py` (run by `scripts/fetch_test_data.sh`)
//! gives their placeholder weights seeded random values (ResNet-50's file
//! is W14's `resnet50.onnx`, byte for byte) and stores, per model, a seeded
//! input and ONNX Runtime's logits: the final Softmax's input, since with
//! random weights the softmax is one-hot. The test exposes the same value
//! as an extra graph output, imports the model, runs it (the JIT must run
//! it) and compares:
//!
//! - the logits, each element within `1e-3 * (|ort| + scale)` where
//!   `scale` is the logits' RMS. Why a scale term: f32 convolutions summed
//!   in another order differ by about `sqrt(K) * 2^-24` of the magnitude of
//!   their *terms*, not of their result, and a logit near zero is a
//!   cancellation of terms as large as the typical logit. Over a 50-layer
//!   network the relative error measured against ORT stays under 1e-5 of
//!   the RMS (see the assertion message), so 1e-3 leaves two orders of
//!   magnitude for other CPUs' summation orders (AVX2's 8 lanes);
//! - the argmax, and the model's own output at the same tolerance.
//!
//! Needs the data: `scripts/fetch_test_data.sh light-models`, then
//! `cargo test --workspace --test onnx -- --ignored real_models::`. Without it
//! the tests fail with that instruction; they never skip.

use std::path::PathBuf;

use prost::Message;
use tracejit_onnx::pb::{type_proto, ModelProto, TensorProto, TypeProto, ValueInfoProto};
use tracejit_trace::Tensor;

/// The directory `scripts/make_light_models.py` writes (its version suffix
/// changes when the script's output does).
fn models_dir() -> PathBuf {
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit"));
    let dir = root.join("light-models-0");
    assert!(
        dir.join(".complete").exists(),
        "the light ImageNet models are not in {}: run scripts/fetch_test_data.sh light-models first",
        dir.display()
    );
    dir
}

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The model with its logits value (named by `logits.pb`) as an extra
/// graph output, unless it is the output already.
fn with_logits_output(mut model: ModelProto, logits: &str) -> ModelProto {
    let graph = model.graph.as_mut().expect("a graph");
    if graph.output.iter().all(|o| o.name() != logits) {
        graph.output.push(ValueInfoProto {
            name: Some(logits.to_string()),
            r#type: Some(TypeProto {
                denotation: None,
                value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(1), shape: None })),
            }),
            ..ValueInfoProto::default()
        });
    }
    model
}

/// Whether `got` matches `want` elementwise within `rtol * (|want| + rms(want))`;
/// the worst element's error relative to the RMS either way.
fn close(got: &[f32], want: &[f32], rtol: f64) -> (bool, f64) {
    assert_eq!(got.len(), want.len());
    let rms = (want.iter().map(|w| f64::from(*w).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let mut ok = true;
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (f64::from(*g), f64::from(*w));
        let err = (g - w).abs();
        ok &= err <= rtol * (w.abs() + rms);
        worst = worst.max(if err.is_nan() { f64::INFINITY } else { err / rms });
    }
    (ok, worst)
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, x)| if *x > v[best] { i } else { best })
}

fn check_model(name: &str) {
    let dir = models_dir();
    let proto = ModelProto::decode(read(dir.join(format!("{name}.onnx")).as_path()).as_slice()).expect("a model");
    let logits_pb = TensorProto::decode(read(&dir.join(name).join("logits.pb")).as_slice()).expect("a tensor");
    let logits_name = logits_pb.name().to_string();
    let want_logits = tracejit_onnx::load_tensor(dir.join(name).join("logits.pb")).unwrap();
    let want_out = tracejit_onnx::load_tensor(dir.join(name).join("output_0.pb")).unwrap();
    let x = tracejit_onnx::load_tensor(dir.join(name).join("input_0.pb")).unwrap();

    let model = tracejit_onnx::import::import_proto(&with_logits_output(proto, &logits_name))
        .unwrap_or_else(|e| panic!("{name}: import: {e}"));
    let outs: Vec<Tensor> = model.run(&[x]).unwrap_or_else(|e| panic!("{name}: run: {e}"));
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{name}: the JIT runs the model");

    let got_logits = outs.last().unwrap();
    assert_eq!(got_logits.shape(), want_logits.shape(), "{name}: logits' shape");
    let (g, w) = (got_logits.to_vec::<f32>().unwrap(), want_logits.to_vec::<f32>().unwrap());
    let (ok, worst) = close(&g, &w, 1e-3);
    assert!(ok, "{name}: logits differ from ONNX Runtime's: worst error {worst:.3e} of their RMS");
    assert_eq!(argmax(&g), argmax(&w), "{name}: the top class");
    eprintln!("{name}: logits within {worst:.2e} of their RMS of ONNX Runtime's");

    assert_eq!(outs[0].shape(), want_out.shape(), "{name}: output's shape");
    let (ok, worst) = close(&outs[0].to_vec::<f32>().unwrap(), &want_out.to_vec::<f32>().unwrap(), 1e-3);
    assert!(ok, "{name}: output differs from ONNX Runtime's: worst error {worst:.3e} of its RMS");
}

macro_rules! real_model_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        #[ignore = "needs the light models: scripts/fetch_test_data.sh light-models, then --ignored"]
        fn $test() {
            check_model($name);
        }
    )*};
}

real_model_tests! {
    alexnet => "bvlc_alexnet",
    densenet121 => "densenet121",
    inception_v1 => "inception_v1",
    inception_v2 => "inception_v2",
    resnet50 => "resnet50",
    shufflenet => "shufflenet",
    squeezenet => "squeezenet",
    vgg19 => "vgg19",
    zfnet512 => "zfnet512",
}
