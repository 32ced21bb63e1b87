//! Validated calls: the `validate` switch of a `Function` and the check
//! each validated call makes (`crate::validate`).

use tracejit_tensor::Storage;

use super::Function;
use crate::concrete::ConcreteFunction;
use crate::nest::Nest;
use crate::validate::{self, Replay, Snapshot};
use crate::Result;

impl<A: Nest, R: Nest> Function<A, R> {
    /// Shadow-eager validation: every call also runs the graph as traced in
    /// the interpreter, on copies of the variables, and compares every
    /// output and variable within the per-op tolerance
    /// (`tracejit_ir::tolerance`). A difference is an
    /// [`Error::Validation`](crate::Error::Validation) naming the first
    /// differing node (a fused region, a composite kernel against its body,
    /// a node a pass rewrote), the pass that produced it, the user's source
    /// line and the largest difference. While such a Function is traced,
    /// registered backward kernels are checked against their body's VJP.
    /// Off by default; `TRACEJIT_VALIDATE=1` turns it on for every Function
    /// that does not say otherwise. Calls cost a second, interpreted run.
    ///
    /// ```
    /// use tracejit_trace::{function, Tensor};
    ///
    /// let f = function(|x: Tensor| (x.exp() * 2.0).sum(&[0], false)).validate(true);
    /// let y = f.call(Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]))?;
    /// assert!((y.to_vec::<f32>()?[0] - 2.0 * (0.5f32.exp() + (-1.0f32).exp() + 2.0f32.exp())).abs() < 1e-4);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn validate(self, on: bool) -> Self {
        self.with_config(|c| c.validate = Some(on))
    }

    /// Whether calls are validated (the switch, else `TRACEJIT_VALIDATE`).
    pub(super) fn validating(&self) -> bool {
        self.config.validate.unwrap_or_else(crate::config::validation_from_env)
    }

    /// Checks one call's `outputs` (variables as in `before`).
    pub(super) fn check_call(
        &self,
        cf: &ConcreteFunction,
        before: &Snapshot,
        inputs: &[Storage],
        outputs: &[Storage],
    ) -> Result<()> {
        let (pipeline, context) = self.pipeline_and_context(format!("{}.validate", self.config.name))?;
        let replay = Replay { pipeline: &pipeline, context: &context, jit: cf.executable().is_some() };
        validate::check(&self.config.name, &cf.graph, before, inputs, outputs, &replay)
    }
}
