//! Loops whose batch rows never meet (a recurrence, a row softmax, a
//! product with the state on either side) run with more than one thread
//! as one loop per block of rows, each on its own thread: the same bits as
//! one thread on odd batch sizes, NaN and infinity, and eager's values
//! within rounding. Loops whose rows meet — a mean over the batch, a
//! product with the batch in its depth, a condition on the state, a
//! variable written in the body, a constant with one value per row — are
//! not split, and still compute what eager computes.

mod common;

use proptest::prelude::*;
use std::sync::{Mutex, MutexGuard};
use tracejit::config::{pool_dispatches, set_num_threads};
use tracejit::prelude::*;
use tracejit_jit::threads::{gemm_threshold, set_gemm_threshold};

/// Serializes the tests that change the process-wide thread count and
/// split threshold.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} values against {}", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * y.abs().max(1.0);
        if !ok {
            return Err(format!("element {i}: {x} against {y}"));
        }
    }
    Ok(())
}

/// What a trip computes from `x[t]` (after its projection) and the state.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `tanh(x_t · wx + h · wh + b)` (W8).
    Rnn,
    /// `softmax(x_t · wx + h · wh)` along each row.
    Softmax,
    /// `tanh((whᵀ · hᵀ)ᵀ + b)`: the state on the right of a product.
    Transposed,
    /// `tanh(x_t · wx + h · whᵀ + b)`: a weight stored `[out, in]` (a
    /// strided view), which some `gemm` paths take for small products.
    WeightT,
}

type Args = (Tensor, Tensor, Tensor, Tensor);

fn step(kind: Step, x_t: &Tensor, h: &Tensor, (wx, wh, b): (&Tensor, &Tensor, &Tensor)) -> Tensor {
    match kind {
        Step::Rnn => (x_t.matmul(wx) + h.matmul(wh) + b).tanh(),
        Step::Softmax => {
            let s = x_t.matmul(wx) + h.matmul(wh);
            let e = (&s - &s.max(&[1], true)).exp();
            &e / &e.sum(&[1], true)
        }
        Step::Transposed => (wh.t().matmul(&h.t()).t() + b).tanh(),
        Step::WeightT => (x_t.matmul(wx) + h.matmul(&wh.t()) + b).tanh(),
    }
}

fn recurrence(kind: Step, (xs, wx, wh, b): &Args, trips: i64) -> Tensor {
    let [batch, hidden] = [xs.dims()[1], wh.dims()[1]].map(|d| d.unwrap());
    let h0 = Tensor::zeros(&[batch, hidden], xs.dtype()) + 0.5;
    fori_loop(0, trips, |t, h: Tensor| step(kind, &xs.gather(&t, 0), &h, (wx, wh, b)), h0)
}

fn args(steps: usize, batch: usize, k: usize, hidden: usize, seed: u64, special: Option<f32>) -> Args {
    common::rnn_args((steps, batch, k, hidden), seed, special)
}

/// Traces and runs `f` once on `a` with every split threshold at zero
/// (so that small loops split too), and returns how many of its loops run
/// in row blocks.
fn row_loops<R: Nest>(f: &Function<Args, R>, a: &Args) -> usize {
    let old = gemm_threshold();
    set_gemm_threshold(0);
    let traced = f.get_concrete_function(a.clone());
    set_gemm_threshold(old);
    let stats = traced.expect("traces").schedule_stats().expect("compiled");
    stats.row_loops
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn row_blocks_give_one_threads_bits(
        kind in prop::sample::select(vec![Step::Rnn, Step::Softmax, Step::Transposed, Step::WeightT]),
        steps in prop::sample::select(vec![1usize, 3, 5]),
        batch in prop::sample::select(vec![16usize, 17, 24, 33]),
        k in prop::sample::select(vec![4usize, 7]),
        // Blocks of at least 8 rows make products of over 256 outputs.
        hidden in prop::sample::select(vec![33usize, 48]),
        threads in 2usize..=3,
        special in prop::sample::select(vec![None, Some(f32::NAN), Some(f32::INFINITY)]),
        seed in 0u64..1000,
    ) {
        let _guard = serial();
        let a = args(steps, batch, k, hidden, seed, special);
        let want = recurrence(kind, &a, steps as i64);
        let f = function(move |a: Args| recurrence(kind, &a, steps as i64));
        prop_assert_eq!(row_loops(&f, &a), 1, "the loop splits");
        set_num_threads(1);
        let one = f.call(a.clone()).unwrap();
        set_num_threads(threads);
        let before = pool_dispatches();
        let split = f.call(a.clone());
        let dispatches = pool_dispatches() - before;
        set_num_threads(1);
        let split = split.unwrap();
        // The blocks' one fork: every trip's kernels are below the split
        // thresholds, so a loop run whole would not enter the pool.
        prop_assert_eq!(dispatches, 1, "the loop ran in row blocks");
        prop_assert_eq!(split.dims(), want.dims());
        prop_assert_eq!(bits(&split), bits(&one), "{} threads against one", threads);
        close(&vals(&split), &vals(&want), 1e-4).map_err(TestCaseError::fail)?;
    }
}

