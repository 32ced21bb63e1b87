//! `function` and `Function`: a closure plus a cache of ConcreteFunctions
//! keyed by input signature.
//!
//! A call flattens its arguments (no allocation for the common shapes), hashes
//! dtypes, shapes, static values and structure, and looks the hash up in a
//! sharded map; a hit compares the key by borrowing and runs the cached graph.
//! A miss takes the Function's trace lock (so concurrent callers of a new
//! signature trace it once while the others wait), looks for a cached
//! ConcreteFunction whose relaxed signature accepts the call, and traces only
//! when none does, logging the reason.

use std::hash::Hasher;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dashmap::DashMap;
use smallvec::SmallVec;
use tracejit_ir::passes::OptimizationOptions;
use tracejit_ir::{verify, FunctionAttrs, TensorType};
use tracejit_tensor::{DType, Storage};

use crate::concrete::ConcreteFunction;
use crate::context::MemoTable;
use crate::context::{push_context, TraceContext};
use crate::nest::{Flattener, Nest, SpecFlattener, SpecNest, StaticValue, TensorSpec, Unflattener};
use crate::{config, Error, Result, Tensor};
use tracejit_ir::panic_message;

mod builder;
mod eager_call;
mod optimize;
mod retrace;
mod retrace_warning;
mod shadow;
use retrace::TraceLimit;
pub use retrace::{CacheStats, RetracePolicy, DEFAULT_MAX_TRACES};

/// Wraps a closure into a traced [`Function`]: each call looks up a
/// ConcreteFunction for its arguments' signature (dtypes, shapes, static
/// values), tracing the closure into a graph and compiling it only when
/// none is cached.
///
/// ```
/// use tracejit_trace::{function, DType, Tensor};
///
/// let gelu = function(|x: Tensor| 0.5 * &x * (1.0 + (0.7978845608 * (&x + 0.044715 * &x * &x * &x)).tanh()));
/// let y = gelu.call(Tensor::zeros(&[4, 3], DType::F32))?;
/// assert_eq!(y.to_vec::<f32>()?, vec![0.0; 12]);
/// gelu.call(Tensor::ones(&[4, 3], DType::F32))?;   // same signature: no retrace
/// gelu.call(Tensor::ones(&[8, 3], DType::F32))?;   // a new shape: a second trace
/// assert_eq!(gelu.tracing_count(), 2);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// Without [`Function::name`], a closure is named after the function that
/// defines it and the line of this call (`main@src/main.rs:12`), so logs and
/// errors tell the closures of one function apart.
///
/// The closure must be `Send + Sync + 'static`: a `Function` is a shared
/// handle whose cache of traces any thread may call (and trace) through, so
/// what the closure captures must be owned (`move`) and thread-safe
/// (`Arc`, `Mutex`, atomics, `Variable`; not `Rc`, `RefCell` or a borrow of
/// a local). rustc reports a capture that is not (E0277 for `Rc`, E0373 for
/// a borrow) and shows the bound with that advice:
///
/// ```compile_fail,E0277
/// use tracejit_trace::{function, Tensor};
///
/// let calls = std::rc::Rc::new(std::cell::Cell::new(0));   // use Arc<AtomicUsize>
/// let f = function(move |x: Tensor| {
///     calls.set(calls.get() + 1);
///     x
/// });
/// ```
#[track_caller]
pub fn function<A: Nest, R: Nest, F>(f: F) -> Function<A, R>
where
    // Shown by rustc when a closure misses a bound (E0277, E0373):
    F: Fn(A) -> R + Send + Sync + 'static, // the trace cache is shared across threads: capture Arc/Mutex, not Rc/RefCell, and `move` owned values in
{
    let defined_at = std::panic::Location::caller();
    Function {
        closure: Arc::new(f),
        config: Arc::new(FunctionConfig {
            name: default_name::<F>(defined_at),
            defined_at,
            named: false,
            input_signature: None,
            reduce_retracing: false,
            warn_on_retrace: true,
            implements: None,
            jit: true,
            optimizations: OptimizationOptions::default(),
            max_traces: TraceLimit::Default,
            retrace_policy: None,
            validate: None,
            mixed_precision: None,
            target: None,
        }),
        state: Arc::new(FunctionState::default()),
        _marker: PhantomData,
    }
}

