//! The exporter's error: what could not be exported, naming the function,
//! the node (its id, op and the user's source line) and why, so a file that
//! a runtime would reject later is never written.

use std::path::PathBuf;

/// An error of ONNX export.
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
    /// Writing a file failed.
    #[error("ONNX export: cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// `Result` with the exporter's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tracejit_trace::Error {
    /// Lets `?` on an export work in functions returning `tracejit::Result`.
    fn from(e: Error) -> tracejit_trace::Error {
        let function = match &e {
            Error::Unsupported { function, .. } | Error::Function { function, .. } | Error::Names { function, .. } => {
                function.clone()
            }
            Error::Io { .. } => String::new(),
        };
        tracejit_trace::Error::Export { function, source: std::sync::Arc::new(e) }
    }
}
