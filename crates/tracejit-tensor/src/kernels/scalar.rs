//! The reference semantics of single elements, for code outside this crate
//! that must compute exactly what the kernels compute (the JIT's per-element
//! helpers call these instead of restating the rules, so the two cannot
//! drift apart).

use super::num::{Float, Num};
use crate::{BinaryOp, UnaryOp};

/// The element function of a float-to-float unary op, exactly as the
/// reference kernel computes it; `None` for the ops whose result is not a
/// float of the input's dtype (`is_nan`, `is_finite`, `logical_not`).
fn unary_float<T: Float>(op: UnaryOp, x: T) -> Option<T> {
    use UnaryOp::*;
    /// `op` applied to `$x` (the arms of `float_unary_functions`).
    macro_rules! apply {
        (($op:expr, $x:expr) $($v:ident => $f:path,)*) => {
            match $op {
                $($v => $f($x),)*
                LogicalNot | IsNan | IsFinite => return None,
            }
        };
    }
    Some(super::unary::float_unary_functions!(apply!(op, x)))
}

/// The element function of an arithmetic binary op on numbers, exactly as
/// the reference kernel computes it; `None` for comparisons and logical ops.
fn binary_num<T: Num>(op: BinaryOp, a: T, b: T) -> Option<T> {
    use BinaryOp::*;
    /// `op` applied to `$a`, `$b` (the arms of `arithmetic_functions`).
    macro_rules! apply {
        (($op:expr, $a:expr, $b:expr) $($v:ident => $f:path,)*) => {
            match $op {
                $($v => $f($a, $b),)*
                Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr | BitwiseXor => {
                    return None
                }
            }
        };
    }
    Some(super::binary::arithmetic_functions!(apply!(op, a, b)))
}

/// `op(x)` for one f32 element, as the reference kernel computes it (`None`
/// when `op` does not map f32 to f32).
pub fn unary_f32(op: UnaryOp, x: f32) -> Option<f32> {
    unary_float(op, x)
}

/// `op(x)` for one f64 element, as the reference kernel computes it (`None`
/// when `op` does not map f64 to f64).
pub fn unary_f64(op: UnaryOp, x: f64) -> Option<f64> {
    unary_float(op, x)
}

/// `op(a, b)` for one f32 element pair, as the reference kernel computes it
/// (`None` for comparisons and logical ops).
pub fn binary_f32(op: BinaryOp, a: f32, b: f32) -> Option<f32> {
    binary_num(op, a, b)
}

/// `op(a, b)` for one f64 element pair, as the reference kernel computes it.
pub fn binary_f64(op: BinaryOp, a: f64, b: f64) -> Option<f64> {
    binary_num(op, a, b)
}

/// `op(a, b)` for one i32 element pair, as the reference kernel computes it.
pub fn binary_i32(op: BinaryOp, a: i32, b: i32) -> Option<i32> {
    binary_num(op, a, b)
}

/// `op(a, b)` for one i64 element pair, as the reference kernel computes it.
pub fn binary_i64(op: BinaryOp, a: i64, b: i64) -> Option<i64> {
    binary_num(op, a, b)
}

/// Python-style float remainder (the result has the divisor's sign), as `rem`.
pub fn rem_f32(a: f32, b: f32) -> f32 {
    Num::modulo(a, b)
}

/// Python-style float remainder (the result has the divisor's sign), as `rem`.
pub fn rem_f64(a: f64, b: f64) -> f64 {
    Num::modulo(a, b)
}

/// Integer power with wrapping and truncated negative exponents, as `pow`.
pub fn pow_i32(a: i32, b: i32) -> i32 {
    Num::power(a, b)
}

/// Integer power with wrapping and truncated negative exponents, as `pow`.
pub fn pow_i64(a: i64, b: i64) -> i64 {
    Num::power(a, b)
}

/// The logistic function computed as the reference does (stable for large |x|).
pub fn sigmoid_f32(x: f32) -> f32 {
    Float::sigmoid(x)
}

/// The logistic function computed as the reference does (stable for large |x|).
pub fn sigmoid_f64(x: f64) -> f64 {
    Float::sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_element_rules() {
        assert_eq!(rem_f32(-1.0, 3.0), 2.0);
        assert_eq!(rem_f64(1.0, -3.0), -2.0);
        assert_eq!(pow_i32(2, 10), 1024);
        assert_eq!(pow_i64(-1, -3), -1);
        assert_eq!(pow_i32(5, -1), 0);
        assert_eq!(sigmoid_f64(0.0), 0.5);
        assert!(sigmoid_f32(-200.0) >= 0.0);
        assert_eq!(unary_f64(UnaryOp::Cosh, 0.0), Some(1.0));
        assert_eq!(unary_f32(UnaryOp::IsNan, 0.0), None);
        assert_eq!(binary_i32(BinaryOp::Pow, 2, 3), Some(8));
        assert_eq!(binary_f64(BinaryOp::Lt, 2.0, 3.0), None);
    }
}
