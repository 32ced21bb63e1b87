//! Tests of the passes and the pass manager: the assertions that go with the
//! golden listings (the listings themselves are filetests, see
//! `filetests.rs`; the graphs built here must equal those files' inputs),
//! idempotence and verifier-cleanliness of every pass,
//! the fusion rule, the pipeline's report, dumps and error handling, and a
//! differential property test: random graphs give the same results through
//! the interpreter before and after optimization, NaN/Inf/-0.0 included.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use tracejit_ir::passes::{
    default_accepts_region, ConstantFolding, Cse, Dce, Fusion, Inline, KernelRegistry, OptimizationOptions, Pass,
    PassContext, PassResult, Pipeline, SelectImplementation, Simplify, Stage,
};
use tracejit_ir::tensor::{kernels, BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{
    eval_primitive, interpret, verify, AssignKind, ExternalKernel, FunctionAttrs, Graph, IrError, LibraryFunction, Op,
    TensorType, ValueId,
};

use crate::common::{f32s, f32t, node, node_ctrl, TestVar};
use crate::filetests::filetest_input;

// ---- helpers ---------------------------------------------------------------

/// Runs `pass` on a copy of `g`, checks the result verifies, that a second
/// run changes nothing (idempotence), and returns the new graph and result.
pub(crate) fn run_checked(pass: &dyn Pass, g: &Graph, cx: &PassContext) -> (Graph, PassResult) {
    verify(g).unwrap_or_else(|e| panic!("input graph does not verify: {e}\n{g}"));
    let mut once = g.clone();
    let result = pass.run(&mut once, cx);
    verify(&once).unwrap_or_else(|e| panic!("after {}: {e}\n{once}", pass.name()));
    if !result.changed {
        assert_eq!(once.to_string(), g.to_string(), "{} reported no change but changed the graph", pass.name());
    }
    let mut twice = once.clone();
    let again = pass.run(&mut twice, cx);
    assert!(!again.changed, "{} is not idempotent: second run: {}\n{once}\n{twice}", pass.name(), again.summary);
    assert_eq!(twice.to_string(), once.to_string(), "{} changed the graph on a second run", pass.name());
    (once, result)
}

/// Runs `pass` on `g` as [`run_checked`] does, after checking that `g` is
/// the input of filetest `name` (which holds the listing before and after).
fn filetest_pass(name: &str, pass: &dyn Pass, g: &Graph, cx: &PassContext) -> Graph {
    assert_is_filetest_input(name, g);
    run_checked(pass, g, cx).0
}

/// Asserts that `g` is structurally the input graph of filetest `name`.
fn assert_is_filetest_input(name: &str, g: &Graph) {
    if let Some(diff) = filetest_input(name).structural_diff(g) {
        panic!("filetest `{name}` does not hold the graph this test builds: {diff}\n{g:#}");
    }
}

/// Results equal bitwise, except that any NaN equals any NaN (rewrites may
/// change a NaN's sign or payload, see the `passes` module docs).
fn same_results(a: &[Storage], b: &[Storage]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            if x.dtype() != y.dtype() || x.shape() != y.shape() {
                return false;
            }
            match (x, y) {
                (Storage::F32(p), Storage::F32(q)) => {
                    p.iter().zip(q.iter()).all(|(u, v)| (u.is_nan() && v.is_nan()) || u.to_bits() == v.to_bits())
                }
                (Storage::F64(p), Storage::F64(q)) => {
                    p.iter().zip(q.iter()).all(|(u, v)| (u.is_nan() && v.is_nan()) || u.to_bits() == v.to_bits())
                }
                _ => x.bit_eq(y),
            }
        })
}

fn f32c(g: &mut Graph, v: f32) -> ValueId {
    g.add_constant(Storage::scalar(v))
}

fn un(g: &mut Graph, u: UnaryOp, x: ValueId) -> ValueId {
    node(g, Op::Unary(u), &[x])
}

fn bin(g: &mut Graph, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    node(g, Op::Binary(b), &[x, y])
}

fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: &[usize], keepdims: bool) -> ValueId {
    node(g, Op::Reduce { op, axes: axes.to_vec(), keepdims }, &[x])
}

fn function(name: &str, implements: Option<&str>, graph: Graph) -> LibraryFunction {
    let attrs = FunctionAttrs { implements: implements.map(str::to_string) };
    LibraryFunction { name: name.to_string(), attrs, graph: Arc::new(graph) }
}

fn call(g: &mut Graph, func: tracejit_ir::FuncId, args: &[ValueId]) -> ValueId {
    node(g, Op::Call { func }, args)
}

/// Counts nodes with op name `name`, inside fused regions too.
fn count_ops(g: &Graph, name: &str) -> usize {
    g.nodes()
        .map(|(_, n)| match &n.op {
            Op::Fused { body } => count_ops(body, name),
            op => usize::from(op.name() == name),
        })
        .sum()
}

fn fused_bodies(g: &Graph) -> Vec<Arc<Graph>> {
    g.nodes()
        .filter_map(|(_, n)| match &n.op {
            Op::Fused { body } => Some(body.clone()),
            _ => None,
        })
        .collect()
}

/// A kernel for tests: `x * 2 + 100`, so a test can tell it ran.
#[derive(Debug)]
struct PlusHundred;

impl ExternalKernel for PlusHundred {
    fn run(&self, inputs: &[Storage]) -> Vec<Storage> {
        let two = kernels::binary(BinaryOp::Add, &inputs[0], &inputs[0]);
        vec![kernels::binary(BinaryOp::Add, &two, &Storage::scalar(100.0f32))]
    }
}

/// A registry with fixed kernels, accepting f32 inputs only.
struct TestKernels(HashMap<String, Arc<dyn ExternalKernel>>);

