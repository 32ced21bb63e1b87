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

    /// Appends the source line of the node that failed, ` (at src/model.rs:12)`,
    /// when it is known.
    pub fn at(mut self, location: Option<&'static std::panic::Location<'static>>) -> OpError {
        // A nested node (inside a fused region) may have named its line already.
        if let Some(loc) = location.filter(|_| !self.message.contains(" (at ")) {
            self.message.push_str(&format!(" (at {}:{})", loc.file(), loc.line()));
        }
        self
    }
}

impl IrError {
    /// An op error raised by a node at `location`, naming that line; other
    /// errors unchanged.
    pub fn at(self, location: Option<&'static std::panic::Location<'static>>) -> IrError {
        match self {
            IrError::Op(e) => IrError::Op(e.at(location)),
            other => other,
        }
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
