//! Optimizing a fresh trace (the pipeline, with the kernels of the
//! composite registry and, under the JIT, the regions it compiles) and
//! preparing the JIT's executable.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracejit_ir::passes::{PassContext, Pipeline, PipelineReport};
use tracejit_ir::Graph;

use super::{Function, FunctionConfig, FunctionState};
use crate::concrete::Preparer;
use crate::nest::Nest;
use crate::{Error, Result};

/// Nesting depth (see `Graph::nesting_depth`) past which a trace is
/// optimized and compiled on a thread of its own with [`DEEP_STACK`]
/// bytes of stack: the passes and the JIT's preparation recurse once per
/// level, a few KiB each, and 400 nested `cond`s overflowed a 2 MiB
/// thread stack there.
const SHALLOW: usize = 16;

/// The stack of the thread that optimizes and compiles deeply nested
/// traces (reserved, not committed, until used).
const DEEP_STACK: usize = 256 << 20;

/// Runs `work` on this thread, or on a thread with [`DEEP_STACK`] bytes of
/// stack when `graph` nests deeply (on this one when no thread can be
/// had); a panic on that thread becomes `on_panic`'s value.
fn on_stack_for<T: Send>(graph: &Graph, work: impl Fn() -> T + Sync, on_panic: impl FnOnce(String) -> T) -> T {
    if graph.nesting_depth() <= SHALLOW {
        return work();
    }
    std::thread::scope(|s| {
        let handle =
            std::thread::Builder::new().name("tracejit-compile".into()).stack_size(DEEP_STACK).spawn_scoped(s, &work);
        match handle {
            Ok(h) => h.join().unwrap_or_else(|p| on_panic(tracejit_ir::panic_message(&*p))),
            Err(_) => work(),
        }
    })
}

impl<A: Nest, R: Nest> Function<A, R> {
    /// [`Function::optimize_graph`] (on a thread with a deep stack when the
    /// graph nests deeply), and what prepares the JIT's executable of the
    /// result when it is first needed (`ConcreteFunction::prepared`): a
    /// function traced only to be inlined into a caller's trace (a
    /// composite, a layer, a gradient's pieces) is never compiled on its
    /// own. W10's trace compiled 30 kernels before, of which its step runs
    /// 17.
    pub(super) fn optimize_and_preparer(&self, graph: &Graph) -> Result<(Graph, PipelineReport, Preparer)> {
        let (optimized, report) = on_stack_for(
            graph,
            || self.optimize_graph(graph),
            |message| Err(Error::TracePanic { function: self.config.name.clone(), message }),
        )?;
        // The state holds the traces, so a trace holds it weakly: a strong
        // reference would be a cycle, and no dropped function freed.
        let (config, state) = (self.config.clone(), Arc::downgrade(&self.state));
        let trace_no = self.state.tracing_count.load(Ordering::SeqCst) + 1;
        let preparer: Preparer = Box::new(move |g: &Graph| {
            on_stack_for(
                g,
                || prepare_with(&config, state.upgrade().as_deref(), trace_no, g),
                |message| (None, Some(format!("preparing the JIT's executable panicked: {message}"))),
            )
        });
        Ok((optimized, report, preparer))
    }

    /// [`prepare_with`] this function's settings, as its first trace.
    #[cfg(test)]
    fn prepare_executable(&self, graph: &Graph) -> (Option<tracejit_jit::Executable>, Option<String>) {
        prepare_with(&self.config, Some(&self.state), 1, graph)
    }

    /// Runs the optimization pipeline over a freshly traced graph; the
    /// trace lock is held. Composite calls find their kernels in the
    /// process-wide table (`tracejit_ir::registry`, which
    /// `tracejit::composite` fills); dumps are named
    /// `<function>.<trace number>`.
    pub(super) fn optimize_graph(&self, graph: &Graph) -> Result<(Graph, PipelineReport)> {
        let trace_no = self.state.tracing_count.load(Ordering::SeqCst) + 1;
        let (pipeline, cx) = self.pipeline_and_context(format!("{}.{trace_no}", self.config.name))?;
        Ok(pipeline.run(graph, &cx)?)
    }

    /// The pipeline and pass context this Function optimizes with; dumps
    /// are named `dump_prefix`.
    pub(super) fn pipeline_and_context(&self, dump_prefix: String) -> Result<(Pipeline, PassContext)> {
        let pipeline = Pipeline::default_pipeline().with_options(self.config.optimizations.clone());
        pipeline.validate().map_err(|message| Error::Options { function: self.config.name.clone(), message })?;
        let mixed_precision = self.config.mixed_precision.unwrap_or_else(crate::config::mixed_precision);
        let mut cx = PassContext {
            dump_prefix: Some(dump_prefix),
            mixed_precision,
            ..PassContext::new(self.config.name.clone())
        }
        .with_kernels(tracejit_ir::registry::global());
        if self.config.jit {
            // Form only regions the JIT compiles (smaller ones where it
            // would reject a bigger one); `OptimizationOptions::accept_region`
            // still overrides.
            cx = cx.with_region_acceptor(Arc::new(tracejit_jit::supports));
            // Channels-last convolutions run on the channel-lane kernels,
            // which need vector code (AVX2 or AVX-512); without it they
            // would go through NCHW with two transposes each.
            let target = self.config.target.unwrap_or_else(tracejit_kernels::Target::current);
            cx.channels_last = target.isa.width().is_some();
        }
        Ok((pipeline, cx))
    }
}

