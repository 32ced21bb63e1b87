//! Tests of the text form's parser: every op and attribute round-trips,
//! constants round-trip bitwise (NaN payloads, -0.0, f32 vs f64), elided
//! constants and kernels without a registry are clear errors, and errors
//! name the line, the column and what was expected. The random graphs of
//! `props.rs` and `passes.rs` round-trip too (there, in their proptests), and
//! every filetest checks its input and output graphs.

use std::sync::Arc;

use tracejit_ir::passes::{Fusion, KernelRegistry, Pass, PassContext};
use tracejit_ir::tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{interpret, verify, AssignKind, ExternalKernel, Graph, Op, ParseError, TensorType, ValueId};

use crate::common::{assert_round_trip, f32t, node, node_ctrl, ty, TestVar};
use crate::verifier::sample_graph;

/// A kernel that returns its input, for kernel nodes.
#[derive(Debug)]
struct Identity;

impl ExternalKernel for Identity {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        vec![inputs[0].clone()]
    }
}

/// Knows `test.identity` for any f32 input.
struct IdentityRegistry;

impl KernelRegistry for IdentityRegistry {
    fn lookup(&self, name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>> {
        (name == "test.identity" && inputs.iter().all(|t| t.dtype == DType::F32)).then(|| Arc::new(Identity) as _)
    }
}

/// Adds `op` on the first of f32, i32 or bool inputs it accepts.
fn on_some_dtype(g: &mut Graph, op: Op, f: ValueId, i: ValueId, b: ValueId, arity: usize) -> ValueId {
    for x in [f, i, b] {
        let inputs = vec![x; arity];
        if let Ok(id) = g.add_node(op.clone(), &inputs, &[], None) {
            return id.into();
        }
    }
    panic!("{} takes none of f32, i32, bool", op.name())
}

/// One node of every op kind; unary, binary and reduce ops come from their
/// `ALL` tables, so a new one is covered without editing this test.
fn every_op_graph() -> Graph {
    let mut inner = Graph::new("inner");
    let p = inner.add_param(f32t(&[2, 3]));
    inner.outputs = vec![node(&mut inner, Op::Unary(UnaryOp::Neg), &[p])];

    let mut g = Graph::new("every_op");
    let f = g.add_param(f32t(&[-1, 3]));
    let i = g.add_param(ty(DType::I32, &[2, 3]));
    let b = g.add_param(ty(DType::Bool, &[2, 3]));
    let idx = g.add_param(ty(DType::I64, &[4]));
    let var = g.add_variable(TestVar::new("w \"quoted\"", Storage::full(&[2, 3], DType::F32, 0.0)));
    let func = g.library.add(tracejit_ir::LibraryFunction {
        name: "inner".into(),
        attrs: Default::default(),
        graph: Arc::new(inner),
    });
    let mut outputs = Vec::new();
    for u in UnaryOp::ALL {
        outputs.push(on_some_dtype(&mut g, Op::Unary(u), f, i, b, 1));
    }
    for op in BinaryOp::ALL {
        outputs.push(on_some_dtype(&mut g, Op::Binary(op), f, i, b, 2));
    }
    for op in ReduceOp::ALL {
        outputs.push(node(&mut g, Op::Reduce { op, axes: vec![0, 1], keepdims: op == ReduceOp::Max }, &[f]));
    }
    for op in ArgReduceOp::ALL {
        outputs.push(node(&mut g, Op::ArgReduce { op, axis: 1, keepdims: true }, &[f]));
    }
    let fixed = i;
    let known = node(&mut g, Op::Cast { to: DType::F32 }, &[fixed]);
    outputs.push(node(&mut g, Op::Select, &[b, known, known]));
    outputs.push(node(&mut g, Op::Clamp { min: -0.0, max: f64::INFINITY }, &[f]));
    outputs.push(node(&mut g, Op::Clamp { min: f64::NEG_INFINITY, max: 1e-300 }, &[f]));
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[known]);
    outputs.push(node(&mut g, Op::MatMul, &[known, t]));
    outputs.push(node(&mut g, Op::Reshape { shape: vec![3, -1] }, &[known]));
    outputs.push(node(&mut g, Op::BroadcastTo { shape: vec![4, 2, 3] }, &[known]));
    let e = node(&mut g, Op::ExpandDims { axis: 0 }, &[known]);
    outputs.push(node(&mut g, Op::Squeeze { axes: vec![0] }, &[e]));
    outputs.push(node(&mut g, Op::Concat { axis: 1 }, &[known, known, known]));
    outputs.push(node(&mut g, Op::Stack { axis: 2 }, &[known, known]));
    let specs = vec![SliceSpec::range(-2, 2), SliceSpec { start: None, stop: Some(1), step: -2 }];
    outputs.push(node(&mut g, Op::Slice { specs }, &[known]));
    outputs.push(node(&mut g, Op::Slice { specs: vec![SliceSpec::FULL, SliceSpec::FULL] }, &[known]));
    outputs.push(node(&mut g, Op::Gather { axis: 1 }, &[known, idx]));
    outputs.push(node(&mut g, Op::OneHot { depth: 5, dtype: DType::F64 }, &[idx]));
    outputs.push(node(&mut g, Op::Call { func }, &[known]));
    let k = Op::Kernel {
        name: "test.identity".into(),
        kernel: Arc::new(Identity),
        inputs: vec![f32t(&[-1, 3])],
        outputs: vec![f32t(&[2, 3])],
    };
    outputs.push(node(&mut g, k, &[known]));
    let k_same = Op::Kernel {
        name: "test.identity".into(),
        kernel: Arc::new(Identity),
        inputs: vec![f32t(&[2, 3])],
        outputs: vec![f32t(&[2, 3])],
    };
    outputs.push(node(&mut g, k_same, &[known]));
    let r = node(&mut g, Op::ReadVariable { var, locked: false }, &[]);
    let a = node_ctrl(&mut g, Op::AssignVariable { var, kind: AssignKind::Add, locked: false }, &[known], &[r.node]);
    for kind in AssignKind::ALL {
        node_ctrl(&mut g, Op::AssignVariable { var, kind, locked: false }, &[r], &[a]);
    }
    outputs.push(r);
    g.outputs = outputs;
    // Fused regions, made by the fusion pass so their bodies are realistic.
    let mut fused = g.clone();
    Fusion::default().run(&mut fused, &PassContext::new("every_op"));
    assert!(fused.nodes().any(|(_, n)| matches!(n.op, Op::Fused { .. })), "{fused}");
    verify(&fused).unwrap();
    fused
}

