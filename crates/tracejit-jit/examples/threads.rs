//! Where splitting a kernel across threads starts to pay (not a benchmark
//! harness): for a cheap elementwise kernel, a heavy one (tanh) and a
//! softmax, the median time per call on 1 thread, and on 2 threads with the
//! work forced to split (threshold 1), over a sweep of sizes; and the same
//! for matrix products. The sizes where the 2-thread time drops below the
//! 1-thread time, in cost units, set `threads::DEFAULT_SPLIT_THRESHOLD`
//! (a kernel splits in two at twice the threshold) and
//! `DEFAULT_GEMM_THRESHOLD`.
//!
//! Run pinned to two cores:
//! `taskset -c 0-1 cargo run --release -p tracejit-jit --example threads`.

use std::time::Instant;

use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, TensorType, ValueId};
use tracejit_jit::threads::{
    set_gemm_threshold, set_num_threads, set_split_threshold, DEFAULT_GEMM_THRESHOLD, DEFAULT_SPLIT_THRESHOLD,
};
use tracejit_jit::Executable;

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    ValueId::from(g.add_node(op, inputs, &[], None).unwrap())
}

fn k(g: &mut Graph, v: f64) -> ValueId {
    g.add_constant(Storage::scalar_of(DType::F32, v))
}

/// Median seconds per call of `f` over about 0.2 s.
fn median(f: &dyn Fn()) -> f64 {
    f();
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().as_secs_f64().max(1e-7);
    let reps = ((0.2 / once) as usize).clamp(5, 20_000);
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn data(shape: &[usize]) -> Storage {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2000) as f32 / 500.0 - 2.0).collect();
    Storage::from_vec(v, shape).unwrap()
}

/// `x * 1.0001 + 0.001` (cost 4 units per element: load, mul, add, store).
fn cheap(n: usize) -> (Graph, u64) {
    let mut g = Graph::new("cheap");
    let x = g.add_param(TensorType::known(DType::F32, &[n]));
    let (a, b) = (k(&mut g, 1.0001), k(&mut g, 0.001));
    let t = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, a]);
    let y = node(&mut g, Op::Binary(BinaryOp::Add), &[t, b]);
    g.outputs.push(y);
    (g, 4)
}

/// `tanh(x * 0.5)` (cost 11: load, mul, tanh 8, store).
fn heavy(n: usize) -> (Graph, u64) {
    let mut g = Graph::new("heavy");
    let x = g.add_param(TensorType::known(DType::F32, &[n]));
    let a = k(&mut g, 0.5);
    let t = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, a]);
    let y = node(&mut g, Op::Unary(UnaryOp::Tanh), &[t]);
    g.outputs.push(y);
    (g, 11)
}

/// Softmax over rows of 1024 (cost 14).
fn softmax(rows: usize) -> (Graph, u64) {
    let mut g = Graph::new("softmax");
    let x = g.add_param(TensorType::known(DType::F32, &[rows, 1024]));
    let red = |g: &mut Graph, op, v| node(g, Op::Reduce { op, axes: vec![1], keepdims: true }, &[v]);
    let m = red(&mut g, ReduceOp::Max, x);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = red(&mut g, ReduceOp::Sum, e);
    let y = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs.push(y);
    (g, 14)
}

fn sweep(name: &str, sizes: &[usize], build: fn(usize) -> (Graph, u64), shape: fn(usize) -> Vec<usize>) {
    println!("\n{name}: elements, work units, 1 thread µs, 2 threads (forced split) µs, ratio");
    for &s in sizes {
        let (g, cost) = build(s);
        let exe = Executable::new(&g).unwrap();
        let x = data(&shape(s));
        let elems = x.len();
        let run = || drop(exe.run(std::slice::from_ref(&x)).unwrap());
        set_num_threads(1);
        let one = median(&run);
        set_num_threads(2);
        set_split_threshold(1);
        let d0 = tracejit_jit::threads::pool_dispatches();
        run();
        let dispatches = tracejit_jit::threads::pool_dispatches() - d0;
        let two = median(&run);
        set_split_threshold(DEFAULT_SPLIT_THRESHOLD);
        println!(
            "  {elems:>8} {:>9} {:>9.2} {:>9.2} {:>6.2}x  ({dispatches} dispatches, {} kernels)",
            elems as u64 * cost,
            one * 1e6,
            two * 1e6,
            one / two,
            exe.num_regions()
        );
    }
}

fn main() {
    let sizes = [1 << 10, 1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 20];
    sweep("x * a + b", &sizes, cheap, |n| vec![n]);
    sweep("tanh(x * a)", &sizes, heavy, |n| vec![n]);
    sweep("softmax [rows, 1024]", &[1, 2, 4, 8, 16, 32, 64, 256, 1024], softmax, |r| vec![r, 1024]);

    println!(
        "\nmatmul [m, k] x [k, n]: multiply-adds, blocks, one gemm call µs, 1 thread µs, 2 threads µs, 2 vs 1 thread"
    );
    for (m, kk, n) in [
        (32, 64, 128),
        (32, 128, 128),
        (64, 128, 128),
        (64, 256, 256),
        (64, 256, 1024),
        (64, 784, 512),
        (64, 512, 784),
        (784, 64, 512),
        (512, 64, 512),
    ] {
        let (a, b) = (data(&[m, kk]), data(&[kk, n]));
        let run = || drop(tracejit_jit::matmul(&a, &b));
        let blocks = tracejit_jit::threads::gemm_blocks(m, n, kk).count;
        let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let mut c = vec![0f32; m * n];
        let c_ptr = c.as_mut_ptr() as usize;
        // The product as one `gemm` call, unblocked: what cutting it into
        // blocks costs on one thread.
        let whole = || unsafe {
            gemm::gemm(
                m,
                n,
                kk,
                c_ptr as *mut f32,
                1,
                n as isize,
                false,
                av.as_ptr(),
                1,
                kk as isize,
                bv.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        };
        let one_call = median(&whole);
        set_num_threads(1);
        let one = median(&run);
        set_num_threads(2);
        // Every product through the pool.
        set_gemm_threshold(0);
        let two = median(&run);
        set_gemm_threshold(DEFAULT_GEMM_THRESHOLD);
        println!(
            "  {m}x{kk}x{n}: {:>9} {blocks:>3} {:>9.2} {:>9.2} {:>9.2} {:>6.2}x",
            m * kk * n,
            one_call * 1e6,
            one * 1e6,
            two * 1e6,
            one / two
        );
        drop(c);
    }
    set_num_threads(0);
}
