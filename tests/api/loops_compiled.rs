//! Compiled counted loops (W8's shape): the `hoist` pass moves a loop's
//! input projection `x[t] @ w` out of the loop as one product, and the
//! executor takes `x[t]` as a view. Traced (interpreter and JIT) against
//! eager on random sizes (0, 1, 3, 5), with NaN and infinity in the
//! sequence, loops shorter than the sequence, negative and out-of-range
//! indices.

use crate::common;

use proptest::prelude::*;
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * y.abs().max(1.0))
}

/// W8's recurrence over the first `trips` steps of `xs`.
fn rnn(xs: &Tensor, wx: &Tensor, wh: &Tensor, b: &Tensor, trips: i64) -> Tensor {
    let [batch, hidden] = [xs.dims()[1], wh.dims()[1]].map(|d| d.unwrap());
    let h0 = Tensor::zeros(&[batch, hidden], xs.dtype());
    fori_loop(0, trips, |t, h: Tensor| (xs.gather(&t, 0).matmul(wx) + h.matmul(wh) + b).tanh(), h0)
}

type Args = (Tensor, Tensor, Tensor, Tensor);

fn args(steps: usize, batch: usize, k: usize, hidden: usize, seed: u64, special: Option<f32>) -> Args {
    common::rnn_args((steps, batch, k, hidden), seed, special)
}

/// The traced function of `rnn` with a static trip count.
fn traced(trips: i64, jit: bool) -> Function<Args, Tensor> {
    function(move |(xs, wx, wh, b): Args| rnn(&xs, &wx, &wh, &b, trips)).jit(jit)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn hoisted_rnn_matches_eager(
        steps in prop::sample::select(vec![1usize, 3, 5]),
        batch in prop::sample::select(vec![0usize, 1, 3, 5]),
        k in prop::sample::select(vec![1usize, 3, 5]),
        hidden in prop::sample::select(vec![1usize, 3, 5]),
        special in prop::sample::select(vec![None, Some(f32::NAN), Some(f32::INFINITY)]),
        seed in 0u64..1000,
    ) {
        let a = args(steps, batch, k, hidden, seed, special);
        let want = vals(&rnn(&a.0, &a.1, &a.2, &a.3, steps as i64));
        for jit in [false, true] {
            let f = traced(steps as i64, jit);
            let got = vals(&f.call(a.clone()).unwrap());
            prop_assert!(close(&got, &want, 1e-5), "jit {}: {:?} vs eager {:?}", jit, got, want);
            let cf = &f.concrete_functions()[0];
            prop_assert!(cf.stats().changed_by("hoist"), "{}", cf.stats());
        }
    }
}

#[test]
fn the_product_leaves_the_loop_and_x_t_is_a_view() {
    let f = traced(4, true);
    f.call(args(4, 3, 5, 6, 1, None)).unwrap();
    let cf = &f.concrete_functions()[0];
    let text = cf.optimized_graph().to_string();
    // The body keeps one product (h @ wh); x @ wx runs once, before the loop.
    let body = &text[text.find("graph").unwrap() + 5..];
    let body = &body[body.find(".body").unwrap()..];
    assert_eq!(body.matches("matmul").count(), 1, "{text}");
    assert_eq!(text.matches("matmul").count(), 2, "{text}");
    // The pass is idempotent and leaves a graph the verifier accepts.
    let mut again = cf.optimized_graph().clone();
    let cx = tracejit::ir::passes::PassContext::new("again");
    let pass = tracejit::ir::passes::HoistLoopProducts;
    assert!(!tracejit::ir::passes::Pass::run(&pass, &mut again, &cx).changed);
    tracejit::ir::verify(cf.optimized_graph()).unwrap();
    let stats = cf.schedule_stats().unwrap();
    // Outer product; per trip: one GEMM, one region, the counter ops.
    assert_eq!(stats.gemms, 2, "{stats}");
    assert_eq!(stats.views, 1, "{stats}");
    assert!(!cf.fallbacks().contains(&"gather".to_string()), "{:?}", cf.fallbacks());
}

#[test]
fn a_loop_shorter_than_the_sequence_keeps_its_product() {
    // Hoisting would compute 5 slices for 2 trips: left alone.
    let a = args(5, 3, 4, 2, 7, None);
    let want = vals(&rnn(&a.0, &a.1, &a.2, &a.3, 2));
    let f = traced(2, true);
    let got = vals(&f.call(a).unwrap());
    assert!(close(&got, &want, 1e-5), "{got:?} vs {want:?}");
    assert!(!f.concrete_functions()[0].stats().changed_by("hoist"));
}

#[test]
fn negative_indices_count_from_the_end() {
    let xs = Tensor::randn(&[4, 2, 3], 3);
    let run = |xs: &Tensor| {
        fori_loop(-4, 0, |t, acc: Tensor| &acc * 0.5 + xs.gather(&t, 0), Tensor::zeros(&[2, 3], DType::F32))
    };
    let want = vals(&run(&xs));
    for jit in [false, true] {
        let f = function(move |xs: Tensor| run(&xs)).jit(jit);
        assert_eq!(vals(&f.call(xs.clone()).unwrap()), want, "jit {jit}");
    }
}

#[test]
fn an_index_out_of_range_is_an_error_naming_it() {
    // 4 trips over a sequence of 3: the hoisted gather fails like x[3].
    for jit in [false, true] {
        let f = traced(4, jit);
        let e = f.call(args(3, 2, 3, 2, 5, None)).unwrap_err().to_string();
        assert!(e.contains("index 3 is out of range for axis 0 of size 3"), "jit {jit}: {e}");
    }
}

#[test]
fn transposes_are_views_not_reference_ops() {
    let f = function(|(a, b): (Tensor, Tensor)| a.transpose(&[1, 0]).matmul(&b));
    let (a, b) = (Tensor::randn(&[5, 3], 1), Tensor::randn(&[5, 4], 2));
    let got = f.call((a.clone(), b.clone())).unwrap();
    let want = a.transpose(&[1, 0]).matmul(&b);
    assert!(close(&vals(&got), &vals(&want), 1e-5));
    let stats = f.concrete_functions()[0].schedule_stats().unwrap();
    assert_eq!((stats.views, stats.fallbacks, stats.gemms), (1, 0, 1), "{stats}");
}
