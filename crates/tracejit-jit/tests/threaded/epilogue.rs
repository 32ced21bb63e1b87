//! A mid-sized product and the region that consumes it, run together in
//! row halves (each thread: its rows of the product, then of the region),
//! give the bits of the two run apart — with 1, 2 and 3 threads, on NaN
//! and infinities, for elementwise and row (softmax) consumers, in place
//! or not, f32 products and bf16 ones (mixed precision's rounded operands,
//! on the bf16 GEMM) — and run so where `threads::epilogue_rows` says.

use crate::common::*;
use crate::serial;
use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};
use tracejit_jit::threads::{self, pool_dispatches, set_num_threads};
use tracejit_jit::Executable;

/// What reads the product.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    /// `tanh(x + p + bias)`: a loop step's update (W8).
    Step,
    /// `softmax(p)` along rows.
    Softmax,
    /// `p * p - p`: the product alone, so written in place.
    Square,
}

/// `a·b` and its consumer; with `keep`, the product is an output too (so
/// it outlives the region, which then runs apart). With `transposed`, `b`
/// is given `[n, k]` and transposed in the graph (a strided view); with
/// `x_view`, so is `x` (the region then gets a strided input, off its
/// static plan: the two run apart at run time). With `bf16` (f32 only),
/// both operands are rounded to bf16 first, as `auto_mixed_precision`
/// writes them: the product runs on the bf16 GEMM.
fn graph(
    dt: DType,
    (m, k, n): (usize, usize, usize),
    consumer: Consumer,
    keep: bool,
    views: (bool, bool, bool),
) -> Graph {
    let (transposed, x_view, bf16) = views;
    let mut g = Graph::new("epilogue");
    let a = param(&mut g, dt, &[m, k]);
    let b = matrix_param(&mut g, dt, (k, n), transposed);
    let x = matrix_param(&mut g, dt, (m, n), x_view);
    let bias = param(&mut g, dt, &[n]);
    let round = |g: &mut Graph, v: ValueId| {
        let low = node(g, Op::Cast { to: DType::BF16 }, &[v]);
        node(g, Op::Cast { to: DType::F32 }, &[low])
    };
    let (a, b) = if bf16 { (round(&mut g, a), round(&mut g, b)) } else { (a, b) };
    let p = node(&mut g, Op::MatMul, &[a, b]);
    let bin = |g: &mut Graph, op, l: ValueId, r: ValueId| node(g, Op::Binary(op), &[l, r]);
    let y = match consumer {
        Consumer::Step => {
            let s = bin(&mut g, BinaryOp::Add, x, p);
            let s = bin(&mut g, BinaryOp::Add, s, bias);
            node(&mut g, Op::Unary(UnaryOp::Tanh), &[s])
        }
        Consumer::Softmax => {
            let red = |g: &mut Graph, op, v| node(g, Op::Reduce { op, axes: vec![1], keepdims: true }, &[v]);
            let mx = red(&mut g, ReduceOp::Max, p);
            let d = bin(&mut g, BinaryOp::Sub, p, mx);
            let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
            let s = red(&mut g, ReduceOp::Sum, e);
            bin(&mut g, BinaryOp::Div, e, s)
        }
        Consumer::Square => {
            let sq = bin(&mut g, BinaryOp::Mul, p, p);
            bin(&mut g, BinaryOp::Sub, sq, p)
        }
    };
    g.outputs.push(y);
    if keep {
        g.outputs.push(p);
    }
    g
}

/// Whether a step of `exe` ran as a product with its consumer.
fn runs_in_halves(exe: &Executable, inputs: &[Storage]) -> bool {
    let profile = exe.profile(inputs, 1).expect("runs");
    profile.steps.iter().any(|s| s.what.contains("in row halves"))
}

/// Whether `exe` runs a product on the bf16 GEMM.
fn runs_bf16(exe: &Executable, inputs: &[Storage]) -> bool {
    let profile = exe.profile(inputs, 1).expect("runs");
    profile.steps.iter().any(|s| s.kind == "gemm_bf16")
}

fn consumer() -> impl Strategy<Value = Consumer> {
    prop::sample::select(vec![Consumer::Step, Consumer::Softmax, Consumer::Square])
}