impl KernelRegistry for TestKernels {
    fn lookup(&self, name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>> {
        if inputs.iter().any(|t| t.dtype != DType::F32) {
            return None;
        }
        self.0.get(name).cloned()
    }
}

pub(crate) fn registry() -> Arc<dyn KernelRegistry> {
    let mut m: HashMap<String, Arc<dyn ExternalKernel>> = HashMap::new();
    m.insert("tracejit.test.double".into(), Arc::new(PlusHundred));
    Arc::new(TestKernels(m))
}

// ---- sample graphs ---------------------------------------------------------

/// `main(x) = double(scale(x)) * scale(x)` where `scale` calls `inner`, and
/// `double` is a composite (`tracejit.test.double`), plus a call of an
/// unregistered composite `other`.
fn call_graph() -> Graph {
    let mut inner = Graph::new("inner");
    let x = inner.add_param(f32t(&[3]));
    inner.outputs = vec![un(&mut inner, UnaryOp::Neg, x)];

    let mut scale = Graph::new("scale");
    let x = scale.add_param(f32t(&[3]));
    let f_inner = scale.library.add(function("inner", None, inner));
    let n = call(&mut scale, f_inner, &[x]);
    let two = f32c(&mut scale, 2.0);
    let m = bin(&mut scale, BinaryOp::Mul, n, two);
    scale.outputs = vec![m];

    let mut double = Graph::new("double");
    let x = double.add_param(f32t(&[3]));
    double.outputs = vec![bin(&mut double, BinaryOp::Add, x, x)];

    let mut other = Graph::new("other");
    let x = other.add_param(f32t(&[3]));
    other.outputs = vec![un(&mut other, UnaryOp::Tanh, x)];

    let mut g = Graph::new("main");
    let x = g.add_param(f32t(&[3]));
    let f_scale = g.library.add(function("scale", None, scale));
    let f_double = g.library.add(function("double", Some("tracejit.test.double"), double));
    let f_other = g.library.add(function("other", Some("tracejit.test.other"), other));
    let s = call(&mut g, f_scale, &[x]);
    let d = call(&mut g, f_double, &[s]);
    let o = call(&mut g, f_other, &[d]);
    g.outputs = vec![bin(&mut g, BinaryOp::Mul, o, s)];
    g
}

fn gelu_graph(dims: &[i64]) -> Graph {
    let mut g = Graph::new("gelu");
    let x = g.add_param(f32t(dims));
    let x2 = bin(&mut g, BinaryOp::Mul, x, x);
    let x3 = bin(&mut g, BinaryOp::Mul, x2, x);
    let c1 = f32c(&mut g, 0.044715);
    let t = bin(&mut g, BinaryOp::Mul, x3, c1);
    let inner = bin(&mut g, BinaryOp::Add, x, t);
    let c2 = f32c(&mut g, 0.797_884_6);
    let s = bin(&mut g, BinaryOp::Mul, inner, c2);
    let th = un(&mut g, UnaryOp::Tanh, s);
    let one = f32c(&mut g, 1.0);
    let p = bin(&mut g, BinaryOp::Add, th, one);
    let half = f32c(&mut g, 0.5);
    let hx = bin(&mut g, BinaryOp::Mul, x, half);
    g.outputs = vec![bin(&mut g, BinaryOp::Mul, hx, p)];
    g
}

fn softmax_graph() -> Graph {
    let mut g = Graph::new("softmax");
    let x = g.add_param(f32t(&[-1, 8]));
    let m = reduce(&mut g, ReduceOp::Max, x, &[1], true);
    let d = bin(&mut g, BinaryOp::Sub, x, m);
    let e = un(&mut g, UnaryOp::Exp, d);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1], true);
    g.outputs = vec![bin(&mut g, BinaryOp::Div, e, s)];
    g
}

fn layer_norm_graph() -> Graph {
    let mut g = Graph::new("layer_norm");
    let x = g.add_param(f32t(&[4, 8]));
    let gamma = g.add_param(f32t(&[8]));
    let beta = g.add_param(f32t(&[8]));
    let mean = reduce(&mut g, ReduceOp::Mean, x, &[1], true);
    let d = bin(&mut g, BinaryOp::Sub, x, mean);
    let sq = bin(&mut g, BinaryOp::Mul, d, d);
    let var = reduce(&mut g, ReduceOp::Mean, sq, &[1], true);
    let eps = f32c(&mut g, 1e-5);
    let ve = bin(&mut g, BinaryOp::Add, var, eps);
    let r = un(&mut g, UnaryOp::Rsqrt, ve);
    let n = bin(&mut g, BinaryOp::Mul, d, r);
    let sc = bin(&mut g, BinaryOp::Mul, n, gamma);
    g.outputs = vec![bin(&mut g, BinaryOp::Add, sc, beta)];
    g
}

fn dense_relu_graph() -> Graph {
    let mut g = Graph::new("dense");
    let x = g.add_param(f32t(&[-1, 4]));
    let w = g.add_param(f32t(&[4, 3]));
    let b = g.add_param(f32t(&[3]));
    let mm = node(&mut g, Op::MatMul, &[x, w]);
    let a = bin(&mut g, BinaryOp::Add, mm, b);
    let r = un(&mut g, UnaryOp::Relu, a);
    let w2 = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[w]);
    let mm2 = node(&mut g, Op::MatMul, &[r, w2]);
    g.outputs = vec![un(&mut g, UnaryOp::Tanh, mm2)];
    g
}

// ---- per-pass tests; their listings are filetests --------------------------

#[test]
fn golden_inline_keeps_composites_for_the_selector() {
    let cx = PassContext { keep_composites: true, ..PassContext::new("main") };
    let after = filetest_pass("inline_keeps_composites", &Inline, &call_graph(), &cx);
    assert_eq!(count_ops(&after, "call"), 2, "the two composite calls stay\n{after}");
    assert_eq!(after.library.len(), 2, "the inlined callee left the library\n{after}");
}

