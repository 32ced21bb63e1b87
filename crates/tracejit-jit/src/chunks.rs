//! The vector chunk functions of [`tracejit_kernels::simd`] as the code
//! generator sees them: which unary ops have one, under the kernel's
//! [`JitOptions`], and the symbols the JIT module imports.
//!
//! A staged kernel stores a chunk of an op's argument, calls the chunk
//! function and reads the results back (see `kernel.rs`); the functions
//! follow the in-line code's recipes operation for operation, so staging
//! changes no bit.

use tracejit_ir::tensor::UnaryOp;
use tracejit_kernels::simd::{ChunkFn, MathFn};

use crate::options::JitOptions;

/// The chunk function for `op` on this CPU under `opts`, with its symbol
/// name; `None` for ops without one (computed in-line or by a helper).
pub(crate) fn chunk_fn(op: UnaryOp, opts: &JitOptions) -> Option<(&'static str, ChunkFn)> {
    let f = match op {
        UnaryOp::Exp => MathFn::Exp,
        UnaryOp::Tanh => MathFn::Tanh,
        UnaryOp::Sigmoid => MathFn::Sigmoid,
        UnaryOp::Erf => MathFn::Erf,
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Expm1
        | UnaryOp::Log
        | UnaryOp::Log1p
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Square
        | UnaryOp::Reciprocal
        | UnaryOp::Relu
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Sinh
        | UnaryOp::Cosh
        | UnaryOp::Atan
        | UnaryOp::Softplus
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::LogicalNot
        | UnaryOp::IsNan
        | UnaryOp::IsFinite => return None,
    };
    tracejit_kernels::simd::chunk_fn(f, opts.isa())
}

/// Every chunk function this CPU has: (symbol name, address), for the
/// JIT's symbol table.
pub(crate) fn symbols() -> Vec<(&'static str, *const u8)> {
    tracejit_kernels::simd::symbols()
}
