//! `tracejit-distributed` in one process (no launcher, with or without the
//! `mpi` feature): a world of one, where every collective returns its
//! input. These run in `cargo test --workspace`; the checks between
//! processes are `tests/mpi/`, run under `mpiexec`.
//!
//! What one process can check: the API's values (exactly: a collective of
//! one rank copies), the graph nodes (kept by every pass, one per call,
//! in the compiled function that ran), gradients against finite
//! differences, errors, and ONNX's refusal.

use proptest::prelude::*;
use tracejit_distributed::{self as distributed, ReduceOp};
use tracejit_trace::{function, DType, GradientTape, Tensor, Variable};

fn world_of_one() {
    let w = distributed::init().unwrap();
    assert_eq!((w.rank(), w.size()), (0, 1));
}

fn shape_and_values() -> impl Strategy<Value = (Vec<usize>, Vec<f32>)> {
    prop::collection::vec(1usize..6, 0..4).prop_flat_map(|shape| {
        let n = shape.iter().product::<usize>();
        let elem = prop_oneof![8 => -1e3f32..1e3, 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => Just(-0.0f32)];
        (Just(shape), prop::collection::vec(elem, n))
    })
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && a.to_vec::<f32>().unwrap().iter().map(|f| f.to_bits()).eq(b
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|f| f.to_bits()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Eagerly and compiled, every collective of one rank is its input,
    /// bit for bit (NaN, infinities and signed zeros included).
    #[test]
    fn every_collective_of_one_rank_is_the_identity((shape, vals) in shape_and_values()) {
        world_of_one();
        let x = Tensor::from_vec(vals, &shape);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            prop_assert!(same_bits(&distributed::all_reduce(&x, op), &x), "{:?}", op);
        }
        prop_assert!(same_bits(&distributed::broadcast(&x, 0), &x));
        if !shape.is_empty() {
            prop_assert!(same_bits(&distributed::all_gather(&x, shape.len() - 1), &x));
        }
        let avg = distributed::average_gradients(&[x.clone(), &x * 2.0]);
        prop_assert!(same_bits(&avg[0], &x));
        let f = function(|x: Tensor| {
            let s = distributed::all_reduce(&x, ReduceOp::Mean);
            let b = distributed::broadcast(&s, 0);
            distributed::average_gradients(&[b]).remove(0)
        });
        prop_assert!(same_bits(&f.call(x.clone()).unwrap(), &x));
    }
}

/// The collective nodes of a compiled function's optimized graph.
fn collective_nodes(f: &tracejit_trace::ConcreteFunction) -> usize {
    f.optimized_graph().to_string().matches(distributed::NODE_PREFIX).count()
}

#[test]
fn passes_keep_every_collective_node() {
    world_of_one();
    let f = function(|x: Tensor| {
        let a = distributed::all_reduce(&(&x * 2.0), ReduceOp::Sum); // identical twins: not merged
        let b = distributed::all_reduce(&(&x * 2.0), ReduceOp::Sum);
        let _unused = distributed::all_reduce(&x, ReduceOp::Max); // unused: not dropped
        let c = distributed::all_reduce(&Tensor::scalar(1.0f32), ReduceOp::Sum); // constant: not folded
        &a + &b + c
    });
    let y = f.call(Tensor::from_vec(vec![1.0f32, -2.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [5.0, -7.0]);
    let cf = f.concrete_functions().remove(0);
    assert_eq!(collective_nodes(&cf), 4, "{}", cf.optimized_graph());
}

#[test]
fn collectives_keep_program_order_with_variable_writes() {
    world_of_one();
    let v = Variable::new(Tensor::from_vec(vec![1.0f32], &[1]));
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        let before = distributed::all_reduce(&v2.read(), ReduceOp::Sum);
        v2.assign_add(&x);
        let after = distributed::all_reduce(&v2.read(), ReduceOp::Sum);
        v2.assign_add(&x);
        Tensor::concat(&[before, after], 0)
    });
    let out = f.call(Tensor::from_vec(vec![10.0f32], &[1])).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), [1.0, 11.0]);
    assert_eq!(v.value().to_vec::<f32>().unwrap(), [21.0]);
}

