//! Bounded signature caches: `max_traces(n)` with each `RetracePolicy`,
//! the counts and reasons in `cache_stats`, and a `Static` key that is not
//! equal to itself. (Regression tests for failure 5 of issue #17: 2,000
//! shapes made 2,001 traces and kept them all.)

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use tracejit::prelude::*;
use tracejit::{CacheStats, RetracePolicy};

fn ramp(n: usize) -> Tensor {
    Tensor::from_vec((0..n).map(|i| i as f32 - 1.5).collect(), &[n])
}

fn expect(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 1.5) * 2.0 + 1.0).collect()
}

fn affine() -> Function<Tensor, Tensor> {
    function(|x: Tensor| x * 2.0 + 1.0).name("affine")
}

#[test]
fn evict_keeps_at_most_n_traces_and_frees_the_rest() {
    let f = affine().max_traces(4);
    let mut evicted: Vec<Weak<ConcreteFunction>> = Vec::new();
    for n in 1..=40 {
        assert_eq!(f.call(ramp(n)).unwrap().to_vec::<f32>().unwrap(), expect(n));
        evicted.extend(f.concrete_functions().iter().map(Arc::downgrade));
        assert!(f.concrete_functions().len() <= 4);
    }
    assert_eq!(f.tracing_count(), 40);
    let stats: CacheStats = f.cache_stats();
    assert_eq!((stats.traces, stats.cached, stats.evictions), (40, 4, 36));
    assert_eq!(stats.refused + stats.generalized + stats.eager_calls, 0);
    // Evicted traces are dropped, with their compiled code.
    let mut alive: Vec<*const ConcreteFunction> =
        evicted.iter().filter(|w| w.strong_count() > 0).map(Weak::as_ptr).collect();
    alive.sort();
    alive.dedup();
    let alive = alive.len();
    assert_eq!(alive, 4, "ConcreteFunctions still alive");
    let last = stats.events.back().unwrap();
    assert!(last.contains("evicted the trace for (f32[36])") && last.contains("least recently used"), "{last}");
    assert!(last.contains("argument 0: shape [39] -> [40]"), "the event gives the retrace's reason: {last}");
}

#[test]
fn evict_drops_the_least_recently_used() {
    let f = affine().max_traces(2).retrace_policy(RetracePolicy::Evict);
    f.call(ramp(1)).unwrap();
    f.call(ramp(2)).unwrap();
    f.call(ramp(1)).unwrap(); // [1] is now more recent than [2]
    f.call(ramp(3)).unwrap(); // evicts [2]
    assert_eq!(f.tracing_count(), 3);
    f.call(ramp(1)).unwrap();
    f.call(ramp(3)).unwrap();
    assert_eq!(f.tracing_count(), 3, "[1] and [3] are cached");
    assert_eq!(f.call(ramp(2)).unwrap().to_vec::<f32>().unwrap(), expect(2));
    assert_eq!(f.tracing_count(), 4, "[2] was evicted and traces again");
}

#[test]
fn error_refuses_a_trace_beyond_the_bound() {
    let f = affine().max_traces(2).retrace_policy(RetracePolicy::Error);
    f.call(ramp(1)).unwrap();
    f.call(ramp(2)).unwrap();
    let e = f.call(ramp(3)).unwrap_err();
    assert!(matches!(&e, Error::RetraceLimit { function, max_traces: 2, .. } if function == "affine"), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("argument 0: shape [2] -> [3]") && msg.contains("limit of 2"), "{msg}");
    // The cached signatures still run; nothing was evicted.
    assert_eq!(f.call(ramp(1)).unwrap().to_vec::<f32>().unwrap(), expect(1));
    assert_eq!(f.call(ramp(2)).unwrap().to_vec::<f32>().unwrap(), expect(2));
    let stats = f.cache_stats();
    assert_eq!((stats.traces, stats.cached, stats.refused, stats.evictions), (2, 2, 1, 0));
}

#[test]
fn a_policy_alone_bounds_the_cache_at_one_trace() {
    let f = affine().retrace_policy(RetracePolicy::Error);
    f.call(ramp(3)).unwrap();
    f.call(ramp(3)).unwrap();
    assert!(matches!(f.call(ramp(4)), Err(Error::RetraceLimit { max_traces: 1, .. })));
}

#[test]
fn generalize_traces_once_for_the_shapes_seen() {
    let f = function(|x: Tensor| (&x * 2.0).sum(&[-1], false)).max_traces(1).retrace_policy(RetracePolicy::Generalize);
    let m = |r: usize, c: usize| Tensor::from_vec((0..r * c).map(|i| i as f32).collect(), &[r, c]);
    let sums =
        |r: usize, c: usize| -> Vec<f32> { (0..r).map(|i| (0..c).map(|j| ((i * c + j) as f32) * 2.0).sum()).collect() };
    for (r, c) in [(2, 3), (4, 3), (7, 3), (0, 3), (1, 3), (5, 3)] {
        assert_eq!(f.call(m(r, c)).unwrap().to_vec::<f32>().unwrap(), sums(r, c), "[{r}, {c}]");
    }
    assert_eq!(f.tracing_count(), 2, "[2, 3], then once for [?, 3]");
    let cfs = f.concrete_functions();
    assert_eq!(cfs.len(), 1);
    assert_eq!(cfs[0].signature()[0].to_string(), "f32[?, 3]");
    let stats = f.cache_stats();
    assert_eq!((stats.generalized, stats.evictions), (1, 1));
    // A new rank cannot be generalized into [?, 3]: it evicts instead.
    assert_eq!(
        f.call(ramp(3)).unwrap().to_vec::<f32>().unwrap(),
        vec![((0..3).map(|i| i as f32 - 1.5).sum::<f32>()) * 2.0]
    );
    assert_eq!(f.cache_stats().evictions, 2);
}

