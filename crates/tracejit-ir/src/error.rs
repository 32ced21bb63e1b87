//! Errors of the IR crate: an op that cannot take its operands (the message
//! users see, e.g. `add: cannot broadcast [3, 4] with [5]`), a verifier
//! failure (always a bug in tracejit), and interpreter failures.

use crate::NodeId;

/// An op given operands it cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct OpError {
    /// The op's name.
    pub op: String,
    /// What was wrong, naming dtypes and shapes.
    pub message: String,
}

impl OpError {
    /// Builds an error for op `op`.
    pub fn new(op: impl Into<String>, message: impl Into<String>) -> OpError {
        OpError { op: op.into(), message: message.into() }
    }
}

/// An error of the IR crate.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IrError {
    /// Shape or dtype inference rejected a node.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The graph breaks an invariant: a bug in tracejit (or in a pass).
    #[error("verifier: graph `{graph}` node {node}: {message} (this is a bug in tracejit)")]
    Verifier {
        /// The graph's name.
        graph: String,
        /// The offending node.
        node: NodeId,
        /// What is wrong.
        message: String,
    },
    /// A graph's text form did not parse.
    #[error(transparent)]
    Parse(#[from] crate::ParseError),
    /// Wrong inputs given to the interpreter.
    #[error("graph `{graph}`: {message}")]
    BadInput {
        /// The graph's name.
        graph: String,
        /// What is wrong.
        message: String,
    },
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`), for
/// the errors that tracejit's boundaries make of panics.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic with a non-string payload)".to_string()
    }
}
