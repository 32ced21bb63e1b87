//! The builder methods of [`Function`]: each returns the function with one
//! setting changed (and its traces dropped, since they were made under
//! the old settings).

use std::sync::Arc;

use super::{Function, FunctionConfig, FunctionState};
use crate::nest::{Nest, TensorSpec};
use tracejit_ir::passes::OptimizationOptions;
use tracejit_tensor::DType;

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

    /// Whether a function traced often warns (at its 5th trace, then the
    /// 8th, 16th, ...; on by default). Turn it off for a function that is
    /// traced once per shape on purpose — a batcher that pads to a few
    /// lengths, such as `tracejit_models::SentenceEncoder` — where the
    /// warning's advice does not apply. Every trace is still logged at
    /// `info` with its reason.
    pub fn warn_on_retrace(self, on: bool) -> Self {
        self.with_config(|c| c.warn_on_retrace = on)
    }

    /// Marks the function as implementing the composite op `name`
    /// (`org.semantic.opname`). A malformed name makes every call an error.
    pub fn implements(self, name: &str) -> Self {
        let checked = validate_composite_name(name);
        self.with_config(|c| c.implements = Some(checked))
    }

    /// Runs the function's products and convolutions in `dtype` (`BF16` or
    /// `F16`) with f32 accumulation: the `auto_mixed_precision` pass
    /// (Grappler's; PyTorch's `autocast`, Keras' `mixed_bfloat16`). What
    /// changes and what stays f32 is listed in
    /// [`tracejit_ir::passes::AutoMixedPrecision`]; Variables stay f32 and
    /// get f32 gradients, so optimizers are unchanged. Overrides
    /// [`crate::config::set_mixed_precision`] for this function; `F32`
    /// turns mixed precision off for it.
    ///
    /// # Panics
    /// If `dtype` is not `BF16`, `F16` or `F32`.
    ///
    /// ```
    /// use tracejit_trace::{function, DType, Tensor};
    ///
    /// let f = function(|(x, w): (Tensor, Tensor)| x.matmul(&w)).mixed_precision(DType::BF16);
    /// let x = Tensor::from_vec(vec![1.0f32 + 1.0 / 512.0; 4], &[2, 2]);
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2]);
    /// let y = f.call((x, w))?;
    /// assert_eq!(y.dtype(), DType::F32);
    /// // The operand was rounded to bf16 (8 significant bits) for the product.
    /// assert_eq!(y.to_vec::<f32>()?, [1.0; 4]);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn mixed_precision(self, dtype: DType) -> Self {
        let low = match dtype {
            DType::BF16 | DType::F16 => Some(dtype),
            DType::F32 => None,
            _ => {
                panic!("mixed_precision: expected BF16 or F16 (or F32 for off), got {dtype}")
            }
        };
        self.with_config(|c| c.mixed_precision = Some(low))
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

    /// Compiles and runs for `target` instead of the process's CPU and
    /// settings: its ISA picks the code (the JIT's kernels, products,
    /// composite kernels and the interpreter's), its thread count and
    /// thresholds how work is split. Tracing, compiling and every call
    /// run under it ([`tracejit_kernels::Target::enter`]), whatever the
    /// process's `set_num_threads` or `TRACEJIT_ISA` say; so one process
    /// can run a function as an AVX2 machine does beside its native form,
    /// to compare.
    ///
    /// ```
    /// use tracejit_trace::{function, Target, Tensor};
    ///
    /// let f = |x: Tensor| (x.tanh() * 2.0).sum(&[0], false);
    /// let native = function(f);
    /// let zen3 = function(f).target(Target::avx2().with_threads(1));
    /// let x = Tensor::from_vec((0..40).map(|i| i as f32 / 7.0).collect(), &[4, 10]);
    /// let (a, b) = (native.call(x.clone())?, zen3.call(x)?);
    /// for (a, b) in a.to_vec::<f32>()?.iter().zip(b.to_vec::<f32>()?) {
    ///     assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0));
    /// }
    /// let cf = &zen3.concrete_functions()[0];
    /// assert_eq!(cf.target(), Some(Target::avx2().with_threads(1)));
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    pub fn target(self, target: tracejit_kernels::Target) -> Self {
        self.with_config(|c| c.target = Some(target))
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
