//! `ConcreteFunction`: one trace of a `Function` for one input signature —
//! the graph, the optimized graph, the signature, the captured tensors — and
//! the way to run it on eager tensors or to call it from another trace.

use std::sync::Arc;

use tracejit_ir::passes::PipelineReport;
use tracejit_ir::{interpret, FunctionAttrs, Graph, LibraryFunction, Op, TensorType};
use tracejit_tensor::Storage;

use crate::context::{self, with_current};
use crate::nest::{StaticValue, TensorSpec};
use crate::{Error, Result, Tensor};

/// What prepares a trace's executable from its optimized graph: the JIT's
/// executable, or none and why.
pub(crate) type Preparer = Box<dyn Fn(&Graph) -> (Option<tracejit_jit::Executable>, Option<String>) + Send + Sync>;

/// One traced graph of a `Function`, for one input signature.
pub struct ConcreteFunction {
    pub(crate) name: String,
    pub(crate) graph: Arc<Graph>,
    pub(crate) optimized: Arc<Graph>,
    pub(crate) signature: Vec<TensorSpec>,
    pub(crate) statics: Vec<Arc<dyn StaticValue>>,
    pub(crate) structure: Vec<u32>,
    pub(crate) captures: Vec<Tensor>,
    /// Symbolic tensors of an enclosing trace this graph reads; passed as
    /// extra trailing inputs by `Call` nodes.
    pub(crate) implicit_inputs: Vec<Tensor>,
    pub(crate) output_statics: Vec<Arc<dyn StaticValue>>,
    pub(crate) output_structure: Vec<u32>,
    /// The nest path of each tensor argument ([`crate::nest_paths`]).
    pub(crate) input_paths: Vec<String>,
    /// The nest path of each tensor result.
    pub(crate) output_paths: Vec<String>,
    pub(crate) attrs: FunctionAttrs,
    /// The target its Function was given (`Function::target`): entered on
    /// every call, so the interpreter and composite kernels run its ISA
    /// too; `None`: the process's.
    pub(crate) target: Option<tracejit_kernels::Target>,
    pub(crate) trace_reason: String,
    /// What the optimization pipeline did to `graph`.
    pub(crate) report: PipelineReport,
    /// The compiled schedule of `optimized` (when the JIT is on and could
    /// prepare it; otherwise the interpreter runs `optimized`) and why the
    /// JIT could not prepare it, when it was asked to and failed: made by
    /// `preparer` when first needed ([`ConcreteFunction::prepared`]).
    pub(crate) prepared: std::sync::OnceLock<(Option<tracejit_jit::Executable>, Option<String>)>,
    pub(crate) preparer: Option<Preparer>,
    /// `graph` with every call inlined (composites by their primitive
    /// bodies): what a gradient tape differentiates a call of this
    /// function through. Built on first use.
    pub(crate) differentiable: std::sync::OnceLock<Arc<Graph>>,
    /// The owning Function's clock at this trace's latest call, when its
    /// cache is bounded (least recently used eviction).
    pub(crate) last_used: std::sync::atomic::AtomicU64,
}

impl ConcreteFunction {
    /// The executable and the JIT's error, prepared on first need: a trace
    /// only ever inlined into its callers' traces is never compiled.
    pub(crate) fn prepared(&self) -> &(Option<tracejit_jit::Executable>, Option<String>) {
        self.prepared.get_or_init(|| self.preparer.as_ref().map_or((None, None), |p| p(&self.optimized)))
    }

    /// The compiled schedule, when the JIT runs this function.
    pub(crate) fn executable(&self) -> Option<&tracejit_jit::Executable> {
        self.prepared().0.as_ref()
    }
}

impl std::fmt::Debug for ConcreteFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcreteFunction")
            .field("name", &self.name)
            .field("signature", &self.signature)
            .field("captures", &self.captures.len())
            .finish()
    }
}

impl ConcreteFunction {
    /// The function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The graph as traced.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph after the optimization pipeline (what runs).
    pub fn optimized_graph(&self) -> &Graph {
        &self.optimized
    }

