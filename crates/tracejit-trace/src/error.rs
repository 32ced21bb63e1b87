//! The error type of tracejit's boundaries: calling a `Function` or a
//! `ConcreteFunction`, reading a tensor's value, tracing. Each variant names
//! the function and the argument involved.

use tracejit_ir::IrError;
use tracejit_tensor::TensorError;

/// An error at a tracejit boundary.
///
/// `Debug` prints the same sentence as `Display`, so `.unwrap()` on a
/// tracejit `Result` shows a readable message.
#[derive(Clone, thiserror::Error)]
pub enum Error {
    /// A call with the wrong number of tensor arguments.
    #[error("function `{function}`: expected {expected} tensor argument(s), got {got}")]
    ArgumentCount {
        /// The function.
        function: String,
        /// How many its signature has.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// An argument whose dtype or shape the signature does not accept.
    #[error("function `{function}`: argument {argument}: expected {expected}, got {got}")]
    ArgumentMismatch {
        /// The function.
        function: String,
        /// Index of the tensor argument (depth-first over the nest).
        argument: usize,
        /// What the signature accepts.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A signature whose structure or static values do not fit the function.
    #[error("function `{function}`: {message}")]
    Signature {
        /// The function.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// The closure panicked while being traced; the cache is unchanged.
    #[error("function `{function}` panicked while tracing: {message}")]
    TracePanic {
        /// The function.
        function: String,
        /// The panic message.
        message: String,
    },
    /// The closure panicked while running eagerly (the
    /// `run_functions_eagerly` switch, or the `Eager` retrace policy): nothing
    /// was traced.
    #[error("function `{function}` panicked while running eagerly: {message}")]
    EagerPanic {
        /// The function.
        function: String,
        /// The panic message.
        message: String,
    },
    /// A call needed a new trace, the cache holds `max_traces` of them and
    /// the retrace policy is `Error`.
    #[error(
        "function `{function}`: a new trace is needed ({reason}), but the cache already holds its limit of \
         {max_traces} trace(s) and the retrace policy is Error; pass an input_signature with -1 dims, use \
         reduce_retracing(true), or raise max_traces"
    )]
    RetraceLimit {
        /// The function.
        function: String,
        /// The bound.
        max_traces: usize,
        /// Why the call needed a new trace.
        reason: String,
    },
    /// Shadow validation found an optimized result that differs from the
    /// graph as traced (see `Function::validate`).
    #[error("function `{function}`: validation: {message}")]
    Validation {
        /// The function.
        function: String,
        /// What differs, by how much, and the first differing node.
        message: String,
    },
    /// The value of a symbolic tensor was asked for while tracing.
    #[error(
        "cannot read the value of a symbolic tensor while tracing function `{function}`: \
         its value exists only when the compiled function runs. Return it from the function \
         instead, and express value-dependent branching with `tracejit::cond` / \
         `tracejit::while_loop` (graph nodes that run the right branch or any trip count) or `Tensor::select`"
    )]
    SymbolicValue {
        /// The function being traced.
        function: String,
    },
    /// A gradient could not be computed (a spent tape, an integer source,
    /// an op without a gradient rule, ...).
    #[error("gradient: {message}")]
    Gradient {
        /// What was wrong.
        message: String,
    },
    /// A graph could not be exported (ONNX export, `tracejit::onnx`); the
    /// message names the node and its source line.
    #[error("{message}")]
    Export {
        /// The function being exported.
        function: String,
        /// The exporter's message.
        message: String,
    },
    /// A checkpoint could not be saved or restored (`tracejit::checkpoint`);
    /// the message names the file and what failed.
    #[error("{message}")]
    Checkpoint {
        /// The checkpoint layer's message.
        message: String,
    },
    /// An error from the IR (verifier or interpreter).
    #[error(transparent)]
    Ir(#[from] IrError),
    /// An error from the tensor layer (e.g. reading f32 data as f64).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// `Result` with tracejit's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
