//! Bounded signature caches: how many ConcreteFunctions a `Function` keeps
//! ([`crate::Function::max_traces`]), what happens when a call needs one
//! more ([`RetracePolicy`]), and the record of those decisions
//! ([`CacheStats`]).
//!
//! An unbounded cache is what tf.function and jax.jit have: a Function
//! called with 2,000 shapes keeps 2,000 traces (and their compiled code)
//! forever. A tracejit Function keeps [`DEFAULT_MAX_TRACES`] unless told
//! otherwise (`max_traces(n)`, or `unbounded_cache()` for the old
//! behaviour), and every decision the policy takes is counted and logged
//! with its reason, so a cache that churns says so. A new trace evicts
//! only once it has succeeded: a call whose trace fails leaves the cache
//! as it was.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracejit_ir::TensorType;

use super::{Function, FunctionConfig};

use crate::concrete::ConcreteFunction;
use crate::nest::{Nest, StaticValue};
use crate::{Error, Result};

/// What a bounded `Function` does when a call needs a new trace and the
/// cache already holds `max_traces` ConcreteFunctions.
///
/// ```
/// use tracejit_trace::{function, DType, RetracePolicy, Tensor};
///
/// let f = function(|x: Tensor| x.exp()).max_traces(2).retrace_policy(RetracePolicy::Error);
/// f.call(Tensor::ones(&[1], DType::F32))?;
/// f.call(Tensor::ones(&[2], DType::F32))?;
/// let e = f.call(Tensor::ones(&[3], DType::F32)).unwrap_err();   // a third shape: refused
/// assert!(e.to_string().contains("max_traces"));
///
/// let g = function(|x: Tensor| x.exp()).max_traces(1).retrace_policy(RetracePolicy::Evict);
/// g.call(Tensor::ones(&[1], DType::F32))?;
/// g.call(Tensor::ones(&[2], DType::F32))?;                        // the first trace is evicted
/// assert_eq!((g.concrete_functions().len(), g.tracing_count()), (1, 2));
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RetracePolicy {
    /// Drop the least recently used ConcreteFunction, then trace (the
    /// default once a bound is set).
    #[default]
    Evict,
    /// Refuse: the call is an [`Error::RetraceLimit`](crate::Error::RetraceLimit)
    /// naming the bound and why a new trace was needed.
    Error,
    /// Trace once more with every dimension that differs between the call
    /// and the cached traces of the same dtypes and ranks relaxed to
    /// unknown, and drop the traces the general one accepts; where nothing
    /// can be relaxed (a new static value or dtype), evict as `Evict` does.
    Generalize,
    /// Run the closure eagerly for this call (nothing is traced or
    /// evicted); calls whose signature is cached still run compiled. A call
    /// from inside another trace, or `get_concrete_function`, evicts
    /// instead, since it must produce a graph.
    Eager,
}

impl RetracePolicy {
    /// The policy's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            RetracePolicy::Evict => "evict",
            RetracePolicy::Error => "error",
            RetracePolicy::Generalize => "generalize",
            RetracePolicy::Eager => "eager",
        }
    }
}

/// What a bounded cache did, per `Function` (see
/// [`crate::Function::cache_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Traces so far (as `tracing_count`).
    pub traces: usize,
    /// ConcreteFunctions cached now.
    pub cached: usize,
    /// ConcreteFunctions dropped to make room (LRU evictions, and traces
    /// replaced by a generalized one).
    pub evictions: usize,
    /// Calls refused by [`RetracePolicy::Error`].
    pub refused: usize,
    /// Generalized traces made by [`RetracePolicy::Generalize`].
    pub generalized: usize,
    /// Calls run eagerly by [`RetracePolicy::Eager`].
    pub eager_calls: usize,
    /// Traces the JIT could not prepare, run by the interpreter instead
    /// ([`crate::ConcreteFunction::jit_error`] says why).
    pub jit_failures: usize,
    /// The latest decisions (at most [`CacheStats::MAX_EVENTS`]), oldest
    /// first, each with its reason: `evicted the trace for (f32[2]) (least
    /// recently used) to trace argument 0: shape [2] -> [3]`.
    pub events: VecDeque<String>,
}

impl CacheStats {
    /// How many decisions `events` keeps.
    pub const MAX_EVENTS: usize = 64;