#[test]
fn golden_inline_everything() {
    let after = filetest_pass("inline_everything", &Inline, &call_graph(), &PassContext::new("main"));
    assert_eq!(count_ops(&after, "call"), 0);
    assert!(after.library.is_empty());
    let x = f32s(&[3], 1);
    let args = [x];
    assert!(same_results(&interpret(&call_graph(), &args).unwrap(), &interpret(&after, &args).unwrap()));
}

#[test]
fn golden_selector_kernel_or_inline() {
    let cx = PassContext::new("main").with_kernels(registry());
    let g = filetest_pass(
        "inline_keeps_composites_then_select",
        &Inline,
        &call_graph(),
        &PassContext { keep_composites: true, ..cx.clone() },
    );
    let after = filetest_pass("selector", &SelectImplementation, &g, &cx);
    assert_eq!(count_ops(&after, "kernel"), 1);
    assert_eq!(count_ops(&after, "call"), 0);
    // The kernel is what runs: x -> scale -> (2s + 100) -> tanh -> * s.
    let x = Storage::from_vec(vec![1.0f32, -2.0, 0.5], &[3]).unwrap();
    let out = interpret(&after, &[x]).unwrap()[0].to_vec::<f32>().unwrap();
    let expect: Vec<f32> =
        [1.0f32, -2.0, 0.5].iter().map(|&v| -2.0 * v).map(|s| (s + s + 100.0f32).tanh() * s).collect();
    assert_eq!(out, expect);
}

#[test]
fn selector_without_a_registry_inlines() {
    let g = call_graph();
    let (after, r) = run_checked(&SelectImplementation, &g, &PassContext::new("main"));
    assert!(r.changed && r.summary.contains("2 composite(s) inlined"), "{}", r.summary);
    assert_eq!(count_ops(&after, "kernel"), 0);
    // Only the plain call remains (for `inline`).
    assert_eq!(count_ops(&after, "call"), 1, "{after}");
}

#[test]
fn golden_const_fold() {
    let var = TestVar::new("v", Storage::from_vec(vec![1.0f32, 2.0], &[2]).unwrap());
    let mut g = Graph::new("fold");
    let x = g.add_param(f32t(&[2048]));
    let v = g.add_variable(var);
    let two = f32c(&mut g, 2.0);
    let three = f32c(&mut g, 3.0);
    let five = bin(&mut g, BinaryOp::Add, two, three);
    let e = un(&mut g, UnaryOp::Exp, five);
    let big = node(&mut g, Op::BroadcastTo { shape: vec![2048] }, &[e]);
    let y = bin(&mut g, BinaryOp::Mul, x, big);
    let r = ValueId::from(g.add_node(Op::ReadVariable { var: v }, &[], &[], None).unwrap());
    let rs = bin(&mut g, BinaryOp::Add, r, five);
    let small = node(&mut g, Op::BroadcastTo { shape: vec![2, 2] }, &[two]);
    let ints = g.add_constant(Storage::from_vec(vec![7i32, -7, 1], &[3]).unwrap());
    let zero = g.add_constant(Storage::scalar(0i32));
    let idiv = bin(&mut g, BinaryOp::Div, ints, zero);
    g.outputs = vec![y, rs, small, idiv];
    let after = filetest_pass("const_fold", &ConstantFolding, &g, &PassContext::new("fold"));
    assert_eq!(count_ops(&after, "broadcast_to"), 1, "the 2048-element broadcast is not materialized\n{after}");
    assert_eq!(count_ops(&after, "read_variable"), 1);
}

#[test]
fn golden_cse() {
    let var = TestVar::new("v", Storage::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap());
    let mut g = Graph::new("cse");
    let x = g.add_param(f32t(&[3]));
    let v = g.add_variable(var);
    let e1 = un(&mut g, UnaryOp::Exp, x);
    let e2 = un(&mut g, UnaryOp::Exp, x);
    let s1 = bin(&mut g, BinaryOp::Add, e1, x);
    let s2 = bin(&mut g, BinaryOp::Add, e2, x);
    let z1 = f32c(&mut g, 0.0);
    let z2 = f32c(&mut g, 0.0);
    let nz = f32c(&mut g, -0.0);
    let nan1 = f32c(&mut g, f32::NAN);
    let nan2 = f32c(&mut g, f32::NAN);
    let a1 = bin(&mut g, BinaryOp::Mul, s1, z1);
    let a2 = bin(&mut g, BinaryOp::Mul, s2, z2);
    let a3 = bin(&mut g, BinaryOp::Mul, s2, nz);
    let n1 = bin(&mut g, BinaryOp::Add, a1, nan1);
    let n2 = bin(&mut g, BinaryOp::Add, a2, nan2);
    let r1 = ValueId::from(g.add_node(Op::ReadVariable { var: v }, &[], &[], None).unwrap());
    let r2 = ValueId::from(g.add_node(Op::ReadVariable { var: v }, &[], &[], None).unwrap());
    g.outputs = vec![n1, n2, a3, r1, r2];
    let after = filetest_pass("cse", &Cse, &g, &PassContext::new("cse"));
    assert_eq!(count_ops(&after, "exp"), 1);
    assert_eq!(count_ops(&after, "read_variable"), 2, "reads are never merged");
}

