//! Elementwise regions that write their output over an input dying at
//! their step (an optimizer's `w - lr·dw` over the GEMM's `dw`): the same
//! bits as the reference kernels on the same operands, on any sizes,
//! special values, broadcasts and thread counts; never over a buffer
//! anything else still holds (a graph output, a result of an earlier call
//! the caller kept); only where the kernel reads each element for its own
//! output alone.

use crate::common::*;
use proptest::prelude::*;
use tracejit_ir::tensor::{kernels, BinaryOp, DType, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};
use tracejit_jit::threads;
use tracejit_jit::Executable;

/// `t = a @ b` (a GEMM: a value no region can absorb), then the listed
/// consumers of `t`; returns the graph and `t`.
fn product(m: usize, k: usize, n: usize) -> (Graph, ValueId) {
    let mut g = Graph::new("in_place");
    let a = param(&mut g, DType::F32, &[m, k]);
    let b = param(&mut g, DType::F32, &[k, n]);
    let t = node(&mut g, Op::MatMul, &[a, b]);
    (g, t)
}

fn bin(g: &mut Graph, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    node(g, Op::Binary(op), &[x, y])
}

/// What each step of `exe` says about writing in place.
fn in_place_steps(exe: &Executable, inputs: &[Storage]) -> Vec<String> {
    let p = exe.profile(inputs, 1).unwrap();
    p.steps.iter().filter(|s| s.what.contains("in place")).map(|s| s.what.clone()).collect()
}

/// `w - t * lr` from the reference kernels, on the executor's own `t`.
fn update_ref(t: &Storage, w: &Storage, lr: f32) -> Storage {
    let scaled = kernels::binary(BinaryOp::Mul, t, &Storage::scalar(lr));
    kernels::binary(BinaryOp::Sub, w, &scaled)
}

fn dims() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![0usize, 1, 3, 5, 64, 1023])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn an_update_over_the_dying_product_gives_the_reference_bits(
        m in dims(), k in prop::sample::select(vec![1usize, 3, 17]), n in dims(),
        special in any::<bool>(), broadcast_w in any::<bool>(), threads_n in 1usize..3, seed in 0u64..1000,
    ) {
        let (mut g, t) = product(m, k, n);
        // w broadcasts along the rows or matches t's shape.
        let w_shape = if broadcast_w { vec![1, n] } else { vec![m, n] };
        let w = param(&mut g, DType::F32, &w_shape);
        let lr = scalar(&mut g, DType::F32, 0.01);
        let scaled = bin(&mut g, BinaryOp::Mul, t, lr);
        let out = bin(&mut g, BinaryOp::Sub, w, scaled);
        g.outputs.push(out);
        let exe = Executable::new(&g).unwrap();
        let ins = [
            data(DType::F32, &[m, k], seed, special),
            data(DType::F32, &[k, n], seed + 1, special),
            data(DType::F32, &w_shape, seed + 2, special),
        ];
        let t_val = tracejit_jit::matmul(&ins[0], &ins[1]);
        let want = update_ref(&t_val, &ins[2], 0.01);
        let _s = crate::serial();
        threads::set_split_threshold(1 << 10);
        threads::set_num_threads(threads_n);
        let first = exe.run(&ins);
        let second = exe.run(&ins);
        threads::set_num_threads(1);
        threads::set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
        let (first, second) = (first.unwrap(), second.unwrap());
        exact_eq(&first[0], &want).map_err(TestCaseError::fail)?;
        // The first call's result, still held, was not the second's buffer.
        exact_eq(&second[0], &want).map_err(TestCaseError::fail)?;
        exact_eq(&first[0], &want).map_err(|e| TestCaseError::fail(format!("a held result changed: {e}")))?;
        // (One element runs as reference ops, no region; an empty one
        // has nothing to alias.)
        let listed = in_place_steps(&exe, &ins);
        prop_assert_eq!(listed.len(), usize::from(m * n > 1), "the update writes over t: {:?}", listed);
    }
}

