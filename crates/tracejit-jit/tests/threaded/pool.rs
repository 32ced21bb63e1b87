//! Kernels and GEMMs split across the thread pool give the same bits with
//! 1, 2 and 3 threads, and the interpreter's results; small kernels never
//! enter the pool.
//!
//! The split threshold is lowered in most tests so that tensors of a few
//! thousand elements already split (at sizes around it: some parts hold a
//! single row or one element granule); `large_kernels_enter_the_pool` and
//! `small_kernels_never_enter_the_pool` use the default. The thread count
//! and threshold are process-wide, so the tests take turns
//! (`crate::serial`, with the other tests of this binary).

use crate::common::*;
use crate::serial;
use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};
use tracejit_jit::threads::{self, pool_dispatches, set_num_threads, set_split_threshold};
use tracejit_jit::Executable;

fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: &[usize], keepdims: bool) -> ValueId {
    node(g, Op::Reduce { op, axes: axes.to_vec(), keepdims }, &[x])
}

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    node(g, Op::Binary(op), &[a, b])
}

fn un(g: &mut Graph, op: UnaryOp, a: ValueId) -> ValueId {
    node(g, Op::Unary(op), &[a])
}

/// Bitwise equality, NaN payloads included.
fn same_bits(a: &[Storage], b: &[Storage]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} outputs vs {}", a.len(), b.len()));
    }
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        if !x.bit_eq(y) {
            return Err(format!("output {k} differs: {:?}", exact_eq(x, y).err()));
        }
    }
    Ok(())
}

/// Runs `g` through an `Executable` with 1, 2 and 3 threads; checks the
/// three agree bit for bit and returns the 1-thread results. With
/// `must_split`, the 2- and 3-thread runs must each have entered the pool
/// (so the split paths really ran).
fn run_each_count(g: &Graph, inputs: &[Storage], must_split: bool) -> Result<Vec<Storage>, String> {
    let exe = Executable::new(g).map_err(|e| e.to_string())?;
    set_num_threads(1);
    let before = pool_dispatches();
    let one = exe.run(inputs).map_err(|e| e.to_string())?;
    if pool_dispatches() != before {
        return Err("1 thread entered the pool".into());
    }
    for t in [2, 3] {
        set_num_threads(t);
        let before = pool_dispatches();
        let got = exe.run(inputs).map_err(|e| e.to_string())?;
        if must_split && pool_dispatches() == before {
            return Err(format!("{t} threads: the kernel did not split"));
        }
        same_bits(&got, &one).map_err(|e| format!("{t} threads vs 1: {e}"))?;
    }
    set_num_threads(1);
    Ok(one)
}

/// Sizes around the split points: single rows, one element granule (512)
/// and a bit, odd counts.
fn rows() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![0usize, 1, 2, 3, 5, 7, 64])
}

fn cols() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![0usize, 1, 3, 5, 63, 64, 65, 511, 512, 513, 1023, 1025, 2049])
}

/// `a * 1.5 + b - max(a, b) / 3` and `tanh` of it (exact ops, then an
/// approximated one), elementwise over `[r, c]` with `b` broadcast along
/// the rows.
fn elementwise(dt: DType, r: usize, c: usize, broadcast: bool) -> Graph {
    let mut g = Graph::new("ew");
    let a = param(&mut g, dt, &[r, c]);
    let b_shape = if broadcast { vec![c] } else { vec![r, c] };
    let b = param(&mut g, dt, &b_shape);
    let k = scalar(&mut g, dt, 1.5);
    let t = bin(&mut g, BinaryOp::Mul, a, k);
    let t = bin(&mut g, BinaryOp::Add, t, b);
    let m = bin(&mut g, BinaryOp::Maximum, a, b);
    let three = scalar(&mut g, dt, 3.0);
    let m = bin(&mut g, BinaryOp::Div, m, three);
    let y = bin(&mut g, BinaryOp::Sub, t, m);
    let z = un(&mut g, UnaryOp::Tanh, y);
    g.outputs.push(y);
    g.outputs.push(z);
    g
}

fn softmax(dt: DType, r: usize, c: usize) -> Graph {
    let mut g = Graph::new("softmax");
    let x = param(&mut g, dt, &[r, c]);
    let m = reduce(&mut g, ReduceOp::Max, x, &[1], true);
    let d = bin(&mut g, BinaryOp::Sub, x, m);
    let e = un(&mut g, UnaryOp::Exp, d);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1], true);
    let y = bin(&mut g, BinaryOp::Div, e, s);
    g.outputs.push(y);
    g
}