#[test]
fn golden_dce() {
    let var = TestVar::new("v", Storage::from_vec(vec![0.0f32; 3], &[3]).unwrap());
    let mut g = Graph::new("dce");
    let x = g.add_param(f32t(&[3]));
    let y = g.add_param(f32t(&[3]));
    let v = g.add_variable(var);
    let _dead = un(&mut g, UnaryOp::Exp, x);
    let dead_chain = un(&mut g, UnaryOp::Tanh, x);
    let _dead2 = bin(&mut g, BinaryOp::Mul, dead_chain, x);
    let ordered = un(&mut g, UnaryOp::Sqrt, y);
    let two = f32c(&mut g, 2.0);
    let upd = bin(&mut g, BinaryOp::Mul, x, two);
    let a = node_ctrl(&mut g, Op::AssignVariable { var: v, kind: AssignKind::Add }, &[upd], &[ordered.node]);
    let r = ValueId::from(node_ctrl(&mut g, Op::ReadVariable { var: v }, &[], &[a]));
    let _unused_read = node_ctrl(&mut g, Op::ReadVariable { var: v }, &[], &[a]);
    g.outputs = vec![r];
    let after = filetest_pass("dce", &Dce, &g, &PassContext::new("dce"));
    assert_eq!(count_ops(&after, "exp") + count_ops(&after, "tanh"), 0);
    assert_eq!(count_ops(&after, "sqrt"), 1, "a control input of a live node stays");
    assert_eq!(count_ops(&after, "read_variable"), 2, "stateful nodes stay even when unused");
}

#[test]
fn golden_simplify() {
    let mut g = Graph::new("simplify");
    let x = g.add_param(f32t(&[2, 3]));
    let y = g.add_param(f32t(&[2, 3]));
    let i = g.add_param(TensorType::known(DType::I32, &[3]));
    let nz = f32c(&mut g, -0.0);
    let pz = f32c(&mut g, 0.0);
    let one = f32c(&mut g, 1.0);
    let four = f32c(&mut g, 4.0);
    let three = f32c(&mut g, 3.0);
    let a = bin(&mut g, BinaryOp::Add, x, nz); // -> x
    let b = bin(&mut g, BinaryOp::Add, a, pz); // kept: x + 0.0 is not x for x = -0.0
    let c = bin(&mut g, BinaryOp::Sub, b, pz); // -> b
    let d = bin(&mut g, BinaryOp::Mul, one, c); // -> c
    let e = bin(&mut g, BinaryOp::Div, d, four); // -> d * 0.25
    let f = bin(&mut g, BinaryOp::Div, e, three); // kept: 1/3 is inexact
    let ny = un(&mut g, UnaryOp::Neg, y);
    let nny = un(&mut g, UnaryOp::Neg, ny); // -> y
    let h = bin(&mut g, BinaryOp::Add, f, ny); // -> f - y
    let k = bin(&mut g, BinaryOp::Sub, h, ny); // -> h + y
    let t1 = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[k]);
    let t2 = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[t1]); // -> k
    let r1 = node(&mut g, Op::Reshape { shape: vec![-1] }, &[t2]);
    let r2 = node(&mut g, Op::Reshape { shape: vec![3, 2] }, &[r1]); // -> reshape(k, [3, 2])
    let bc = node(&mut g, Op::BroadcastTo { shape: vec![3, 2] }, &[three]);
    let m = bin(&mut g, BinaryOp::Maximum, r2, bc); // -> maximum(r2, 3.0)
    let big = node(&mut g, Op::BroadcastTo { shape: vec![4, 3, 2] }, &[one]);
    let grow = bin(&mut g, BinaryOp::Mul, m, big); // kept: the broadcast grows the result
    let zero_i = g.add_constant(Storage::scalar(0i32));
    let one_i = g.add_constant(Storage::scalar(1i32));
    let ia = bin(&mut g, BinaryOp::Add, i, zero_i); // -> i
    let ib = bin(&mut g, BinaryOp::Div, ia, one_i); // -> i
    let never = bin(&mut g, BinaryOp::Mul, x, pz); // x * 0 is never folded
    g.outputs = vec![grow, nny, ib, never];
    let after = filetest_pass("simplify", &Simplify, &g, &PassContext::new("simplify"));
    let xs = Storage::from_vec(vec![-0.0f32, 0.0, f32::NAN, f32::INFINITY, -1.5, 3.0], &[2, 3]).unwrap();
    let ys = Storage::from_vec(vec![1.0f32, -0.0, 2.0, f32::NEG_INFINITY, 0.0, f32::NAN], &[2, 3]).unwrap();
    let is = Storage::from_vec(vec![i32::MIN, 0, 7], &[3]).unwrap();
    let args = [xs, ys, is];
    assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
}

