//! [`JitOptions`]: the code generation knobs as one value, passed down to
//! the kernel planner rather than read from the environment deep inside it
//! (Cranelift takes its settings from the ISA's flags the same way). The
//! kernel cache keys on it, so two option sets never share a kernel.

/// How the JIT generates region kernels.
///
/// ```
/// use tracejit_jit::JitOptions;
///
/// // Keep every transcendental in-line (the code Cranelift emits), as
/// // `TRACEJIT_JIT_STAGE=0` does for the whole process.
/// let inline = JitOptions::from_env().stage_transcendentals(false);
/// assert!(!inline.stage_transcendentals);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct JitOptions {
    /// Compute f32 `exp`, `tanh` and `sigmoid` of elementwise and row
    /// regions in the 256-bit AVX2 chunk functions ("staged" nodes) where
    /// the CPU has AVX2 and FMA; `false` keeps them in-line. Both compute
    /// the same bits (see `fastmath`).
    pub stage_transcendentals: bool,
}

impl JitOptions {
    /// The process's defaults: staging on unless `TRACEJIT_JIT_STAGE=0`
    /// (read once).
    pub fn from_env() -> JitOptions {
        static STAGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let stage = *STAGE.get_or_init(|| std::env::var("TRACEJIT_JIT_STAGE").map_or(true, |v| v != "0"));
        JitOptions { stage_transcendentals: stage }
    }

    /// Sets [`JitOptions::stage_transcendentals`].
    pub fn stage_transcendentals(mut self, on: bool) -> JitOptions {
        self.stage_transcendentals = on;
        self
    }
}

impl Default for JitOptions {
    /// [`JitOptions::from_env`].
    fn default() -> JitOptions {
        JitOptions::from_env()
    }
}
