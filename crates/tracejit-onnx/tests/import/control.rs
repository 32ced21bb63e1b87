//! `If`: a predicate computed from data becomes one `cond` node (one trace
//! serves both values; the branches read the enclosing graph's values), a
//! predicate known at trace time evaluates only the taken branch (so the
//! branches may differ in shape), and what a branch lacks is refused at
//! import. Results are checked exactly (each branch is one exact op or a
//! single rounding, compared with the same rounding in f32).

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_onnx::pb::{attribute_proto::AttributeType, AttributeProto, GraphProto, NodeProto, ValueInfoProto};
use tracejit_trace::{DType, Tensor};

use crate::builder::*;

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
    bad.graph.as_mut().unwrap().node[2].attribute[0].g.as_mut().unwrap().node[0].op_type = Some("Atan".into());
    let e = import_bytes(&prost::Message::encode_to_vec(&bad)).unwrap_err().to_string();
    assert!(
        e.contains("If") && e.contains("'if'") && e.contains("then_branch") && e.contains("needs primitive atan"),
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
