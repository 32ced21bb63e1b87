//! Independent matrix products run side by side on two threads (a layer's
//! weight and input gradients): one pool dispatch for both, the bits of one
//! thread, any thread count; dependent products stay in order; a panic in
//! a pool task reaches the caller instead of aborting the process.

use crate::common::*;
use crate::serial;
use std::sync::Mutex;
use tracejit_ir::tensor::{BinaryOp, DType, Storage};
use tracejit_ir::{Graph, Op, ValueId};
use tracejit_jit::threads::{self, pool_dispatches, set_num_threads};
use tracejit_jit::Executable;

fn transpose(g: &mut Graph, x: ValueId) -> ValueId {
    node(g, Op::Transpose { perm: vec![1, 0] }, &[x])
}

/// A dense layer's backward: `dw = xᵀ·dy`, `dx = dy·wᵀ`, and with
/// `update`, `w - 0.01·dw` and `dx * 2` instead of them.
fn backward(b: usize, i: usize, o: usize, update: bool) -> (Graph, Vec<Storage>) {
    let mut g = Graph::new("backward");
    let x = param(&mut g, DType::F32, &[b, i]);
    let w = param(&mut g, DType::F32, &[i, o]);
    let dy = param(&mut g, DType::F32, &[b, o]);
    let xt = transpose(&mut g, x);
    let dw = node(&mut g, Op::MatMul, &[xt, dy]);
    let wt = transpose(&mut g, w);
    let dx = node(&mut g, Op::MatMul, &[dy, wt]);
    if update {
        let lr = scalar(&mut g, DType::F32, 0.01);
        let step = node(&mut g, Op::Binary(BinaryOp::Mul), &[dw, lr]);
        let w2 = node(&mut g, Op::Binary(BinaryOp::Sub), &[w, step]);
        let two = scalar(&mut g, DType::F32, 2.0);
        let dx2 = node(&mut g, Op::Binary(BinaryOp::Mul), &[dx, two]);
        g.outputs.extend([w2, dx2]);
    } else {
        g.outputs.extend([dw, dx]);
    }
    let ins = vec![
        data(DType::F32, &[b, i], 1, true),
        data(DType::F32, &[i, o], 2, true),
        data(DType::F32, &[b, o], 3, true),
    ];
    (g, ins)
}

