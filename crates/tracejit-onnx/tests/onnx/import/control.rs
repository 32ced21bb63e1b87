//! `If` and `Loop`. A predicate computed from data becomes one `cond` node
//! (one trace serves both values; the branches read the enclosing graph's
//! values), a predicate known at trace time evaluates only the taken
//! branch (so the branches may differ in shape), and what a branch lacks
//! is refused at import. A `Loop` unrolls to its trip count or to where
//! its body's condition turns false, and refuses data conditions and
//! more than `MAX_UNROLL` iterations. `If`'s results are checked exactly
//! (each branch is one op, compared with the same op in f32); `Loop`'s
//! against f64 within its roundings.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_onnx::pb::{attribute_proto::AttributeType, AttributeProto, GraphProto, NodeProto, ValueInfoProto};
use tracejit_trace::{DType, Tensor};

use super::builder::*;

fn branch(name: &str, nodes: Vec<NodeProto>, output: ValueInfoProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        g: Some(GraphProto { name: Some(name.into()), node: nodes, output: vec![output], ..GraphProto::default() }),
        r#type: Some(AttributeType::Graph as i32),
        ..Default::default()
    }
}

/// `If(ReduceSum(x) > 0)`: then `x · 2`, else `x − 1` (`two`, `one`
/// initializers of the outer graph, read by the branches).
fn data_if(n: usize) -> Vec<u8> {
    let out = |name: &str| fixed(name, DType::F32, &[n]);
    model(
        vec![
            node("ReduceSum", "sum", &["x"], &["s"], vec![attr_i("keepdims", 0)]),
            node("Greater", "positive", &["s", "zero"], &["p"], vec![]),
            node(
                "If",
                "if",
                &["p"],
                &["y"],
                vec![
                    branch("then_branch", vec![node("Mul", "dbl", &["x", "two"], &["t"], vec![])], out("t")),
                    branch("else_branch", vec![node("Sub", "dec", &["x", "one"], &["e"], vec![])], out("e")),
                ],
            ),
        ],
        vec![fixed("x", DType::F32, &[n])],
        vec![out("y")],
        vec![
            init("zero", &Tensor::scalar(0.0f32)),
            init("two", &Tensor::scalar(2.0f32)),
            init("one", &Tensor::scalar(1.0f32)),
        ],
        13,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn a_data_predicate_is_one_cond_node(n in 1usize..6, seed in 0u64..10_000) {
        let model = import_bytes(&data_if(n)).unwrap();
        for sign in [1.0f32, -1.0] {
            let x = Tensor::from_vec(floats(&[n], seed, false).to_vec::<f32>().unwrap().iter().map(|v| sign * (v.abs() + 0.5)).collect(), &[n]);
            let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0).to_vec::<f32>().unwrap();
            let x = x.to_vec::<f32>().unwrap();
            let positive = x.iter().map(|&v| v as f64).sum::<f64>() > 0.0;
            let want: Vec<f32> = x.iter().map(|&v| if positive { v * 2.0 } else { v - 1.0 }).collect();
            prop_assert_eq!(y, want);
        }
        prop_assert_eq!(model.function().tracing_count(), 1, "one trace serves both predicate values");
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        prop_assert!(cf.optimized_graph().to_string().contains("cond"), "{}", cf.optimized_graph());
    }
}

