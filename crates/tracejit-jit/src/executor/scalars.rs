//! Binary ops on two 0-d operands of one dtype (a loop's `i < n` and
//! `i + 1`) computed in place of the reference kernel, into a pooled 0-d
//! buffer.
//!
//! Why: the reference kernel broadcasts, zips and allocates even for one
//! element (about 0.12 µs); a loop runs two such ops per trip. The element
//! functions are the reference's own (`kernels::scalar`), the comparisons
//! Rust's operators as the reference kernel's, so the result is the same.

use tracejit_ir::tensor::kernels::scalar as element;
use tracejit_ir::tensor::{BinaryKind, BinaryOp, Storage};

use crate::region::{unique_mut_ptr, BufPool};
use crate::scalar::Scalar;

/// `op(a, b)` for scalars of one dtype, or `None` where the reference
/// kernel runs (logical ops, mixed dtypes, an op without an element rule).
fn apply(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    macro_rules! compare {
        ($x:expr, $y:expr) => {
            Scalar::Bool(match op {
                BinaryOp::Lt => $x < $y,
                BinaryOp::Le => $x <= $y,
                BinaryOp::Gt => $x > $y,
                BinaryOp::Ge => $x >= $y,
                BinaryOp::Eq => $x == $y,
                BinaryOp::Ne => $x != $y,
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Pow
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Rem
                | BinaryOp::LogicalAnd
                | BinaryOp::LogicalOr
                | BinaryOp::BitwiseAnd
                | BinaryOp::BitwiseOr
                | BinaryOp::BitwiseXor => return None,
            })
        };
    }
    Some(match (op.kind(), a, b) {
        (BinaryKind::Arithmetic, Scalar::I64(x), Scalar::I64(y)) => Scalar::I64(element::binary_i64(op, x, y)?),
        (BinaryKind::Arithmetic, Scalar::I32(x), Scalar::I32(y)) => Scalar::I32(element::binary_i32(op, x, y)?),
        (BinaryKind::Arithmetic, Scalar::F32(x), Scalar::F32(y)) => Scalar::F32(element::binary_f32(op, x, y)?),
        (BinaryKind::Arithmetic, Scalar::F64(x), Scalar::F64(y)) => Scalar::F64(element::binary_f64(op, x, y)?),
        (BinaryKind::Ordering | BinaryKind::Equality, Scalar::I64(x), Scalar::I64(y)) => compare!(x, y),
        (BinaryKind::Ordering | BinaryKind::Equality, Scalar::I32(x), Scalar::I32(y)) => compare!(x, y),
        (BinaryKind::Ordering | BinaryKind::Equality, Scalar::F32(x), Scalar::F32(y)) => compare!(x, y),
        (BinaryKind::Ordering | BinaryKind::Equality, Scalar::F64(x), Scalar::F64(y)) => compare!(x, y),
        (
            BinaryKind::Arithmetic
            | BinaryKind::Ordering
            | BinaryKind::Equality
            | BinaryKind::Logical
            | BinaryKind::Bitwise,
            _,
            _,
        ) => return None,
    })
}

/// `op` on two 0-d operands, into a 0-d buffer from `pool` where it has
/// one; `None` for other operands and ops (the reference kernel runs).
pub(super) fn binary(op: BinaryOp, args: &[&Storage], pool: &mut BufPool) -> Option<Storage> {
    let [a, b] = args else { return None };
    // The 16-bit floats take the reference kernel (f32 arithmetic, rounded),
    // and so do the narrow integers and u64.
    let compiled = crate::analysis::compiled_dtype;
    if a.rank() != 0 || b.rank() != 0 || !compiled(a.dtype()) || !compiled(b.dtype()) {
        return None;
    }
    let v = apply(op, Scalar::of_storage(a), Scalar::of_storage(b))?;
    let Some(mut out) = pool.take(v.dtype(), &[]) else { return Some(v.to_storage()) };
    let p = unique_mut_ptr(&mut out)?;
    // SAFETY: `out` is a unique 0-d buffer of `dtype`: one element at `p`.
    unsafe {
        match v {
            Scalar::F32(x) => *(p as *mut f32) = x,
            Scalar::F64(x) => *(p as *mut f64) = x,
            Scalar::I32(x) => *(p as *mut i32) = x,
            Scalar::I64(x) => *(p as *mut i64) = x,
            Scalar::Bool(x) => *(p as *mut bool) = x,
        }
    }
    Some(out)
}