/// Bucket sizes are read at trace time and are process-wide: the tests
/// that change them hold this (tests run in parallel threads of one
/// process).
static BUCKET_BYTES: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn average_gradients_goes_out_in_buckets_of_the_set_size() {
    world_of_one();
    let _only_me = BUCKET_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    distributed::set_bucket_bytes(64);
    let f = function(|(a, b, c): (Tensor, Tensor, Tensor)| distributed::average_gradients(&[a, b, c]));
    // 16 f32 (64 bytes), 4 f32 (16), 12 f32 (48): [c, b] fit 64 bytes, a alone.
    let args = (Tensor::randn(&[16], 1), Tensor::randn(&[4], 2), Tensor::randn(&[3, 4], 3));
    let out = f.call(args.clone()).unwrap();
    distributed::set_bucket_bytes(distributed::DEFAULT_BUCKET_BYTES);
    for (o, i) in out.iter().zip([&args.0, &args.1, &args.2]) {
        assert!(same_bits(o, i));
    }
    let listing = f.concrete_functions()[0].optimized_graph().to_string();
    assert_eq!(listing.matches("start_bucket").count(), 2, "{listing}");
    assert_eq!(listing.matches("wait_bucket").count(), 2, "{listing}");
}

/// A three-layer regression step: the loss, after the weights took one
/// SGD step with their gradients averaged over the world (`ddp`) or not.
fn sgd_step(ws: Vec<Variable>, ddp: bool) -> tracejit_trace::Function<Tensor, Tensor> {
    function(move |x: Tensor| {
        let tape = GradientTape::new();
        let h1 = x.matmul(&ws[0].read()).tanh();
        let h2 = h1.matmul(&ws[1].read()).tanh();
        let loss = (h2.matmul(&ws[2].read()) - 0.5).square().sum_all();
        let grads: Vec<Tensor> =
            tape.gradient(&loss, &ws[..]).unwrap().into_iter().map(|g| g.expect("every weight is used")).collect();
        let grads = if ddp { distributed::average_gradients(&grads) } else { grads };
        for (w, g) in ws.iter().zip(&grads) {
            w.assign_sub(&(g * 0.1f32));
        }
        loss
    })
}

/// Inside a compiled training step each bucket's all-reduce starts right
/// after the step making its last gradient (the JIT's `start_early` pass),
/// while the rest of the backward still computes, not after the whole
/// backward where `average_gradients` is called; the step's results are
/// those of the same step without DDP, bit for bit (a world of one).
#[test]
fn buckets_start_while_the_backward_still_computes() {
    world_of_one();
    let weights = |seed: u64| -> Vec<Variable> {
        [[12usize, 32], [32, 32], [32, 4]]
            .iter()
            .enumerate()
            .map(|(i, s)| Variable::new(Tensor::randn(s, seed + i as u64) * 0.3f32))
            .collect()
    };
    let x = Tensor::randn(&[16, 12], 7);
    let (ddp_w, plain_w) = (weights(1), weights(1));
    let step = {
        let _only_me = BUCKET_BYTES.lock().unwrap_or_else(|e| e.into_inner());
        distributed::set_bucket_bytes(64); // one bucket per weight
        let step = sgd_step(ddp_w.clone(), true);
        let traced = step.get_concrete_function(x.clone());
        distributed::set_bucket_bytes(distributed::DEFAULT_BUCKET_BYTES);
        traced.unwrap();
        step
    };
    let plain = sgd_step(plain_w.clone(), false);
    for _ in 0..3 {
        let (a, b) = (step.call(x.clone()).unwrap(), plain.call(x.clone()).unwrap());
        assert!(same_bits(&a, &b));
    }
    for (a, b) in ddp_w.iter().zip(&plain_w) {
        assert!(same_bits(&a.value(), &b.value()));
    }
    let cf = step.concrete_functions().remove(0);
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let profile = cf.profile(std::slice::from_ref(&x), 1).unwrap().expect("the JIT runs it");
    let top = || profile.steps.iter().filter(|s| s.depth == 0);
    let starts: Vec<usize> = top().filter(|s| s.what.contains("start_bucket")).map(|s| s.index).collect();
    let products: Vec<usize> = top().filter(|s| s.kind == "gemm").map(|s| s.index).collect();
    assert_eq!(starts.len(), 3, "{profile}");
    // The backward's last product is the first layer's weight gradient:
    // the last layer's bucket (the first one) starts before it.
    assert!(starts[0] < *products.last().unwrap(), "starts {starts:?}, products {products:?}\n{profile}");
}