fn layernorm(dt: DType, r: usize, c: usize) -> Graph {
    let mut g = Graph::new("layernorm");
    let x = param(&mut g, dt, &[r, c]);
    let gamma = param(&mut g, dt, &[c]);
    let mean = reduce(&mut g, ReduceOp::Mean, x, &[1], true);
    let d = bin(&mut g, BinaryOp::Sub, x, mean);
    let d2 = bin(&mut g, BinaryOp::Mul, d, d);
    let var = reduce(&mut g, ReduceOp::Mean, d2, &[1], true);
    let eps = scalar(&mut g, dt, 1e-5);
    let ve = bin(&mut g, BinaryOp::Add, var, eps);
    let rs = un(&mut g, UnaryOp::Rsqrt, ve);
    let y = bin(&mut g, BinaryOp::Mul, d, rs);
    let y = bin(&mut g, BinaryOp::Mul, y, gamma);
    g.outputs.push(y);
    // The per-row statistic too: a kept-size output of a split row region.
    g.outputs.push(var);
    g
}

/// Sums over the rows (a column region: exact, in the reference's order)
/// and over the columns (a row region), with a full-size output alongside.
fn sums(dt: DType, r: usize, c: usize, op: ReduceOp) -> (Graph, Graph) {
    let mut col = Graph::new("colsum");
    let x = param(&mut col, dt, &[r, c]);
    let two = scalar(&mut col, dt, 2.0);
    let p = bin(&mut col, BinaryOp::Mul, x, two);
    let s = reduce(&mut col, op, p, &[0], false);
    col.outputs.push(s);
    col.outputs.push(p);
    let mut row = Graph::new("rowsum");
    let x = param(&mut row, dt, &[r, c]);
    let s = reduce(&mut row, op, x, &[1], true);
    row.outputs.push(s);
    (col, row)
}

/// The elements as f64.
fn f64s(x: &Storage) -> Vec<f64> {
    match tracejit_ir::tensor::kernels::cast(x, DType::F64) {
        Storage::F64(a) => a.iter().copied().collect(),
        _ => unreachable!("a cast to f64"),
    }
}