/// One case: the product with its consumer against the two apart, at 1,
/// 2 and 3 threads, run in halves exactly where planned.
#[allow(clippy::too_many_arguments, reason = "the dimensions of one case")]
fn check_case(
    (m, k, n): (usize, usize, usize),
    dt: DType,
    consumer: Consumer,
    seed: u64,
    special: bool,
    (transposed, x_view, bf16): (bool, bool, bool),
) -> Result<(), TestCaseError> {
    let _s = serial();
    let sizes = (m, k, n);
    let inputs = [
        data(dt, &[m, k], seed, special),
        data(dt, &if transposed { [n, k] } else { [k, n] }, seed + 1, false),
        data(dt, &if x_view { [n, m] } else { [m, n] }, seed + 2, special),
        data(dt, &[n], seed + 3, false),
    ];
    let together = Executable::new(&graph(dt, sizes, consumer, false, (transposed, x_view, bf16))).unwrap();
    let apart = Executable::new(&graph(dt, sizes, consumer, true, (transposed, x_view, bf16))).unwrap();
    prop_assert_eq!(runs_bf16(&together, &inputs), bf16);
    // `Square`'s region is one flat row of `m·n` elements, cut only at
    // multiples of the 512-element granule; the others walk rows.
    let planned = threads::epilogue_rows(m, n, k)
        .is_some_and(|half| !matches!(consumer, Consumer::Square) || (half * n).is_multiple_of(512));
    set_num_threads(2);
    prop_assert_eq!(runs_in_halves(&together, &inputs), planned, "{:?}", sizes);
    prop_assert!(!runs_in_halves(&apart, &inputs));
    for t in [1, 2, 3] {
        set_num_threads(t);
        let before = pool_dispatches();
        let got = together.run(&inputs).unwrap();
        // A strided `x` falls back to the plain product (split or not by
        // its own rules).
        let halves = planned && !x_view;
        prop_assert!(!halves || t == 1 || pool_dispatches() > before, "{t} threads did not split");
        let want = apart.run(&inputs).unwrap();
        if let Err(e) = exact_eq(&got[0], &want[0]) {
            set_num_threads(1);
            return Err(TestCaseError::fail(format!("{t} threads: {e}")));
        }
    }
    set_num_threads(1);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_product_with_its_consumer_has_the_bits_of_the_two_apart(
        m in prop::sample::select(vec![16usize, 17, 23, 32, 40, 64, 100, 130]),
        k in prop::sample::select(vec![4usize, 5, 64, 128, 300, 512, 600]),
        n in prop::sample::select(vec![4usize, 17, 64, 128, 200]),
        dt in prop::sample::select(vec![DType::F32, DType::F64]),
        consumer in consumer(),
        seed in 0u64..1000,
        special in any::<bool>(),
        views in any::<(bool, bool, bool)>(),
    ) {
        let bf16 = views.2 && dt == DType::F32;
        check_case((m, k, n), dt, consumer, seed, special, (views.0, views.1, bf16))?;
    }
}

/// Shapes the pairing takes, every consumer, f32 and bf16 products, NaN
/// and Inf or not (the random cases above land on them only now and then).
#[test]
fn planned_shapes_with_every_consumer() {
    for (n, sizes) in [(32, 128, 128), (64, 64, 128), (40, 300, 64), (100, 128, 64)].into_iter().enumerate() {
        assert!(threads::epilogue_rows(sizes.0, sizes.2, sizes.1).is_some(), "{sizes:?} is not planned");
        for consumer in [Consumer::Step, Consumer::Softmax, Consumer::Square] {
            for bf16 in [false, true] {
                let views = (n % 2 == 1, false, bf16);
                check_case(sizes, DType::F32, consumer, n as u64, n % 2 == 0, views).unwrap();
            }
        }
    }
}

/// A recurrent step `h = tanh(x + h·w + b)` of W8's sizes, its output fed
/// back eight times, runs in halves and keeps one thread's bits — in f32
/// and with the product on the bf16 GEMM.
#[test]
fn repeated_recurrent_steps_keep_their_bits() {
    let _s = serial();
    let dt = DType::F32;
    for bf16 in [false, true] {
        let g = graph(dt, (32, 128, 128), Consumer::Step, false, (false, false, bf16));
        let inputs = [
            data(dt, &[32, 128], 7, false),
            data(dt, &[128, 128], 8, false),
            data(dt, &[32, 128], 9, false),
            data(dt, &[128], 10, false),
        ];
        let exe = Executable::new(&g).unwrap();
        set_num_threads(1);
        let mut one = inputs.clone();
        let mut two = inputs.clone();
        for _ in 0..8 {
            set_num_threads(1);
            one[0] = exe.run(&one).unwrap().remove(0);
            set_num_threads(2);
            two[0] = exe.run(&two).unwrap().remove(0);
            exact_eq(&one[0], &two[0]).unwrap();
        }
        set_num_threads(2);
        assert!(runs_in_halves(&exe, &inputs), "bf16: {bf16}");
        assert_eq!(runs_bf16(&exe, &inputs), bf16);
        set_num_threads(1);
    }
}