#[test]
fn simplify_keeps_x_plus_positive_zero() {
    // The classic trap: x + 0.0 is not x when x is -0.0.
    let mut g = Graph::new("trap");
    let x = g.add_param(f32t(&[1]));
    let pz = f32c(&mut g, 0.0);
    g.outputs = vec![bin(&mut g, BinaryOp::Add, x, pz)];
    let (after, r) = run_checked(&Simplify, &g, &PassContext::new("trap"));
    assert!(!r.changed, "{after}");
    let out = interpret(&after, &[Storage::from_vec(vec![-0.0f32], &[1]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap()[0].to_bits(), 0.0f32.to_bits());
}

#[test]
fn golden_fusion_gelu_is_one_region() {
    let after = filetest_pass("fusion_gelu", &Fusion::default(), &gelu_graph(&[-1]), &PassContext::new("gelu"));
    assert_eq!(fused_bodies(&after).len(), 1);
    assert_eq!(after.len(), 2, "parameter + one region\n{after}");
}

#[test]
fn golden_fusion_softmax() {
    let after = filetest_pass("fusion_softmax", &Fusion::default(), &softmax_graph(), &PassContext::new("softmax"));
    let bodies = fused_bodies(&after);
    assert_eq!(bodies.len(), 3, "max | sub, exp, sum | div\n{after}");
    assert_eq!(count_ops(&after, "exp"), 1, "exp is computed once");
    assert_no_member_reads_a_reduction(&after);
}

#[test]
fn fusion_continues_after_reductions_when_the_executor_accepts_it() {
    // An executor running multi-pass regions (the JIT) accepts a whole softmax.
    let cx = PassContext::new("softmax").with_region_acceptor(Arc::new(|_: &Graph| true));
    let (after, _) = run_checked(&Fusion::default(), &softmax_graph(), &cx);
    assert_eq!(fused_bodies(&after).len(), 1, "the whole softmax is one region\n{after}");
    let args = [f32s(&[3, 8], 5)];
    assert!(same_results(&interpret(&softmax_graph(), &args).unwrap(), &interpret(&after, &args).unwrap()));
    // `reductions_end_regions` splits at reductions whatever the executor says.
    let split = Fusion { reductions_end_regions: true, ..Fusion::default() };
    let (after, _) = run_checked(&split, &softmax_graph(), &cx);
    assert_eq!(fused_bodies(&after).len(), 3, "max | sub, exp, sum | div\n{after}");
    assert_no_member_reads_a_reduction(&after);
}

#[test]
fn fusion_bounds_region_size_and_plans_a_long_chain() {
    // A chain twice the bound: two or more regions, each within it, and the
    // same results.
    let mut g = Graph::new("chain");
    let x = g.add_param(f32t(&[5]));
    let mut y = x;
    for i in 0..2 * tracejit_ir::passes::MAX_REGION_NODES + 3 {
        let op = if i % 2 == 0 { Op::Unary(UnaryOp::Tanh) } else { Op::Unary(UnaryOp::Neg) };
        y = node(&mut g, op, &[y]);
    }
    g.outputs.push(y);
    let (after, _) = run_checked(&Fusion::default(), &g, &PassContext::new("chain"));
    let bodies = fused_bodies(&after);
    assert!(bodies.len() >= 3, "{} regions", bodies.len());
    assert!(bodies.iter().all(|b| b.len() <= tracejit_ir::passes::MAX_REGION_NODES + 1));
    let args = [f32s(&[5], 6)];
    assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
}

#[test]
fn golden_fusion_layer_norm() {
    let after = filetest_pass("fusion_layer_norm", &Fusion::default(), &layer_norm_graph(), &PassContext::new("ln"));
    assert_no_member_reads_a_reduction(&after);
    assert_eq!(count_ops(&after, "sub"), 1, "no duplicated work");
}

#[test]
fn golden_fusion_matmul_epilogue() {
    let after = filetest_pass("fusion_dense", &Fusion::default(), &dense_relu_graph(), &PassContext::new("dense"));
    let bodies = fused_bodies(&after);
    assert_eq!(count_ops(&bodies[0], "add") + count_ops(&bodies[0], "relu"), 2, "{after}");
    assert_eq!(count_ops(&after, "matmul"), 2);
    assert!(bodies.iter().all(|b| count_ops(b, "matmul") == 0), "matmul is never fused");
    assert_eq!(count_ops(&after, "tanh"), 1);
    assert_eq!(bodies.len(), 2, "the lone tanh is a region of its own\n{after}");
    let lone = Fusion { single_node_regions: false, ..Fusion::default() };
    let (plain, _) = run_checked(&lone, &dense_relu_graph(), &PassContext::new("dense"));
    assert!(plain.nodes().any(|(_, n)| matches!(n.op, Op::Unary(UnaryOp::Tanh))), "{plain}");
    assert_eq!(fused_bodies(&plain).len(), 1);
}

#[test]
fn fusion_never_duplicates_an_expensive_producer() {
    // e = exp(b) over [3] feeds x * e over [4, 3] and a sum: e must not be
    // recomputed per row inside the bigger region.
    let mut g = Graph::new("bcast");
    let x = g.add_param(f32t(&[4, 3]));
    let b = g.add_param(f32t(&[3]));
    let e = un(&mut g, UnaryOp::Exp, b);
    let y = bin(&mut g, BinaryOp::Mul, x, e);
    let z = un(&mut g, UnaryOp::Tanh, y);
    // A cheap producer over the smaller space may be recomputed.
    let two = f32c(&mut g, 2.0);
    let b2 = bin(&mut g, BinaryOp::Mul, b, two);
    let w = bin(&mut g, BinaryOp::Add, z, b2);
    g.outputs = vec![w, e];
    let (after, _) = run_checked(&Fusion::default(), &g, &PassContext::new("bcast"));
    assert_eq!(count_ops(&after, "exp"), 1);
    for body in fused_bodies(&after) {
        if count_ops(&body, "tanh") == 1 {
            assert_eq!(count_ops(&body, "exp"), 0, "exp joined the [4, 3] region\n{after}");
            assert_eq!(count_ops(&body, "mul"), 2, "the cheap b * 2 joins\n{after}");
        }
    }
    let args = [f32s(&[4, 3], 3), f32s(&[3], 4)];
    assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
}

#[test]
fn fusion_respects_the_acceptance_rule() {
    let g = softmax_graph();
    let nothing = PassContext::new("softmax").with_region_acceptor(Arc::new(|_: &Graph| false));
    let (after, r) = run_checked(&Fusion::default(), &g, &nothing);
    assert!(!r.changed);
    assert!(fused_bodies(&after).is_empty());
    // An executor without reductions: only elementwise regions.
    let no_reduce = PassContext::new("softmax")
        .with_region_acceptor(Arc::new(|b: &Graph| count_ops(b, "sum") + count_ops(b, "max") == 0));
    let (after, _) = run_checked(&Fusion::default(), &gelu_graph(&[8]), &no_reduce);
    assert_eq!(fused_bodies(&after).len(), 1);
    let (after, _) = run_checked(&Fusion::default(), &g, &no_reduce);
    assert!(fused_bodies(&after).iter().all(|b| count_ops(b, "sum") + count_ops(b, "max") == 0), "{after}");
    assert!(default_accepts_region(&fused_bodies(&run_checked(&Fusion::default(), &g, &PassContext::new("s")).0)[0]));
}

#[test]
fn fusion_avoids_cycles_through_unfusible_nodes() {
    // a = exp(x); m = a @ w (unfusible); out = a + m: a and the add cannot
    // share a region (the region would feed and wait for the matmul).
    let mut g = Graph::new("cycle");
    let x = g.add_param(f32t(&[3, 3]));
    let w = g.add_param(f32t(&[3, 3]));
    let a = un(&mut g, UnaryOp::Exp, x);
    let a2 = un(&mut g, UnaryOp::Neg, a);
    let m = node(&mut g, Op::MatMul, &[a2, w]);
    let s = bin(&mut g, BinaryOp::Add, a, m);
    g.outputs = vec![un(&mut g, UnaryOp::Relu, s)];
    let (after, _) = run_checked(&Fusion::default(), &g, &PassContext::new("cycle"));
    let args = [f32s(&[3, 3], 1), f32s(&[3, 3], 2)];
    assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
    let bodies = fused_bodies(&after);
    assert_eq!(bodies.len(), 2, "exp, neg | add, relu: {after}");
    assert!(bodies.iter().all(|b| count_ops(b, "exp") + count_ops(b, "add") < 2), "{after}");
}

#[test]
fn fusion_avoids_cycles_between_regions() {
    // a1 = exp(x), b1 = tanh(x), a2 = a1 + b1, b2 = b1 * a1, with an executor
    // that takes neither {add, tanh} nor {mul, exp} in one region: regions
    // {a1, a2} and {b1, b2} would each need the other first.
    let mut g = Graph::new("cross");
    let x = g.add_param(f32t(&[4]));
    let a1 = un(&mut g, UnaryOp::Exp, x);
    let b1 = un(&mut g, UnaryOp::Tanh, x);
    let a2 = bin(&mut g, BinaryOp::Add, a1, b1);
    let b2 = bin(&mut g, BinaryOp::Mul, b1, a1);
    g.outputs = vec![a2, b2];
    let picky = PassContext::new("cross").with_region_acceptor(Arc::new(|b: &Graph| {
        let has = |n: &str| count_ops(b, n) > 0;
        !(has("add") && has("tanh") || has("mul") && has("exp"))
    }));
    let (after, _) = run_checked(&Fusion::default(), &g, &picky);
    let args = [f32s(&[4], 9)];
    assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
}

fn assert_no_member_reads_a_reduction(g: &Graph) {
    for body in fused_bodies(g) {
        for (_, n) in body.nodes() {
            for v in &n.inputs {
                assert!(
                    !matches!(body.node(v.node).op, Op::Reduce { .. }),
                    "a region member reads a reduction of its region:\n{body}"
                );
            }
        }
    }
}

#[test]
fn golden_default_pipeline() {
    let cx = PassContext::new("main").with_kernels(registry());
    let (after, report) = Pipeline::default_pipeline().run(&call_graph(), &cx).unwrap();
    assert_is_filetest_input("pipeline_default", &call_graph());
    assert!(report.changed_by("inline") && report.changed_by("selector") && report.changed_by("fusion"));
    let text = report.to_string();
    for name in ["inline", "selector", "const_fold", "simplify", "cse", "dce", "fusion", "fixpoint `simplify`"] {
        assert!(text.contains(name), "{text}");
    }
    assert_eq!(report.nodes_before, call_graph().len());
    assert_eq!(report.nodes_after, after.len());
}

// ---- the pass manager -------------------------------------------------------

/// Claims a change every time without changing anything.
struct Restless;
impl Pass for Restless {
    fn name(&self) -> &'static str {
        "restless"
    }
    fn run(&self, _g: &mut Graph, _cx: &PassContext) -> PassResult {
        PassResult::changed("nothing, really")
    }
}

/// Breaks the graph: an output type that inference disagrees with.
struct Vandal;
impl Pass for Vandal {
    fn name(&self) -> &'static str {
        "vandal"
    }
    fn run(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let last = g.nodes().map(|(id, _)| id).last().unwrap();
        g.node_mut(last).outputs[0] = TensorType::known(DType::I64, &[7]);
        PassResult::changed("broke it")
    }
}