/// A predicate from shapes (`Size(x) == 4`) picks a branch at trace time:
/// the branches may give different shapes, and only the taken one runs.
#[test]
fn a_known_predicate_takes_one_branch_of_any_shape() {
    let bytes = model(
        vec![
            node("Size", "size", &["x"], &["s"], vec![]),
            node("Equal", "is4", &["s", "four"], &["p"], vec![]),
            node(
                "If",
                "if",
                &["p"],
                &["y"],
                vec![
                    branch(
                        "then_branch",
                        vec![node("ReduceSum", "sum", &["x"], &["t"], vec![attr_i("keepdims", 0)])],
                        fixed("t", DType::F32, &[]),
                    ),
                    branch(
                        "else_branch",
                        vec![node("Neg", "neg", &["x"], &["e"], vec![])],
                        value("e", elem(DType::F32), &[None]),
                    ),
                ],
            ),
        ],
        vec![value("x", elem(DType::F32), &[None])],
        vec![value("y", elem(DType::F32), &[])],
        vec![init("four", &Tensor::scalar(4i64))],
        13,
    );
    let model = import_bytes(&bytes).unwrap();
    let four = model.run(&[Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4])]).unwrap().remove(0);
    assert_eq!((four.shape().to_vec(), four.to_vec::<f32>().unwrap()), (vec![], vec![10.0]));
    let three = model.run(&[Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])]).unwrap().remove(0);
    assert_eq!((three.shape().to_vec(), three.to_vec::<f32>().unwrap()), (vec![3], vec![-1.0, -2.0, -3.0]));
    for cf in model.function().concrete_functions() {
        assert!(!cf.optimized_graph().to_string().contains("cond"), "{}", cf.optimized_graph());
    }
}

#[test]
fn what_a_branch_lacks_is_refused_at_import_and_branches_that_disagree_at_run() {
    let mut base = tracejit_onnx::pb::ModelProto::default();
    {
        use prost::Message;
        base.merge(&data_if(3)[..]).unwrap();
    }
    let mut bad = base.clone();
    bad.graph.as_mut().unwrap().node[2].attribute[0].g.as_mut().unwrap().node[0].op_type = Some("Bernoulli".into());
    let e = import_bytes(&prost::Message::encode_to_vec(&bad)).unwrap_err().to_string();
    assert!(
        e.contains("If") && e.contains("'if'") && e.contains("then_branch") && e.contains("random ops cannot match"),
        "{e}"
    );
    // A data predicate with branches of different shapes cannot be one cond node.
    let mut differ = base;
    let else_graph = differ.graph.as_mut().unwrap().node[2].attribute[1].g.as_mut().unwrap();
    else_graph.node[0] = node("ReduceSum", "sum", &["x"], &["e"], vec![attr_i("keepdims", 0)]);
    let model = import_bytes(&prost::Message::encode_to_vec(&differ)).unwrap();
    let e = model.run(&[Tensor::ones(&[3], DType::F32)]).unwrap_err().to_string();
    assert!(e.contains("'if'") && e.contains("If"), "{e}");
    // A second call fails the same way: the failed trace left nothing behind.
    assert_eq!(model.run(&[Tensor::ones(&[3], DType::F32)]).unwrap_err().to_string(), e);
}

