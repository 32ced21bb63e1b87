//! A workload's case: its inputs and closure bound together
//! ([`Case`]), run eagerly or as a traced `Function` in any [`Mode`]
//! ([`Runnable`], [`TracedRunner`]), so every mode calls the same closure.

use std::sync::Arc;

use tracejit::{function, DType, Flattener, Function, Nest, StaticValue, Tensor, Unflattener};

use crate::modes::{configure_function, Mode};

/// A workload's inputs and closure, ready to run in any mode.
pub trait Runnable {
    /// Calls the closure eagerly once; a panic becomes `Err`.
    fn eager_call(&self) -> Result<Vec<Tensor>, String>;
    /// Calls the closure eagerly, dropping the result (the timed loop).
    fn eager_call_discard(&self);
    /// Calls the closure eagerly on the inputs cast to f64, with the outputs
    /// cast back to f32: a higher-precision reference, used to check that
    /// the tolerances leave room for f32 rounding.
    fn eager_call_f64(&self) -> Result<Vec<Tensor>, String>;
    /// A fresh traced `Function` of the closure for `mode` (nothing traced
    /// yet); `Err` is the reason the mode is not available.
    fn traced(&self, mode: Mode) -> Result<Box<dyn TracedRunner + '_>, String>;
}

/// A traced `Function` bound to a workload's inputs.
pub trait TracedRunner {
    /// Calls the function, returning its outputs flattened.
    fn call(&mut self) -> Result<Vec<Tensor>, String>;
    /// Calls the function, dropping the result (the timed loop).
    fn call_discard(&mut self) -> Result<(), String>;
    /// The executor of the first ConcreteFunction (`"jit"`, `"interpreter"`),
    /// once something was traced.
    fn executor_kind(&self) -> Option<&'static str>;
    /// What one call runs (kernels, GEMMs, ...), when the JIT runs it.
    fn schedule_stats(&self) -> Option<tracejit::ScheduleStats>;
    /// How many times the closure was traced.
    fn tracing_count(&self) -> usize;
    /// Per-step times of `runs` calls of the first trace (`--profile`);
    /// `None` before a call or when the interpreter runs it.
    fn profile(&mut self, runs: usize) -> Option<Result<tracejit::Profile, String>>;
}

/// The flattened tensors of a result nest.
pub fn flatten_result<R: Nest>(r: &R) -> Vec<Tensor> {
    let mut flat = Flattener::default();
    r.flatten(&mut flat);
    flat.tensors.iter().map(|t| (*t).clone()).collect()
}

/// One workload: its arguments and the closure, shared by every mode.
pub struct Case<A, R> {
    name: &'static str,
    args: A,
    closure: Arc<dyn Fn(A) -> R + Send + Sync>,
    inputs: usize,
}

impl<A, R> Case<A, R>
where
    A: Nest + Clone + 'static,
    R: Nest + 'static,
{
    /// A case named `name` calling `closure` on (clones of) `args`.
    pub fn new(name: &'static str, args: A, closure: impl Fn(A) -> R + Send + Sync + 'static) -> Case<A, R> {
        Case { name, args, closure: Arc::new(closure), inputs: 1 }
    }

    /// How many of the flattened argument tensors are the model's inputs
    /// (1 unless set): the int8 mode keeps these as arguments and holds
    /// every later tensor (the weights) in a Variable.
    pub fn with_inputs(mut self, inputs: usize) -> Case<A, R> {
        self.inputs = inputs;
        self
    }

    /// The closure as a fresh (untraced) `Function`.
    pub fn function(&self) -> Function<A, R> {
        let c = self.closure.clone();
        function(move |a: A| c(a)).name(self.name)
    }
}

impl<A, R> Runnable for Case<A, R>
where
    A: Nest + Clone + 'static,
    R: Nest + 'static,
{
    fn eager_call(&self) -> Result<Vec<Tensor>, String> {
        tracejit::ir::catch_quietly(|| flatten_result(&(self.closure)(self.args.clone())))
            .map_err(|p| format!("eager call panicked: {}", tracejit::ir::panic_message(&*p)))
    }

    fn eager_call_discard(&self) {
        std::hint::black_box((self.closure)(std::hint::black_box(self.args.clone())));
    }

    fn eager_call_f64(&self) -> Result<Vec<Tensor>, String> {
        let mut flat = Flattener::default();
        self.args.flatten(&mut flat);
        let tensors: Vec<Tensor> = flat
            .tensors
            .iter()
            .map(|t| if t.dtype() == DType::F32 { t.cast(DType::F64) } else { (*t).clone() })
            .collect();
        let statics: Vec<Arc<dyn StaticValue>> = flat.statics.iter().map(|s| s.clone_arc()).collect();
        let args = A::unflatten(&mut Unflattener::new(tensors, statics, flat.structure.to_vec()));
        tracejit::ir::catch_quietly(|| {
            flatten_result(&(self.closure)(args))
                .into_iter()
                .map(|t| if t.dtype() == DType::F64 { t.cast(DType::F32) } else { t })
                .collect()
        })
        .map_err(|p| format!("eager f64 call panicked: {}", tracejit::ir::panic_message(&*p)))
    }

    fn traced(&self, mode: Mode) -> Result<Box<dyn TracedRunner + '_>, String> {
        if mode == Mode::TracedJitInt8 {
            return Ok(Box::new(crate::int8::runner(self.name, &self.args, self.inputs, self.closure.clone())?));
        }
        let f = configure_function(self.function(), mode)?;
        Ok(Box::new(BoundFunction { f, args: &self.args }))
    }
}

struct BoundFunction<'a, A, R> {
    f: Function<A, R>,
    args: &'a A,
}

impl<A: Nest + Clone, R: Nest> TracedRunner for BoundFunction<'_, A, R> {
    fn call(&mut self) -> Result<Vec<Tensor>, String> {
        let out = self.f.call(self.args.clone()).map_err(|e| e.to_string())?;
        Ok(flatten_result(&out))
    }

    fn call_discard(&mut self) -> Result<(), String> {
        match self.f.call(std::hint::black_box(self.args.clone())) {
            Ok(out) => {
                std::hint::black_box(out);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn executor_kind(&self) -> Option<&'static str> {
        self.f.concrete_functions().first().map(|cf| cf.executor_kind())
    }

    fn schedule_stats(&self) -> Option<tracejit::ScheduleStats> {
        self.f.concrete_functions().first().and_then(|cf| cf.schedule_stats())
    }

    fn tracing_count(&self) -> usize {
        self.f.tracing_count()
    }

    fn profile(&mut self, runs: usize) -> Option<Result<tracejit::Profile, String>> {
        let cf = self.f.concrete_functions().into_iter().next()?;
        let mut flat = Flattener::default();
        self.args.flatten(&mut flat);
        let inputs: Vec<Tensor> = flat.tensors.iter().map(|t| (*t).clone()).collect();
        cf.profile(&inputs, runs).map_err(|e| e.to_string()).transpose()
    }
}