struct Panicky;
impl Pass for Panicky {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn run(&self, _g: &mut Graph, _cx: &PassContext) -> PassResult {
        panic!("oops")
    }
}

#[test]
fn fixpoints_stop_at_the_cap_and_say_so() {
    let p = Pipeline::new(vec![Stage::Fixpoint { name: "loop", passes: vec![Box::new(Restless)], max_iterations: 3 }]);
    let (_, report) = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap();
    assert_eq!(report.passes.len(), 3);
    assert_eq!(report.fixpoints[0].rounds, 3);
    assert!(!report.fixpoints[0].converged);
    assert!(report.to_string().contains("stopped at the iteration cap after 3 round(s)"), "{report}");
    let (_, report) = Pipeline::default_pipeline().run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap();
    assert!(report.fixpoints[0].converged);
}

#[test]
fn a_verifier_failure_names_the_pass() {
    let p = Pipeline::new(vec![Stage::pass(Dce), Stage::pass(Vandal)])
        .with_options(OptimizationOptions { verify: Some(true), ..OptimizationOptions::default() });
    let e = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap_err();
    assert!(matches!(&e, IrError::Verifier { message, .. } if message.starts_with("after pass `vandal`")), "{e}");
    let p = Pipeline::new(vec![Stage::pass(Panicky)]);
    let e = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap_err();
    assert!(e.to_string().contains("pass `panicky` panicked: oops"), "{e}");
}