/// Compiles the optimized graph for the JIT executor when `jit(true)`.
/// A graph the executor cannot prepare runs in the interpreter instead:
/// slower, never wrong, and never silent — a `log` warning names the
/// reason, [`crate::ConcreteFunction::jit_error`] keeps it and
/// [`crate::CacheStats::jit_failures`] counts it.
fn prepare_with(
    config: &FunctionConfig,
    state: Option<&FunctionState>,
    trace_no: usize,
    graph: &Graph,
) -> (Option<tracejit_jit::Executable>, Option<String>) {
    if !config.jit {
        return (None, None);
    }
    // The pipeline's fusion pass planned the regions with the JIT's
    // rule (the planner runs once); with fusion switched off, the JIT
    // plans them itself.
    let opts = match config.target {
        Some(target) => tracejit_jit::JitOptions::global().for_target(target),
        None => tracejit_jit::JitOptions::global(),
    };
    let prepared = if config.optimizations.runs("fusion") {
        let pipeline = Pipeline::default_pipeline().with_options(config.optimizations.clone());
        let dump = pipeline
            .dump_dir()
            .map(|dir| tracejit_jit::codegen::DumpTo { dir, prefix: format!("{}.{trace_no}", config.name) });
        tracejit_jit::Executable::from_optimized(graph, &opts, dump)
    } else {
        tracejit_jit::Executable::with_options(graph, &opts)
    };
    match prepared {
        Ok(exe) => (Some(exe), None),
        Err(e) => {
            log::warn!("tracejit: `{}` runs in the interpreter: the JIT could not prepare it: {e}", config.name);
            // Counted on the function, when it still exists.
            if let Some(state) = state {
                let mut stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
                stats.jit_failures += 1;
                stats.note(format!("the JIT could not prepare a trace ({e}); it runs in the interpreter"));
            }
            (None, Some(e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use tracejit_ir::{Graph, NodeId, TensorType, ValueId};
    use tracejit_tensor::DType;

    use crate::{function, Tensor};

    /// A graph the JIT cannot prepare (its output names a node that does
    /// not exist) is reported, kept and counted, never silently run by the
    /// interpreter.
    #[test]
    fn a_jit_failure_is_visible() {
        let f = function(|x: Tensor| x);
        let mut g = Graph::new("broken");
        g.add_param(TensorType::known(DType::F32, &[2]));
        g.outputs.push(ValueId::new(NodeId::from_u32(99), 0));
        let (exe, err) = f.prepare_executable(&g);
        assert!(exe.is_none());
        let err = err.expect("the reason is kept");
        assert!(err.contains("%99"), "{err}");
        let stats = f.cache_stats();
        assert_eq!(stats.jit_failures, 1);
        assert!(stats.events.iter().any(|e| e.contains("runs in the interpreter")), "{:?}", stats.events);
        // With the JIT off nothing is attempted, so nothing failed.
        let (exe, err) = f.clone().jit(false).prepare_executable(&g);
        assert!(exe.is_none() && err.is_none());
    }

    /// A function called from another trace is traced (its graph is
    /// inlined or called) but not compiled on its own until it is called
    /// directly; then it is, and computes what the caller's trace did.
    #[test]
    fn a_function_called_from_a_trace_is_compiled_only_when_called_itself() {
        let inner = function(|x: Tensor| (x.clone() * 2.0).tanh() + x);
        let i = inner.clone();
        let outer = function(move |x: Tensor| i.call(x).expect("the inner call traces") * 3.0);
        let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, f32::NAN], &[4]);
        let through_outer = outer.call(x.clone()).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(outer.concrete_functions()[0].executor_kind(), "jit");
        let cf = inner.concrete_functions()[0].clone();
        assert!(cf.prepared.get().is_none(), "the inner trace was compiled for a call it never runs");
        let direct = inner.call(x.clone()).unwrap().to_vec::<f32>().unwrap();
        assert!(cf.prepared.get().is_some_and(|(exe, _)| exe.is_some()), "a direct call runs the JIT");
        for (a, b) in through_outer.iter().zip(&direct) {
            assert!(
                a.to_bits() == (b * 3.0).to_bits()
                    || (a - b * 3.0).abs() <= 1e-5 * a.abs().max(1.0)
                    || (a.is_nan() && b.is_nan()),
                "{a} vs 3 * {b}"
            );
        }
    }
}
