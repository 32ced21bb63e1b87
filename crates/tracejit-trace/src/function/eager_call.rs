//! Calling a `Function`'s closure directly, for the debugging switch
//! (`run_functions_eagerly`) and the `Eager` retrace policy, with the
//! traced semantics that `crate::eager` keeps.

use std::sync::Arc;

use tracejit_ir::{panic_message, TensorType};

use super::Function;
use crate::nest::{Flattener, Nest};
use crate::{Error, Result};

impl<A: Nest, R: Nest> Function<A, R> {
    /// Runs the closure on the arguments as they are, keeping what tracing
    /// would: the input signature is checked, `remember` is per Function,
    /// and variables are created on the first call only (`crate::eager`).
    pub(super) fn call_eagerly(&self, args: A) -> Result<R> {
        if let Some(sig) = &self.config.input_signature {
            let mut flat = Flattener::default();
            args.flatten(&mut flat);
            let types: Vec<TensorType> = flat.tensors.iter().map(|t| t.tensor_type()).collect();
            self.check_signature(sig, &types)?;
        }
        let after_trace = self.tracing_count() > 0;
        let (name, memo, vars) =
            (Arc::from(self.config.name.as_str()), self.state.memo.clone(), self.state.eager_variables.clone());
        tracejit_ir::catch_quietly(|| crate::eager::run_as(name, memo, vars, after_trace, || (self.closure)(args)))
            .map_err(|p| Error::EagerPanic {
                function: self.config.name.clone(),
                message: self.config.with_definition(panic_message(&*p)),
            })
    }
}
