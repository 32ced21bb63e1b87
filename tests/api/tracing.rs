//! Tracing through the public surface: the signature cache and its retrace
//! rules, nests, captures, nested functions, the eager switch, errors, and
//! concurrency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tracejit::prelude::*;

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape)
}

fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32 * 0.5 - 1.0).collect(), shape)
}

#[test]
fn traced_result_equals_eager_result() {
    let f = function(|(a, b): (Tensor, Tensor)| (&a * &b + 1.0).relu());
    let x = t(&[1.0, -2.0, 3.0, -4.0], &[2, 2]);
    let y = t(&[1.0, 1.0, 2.0, 2.0], &[2, 2]);
    let out = f.call((x.clone(), y.clone())).unwrap();
    let eager = (&x * &y + 1.0).relu();
    assert_eq!(out.to_vec::<f32>().unwrap(), eager.to_vec::<f32>().unwrap());
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 7.0, 0.0]);
    assert_eq!(f.tracing_count(), 1);
}

/// One step of a retracing scenario: the call to make and the tracing count
/// expected after it.
enum Step {
    Shape(&'static [usize]),
    Dtype(DType, &'static [usize]),
}

fn run_steps<A: Nest, R: Nest>(f: &Function<A, R>, steps: &[(Step, usize)], mk: impl Fn(Tensor) -> A) {
    for (i, (step, expected)) in steps.iter().enumerate() {
        let x = match step {
            Step::Shape(s) => ramp(s),
            Step::Dtype(d, s) => ramp(s).cast(*d),
        };
        f.call(mk(x)).unwrap_or_else(|e| panic!("step {i}: {e}"));
        assert_eq!(f.tracing_count(), *expected, "tracing count after step {i}");
    }
}

#[test]
fn retracing_follows_tf_function_rules() {
    use Step::*;
    // Plain: every new shape or dtype traces; repeats do not.
    let f = function(|x: Tensor| x.abs());
    run_steps(
        &f,
        &[
            (Shape(&[2, 3]), 1),
            (Shape(&[2, 3]), 1),
            (Shape(&[4, 3]), 2),
            (Shape(&[2, 3]), 2),
            (Dtype(DType::F64, &[2, 3]), 3),
            (Dtype(DType::I32, &[2, 3]), 4),
            (Shape(&[3]), 5),
            (Shape(&[]), 6),
            (Shape(&[4, 3]), 6),
        ],
        |x| x,
    );

    // An input signature with -1 traces once for every batch size.
    let g = function(|x: Tensor| x.abs()).input_signature(vec![TensorSpec::new(DType::F32, &[-1, 3])]);
    run_steps(&g, &[(Shape(&[2, 3]), 1), (Shape(&[5, 3]), 1), (Shape(&[0, 3]), 1), (Shape(&[1, 3]), 1)], |x| x);

    // reduce_retracing: the second shape relaxes the changing dim.
    let h = function(|x: Tensor| x.abs()).reduce_retracing(true);
    run_steps(
        &h,
        &[
            (Shape(&[2, 3]), 1),
            (Shape(&[2, 3]), 1),
            (Shape(&[4, 3]), 2),
            (Shape(&[8, 3]), 2),
            (Shape(&[16, 3]), 2),
            (Shape(&[16, 5]), 3),
            (Shape(&[7, 9]), 3),
            (Dtype(DType::F64, &[7, 9]), 4),
        ],
        |x| x,
    );
    let relaxed = &h.concrete_functions()[1];
    assert_eq!(relaxed.signature()[0].dims(), &[None, Some(3)]);
}

#[test]
fn static_arguments_go_into_the_key_by_value() {
    let h = function(|(x, n): (Tensor, Static<i64>)| x * (*n as f32));
    let x = ramp(&[3]);
    assert_eq!(h.call((x.clone(), Static(3))).unwrap().to_vec::<f32>().unwrap(), vec![-3.0, -1.5, 0.0]);
    assert_eq!(h.tracing_count(), 1);
    h.call((x.clone(), Static(3))).unwrap();
    assert_eq!(h.tracing_count(), 1);
    assert_eq!(h.call((x.clone(), Static(2))).unwrap().to_vec::<f32>().unwrap(), vec![-2.0, -1.0, 0.0]);
    assert_eq!(h.tracing_count(), 2);
    h.call((x.clone(), Static(3))).unwrap();
    assert_eq!(h.tracing_count(), 2);
    let reason = h.concrete_functions()[1].trace_reason().to_string();
    assert!(reason.contains("static argument 0"), "{reason}");

    let s = function(|(x, act): (Tensor, Static<&'static str>)| if *act == "relu" { x.relu() } else { x.neg() });
    assert_eq!(s.call((x.clone(), Static("relu"))).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0]);
    assert_eq!(s.call((x.clone(), Static("neg"))).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 0.5, -0.0]);
    assert_eq!(s.tracing_count(), 2);
}

#[test]
fn retrace_reasons_name_the_argument_and_the_change() {
    let f = function(|(a, b): (Tensor, Tensor)| &a + &b).name("adder");
    f.call((ramp(&[32, 4]), ramp(&[4]))).unwrap();
    f.call((ramp(&[64, 4]), ramp(&[4]))).unwrap();
    f.call((ramp(&[64, 4]), ramp(&[4]).cast(DType::F64).cast(DType::F32))).unwrap();
    let cfs = f.concrete_functions();
    assert_eq!(cfs.len(), 2);
    assert_eq!(cfs[0].trace_reason(), "first trace");
    assert_eq!(cfs[1].trace_reason(), "argument 0: shape [32, 4] -> [64, 4]");
    f.call((ramp(&[64, 4]).cast(DType::F64), ramp(&[4]).cast(DType::F64))).unwrap();
    let r = f.concrete_functions()[2].trace_reason().to_string();
    assert!(r.contains("argument 0: dtype f32 -> f64") && r.contains("argument 1: dtype f32 -> f64"), "{r}");
    assert_eq!(f.function_name(), "adder");
}

#[test]
fn get_concrete_function_accepts_specs_and_tensors() {
    let f = function(|(a, b): (Tensor, Tensor)| a.matmul(&b));
    let cf =
        f.get_concrete_function((TensorSpec::new(DType::F32, &[-1, 2]), TensorSpec::new(DType::F32, &[2, 2]))).unwrap();
    assert_eq!(f.tracing_count(), 1);
    assert_eq!(cf.signature()[0].dims(), &[None, Some(2)]);
    assert_eq!(cf.graph().output_types()[0].to_string(), "f32[?, 2]");
    // A call with a batch of 5 is accepted by the [-1, 2] trace.
    let x = ramp(&[5, 2]);
    let y = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
    let out = f.call((x.clone(), y.clone())).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_eq!(f.tracing_count(), 1);
    let flat = cf.call_flat(&[x.clone(), y.clone()]).unwrap();
    assert_eq!(flat[0].to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    // Tensors stand for their own type.
    let cf2 = f.get_concrete_function((x.clone(), y.clone())).unwrap();
    assert!(Arc::ptr_eq(&cf, &cf2));
    // call_flat checks count, dtype and shape.
    assert!(matches!(cf.call_flat(std::slice::from_ref(&x)), Err(Error::ArgumentCount { expected: 2, got: 1, .. })));
    let e = cf.call_flat(&[x.clone(), ramp(&[3, 3])]).unwrap_err();
    assert!(e.to_string().contains("argument 1: expected f32[2, 2], got f32[3, 3]"), "{e}");
    let e = cf.call_flat(&[x.cast(DType::F64), y.clone()]).unwrap_err();
    assert!(e.to_string().contains("argument 0: expected f32[?, 2], got f64[5, 2]"), "{e}");
}

#[test]
fn input_signature_mismatches_are_errors_not_retraces() {
    let f =
        function(|x: Tensor| x.relu()).name("relu_fn").input_signature(vec![TensorSpec::new(DType::F32, &[-1, 784])]);
    f.call(Tensor::zeros(&[2, 784], DType::F32)).unwrap();
    let e = f.call(Tensor::zeros(&[2, 783], DType::F32)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("relu_fn") && msg.contains("argument 0") && msg.contains("f32[?, 784]"), "{msg}");
    let e = f.call(Tensor::zeros(&[2, 784], DType::F64)).unwrap_err();
    assert!(e.to_string().contains("f64[2, 784]"), "{e}");
    let g = function(|(a, _b): (Tensor, Tensor)| a).input_signature(vec![TensorSpec::new(DType::F32, &[2])]);
    let e = g.call((ramp(&[2]), ramp(&[2]))).unwrap_err();
    assert!(matches!(e, Error::ArgumentCount { expected: 1, got: 2, .. }), "{e}");
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn a_panic_while_tracing_is_an_error_and_the_cache_stays_usable() {
    let fail = Arc::new(AtomicUsize::new(1));
    let fail2 = fail.clone();
    let f = function(move |x: Tensor| {
        if fail2.load(Ordering::SeqCst) == 1 {
            panic!("user bug");
        }
        x * 2.0
    })
    .name("flaky");
    let e = f.call(ramp(&[3])).unwrap_err();
    assert!(
        matches!(&e, Error::TracePanic { function, message } if function == "flaky" && message.contains("user bug"))
    );
    assert_eq!(f.tracing_count(), 0);
    assert!(f.concrete_functions().is_empty());
    fail.store(0, Ordering::SeqCst);
    assert_eq!(f.call(ramp(&[3])).unwrap().to_vec::<f32>().unwrap(), vec![-2.0, -1.0, 0.0]);
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn an_op_misused_while_tracing_names_the_op_the_shapes_and_the_function() {
    let f = function(|(a, b): (Tensor, Tensor)| &a + &b).name("bad_add");
    let e = f.call((ramp(&[3, 4]), ramp(&[5]))).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("add") && msg.contains("[3, 4]") && msg.contains("[5]") && msg.contains("bad_add"), "{msg}");
    let g = function(|(a, b): (Tensor, Tensor)| &a + &b);
    let e = g.call((ramp(&[2]), ramp(&[2]).cast(DType::F64))).unwrap_err();
    assert!(e.to_string().contains("cast"), "{e}");
}

#[test]
fn reading_a_symbolic_value_is_an_error_that_says_why() {
    let f = function(|x: Tensor| {
        let v = x.to_vec::<f32>();
        let msg = v.unwrap_err().to_string();
        assert!(msg.contains("peek") && msg.contains("cond"), "{msg}");
        x
    })
    .name("peek");
    f.call(ramp(&[2])).unwrap();
    // Branching on a value panics inside the closure: an Err from call.
    let g = function(|x: Tensor| if x.sum_all().to_scalar::<f32>().unwrap() > 0.0 { x } else { -x }).name("branchy");
    let e = g.call(ramp(&[2])).unwrap_err().to_string();
    assert!(e.contains("branchy") && e.contains("symbolic"), "{e}");
}

#[test]
fn side_effects_run_only_while_tracing() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    let f = function(move |x: Tensor| {
        log2.lock().unwrap().push(x.dims().len());
        x + 1.0
    });
    for _ in 0..3 {
        f.call(ramp(&[2])).unwrap();
    }
    f.call(ramp(&[2, 2])).unwrap();
    assert_eq!(*log.lock().unwrap(), vec![1, 2]);
}

#[test]
fn eager_tensors_are_captured_by_value() {
    let w = t(&[1.0, 2.0, 3.0], &[3]);
    let w2 = w.clone();
    let f = function(move |x: Tensor| &x * &w2 + 0.5);
    let out = f.call(t(&[1.0, 1.0, 1.0], &[3])).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![1.5, 2.5, 3.5]);
    let cf = &f.concrete_functions()[0];
    assert_eq!(cf.captures().len(), 1, "the scalar literal is not a capture");
    assert_eq!(cf.captures()[0].to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
}

#[derive(Nest)]
struct Pair {
    x: Tensor,
    scale: Static<i32>,
    extra: Option<Tensor>,
}

#[derive(Nest)]
struct Out(Tensor, Vec<Tensor>);

#[test]
fn nests_flatten_and_rebuild() {
    let f = function(|p: Pair| {
        let y = &p.x * (*p.scale as f64);
        let parts = match p.extra {
            Some(e) => vec![y.clone() + &e, e],
            None => vec![],
        };
        Out(y, parts)
    });
    let x = ramp(&[2]);
    let o = f.call(Pair { x: x.clone(), scale: Static(2), extra: Some(t(&[1.0, 1.0], &[2])) }).unwrap();
    assert_eq!(o.0.to_vec::<f32>().unwrap(), vec![-2.0, -1.0]);
    assert_eq!(o.1.len(), 2);
    assert_eq!(o.1[0].to_vec::<f32>().unwrap(), vec![-1.0, 0.0]);
    let o = f.call(Pair { x: x.clone(), scale: Static(2), extra: None }).unwrap();
    assert!(o.1.is_empty());
    assert_eq!(f.tracing_count(), 2);

    let g = function(|(xs, arr): (Vec<Tensor>, [Tensor; 2])| {
        let mut acc = &arr[0] + &arr[1];
        for x in &xs {
            acc = acc + x;
        }
        (acc, ())
    });
    let (s, ()) = g.call((vec![ramp(&[2]), ramp(&[2])], [ramp(&[2]), ramp(&[2])])).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![-4.0, -2.0]);
    g.call((vec![ramp(&[2])], [ramp(&[2]), ramp(&[2])])).unwrap();
    assert_eq!(g.tracing_count(), 2, "a Vec of another length retraces");
}

#[test]
fn nested_functions_become_call_nodes() {
    let inner = function(|x: Tensor| x.tanh() * 2.0).name("inner");
    let inner2 = inner.clone();
    let outer =
        function(move |x: Tensor| inner2.call(x.clone()).unwrap() + inner2.call(x * 3.0).unwrap()).name("outer");
    let x = ramp(&[4]);
    let out = outer.call(x.clone()).unwrap();
    let expect = x.tanh() * 2.0 + (&x * 3.0).tanh() * 2.0;
    // The JIT's tanh is within a few ULP of the reference, not bit-exact.
    for (p, q) in out.to_vec::<f32>().unwrap().iter().zip(expect.to_vec::<f32>().unwrap()) {
        assert!((p - q).abs() <= 1e-5 * q.abs().max(1.0), "{p} vs {q}");
    }
    let g = outer.concrete_functions()[0].graph().clone();
    let calls = g.nodes().filter(|(_, n)| matches!(n.op, tracejit::ir::Op::Call { .. })).count();
    assert_eq!(calls, 2);
    assert_eq!(g.library.len(), 1, "one trace of inner serves both calls");
    assert!(g.to_string().contains("call"), "{g}");
}

#[test]
fn closures_of_nested_functions_may_capture_outer_symbolic_tensors() {
    let outer = function(|(x, y): (Tensor, Tensor)| {
        let y2 = y.clone();
        let inner = function(move |a: Tensor| &a * &y2);
        inner.call(x + 1.0).unwrap()
    });
    let out = outer.call((ramp(&[3]), t(&[2.0, 2.0, 2.0], &[3]))).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
}

#[test]
fn run_functions_eagerly_calls_the_closure() {
    // Run in a child process: the switch is process-wide and tests run in parallel.
    if std::env::var("TRACEJIT_EAGER_CHILD").is_ok() {
        assert!(tracejit::config::functions_run_eagerly());
        let count = Arc::new(AtomicUsize::new(0));
        let c2 = count.clone();
        let f = function(move |x: Tensor| {
            if !x.is_symbolic() {
                c2.fetch_add(1, Ordering::SeqCst);
            }
            x + 1.0
        });
        for _ in 0..3 {
            assert_eq!(f.call(ramp(&[2])).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.5]);
        }
        assert_eq!(count.load(Ordering::SeqCst), 3);
        assert_eq!(f.tracing_count(), 0);
        tracejit::config::run_functions_eagerly(false);
        f.call(ramp(&[2])).unwrap();
        assert_eq!(f.tracing_count(), 1);
        assert_eq!(count.load(Ordering::SeqCst), 3);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args(["tracing::run_functions_eagerly_calls_the_closure", "--exact", "--nocapture"])
        .env("TRACEJIT_EAGER_CHILD", "1")
        .env("TRACEJIT_EAGER", "1")
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn concurrent_callers_trace_each_signature_once() {
    let f = function(|x: Tensor| (&x * 2.0 + 1.0).sum(&[-1], false));
    let shapes: [&[usize]; 3] = [&[4, 3], &[2, 5], &[7]];
    std::thread::scope(|s| {
        for th in 0..8usize {
            let f = f.clone();
            s.spawn(move || {
                for i in 0..1000usize {
                    let shape = shapes[(i + th) % 3];
                    let n: usize = shape.iter().product();
                    let v: Vec<f32> = (0..n).map(|k| (k + i + th) as f32).collect();
                    let x = Tensor::from_vec(v.clone(), shape);
                    let out = f.call(x).unwrap().to_vec::<f32>().unwrap();
                    let last = *shape.last().unwrap();
                    let expect: Vec<f32> = v.chunks(last).map(|c| c.iter().map(|a| a * 2.0 + 1.0).sum()).collect();
                    assert_eq!(out, expect);
                }
            });
        }
    });
    assert_eq!(f.tracing_count(), 3);
}

#[test]
fn malformed_implements_names_are_errors() {
    let f = function(|x: Tensor| x).implements("gelu");
    assert!(f.call(ramp(&[1])).unwrap_err().to_string().contains("org.semantic.opname"));
    let g = function(|x: Tensor| x).implements("tracejit.nn.gelu");
    g.call(ramp(&[1])).unwrap();
    let attrs = g.concrete_functions()[0].attributes().clone();
    assert_eq!(attrs.implements.as_deref(), Some("tracejit.nn.gelu"));
}

#[test]
fn graphs_print_and_verify() {
    let f = function(|(a, b): (Tensor, Tensor)| (&a * &b + 1.0).sum(&[1], true));
    let cf =
        f.get_concrete_function((TensorSpec::new(DType::F32, &[-1, 3]), TensorSpec::new(DType::F32, &[3]))).unwrap();
    let text = cf.graph().to_string();
    assert!(text.contains("mul") && text.contains("add") && text.contains("sum"), "{text}");
    assert!(text.contains("f32[?, 1]"), "{text}");
    let dot = cf.optimized_graph().to_dot();
    assert!(dot.starts_with("digraph"), "{dot}");
    tracejit::ir::verify(cf.graph()).unwrap();
}

#[test]
fn a_function_calling_itself_while_tracing_is_an_error_not_a_deadlock() {
    let cell: Arc<Mutex<Option<Function<Tensor, Tensor>>>> = Arc::new(Mutex::new(None));
    let c2 = cell.clone();
    let f = function(move |x: Tensor| {
        let me = c2.lock().unwrap().clone().unwrap();
        me.call(x.clone() + 1.0).unwrap()
    })
    .name("selfish");
    *cell.lock().unwrap() = Some(f.clone());
    let e = f.call(ramp(&[2])).unwrap_err().to_string();
    assert!(e.contains("selfish") && e.contains("calls itself"), "{e}");
}

#[test]
fn the_jit_runs_compiled_code_and_jit_false_the_interpreter() {
    let body = |x: Tensor| ((&x * 0.5).tanh() + 1.0).sum(&[-1], false);
    let f = function(body);
    let g = function(body).jit(false);
    let x = ramp(&[8, 33]);
    let (a, b) = (f.call(x.clone()).unwrap(), g.call(x.clone()).unwrap());
    let cf = &f.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit");
    assert!(cf.fallbacks().is_empty(), "fell back: {:?}", cf.fallbacks());
    assert_eq!(g.concrete_functions()[0].executor_kind(), "interpreter");
    for (p, q) in a.to_vec::<f32>().unwrap().iter().zip(b.to_vec::<f32>().unwrap()) {
        assert!((p - q).abs() <= 1e-5 * q.abs().max(1.0), "{p} vs {q}");
    }
}

/// Two threads trace `f` and `g` at the same time, and each trace calls the
/// other function (at a smaller static depth, so there is no recursion):
/// each thread holds one trace lock and wants the other's. One of them must
/// get an error naming the deadlock instead of waiting forever; the other
/// finishes, and the failed call succeeds when retried.
#[test]
fn threads_tracing_functions_that_call_each_other_do_not_deadlock() {
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Barrier, OnceLock};
    type Fun = Function<(Tensor, Static<i64>), Tensor>;
    static F: OnceLock<Fun> = OnceLock::new();
    static G: OnceLock<Fun> = OnceLock::new();
    static BARRIER: Barrier = Barrier::new(2);
    static F_FIRST: AtomicBool = AtomicBool::new(true);
    static G_FIRST: AtomicBool = AtomicBool::new(true);
    fn body(x: Tensor, n: i64, first: &AtomicBool, other: &OnceLock<Fun>) -> Tensor {
        if first.swap(false, Ordering::SeqCst) {
            // Both traces are under way before either calls the other.
            BARRIER.wait();
        }
        if n > 0 {
            other.get().unwrap().call((x + 1.0, Static(n - 1))).expect("nested call")
        } else {
            x * 2.0
        }
    }
    let _ = F.set(function(|(x, n): (Tensor, Static<i64>)| body(x, *n, &F_FIRST, &G)).name("f"));
    let _ = G.set(function(|(x, n): (Tensor, Static<i64>)| body(x, *n, &G_FIRST, &F)).name("g"));
    let x = t(&[1.0, 2.0], &[2]);
    let (tx, rx) = mpsc::channel();
    for which in [&F, &G] {
        let (tx, x) = (tx.clone(), x.clone());
        std::thread::spawn(move || {
            let name = if std::ptr::eq(which, &F) { "f" } else { "g" };
            tx.send((name, which.get().unwrap().call((x, Static(1))))).unwrap();
        });
    }
    let mut results = Vec::new();
    for _ in 0..2 {
        results.push(rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the two traces deadlocked"));
    }
    let errors: Vec<String> = results.iter().filter_map(|(_, r)| r.as_ref().err().map(|e| e.to_string())).collect();
    assert_eq!(errors.len(), 1, "exactly one trace must give way: {errors:?}");
    assert!(errors[0].contains("deadlock"), "{}", errors[0]);
    for (name, r) in &results {
        let fun = if *name == "f" { &F } else { &G };
        let r = match r {
            Ok(r) => r.clone(),
            Err(_) => fun.get().unwrap().call((x.clone(), Static(1))).expect("the retry succeeds"),
        };
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![4.0, 6.0], "{name}");
    }
}