#[test]
fn passes_can_be_disabled_and_the_pipeline_switched_off() {
    let opts = OptimizationOptions::default().disable("fusion").disable("cse");
    let (after, report) =
        Pipeline::default_pipeline().with_options(opts).run(&softmax_graph(), &PassContext::new("s")).unwrap();
    assert!(fused_bodies(&after).is_empty());
    assert_eq!(report.pass("cse").count(), 0);
    assert_eq!(report.pass("dce").count(), 1);
    let (after, report) = Pipeline::default_pipeline()
        .with_options(OptimizationOptions::none())
        .run(&softmax_graph(), &PassContext::new("s"))
        .unwrap();
    assert_eq!(after.to_string(), softmax_graph().to_string());
    assert!(report.passes.is_empty() && !report.enabled);
    assert!(report.to_string().contains("optimizations off"));
    // Without the selector, composites are inlined by `inline` itself.
    let opts = OptimizationOptions { selector: false, ..OptimizationOptions::default() };
    let cx = PassContext::new("main").with_kernels(registry());
    let (after, _) = Pipeline::default_pipeline().with_options(opts).run(&call_graph(), &cx).unwrap();
    assert_eq!(count_ops(&after, "kernel") + count_ops(&after, "call"), 0, "{after}");
}

#[test]
fn dumps_are_written_in_pipeline_order() {
    let dir = std::env::temp_dir().join(format!("tracejit-dump-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = OptimizationOptions { dump_dir: Some(dir.clone()), ..OptimizationOptions::default() };
    let cx = PassContext { dump_prefix: Some("my fn.1".into()), ..PassContext::new("my fn") };
    let (_, report) = Pipeline::default_pipeline().with_options(opts).run(&gelu_graph(&[4]), &cx).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), report.passes.len() * 4, "{names:?}");
    assert_eq!(names[0], "my_fn.1.001.inline.before.dot");
    assert_eq!(names[1], "my_fn.1.001.inline.before.txt");
    assert_eq!(names[2], "my_fn.1.002.inline.after.dot");
    let txt: Vec<&String> = names.iter().filter(|n| n.ends_with(".txt")).collect();
    let order: Vec<&str> = txt.iter().map(|n| n.split('.').nth(3).unwrap()).collect();
    let expected: Vec<&str> = report.passes.iter().flat_map(|r| [r.pass, r.pass]).collect();
    assert_eq!(order, expected);
    let last = std::fs::read_to_string(dir.join(txt.last().unwrap())).unwrap();
    assert!(last.contains("fused"), "{last}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- Op::Kernel ------------------------------------------------------------

#[test]
fn kernel_nodes_infer_interpret_print_and_verify() {
    let mut g = Graph::new("k");
    let x = g.add_param(f32t(&[-1]));
    let op = Op::Kernel {
        name: "tracejit.test.double".into(),
        kernel: Arc::new(PlusHundred),
        inputs: vec![f32t(&[-1])],
        outputs: vec![f32t(&[-1])],
    };
    let k = node(&mut g, op.clone(), &[x]);
    g.outputs = vec![k];
    verify(&g).unwrap();
    assert!(g.to_string().contains(r#"%1 = kernel["tracejit.test.double"] %0 : f32[?]"#), "{g}");
    assert!(g.to_dot().contains("kernel"));
    let out = interpret(&g, &[Storage::from_vec(vec![1.0f32, 2.0], &[2]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![102.0, 104.0]);
    // eval_primitive runs it too, and checks what it returns.
    let x = Storage::from_vec(vec![1.0f32], &[1]).unwrap();
    assert_eq!(eval_primitive(&op, &[&x])[0].to_vec::<f32>().unwrap(), vec![102.0]);
    let liar = Op::Kernel {
        name: "tracejit.test.liar".into(),
        kernel: Arc::new(PlusHundred),
        inputs: vec![f32t(&[-1])],
        outputs: vec![TensorType::known(DType::F64, &[1])],
    };
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| eval_primitive(&liar, &[&x]))).unwrap_err();
    let msg = e.downcast_ref::<String>().unwrap();
    assert!(msg.contains("kernel `tracejit.test.liar`") && msg.contains("f64[1]"), "{msg}");
    // Arguments must fit the declared input types.
    let mut bad = Graph::new("bad");
    let y = bad.add_param(f32t(&[2, 2]));
    let err = bad.add_node(op, &[y], &[], None).unwrap_err();
    assert!(err.to_string().contains("kernel `tracejit.test.double`"), "{err}");
}

// ---- differential property test --------------------------------------------

/// Values that exercise IEEE corner cases.
const SPECIAL: [f32; 12] =
    [-0.0, 0.0, 1.0, -1.0, 2.0, 0.25, 3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.5, 1e-30];

const UNARY: [UnaryOp; 10] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Relu,
    UnaryOp::Sqrt,
    UnaryOp::Log,
    UnaryOp::Square,
    UnaryOp::Sigmoid,
    UnaryOp::Floor,
];
const BINARY: [BinaryOp; 6] =
    [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum];
const REDUCE: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Prod];

#[derive(Clone, Debug)]
struct Step {
    kind: u8,
    a: usize,
    b: usize,
    c: usize,
    flag: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..12, any::<usize>(), any::<usize>(), any::<usize>(), any::<bool>()).prop_map(|(kind, a, b, c, flag)| Step {
        kind,
        a,
        b,
        c,
        flag,
    })
}

/// Input data: special values and ordinary ones.
fn data(shape: &[usize], seed: u64) -> Storage {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if s % 3 == 0 {
                SPECIAL[(s >> 8) as usize % SPECIAL.len()]
            } else {
                ((s >> 11) % 1000) as f32 / 250.0 - 2.0
            }
        })
        .collect();
    Storage::from_vec(v, shape).unwrap()
}

