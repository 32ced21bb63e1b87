//! Graph inputs and outputs are named after the function's signature (nest
//! paths), and unknown dims are symbolic names that flow from the inputs to
//! the outputs whose dims equal them; the files still run in tract at
//! several sizes.

use crate::common;

use tracejit_onnx::pb::tensor_shape_proto::dimension::Value as Dim;
use tracejit_onnx::pb::{type_proto, ModelProto, ValueInfoProto};
use tracejit_onnx::Exporter;
use tracejit_tensor::DType;
use tracejit_trace::{function, Tensor, TensorSpec};

fn names(infos: &[ValueInfoProto]) -> Vec<&str> {
    infos.iter().map(|v| v.name()).collect()
}

/// Each dim of `v`: its size, or its symbolic name.
fn dims(v: &ValueInfoProto) -> Vec<String> {
    let Some(type_proto::Value::TensorType(t)) = &v.r#type.as_ref().unwrap().value else { panic!("a tensor") };
    t.shape
        .as_ref()
        .unwrap()
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(Dim::DimValue(n)) => n.to_string(),
            Some(Dim::DimParam(p)) => p.clone(),
            None => "<unnamed>".to_string(),
        })
        .collect()
}

fn model(cf: &tracejit_trace::ConcreteFunction) -> ModelProto {
    Exporter::new(cf).to_model().unwrap()
}

fn spec(dtype: DType, shape: &[i64]) -> TensorSpec {
    TensorSpec::new(dtype, shape)
}

#[test]
fn names_are_nest_paths() {
    let cf = function(|x: Tensor| x.exp()).get_concrete_function(spec(DType::F32, &[3])).unwrap();
    assert_eq!(cf.input_paths(), ["args"]);
    assert_eq!(cf.output_paths(), ["output"]);
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!((names(&g.input), names(&g.output)), (vec!["args"], vec!["output"]));

    let cf = function(|(a, b): (Tensor, Tensor)| (&a + &b, vec![a.exp(), b.exp()]))
        .get_concrete_function((spec(DType::F32, &[3]), spec(DType::F32, &[3])))
        .unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(names(&g.input), ["args.0", "args.1"]);
    assert_eq!(names(&g.output), ["output.0", "output.1[0]", "output.1[1]"]);

    let cf = function(|xs: Vec<Tensor>| (xs[0].clone() * 2.0, Some(xs[1].clone())))
        .get_concrete_function(vec![spec(DType::F32, &[2]), spec(DType::F32, &[2])])
        .unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(names(&g.input), ["args[0]", "args[1]"]);
    assert_eq!(names(&g.output), ["output.0", "output.1"], "an Option adds nothing to the path");
    let x = [Tensor::randn(&[2], 1), Tensor::randn(&[2], 2)];
    common::check("names_vec", &cf, &x, 1e-6);
}

#[test]
fn user_names_replace_the_paths_and_must_not_clash() {
    let cf = function(|(a, b): (Tensor, Tensor)| &a * &b)
        .get_concrete_function((spec(DType::F32, &[3]), spec(DType::F32, &[3])))
        .unwrap();
    let m = Exporter::new(&cf).input_names(["a", "b"]).to_model().unwrap();
    let g = m.graph.as_ref().unwrap();
    assert_eq!((names(&g.input), names(&g.output)), (vec!["a", "b"], vec!["output"]));
    let err = Exporter::new(&cf).input_names(["a", "b"]).output_names(["a"]).to_model().unwrap_err().to_string();
    assert!(err.contains("`a` names both an input and an output"), "{err}");
}

