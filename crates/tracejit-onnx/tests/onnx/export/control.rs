//! Control flow exported as ONNX `If` and `Loop`. tract runs `If`; it has
//! no `Loop`, so loops are checked for structure here and run in
//! onnxruntime through the saved cases (`scripts/run_onnxruntime.py`).

use crate::common;

use tracejit_onnx::Exporter;
use tracejit_tensor::DType;
use tracejit_trace::{cond, fori_loop, function, while_loop, Tensor, TensorSpec, Variable};

fn spec(t: &Tensor) -> TensorSpec {
    TensorSpec::new(t.dtype(), &t.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
}

/// The op types of the main graph's nodes.
fn main_ops(cf: &tracejit_trace::ConcreteFunction) -> Vec<String> {
    let model = Exporter::new(cf).to_model().unwrap();
    model.graph.unwrap().node.iter().map(|n| n.op_type().to_string()).collect()
}

#[test]
fn cond_is_an_if_that_runs_both_ways() {
    let scale = Variable::new(Tensor::from_vec(vec![3.0f32, 4.0, 5.0], &[3])).with_name("scale");
    let s = scale.clone();
    let f = function(move |x: Tensor| {
        let y = cond(&x.sum_all().gt(0.0), || &x * s.read(), || (&x - 1.0).exp());
        (y, x.clone())
    })
    .name("branchy");
    let x = Tensor::from_vec(vec![1.0f32, 2.0, -0.5], &[3]);
    let cf = f.get_concrete_function(spec(&x)).unwrap();
    assert!(main_ops(&cf).contains(&"If".to_string()), "{:?}", main_ops(&cf));
    let model = Exporter::new(&cf).to_model().unwrap();
    let inits: Vec<&str> = model.graph.as_ref().unwrap().initializer.iter().map(|t| t.name()).collect();
    assert!(inits.contains(&"scale"), "the variable read in a branch is a main-graph initializer: {inits:?}");
    common::check("cond_positive", &cf, std::slice::from_ref(&x), 1e-6);
    let negative = Tensor::from_vec(vec![-1.0f32, -2.0, 0.5], &[3]);
    common::check("cond_negative", &cf, &[negative], 1e-6);
}

#[test]
fn cond_with_a_composite_in_a_branch() {
    let f = function(|(p, x): (Tensor, Tensor)| cond(&p, || tracejit_nn::gelu(&x), || x.relu()));
    let x = Tensor::randn(&[2, 3], 1);
    let cf = f.get_concrete_function((TensorSpec::new(DType::Bool, &[]), spec(&x))).unwrap();
    let model = Exporter::new(&cf).to_model().unwrap();
    assert_eq!(model.functions.len(), 1, "gelu stays a local function inside the branch");
    for p in [true, false] {
        common::check(&format!("cond_gelu_{p}"), &cf, &[Tensor::scalar(p), x.clone()], 1e-5);
    }
}

#[test]
fn loops_are_onnx_loops() {
    // fori_loop: a static trip count (M) plus the condition.
    let f = function(|h: Tensor| fori_loop(0, 5, |t, h: Tensor| (&h * 0.5).tanh() + t.cast(DType::F32), h));
    let h = Tensor::randn(&[4], 1);
    let cf = f.get_concrete_function(spec(&h)).unwrap();
    let model = Exporter::new(&cf).to_model().unwrap();
    let graph = model.graph.as_ref().unwrap();
    let lp = graph.node.iter().find(|n| n.op_type() == "Loop").expect("a Loop node");
    assert!(!lp.input[0].is_empty(), "the trip count is M");
    let body = lp.attribute[0].g.as_ref().unwrap();
    assert_eq!(body.input.len(), 2 + 2, "iteration, condition, and the carried (counter, h)");
    assert_eq!(body.output.len(), 1 + 2);
    common::save_case("fori_loop", &cf, &[h]);

    // while_loop: a data-dependent trip count, no M.
    let f = function(|x: Tensor| {
        let (n, y) = while_loop(
            |(_, y): &(Tensor, Tensor)| y.sum(&[0], false).le(100.0),
            |(i, y): (Tensor, Tensor)| (i + 1, y * 2.0),
            (Tensor::scalar(0i64), x),
        );
        (n, y)
    });
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let cf = f.get_concrete_function(spec(&x)).unwrap();
    let model = Exporter::new(&cf).to_model().unwrap();
    let lp = model.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "Loop").expect("a Loop node");
    assert!(lp.input[0].is_empty(), "no trip count");
    common::save_case("while_loop", &cf, &[x]);

    // W8-shaped: an RNN over a sequence, x[t] gathered in the body.
    let (xs, wx, wh, b) = (
        Tensor::randn(&[6, 4, 8], 30),
        Tensor::randn(&[8, 16], 31) * 0.3,
        Tensor::randn(&[16, 16], 32) * 0.25,
        Tensor::randn(&[16], 33) * 0.1,
    );
    let f = function(|(xs, wx, wh, b): (Tensor, Tensor, Tensor, Tensor)| {
        let h0 = Tensor::zeros(&[4, 16], DType::F32);
        fori_loop(0, 6, |t, h: Tensor| (xs.gather(&t, 0).matmul(&wx) + h.matmul(&wh) + &b).tanh(), h0)
    });
    let cf = f.get_concrete_function((spec(&xs), spec(&wx), spec(&wh), spec(&b))).unwrap();
    assert!(main_ops(&cf).contains(&"Loop".to_string()));
    common::save_case("w8_rnn_loop", &cf, &[xs, wx, wh, b]);
}

#[test]
fn an_assignment_inside_a_branch_is_an_error() {
    let v = Variable::new(Tensor::zeros(&[2], DType::F32)).with_name("acc");
    let v2 = v.clone();
    let f = function(move |(p, x): (Tensor, Tensor)| {
        cond(
            &p,
            || {
                v2.assign_add(&x);
                x.clone()
            },
            || x.clone(),
        )
    });
    let cf = f.get_concrete_function((TensorSpec::new(DType::Bool, &[]), TensorSpec::new(DType::F32, &[2]))).unwrap();
    let msg = tracejit_onnx::to_bytes(&cf).unwrap_err().to_string();
    assert!(msg.contains("assign_variable") && msg.contains("acc"), "{msg}");
}
