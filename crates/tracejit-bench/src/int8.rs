//! The `traced-jit-int8` mode (W5, W9, W15): inference through
//! `tracejit::quantize::dynamic`. The workload's inputs (its first
//! flattened tensor, or the first [`crate::case::Case::with_inputs`]) stay
//! arguments; every other tensor argument (the weights) becomes a Variable,
//! as a deployed model holds its parameters, so that the products against
//! them are quantized once (per output channel) and the activations per
//! row on each call. The function is traced once, quantized, and its
//! quantized ConcreteFunction is what every call runs.

use std::sync::Arc;

use tracejit::{function, ConcreteFunction, Flattener, Nest, StaticValue, Tensor, Unflattener, Variable};

use crate::workloads::{flatten_result, TracedRunner};

/// A quantized ConcreteFunction bound to its inputs.
pub(crate) struct Int8Runner {
    q: Arc<ConcreteFunction>,
    x: Vec<Tensor>,
    traced: usize,
}

/// Traces `closure` on `args` with its weights (every flattened tensor
/// after the first `inputs`) held in Variables and quantizes it; `Err`
/// says why it cannot run in int8.
pub(crate) fn runner<A, R>(
    name: &'static str,
    args: &A,
    inputs: usize,
    closure: Arc<dyn Fn(A) -> R + Send + Sync>,
) -> Result<Int8Runner, String>
where
    A: Nest + Clone + 'static,
    R: Nest + 'static,
{
    let mut flat = Flattener::default();
    args.flatten(&mut flat);
    if inputs == 0 || flat.tensors.len() <= inputs {
        return Err("int8 mode needs an input argument and weights".to_string());
    }
    let (x, weights) = flat.tensors.split_at(inputs);
    let x: Vec<Tensor> = x.iter().map(|t| (*t).clone()).collect();
    let vars: Vec<Variable> = weights.iter().map(|w| Variable::new((*w).clone())).collect();
    let statics: Vec<Arc<dyn StaticValue>> = flat.statics.iter().map(|s| s.clone_arc()).collect();
    let structure = flat.structure.to_vec();
    let f = function(move |x: Vec<Tensor>| {
        let mut leaves = x;
        leaves.extend(vars.iter().map(Variable::read));
        let a = A::unflatten(&mut Unflattener::new(leaves, statics.clone(), structure.clone()));
        flatten_result(&closure(a))
    })
    .name(name);
    let cf = f.get_concrete_function(x.clone()).map_err(|e| e.to_string())?;
    let q = tracejit::quantize::dynamic(&cf).map_err(|e| e.to_string())?;
    Ok(Int8Runner { q, x, traced: f.tracing_count() })
}

impl TracedRunner for Int8Runner {
    fn call(&mut self) -> Result<Vec<Tensor>, String> {
        self.q.call_flat(&self.x).map_err(|e| e.to_string())
    }

    fn call_discard(&mut self) -> Result<(), String> {
        std::hint::black_box(self.q.call_flat(std::hint::black_box(&self.x))).map(drop).map_err(|e| e.to_string())
    }

    fn executor_kind(&self) -> Option<&'static str> {
        Some(self.q.executor_kind())
    }

    fn schedule_stats(&self) -> Option<tracejit::ScheduleStats> {
        self.q.schedule_stats()
    }

    fn tracing_count(&self) -> usize {
        self.traced
    }

    fn profile(&mut self, runs: usize) -> Option<Result<tracejit::Profile, String>> {
        self.q.profile(&self.x, runs).map_err(|e| e.to_string()).transpose()
    }
}