#[test]
fn eager_runs_beyond_the_bound_without_tracing() {
    let f = affine().max_traces(1).retrace_policy(RetracePolicy::Eager);
    for n in [3, 5, 0, 3, 1, 3] {
        assert_eq!(f.call(ramp(n)).unwrap().to_vec::<f32>().unwrap(), expect(n));
    }
    assert_eq!(f.tracing_count(), 1);
    let stats = f.cache_stats();
    assert_eq!((stats.cached, stats.eager_calls, stats.evictions), (1, 3, 0));
    assert!(stats.events[0].contains("ran eagerly"), "{:?}", stats.events);
    // get_concrete_function must produce a graph: it evicts instead.
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[9])).unwrap();
    assert_eq!(cf.signature()[0].to_string(), "f32[9]");
    assert_eq!(f.cache_stats().evictions, 1);
}

#[test]
fn bounded_caches_stay_correct_under_threads() {
    let f = affine().max_traces(3);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let f = f.clone();
            s.spawn(move || {
                for i in 0..200usize {
                    let n = (i * 7 + t) % 9;
                    assert_eq!(f.call(ramp(n)).unwrap().to_vec::<f32>().unwrap(), expect(n));
                }
            });
        }
    });
    let stats = f.cache_stats();
    assert!(stats.cached <= 3, "{stats:?}");
    assert_eq!(stats.traces, stats.cached + stats.evictions);
}

/// A key whose `Eq` is not reflexive for NaN, as a derived `PartialEq` over
/// an f64 is.
#[derive(Clone, Debug)]
struct Scale(f64);

