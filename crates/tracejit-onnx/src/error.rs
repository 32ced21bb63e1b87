//! The crate's error. For export: what could not be exported, naming the
//! function, the node (its id, op and the user's source line) and why, so a
//! file that a runtime would reject later is never written. For import:
//! what in a file is malformed or unsupported (naming the op type, node,
//! domain and opset), and at `run` which input contradicts the model's
//! declaration or which node failed while tracing.

use std::path::PathBuf;

/// An error of ONNX export or import.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A node ONNX cannot express (a variable assignment, a native kernel
    /// without a body, a call of a function that reads tensors of an
    /// enclosing trace).
    #[error("ONNX export of `{function}`: node {node} (`{op}`{at}) cannot be exported: {reason}")]
    Unsupported {
        /// The function being exported (or the composite whose body holds the node).
        function: String,
        /// The node's id in the exported graph (`%12`).
        node: String,
        /// The op's name (`assign_variable`).
        op: String,
        /// `, created at file.rs:LINE` when the source line is known.
        at: String,
        /// What ONNX lacks, and what to do instead.
        reason: String,
    },
    /// The function as a whole cannot be exported (it reads tensors of an
    /// enclosing trace, or its graph failed to prepare).
    #[error("ONNX export of `{function}`: {message}")]
    Function {
        /// The function being exported.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// A user-given name list does not fit the function.
    #[error("ONNX export of `{function}`: {what}: expected {expected} name(s), got {got}")]
    Names {
        /// The function being exported.
        function: String,
        /// `input names` or `output names`.
        what: &'static str,
        /// How many the function has.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A file (a model or a serialized tensor) is not valid protobuf, or is
    /// protobuf that breaks ONNX's rules (a node reading a name nothing
    /// defines, a tensor whose data does not fit its dims).
    #[error("ONNX import: malformed {what}: {message}")]
    Malformed {
        /// What was being read (`model`, `tensor`, `initializer 'w'`).
        what: String,
        /// What is wrong.
        message: String,
    },
    /// An op the importer does not implement (or not at this opset), or an
    /// attribute of it that it does not read, refused at import.
    #[error("ONNX import: unsupported op {op_type} (node '{node}', domain '{domain}', opset {opset}): {reason}")]
    UnsupportedOp {
        /// The node's op type (`Conv`).
        op_type: String,
        /// The node's name (empty when the file gives none).
        node: String,
        /// The op's domain (`ai.onnx` for the default one).
        domain: String,
        /// The model's opset for that domain.
        opset: i64,
        /// Why (`not implemented`, `attribute 'foo' is not supported`, `needs dtype uint8`).
        reason: String,
    },
    /// A tensor element type tracejit lacks (uint8, string, float8, ...).
    #[error("ONNX import: {what} has element type {dtype}, which tracejit does not support (it has f32, f64, bf16, f16, i8, u8, i16, u16, i32, u32, i64, u64, bool)")]
    UnsupportedDType {
        /// Where it appears (`graph input 'x'`, `initializer 'w'`, `tensor`).
        what: String,
        /// ONNX's name of the type (`uint8`).
        dtype: String,
    },
    /// An opset the importer does not read (a domain other than the
    /// default one, or a default-domain version outside the supported range).
    #[error("ONNX import: opset {version} of domain '{domain}' is not supported: {reason}")]
    Opset {
        /// The domain (`ai.onnx` for the default one).
        domain: String,
        /// Its version in the file.
        version: i64,
        /// Why.
        reason: String,
    },
    /// `Model::run` was given inputs that contradict the graph's declared
    /// inputs (count, dtype or a fixed dim).
    #[error("ONNX model '{model}': input {index} ('{input}'): {message}")]
    Input {
        /// The graph's name.
        model: String,
        /// The input's position.
        index: usize,
        /// The input's name (empty when the count is wrong).
        input: String,
        /// What contradicts the declaration (`expected f32, got i64`).
        message: String,
    },
    /// A node could not be mapped while tracing the model for a signature
    /// (an attribute value out of range, an operand that must be known at
    /// trace time but is not, an input of an unsupported dtype).
    #[error("ONNX model '{model}': node '{node}' ({op_type}, opset {opset}): {message}")]
    Node {
        /// The graph's name.
        model: String,
        /// The node's name, or its first output's when it has none.
        node: String,
        /// Its op type.
        op_type: String,
        /// The model's default-domain opset.
        opset: i64,
        /// What went wrong.
        message: String,
    },
    /// Running the traced model failed for another reason (an error of
    /// tracing, optimizing or executing it).
    #[error("ONNX model '{model}': {source}")]
    Run {
        /// The graph's name.
        model: String,
        /// tracejit's error.
        source: tracejit_trace::Error,
    },
    /// Reading or writing a file failed.
    #[error("ONNX: cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tracejit_trace::Error {
    /// Lets `?` on an export work in functions returning `tracejit::Result`.
    fn from(e: Error) -> tracejit_trace::Error {
        let function = match &e {
            Error::Unsupported { function, .. } | Error::Function { function, .. } | Error::Names { function, .. } => {
                function.clone()
            }
            Error::Run { model, .. } => model.clone(),
            _ => String::new(),
        };
        tracejit_trace::Error::Export { function, source: std::sync::Arc::new(e) }
    }
}