    /// Records a decision (also logged by the caller).
    pub(crate) fn note(&mut self, event: String) {
        if self.events.len() == Self::MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}

/// How many traces a `Function` keeps when nothing says otherwise
/// ([`crate::Function::max_traces`], [`crate::Function::unbounded_cache`]):
/// past it the least recently used trace is evicted, with a warning the
/// first time that names the arguments whose shapes keep changing. A
/// Function called with 10,000 shapes used to keep 10,001 traces (700 MB).
pub const DEFAULT_MAX_TRACES: usize = 64;

/// The cache bound a `Function` was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TraceLimit {
    /// Nothing said: [`DEFAULT_MAX_TRACES`], evicting with a warning.
    Default,
    /// `max_traces(n)`.
    At(usize),
    /// `unbounded_cache()`: every trace is kept.
    Unbounded,
}

impl FunctionConfig {
    /// The cache bound: `max_traces`, one trace when only a policy was
    /// given, [`DEFAULT_MAX_TRACES`] when nothing was; `None`: unbounded.
    pub(super) fn trace_limit(&self) -> Option<usize> {
        match self.max_traces {
            TraceLimit::At(n) => Some(n),
            TraceLimit::Unbounded => None,
            TraceLimit::Default if self.retrace_policy.is_some() => Some(1),
            TraceLimit::Default => Some(DEFAULT_MAX_TRACES),
        }
    }
}

impl<A: Nest, R: Nest> Function<A, R> {
    /// Keeps at most `n` ConcreteFunctions (at least one); what a call
    /// needing one more does is the [`RetracePolicy`] (LRU eviction unless
    /// [`Function::retrace_policy`] says otherwise). Every decision is
    /// counted in [`Function::cache_stats`] and logged with its reason.
    ///
    /// ```
    /// use tracejit_trace::{function, DType, RetracePolicy, Tensor};
    ///
    /// let f = function(|x: Tensor| x * 2.0).max_traces(2).retrace_policy(RetracePolicy::Evict);
    /// for n in 1..=5 {
    ///     f.call(Tensor::zeros(&[n], DType::F32))?;
    /// }
    /// assert_eq!(f.concrete_functions().len(), 2);
    /// assert_eq!(f.cache_stats().evictions, 3);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    ///
    /// Without `max_traces` a Function keeps [`DEFAULT_MAX_TRACES`] (64)
    /// traces and warns the first time it evicts one;
    /// [`Function::unbounded_cache`] keeps every trace.
    pub fn max_traces(self, n: usize) -> Self {
        self.with_config(|c| c.max_traces = TraceLimit::At(n.max(1)))
    }

    /// Keeps every trace, however many signatures the Function is called
    /// with (what tf.function and jax.jit do, and what tracejit did before
    /// the default bound of [`DEFAULT_MAX_TRACES`]): memory grows with
    /// every new signature, for the life of the Function.
    ///
    /// ```
    /// use tracejit_trace::{function, DType, Tensor};
    ///
    /// let f = function(|x: Tensor| x * 2.0).unbounded_cache();
    /// for n in 1..=70 {
    ///     f.call(Tensor::zeros(&[n], DType::F32))?;
    /// }
    /// assert_eq!(f.concrete_functions().len(), 70);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn unbounded_cache(self) -> Self {
        self.with_config(|c| c.max_traces = TraceLimit::Unbounded)
    }

    /// What a call does when it needs a new trace and the cache is full
    /// (see [`RetracePolicy`]). Without [`Function::max_traces`], a policy
    /// bounds the cache at one trace: `retrace_policy(RetracePolicy::Error)`
    /// alone makes any retrace an error.
    pub fn retrace_policy(self, policy: RetracePolicy) -> Self {
        self.with_config(|c| c.retrace_policy = Some(policy))
    }

    /// What the bounded cache did so far: evictions, refusals,
    /// generalizations, eager calls, and the latest decisions with their
    /// reasons.
    pub fn cache_stats(&self) -> CacheStats {
        let mut stats = self.state.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        stats.traces = self.tracing_count();
        stats.cached = self.state.concrete.read().expect("concrete list poisoned").len();
        stats
    }
}

impl<A: Nest, R: Nest> Function<A, R> {
    /// Refuses a static value that is not equal to itself: every call with
    /// it would miss the cache and trace again, forever.
    pub(super) fn check_statics(&self, statics: &[Arc<dyn StaticValue>]) -> Result<()> {
        let Some(i) = non_reflexive_static(statics) else { return Ok(()) };
        let e = Error::NonReflexiveStatic {
            function: self.config.name.clone(),
            argument: i,
            type_name: statics[i].type_name().to_string(),
        };
        log::warn!("tracejit: {e}");
        Err(e)
    }