/// W8's own sizes, at the default thresholds: the loop splits, and runs
/// the bits of one thread.
#[test]
fn w8_sized_loop_splits_with_the_default_thresholds() {
    let _guard = serial();
    let a = args(32, 32, 64, 128, 7, None);
    let f = function(|a: Args| recurrence(Step::Rnn, &a, 32));
    let stats = f.get_concrete_function(a.clone()).unwrap().schedule_stats().unwrap();
    assert_eq!(stats.row_loops, 1, "{stats}");
    set_num_threads(1);
    let one = f.call(a.clone()).unwrap();
    set_num_threads(2);
    let before = pool_dispatches();
    let two = f.call(a.clone());
    // The hoisted input projection's blocks and the loop's: not one per trip.
    assert_eq!(pool_dispatches() - before, 2);
    set_num_threads(1);
    assert_eq!(bits(&two.unwrap()), bits(&one));
}

/// Loops whose rows meet are not split, and compute what eager does at
/// two threads.
#[test]
fn loops_whose_rows_meet_run_whole() {
    let _guard = serial();
    let a = args(4, 16, 4, 8, 3, None);
    type Body = fn(&Args, &Tensor, &Tensor) -> Tensor;
    let bodies: [(&str, Body); 4] = [
        // The mean over the batch mixes every row into each.
        ("batch mean", |(_, _, wh, _), x_t, h| (&h.matmul(wh) - &h.mean(&[0], true)).tanh() + x_t.sum(&[1], true)),
        // hᵀ·h sums over the batch.
        ("batch in the depth", |(_, _, wh, _), _, h| (h.t().matmul(h).matmul(wh).sum(&[0], true) + h).tanh()),
        // One value per row, baked into the graph.
        ("row constants", |(_, _, wh, _), _, h| {
            let c = Tensor::from_vec((0..16 * 8).map(|i| i as f32 * 0.01).collect(), &[16, 8]);
            (h.matmul(wh) + c).tanh()
        }),
        // Every block's transpose of the whole batch.
        ("reshape across rows", |(_, _, wh, _), _, h| h.matmul(wh).reshape(&[8, 16]).t().tanh()),
    ];
    for (what, body) in bodies {
        let trips = 4;
        let run = move |a: &Args| {
            let h0 = Tensor::zeros(&[16, 8], DType::F32) + 0.25;
            fori_loop(0, trips, |t, h: Tensor| body(a, &a.0.gather(&t, 0).matmul(&a.1), &h), h0)
        };
        let want = run(&a);
        let f = function(move |a: Args| run(&a));
        assert_eq!(row_loops(&f, &a), 0, "{what}: not split");
        set_num_threads(2);
        let got = f.call(a.clone());
        set_num_threads(1);
        close(&vals(&got.unwrap()), &vals(&want), 1e-4).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// A condition on the state, or a variable written in the body, keeps the
/// loop whole: the blocks would stop at different trips, or write the
/// variable once each.
#[test]
fn conditions_on_rows_and_variable_writes_run_whole() {
    let _guard = serial();
    let a = args(4, 16, 4, 8, 5, None);
    let until = function(|(xs, wx, wh, b): Args| {
        let h0 = Tensor::zeros(&[16, 8], DType::F32);
        while_loop(
            |h: &Tensor| h.sum_all().lt(20.0),
            |h: Tensor| (xs.gather(&Tensor::scalar(0i64), 0).matmul(&wx) + h.matmul(&wh) + &b).tanh() + 1.0,
            h0,
        )
    });
    assert_eq!(row_loops(&until, &a), 0);
    let body = |v: &Variable, (xs, wx, wh, b): &Args| {
        let h0 = Tensor::zeros(&[16, 8], DType::F32);
        fori_loop(
            0,
            4,
            |t, h: Tensor| {
                let h = (xs.gather(&t, 0).matmul(wx) + h.matmul(wh) + b).tanh();
                v.assign_add(&h.sum(&[0], false));
                h
            },
            h0,
        )
    };
    let (eager, traced) =
        (Variable::new(Tensor::zeros(&[8], DType::F32)), Variable::new(Tensor::zeros(&[8], DType::F32)));
    let want = body(&eager, &a);
    let v = traced.clone();
    let writes = function(move |a: Args| body(&v, &a));
    assert_eq!(row_loops(&writes, &a), 0);
    set_num_threads(2);
    let (got, h) = (until.call(a.clone()), writes.call(a.clone()));
    set_num_threads(1);
    close(&vals(&h.unwrap()), &vals(&want), 1e-4).unwrap();
    // Four trips, each adding its sum once.
    close(&vals(&traced.value()), &vals(&eager.value()), 1e-4).unwrap();
    let until_eager = {
        let (xs, wx, wh, b) = &a;
        while_loop(
            |h: &Tensor| h.sum_all().lt(20.0),
            |h: Tensor| (xs.gather(&Tensor::scalar(0i64), 0).matmul(wx) + h.matmul(wh) + b).tanh() + 1.0,
            Tensor::zeros(&[16, 8], DType::F32),
        )
    };
    close(&vals(&got.unwrap()), &vals(&until_eager), 1e-4).unwrap();
}

/// An index out of range in one block's trip is the same error as on one
/// thread, and the function keeps working.
#[test]
fn an_error_in_a_block_is_the_loops_error() {
    let _guard = serial();
    let a = args(3, 16, 4, 40, 9, None);
    let f = function(|a: Args| recurrence(Step::Rnn, &a, 5));
    assert_eq!(row_loops(&f, &a), 1);
    set_num_threads(1);
    let one = f.call(a.clone()).expect_err("trip 3 is out of range").to_string();
    set_num_threads(2);
    let two = f.call(a.clone()).expect_err("trip 3 is out of range").to_string();
    set_num_threads(1);
    assert_eq!(one, two);
    let ok = function(|a: Args| recurrence(Step::Rnn, &a, 3));
    set_num_threads(2);
    let fine = ok.call(a.clone());
    set_num_threads(1);
    assert!(fine.is_ok());
}

/// A product on the rows whose blocks could round differently from the
/// whole (depth over 512, or fewer than 4 outputs across) keeps the loop
/// whole: results never depend on the thread count.
#[test]
fn products_whose_blocks_round_differently_run_whole() {
    let _guard = serial();
    let a = args(2, 16, 4, 3, 11, None);
    let thin = function(|a: Args| recurrence(Step::Rnn, &a, 2));
    assert_eq!(row_loops(&thin, &a), 0, "h · wh with 3 outputs across");
    // Blocks of 40 rows by 4 outputs (160) would take the `gemm` crate's
    // horizontal path, the whole (320) not: 65 rows a block at least.
    let small = args(2, 80, 4, 4, 12, None);
    let weight_t = function(|a: Args| recurrence(Step::WeightT, &a, 2));
    assert_eq!(row_loops(&weight_t, &small), 0, "[80, 4] · [4, 4]ᵀ");
    set_num_threads(1);
    let one = weight_t.call(small.clone()).unwrap();
    set_num_threads(2);
    let two = weight_t.call(small.clone());
    set_num_threads(1);
    assert_eq!(bits(&two.unwrap()), bits(&one), "[80, 4] · [4, 4]ᵀ at two threads");
    let tall = args(2, 160, 4, 4, 13, None);
    assert_eq!(row_loops(&weight_t, &tall), 1, "[160, 4] · [4, 4]ᵀ in blocks of 80");
    // h · w1 · w2 with h [16, depth], w1 [depth, 40], w2 [40, depth].
    let chain = |(xs, w1, w2, _): Args| {
        let h0 = xs.gather(&Tensor::scalar(0i64), 0);
        fori_loop(0, 2, |_, h: Tensor| h.matmul(&w1).matmul(&w2).tanh(), h0)
    };
    let sized = |depth: usize| {
        let w = |shape: &[usize], seed| Tensor::randn(shape, seed);
        (w(&[1, 16, depth], 1), w(&[depth, 40], 2), w(&[40, depth], 3), Tensor::scalar(0f32))
    };
    assert_eq!(row_loops(&function(chain), &sized(600)), 0, "h · w1 with depth 600");
    assert_eq!(row_loops(&function(chain), &sized(500)), 1, "the same at depth 500 splits");
}

/// Callers on several threads share one split loop (its block schedules
/// and buffers): each gets its own inputs' result, with one thread's bits.
#[test]
fn concurrent_callers_share_a_split_loop() {
    let _guard = serial();
    let f = function(|a: Args| recurrence(Step::Rnn, &a, 4));
    let inputs: Vec<Args> = (0..4).map(|s| args(4, 24, 5, 40, 100 + s, None)).collect();
    assert_eq!(row_loops(&f, &inputs[0]), 1);
    set_num_threads(1);
    let want: Vec<Vec<u32>> = inputs.iter().map(|a| bits(&f.call(a.clone()).unwrap())).collect();
    set_num_threads(2);
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .iter()
            .map(|a| s.spawn(|| (0..20).map(|_| bits(&f.call(a.clone()).unwrap())).collect::<Vec<_>>()))
            .collect();
        for (h, w) in handles.into_iter().zip(&want) {
            assert!(h.join().unwrap().iter().all(|got| got == w), "a caller got another's rows");
        }
    });
    set_num_threads(1);
}
