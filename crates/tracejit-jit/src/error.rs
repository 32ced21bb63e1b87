//! The error type of the JIT crate.

/// Why a region or graph could not be compiled.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JitError {
    /// The region is not one this JIT compiles (`supports` would say false).
    #[error("unsupported region: {0}")]
    Unsupported(String),
    /// The host CPU could not be targeted.
    #[error("cannot target the host: {0}")]
    Host(String),
    /// Cranelift rejected the generated function: a bug in tracejit.
    #[error("code generation failed for region `{key}`: {message} (this is a bug in tracejit)")]
    Codegen {
        /// The region's structural key.
        key: String,
        /// Cranelift's message.
        message: String,
    },
    /// The graph given to the executor is malformed.
    #[error(transparent)]
    Ir(#[from] tracejit_ir::IrError),
}