#[test]
fn every_op_round_trips() {
    let g = every_op_graph();
    verify(&g).unwrap();
    let text = format!("{g:#}");
    let back = Graph::parse_with_kernels(&text, &IdentityRegistry).unwrap_or_else(|e| panic!("{e}\n{text}"));
    if let Some(diff) = g.structural_diff(&back) {
        panic!("{diff}\n{text}\n{back:#}");
    }
    assert_eq!(format!("{back:#}"), text);
    verify(&back).unwrap();
    // Kernels print their declared types only when the inputs differ.
    assert!(text.contains(r#"kernel["test.identity"](f32[?, 3]) %"#), "{text}");
    assert!(text.contains(r#"kernel["test.identity"] %"#), "{text}");
}

#[test]
fn listings_of_the_printer_tests_round_trip() {
    assert_round_trip(&sample_graph());
    assert_round_trip(&crate::printer::misc_graph());
}

#[test]
fn parsed_variables_are_stand_ins_holding_zeros() {
    let g = Graph::parse(
        "variable var0 \"w\": f64[2]\n\
         graph g() -> (%0) {\n  %0 = read_variable[var=var0 \"w\"] : f64[2]\n}\n",
    )
    .unwrap();
    let var = &g.variables[tracejit_ir::VarId::from_u32(0)];
    assert_eq!((var.name(), var.dtype(), var.shape()), ("w".to_string(), DType::F64, vec![2]));
    let out = interpret(&g, &[]).unwrap();
    assert_eq!(out[0].to_vec::<f64>().unwrap(), vec![0.0, 0.0]);
}

#[test]
fn constants_round_trip_bitwise() {
    let mut g = Graph::new("consts");
    let quiet_neg = f32::from_bits(0xffc0_0000);
    let payload = f32::from_bits(0x7fc0_0123);
    let values32 = vec![-0.0f32, 0.0, f32::NAN, quiet_neg, payload, f32::INFINITY, f32::NEG_INFINITY, 0.1, 1e-45];
    let c32 = g.add_constant(Storage::from_vec(values32.clone(), &[9]).unwrap());
    let values64 = vec![-0.0f64, f64::from_bits(0x7ff0_0000_0000_0001), 0.1, f64::MAX, 5e-324, 1.0 / 3.0];
    let c64 = g.add_constant(Storage::from_vec(values64, &[2, 3]).unwrap());
    let ints = g.add_constant(Storage::from_vec(vec![i64::MIN, -1, i64::MAX], &[3]).unwrap());
    let i32s = g.add_constant(Storage::from_vec(vec![i32::MIN, i32::MAX], &[1, 2]).unwrap());
    let bools = g.add_constant(Storage::from_vec(vec![true, false], &[2]).unwrap());
    let empty = g.add_constant(Storage::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap());
    let scalar = g.add_constant(Storage::scalar(0.1f64));
    let one32 = g.add_constant(Storage::scalar(0.1f32));
    g.outputs = vec![c32, c64, ints, i32s, bools, empty, scalar, one32];
    verify(&g).unwrap();
    let text = g.to_string();
    assert!(text.contains("[-0.0, 0.0, NaN, NaN(0xffc00000), NaN(0x7fc00123), inf, -inf, 0.1, 1e-45]"), "{text}");
    assert!(text.contains("NaN(0x7ff0000000000001)"), "{text}");
    assert_round_trip(&g);
    // f32 and f64 constants with the same digits are different graphs.
    let as64 = text.replace("%7 = constant f32[] 0.1", "%7 = constant f64[] 0.1");
    assert_ne!(as64, text);
    assert!(!Graph::parse(&as64).unwrap().structurally_eq(&g));
}

#[test]
fn big_constants_elide_unless_alternate() {
    let mut g = Graph::new("big");
    let values: Vec<f32> = (0..784 * 4).map(|i| i as f32 * 0.5).collect();
    let w = g.add_constant(Storage::from_vec(values, &[784, 4]).unwrap());
    let small = g.add_constant(Storage::from_vec((0..64).collect::<Vec<i32>>(), &[64]).unwrap());
    g.outputs = vec![w, small];
    let short = g.to_string();
    assert!(short.contains("%0 = constant f32[784, 4] [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, ...]\n"), "{short}");
    assert!(short.lines().all(|l| l.len() < 400), "the short listing stays readable");
    assert!(short.contains(", 63]"), "64 values print in full: {short}");
    let e = Graph::parse(&short).unwrap_err();
    assert!(matches!(&e, ParseError::ElidedConstant { line: 2, node, .. } if node == "%0"), "{e:?}");
    assert!(e.to_string().contains("constant %0 is elided"), "{e}");
    assert!(e.to_string().contains("{:#}"), "{e}");
    assert_round_trip(&g);
}

#[test]
fn kernels_need_a_registry() {
    let text = "graph k(%0: f32[3]) -> (%1) {\n  %1 = kernel[\"test.identity\"] %0 : f32[3]\n}\n";
    let e = Graph::parse(text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 2, column 8: %1 is kernel `test.identity`, native code that cannot be parsed without a kernel \
         registry (`Graph::parse_with_kernels`)"
    );
    let g = Graph::parse_with_kernels(text, &IdentityRegistry).unwrap();
    verify(&g).unwrap();
    let out = interpret(&g, &[Storage::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let e = Graph::parse_with_kernels(&text.replace("test.identity", "test.nope"), &IdentityRegistry).unwrap_err();
    assert_eq!(e.to_string(), "line 2, column 8: no kernel `test.nope` is registered for inputs (f32[3])");
}

#[test]
fn names_and_strings_with_odd_characters_round_trip() {
    let mut g = Graph::new("my fn (v2) \"x\"\n\u{1b}é");
    let x = g.add_param(f32t(&[]));
    g.outputs = vec![x];
    assert!(g.to_string().starts_with("graph \"my fn (v2) \\\"x\\\"\\n\\u{1b}é\"(%0: f32[]) -> (%0) {"), "{g}");
    assert_round_trip(&g);
    assert_round_trip(&Graph::new(""));
}

/// The error for `text`, as a string.
fn error(text: &str) -> String {
    match Graph::parse(text) {
        Ok(g) => panic!("parsed:\n{g}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn errors_name_line_column_expected_and_found() {
    let head = "graph g(%0: f32[3]) -> (%1) {\n";
    assert_eq!(error(""), "line 1, column 1: expected a `graph` line, found end of input");
    assert_eq!(error("grph g() -> () {\n}\n"), "line 1, column 1: expected `graph`, found `grph`");
    assert_eq!(
        error("graph g(%0: f33[3]) -> (%0) {\n}\n"),
        "line 1, column 13: expected a dtype (f32, f64, i32, i64, bool, bf16, f16, i8, u8, i16, u16, u32, u64), found `f33`"
    );
    assert_eq!(
        error(&format!("{head}  %1 = neg %0 : f32[3\n}}\n")),
        "line 2, column 22: expected `,` or `]`, found end of line"
    );
    assert_eq!(error(&format!("{head}  %2 = neg %0 : f32[3]\n}}\n")), "line 2, column 3: expected `%1`, found `%2`");
    assert_eq!(
        error(&format!("{head}  %1 = neg %7 : f32[3]\n}}\n")),
        "line 2, column 12: %7 is not defined before this use"
    );
    assert_eq!(
        error(&format!("{head}  %1 = neg %0 : f32[3]\n")),
        "line 3, column 1: expected a node line or `}`, found end of input"
    );
    assert_eq!(
        error(&format!("{head}  %1 = reduce_sum[axes=[0], keepdims=maybe] %0 : f32[]\n}}\n")),
        "line 2, column 38: expected `true` or `false`, found `maybe`"
    );
    assert_eq!(
        error(&format!("{head}  %1 = read_variable[var=var0 \"w\"] : f32[3]\n}}\n")),
        "line 2, column 26: variable var0 is not declared (a `variable var0 \"name\": type` line)"
    );
    assert_eq!(
        error(&format!("{head}  %1 = call @f0 \"inner\" %0 : f32[3]\n}}\n")),
        "line 2, column 8: function f0 \"inner\" is not in the graph's library"
    );
    assert_eq!(
        error(&format!("{head}  %1 = constant f32[2] [1.0]\n}}\n")),
        "line 2, column 24: a constant of shape [2] needs 2 value(s), found 1"
    );
    assert_eq!(
        error(&format!("{head}  %1 = constant f32[] one\n}}\n")),
        "line 2, column 23: expected a value of the constant's dtype (f32), found `one`"
    );
    // Columns deep into a line (counted on from the last one asked).
    assert_eq!(
        error(&format!("{head}  %1 = constant f32[3] [1.0, 2.5, two]\n}}\n")),
        "line 2, column 35: expected a value of the constant's dtype (f32), found `two`"
    );
    assert_eq!(
        error(&format!("{head}  %1 = neg %0 : f32[3]\n}}\ngraph h() -> () {{\n}}\n")),
        "line 4, column 1: expected end of input (one graph per text), found `graph`"
    );
    assert_eq!(
        error(&format!("{head}  %1 = neg %0, %0 : f32[3], f32[3]\n}}\n")),
        "line 2, column 3: 1 result(s) named but 2 output type(s) given"
    );
    let func = "graph g() -> () {\n}\nfunction f0 \"h\" implements=\"a.b.c\" ATTR:\n  graph h() -> () {\n  }\n";
    assert!(Graph::parse(&func.replace(" ATTR", "")).is_ok());
    assert_eq!(
        error(&func.replace("ATTR", "inline=false")),
        "line 3, column 36: expected a function attribute (`implements`) or `:`, found `inline`"
    );
    assert_eq!(
        error(&func.replace("ATTR", "implements=\"x.y.z\"")),
        "line 3, column 36: attribute `implements` is given twice"
    );
    // Comments and blank lines are skipped; line numbers still count them.
    assert_eq!(
        error(&format!("; a comment\n\n{head}  %1 = bogus %0 : f32[3]\n}}\n")),
        "line 4, column 8: unknown op `bogus`"
    );
}

#[test]
fn parse_errors_convert_into_ir_errors() {
    let e: tracejit_ir::IrError = Graph::parse("x").unwrap_err().into();
    assert!(e.to_string().starts_with("line 1, column 1: expected `graph`"), "{e}");
}