fn float_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn elementwise_kernels_give_the_same_bits_with_any_thread_count(
        r in rows(), c in cols(), dt in float_dtype(), broadcast in any::<bool>(),
        seed in 0u64..1000, threshold in prop::sample::select(vec![1u64, 700, 5000]),
    ) {
        let _s = serial();
        set_split_threshold(threshold);
        let g = elementwise(dt, r, c, broadcast);
        let b_shape = if broadcast { vec![c] } else { vec![r, c] };
        let ins = [data(dt, &[r, c], seed, true), data(dt, &b_shape, seed + 1, true)];
        // Threshold 1: any two kernel rows or two element granules split.
        // Without a broadcast (or with one column) the domain collapses
        // into one row of r·c elements.
        let must = r > 0 && if broadcast && c > 1 { r >= 2 || c > 512 } else { r * c > 512 };
        let got = run_each_count(&g, &ins, threshold == 1 && must);
        set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
        let got = got.map_err(TestCaseError::fail)?;
        let want = tracejit_ir::interpret(&g, &ins).unwrap();
        // Exact ops: the interpreter's bits. tanh: within its ULP bound.
        exact_eq(&got[0], &want[0]).map_err(TestCaseError::fail)?;
        close_abs(&got[1], &want[1], 1e-6).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn row_regions_give_the_same_bits_with_any_thread_count(
        r in rows(), c in cols(), dt in float_dtype(), seed in 0u64..1000,
        threshold in prop::sample::select(vec![1u64, 3000, 20000]),
    ) {
        // max over an empty row is the interpreter's error, not a split.
        prop_assume!(c > 0);
        let _s = serial();
        set_split_threshold(threshold);
        let sm = softmax(dt, r, c);
        let x = data(dt, &[r, c], seed, false);
        let got_sm = run_each_count(&sm, std::slice::from_ref(&x), threshold == 1 && r >= 2 && c > 1);
        let ln = layernorm(dt, r, c);
        let ln_ins = [x.clone(), data(dt, &[c], seed + 7, false)];
        let got_ln = Some(run_each_count(&ln, &ln_ins, threshold == 1 && r >= 2 && c > 1));
        set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
        let want = tracejit_ir::interpret(&sm, std::slice::from_ref(&x)).unwrap();
        close(&got_sm.map_err(TestCaseError::fail)?[0], &want[0], 2e-6, 1e-13).map_err(TestCaseError::fail)?;
        if let Some(got) = got_ln {
            let got = got.map_err(TestCaseError::fail)?;
            let want = tracejit_ir::interpret(&ln, &ln_ins).unwrap();
            let tol = if dt == DType::F32 { 2e-5 } else { 1e-12 };
            for k in 0..2 {
                close_abs(&got[k], &want[k], tol).map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn reductions_give_the_same_bits_with_any_thread_count(
        r in rows(), c in cols(),
        dt in prop::sample::select(vec![DType::F32, DType::F64, DType::I32, DType::I64]),
        op in prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]),
        seed in 0u64..1000, threshold in prop::sample::select(vec![1u64, 900, 9000]),
    ) {
        prop_assume!(op.result_dtype(dt).is_some());
        // max over an empty axis is an error (the interpreter's), not a split.
        prop_assume!(op != ReduceOp::Max || (r > 0 && c > 0));
        let _s = serial();
        set_split_threshold(threshold);
        let (col, row) = sums(dt, r, c, op);
        let x = data(dt, &[r, c], seed, false);
        // Columns split at multiples of 64. (A unit axis is no reduction
        // class: with r or c = 1 the region is another kind.)
        let got_col = run_each_count(&col, std::slice::from_ref(&x), threshold == 1 && r > 1 && c > 64);
        let got_row = run_each_count(&row, std::slice::from_ref(&x), threshold == 1 && r >= 2 && c > 1);
        set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
        // Column reductions keep the reference's order: exact. (With one
        // column the region is a full sum, a row region: lane partials.)
        let want = tracejit_ir::interpret(&col, std::slice::from_ref(&x)).unwrap();
        let got = got_col.map_err(TestCaseError::fail)?;
        for k in 0..2 {
            let r = if c == 1 && k == 0 && dt.is_float() && op != ReduceOp::Max {
                close(&got[k], &want[k], 3e-4, 1e-11)
            } else {
                exact_eq(&got[k], &want[k])
            };
            r.map_err(|e| TestCaseError::fail(format!("column output {k}: {e}")))?;
        }
        let want = tracejit_ir::interpret(&row, std::slice::from_ref(&x)).unwrap();
        let got = got_row.map_err(TestCaseError::fail)?;
        if dt.is_float() && op != ReduceOp::Max {
            // Lane partials: within c·ε·(the same reduction of |x|).
            let ax = tracejit_ir::tensor::kernels::unary(UnaryOp::Abs, &x);
            let bound = f64s(&tracejit_ir::interpret(&row, &[ax]).unwrap()[0]);
            let eps = if dt == DType::F32 { f64::from(f32::EPSILON) } else { f64::EPSILON };
            for (i, ((g, w), b)) in f64s(&got[0]).into_iter().zip(f64s(&want[0])).zip(bound).enumerate() {
                prop_assert!(g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= c as f64 * eps * b + 1e-30, "row {i}: {g} vs reference {w}");
            }
        } else {
            exact_eq(&got[0], &want[0]).map_err(|e| TestCaseError::fail(format!("row output: {e}")))?;
        }
    }

    #[test]
    fn matmuls_give_the_same_bits_with_any_thread_count(
        // 504 rows (or 400 columns) make three blocks, regrouped into two
        // on two threads (`gemm_blocks_on`).
        m in prop::sample::select(vec![1usize, 3, 4, 9, 40, 64, 65, 127, 300, 504, 784]),
        k in prop::sample::select(vec![1usize, 3, 5, 129, 300, 1024, 1100]),
        n in prop::sample::select(vec![1usize, 17, 128, 255, 400, 513, 700]),
        dt in float_dtype(), seed in 0u64..1000,
        // `a · bᵀ` with `b` stored `[n, k]`: the layout whose operand the
        // GEMM may copy column-major first (per block when split).
        transposed in any::<bool>(),
    ) {
        let _s = serial();
        let mut g = Graph::new("mm");
        let a = param(&mut g, dt, &[m, k]);
        let b = matrix_param(&mut g, dt, (k, n), transposed);
        let y = node(&mut g, Op::MatMul, &[a, b]);
        g.outputs.push(y);
        let b_data = data(dt, &if transposed { [n, k] } else { [k, n] }, seed + 1, false);
        let b_value = if transposed { tracejit_ir::tensor::kernels::transpose(&b_data, &[1, 0]) } else { b_data.clone() };
        let ins = [data(dt, &[m, k], seed, false), b_data];
        // A threshold low enough that most of these products split.
        threads::set_gemm_threshold(1 << 16);
        let big = m * k * n >= threads::gemm_threshold() && threads::gemm_blocks(m, n, k).count > 1;
        let got = run_each_count(&g, &ins, big);
        threads::set_gemm_threshold(threads::DEFAULT_GEMM_THRESHOLD);
        let got = got.map_err(TestCaseError::fail)?;
        let want = tracejit_ir::tensor::kernels::matmul(&ins[0], &b_value);
        // Within k·ε·Σ|aᵢbᵢ| of the reference (a blocked sum of its own).
        let abs = |x: &Storage| tracejit_ir::tensor::kernels::unary(UnaryOp::Abs, x);
        let bound = tracejit_ir::tensor::kernels::matmul(&abs(&ins[0]), &abs(&b_value));
        let eps = if dt == DType::F32 { f64::from(f32::EPSILON) } else { f64::EPSILON };
        let (g, w, b) = (f64s(&got[0]), f64s(&want), f64s(&bound));
        for (i, ((x, y), s)) in g.iter().zip(&w).zip(&b).enumerate() {
            prop_assert!((x - y).abs() <= k as f64 * eps * s + 1e-30, "element {i}: {x} vs reference {y}");
        }
    }
}

/// W1's kernel: 50 times `x * 1.0001 + 0.001` over 16 elements.
fn small_ops() -> Graph {
    let mut g = Graph::new("small_ops");
    let mut x = param(&mut g, DType::F32, &[16]);
    for _ in 0..50 {
        let a = scalar(&mut g, DType::F32, 1.0001);
        let b = scalar(&mut g, DType::F32, 0.001);
        let t = bin(&mut g, BinaryOp::Mul, x, a);
        x = bin(&mut g, BinaryOp::Add, t, b);
    }
    g.outputs.push(x);
    g
}

#[test]
fn small_kernels_never_enter_the_pool() {
    let _s = serial();
    set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
    let g = small_ops();
    let exe = Executable::new(&g).unwrap();
    let x = data(DType::F32, &[16], 3, false);
    for t in [2, 3] {
        set_num_threads(t);
        let before = pool_dispatches();
        for _ in 0..10 {
            exe.run(std::slice::from_ref(&x)).unwrap();
        }
        assert_eq!(pool_dispatches(), before, "a 16-element kernel entered the pool with {t} threads");
    }
    // W8's step sizes: a [32, 64] x [64, 128] product and tanh of [32, 128].
    let mut g = Graph::new("rnn_step");
    let xt = param(&mut g, DType::F32, &[32, 64]);
    let w = param(&mut g, DType::F32, &[64, 128]);
    let y = node(&mut g, Op::MatMul, &[xt, w]);
    let h = un(&mut g, UnaryOp::Tanh, y);
    g.outputs.push(h);
    let exe = Executable::new(&g).unwrap();
    let ins = [data(DType::F32, &[32, 64], 4, false), data(DType::F32, &[64, 128], 5, false)];
    let before = pool_dispatches();
    exe.run(&ins).unwrap();
    assert_eq!(pool_dispatches(), before, "W8-sized steps entered the pool");
    set_num_threads(1);
}

#[test]
fn large_kernels_enter_the_pool() {
    let _s = serial();
    set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
    let g = softmax(DType::F32, 256, 1024);
    let exe = Executable::new(&g).unwrap();
    let x = data(DType::F32, &[256, 1024], 3, false);
    set_num_threads(2);
    let before = pool_dispatches();
    exe.run(std::slice::from_ref(&x)).unwrap();
    assert_eq!(pool_dispatches(), before + 1, "a [256, 1024] softmax did not split");
    // With one thread nothing is dispatched.
    set_num_threads(1);
    let before = pool_dispatches();
    exe.run(std::slice::from_ref(&x)).unwrap();
    assert_eq!(pool_dispatches(), before);
    // A product goes through the pool past the GEMM threshold, not under it.
    let product = |m: usize, k: usize, n: usize| {
        let mut g = Graph::new("mm");
        let a = param(&mut g, DType::F32, &[m, k]);
        let b = param(&mut g, DType::F32, &[k, n]);
        let y = node(&mut g, Op::MatMul, &[a, b]);
        g.outputs.push(y);
        (Executable::new(&g).unwrap(), [data(DType::F32, &[m, k], 1, false), data(DType::F32, &[k, n], 2, false)])
    };
    set_num_threads(2);
    let (exe, ins) = product(32, 128, 64);
    let before = pool_dispatches();
    exe.run(&ins).unwrap();
    assert_eq!(pool_dispatches(), before, "a 32x128x64 product used the pool under the default threshold");
    // W8's recurrent step: two halves.
    let (exe, ins) = product(32, 128, 128);
    let before = pool_dispatches();
    exe.run(&ins).unwrap();
    assert_eq!(pool_dispatches(), before + 1, "a 32x128x128 product was not cut in halves");
    let (exe, ins) = product(128, 256, 256);
    let before = pool_dispatches();
    exe.run(&ins).unwrap();
    assert_eq!(pool_dispatches(), before + 1, "a 128x256x256 product did not use the pool past the default threshold");
    threads::set_gemm_threshold(1 << 24);
    let before = pool_dispatches();
    exe.run(&ins).unwrap();
    threads::set_gemm_threshold(threads::DEFAULT_GEMM_THRESHOLD);
    assert_eq!(pool_dispatches(), before, "a 128x256x256 product used the pool under a raised threshold");
    set_num_threads(1);
}

#[test]
fn changing_the_count_while_kernels_run_is_safe() {
    let _s = serial();
    set_split_threshold(1000);
    let g = softmax(DType::F32, 64, 1023);
    let exe = Executable::new(&g).unwrap();
    let x = data(DType::F32, &[64, 1023], 9, false);
    set_num_threads(1);
    let want = exe.run(std::slice::from_ref(&x)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut t = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                t = t % 4 + 1;
                set_num_threads(t);
                std::thread::yield_now();
            }
        });
        let runs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..40 {
                        let got = exe.run(std::slice::from_ref(&x)).unwrap();
                        same_bits(&got, &want).unwrap();
                    }
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
    set_num_threads(1);
}