    /// Applies the retrace policy before a trace for `specs` (the trace lock
    /// is held). Returns the types to trace (relaxed by `Generalize`), or
    /// `None` when this call runs eagerly (`Eager`, if `may_run_eagerly`).
    pub(super) fn make_room(
        &self,
        specs: &[TensorType],
        statics: &[Arc<dyn StaticValue>],
        structure: &[u32],
        reason: &str,
        may_run_eagerly: bool,
    ) -> Result<Option<Vec<TensorType>>> {
        let Some(limit) = self.config.trace_limit() else { return Ok(Some(specs.to_vec())) };
        let cached = self.concrete_functions();
        if cached.len() < limit {
            return Ok(Some(specs.to_vec()));
        }
        let name = &self.config.name;
        let policy = self.config.retrace_policy.unwrap_or_default();
        let mut stats = self.state.stats.lock().unwrap_or_else(|e| e.into_inner());
        match policy {
            RetracePolicy::Error => {
                stats.refused += 1;
                stats.note(format!("refused a trace ({reason}): the cache holds its limit of {limit}"));
                log::warn!("tracejit: `{name}`: refused a new trace ({reason}): max_traces is {limit}");
                return Err(Error::RetraceLimit {
                    function: name.clone(),
                    max_traces: limit,
                    reason: reason.to_string(),
                });
            }
            RetracePolicy::Eager if may_run_eagerly => {
                stats.eager_calls += 1;
                stats.note(format!("ran eagerly instead of tracing ({reason}): the cache holds its limit of {limit}"));
                log::info!("tracejit: `{name}`: running eagerly instead of tracing ({reason}): max_traces is {limit}");
                return Ok(None);
            }
            RetracePolicy::Generalize if self.config.input_signature.is_none() => {
                if let Some(general) = generalized_types(&cached, specs, statics, structure) {
                    if general != specs {
                        let shown: Vec<String> = general.iter().map(ToString::to_string).collect();
                        stats.generalized += 1;
                        stats.note(format!("generalized to ({}) ({reason})", shown.join(", ")));
                        log::info!(
                            "tracejit: `{name}`: the cache holds its limit of {limit}; tracing once for ({}) \
                             ({reason})",
                            shown.join(", ")
                        );
                        return Ok(Some(general));
                    }
                }
            }
            RetracePolicy::Evict | RetracePolicy::Generalize | RetracePolicy::Eager => {}
        }
        // The eviction waits for the new trace to succeed (`after_trace`):
        // a trace that fails must not cost the working ones (with a body
        // that creates variables on its first trace, losing the only trace
        // made every later call fail).
        Ok(Some(specs.to_vec()))
    }