impl PartialEq for Scale {
    fn eq(&self, other: &Scale) -> bool {
        self.0 == other.0
    }
}
impl Eq for Scale {}
impl Hash for Scale {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

#[test]
fn a_static_key_that_is_not_equal_to_itself_is_reported() {
    let f = function(|(x, s): (Tensor, Static<Scale>)| x * (s.0).0).name("scaled");
    assert_eq!(f.call((ramp(2), Static(Scale(2.0)))).unwrap().to_vec::<f32>().unwrap(), vec![-3.0, -1.0]);
    for _ in 0..3 {
        let e = f.call((ramp(2), Static(Scale(f64::NAN)))).unwrap_err().to_string();
        assert!(e.contains("scaled") && e.contains("static argument 0") && e.contains("not equal to itself"), "{e}");
    }
    assert_eq!(f.tracing_count(), 1, "a NaN key never traces");
}

#[test]
fn eager_calls_keep_the_functions_variables() {
    let ones = |n: usize| Tensor::ones(&[n], DType::F32);
    // `remember` gives the eager calls the variable the trace created.
    let total = function(|x: Tensor| {
        let t = remember(|| Variable::new(Tensor::zeros(&[], DType::F32)));
        t.assign_add(&x.sum_all());
        t.read()
    })
    .max_traces(1)
    .retrace_policy(RetracePolicy::Eager);
    for (n, want) in [(2, 2.0f32), (3, 5.0), (2, 7.0), (5, 12.0)] {
        assert_eq!(total.call(ones(n)).unwrap().to_vec::<f32>().unwrap(), vec![want]);
    }
    assert_eq!((total.tracing_count(), total.cache_stats().eager_calls), (1, 2));
    // A variable created in the body on a later call is the error a later
    // trace gives, eagerly too.
    let fresh = function(|x: Tensor| {
        let v = Variable::new(Tensor::zeros(&[], DType::F32));
        v.assign_add(&x.sum_all());
        v.read()
    })
    .max_traces(1)
    .retrace_policy(RetracePolicy::Eager);
    fresh.call(ones(2)).unwrap();
    let e = fresh.call(ones(3)).unwrap_err().to_string();
    assert!(e.contains("running eagerly") && e.contains("later call"), "{e}");
}

/// A call whose trace failed evicted the working trace first: with
/// `max_traces(1)` and a body that creates its variable on the first trace,
/// every later call then failed for good (failure 5 of issue #28).
#[test]
fn a_failed_trace_evicts_nothing() {
    let f = function(|x: Tensor| {
        let scale = Variable::new(Tensor::ones(&[3], DType::F32));
        x * scale.read()
    })
    .max_traces(1);
    assert_eq!(f.call(ramp(3)).unwrap().to_vec::<f32>().unwrap(), vec![-1.5, -0.5, 0.5]);
    // A second trace fails (it would create the variable again).
    let e = f.call(ramp(4)).unwrap_err();
    assert!(e.to_string().contains("creates a variable on a later trace"), "{e}");
    assert_eq!(f.cache_stats().cached, 1, "the working trace is still cached");
    assert_eq!(f.cache_stats().evictions, 0);
    assert_eq!(f.call(ramp(3)).unwrap().to_vec::<f32>().unwrap(), vec![-1.5, -0.5, 0.5]);
    assert_eq!(f.tracing_count(), 1);
}

/// Collects `log` warnings (installed in a child process only: the logger
/// is process-wide).
struct Warnings(std::sync::Mutex<Vec<String>>);

impl log::Log for Warnings {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.level() <= log::Level::Warn {
            self.0.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static WARNINGS: Warnings = Warnings(std::sync::Mutex::new(Vec::new()));

/// The child of `the_default_bound_evicts_with_one_warning`.
#[test]
fn child_default_bound() {
    if std::env::var_os("TRACEJIT_DEFAULT_BOUND_CHILD").is_none() {
        return;
    }
    log::set_logger(&WARNINGS).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let f = function(|(x, k): (Tensor, Tensor)| x * 2.0 + k).name("growing");
    let n = tracejit::DEFAULT_MAX_TRACES + 6;
    for len in 1..=n {
        f.call((ramp(len), Tensor::scalar(1.0f32))).unwrap();
    }
    let stats = f.cache_stats();
    assert_eq!((stats.traces, stats.cached, stats.evictions), (n, tracejit::DEFAULT_MAX_TRACES, 6));
    let warned: Vec<String> =
        WARNINGS.0.lock().unwrap().iter().filter(|w| w.contains("default max_traces")).cloned().collect();
    assert_eq!(warned.len(), 1, "one warning, the first time: {warned:?}");
    assert!(
        warned[0].contains("`growing`") && warned[0].contains("args.0") && !warned[0].contains("args.1"),
        "{}",
        warned[0]
    );
    // Today's behaviour, asked for.
    let g = function(|x: Tensor| x * 2.0).unbounded_cache();
    for len in 1..=n {
        g.call(ramp(len)).unwrap();
    }
    assert_eq!(g.concrete_functions().len(), n);
    eprintln!("child done");
}

/// A Function with no `max_traces` grew without bound (10,000 shapes,
/// 10,001 traces, +700 MB); it now keeps DEFAULT_MAX_TRACES and warns once,
/// naming the argument whose shape keeps changing.
#[test]
fn the_default_bound_evicts_with_one_warning() {
    if std::env::var_os("TRACEJIT_DEFAULT_BOUND_CHILD").is_some() {
        return;
    }
    let (status, stderr) = crate::common::run_child(
        "retrace_policy::child_default_bound",
        &[("TRACEJIT_DEFAULT_BOUND_CHILD", "1")],
        std::time::Duration::from_secs(300),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}

/// The composites' process-wide Functions (`nn::softmax`, ...) ignored the
/// callers' bounds and kept a trace per shape forever.
#[test]
fn composite_functions_keep_a_bounded_cache() {
    let softmax = tracejit::nn::declared().iter().find(|c| c.name() == "tracejit.nn.softmax").unwrap();
    for len in 1..=tracejit::nn::COMPOSITE_MAX_TRACES + 8 {
        let f = function(|x: Tensor| tracejit::nn::softmax(&x, -1));
        f.call(Tensor::zeros(&[2, 100 + len], DType::F32)).unwrap();
        assert!(softmax.function().concrete_functions().len() <= tracejit::nn::COMPOSITE_MAX_TRACES);
    }
}

/// A new trace takes the memory its function's other traces keep between
/// calls: their pools are emptied (their buffers back to the allocator),
/// and refill at their next call, with the same values.
#[test]
fn a_new_trace_releases_the_other_traces_buffers() {
    // Two products whose first result dies inside the call: its buffer
    // is kept by the pool for the next call.
    let f = function(|(x, w): (Tensor, Tensor)| x.matmul(&w).relu().matmul(&w)).name("two_products");
    let w = Tensor::randn(&[64, 64], 1);
    let (a, b) = (Tensor::randn(&[32, 64], 2), Tensor::randn(&[48, 64], 3));
    let first = f.call((a.clone(), w.clone())).unwrap().to_vec::<f32>().unwrap();
    f.call((a.clone(), w.clone())).unwrap();
    let cf_a = f.concrete_functions()[0].clone();
    assert_eq!(cf_a.executor_kind(), "jit");
    f.call((b.clone(), w.clone())).unwrap();
    assert_eq!(f.concrete_functions().len(), 2);
    assert_eq!(cf_a.release_buffers(), 0, "tracing the second shape released the first one's buffers");
    // The first shape's next call allocates anew and keeps them again.
    assert_eq!(f.call((a.clone(), w.clone())).unwrap().to_vec::<f32>().unwrap(), first);
    assert!(cf_a.release_buffers() > 0, "its pool kept buffers again");
    assert_eq!(f.call((a, w)).unwrap().to_vec::<f32>().unwrap(), first);
}
