//! The hand-written row softmax (`crate::native`): which regions get it,
//! and its results against the interpreter and against the generated
//! kernel of the same region, on random rows of every length around the
//! vector widths, rows with NaN, ±inf and huge values, strided rows,
//! several threads.

use crate::common::*;

use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};
use tracejit_jit::JitOptions;

fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: &[usize]) -> ValueId {
    node(g, Op::Reduce { op, axes: axes.to_vec(), keepdims: true }, &[x])
}

/// `exp(x - max(x)) / sum(...)` over `axes`, with `x` transformed first by
/// `pre` (a prologue the hand-written kernel must not swallow).
fn softmax(dt: DType, shape: &[usize], axes: &[usize], pre: Option<UnaryOp>) -> Graph {
    let spec: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    softmax_spec(dt, &spec, axes, pre)
}

/// [`softmax`] of a parameter with dims `spec` (-1: unknown until run).
fn softmax_spec(dt: DType, spec: &[i64], axes: &[usize], pre: Option<UnaryOp>) -> Graph {
    let mut g = Graph::new("softmax");
    let p = g.add_param(tracejit_ir::TensorType::from_spec(dt, spec));
    let x = match pre {
        Some(u) => node(&mut g, Op::Unary(u), &[p]),
        None => p,
    };
    let m = reduce(&mut g, ReduceOp::Max, x, axes);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = reduce(&mut g, ReduceOp::Sum, e, axes);
    let y = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs.push(y);
    g
}

fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn staged() -> JitOptions {
    JitOptions { stage: true, ..JitOptions::default() }
}

/// Staged, at 16 lanes where the CPU has them (`wide`) or at 8.
fn staged_at(wide: bool) -> JitOptions {
    staged().for_target(tracejit_jit::Target::for_isa(tracejit_kernels::Isa::native().with_avx512(wide)))
}

/// The hand-written kernel's name under `opts`, if this CPU runs one.
fn expected(opts: &JitOptions) -> Option<&'static str> {
    if opts.avx512() && avx512() {
        Some("row softmax (16 lanes)")
    } else {
        avx2().then_some("row softmax (8 lanes)")
    }
}

#[test]
fn only_the_f32_row_softmax_gets_the_hand_written_kernel() {
    let native = |g: &Graph, opts: &JitOptions| tracejit_jit::compile_region_with(g, opts).unwrap().native_kernel();
    for wide in [true, false] {
        let want = expected(&staged_at(wide));
        assert_eq!(native(&softmax(DType::F32, &[4, 37], &[1], None), &staged_at(wide)), want);
        assert_eq!(native(&softmax(DType::F32, &[2, 3, 37], &[2], None), &staged_at(wide)), want);
    }
    // Staging off (TRACEJIT_JIT_STAGE=0): generated code.
    assert_eq!(native(&softmax(DType::F32, &[4, 37], &[1], None), &JitOptions { stage: false, ..staged() }), None);
    // f64, a prologue, another epilogue: generated code.
    assert_eq!(native(&softmax(DType::F64, &[4, 37], &[1], None), &staged()), None);
    assert_eq!(native(&softmax(DType::F32, &[4, 37], &[1], Some(UnaryOp::Tanh)), &staged()), None);
    let mut g = Graph::new("log_softmax");
    let x = param(&mut g, DType::F32, &[4, 37]);
    let m = reduce(&mut g, ReduceOp::Max, x, &[1]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1]);
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[e, s]);
    g.outputs.push(y);
    assert_eq!(native(&g, &staged()), None);
}

/// Rows of `n` values: random, with specials in some rows.
fn rows(rows: usize, n: usize, seed: u64, special: bool) -> Vec<f32> {
    let base = data(DType::F32, &[rows, n], seed, false).to_vec::<f32>().unwrap();
    let mut v: Vec<f32> = base.iter().map(|x| x * 3.0).collect();
    if special && n > 0 {
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 88.0, -0.0];
        for r in 0..rows {
            if r % 3 == 1 {
                let at = (r * 7 + seed as usize) % n;
                v[r * n + at] = specials[(r + seed as usize) % specials.len()];
            }
        }
    }
    v
}

