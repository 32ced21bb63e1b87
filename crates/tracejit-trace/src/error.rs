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
    /// The function's `implements` name is not of the form
    /// `org.semantic.opname`.
    #[error("function `{function}`: {message}")]
    ImplementsName {
        /// The function.
        function: String,
        /// What is wrong with the name.
        message: String,
    },
    /// A static argument is not equal to itself (a NaN inside it), so no
    /// cached trace could ever match a call with it.
    #[error(
        "function `{function}`: static argument {argument} ({type_name}) is not equal to itself (a NaN inside \
         it?), so no cached trace can ever match it and every call would trace again; give its type a reflexive \
         `Eq` (compare floats by their bits) or pass the value as a tensor"
    )]
    NonReflexiveStatic {
        /// The function.
        function: String,
        /// Index of the static argument.
        argument: usize,
        /// Its Rust type.
        type_name: String,
    },
    /// The function calls itself while being traced.
    #[error(
        "function `{function}`: the function calls itself while being traced; recursion needs `while_loop` \
         (a loop node traced once) or a Rust loop unrolled at trace time"
    )]
    Recursion {
        /// The function.
        function: String,
    },
    /// Tracing the function would deadlock: another thread traces it and
    /// waits for a function this thread is tracing.
    #[error(
        "function `{function}`: tracing it would deadlock: another thread is tracing this function and waits, \
         directly or through other functions, for a function this thread is tracing; trace one of them first \
         (for example with get_concrete_function) or trace them from one thread"
    )]
    TraceDeadlock {
        /// The function.
        function: String,
    },
    /// The function's optimization options name a pass that does not exist
    /// (or are otherwise invalid).
    #[error("function `{function}`: {message}")]
    Options {
        /// The function.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// `to_scalar` on a tensor that does not hold exactly one element.
    #[error("to_scalar: the tensor has {elements} elements, not 1")]
    NotAScalar {
        /// How many it holds.
        elements: usize,
    },
    /// A call of a traced function's graph failed while it ran (an index
    /// out of range, a shape only known at run time that does not fit).
    #[error("function `{function}`: error while running: {message}")]
    Run {
        /// The function.
        function: String,
        /// What failed, with the user's source line where known.
        message: String,
    },
    /// A `ConcreteFunction` that reads tensors of an enclosing trace was
    /// called after that trace ended.
    #[error(
        "function `{function}`: this function captured tensors of a trace that has ended; call it inside that trace"
    )]
    EndedTrace {
        /// The function.
        function: String,
    },
    /// An argument that must be eager (to profile a run) is symbolic.
    #[error(
        "function `{function}`: {what} needs eager tensors; argument {argument} is symbolic (called inside a trace)"
    )]
    SymbolicArgument {
        /// The function.
        function: String,
        /// What needed the value.
        what: &'static str,
        /// Index of the argument.
        argument: usize,
    },
    /// The closure failed (panicked) while being traced: an op given
    /// operands it cannot take, or a panic of the user's own. The cache is
    /// unchanged.
    #[error("error while tracing function `{function}`: {message}")]
    TracePanic {
        /// The function.
        function: String,
        /// The panic message.
        message: String,
    },
    /// The closure panicked while running eagerly (the
    /// `run_functions_eagerly` switch, or the `Eager` retrace policy): nothing
    /// was traced.
    #[error("error in function `{function}` while running eagerly: {message}")]
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
    /// `quantize::dynamic` found nothing to quantize in a function.
    #[error("quantize::dynamic: function `{function}`: nothing to quantize: {message}")]
    Quantize {
        /// The function.
        function: String,
        /// What it found instead.
        message: String,
    },
    /// A gradient could not be computed (a spent tape, an integer source,
    /// an op without a gradient rule, ...).
    #[error("gradient: {message}")]
    Gradient {
        /// What was wrong.
        message: String,
    },
    /// A graph could not be exported (ONNX export, `tracejit::onnx`): the
    /// exporter's own error (`tracejit::onnx::Error`), which names the node
    /// and its source line, kept as the source
    /// (`e.source()` / [`Error::downcast_source`]). This crate sits below
    /// the exporter, so it holds the error without knowing its type; the
    /// variant exists so that `?` works in functions returning
    /// `tracejit::Result`.
    #[error("{source}")]
    Export {
        /// The function being exported.
        function: String,
        /// The exporter's error.
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A checkpoint could not be saved or restored (`tracejit::checkpoint`):
    /// the checkpoint layer's own error (`tracejit::checkpoint::CheckpointError`),
    /// kept as the source, as [`Error::Export`] keeps the exporter's.
    #[error("{source}")]
    Checkpoint {
        /// The checkpoint layer's error.
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A collective or the start-up of a data-parallel job failed
    /// (`tracejit::distributed`): its own error
    /// (`tracejit::distributed::Error`, naming the rank), kept as the
    /// source as [`Error::Export`] keeps the exporter's, so that
    /// `distributed::init()?` works in a function returning `tracejit::Result`.
    #[error("{source}")]
    Distributed {
        /// The distributed layer's error.
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    /// An artifact could not be saved, loaded or called
    /// (`tracejit::artifact`): that layer's own error
    /// (`tracejit::artifact::Error`), kept as the source, as
    /// [`Error::Export`] keeps the exporter's.
    #[error("{source}")]
    Artifact {
        /// The artifact layer's error.
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
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

impl Error {
    /// The error of a layer above this crate that this one wraps (the
    /// exporter's, the checkpoint layer's or the distributed layer's), as
    /// its own type:
    /// `e.downcast_source::<tracejit::checkpoint::CheckpointError>()`.
    pub fn downcast_source<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Export { source, .. }
            | Error::Checkpoint { source }
            | Error::Distributed { source }
            | Error::Artifact { source } => source.downcast_ref::<E>(),
            Error::ArgumentCount { .. }
            | Error::ArgumentMismatch { .. }
            | Error::ImplementsName { .. }
            | Error::NonReflexiveStatic { .. }
            | Error::Recursion { .. }
            | Error::TraceDeadlock { .. }
            | Error::Options { .. }
            | Error::NotAScalar { .. }
            | Error::Run { .. }
            | Error::EndedTrace { .. }
            | Error::SymbolicArgument { .. }
            | Error::TracePanic { .. }
            | Error::EagerPanic { .. }
            | Error::RetraceLimit { .. }
            | Error::Validation { .. }
            | Error::SymbolicValue { .. }
            | Error::Gradient { .. }
            | Error::Quantize { .. }
            | Error::Ir(_)
            | Error::Tensor(_) => None,
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