    /// After a trace of a bounded Function: stamps `cf` as just used, drops
    /// the cached traces it accepts (a generalized trace replaces them; not
    /// under the default bound), and evicts down to the bound.
    pub(super) fn after_trace(&self, cf: &Arc<ConcreteFunction>) {
        let Some(limit) = self.config.trace_limit() else { return };
        cf.last_used.store(self.state.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let types: Vec<TensorType> = cf.signature.iter().map(|s| s.ty.clone()).collect();
        // Under the default bound the traces a general one accepts stay, as
        // without a bound: their exact shapes may run faster.
        let chosen = self.config.max_traces != TraceLimit::Default || self.config.retrace_policy.is_some();
        let subsumed: Vec<Arc<ConcreteFunction>> = self
            .concrete_functions()
            .into_iter()
            .filter(|old| {
                chosen
                    && !Arc::ptr_eq(old, cf)
                    && old.structure == cf.structure
                    && old.statics.len() == cf.statics.len()
                    && old.statics.iter().zip(&cf.statics).all(|(a, b)| a.dyn_eq(&**b))
                    && old.signature.len() == types.len()
                    && old.signature.iter().zip(&types).all(|(o, t)| t.is_compatible_with(&o.ty))
            })
            .collect();
        for old in &subsumed {
            self.remove_cached(old, &format!("replaced by the trace for {}", signature_text(cf)));
        }
        let len = self.concrete_functions().len();
        if len > limit {
            self.warn_default_bound(limit);
            self.evict_lru(len - limit, &format!("to trace {}", cf.trace_reason));
        }
    }

    /// The first eviction under the default bound warns (once per
    /// Function), naming the arguments whose shapes differ among the
    /// cached traces, as tf.function warns about repeated retracing.
    fn warn_default_bound(&self, limit: usize) {
        if self.config.max_traces != TraceLimit::Default || self.config.retrace_policy.is_some() {
            return;
        }
        if self.state.warned_eviction.swap(true, Ordering::Relaxed) {
            return;
        }
        let cached = self.concrete_functions();
        let changing = changing_arguments(&cached);
        let which = if changing.is_empty() {
            "its static arguments or argument structure keep changing".to_string()
        } else {
            format!("the shape of {} keeps changing", changing.join(", "))
        };
        log::warn!(
            "tracejit: `{}` has more than {limit} traces (the default max_traces), so it evicts the least recently \
             used one from now on: {which}. Pass an input_signature with -1 dims or reduce_retracing(true) to trace \
             once for many shapes, or choose the bound with max_traces(n) (unbounded_cache() keeps every trace)",
            self.config.name
        );
    }

    /// Evicts the `n` least recently used traces.
    fn evict_lru(&self, n: usize, why: &str) {
        for _ in 0..n {
            let victim = self.concrete_functions().into_iter().min_by_key(|cf| cf.last_used.load(Ordering::Relaxed));
            match victim {
                Some(v) => self.remove_cached(&v, &format!("least recently used, {why}")),
                None => return,
            }
        }
    }

    /// Drops `cf` from the cache (its exact-signature entries too).
    fn remove_cached(&self, cf: &Arc<ConcreteFunction>, why: &str) {
        self.state.concrete.write().expect("concrete list poisoned").retain(|c| !Arc::ptr_eq(c, cf));
        self.state.buckets.retain(|_, bucket| {
            bucket.retain(|e| !Arc::ptr_eq(&e.cf, cf));
            !bucket.is_empty()
        });
        let event = format!("evicted the trace for {} ({why})", signature_text(cf));
        log::info!("tracejit: `{}`: {event}", self.config.name);
        let mut stats = self.state.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.evictions += 1;
        stats.note(event);
    }
}

/// The nest paths (`args.0`, `x`) of the tensor arguments whose dims differ
/// among `cached` traces of the same dtypes and ranks.
fn changing_arguments(cached: &[Arc<ConcreteFunction>]) -> Vec<String> {
    let mut out = Vec::new();
    let Some(first) = cached.first() else { return out };
    for (i, spec) in first.signature.iter().enumerate() {
        let differs = cached
            .iter()
            .any(|cf| cf.signature.get(i).is_some_and(|s| s.ty.dtype == spec.ty.dtype && s.ty.dims != spec.ty.dims));
        if differs {
            let path = first.input_paths.get(i).cloned().unwrap_or_else(|| format!("argument {i}"));
            out.push(format!("`{path}` (argument {i})"));
        }
    }
    out
}

/// `(f32[2], i64[?])`: a trace's signature, for messages.
pub(crate) fn signature_text(cf: &ConcreteFunction) -> String {
    let types: Vec<String> = cf.signature.iter().map(|s| s.ty.to_string()).collect();
    format!("({})", types.join(", "))
}

/// The index of the first static value that is not equal to itself (a NaN
/// inside a float key): such a key can never hit the cache.
pub(crate) fn non_reflexive_static(statics: &[Arc<dyn StaticValue>]) -> Option<usize> {
    statics.iter().position(|s| !s.dyn_eq(&**s))
}

/// The call's types with every dim relaxed to unknown that differs from
/// the same dim of some cached trace of the same kind (statics, structure,
/// dtypes and ranks); `None` when no cached trace is of that kind.
pub(crate) fn generalized_types(
    cached: &[Arc<ConcreteFunction>],
    types: &[TensorType],
    statics: &[Arc<dyn StaticValue>],
    structure: &[u32],
) -> Option<Vec<TensorType>> {
    let mut out = types.to_vec();
    let mut any = false;
    for cf in cached {
        let same_kind = cf.structure == structure
            && cf.statics.len() == statics.len()
            && cf.statics.iter().zip(statics).all(|(a, b)| a.dyn_eq(&**b))
            && cf.signature.len() == types.len()
            && cf.signature.iter().zip(types).all(|(s, t)| s.ty.dtype == t.dtype && s.ty.rank() == t.rank());
        if !same_kind {
            continue;
        }
        any = true;
        for (o, s) in out.iter_mut().zip(&cf.signature) {
            for (d, sd) in o.dims.iter_mut().zip(&s.ty.dims) {
                if *d != *sd {
                    *d = None;
                }
            }
        }
    }
    any.then_some(out)
}
