//! Train a small classifier with tracejit, export its forward pass to ONNX,
//! and serve the file elsewhere: ONNX Runtime, Triton Inference Server, or
//! tract.
//!
//! ```sh
//! cargo run --example export_onnx            # writes target/onnx-example/
//! python3 scripts/run_onnxruntime.py target/onnx-example/classifier
//! ```
//!
//! The model: 2 inputs -> 16 (tanh) -> 2 logits, then `tracejit::nn::softmax`
//! (exported as the ONNX local function `tracejit.nn.softmax`). The batch
//! dimension is `-1` in the input signature, so one file serves every batch
//! size.

use std::path::Path;

use tracejit::onnx::pb::tensor_shape_proto::dimension::Value as Dim;
use tracejit::onnx::pb::type_proto::Value as Type;
use tracejit::onnx::pb::ValueInfoProto;
use tracejit::optim::Optimizer;
use tracejit::prelude::*;

/// `y = x @ w + b`.
#[derive(Module, Clone)]
struct Dense {
    w: Variable,
    b: Variable,
}

impl Dense {
    fn new(inputs: usize, outputs: usize, seed: u64) -> Dense {
        Dense {
            w: Variable::new(Tensor::randn(&[inputs, outputs], seed) * (1.0 / (inputs as f64).sqrt())),
            b: Variable::new(Tensor::zeros(&[outputs], DType::F32)),
        }
    }
}

#[derive(Module, Clone)]
struct Classifier {
    hidden: Dense,
    out: Dense,
}

impl Classifier {
    fn logits(&self, x: &Tensor) -> Tensor {
        let h = (x.matmul(&self.hidden.w.read()) + self.hidden.b.read()).tanh();
        h.matmul(&self.out.w.read()) + self.out.b.read()
    }
}

/// Points inside the unit circle are class 1, outside class 0.
fn data(n: usize, seed: u64) -> (Tensor, Tensor) {
    let x = Tensor::rand_uniform(&[n, 2], -1.5, 1.5, seed);
    let inside = (&x * &x).sum(&[1], false).lt(1.0);
    (x, inside.cast(DType::I64).one_hot(2, DType::F32))
}

fn describe(kind: &str, info: &ValueInfoProto) -> String {
    let Some(Type::TensorType(t)) = info.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return format!("{kind} {}: not a tensor", info.name());
    };
    let dims: Vec<String> = t
        .shape
        .iter()
        .flat_map(|s| &s.dim)
        .map(|d| match &d.value {
            Some(Dim::DimValue(n)) => n.to_string(),
            Some(Dim::DimParam(p)) => p.clone(),
            None => "?".into(),
        })
        .collect();
    let dtype = tracejit::onnx::pb::tensor_proto::DataType::try_from(t.elem_type())
        .map(|d| d.as_str_name().to_lowercase())
        .unwrap_or_default();
    format!("{kind} {:<8} {dtype}[{}]", info.name(), dims.join(", "))
}

#[path = "common/logging.rs"]
mod logging;

fn main() -> anyhow::Result<()> {
    logging::init();
    let model = Classifier { hidden: Dense::new(2, 16, 1), out: Dense::new(16, 2, 2) };
    let vars = model.trainable_variables();

    // Training: forward, backward and the SGD update traced into one graph.
    let m = model.clone();
    let opt = tracejit::optim::Sgd::new(0.5);
    let step = function(move |(x, y): (Tensor, Tensor)| {
        let loss_fn = || tracejit::nn::softmax_cross_entropy_with_logits(&m.logits(&x), &y).mean(&[0], false);
        let (loss, grads) = tracejit::autodiff::value_and_grad(&vars, loss_fn).expect("differentiable");
        opt.apply_gradients(&grads, &vars);
        loss
    });
    let (x, y) = data(256, 7);
    for i in 0..=300 {
        let loss = step.call((x.clone(), y.clone()))?;
        if i % 100 == 0 {
            println!("step {i:>3}: loss {:.4}", loss.to_scalar::<f32>()?);
        }
    }

    // The serving function: probabilities for any batch size.
    let m = model.clone();
    let predict = function(move |x: Tensor| tracejit::nn::softmax(&m.logits(&x), -1))
        .name("classifier")
        .input_signature(vec![TensorSpec::new(DType::F32, &[-1, 2])]);
    let cf = predict.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 2]))?;

    let dir = Path::new("target/onnx-example");
    let exporter = tracejit::onnx::Exporter::new(&cf)
        .input_names(["points"])
        .output_names(["probs"])
        .variable_names(model.named_variables());
    let (test_x, _) = data(5, 99);
    exporter.save_test_case(&[test_x], dir.join("classifier"))?;
    let onnx = tracejit::onnx::decode(&std::fs::read(dir.join("classifier/model.onnx"))?)?;
    let graph = onnx.graph.as_ref().expect("a graph");
    println!(
        "\nwrote {}/classifier/model.onnx (IR {}, opset {})",
        dir.display(),
        onnx.ir_version(),
        tracejit::onnx::OPSET
    );
    for info in &graph.input {
        println!("  {}", describe("input ", info));
    }
    for info in &graph.output {
        println!("  {}", describe("output", info));
    }
    let inits: Vec<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    println!("  initializers (Module paths): {}", inits.join(", "));
    for f in &onnx.functions {
        println!("  local function {}.{} ({} nodes)", f.domain(), f.name(), f.node.len());
    }

    // Triton's model repository: <repo>/<model>/config.pbtxt and <repo>/<model>/1/model.onnx.
    let triton = dir.join("triton/classifier");
    std::fs::create_dir_all(triton.join("1"))?;
    std::fs::copy(dir.join("classifier/model.onnx"), triton.join("1/model.onnx"))?;
    std::fs::write(
        triton.join("config.pbtxt"),
        "name: \"classifier\"\nbackend: \"onnxruntime\"\nmax_batch_size: 0\n\
         input [ { name: \"points\", data_type: TYPE_FP32, dims: [ -1, 2 ] } ]\n\
         output [ { name: \"probs\", data_type: TYPE_FP32, dims: [ -1, 2 ] } ]\n",
    )?;
    println!(
        "\nServe it:\n\
         - ONNX Runtime (Python): sess = onnxruntime.InferenceSession(\"{0}/classifier/model.onnx\");\n\
         \x20 sess.run(None, {{\"points\": np.array([[0.1, 0.2]], np.float32)}})\n\
         - check it there: python3 scripts/run_onnxruntime.py {0}/classifier\n\
         - Triton: the model repository is {0}/triton (config.pbtxt + 1/model.onnx);\n\
         \x20 tritonserver --model-repository={0}/triton",
        dir.display()
    );
    Ok(())
}