/// Same values within the sum's rounding: `n·ε` relative, NaN for NaN.
fn agree(a: &Storage, b: &Storage, n: usize) -> Result<(), String> {
    close(a, b, (n as f64 + 8.0) * f64::from(f32::EPSILON), 0.0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_interpreter_and_the_generated_kernel(
        r in prop::sample::select(vec![1usize, 2, 3, 7]),
        n in prop::sample::select(vec![1usize, 3, 5, 7, 8, 9, 31, 32, 33, 40, 255, 1023, 1024]),
        special in any::<bool>(), seed in 0u64..1000, wide in any::<bool>(),
    ) {
        // Dims unknown when compiled (rows of 1 are then allowed too).
        let g = softmax_spec(DType::F32, &[-1, -1], &[1], None);
        let xs = Storage::from_vec(rows(r, n, seed, special), &[r, n]).unwrap();
        let native = tracejit_jit::compile_region_with(&g, &staged_at(wide)).unwrap();
        let generated = tracejit_jit::compile_region_with(&g, &JitOptions { stage: false, ..staged() }).unwrap();
        prop_assert!(generated.native_kernel().is_none());
        prop_assert_eq!(native.native_kernel(), expected(&staged_at(wide)));
        let got = native.run(&[&xs]);
        let gen = generated.run(&[&xs]);
        let want = tracejit_ir::interpret(&g, std::slice::from_ref(&xs)).unwrap();
        agree(&got[0], &want[0], n).map_err(|e| TestCaseError::fail(format!("vs interpreter: {e}")))?;
        agree(&got[0], &gen[0], n).map_err(|e| TestCaseError::fail(format!("vs generated kernel: {e}")))?;
    }
}

/// Rows that are not contiguous in memory (a transposed input is
/// materialized or read with strides by the launcher), a leading batch
/// axis, and the row split across threads: same results as one thread, bit
/// for bit; at both vector widths.
#[test]
fn strided_batched_and_threaded_rows() {
    for wide in [true, false] {
        strided_batched_and_threaded_rows_at(&staged_at(wide));
    }
}

fn strided_batched_and_threaded_rows_at(opts: &JitOptions) {
    let g = softmax(DType::F32, &[3, 64, 1023], &[2], None);
    let xs = Storage::from_vec(rows(3 * 64, 1023, 9, true), &[3, 64, 1023]).unwrap();
    let region = tracejit_jit::compile_region_with(&g, opts).unwrap();
    let want = tracejit_ir::interpret(&g, std::slice::from_ref(&xs)).unwrap();
    let _s = crate::serial();
    tracejit_jit::threads::set_split_threshold(1);
    let mut outs = Vec::new();
    for t in [1, 2, 3] {
        tracejit_jit::threads::set_num_threads(t);
        outs.push(region.run(&[&xs]));
    }
    tracejit_jit::threads::set_split_threshold(tracejit_jit::threads::DEFAULT_SPLIT_THRESHOLD);
    tracejit_jit::threads::set_num_threads(1);
    for o in &outs {
        assert!(o[0].bit_eq(&outs[0][0]), "thread counts disagree");
    }
    agree(&outs[0][0], &want[0], 1023).unwrap();
    // A softmax over two trailing axes: rows of 3 * 37.
    let g2 = softmax(DType::F32, &[4, 3, 37], &[1, 2], None);
    let x2 = Storage::from_vec(rows(4, 3 * 37, 6, true), &[4, 3, 37]).unwrap();
    let got = tracejit_jit::compile_region_with(&g2, opts).unwrap().run(&[&x2]);
    let want = tracejit_ir::interpret(&g2, std::slice::from_ref(&x2)).unwrap();
    agree(&got[0], &want[0], 3 * 37).unwrap();
    // A view with a row stride of its own: every other row of a [6, 1023].
    let g = softmax(DType::F32, &[3, 1023], &[1], None);
    let big = Storage::from_vec(rows(6, 1023, 4, false), &[6, 1023]).unwrap();
    let every = |step| SliceSpec { start: None, stop: None, step };
    let view = tracejit_ir::tensor::kernels::slice(&big, &[every(2), every(1)]);
    assert!(!view.is_standard_layout());
    // And a transposed input, whose rows are not contiguous at all.
    let tall = Storage::from_vec(rows(1023, 3, 5, false), &[1023, 3]).unwrap();
    let t = tracejit_ir::tensor::kernels::transpose(&tall, &[1, 0]);
    let region = tracejit_jit::compile_region_with(&g, opts).unwrap();
    for x in [view, t] {
        let got = region.run(&[&x]);
        let want = tracejit_ir::interpret(&g, std::slice::from_ref(&x)).unwrap();
        agree(&got[0], &want[0], 1023).unwrap();
    }
}

/// No rows at all: an empty result.
#[test]
fn no_rows_give_an_empty_result() {
    let g = softmax_spec(DType::F32, &[-1, -1], &[1], None);
    let region = tracejit_jit::compile_region_with(&g, &staged()).unwrap();
    let none = region.run(&[&Storage::full(&[0, 5], DType::F32, 0.0)]);
    assert_eq!(none[0].shape(), &[0, 5]);
}

/// Rows of no elements are refused before any kernel runs, as the
/// reference refuses a max over an empty axis.
#[test]
#[should_panic(expected = "cannot reduce an empty axis")]
fn empty_rows_are_refused_like_the_reference() {
    let g = softmax_spec(DType::F32, &[-1, -1], &[1], None);
    let region = tracejit_jit::compile_region_with(&g, &staged()).unwrap();
    region.run(&[&Storage::full(&[4, 0], DType::F32, 0.0)]);
}

/// Rows whose output lies a few bytes past a multiple of 4 KiB from the
/// input (the kernel then writes `exp` into a scratch row first), with
/// every head length before the output's vector alignment: the same bits
/// as with unrelated buffers, and the values of an f64 softmax.
#[test]
fn rows_a_multiple_of_4k_apart_give_the_same_values() {
    for n in [1usize, 3, 5, 17, 1023, 1024, 4096, 4097] {
        let x = rows(1, n, n as u64, true);
        let mut apart = vec![0f32; n];
        tracejit_kernels::softmax::row(&x, &mut apart, tracejit_kernels::Isa::native());
        let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m.is_nan() || m >= v { m } else { v });
        let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - f64::from(m)).exp()).collect();
        let total: f64 = e.iter().sum();
        let pages = n.div_ceil(1024) + 1;
        for gap in [1024 * pages, 1024 * pages + 4, 1024 * pages - 4, 1024 * pages + 3, 1024 * (pages + 1) + 7] {
            for shift in 0..4 {
                // x at `shift`, y `gap` floats later, in one buffer.
                let mut buf = vec![0f32; shift + gap + n + 16];
                buf[shift..shift + n].copy_from_slice(&x);
                let (a, b) = buf.split_at_mut(shift + gap);
                let y = &mut b[..n];
                tracejit_kernels::softmax::row(&a[shift..shift + n], y, tracejit_kernels::Isa::native());
                let (got, want) =
                    (Storage::from_vec(y.to_vec(), &[n]).unwrap(), Storage::from_vec(apart.clone(), &[n]).unwrap());
                // Bit for bit: the sum's order depends on the row alone.
                assert!(got.bit_eq(&want), "n {n} gap {gap} shift {shift}: not the bits of unrelated buffers");
                for (j, g) in y.iter().enumerate() {
                    let w = e[j] / total;
                    assert!(
                        (g.is_nan() && w.is_nan()) || (f64::from(*g) - w).abs() <= 1e-5 * w.max(1e-30) + 1e-12,
                        "n {n} gap {gap} shift {shift}: y[{j}] = {g}, f64 softmax {w}"
                    );
                }
            }
        }
    }
}
