//! How the harness runs a workload's closure: the [`Mode`]s, which
//! workloads run in which ([`STANDARD_MODES`] and the others), and
//! [`configure_function`], the one place a mode becomes builder calls.
//!
//! Inputs are f32 from fixed seeds, built by [`crate::workloads::WorkloadSpec::build`] outside
//! every timed region. How each mode runs the closure:
//!
//! - `eager`: the closure called directly on eager tensors;
//! - `traced-interp`: `function(closure).jit(false)`;
//! - `traced-jit`: `function(closure).jit(true)`, reported only when the
//!   ConcreteFunction's `executor_kind()` says `"jit"`;
//! - `traced-jit-noselect` (W7): the JIT with the implementation selector off
//!   (see [`configure_function`]);
//! - `traced-jit-bf16` (W5, W6, W9, W10, W15): the JIT with
//!   `mixed_precision(DType::BF16)` (products in bf16, f32 accumulation),
//!   checked against the f32 eager result within [`crate::verify::Tolerance::BF16`] and
//!   reported with its error (max abs error / max abs value);
//! - `traced-jit-int8` (W5, W9, W15): inference through `quantize::dynamic`,
//!   the weights held in Variables (see `crate::int8`), checked and
//!   reported like the bf16 mode.

use tracejit::{DType, Function, Nest};

/// How a workload is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// The closure called directly.
    Eager,
    /// Traced, the graph run by the interpreter.
    TracedInterp,
    /// Traced, compiled by the JIT.
    TracedJit,
    /// Traced, compiled by the JIT, with the implementation selector off (so
    /// composites are inlined instead of swapped for their kernels).
    TracedJitNoSelect,
    /// Traced, compiled by the JIT, with mixed precision: products in bf16
    /// with f32 accumulation (`Function::mixed_precision(DType::BF16)`).
    TracedJitBf16,
    /// Traced with the weights in Variables, compiled, and quantized with
    /// `tracejit::quantize::dynamic` (int8 products, f32 elsewhere).
    TracedJitInt8,
}

impl Mode {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::TracedInterp => "traced-interp",
            Mode::TracedJit => "traced-jit",
            Mode::TracedJitNoSelect => "traced-jit-noselect",
            Mode::TracedJitBf16 => "traced-jit-bf16",
            Mode::TracedJitInt8 => "traced-jit-int8",
        }
    }

    /// True for the modes that go through `function`.
    pub fn is_traced(self) -> bool {
        self != Mode::Eager
    }

    /// True for the modes whose figures must come from the JIT executor.
    pub fn needs_jit(self) -> bool {
        matches!(self, Mode::TracedJit | Mode::TracedJitNoSelect | Mode::TracedJitBf16 | Mode::TracedJitInt8)
    }

    /// True for the reduced-precision modes, whose rows report their error
    /// against the f32 result.
    pub fn is_low_precision(self) -> bool {
        matches!(self, Mode::TracedJitBf16 | Mode::TracedJitInt8)
    }
}

/// The modes every workload runs in.
pub const STANDARD_MODES: &[Mode] = &[Mode::Eager, Mode::TracedInterp, Mode::TracedJit];
/// W7's modes: the standard ones plus the JIT with the selector off.
pub const COMPOSITE_MODES: &[Mode] = &[Mode::Eager, Mode::TracedInterp, Mode::TracedJit, Mode::TracedJitNoSelect];
/// W6 and W10's modes: the standard ones plus mixed precision.
pub const BF16_MODES: &[Mode] = &[Mode::Eager, Mode::TracedInterp, Mode::TracedJit, Mode::TracedJitBf16];
/// W5, W9 and W15's modes: the standard ones plus mixed precision and int8.
pub const LOW_PRECISION_MODES: &[Mode] =
    &[Mode::Eager, Mode::TracedInterp, Mode::TracedJit, Mode::TracedJitBf16, Mode::TracedJitInt8];

/// Configures a fresh `Function` for a traced mode: THE place where modes map
/// to builder calls. `Err` carries the reason a mode cannot run yet.
pub fn configure_function<A: Nest, R: Nest>(f: Function<A, R>, mode: Mode) -> Result<Function<A, R>, String> {
    match mode {
        Mode::Eager => Err("eager mode does not go through `function`".to_string()),
        Mode::TracedInterp => Ok(f.jit(false)),
        Mode::TracedJit => Ok(f.jit(true)),
        // Composites inlined and fused like any other code instead of being
        // swapped for their registered kernels.
        Mode::TracedJitNoSelect => Ok(f.jit(true).selector(false)),
        Mode::TracedJitBf16 => Ok(f.jit(true).mixed_precision(DType::BF16)),
        Mode::TracedJitInt8 => Err("the int8 mode runs a quantized ConcreteFunction (crate::int8)".to_string()),
    }
}
