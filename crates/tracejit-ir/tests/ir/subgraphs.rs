//! Ops that hold graphs (`Op::subgraphs`) and op effects (`Op::effects`):
//! passes reach nested code through the one interface, and an op whose
//! nested code has an effect is never merged, folded or dropped.

use std::sync::Arc;

use tracejit_ir::passes::{ConstantFolding, Cse, Dce, Pass, PassContext, Simplify};
use tracejit_ir::tensor::{BinaryOp, UnaryOp};
use tracejit_ir::{interpret, verify, AssignKind, Effects, Graph, LibraryFunction, Op, ValueId};

use crate::common::{f32s, f32t, node, node_ctrl, TestVar};

/// A region body `exp(x) + exp(x)`, with the `exp` written twice.
fn body_with_duplicate() -> Graph {
    let mut b = Graph::new("region");
    let x = b.add_param(f32t(&[4]));
    let e1 = node(&mut b, Op::Unary(UnaryOp::Exp), &[x]);
    let e2 = node(&mut b, Op::Unary(UnaryOp::Exp), &[x]);
    let s = node(&mut b, Op::Binary(BinaryOp::Add), &[e1, e2]);
    b.outputs.push(s);
    b
}

/// A body that adds its input to a variable and returns the input.
fn body_with_assign() -> Graph {
    let mut b = Graph::new("writes");
    let x = b.add_param(f32t(&[4]));
    let v = b.add_variable(TestVar::new("acc", f32s(&[4], 1)));
    node_ctrl(&mut b, Op::AssignVariable { var: v, kind: AssignKind::Add, locked: false }, &[x], &[]);
    b.outputs.push(x);
    b
}

fn count(g: &Graph, pred: &dyn Fn(&Op) -> bool) -> usize {
    g.nodes()
        .map(|(_, n)| usize::from(pred(&n.op)) + n.op.subgraphs().iter().map(|s| count(s, pred)).sum::<usize>())
        .sum()
}

#[test]
fn subgraphs_lists_a_fused_body_and_nothing_else() {
    let body = Arc::new(body_with_duplicate());
    let op = Op::Fused { body: body.clone() };
    assert_eq!(op.subgraphs().len(), 1);
    assert!(Arc::ptr_eq(&op.subgraphs()[0], &body));
    assert!(Op::MatMul.subgraphs().is_empty());
    assert!(Op::Unary(UnaryOp::Exp).subgraphs().is_empty());
}

#[test]
fn effects_of_primitives_variables_calls_and_nested_code() {
    let lib = tracejit_ir::FunctionLibrary::default();
    assert!(Op::Unary(UnaryOp::Exp).effects(&lib).is_pure());
    let mut g = Graph::new("g");
    let v = g.add_variable(TestVar::new("v", f32s(&[4], 2)));
    assert!(Op::ReadVariable { var: v, locked: false }.effects(&lib).reads());
    assert!(Op::AssignVariable { var: v, kind: AssignKind::Assign, locked: false }.effects(&lib).writes());
    assert!(Op::Fused { body: Arc::new(body_with_duplicate()) }.effects(&lib).is_pure());
    let writes = Op::Fused { body: Arc::new(body_with_assign()) }.effects(&lib);
    assert!(writes.writes() && !writes.reads());
    // A call has its callee's effects; an unknown callee counts as writing.
    let f = g.library.add(LibraryFunction {
        name: "w".into(),
        attrs: Default::default(),
        graph: Arc::new(body_with_assign()),
    });
    assert!(Op::Call { func: f }.effects(&g.library).writes());
    assert!(Op::Call { func: f }.effects(&lib).writes(), "unknown callee");
    assert_eq!(Effects::READS.union(Effects::RANDOM), Effects::RANDOM.union(Effects::READS));
    assert!(!Effects::READS.union(Effects::RANDOM).is_pure());
}

#[test]
fn cse_and_dce_run_inside_subgraphs() {
    let mut g = Graph::new("outer");
    let x = g.add_param(f32t(&[4]));
    let y = node(&mut g, Op::Fused { body: Arc::new(body_with_duplicate()) }, &[x]);
    g.outputs.push(y);
    let before = interpret(&g, &[f32s(&[4], 3)]).unwrap();
    let cx = PassContext::new("outer");
    assert_eq!(count(&g, &|op| matches!(op, Op::Unary(UnaryOp::Exp))), 2);
    let r = Cse.run(&mut g, &cx);
    assert!(r.changed, "{}", r.summary);
    verify(&g).unwrap();
    assert_eq!(count(&g, &|op| matches!(op, Op::Unary(UnaryOp::Exp))), 1, "{g}");
    let after = interpret(&g, &[f32s(&[4], 3)]).unwrap();
    assert!(before[0].bit_eq(&after[0]));
    // Idempotent: nothing left to do, and the body is not copied again.
    let body = g.nodes().find_map(|(_, n)| n.op.subgraphs().first().cloned()).unwrap();
    assert!(!Cse.run(&mut g, &cx).changed);
    assert!(!Dce.run(&mut g, &cx).changed);
    let again = g.nodes().find_map(|(_, n)| n.op.subgraphs().first().cloned()).unwrap();
    assert!(Arc::ptr_eq(&body, &again));
}

#[test]
fn an_op_whose_subgraph_writes_is_never_merged_folded_or_dropped() {
    let mut g = Graph::new("outer");
    let c = g.add_constant(f32s(&[4], 4));
    let body = Arc::new(body_with_assign());
    // Two identical writing regions on a constant, neither result used.
    let a = node(&mut g, Op::Fused { body: body.clone() }, &[c]);
    let b = node(&mut g, Op::Fused { body }, &[c]);
    let out = node(&mut g, Op::Unary(UnaryOp::Neg), &[c]);
    // A pure region nobody reads, which DCE does drop.
    node(&mut g, Op::Fused { body: Arc::new(body_with_duplicate()) }, &[c]);
    g.outputs.push(out);
    let _ = (a, b);
    let cx = PassContext::new("outer");
    for pass in [&Cse as &dyn Pass, &Dce, &ConstantFolding, &Simplify] {
        let mut h = g.clone();
        pass.run(&mut h, &cx);
        verify(&h).unwrap();
        assert!(count(&h, &|op| matches!(op, Op::Fused { .. })) >= 2, "after {}:\n{h}", pass.name());
    }
    let mut h = g.clone();
    Dce.run(&mut h, &cx);
    assert_eq!(count(&h, &|op| matches!(op, Op::Fused { .. })), 2, "DCE drops only the pure region:\n{h}");
}

#[test]
fn the_printer_and_verifier_walk_subgraphs() {
    let mut g = Graph::new("outer");
    let x = g.add_param(f32t(&[4]));
    let y = node(&mut g, Op::Fused { body: Arc::new(body_with_duplicate()) }, &[x]);
    g.outputs.push(y);
    let text = g.to_string();
    assert!(text.contains("graph region("), "{text}");
    // A broken body is found through the outer graph.
    let mut bad = body_with_duplicate();
    bad.outputs.push(ValueId::new(tracejit_ir::NodeId::from_u32(99), 0));
    let mut h = Graph::new("outer");
    let x = h.add_param(f32t(&[4]));
    let body = Arc::new(bad);
    let id = h.push_node(tracejit_ir::Node {
        op: Op::Fused { body },
        inputs: smallvec::smallvec![x],
        control_inputs: smallvec::smallvec![],
        outputs: smallvec::smallvec![f32t(&[4]), f32t(&[4])],
        location: None,
    });
    h.outputs.push(ValueId::new(id, 0));
    assert!(verify(&h).is_err());
}
