//! Tests of the passes: the assertions that go with the golden listings (the
//! listings themselves are filetests, see `filetests.rs`; the graphs built
//! here must equal those files' inputs), idempotence and
//! verifier-cleanliness of every pass, and the fusion rule. The pass manager
//! is tested in `pipeline.rs`, the differential property test is in
//! `pass_props.rs`; both share the helpers and sample graphs here.

use std::collections::HashMap;
use std::sync::Arc;

use tracejit_ir::passes::{
    default_accepts_region, ConstantFolding, Cse, Dce, Fusion, Inline, KernelRegistry, Pass, PassContext, PassResult,
    Pipeline, SelectImplementation, Simplify,
};
use tracejit_ir::tensor::{kernels, BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{
    interpret, verify, AssignKind, ExternalKernel, FunctionAttrs, Graph, LibraryFunction, Op, TensorType, ValueId,
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
pub(crate) fn filetest_pass(name: &str, pass: &dyn Pass, g: &Graph, cx: &PassContext) -> Graph {
    assert_is_filetest_input(name, g);
    run_checked(pass, g, cx).0
}

/// Asserts that `g` is structurally the input graph of filetest `name`.
pub(crate) fn assert_is_filetest_input(name: &str, g: &Graph) {
    if let Some(diff) = filetest_input(name).structural_diff(g) {
        panic!("filetest `{name}` does not hold the graph this test builds: {diff}\n{g:#}");
    }
}

/// Results equal bitwise, except that any NaN equals any NaN (rewrites may
/// change a NaN's sign or payload, see the `passes` module docs).
pub(crate) fn same_results(a: &[Storage], b: &[Storage]) -> bool {
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

pub(crate) fn f32c(g: &mut Graph, v: f32) -> ValueId {
    g.add_constant(Storage::scalar(v))
}

pub(crate) fn un(g: &mut Graph, u: UnaryOp, x: ValueId) -> ValueId {
    node(g, Op::Unary(u), &[x])
}

pub(crate) fn bin(g: &mut Graph, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    node(g, Op::Binary(b), &[x, y])
}

pub(crate) fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: &[usize], keepdims: bool) -> ValueId {
    node(g, Op::Reduce { op, axes: axes.to_vec(), keepdims }, &[x])
}

pub(crate) fn function(name: &str, implements: Option<&str>, graph: Graph) -> LibraryFunction {
    let attrs = FunctionAttrs { implements: implements.map(str::to_string) };
    LibraryFunction { name: name.to_string(), attrs, graph: Arc::new(graph) }
}

pub(crate) fn call(g: &mut Graph, func: tracejit_ir::FuncId, args: &[ValueId]) -> ValueId {
    node(g, Op::Call { func }, args)
}

/// Counts nodes with op name `name`, inside fused regions too.
pub(crate) fn count_ops(g: &Graph, name: &str) -> usize {
    g.nodes()
        .map(|(_, n)| match &n.op {
            Op::Fused { body } => count_ops(body, name),
            op => usize::from(op.name() == name),
        })
        .sum()
}

pub(crate) fn fused_bodies(g: &Graph) -> Vec<Arc<Graph>> {
    g.nodes()
        .filter_map(|(_, n)| match &n.op {
            Op::Fused { body } => Some(body.clone()),
            _ => None,
        })
        .collect()
}

/// A kernel for tests: `x * 2 + 100`, so a test can tell it ran.
#[derive(Debug)]
pub(crate) struct PlusHundred;

impl ExternalKernel for PlusHundred {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        let two = kernels::binary(BinaryOp::Add, &inputs[0], &inputs[0]);
        vec![kernels::binary(BinaryOp::Add, &two, &Storage::scalar(100.0f32))]
    }
}

/// A registry with fixed kernels, accepting f32 inputs only.
pub(crate) struct TestKernels(HashMap<String, Arc<dyn ExternalKernel>>);

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
pub(crate) fn call_graph() -> Graph {
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

pub(crate) fn gelu_graph(dims: &[i64]) -> Graph {
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

pub(crate) fn softmax_graph() -> Graph {
    let mut g = Graph::new("softmax");
    let x = g.add_param(f32t(&[-1, 8]));
    let m = reduce(&mut g, ReduceOp::Max, x, &[1], true);
    let d = bin(&mut g, BinaryOp::Sub, x, m);
    let e = un(&mut g, UnaryOp::Exp, d);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1], true);
    g.outputs = vec![bin(&mut g, BinaryOp::Div, e, s)];
    g
}

pub(crate) fn layer_norm_graph() -> Graph {
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

pub(crate) fn dense_relu_graph() -> Graph {
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
    let r = ValueId::from(g.add_node(Op::ReadVariable { var: v, locked: false }, &[], &[], None).unwrap());
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
    let r1 = ValueId::from(g.add_node(Op::ReadVariable { var: v, locked: false }, &[], &[], None).unwrap());
    let r2 = ValueId::from(g.add_node(Op::ReadVariable { var: v, locked: false }, &[], &[], None).unwrap());
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
    let a =
        node_ctrl(&mut g, Op::AssignVariable { var: v, kind: AssignKind::Add, locked: false }, &[upd], &[ordered.node]);
    let r = ValueId::from(node_ctrl(&mut g, Op::ReadVariable { var: v, locked: false }, &[], &[a]));
    let _unused_read = node_ctrl(&mut g, Op::ReadVariable { var: v, locked: false }, &[], &[a]);
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

pub(crate) fn assert_no_member_reads_a_reduction(g: &Graph) {
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
    for name in ["inline", "selector", "hoist", "const_fold", "simplify", "cse", "dce", "fusion", "fixpoint `simplify`"]
    {
        assert!(text.contains(name), "{text}");
    }
    assert_eq!(report.nodes_before, call_graph().len());
    assert_eq!(report.nodes_after, after.len());
}
