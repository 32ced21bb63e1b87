//! The verifier accepts what `add_node` builds and rejects hand-broken graphs,
//! naming the node.

use std::sync::Arc;

use smallvec::smallvec;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{verify, AssignKind, FuncId, Graph, IrError, LibraryFunction, Node, NodeId, Op, ValueId, VarId};

use crate::common::{f32t, node, node_ctrl, TestVar};

/// A well-formed graph using most features: params, a constant, elementwise
/// and reduce ops, a call, variable reads and writes with control inputs.
pub fn sample_graph() -> Graph {
    let mut inner = Graph::new("inner");
    let x = inner.add_param(f32t(&[-1, 3]));
    let y = node(&mut inner, Op::Unary(UnaryOp::Tanh), &[x]);
    inner.outputs = vec![y];

    let mut g = Graph::new("sample");
    let attrs = tracejit_ir::FunctionAttrs::implementing("tracejit.test.tanh");
    let f = g.library.add(LibraryFunction { name: "inner".into(), attrs, graph: Arc::new(inner) });
    let w = g.add_variable(TestVar::new("w", Storage::full(&[3], DType::F32, 1.0)));

    let a = g.add_param(f32t(&[-1, 3]));
    let half = g.add_constant(Storage::scalar(0.5f32));
    let m = node(&mut g, Op::Binary(BinaryOp::Mul), &[a, half]);
    let c = node(&mut g, Op::Call { func: f }, &[m]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: false }, &[c]);
    let asg = node_ctrl(&mut g, Op::AssignVariable { var: w, kind: AssignKind::Add, locked: false }, &[s], &[]);
    let r = node_ctrl(&mut g, Op::ReadVariable { var: w, locked: false }, &[], &[asg]);
    let out = node(&mut g, Op::Binary(BinaryOp::Add), &[c, ValueId::from(r)]);
    g.outputs = vec![out, s];
    g
}

#[track_caller]
fn rejects(g: &Graph, node: u32, parts: &[&str]) {
    match verify(g) {
        Err(e @ IrError::Verifier { .. }) => {
            let IrError::Verifier { node: n, .. } = &e else { unreachable!() };
            assert_eq!(*n, NodeId::from_u32(node), "{e}");
            let msg = e.to_string();
            assert!(msg.contains("this is a bug in tracejit"), "{msg}");
            for p in parts {
                assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
            }
        }
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

#[test]
fn accepts_graphs_built_with_add_node() {
    verify(&sample_graph()).unwrap();
    verify(&Graph::new("empty")).unwrap();
}

#[test]
fn rejects_wrong_output_type() {
    let mut g = sample_graph();
    // node 2 is the mul
    g.node_mut(NodeId::from_u32(2)).outputs = smallvec![f32t(&[2, 3])];
    rejects(&g, 2, &["mul declares output types (f32[2, 3])", "inference gives (f32[?, 3])", "`sample`"]);
}

#[test]
fn rejects_wrong_output_count() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).outputs.push(f32t(&[]));
    rejects(&g, 2, &["declares output types"]);
}

#[test]
fn rejects_forward_reference() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).inputs[0] = ValueId::from(NodeId::from_u32(5));
    rejects(&g, 2, &["input 0 (%5) does not refer to an earlier node"]);
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).inputs[0] = ValueId::from(NodeId::from_u32(2));
    rejects(&g, 2, &["earlier node"]);
}

#[test]
fn rejects_bad_output_index() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).inputs[0] = ValueId::new(NodeId::from_u32(0), 1);
    rejects(&g, 2, &["%0.1"]);
}

#[test]
fn rejects_forward_control_input() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).control_inputs.push(NodeId::from_u32(6));
    rejects(&g, 2, &["control input n6"]);
}

#[test]
fn rejects_inference_errors() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(2)).op = Op::Binary(BinaryOp::LogicalAnd);
    rejects(&g, 2, &["shape inference rejects the node", "logical_and"]);
}

#[test]
fn rejects_unknown_function_and_variable() {
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(3)).op = Op::Call { func: FuncId::from_u32(3) };
    rejects(&g, 3, &["unknown function f3"]);
    let mut g = sample_graph();
    g.node_mut(NodeId::from_u32(6)).op = Op::ReadVariable { var: VarId::from_u32(2), locked: false };
    rejects(&g, 6, &["unknown variable var2"]);
}

#[test]
fn rejects_bad_params() {
    // A Parameter node that is not listed in params.
    let mut g = Graph::new("p");
    let a = g.add_param(f32t(&[2]));
    g.push_node(Node {
        op: Op::Parameter { index: 1 },
        inputs: smallvec![],
        control_inputs: smallvec![],
        outputs: smallvec![f32t(&[2])],
        location: None,
    });
    g.outputs = vec![a];
    rejects(&g, 1, &["parameter 1 is not listed as params[1]"]);

    // params in the wrong order.
    let mut g = Graph::new("p");
    g.add_param(f32t(&[2]));
    g.add_param(f32t(&[3]));
    g.params.swap(0, 1);
    rejects(&g, 0, &["params[0]"]);

    // params naming a non-parameter node.
    let mut g = Graph::new("p");
    let a = g.add_param(f32t(&[2]));
    let n = node(&mut g, Op::Unary(UnaryOp::Neg), &[a]);
    g.params.push(n.node);
    rejects(&g, 1, &["params[1] is not a `Parameter { index: 1 }` node"]);

    // params naming a missing node.
    let mut g = Graph::new("p");
    g.params.push(NodeId::from_u32(4));
    rejects(&g, 4, &["params[0] refers to a missing node"]);
}

#[test]
fn rejects_missing_outputs() {
    let mut g = sample_graph();
    g.outputs.push(ValueId::from(NodeId::from_u32(40)));
    rejects(&g, 40, &["graph output 2 (%40) does not exist"]);
    let mut g = sample_graph();
    g.outputs.push(ValueId::new(NodeId::from_u32(2), 1));
    rejects(&g, 2, &["graph output 2 (%2.1) does not exist"]);
}

#[test]
fn verifies_library_graphs() {
    let mut g = sample_graph();
    let (_, f) = g.library.iter().next().unwrap();
    let mut inner = (*f.graph).clone();
    inner.node_mut(NodeId::from_u32(1)).outputs = smallvec![f32t(&[9])];
    let broken = LibraryFunction { name: f.name.clone(), attrs: f.attrs.clone(), graph: Arc::new(inner) };
    let mut lib = tracejit_ir::FunctionLibrary::default();
    lib.add(broken);
    g.library = lib;
    // The caller's call node also no longer matches the callee's output type,
    // so verify the callee directly through a fresh caller.
    let mut caller = Graph::new("caller");
    caller.library = g.library.clone();
    match verify(&caller) {
        Err(IrError::Verifier { graph, node, .. }) => {
            assert_eq!(graph, "inner");
            assert_eq!(node, NodeId::from_u32(1));
        }
        other => panic!("expected a verifier error, got {other:?}"),
    }
    // The sample graph's call node now disagrees with the callee's output type.
    rejects(&g, 3, &["call declares output types (f32[?, 3])", "f32[9]"]);
}