/// A closure's default name: its defining function's name and the line
/// that wrapped it; a function item (`function(step)`) keeps its own name.
fn default_name<F>(at: &std::panic::Location<'_>) -> String {
    let short = short_type_name::<F>();
    if std::any::type_name::<F>().ends_with("{{closure}}") {
        format!("{short}@{}:{}", at.file(), at.line())
    } else {
        short
    }
}

fn short_type_name<F>() -> String {
    // Closures are named `crate::path::{{closure}}`; keep something readable.
    let full = std::any::type_name::<F>();
    let trimmed = full.trim_end_matches("::{{closure}}");
    let last = trimmed.rsplit("::").next().unwrap_or(trimmed);
    if last.is_empty() || last.contains("{") {
        "function".to_string()
    } else {
        last.to_string()
    }
}

#[derive(Clone)]
struct FunctionConfig {
    name: String,
    /// The user's call of `function`: errors of a named function say where
    /// it is defined (an unnamed one has it in its name).
    defined_at: &'static std::panic::Location<'static>,
    /// Named by [`Function::name`].
    named: bool,
    input_signature: Option<Vec<TensorSpec>>,
    reduce_retracing: bool,
    /// Warn when traced often ([`Function::warn_on_retrace`]).
    warn_on_retrace: bool,
    implements: Option<std::result::Result<String, String>>,
    jit: bool,
    optimizations: OptimizationOptions,
    max_traces: TraceLimit,
    retrace_policy: Option<RetracePolicy>,
    /// Shadow-eager validation; `None`: `TRACEJIT_VALIDATE`.
    validate: Option<bool>,
    /// `Function::mixed_precision`; `None`: [`crate::config::mixed_precision`].
    mixed_precision: Option<Option<tracejit_tensor::DType>>,
    /// `Function::target`; `None`: the process's (`Target::host`).
    target: Option<tracejit_kernels::Target>,
}

/// The cache's keys are already signature hashes: hashing them again (with
/// the default SipHash) would only cost time on every call.
#[derive(Default)]
struct PreHashed(u64);

impl std::hash::Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; fold anything else in anyway.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[derive(Default)]
struct FunctionState {
    buckets: DashMap<u64, SmallVec<[Arc<CacheEntry>; 1]>, std::hash::BuildHasherDefault<PreHashed>>,
    concrete: RwLock<Vec<Arc<ConcreteFunction>>>,
    tracing_count: AtomicUsize,
    trace_lock: Mutex<()>,
    memo: Arc<MemoTable>,
    /// Ticks on every call of a bounded Function; a ConcreteFunction's
    /// `last_used` holds the tick of its latest call (LRU eviction).
    clock: AtomicU64,
    stats: Mutex<CacheStats>,
    /// The variables the body created while running eagerly.
    eager_variables: Arc<crate::eager::EagerVariables>,
    /// Set once the default cache bound has warned about evicting.
    warned_eviction: std::sync::atomic::AtomicBool,
}

/// What a call that missed the cache runs.
enum Resolved {
    Traced(Arc<ConcreteFunction>),
    /// The Eager retrace policy: the closure, eagerly.
    Eagerly,
}

/// An exact call signature that a ConcreteFunction was found for.
struct CacheEntry {
    tensors: Vec<(DType, SmallVec<[usize; 4]>)>,
    statics: Vec<Arc<dyn StaticValue>>,
    structure: SmallVec<[u32; 4]>,
    cf: Arc<ConcreteFunction>,
}

impl CacheEntry {
    fn matches(&self, flat: &Flattener<'_>) -> bool {
        self.tensors.len() == flat.tensors.len()
            && self.statics.len() == flat.statics.len()
            && self.structure[..] == flat.structure[..]
            && self.tensors.iter().zip(&flat.tensors).all(|((d, s), t)| *d == t.dtype() && s[..] == *t.shape())
            && self.statics.iter().zip(&flat.statics).all(|(a, b)| a.dyn_eq(*b))
    }
}

/// A small fast hasher (FxHash's mixing); signatures are tiny and hashed on
/// every call.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn signature_hash(flat: &Flattener<'_>) -> u64 {
    let mut h = FxHasher::default();
    for t in &flat.tensors {
        h.write_u8(t.dtype() as u8);
        let shape = t.shape();
        h.write_usize(shape.len());
        for &d in shape {
            h.write_usize(d);
        }
    }
    for s in &flat.statics {
        s.dyn_hash(&mut h);
    }
    for &s in &flat.structure {
        h.write_u32(s);
    }
    h.finish()
}