#[test]
fn thread_counts_from_the_environment_are_validated() {
    for good in ["1", "2", " 3 ", "16"] {
        assert_eq!(threads::parse_num_threads(good), Ok(good.trim().parse().unwrap()));
    }
    for bad in ["", "0", "-1", "two", "2.5", "1e3", "99999"] {
        let e = threads::parse_num_threads(bad).unwrap_err();
        assert!(e.contains("TRACEJIT_NUM_THREADS") && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
    }
    let e = threads::parse_num_threads("0").unwrap_err();
    assert!(e.contains("positive integer"), "{e}");
}

#[test]
fn zero_restores_the_default() {
    let _s = serial();
    set_num_threads(3);
    assert_eq!(threads::num_threads(), 3);
    set_num_threads(0);
    assert_eq!(threads::num_threads(), threads::default_num_threads());
    assert!(threads::num_threads() >= 1);
    set_num_threads(1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Blocks tile the output exactly once, along the longer side, in at
    /// most `GEMM_MAX_BLOCKS` near-equal pieces of enough work each (or
    /// two halves of a mid-sized product).
    #[test]
    fn gemm_blocks_tile_the_output_once(m in 0usize..3000, n in 0usize..3000, k in 0usize..2000) {
        let _s = serial();
        let b = threads::gemm_blocks(m, n, k);
        let dim = if b.by_rows { m } else { n };
        prop_assert_eq!(b.by_rows, m > n);
        prop_assert!(b.count >= 1 && b.count <= threads::GEMM_MAX_BLOCKS);
        prop_assert!(b.size.is_multiple_of(threads::GEMM_ROUND) || b.count == 1, "{:?}", b);
        let work = m * n * k;
        let regular = work >= 2 * threads::GEMM_BLOCK_WORK && dim >= 2 * threads::GEMM_GRANULE;
        if !regular {
            // One block, or two halves of a mid-sized product.
            let halves = work >= threads::SMALL_SPLIT_WORK && dim >= 2 * threads::SMALL_GRANULE;
            prop_assert_eq!(b.count, if halves { 2 } else { 1 }, "{:?}", b);
            if halves {
                let last = dim - b.size;
                prop_assert!(b.size >= threads::SMALL_GRANULE && b.size.is_multiple_of(threads::GEMM_ROUND), "{:?}", b);
                prop_assert!(last >= 1 && last <= b.size && b.size - last < 2 * threads::GEMM_ROUND, "{:?}: last {}", b, last);
                prop_assert_eq!(b.same_as_whole, m.min(n) >= 4 && (4..=512).contains(&k));
            }
        } else {
            // Every block over 64 wide (the gemm crate's general path); the
            // last takes the rest.
            prop_assert!(b.count > 1, "{:?}", b);
            let last = dim - (b.count - 1) * b.size;
            prop_assert!(b.size >= threads::GEMM_GRANULE, "{:?}", b);
            prop_assert!(last > 64 && last <= b.size + threads::GEMM_ROUND / 2, "{:?}: last block {} of {}", b, last, dim);
            // Near equal: no block more than a rounding step over the mean.
            prop_assert!(b.size <= dim.div_ceil(b.count) + threads::GEMM_ROUND, "{:?}: blocks of {} for {}", b, b.size, dim);
            prop_assert_eq!(b.same_as_whole, m.min(n) >= 4 && k >= 4);
            prop_assert!(work / b.count >= threads::GEMM_BLOCK_WORK / 2, "{:?}: too little work per block", b);
        }
        // On t threads: the same blocks, or (blocks that give the whole's
        // bits and do not share out) fewer, each over 64 wide, as many per
        // thread.
        for t in 2..=4 {
            let on = threads::gemm_blocks_on(m, n, k, t);
            if on != b {
                prop_assert!(b.same_as_whole && b.count > t && !b.count.is_multiple_of(t), "{:?} -> {:?}", b, on);
                prop_assert!(on.count.is_multiple_of(t) && on.count < b.count && on.by_rows == b.by_rows, "{:?} -> {:?}", b, on);
                let last = dim - (on.count - 1) * on.size;
                prop_assert!(on.size > 64 && last > 64 && last <= on.size + threads::GEMM_ROUND / 2, "{:?}: last {}", on, last);
            }
        }
        let seen = std::sync::Mutex::new(vec![0u8; m * n]);
        set_num_threads(2);
        threads::run_gemm_blocks(m, n, k, &|rows, cols| {
            let mut seen = seen.lock().unwrap();
            for r in rows {
                for c in cols.clone() {
                    seen[r * n + c] += 1;
                }
            }
        });
        set_num_threads(1);
        prop_assert!(seen.into_inner().unwrap().iter().all(|&v| v == 1));
    }
}

/// A reshape of a large strided view (W10's attention output seen as
/// `[b, t, h·d]`) and a concatenation of large contiguous values copy over
/// the pool: 1, 2 and 3 threads give the interpreter's values; reshapes of
/// views whose first axes are 1 long, odd sizes and a reshape with `-1`
/// included.
#[test]
fn large_copies_split_and_give_the_interpreters_values() {
    let _s = serial();
    for (lead, t) in [(8usize, 128usize), (1, 257), (3, 129)] {
        let mut g = Graph::new("copies");
        let x = param(&mut g, DType::F32, &[lead, 4, t, 64]);
        let heads_last = node(&mut g, Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x]);
        let merged = node(&mut g, Op::Reshape { shape: vec![lead as i64, -1, 256] }, &[heads_last]);
        let ys: Vec<ValueId> = (0..3).map(|_| param(&mut g, DType::F32, &[lead, t, 256])).collect();
        let joined = node(&mut g, Op::Concat { axis: 2 }, &[ys[0], merged, ys[1], ys[2]]);
        g.outputs.extend([merged, joined]);
        let mut ins = vec![data(DType::F32, &[lead, 4, t, 64], 1, true)];
        ins.extend((0..3).map(|k| data(DType::F32, &[lead, t, 256], 2 + k, true)));
        let got = run_each_count(&g, &ins, true).unwrap_or_else(|e| panic!("[{lead}, 4, {t}, 64]: {e}"));
        let want = tracejit_ir::interpret(&g, &ins).unwrap();
        for k in 0..2 {
            exact_eq(&got[k], &want[k]).unwrap_or_else(|e| panic!("[{lead}, 4, {t}, 64] output {k}: {e}"));
        }
    }
}