#[test]
fn an_unknown_batch_dim_flows_to_the_outputs() {
    let w = Tensor::randn(&[784, 10], 3) * 0.05;
    let f = function(move |(x, labels): (Tensor, Tensor)| {
        let flat = x.reshape(&[-1, 784]);
        let logits = flat.matmul(&w);
        let probs = tracejit_nn::softmax(&logits, -1);
        let picked = probs.transpose(&[1, 0]).gather(&labels, 1);
        let total = logits.sum(&[0], false);
        let both = Tensor::concat(&[logits.clone(), logits.clone()], 0);
        (probs, picked, total, both, logits.transpose(&[1, 0]))
    });
    let cf = f.get_concrete_function((spec(DType::F32, &[-1, 28, 28]), spec(DType::I64, &[-1]))).unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(dims(&g.input[0]), ["batch", "28", "28"]);
    assert_eq!(dims(&g.input[1]), ["batch_1"], "another input's batch may differ: a name of its own");
    assert_eq!(dims(&g.output[0]), ["batch", "10"], "reshape, matmul and the softmax composite keep it");
    assert_eq!(dims(&g.output[1]), ["10", "batch_1"], "gather takes the indices' dims");
    assert_eq!(dims(&g.output[2]), ["10"]);
    assert_eq!(dims(&g.output[3]), ["output.3_dim0", "10"], "a concatenated dim is a fresh name");
    assert_eq!(dims(&g.output[4]), ["10", "batch"]);

    let m = Exporter::new(&cf).dim_param("args.0", 0, "images").to_model().unwrap();
    let g = m.graph.as_ref().unwrap();
    assert_eq!(dims(&g.input[0]), ["images", "28", "28"]);
    assert_eq!(dims(&g.output[0]), ["images", "10"]);
    assert_eq!(dims(&g.input[1]), ["batch"]);

    for batch in [1usize, 5] {
        let x = Tensor::randn(&[batch, 28, 28], batch as u64);
        let labels = Tensor::from_vec((0..batch as i64).map(|i| i % 10).collect::<Vec<_>>(), &[batch]);
        common::check(&format!("batch_names_{batch}"), &cf, &[x, labels], 1e-5);
    }
}

#[test]
fn dims_that_may_differ_are_not_given_one_name() {
    // Two unknown dims that broadcast together may be 1 and n at run time.
    let cf = function(|(a, b): (Tensor, Tensor)| &a + &b)
        .get_concrete_function((spec(DType::F32, &[-1, 3]), spec(DType::F32, &[-1, 3])))
        .unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(dims(&g.output[0]), ["output_dim0", "3"]);
    // Against a known 1 the name survives; a slice of the axis is new.
    let cf = function(|(a, b): (Tensor, Tensor)| {
        (&a + &b, a.slice(&[tracejit_tensor::SliceSpec::range(0, 2), tracejit_tensor::SliceSpec::FULL]))
    })
    .get_concrete_function((spec(DType::F32, &[-1, 3]), spec(DType::F32, &[1, 3])))
    .unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(dims(&g.output[0]), ["batch", "3"]);
    assert_eq!(dims(&g.output[1]), ["output.1_dim0", "3"]);
    let a = Tensor::randn(&[4, 3], 1);
    let b = Tensor::randn(&[1, 3], 2);
    common::check("broadcast_names", &cf, &[a, b], 1e-6);
}

#[test]
fn loops_and_conditionals_keep_the_dims_they_do_not_change() {
    // The loop keeps `h`'s batch and its other unknown dim; a cond whose
    // branches both keep them passes them on.
    let cf = function(|(h, n): (Tensor, Tensor)| {
        let h = tracejit_trace::fori_loop(0, 3, |_i, h: Tensor| (&h * 0.5).tanh(), h);
        let k = tracejit_trace::cond(&n.sum_all().gt(0.0), || &h * 2.0, || h.clone());
        let shrunk =
            tracejit_trace::while_loop(|s: &Tensor| s.sum_all().gt(1.0), |s: Tensor| s.sum(&[1], true), k.clone());
        (h, k, shrunk)
    })
    .get_concrete_function((spec(DType::F32, &[-1, -1]), spec(DType::F32, &[2])))
    .unwrap();
    let m = model(&cf);
    let g = m.graph.as_ref().unwrap();
    assert_eq!(dims(&g.input[0]), ["batch", "dim_1"]);
    assert_eq!(dims(&g.output[0]), ["batch", "dim_1"]);
    assert_eq!(dims(&g.output[1]), ["batch", "dim_1"]);
    assert_eq!(dims(&g.output[2]), ["batch", "output.2_dim1"], "the body changes axis 1");
}