    /// The accepted type of each tensor argument, depth first.
    pub fn signature(&self) -> &[TensorSpec] {
        &self.signature
    }

    /// The path of each tensor argument in the argument nest, depth first
    /// (as [`signature`](Self::signature)): `args` for a lone tensor,
    /// `args.0`, `args.1` for a tuple's elements, `args[2]` for a `Vec`'s,
    /// and the field names of a `#[derive(Nest)]` struct (`x`, `state.h`).
    /// See [`crate::Nest::leaf_paths`].
    pub fn input_paths(&self) -> &[String] {
        &self.input_paths
    }

    /// The path of each tensor result in the result nest, spelled as
    /// [`input_paths`](Self::input_paths) with the root `output`
    /// (`output`, `output.0`, `output.h`...).
    pub fn output_paths(&self) -> &[String] {
        &self.output_paths
    }

    /// Eager tensors (rank > 0) the closure used without receiving them;
    /// captured by value when traced.
    pub fn captures(&self) -> &[Tensor] {
        &self.captures
    }

    /// Why this trace happened (`"first trace"`, `"argument 0: shape [2] -> [3]"`).
    pub fn trace_reason(&self) -> &str {
        &self.trace_reason
    }

    /// Which executor runs this function: `"jit"` (Cranelift kernels) or
    /// `"interpreter"` (the reference kernels, node by node). The benchmark
    /// harness uses it to never report interpreter figures as JIT figures.
    pub fn executor_kind(&self) -> &'static str {
        if self.executable().is_some() {
            "jit"
        } else {
            "interpreter"
        }
    }

    /// Why the JIT could not prepare this function, when it was on and
    /// failed: the interpreter runs it instead (also logged as a warning and
    /// counted in [`crate::CacheStats::jit_failures`]). `None` when the JIT
    /// runs it or was turned off (`jit(false)`).
    pub fn jit_error(&self) -> Option<&str> {
        self.prepared().1.as_deref()
    }

    /// The target its Function was given (`Function::target`), entered on
    /// every call; `None`: the process's CPU and settings.
    pub fn target(&self) -> Option<tracejit_kernels::Target> {
        self.target
    }

    /// The compiled kernels of this function as compile cache entries
    /// (`tracejit_jit::compile_cache`), each once; empty when the
    /// interpreter runs it. What an artifact embeds.
    pub fn kernel_entries(&self) -> Vec<Arc<[u8]>> {
        self.executable().map(|e| e.kernel_entries()).unwrap_or_default()
    }

    /// How many symbolic tensors of an enclosing trace this function reads
    /// (passed as extra inputs by calls from that trace); such a function
    /// cannot stand alone.
    pub fn implicit_input_count(&self) -> usize {
        self.implicit_inputs.len()
    }

    /// The static (non-tensor) arguments this trace was made for, as their
    /// Rust type names: they are part of the graph, not of its inputs.
    pub fn static_type_names(&self) -> Vec<&'static str> {
        self.statics.iter().map(|s| s.type_name()).collect()
    }

    /// Ops the JIT executor runs with the reference kernels instead of
    /// compiled code (empty when every step is compiled or a GEMM).
    pub fn fallbacks(&self) -> Vec<String> {
        self.executable().map(|e| e.fallbacks()).unwrap_or_default()
    }

    /// What one call runs when the JIT executes this function: fused
    /// regions (one compiled kernel each), GEMMs, native kernels, ops left
    /// to the reference kernels, variable reads and writes, counted over
    /// called functions too. `None` when the interpreter runs it.
    ///
    /// ```
    /// use tracejit_trace::{function, Tensor};
    ///
    /// let f = function(|(x, w): (Tensor, Tensor)| (x.matmul(&w) + 1.0).relu().tanh());
    /// f.call((Tensor::randn(&[4, 3], 0), Tensor::randn(&[3, 2], 1)))?;
    /// let stats = f.concrete_functions()[0].schedule_stats().expect("the JIT runs it");
    /// assert_eq!((stats.gemms, stats.regions), (1, 1), "{stats}");
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn schedule_stats(&self) -> Option<tracejit_jit::ScheduleStats> {
        self.executable().map(|e| e.stats())
    }

    /// Gives back the buffers the compiled function keeps between calls
    /// for reuse (`tracejit_jit::Executable::release_buffers`), returning
    /// their bytes; 0 when it was never compiled or the interpreter runs
    /// it. A [`Function`](crate::Function) does this to its other traces
    /// when it traces a new one: a function called with one shape after
    /// another (sentence batches sorted by length) would otherwise hold
    /// every shape's buffers and fault fresh pages for each new one.
    pub fn release_buffers(&self) -> usize {
        self.prepared.get().and_then(|p| p.0.as_ref()).map_or(0, |e| e.release_buffers())
    }

    /// Runs this function `runs` times on eager `inputs` (flat, in the
    /// signature's order, as [`call_flat`](Self::call_flat)) and returns
    /// how long each step of the compiled schedule took: which GEMM or
    /// fused region the time goes to, named by its ops and output type.
    /// `Ok(None)` when the interpreter runs this function. Variables the
    /// function assigns are assigned `runs` times.
    ///
    /// ```
    /// use tracejit_trace::{function, Tensor};
    ///
    /// let f = function(|(x, w): (Tensor, Tensor)| (x.matmul(&w) + 1.0).relu());
    /// let (x, w) = (Tensor::randn(&[64, 32], 0), Tensor::randn(&[32, 16], 1));
    /// f.call((x.clone(), w.clone()))?;
    /// let profile = f.concrete_functions()[0].profile(&[x, w], 20)?.expect("the JIT runs it");
    /// assert!(profile.steps.iter().any(|s| s.kind == "gemm"));
    /// println!("{profile}"); // slowest steps first
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn profile(&self, inputs: &[Tensor], runs: usize) -> Result<Option<tracejit_jit::Profile>> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        self.check_inputs(&refs)?;
        let Some(exe) = self.executable() else { return Ok(None) };
        if let Some(i) = inputs.iter().position(|t| t.is_symbolic()) {
            return Err(Error::SymbolicArgument { function: self.name.clone(), what: "profile", argument: i });
        }
        let storages: Vec<Storage> = inputs.iter().map(|t| t.eager_storage().clone()).collect();
        self.guarded(|| exe.profile(&storages, runs)).map(Some)
    }

    /// What the optimization pipeline did: per pass, the node counts before
    /// and after, whether it changed the graph, and its time. `Display`
    /// prints it as a table.
    pub fn stats(&self) -> &PipelineReport {
        &self.report
    }

    /// Function attributes (`implements`).
    pub fn attributes(&self) -> &FunctionAttrs {
        &self.attrs
    }

    /// True when this function accepts tensors of these types.
    pub(crate) fn accepts_types(&self, types: &[TensorType]) -> bool {
        self.signature.len() == types.len() && self.signature.iter().zip(types).all(|(s, t)| s.ty.is_compatible_with(t))
    }

    /// Checks a call's tensors against the signature.
    pub(crate) fn check_inputs(&self, inputs: &[&Tensor]) -> Result<()> {
        if inputs.len() != self.signature.len() {
            return Err(Error::ArgumentCount {
                function: self.name.clone(),
                expected: self.signature.len(),
                got: inputs.len(),
            });
        }
        for (i, (spec, t)) in self.signature.iter().zip(inputs).enumerate() {
            let ty = t.tensor_type();
            if !spec.ty.is_compatible_with(&ty) {
                return Err(Error::ArgumentMismatch {
                    function: self.name.clone(),
                    argument: i,
                    expected: spec.ty.to_string(),
                    got: ty.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Calls with a flat list of tensors (the signature's order). Eager
    /// inputs run the graph now; symbolic inputs (a call from inside another
    /// trace) record a `Call` node.
    #[track_caller]
    pub fn call_flat(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        self.call_refs(&refs)
    }

    #[track_caller]
    pub(crate) fn call_refs(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        // Inside a trace every call is part of the graph, even with eager
        // (or no) tensor arguments: its effects must happen on every run of
        // the caller, not once while tracing.
        if context::current_function().is_some()
            || inputs.iter().any(|t| t.is_symbolic())
            || !self.implicit_inputs.is_empty()
        {
            return self.record_call(inputs);
        }
        let storages: Vec<Storage> = inputs.iter().map(|t| t.eager_storage().clone()).collect();
        let before = self.variables_before_call();
        let outs: Vec<Tensor> = self.execute(&storages)?.into_iter().map(Tensor::from_storage).collect();
        self.record_on_tapes(inputs, &outs, before)?;
        Ok(outs)
    }

    /// `graph` with every call inlined but custom-gradient ones: what a
    /// tape differentiates a call of this function through.
    fn differentiable_graph(&self) -> Arc<Graph> {
        match self.differentiable.get() {
            Some(g) => g.clone(),
            None => {
                let mut g = (*self.graph).clone();
                // Custom-gradient calls stay: the tape applies their rules.
                let cx = tracejit_ir::passes::PassContext {
                    keep_custom_gradients: true,
                    ..tracejit_ir::passes::PassContext::new(self.name.clone())
                };
                tracejit_ir::passes::Pass::run(&tracejit_ir::passes::Inline, &mut g, &cx);
                self.differentiable.get_or_init(|| Arc::new(g)).clone()
            }
        }
    }

    /// For a call that a tape will differentiate through its graph and
    /// that assigns variables: the values of the variables it reads, read
    /// before it runs (what its first reads see). `None` otherwise (the
    /// values read after the call are the same then).
    pub(crate) fn variables_before_call(&self) -> Option<crate::tape::CallVariables> {
        if !crate::tape::recording() || !self.graph.effects().writes() {
            return None;
        }
        if crate::tape::has_registered_gradient(self.attrs.implements.as_deref()) {
            return None;
        }
        Some(crate::tape::call_variable_values(&self.differentiable_graph()))
    }

    /// Records this call on the gradient tapes of the thread that track one
    /// of its inputs: by its registered backward kernel, or as its
    /// primitive graph (see `differentiable`).
    ///
    /// `before`: the variables' values read before the call
    /// ([`Self::variables_before_call`]); `None`: read them now.
    pub(crate) fn record_on_tapes(
        &self,
        inputs: &[&Tensor],
        outputs: &[Tensor],
        before: Option<crate::tape::CallVariables>,
    ) -> Result<()> {
        if !crate::tape::recording() {
            return Ok(());
        }
        let graph = || self.differentiable_graph();
        crate::tape::record_call(self.attrs.implements.as_deref(), &graph, before, inputs, outputs);
        Ok(())
    }

    /// The kernel registered for this function's `implements` name that
    /// accepts `inputs`, for an eager call under a gradient tape (how
    /// composites run while a tape records, so the tapes see the call):
    /// the kernel a call of it in a graph becomes, where the body could
    /// hold what the kernel never does (attention's `[Tq, Tk]` scores).
    /// The tapes differentiate the call as before (by its registered
    /// backward, else through its graph). `None` with no tape recording (a
    /// direct call runs its graph).
    fn composite_kernel(&self, inputs: &[Storage]) -> Option<Arc<dyn tracejit_ir::ExternalKernel>> {
        if !crate::tape::recording() || self.attrs.implements.is_none() {
            return None;
        }
        let types: Vec<TensorType> = inputs.iter().map(|s| TensorType::known(s.dtype(), s.shape())).collect();
        tracejit_ir::registry::lookup(self.attrs.implements.as_deref()?, &types)
    }

    /// Runs `kernel` on `inputs` in place of the graph; its results must
    /// fit the graph's outputs.
    fn run_kernel(&self, kernel: &dyn tracejit_ir::ExternalKernel, inputs: &[Storage]) -> Result<Vec<Storage>> {
        let outs = self.guarded(|| Ok(kernel.run(inputs, tracejit_kernels::Isa::current())))?;
        let want: Vec<&TensorType> = self.optimized.outputs.iter().map(|v| self.optimized.value_type(*v)).collect();
        let fits = outs.len() == want.len() && outs.iter().zip(&want).all(|(o, t)| t.accepts(o.dtype(), o.shape()));
        if !fits {
            let got: Vec<String> = outs.iter().map(|o| format!("{}{:?}", o.dtype(), o.shape())).collect();
            return Err(Error::Run {
                function: self.name.clone(),
                message: format!("its registered kernel returned {got:?}, the body returns {want:?}"),
            });
        }
        Ok(outs)
    }

    /// Runs the optimized graph on eager values; a panic inside a kernel
    /// becomes an `Err`.
    pub(crate) fn execute(&self, inputs: &[Storage]) -> Result<Vec<Storage>> {
        let _target = self.target.map(tracejit_kernels::Target::scope);
        if let Some(kernel) = self.composite_kernel(inputs) {
            return self.run_kernel(kernel.as_ref(), inputs);
        }
        let run = || match self.executable() {
            Some(exe) => exe.run(inputs),
            None => interpret(&self.optimized, inputs),
        };
        self.guarded(run)
    }

    /// Runs `run` (this function's graph on eager values); a panic inside
    /// a kernel becomes an `Err` naming the function.
    fn guarded<T>(&self, run: impl FnOnce() -> std::result::Result<T, tracejit_ir::IrError>) -> Result<T> {
        tracejit_ir::note_running(None);
        match tracejit_ir::catch_quietly(run) {
            Ok(r) => Ok(r?),
            Err(p) => {
                // The node that was running is the one whose kernel panicked.
                let mut message = tracejit_ir::panic_message(&*p);
                if let Some(at) = tracejit_ir::running_location().filter(|_| !message.contains(" (at ")) {
                    message.push_str(&format!(" (at {}:{})", at.file(), at.line()));
                }
                Err(Error::Run { function: self.name.clone(), message })
            }
        }
    }

    /// The graph a `Call` of this function refers to: the optimized one,
    /// except while `vmap` traces a closure, whose batching rules walk the
    /// graph as traced (composites still calls of their bodies, not native
    /// kernels without a batch axis) when it takes the same inputs.
    fn callee_graph(&self) -> Arc<Graph> {
        if crate::vmap::tracing() && self.graph.param_types() == self.optimized.param_types() {
            return self.graph.clone();
        }
        self.optimized.clone()
    }

    #[track_caller]
    fn record_call(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        if context::current_function().is_none() {
            return Err(Error::EndedTrace { function: self.name.clone() });
        }
        let mut all: Vec<&Tensor> = inputs.to_vec();
        all.extend(self.implicit_inputs.iter());
        let lib_fn = LibraryFunction { name: self.name.clone(), attrs: self.attrs.clone(), graph: self.callee_graph() };
        let func = with_current(|ctx| {
            let existing =
                ctx.graph.library.iter().find(|(_, f)| Arc::ptr_eq(&f.graph, &lib_fn.graph)).map(|(id, _)| id);
            existing.unwrap_or_else(|| ctx.graph.library.add(lib_fn))
        })
        .expect("checked above that a trace is active");
        // A callee with side effects is ordered like a write of every
        // variable: after all earlier accesses, before all later ones.
        let stateful = tracejit_ir::passes::graph_has_side_effects(&self.optimized);
        // Read before the accesses are collected, so the call is ordered
        // after these reads (they see the values from before the call).
        let before = self.variables_before_call();
        let control = if stateful { context::all_variable_accesses() } else { Vec::new() };
        let (node, outs) = context::record_in_current(Op::Call { func }, &all, &control).expect("a trace is active");
        if stateful {
            context::note_barrier(node, self.optimized.variables.values().map(|v| v.id()));
        }
        self.record_on_tapes(&all, &outs, before)?;
        Ok(outs)
    }
}
