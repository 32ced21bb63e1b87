//! Golden tests of the text listing and checks of the DOT output.

use std::sync::Arc;

use tracejit_ir::tensor::{BinaryOp, DType, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{FunctionAttrs, Graph, LibraryFunction, Op, ValueId};

use crate::common::{f32t, node, ty};
use crate::verifier::sample_graph;

#[test]
fn listing_golden() {
    let expected = r#"variable var0 "w": f32[3]
graph sample(%0: f32[?, 3]) -> (%7, %4) {
  %1 = constant f32[] 0.5
  %2 = mul %0, %1 : f32[?, 3]
  %3 = call @f0 "inner" %2 : f32[?, 3]
  %4 = reduce_sum[axes=[0], keepdims=false] %3 : f32[3]
  assign_variable[var=var0 "w", kind=assign_add] %4
  %6 = read_variable[var=var0 "w"] : f32[3] ctrl(%5)
  %7 = add %3, %6 : f32[?, 3]
}
function f0 "inner" implements="tracejit.test.tanh":
  graph inner(%0: f32[?, 3]) -> (%1) {
    %1 = tanh %0 : f32[?, 3]
  }
"#;
    let g = sample_graph();
    assert_eq!(g.to_string(), expected);
    // Deterministic: a clone prints the same.
    assert_eq!(g.clone().to_string(), expected);
}

/// Attributes, constants of three dtypes, a call with two results, slices.
pub fn misc_graph() -> Graph {
    let mut two = Graph::new("two");
    let x = two.add_param(f32t(&[2]));
    let n = node(&mut two, Op::Unary(UnaryOp::Neg), &[x]);
    two.outputs = vec![x, n];

    let mut g = Graph::new("misc");
    let attrs = FunctionAttrs::implementing("tracejit.test.two");
    let f = g.library.add(LibraryFunction { name: "two".into(), attrs, graph: Arc::new(two) });
    let a = g.add_param(f32t(&[2]));
    let b = g.add_param(ty(DType::I64, &[-1, 4]));
    let c = g.add_constant(Storage::from_vec((0..10).collect::<Vec<i32>>(), &[2, 5]).unwrap());
    let d = g.add_constant(Storage::from_vec(vec![1.0f32, 2.5], &[2]).unwrap());
    let e = g.add_constant(Storage::scalar(true));
    let call = g.add_node(Op::Call { func: f }, &[a], &[], None).unwrap();
    let s = node(&mut g, Op::Binary(BinaryOp::Sub), &[ValueId::new(call, 1), d]);
    let sl = node(
        &mut g,
        Op::Slice { specs: vec![SliceSpec::range(1, 3), SliceSpec { start: None, stop: None, step: -1 }] },
        &[b],
    );
    let cast = node(&mut g, Op::Cast { to: DType::F64 }, &[sl]);
    let cl = node(&mut g, Op::Clamp { min: 0.0, max: 6.0 }, &[cast]);
    let r = node(&mut g, Op::Reshape { shape: vec![-1] }, &[c]);
    g.outputs = vec![s, cl, r, e];
    g
}

#[test]
fn listing_of_attributes_constants_and_multiple_outputs() {
    let g = misc_graph();
    let expected = r#"graph misc(%0: f32[2], %1: i64[?, 4]) -> (%6, %9, %10, %4) {
  %2 = constant i32[2, 5] [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
  %3 = constant f32[2] [1.0, 2.5]
  %4 = constant bool[] true
  %5, %5.1 = call @f0 "two" %0 : f32[2], f32[2]
  %6 = sub %5.1, %3 : f32[2]
  %7 = slice[1:3, ::-1] %1 : i64[?, 4]
  %8 = cast[to=f64] %7 : f64[?, 4]
  %9 = clamp[min=0.0, max=6.0] %8 : f64[?, 4]
  %10 = reshape[shape=[-1]] %2 : i32[10]
}
function f0 "two" implements="tracejit.test.two":
  graph two(%0: f32[2]) -> (%0, %1) {
    %1 = neg %0 : f32[2]
  }
"#;
    assert_eq!(g.to_string(), expected);
}

#[test]
fn listing_never_panics_on_broken_graphs() {
    let mut g = sample_graph();
    g.node_mut(tracejit_ir::NodeId::from_u32(3)).op = Op::Call { func: tracejit_ir::FuncId::from_u32(9) };
    g.node_mut(tracejit_ir::NodeId::from_u32(6)).op =
        Op::ReadVariable { var: tracejit_ir::VarId::from_u32(9), locked: false };
    g.params.push(tracejit_ir::NodeId::from_u32(99));
    let text = g.to_string();
    assert!(text.contains("call @f9 <missing>"), "{text}");
    assert!(text.contains("read_variable[var=var9 <missing>]"), "{text}");
    assert!(text.contains("%99: <missing>"), "{text}");
    let _ = g.to_dot();
}

#[test]
fn dot_output() {
    let mut g = sample_graph();
    g.name = "quote\"d".into();
    let dot = g.to_dot();
    assert!(dot.starts_with("digraph \"quote\\\"d\" {\n"), "{dot}");
    assert!(dot.ends_with("}\n"));
    // One node statement per graph node plus one per output.
    for i in 0..g.len() {
        assert!(dot.contains(&format!("  n{i} [label=")), "{dot}");
    }
    assert!(dot.contains("out0 [label=\"output 0\""));
    assert!(dot.contains("n7 -> out0;") && dot.contains("n4 -> out1;"));
    // Parameters are marked, data edges solid, control edges dashed.
    assert!(dot.contains("n0 [label=\"%0 = parameter[index=0]\\nf32[?, 3]\", shape=invhouse"), "{dot}");
    assert!(dot.contains("  n0 -> n2;\n  n1 -> n2;\n"), "{dot}");
    assert!(dot.contains("n5 -> n6 [style=dashed"), "{dot}");
    assert!(dot.contains("call @f0 \\\"inner\\\""), "{dot}");
    assert!(dot.contains("reduce_sum[axes=[0], keepdims=false]\\nf32[3]"), "{dot}");
    // Quotes are balanced: every label is a well-formed DOT string.
    let unescaped = dot.replace("\\\\", "").replace("\\\"", "");
    assert_eq!(unescaped.matches('"').count() % 2, 0);
    assert_eq!(dot.matches('{').count(), dot.matches('}').count());
}
