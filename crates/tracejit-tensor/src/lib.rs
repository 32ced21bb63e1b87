//! Eager tensor storage and the reference kernels of tracejit.
//!
//! This crate is the bottom of the stack: [`DType`], [`Storage`] (an
//! `ndarray::ArcArray` per dtype, so clones are O(1)), the op families
//! ([`UnaryOp`], [`BinaryOp`], [`ReduceOp`], ...) and, in [`kernels`], the
//! reference implementation of every primitive op. The graph interpreter and
//! eager mode run these kernels; the JIT is tested against them.
//!
//! # Type rules
//!
//! - There is no implicit promotion between two tensors: a binary op needs
//!   both operands of one dtype, and the user `cast`s otherwise. A Rust scalar
//!   meeting a tensor takes the tensor's dtype (weak typing, as in JAX).
//! - Each op family's facts (name, dtype rule, cost, how exactly the JIT
//!   reproduces it) are declared once, in a table ([`for_each_unary_op!`],
//!   [`for_each_binary_op!`], [`for_each_reduce_op!`]); `result_dtype`
//!   ([`UnaryOp::result_dtype`], [`BinaryOp::result_dtype`],
//!   [`ReduceOp::result_dtype`]) follows from each row's kind.
//! - Integer arithmetic wraps on overflow. Integer `div` truncates toward
//!   zero (`-7 / 2 == -3`) while `rem` is Python's modulo, with the sign of
//!   the divisor (`-7 % 3 == 2`); dividing or taking the remainder by zero
//!   gives 0. `pow` with a negative integer exponent is the real result
//!   truncated toward zero. See [`kernels`] for the exact rules.
//! - Float ops follow IEEE 754: NaN propagates through arithmetic, `maximum`,
//!   `minimum`, `max` and `min`.

mod dtype;
mod error;
pub mod kernels;
mod limits;
mod ops;
pub mod spatial;
mod storage;

pub use dtype::{DType, Element};
pub use error::TensorError;
pub use limits::{byte_size, check_allocation, element_count, PROBE_BYTES};
pub use ops::{
    ArgReduceOp, BinaryKind, BinaryOp, Cost, Exactness, RandomDist, ReduceKind, ReduceOp, SliceSpec, UnaryKind, UnaryOp,
};
pub use spatial::{Conv2dAttrs, ConvEpilogue, Pool2dAttrs, SpatialOp};
pub use storage::{Storage, StorageElement};

/// The 16-bit float element types of [`DType::BF16`] and [`DType::F16`].
pub use half::{bf16, f16};

// ndarray's GEMM runs the reference matmul; naming matrixmultiply turns on
// its default `avx512` feature (runtime-selected AVX-512 kernels).
use matrixmultiply as _;

/// Re-export so dependents name the same ndarray version.
pub use ndarray;