#[test]
fn a_value_that_lives_on_is_never_overwritten() {
    // t is a graph output too: the update must not write over it.
    let (mut g, t) = product(64, 8, 96);
    let w = param(&mut g, DType::F32, &[64, 96]);
    let lr = scalar(&mut g, DType::F32, 0.5);
    let scaled = bin(&mut g, BinaryOp::Mul, t, lr);
    let out = bin(&mut g, BinaryOp::Sub, w, scaled);
    g.outputs.extend([t, out]);
    let exe = Executable::new(&g).unwrap();
    let ins = [
        data(DType::F32, &[64, 8], 1, true),
        data(DType::F32, &[8, 96], 2, true),
        data(DType::F32, &[64, 96], 3, true),
    ];
    let got = exe.run(&ins).unwrap();
    let t_val = tracejit_jit::matmul(&ins[0], &ins[1]);
    exact_eq(&got[0], &t_val).unwrap();
    exact_eq(&got[1], &update_ref(&t_val, &ins[2], 0.5)).unwrap();
    assert!(in_place_steps(&exe, &ins).is_empty(), "t outlives the update");
}

#[test]
fn only_kernels_that_read_each_element_for_its_own_output_qualify() {
    let ins = |m: usize, n: usize| [data(DType::F32, &[m, 4], 1, false), data(DType::F32, &[4, n], 2, false)];
    let t_of = |ins: &[Storage]| tracejit_jit::matmul(&ins[0], &ins[1]);
    // t * t - exp(t): several loads of t, one elementwise output: in place.
    let (mut g, t) = product(32, 4, 48);
    let sq = bin(&mut g, BinaryOp::Mul, t, t);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[t]);
    let out = bin(&mut g, BinaryOp::Sub, sq, e);
    g.outputs.push(out);
    let exe = Executable::new(&g).unwrap();
    let x = ins(32, 48);
    assert_eq!(in_place_steps(&exe, &x).len(), 1);
    let got = exe.run(&x).unwrap();
    let tv = t_of(&x);
    let want = tracejit_ir::interpret(&region_of(&g), &[tv]).unwrap();
    close(&got[0], &want[0], 1e-6, 1e-12).unwrap();

    // A row reduction (softmax-like: t - max(t)) reads a row many times:
    // its output takes a fresh buffer.
    let (mut g, t) = product(32, 4, 48);
    let mx = node(&mut g, Op::Reduce { op: tracejit_ir::tensor::ReduceOp::Max, axes: vec![1], keepdims: true }, &[t]);
    let out = bin(&mut g, BinaryOp::Sub, t, mx);
    g.outputs.push(out);
    let exe = Executable::new(&g).unwrap();
    assert!(in_place_steps(&exe, &x).is_empty());
    let got = exe.run(&x).unwrap();
    let tv = t_of(&x);
    let want =
        kernels::binary(BinaryOp::Sub, &tv, &kernels::reduce(tracejit_ir::tensor::ReduceOp::Max, &tv, &[1], true));
    exact_eq(&got[0], &want).unwrap();

    // An output of another shape than t (t broadcast up) cannot take t's
    // buffer.
    let (mut g, t) = product(1, 4, 48);
    let w = param(&mut g, DType::F32, &[32, 48]);
    let out = bin(&mut g, BinaryOp::Add, w, t);
    g.outputs.push(out);
    let exe = Executable::new(&g).unwrap();
    let x = [
        data(DType::F32, &[1, 4], 1, false),
        data(DType::F32, &[4, 48], 2, false),
        data(DType::F32, &[32, 48], 3, false),
    ];
    assert!(in_place_steps(&exe, &x).is_empty());
    let got = exe.run(&x).unwrap();
    exact_eq(&got[0], &kernels::binary(BinaryOp::Add, &x[2], &t_of(&x))).unwrap();
}

/// The graph after `t`: one param standing for `t`, the same consumers.
fn region_of(g: &Graph) -> Graph {
    let mut h = Graph::new("after_t");
    let t = param(&mut h, DType::F32, &[32, 48]);
    let sq = bin(&mut h, BinaryOp::Mul, t, t);
    let e = node(&mut h, Op::Unary(UnaryOp::Exp), &[t]);
    let out = bin(&mut h, BinaryOp::Sub, sq, e);
    h.outputs.push(out);
    assert_eq!(g.outputs.len(), 1);
    h
}
