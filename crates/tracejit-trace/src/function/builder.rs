//! The builder methods of [`Function`]: each returns the function with one
//! setting changed (and its traces dropped, since they were made under
//! the old settings).

use std::sync::Arc;

use super::{Function, FunctionConfig, FunctionState};
use crate::nest::{Nest, TensorSpec};
use tracejit_ir::passes::OptimizationOptions;

impl<A: Nest, R: Nest> Function<A, R> {
    pub(super) fn with_config(mut self, f: impl FnOnce(&mut FunctionConfig)) -> Self {
        f(Arc::make_mut(&mut self.config));
        // A changed configuration invalidates what was traced before.
        self.state = Arc::new(FunctionState::default());
        self
    }

    /// Names the function (in listings, logs and errors).
    pub fn name(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.with_config(|c| {
            c.name = name;
            c.named = true;
        })
    }

    /// Fixes the accepted type of each tensor argument (depth first); `-1`
    /// dims accept any size, so one trace serves them all. Calls that do not
    /// fit are errors, not retraces.
    pub fn input_signature(self, specs: Vec<TensorSpec>) -> Self {
        self.with_config(|c| c.input_signature = Some(specs))
    }

    /// After a second shape of otherwise the same signature, trace once more
    /// with the changing dims relaxed to unknown, so later sizes reuse it.
    pub fn reduce_retracing(self, on: bool) -> Self {
        self.with_config(|c| c.reduce_retracing = on)
    }

    /// Marks the function as implementing the composite op `name`
    /// (`org.semantic.opname`). A malformed name makes every call an error.
    pub fn implements(self, name: &str) -> Self {
        let checked = validate_composite_name(name);
        self.with_config(|c| c.implements = Some(checked))
    }

    /// Optimizes traced graphs under `options` (which passes run, the
    /// selector, verification, dumps); see [`OptimizationOptions`].
    pub fn with_optimizations(self, options: OptimizationOptions) -> Self {
        self.with_config(|c| c.optimizations = options)
    }

    /// Runs the optimization pipeline (default) or executes graphs as traced.
    pub fn optimize(self, on: bool) -> Self {
        self.with_config(|c| c.optimizations.enabled = on)
    }

    /// Skips the pass named `pass` (`"cse"`, `"fusion"`, ...); an unknown
    /// name makes tracing fail with the list of passes.
    pub fn disable_pass(self, pass: &str) -> Self {
        let pass = pass.to_string();
        self.with_config(|c| {
            c.optimizations.disabled.insert(pass);
        })
    }

    /// Replaces composite calls by registered kernels (default), or inlines
    /// every composite (`false`), to compare the two.
    pub fn selector(self, on: bool) -> Self {
        self.with_config(|c| c.optimizations.selector = on)
    }

    /// Compile with the JIT (default) or run graphs with the interpreter.
    pub fn jit(self, on: bool) -> Self {
        self.with_config(|c| c.jit = on)
    }
}

/// The `implements` name if it has the `org.semantic.opname` form
/// ([`tracejit_ir::registry::is_valid_name`]), else the message a call reports.
fn validate_composite_name(name: &str) -> std::result::Result<String, String> {
    if tracejit_ir::registry::is_valid_name(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "implements: `{name}` is not of the form `org.semantic.opname` \
             (three or more dot-separated names of letters, digits and `_`)"
        ))
    }
}