/// A traced function: call it like the closure, get results computed by a
/// compiled graph. Cheap to clone; clones share the cache.
pub struct Function<A, R> {
    closure: Arc<dyn Fn(A) -> R + Send + Sync>,
    config: Arc<FunctionConfig>,
    state: Arc<FunctionState>,
    _marker: PhantomData<fn(A) -> R>,
}

impl<A, R> Clone for Function<A, R> {
    fn clone(&self) -> Self {
        Function {
            closure: self.closure.clone(),
            config: self.config.clone(),
            state: self.state.clone(),
            _marker: PhantomData,
        }
    }
}

impl<A: Nest, R: Nest> Function<A, R> {
    /// The function's name.
    pub fn function_name(&self) -> &str {
        &self.config.name
    }

    /// How many times the closure has been traced.
    pub fn tracing_count(&self) -> usize {
        self.state.tracing_count.load(Ordering::SeqCst)
    }

    /// Every ConcreteFunction traced so far, in tracing order.
    pub fn concrete_functions(&self) -> Vec<Arc<ConcreteFunction>> {
        self.state.concrete.read().expect("concrete list poisoned").clone()
    }

    /// Calls the function: finds or traces the ConcreteFunction for the
    /// arguments' signature and runs it.
    #[track_caller]
    pub fn call(&self, args: A) -> Result<R> {
        // Tracing, the passes, compilation and the run all see the target.
        let _target = self.config.target.map(tracejit_kernels::Target::scope);
        if let Some(Err(msg)) = &self.config.implements {
            return Err(Error::ImplementsName { function: self.config.name.clone(), message: msg.clone() });
        }
        if config::functions_run_eagerly() {
            return self.call_eagerly(args);
        }
        let mut flat = Flattener::default();
        args.flatten(&mut flat);
        if crate::context::current_function().is_some() || flat.tensors.iter().any(|t| t.is_symbolic()) {
            return self.call_from_trace(&flat);
        }
        let hash = signature_hash(&flat);
        let cached = self
            .state
            .buckets
            .get(&hash)
            .and_then(|bucket| bucket.iter().find(|e| e.matches(&flat)).map(|e| e.cf.clone()));
        let cf = match cached {
            Some(cf) => cf,
            None => match self.find_or_trace(&flat, hash)? {
                Resolved::Traced(cf) => cf,
                Resolved::Eagerly => {
                    drop(flat);
                    return self.call_eagerly(args);
                }
            },
        };
        if self.config.trace_limit().is_some() {
            cf.last_used.store(self.state.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        }
        if !cf.implicit_inputs.is_empty() {
            let outs = cf.call_refs(&flat.tensors)?;
            return Ok(self.rebuild_output(&cf, outs));
        }
        let storages: SmallVec<[Storage; 4]> = flat.tensors.iter().map(|t| t.eager_storage().clone()).collect();
        let before = self.validating().then(|| crate::validate::snapshot(&cf.graph));
        let variables = cf.variables_before_call();
        let outs = cf.execute(&storages)?;
        if let Some(before) = before {
            self.check_call(&cf, &before, &storages, &outs)?;
        }
        let outs: Vec<Tensor> = outs.into_iter().map(Tensor::from_storage).collect();
        cf.record_on_tapes(&flat.tensors, &outs, variables)?;
        Ok(self.rebuild_output(&cf, outs))
    }

    /// The ConcreteFunction for a signature given as specs (`TensorSpec`s,
    /// or tensors standing for their own type, plus statics), tracing it if
    /// no cached one accepts it.
    pub fn get_concrete_function<S: SpecNest>(&self, specs: S) -> Result<Arc<ConcreteFunction>> {
        let _target = self.config.target.map(tracejit_kernels::Target::scope);
        if let Some(Err(msg)) = &self.config.implements {
            return Err(Error::ImplementsName { function: self.config.name.clone(), message: msg.clone() });
        }
        let mut flat = SpecFlattener::default();
        specs.flatten_spec(&mut flat);
        let cf = self.concrete_for_types(flat.tensors, flat.statics, flat.structure)?;
        // Compiled now, under the settings the caller traced it with (the
        // JIT's thresholds and options are process-wide): only a trace made
        // for a call inside another trace waits for its first direct use.
        cf.prepared();
        Ok(cf)
    }

    fn rebuild_output(&self, cf: &ConcreteFunction, outs: Vec<Tensor>) -> R {
        R::unflatten(&mut Unflattener::new(outs, cf.output_statics.clone(), cf.output_structure.clone()))
    }

    /// A call whose tensors are symbolic: we are inside another trace, so
    /// this call becomes a `Call` node.
    #[track_caller]
    fn call_from_trace(&self, flat: &Flattener<'_>) -> Result<R> {
        let types: Vec<TensorType> = flat.tensors.iter().map(|t| t.tensor_type()).collect();
        let statics: Vec<Arc<dyn StaticValue>> = flat.statics.iter().map(|s| s.clone_arc()).collect();
        let cf = self.concrete_for_types(types, statics, flat.structure.to_vec())?;
        let outs = cf.call_refs(&flat.tensors)?;
        Ok(self.rebuild_output(&cf, outs))
    }

    /// Finds a cached ConcreteFunction accepting these types (at least as
    /// general), or traces one with exactly these types.
    fn concrete_for_types(
        &self,
        types: Vec<TensorType>,
        statics: Vec<Arc<dyn StaticValue>>,
        structure: Vec<u32>,
    ) -> Result<Arc<ConcreteFunction>> {
        let _lock = self.lock_for_tracing()?;
        if let Some(cf) = self.find_accepting(&types, &statics, &structure) {
            return Ok(cf);
        }
        let specs = match &self.config.input_signature {
            Some(sig) => {
                self.check_signature(sig, &types)?;
                sig.iter().map(|s| s.ty.clone()).collect()
            }
            None => types,
        };
        let reason = self.retrace_reason(&specs, &statics, &structure);
        self.check_statics(&statics)?;
        // This path must produce a graph: the Eager policy evicts here.
        let specs = self.make_room(&specs, &statics, &structure, &reason, false)?.unwrap_or(specs);
        let cf = self.trace(specs, statics, structure, reason)?;
        self.after_trace(&cf);
        Ok(cf)
    }

    fn find_accepting(
        &self,
        types: &[TensorType],
        statics: &[Arc<dyn StaticValue>],
        structure: &[u32],
    ) -> Option<Arc<ConcreteFunction>> {
        let list = self.state.concrete.read().expect("concrete list poisoned");
        list.iter()
            .find(|cf| {
                cf.structure == structure
                    && cf.statics.len() == statics.len()
                    && cf.statics.iter().zip(statics).all(|(a, b)| a.dyn_eq(&**b))
                    && cf.accepts_types(types)
            })
            .cloned()
    }

    fn check_signature(&self, sig: &[TensorSpec], types: &[TensorType]) -> Result<()> {
        if sig.len() != types.len() {
            return Err(Error::ArgumentCount {
                function: self.config.name.clone(),
                expected: sig.len(),
                got: types.len(),
            });
        }
        for (i, (s, t)) in sig.iter().zip(types).enumerate() {
            if !s.ty.is_compatible_with(t) {
                return Err(Error::ArgumentMismatch {
                    function: self.config.name.clone(),
                    argument: i,
                    expected: s.ty.to_string(),
                    got: t.to_string(),
                });
            }
        }
        Ok(())
    }

    fn find_or_trace(&self, flat: &Flattener<'_>, hash: u64) -> Result<Resolved> {
        let _lock = self.lock_for_tracing()?;
        // Another thread may have traced this signature while we waited.
        if let Some(bucket) = self.state.buckets.get(&hash) {
            if let Some(e) = bucket.iter().find(|e| e.matches(flat)) {
                return Ok(Resolved::Traced(e.cf.clone()));
            }
        }
        let types: Vec<TensorType> = flat.tensors.iter().map(|t| t.tensor_type()).collect();
        let statics: Vec<Arc<dyn StaticValue>> = flat.statics.iter().map(|s| s.clone_arc()).collect();
        let structure: Vec<u32> = flat.structure.to_vec();
        let cf = match self.find_accepting(&types, &statics, &structure) {
            Some(cf) => cf,
            None => {
                let specs = match &self.config.input_signature {
                    Some(sig) => {
                        self.check_signature(sig, &types)?;
                        sig.iter().map(|s| s.ty.clone()).collect()
                    }
                    None if self.config.reduce_retracing => self.relaxed_types(&types, &statics, &structure),
                    None => types.clone(),
                };
                let reason = self.retrace_reason(&types, &statics, &structure);
                self.check_statics(&statics)?;
                let specs = match self.make_room(&specs, &statics, &structure, &reason, true)? {
                    Some(specs) => specs,
                    None => return Ok(Resolved::Eagerly),
                };
                let cf = self.trace(specs, statics.clone(), structure.clone(), reason)?;
                self.after_trace(&cf);
                cf
            }
        };
        if cf.implicit_inputs.is_empty() {
            let entry = Arc::new(CacheEntry {
                tensors: flat.tensors.iter().map(|t| (t.dtype(), SmallVec::from_slice(t.shape()))).collect(),
                statics,
                structure: SmallVec::from_vec(structure),
                cf: cf.clone(),
            });
            self.state.buckets.entry(hash).or_default().push(entry);
        }
        Ok(Resolved::Traced(cf))
    }

    /// With reduce_retracing: relax to unknown every dim that differs from a
    /// previous trace of the same statics, structure, dtypes and ranks.
    fn relaxed_types(
        &self,
        types: &[TensorType],
        statics: &[Arc<dyn StaticValue>],
        structure: &[u32],
    ) -> Vec<TensorType> {
        let list = self.state.concrete.read().expect("concrete list poisoned");
        let mut out = types.to_vec();
        for cf in list.iter().rev() {
            let same_kind = cf.structure == structure
                && cf.statics.len() == statics.len()
                && cf.statics.iter().zip(statics).all(|(a, b)| a.dyn_eq(&**b))
                && cf.signature.len() == types.len()
                && cf.signature.iter().zip(types).all(|(s, t)| s.ty.dtype == t.dtype && s.ty.rank() == t.rank());
            if same_kind {
                for (o, s) in out.iter_mut().zip(&cf.signature) {
                    for (d, sd) in o.dims.iter_mut().zip(&s.ty.dims) {
                        if *d != *sd {
                            *d = None;
                        }
                    }
                }
                break;
            }
        }
        out
    }

    fn retrace_reason(&self, types: &[TensorType], statics: &[Arc<dyn StaticValue>], structure: &[u32]) -> String {
        let list = self.state.concrete.read().expect("concrete list poisoned");
        let Some(prev) = list.last() else {
            return "first trace".to_string();
        };
        if prev.structure != structure {
            return "the arguments' structure changed (a Vec's length or an Option)".to_string();
        }
        let mut reasons = Vec::new();
        if prev.signature.len() != types.len() {
            reasons.push(format!("{} tensor arguments -> {}", prev.signature.len(), types.len()));
        } else {
            for (i, (s, t)) in prev.signature.iter().zip(types).enumerate() {
                if s.ty.dtype != t.dtype {
                    reasons.push(format!("argument {i}: dtype {} -> {}", s.ty.dtype, t.dtype));
                } else if s.ty.dims != t.dims {
                    reasons.push(format!(
                        "argument {i}: shape {} -> {}",
                        tracejit_ir::DimsDisplay(&s.ty.dims),
                        tracejit_ir::DimsDisplay(&t.dims)
                    ));
                }
            }
        }
        for (i, (a, b)) in prev.statics.iter().zip(statics).enumerate() {
            if !a.dyn_eq(&**b) {
                reasons.push(format!("static argument {i} ({}) changed value", b.type_name()));
            }
        }
        if reasons.is_empty() {
            "no cached trace accepts the call".to_string()
        } else {
            reasons.join("; ")
        }
    }

    /// Takes the trace lock. A Function that calls itself while being traced
    /// would wait for itself forever: that is an error instead.
    fn lock_for_tracing(&self) -> Result<crate::tracelock::TraceLockGuard<'_>> {
        if crate::context::is_tracing_memo(&self.state.memo) {
            return Err(Error::Recursion { function: self.config.name.clone() });
        }
        crate::tracelock::acquire(&self.state.trace_lock)
            .map_err(|_| Error::TraceDeadlock { function: self.config.name.clone() })
    }