/// A random graph of elementwise, broadcast, reduce, reshape and transpose
/// ops with constants, and inputs for it.
fn random_graph(base: &[usize], n_inputs: usize, unknown: bool, steps: &[Step], seed: u64) -> (Graph, Vec<Storage>) {
    let mut g = Graph::new("random");
    let mut vals: Vec<ValueId> = Vec::new();
    let mut args = Vec::new();
    for i in 0..n_inputs {
        let drop = i % (base.len() + 1);
        let shape: Vec<usize> = base[drop..].to_vec();
        let dims: Vec<i64> =
            shape.iter().enumerate().map(|(k, &d)| if unknown && k == 0 && i == 0 { -1 } else { d as i64 }).collect();
        vals.push(g.add_param(f32t(&dims)));
        args.push(data(&shape, seed.wrapping_add(i as u64)));
    }
    for s in steps {
        let n = vals.len();
        let a = vals[s.a % n];
        let b = vals[s.b % n];
        let ta = g.value_type(a).clone();
        let constant = |g: &mut Graph, k: usize| f32c(g, SPECIAL[k % SPECIAL.len()]);
        let v = match s.kind {
            0 | 1 => un(&mut g, UNARY[s.c % UNARY.len()], a),
            2 | 3 => {
                let op = BINARY[s.c % BINARY.len()];
                let tb = g.value_type(b);
                if tracejit_ir::broadcast_dims(&ta.dims, &tb.dims).is_some() {
                    bin(&mut g, op, a, b)
                } else {
                    let k = constant(&mut g, s.b);
                    bin(&mut g, op, a, k)
                }
            }
            4 | 5 => {
                // A binary op with a constant, on either side, maybe broadcast.
                let op = BINARY[s.c % BINARY.len()];
                let mut k = constant(&mut g, s.b);
                if s.kind == 5 {
                    if let Some(shape) = ta.shape() {
                        k = node(&mut g, Op::BroadcastTo { shape }, &[k]);
                    }
                }
                if s.flag {
                    bin(&mut g, op, k, a)
                } else {
                    bin(&mut g, op, a, k)
                }
            }
            6 if ta.rank() > 0 => {
                let axes: Vec<usize> = if s.flag { vec![ta.rank() - 1] } else { (0..ta.rank()).collect() };
                reduce(&mut g, REDUCE[s.c % REDUCE.len()], a, &axes, s.b % 2 == 0)
            }
            7 if ta.rank() > 1 => {
                let mut perm: Vec<usize> = (0..ta.rank()).collect();
                perm.rotate_left(1 + s.c % (ta.rank() - 1));
                let t = node(&mut g, Op::Transpose { perm: perm.clone() }, &[a]);
                if s.flag {
                    // Back again: the pair collapses.
                    let inv: Vec<usize> = (0..perm.len()).map(|i| perm.iter().position(|&p| p == i).unwrap()).collect();
                    node(&mut g, Op::Transpose { perm: inv }, &[t])
                } else {
                    t
                }
            }
            8 => {
                let flat = node(&mut g, Op::Reshape { shape: vec![-1] }, &[a]);
                match ta.shape() {
                    Some(shape) if s.flag => {
                        node(&mut g, Op::Reshape { shape: shape.iter().map(|&d| d as i64).collect() }, &[flat])
                    }
                    _ => flat,
                }
            }
            9 => {
                let n1 = un(&mut g, UnaryOp::Neg, b);
                if g.value_type(n1).dims.len() <= ta.dims.len()
                    && tracejit_ir::broadcast_dims(&ta.dims, &g.value_type(n1).dims).is_some()
                {
                    let op = if s.flag { BinaryOp::Add } else { BinaryOp::Sub };
                    bin(&mut g, op, a, n1)
                } else {
                    un(&mut g, UnaryOp::Neg, n1)
                }
            }
            10 => {
                // Duplicate work for CSE.
                let e1 = un(&mut g, UNARY[s.c % UNARY.len()], a);
                let e2 = un(&mut g, UNARY[s.c % UNARY.len()], a);
                bin(&mut g, BinaryOp::Add, e1, e2)
            }
            _ => {
                // Constant subexpressions for folding.
                let k1 = constant(&mut g, s.b);
                let k2 = constant(&mut g, s.c);
                let kk = bin(&mut g, BINARY[s.c % BINARY.len()], k1, k2);
                bin(&mut g, BinaryOp::Mul, a, kk)
            }
        };
        vals.push(v);
    }
    let n = vals.len();
    g.outputs = vec![vals[n - 1]];
    if n >= 3 {
        g.outputs.push(vals[n / 2]);
    }
    (g, args)
}

fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Inline),
        Box::new(SelectImplementation),
        Box::new(ConstantFolding),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Dce),
        Box::new(Fusion::default()),
        Box::new(Fusion { single_node_regions: false, ..Fusion::default() }),
        Box::new(Fusion { reductions_end_regions: false, ..Fusion::default() }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn optimized_graphs_compute_the_same_results(
        base in prop::collection::vec(1usize..4, 0..4),
        n_inputs in 1usize..4,
        unknown in any::<bool>(),
        steps in prop::collection::vec(step(), 1..14),
        seed in any::<u64>(),
    ) {
        let (g, args) = random_graph(&base, n_inputs, unknown, &steps, seed);
        verify(&g).unwrap();
        crate::common::assert_round_trip(&g);
        // An unknown dim can hide shapes that do not broadcast at run time.
        let want = interpret(&g, &args);
        prop_assume!(want.is_ok());
        let want = want.unwrap();
        // The whole pipeline.
        let (opt, _) = Pipeline::default_pipeline().run(&g, &PassContext::new("random")).unwrap();
        crate::common::assert_round_trip(&opt);
        let got = interpret(&opt, &args).unwrap();
        prop_assert!(same_results(&want, &got), "pipeline changed results\nwant {:?}\ngot {:?}\n{}\n{}", want, got, g, opt);
        // Every pass alone: verifier-clean, idempotent, same results.
        for pass in all_passes() {
            let (once, _) = run_checked(pass.as_ref(), &g, &PassContext::new("random"));
            crate::common::assert_round_trip(&once);
            let got = interpret(&once, &args).unwrap();
            prop_assert!(same_results(&want, &got), "{} changed results\n{}\n{}", pass.name(), g, once);
        }
    }
}