/// Central differences in f64 (h = 1e-5: error ~1e-10 for these smooth
/// losses) against the tape's gradient, eagerly and inside a function.
#[test]
fn gradients_of_one_rank_match_finite_differences() {
    world_of_one();
    type Loss = fn(&Tensor) -> Tensor;
    let cases: Vec<(&str, Loss)> = vec![
        ("sum", |x| distributed::all_reduce(&(x * x), ReduceOp::Sum).tanh().sum_all()),
        ("mean", |x| distributed::all_reduce(&x.exp(), ReduceOp::Mean).sum_all()),
        ("max", |x| (distributed::all_reduce(x, ReduceOp::Max) * 3.0).sin().sum_all()),
        ("broadcast", |x| distributed::broadcast(&x.tanh(), 0).sum_all()),
        ("all_gather", |x| (distributed::all_gather(x, 1) * x).sum_all()),
    ];
    let x0 = vec![0.3f64, -1.2, 0.7, 2.0, -0.1, 0.05];
    for (name, loss) in cases {
        let x = Tensor::from_vec(x0.clone(), &[2, 3]);
        let tape = GradientTape::new();
        tape.watch(&x);
        let eager = tape.gradient(&loss(&x), &[&x]).unwrap()[0].clone().unwrap().to_vec::<f64>().unwrap();
        let f = function(move |x: Tensor| {
            let tape = GradientTape::new();
            tape.watch(&x);
            tape.gradient(&loss(&x), &[&x]).unwrap()[0].clone().unwrap()
        });
        let compiled = f.call(x.clone()).unwrap().to_vec::<f64>().unwrap();
        assert!(collective_nodes(&f.concrete_functions()[0]) >= 2, "{name}: forward and backward nodes");
        for j in 0..x0.len() {
            let at = |d: f64| {
                let mut v = x0.clone();
                v[j] += d;
                loss(&Tensor::from_vec(v, &[2, 3])).to_vec::<f64>().unwrap()[0]
            };
            let fd = (at(1e-5) - at(-1e-5)) / 2e-5;
            for (how, g) in [("eager", eager[j]), ("compiled", compiled[j])] {
                assert!((g - fd).abs() <= 1e-6 * (1.0 + fd.abs()), "{name} {how} [{j}]: {g} vs {fd}");
            }
        }
    }
}

#[test]
fn misuse_is_an_error_naming_the_rank() {
    world_of_one();
    let ints = Tensor::from_vec(vec![1i32, 2], &[2]);
    let e = distributed::try_all_reduce(&ints, ReduceOp::Mean).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("float"), "{e}");
    let e = distributed::try_all_reduce(&Tensor::scalar(true), ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("bool"), "{e}");
    let e = distributed::try_broadcast(&Tensor::scalar(1.0f32), 1).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("root 1"), "{e}");
    let f = function(|x: Tensor| distributed::all_reduce(&x, ReduceOp::Mean));
    let e = f.call(Tensor::from_vec(vec![1i64], &[1])).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("float"), "{e}");
    // The function still works for a valid call afterwards.
    let ok = f.call(Tensor::from_vec(vec![2.0f32], &[1])).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), [2.0]);
    // Integer sums, bool max/min are fine.
    assert_eq!(distributed::all_reduce(&ints, ReduceOp::Sum).to_vec::<i32>().unwrap(), [1, 2]);
    assert_eq!(distributed::all_reduce(&Tensor::scalar(true), ReduceOp::Min).dtype(), DType::Bool);
    // u64 travels as i64's bits: its max and min would compare signed.
    let big = Tensor::from_vec(vec![u64::MAX, 1], &[2]);
    let e = distributed::try_all_reduce(&big, ReduceOp::Max).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("u64"), "{e}");
    assert_eq!(distributed::all_reduce(&big, ReduceOp::Sum).to_vec::<u64>().unwrap(), [u64::MAX, 1]);
    // The narrow integers travel in their compute dtype and come back as they were.
    for d in [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32] {
        let x = Tensor::from_vec(vec![-1i64, 7, 200], &[3]).cast(d);
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let y = distributed::all_reduce(&x, op);
            assert_eq!(y.dtype(), d);
            assert_eq!(y.cast(DType::I64).to_vec::<i64>().unwrap(), x.cast(DType::I64).to_vec::<i64>().unwrap());
        }
    }
}

#[test]
fn onnx_export_refuses_a_collective_by_name() {
    world_of_one();
    let f = function(|x: Tensor| distributed::all_reduce(&x.relu(), ReduceOp::Sum));
    let cf = f.get_concrete_function(tracejit_trace::TensorSpec::new(DType::F32, &[2])).unwrap();
    let e = tracejit_onnx::to_bytes(&cf).unwrap_err().to_string();
    assert!(e.contains("tracejit.distributed.all_reduce") && e.contains("collective"), "{e}");
}

#[test]
fn errors_convert_into_tracejit_errors_for_question_marks() -> tracejit_trace::Result<()> {
    let w = distributed::init()?;
    assert_eq!(w.size(), 1);
    let e: tracejit_trace::Error = distributed::try_broadcast(&Tensor::scalar(1.0f32), 3).unwrap_err().into();
    assert!(e.to_string().contains("root 3"), "{e}");
    assert!(matches!(e.downcast_source::<distributed::Error>(), Some(distributed::Error::Invalid { rank: 0, .. })));
    Ok(())
}