/// `Loop` with a trip count fed as a graph input (so static) and a
/// condition the body computes from the iteration number (`i < stop`,
/// `stop` read from the enclosing graph), a carried sum (`s + x · i`) and a
/// scan output (`s`), against the loop in f64.
fn loop_model(n: usize) -> Vec<u8> {
    let body = AttributeProto {
        name: Some("body".into()),
        g: Some(GraphProto {
            name: Some("body".into()),
            node: vec![
                node("Cast", "fi", &["i"], &["fi"], vec![attr_i("to", 1)]),
                node("Mul", "xi", &["x", "fi"], &["p"], vec![]),
                node("Add", "acc", &["s", "p"], &["s_out"], vec![]),
                node("Add", "next", &["i", "one"], &["i1"], vec![]),
                node("Less", "more", &["i1", "stop"], &["c_out"], vec![]),
                node("Identity", "emit", &["s_out"], &["y"], vec![]),
            ],
            input: vec![fixed("i", DType::I64, &[]), fixed("c", DType::Bool, &[]), fixed("s", DType::F32, &[n])],
            output: vec![
                fixed("c_out", DType::Bool, &[]),
                fixed("s_out", DType::F32, &[n]),
                fixed("y", DType::F32, &[n]),
            ],
            ..GraphProto::default()
        }),
        r#type: Some(AttributeType::Graph as i32),
        ..Default::default()
    };
    model(
        vec![node("Loop", "loop", &["m", "", "s0"], &["s_final", "ys"], vec![body])],
        vec![fixed("m", DType::I64, &[]), fixed("s0", DType::F32, &[n]), fixed("x", DType::F32, &[n])],
        vec![fixed("s_final", DType::F32, &[n]), value("ys", elem(DType::F32), &[None, Some(n as i64)])],
        vec![init("one", &Tensor::scalar(1i64)), init("stop", &Tensor::scalar(5i64))],
        13,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn loop_unrolls_to_the_trip_count_or_the_condition(n in 1usize..4, m in 1i64..9, seed in 0u64..10_000) {
        let model = import_bytes(&loop_model(n)).unwrap();
        assert_eq!(model.static_inputs(), ["m"]);
        let (s0, x) = (floats(&[n], seed, false), floats(&[n], seed + 1, true));
        let outs = model.run(&[Tensor::scalar(m), s0.clone(), x.clone()]).unwrap();
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let x: Vec<f64> = x.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        let mut s: Vec<f64> = s0.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        let mut mag: Vec<f64> = s.iter().map(|v| v.abs()).collect();
        let mut want = Vec::new();
        // The body runs while i < m and, after each step, i + 1 < 5.
        let steps = m.min(5);
        for i in 0..steps {
            for ((sv, mv), xv) in s.iter_mut().zip(mag.iter_mut()).zip(&x) {
                *sv += xv * i as f64;
                *mv += (xv * i as f64).abs();
            }
            // Each step rounds a product and a sum: 2(i + 1) roundings of the magnitudes.
            want.extend(s.iter().zip(&mag).map(|(&v, &mv)| (v, 2.0 * (i + 1) as f64 * f32::EPSILON as f64 * mv)));
        }
        let close = |got: &[f32], want: &[(f64, f64)]| {
            got.len() == want.len()
                && got.iter().zip(want).all(|(&g, &(w, b))| if w.is_nan() { g.is_nan() } else if w.is_infinite() { g as f64 == w } else { (g as f64 - w).abs() <= b })
        };
        prop_assert_eq!(outs[1].shape(), &[steps as usize, n]);
        prop_assert!(close(&outs[1].to_vec::<f32>().unwrap(), &want), "{:?} vs {:?}", outs[1], want);
        prop_assert!(close(&outs[0].to_vec::<f32>().unwrap(), &want[want.len() - n..]), "{:?} vs {:?}", outs[0], want);
    }
}

#[test]
fn a_loop_past_the_unroll_limit_or_with_a_data_condition_is_a_node_error() {
    let model = import_bytes(&loop_model(2)).unwrap();
    let s0 = Tensor::ones(&[2], DType::F32);
    // stop = 5 ends it early, so only a trip count with no stop would run long:
    // a data condition instead, then the limit with a constant-true body.
    let mut p = tracejit_onnx::pb::ModelProto::default();
    prost::Message::merge(&mut p, &loop_model(2)[..]).unwrap();
    let body = p.graph.as_mut().unwrap().node[0].attribute[0].g.as_mut().unwrap();
    body.node[4] = node("Greater", "more", &["s_out", "p"], &["c_out"], vec![]);
    let data = import_bytes(&prost::Message::encode_to_vec(&p)).unwrap();
    let e = data.run(&[Tensor::scalar(3i64), s0.clone(), s0.clone()]).unwrap_err().to_string();
    assert!(e.contains("'loop'") && e.contains("computed from data"), "{e}");
    let body = p.graph.as_mut().unwrap().node[0].attribute[0].g.as_mut().unwrap();
    body.node[4] = node("Identity", "more", &["c"], &["c_out"], vec![]);
    let long = import_bytes(&prost::Message::encode_to_vec(&p)).unwrap();
    let e = long.run(&[Tensor::scalar(5000i64), s0.clone(), s0.clone()]).unwrap_err().to_string();
    assert!(e.contains("'loop'") && e.contains("more than 4096"), "{e}");
    assert_eq!(model.run(&[Tensor::scalar(2i64), s0.clone(), s0]).unwrap()[1].shape(), [2, 2]);
}