    /// Traces the closure for `specs`; the trace lock is held.
    fn trace(
        &self,
        specs: Vec<TensorType>,
        statics: Vec<Arc<dyn StaticValue>>,
        structure: Vec<u32>,
        reason: String,
    ) -> Result<Arc<ConcreteFunction>> {
        let name: Arc<str> = Arc::from(self.config.name.as_str());
        let first_trace = self.state.tracing_count.load(Ordering::SeqCst) == 0;
        let guard = push_context(TraceContext::new(name.clone()).for_function(first_trace, self.state.memo.clone()));
        let placeholders: Vec<Tensor> = guard.with(|ctx| {
            specs
                .iter()
                .map(|ty| {
                    let v = ctx.graph.add_param(ty.clone());
                    ctx.symbolic(v)
                })
                .collect()
        });
        let validating = self.validating();
        let result = tracejit_ir::catch_quietly(|| {
            let _validating = validating.then(crate::validate::Active::enter);
            let args = A::unflatten(&mut Unflattener::new(placeholders, statics.clone(), structure.clone()));
            let input_paths = crate::nest::nest_paths(&args, "args");
            let out = (self.closure)(args);
            let mut flat = Flattener::default();
            out.flatten(&mut flat);
            let outputs = crate::context::values_in_current(&flat.tensors).expect("trace context is live");
            let out_statics: Vec<Arc<dyn StaticValue>> = flat.statics.iter().map(|s| s.clone_arc()).collect();
            let output_paths = crate::nest::nest_paths(&out, "output");
            (outputs, out_statics, flat.structure.to_vec(), (input_paths, output_paths))
        });
        let (outputs, output_statics, output_structure, (input_paths, output_paths)) = match result {
            Ok(r) => r,
            Err(p) => {
                drop(guard);
                return Err(Error::TracePanic {
                    function: self.config.name.clone(),
                    message: self.config.with_definition(panic_message(&*p)),
                });
            }
        };
        let mut ctx = guard.finish();
        ctx.graph.outputs = outputs;
        if cfg!(debug_assertions) {
            verify(&ctx.graph)?;
        }
        // A malformed `implements` name failed the call before tracing.
        let attrs = FunctionAttrs { implements: self.config.implements.clone().and_then(Result::ok) };
        let (optimized, report, preparer) = self.optimize_and_preparer(&ctx.graph)?;
        let graph = Arc::new(ctx.graph);
        let n_params = specs.len();
        let cf = Arc::new(ConcreteFunction {
            name: self.config.name.clone(),
            optimized: Arc::new(optimized),
            report,
            prepared: std::sync::OnceLock::new(),
            preparer: Some(preparer),
            graph,
            signature: specs.into_iter().map(|ty| TensorSpec { ty }).collect(),
            statics,
            structure,
            captures: ctx.captures,
            implicit_inputs: ctx.outer_captures.into_iter().map(|(t, _)| t).collect(),
            output_statics,
            output_structure,
            input_paths,
            output_paths,
            attrs,
            target: self.config.target,
            trace_reason: reason.clone(),
            differentiable: std::sync::OnceLock::new(),
            last_used: AtomicU64::new(0),
        });
        debug_assert_eq!(cf.graph.params.len(), n_params + cf.implicit_inputs.len());
        let count = self.state.tracing_count.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!("tracejit: tracing `{}` (trace #{count}): {reason}", self.config.name);
        // A composite's shared Function (`implements`) is traced once per
        // shape it meets in any caller, bounded by its own cache; its users
        // have no input_signature to give it, so the warning would only
        // alarm (train_charlm met layer_norm in 5 shapes: train, eval,
        // sampling).
        if self.config.implements.is_none() && self.config.warn_on_retrace {
            retrace_warning::warn_if_excessive(&self.config.name, count);
        }
        let mut concrete = self.state.concrete.write().expect("concrete list poisoned");
        // The new trace takes the heap the others' pools keep, not fresh
        // pages (see `ConcreteFunction::release_buffers`): War and Peace's
        // paragraphs embedded in 33 batch shapes held 2.1 GB and spent a
        // sixth of the CPU zeroing fresh pages.
        let released: usize = concrete.iter().map(|c| c.release_buffers()).sum();
        if released > 0 {
            log::debug!("tracejit: `{}` released {released} bytes of its other traces' buffers", self.config.name);
        }
        concrete.push(cf.clone());
        Ok(cf)
    }
}

impl FunctionConfig {
    /// A panic message of the closure, with where a named function is
    /// defined (an unnamed one carries it in its name).
    fn with_definition(&self, message: String) -> String {
        if self.named {
            format!("{message} (`{}` is defined at {}:{})", self.name, self.defined_at.file(), self.defined_at.line())
        } else {
            message
        }
    }
}