fn bits(xs: &[Storage]) -> Vec<Vec<u32>> {
    xs.iter().map(|x| x.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

/// Runs `exe` on one thread (which must not enter the pool), then on two
/// and three, where the paired products take `dispatches` pool dispatches
/// (`None`: not checked) and give the bits of one thread; returns the
/// one-thread outputs (the count is left at 1).
fn same_bits_at_each_count(exe: &Executable, ins: &[Storage], dispatches: Option<u64>, what: &str) -> Vec<Storage> {
    set_num_threads(1);
    let before = pool_dispatches();
    let one = exe.run(ins).unwrap();
    assert_eq!(pool_dispatches(), before, "{what}: one thread entered the pool");
    for t in [2, 3] {
        set_num_threads(t);
        let before = pool_dispatches();
        let got = exe.run(ins).unwrap();
        if let Some(n) = dispatches {
            assert_eq!(pool_dispatches() - before, n, "{what}: dispatches at {t} threads");
        }
        assert_eq!(bits(&got), bits(&one), "{what}: {t} threads vs 1");
    }
    set_num_threads(1);
    one
}

#[test]
fn a_layers_two_gradients_run_side_by_side_with_the_bits_of_one_thread() {
    let _s = serial();
    // W6's second layer: 64 x 512 x 512, both products past the threshold,
    // the weight gradient's wᵀ view made between them (moved before).
    for update in [false, true] {
        let (g, ins) = backward(64, 512, 512, update);
        let exe = Executable::new(&g).unwrap();
        let listing = exe.profile(&ins, 1).unwrap().to_string();
        assert!(listing.contains("alongside"), "{listing}");
        // One dispatch for both (each alone would split: one each).
        let dispatches = (!update).then_some(1);
        let one = same_bits_at_each_count(&exe, &ins, dispatches, &format!("update {update}"));
        // The products themselves: the executor's GEMM on one thread.
        let kernels = |x: &Storage| tracejit_ir::tensor::kernels::transpose(x, &[1, 0]);
        let dw = tracejit_jit::matmul(&kernels(&ins[0]), &ins[2]);
        let dx = tracejit_jit::matmul(&ins[2], &kernels(&ins[1]));
        if update {
            let step = tracejit_ir::tensor::kernels::binary(BinaryOp::Mul, &dw, &Storage::scalar(0.01f32));
            let want = tracejit_ir::tensor::kernels::binary(BinaryOp::Sub, &ins[1], &step);
            assert_eq!(bits(&one[..1]), bits(&[want]));
        } else {
            assert_eq!(bits(&one), bits(&[dw, dx]));
        }
    }
}

/// `x` rounded to bf16 and widened back: what `auto_mixed_precision`
/// writes before a product, which the bf16 GEMM reads as bf16.
fn rounded(g: &mut Graph, x: ValueId) -> ValueId {
    let low = node(g, Op::Cast { to: DType::BF16 }, &[x]);
    node(g, Op::Cast { to: DType::F32 }, &[low])
}

#[test]
fn bf16_products_pair_too_with_the_bits_of_one_thread() {
    let _s = serial();
    // W6's second layer again, its operands rounded to bf16: both products
    // run on the bf16 GEMM, side by side.
    let (b, i, o) = (64, 512, 512);
    let mut g = Graph::new("backward_bf16");
    let x = param(&mut g, DType::F32, &[b, i]);
    let w = param(&mut g, DType::F32, &[i, o]);
    let dy = param(&mut g, DType::F32, &[b, o]);
    let (xt, wt) = (transpose(&mut g, x), transpose(&mut g, w));
    let (xt, wt, dy) = (rounded(&mut g, xt), rounded(&mut g, wt), rounded(&mut g, dy));
    let dw = node(&mut g, Op::MatMul, &[xt, dy]);
    let dx = node(&mut g, Op::MatMul, &[dy, wt]);
    g.outputs.extend([dw, dx]);
    let ins = vec![
        data(DType::F32, &[b, i], 1, true),
        data(DType::F32, &[i, o], 2, true),
        data(DType::F32, &[b, o], 3, true),
    ];
    let exe = Executable::new(&g).unwrap();
    let listing = exe.profile(&ins, 1).unwrap().to_string();
    assert!(listing.contains("alongside") && listing.contains("gemm_bf16"), "{listing}");
    let one = same_bits_at_each_count(&exe, &ins, Some(1), "bf16");
    // The products of the rounded operands, summed in f32 in another order.
    let k = tracejit_ir::tensor::kernels::cast;
    let round = |x: &Storage| k(&k(x, DType::BF16), DType::F32);
    let tr = |x: &Storage| tracejit_ir::tensor::kernels::transpose(x, &[1, 0]);
    let want = [
        tracejit_jit::matmul(&round(&tr(&ins[0])), &round(&ins[2])),
        tracejit_jit::matmul(&round(&ins[2]), &round(&tr(&ins[1]))),
    ];
    for (got, want) in one.iter().zip(&want) {
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-5 * top, "{err} of {top}");
    }
}

#[test]
fn a_stack_of_rows_times_a_matrix_pairs_too() {
    let _s = serial();
    // A transformer's `dy · wᵀ` multiplies a [batch, seq, width] stack: one
    // product of all its rows, paired with an independent 2-D product,
    // on the f32 GEMM and on the bf16 one.
    for bf16 in [false, true] {
        let mut g = Graph::new("stacked");
        let a = param(&mut g, DType::F32, &[8, 8, 512]);
        let w1 = param(&mut g, DType::F32, &[512, 512]);
        let b = param(&mut g, DType::F32, &[64, 512]);
        let w2 = param(&mut g, DType::F32, &[512, 384]);
        let ops: Vec<ValueId> =
            if bf16 { [a, w1, b, w2].into_iter().map(|v| rounded(&mut g, v)).collect() } else { vec![a, w1, b, w2] };
        let p1 = node(&mut g, Op::MatMul, &[ops[0], ops[1]]);
        let p2 = node(&mut g, Op::MatMul, &[ops[2], ops[3]]);
        g.outputs.extend([p1, p2]);
        let ins = vec![
            data(DType::F32, &[8, 8, 512], 4, true),
            data(DType::F32, &[512, 512], 5, true),
            data(DType::F32, &[64, 512], 6, true),
            data(DType::F32, &[512, 384], 7, true),
        ];
        let exe = Executable::new(&g).unwrap();
        let listing = exe.profile(&ins, 1).unwrap().to_string();
        assert!(listing.contains("alongside"), "bf16 {bf16}: {listing}");
        let one = same_bits_at_each_count(&exe, &ins, Some(1), &format!("stacked, bf16 {bf16}"));
        assert_eq!(one[0].shape(), &[8, 8, 512]);
        if !bf16 {
            assert_eq!(bits(&one[..1]), bits(&[tracejit_jit::matmul(&ins[0], &ins[1])]));
        }
    }
}

#[test]
fn small_or_dependent_products_are_not_paired() {
    let _s = serial();
    // Under the GEMM threshold: nothing to gain from a second thread.
    let (g, ins) = backward(8, 16, 16, true);
    let exe = Executable::new(&g).unwrap();
    assert!(!exe.profile(&ins, 1).unwrap().to_string().contains("alongside"));
    // (a·b)·c: the second needs the first.
    let mut g = Graph::new("chain");
    let a = param(&mut g, DType::F32, &[64, 512]);
    let b = param(&mut g, DType::F32, &[512, 512]);
    let c = param(&mut g, DType::F32, &[512, 512]);
    let ab = node(&mut g, Op::MatMul, &[a, b]);
    let abc = node(&mut g, Op::MatMul, &[ab, c]);
    g.outputs.push(abc);
    let exe = Executable::new(&g).unwrap();
    let ins = [
        data(DType::F32, &[64, 512], 1, false),
        data(DType::F32, &[512, 512], 2, false),
        data(DType::F32, &[512, 512], 3, false),
    ];
    assert!(!exe.profile(&ins, 1).unwrap().to_string().contains("alongside"));
    // Independent but four times apart: the larger one alone on a thread
    // would outlast both split over the pool.
    let mut g = Graph::new("unbalanced");
    let (x, y) = (param(&mut g, DType::F32, &[64, 512]), param(&mut g, DType::F32, &[256, 512]));
    let w = param(&mut g, DType::F32, &[512, 512]);
    let (p, q) = (node(&mut g, Op::MatMul, &[x, w]), node(&mut g, Op::MatMul, &[y, w]));
    g.outputs.extend([p, q]);
    let uneven = [
        data(DType::F32, &[64, 512], 1, false),
        data(DType::F32, &[256, 512], 2, false),
        data(DType::F32, &[512, 512], 3, false),
    ];
    let listing = Executable::new(&g).unwrap().profile(&uneven, 1).unwrap().to_string();
    assert!(!listing.contains("alongside"), "{listing}");
    set_num_threads(1);
    let one = exe.run(&ins).unwrap();
    set_num_threads(2);
    let before = pool_dispatches();
    let two = exe.run(&ins).unwrap();
    // Each product split on its own.
    assert_eq!(pool_dispatches() - before, 2);
    set_num_threads(1);
    assert_eq!(bits(&one), bits(&two));
}

#[test]
fn a_panic_in_a_pool_task_reaches_the_caller() {
    let _s = serial();
    set_num_threads(2);
    for bad_block in [0usize, 1, 3] {
        let r = tracejit_ir::catch_quietly(|| {
            let next = std::sync::atomic::AtomicUsize::new(0);
            threads::run_gemm_blocks(64, 4096, 512, &|_, _| {
                if next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == bad_block {
                    panic!("block {bad_block} failed");
                }
            });
        });
        let p = r.expect_err("the panic came back");
        assert_eq!(tracejit_ir::panic_message(&*p), format!("block {bad_block} failed"));
    }
    // The pool still works.
    let seen = Mutex::new(0usize);
    threads::run_gemm_blocks(64, 4096, 512, &|_, _| *seen.lock().unwrap() += 1);
    assert_eq!(*seen.lock().unwrap(), threads::gemm_blocks(64, 4096, 512).count);
    set_num_threads(1);
}
