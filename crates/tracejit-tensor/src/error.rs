//! The error type of the tensor crate: the recoverable failures at its
//! boundary (reading values out with the wrong type, building from data of the
//! wrong length). Misuse of an op is a panic raised by the op's caller.

use crate::DType;

/// An error from constructing or reading a tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    /// Reading values with a Rust type that does not match the dtype.
    #[error("dtype mismatch: the tensor holds {actual}, but {requested} was requested")]
    DTypeMismatch {
        /// The tensor's dtype.
        actual: DType,
        /// The dtype of the Rust type asked for.
        requested: DType,
    },
    /// Data whose length does not match the product of the shape.
    #[error("{len} values cannot fill a tensor of shape {shape:?} ({expected} elements)")]
    LengthMismatch {
        /// Number of values given.
        len: usize,
        /// Shape asked for.
        shape: Vec<usize>,
        /// Product of the shape.
        expected: usize,
    },
}
