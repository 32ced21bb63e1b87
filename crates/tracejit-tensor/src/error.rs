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
    /// A tensor too big to allocate: its byte size overflows (`bytes` is
    /// `None`) or the allocator refused it.
    #[error("{}", too_large_message(*dtype, shape, *bytes))]
    TooLarge {
        /// The element type.
        dtype: DType,
        /// The shape asked for.
        shape: Vec<usize>,
        /// The bytes it needs, when that fits in `usize`.
        bytes: Option<usize>,
    },
}

fn too_large_message(dtype: DType, shape: &[usize], bytes: Option<usize>) -> String {
    match bytes {
        Some(b) => format!("a {dtype} tensor of shape {shape:?} needs {b} bytes, which the allocator cannot give"),
        None => format!("the size of a {dtype} tensor of shape {shape:?} overflows (more than isize::MAX bytes)"),
    }
}
