//! Rust helpers called from generated code, one element per call, for the
//! element functions the kernels do not compute in-line (f64
//! transcendentals, `expm1`, `log1p`, `sin`, `cos`, `sinh`, `cosh`,
//! `atan`, `softplus`, `pow`, float `rem`, integer `pow`).
//!
//! There is one helper per element type and arity, not one per op: the op is
//! the helper's first argument (its index in `UnaryOp::ALL` or
//! `BinaryOp::ALL`, a constant at the call site) and the helper calls the
//! reference's element rule (`tracejit_tensor::kernels::scalar`). So a new
//! op in the op tables needs no helper entry here, and a helper's result is
//! bit-identical to the interpreter by construction. The switch on the op
//! costs a predictable branch next to a libm call.
//!
//! Helpers are `extern "C"`, never panic and never allocate: an op index
//! that names no float-valued op (which the lowering never passes) gives NaN
//! or 0.

use tracejit_ir::tensor::kernels::scalar;
use tracejit_ir::tensor::{BinaryOp, DType, UnaryOp};

/// A helper function the JIT can call: its element type and arity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Helper {
    /// `f(op: i32, x: f32) -> f32`
    UnaryF32,
    /// `f(op: i32, x: f64) -> f64`
    UnaryF64,
    /// `f(op: i32, a: f32, b: f32) -> f32`
    BinaryF32,
    /// `f(op: i32, a: f64, b: f64) -> f64`
    BinaryF64,
    /// `f(op: i32, a: i32, b: i32) -> i32`
    BinaryI32,
    /// `f(op: i32, a: i64, b: i64) -> i64`
    BinaryI64,
}

impl Helper {
    /// Every helper.
    pub const ALL: [Helper; 6] = [
        Helper::UnaryF32,
        Helper::UnaryF64,
        Helper::BinaryF32,
        Helper::BinaryF64,
        Helper::BinaryI32,
        Helper::BinaryI64,
    ];

    /// The helper computing unary ops on `t` (a float dtype).
    pub fn unary(t: DType) -> Helper {
        match t {
            DType::F32 => Helper::UnaryF32,
            DType::F64 => Helper::UnaryF64,
            _ => unreachable!("unary helpers take f32 or f64, not {t}"),
        }
    }

    /// The helper computing binary ops on `t` (a numeric dtype).
    pub fn binary(t: DType) -> Helper {
        match t {
            DType::F32 => Helper::BinaryF32,
            DType::F64 => Helper::BinaryF64,
            DType::I32 => Helper::BinaryI32,
            DType::I64 => Helper::BinaryI64,
            _ => unreachable!("binary helpers take f32, f64, i32 or i64, not {t}"),
        }
    }

    /// The symbol name registered with the JIT.
    pub fn name(self) -> &'static str {
        match self {
            Helper::UnaryF32 => "tj_unary_f32",
            Helper::UnaryF64 => "tj_unary_f64",
            Helper::BinaryF32 => "tj_binary_f32",
            Helper::BinaryF64 => "tj_binary_f64",
            Helper::BinaryI32 => "tj_binary_i32",
            Helper::BinaryI64 => "tj_binary_i64",
        }
    }

    /// The element dtype of the value arguments and the result.
    pub fn dtype(self) -> DType {
        match self {
            Helper::UnaryF32 | Helper::BinaryF32 => DType::F32,
            Helper::UnaryF64 | Helper::BinaryF64 => DType::F64,
            Helper::BinaryI32 => DType::I32,
            Helper::BinaryI64 => DType::I64,
        }
    }

    /// Number of value arguments (after the op index).
    pub fn arity(self) -> usize {
        match self {
            Helper::UnaryF32 | Helper::UnaryF64 => 1,
            Helper::BinaryF32 | Helper::BinaryF64 | Helper::BinaryI32 | Helper::BinaryI64 => 2,
        }
    }

    /// The address of the function.
    pub fn address(self) -> *const u8 {
        match self {
            Helper::UnaryF32 => unary_f32 as *const u8,
            Helper::UnaryF64 => unary_f64 as *const u8,
            Helper::BinaryF32 => binary_f32 as *const u8,
            Helper::BinaryF64 => binary_f64 as *const u8,
            Helper::BinaryI32 => binary_i32 as *const u8,
            Helper::BinaryI64 => binary_i64 as *const u8,
        }
    }
}

/// The op index a call site passes for `op`.
pub(crate) fn unary_index(op: UnaryOp) -> i64 {
    op as i64
}

/// The op index a call site passes for `op`.
pub(crate) fn binary_index(op: BinaryOp) -> i64 {
    op as i64
}

fn unary_op(index: i32) -> Option<UnaryOp> {
    UnaryOp::ALL.get(usize::try_from(index).ok()?).copied()
}

fn binary_op(index: i32) -> Option<BinaryOp> {
    BinaryOp::ALL.get(usize::try_from(index).ok()?).copied()
}

extern "C" fn unary_f32(op: i32, x: f32) -> f32 {
    unary_op(op).and_then(|op| scalar::unary_f32(op, x)).unwrap_or(f32::NAN)
}
extern "C" fn unary_f64(op: i32, x: f64) -> f64 {
    unary_op(op).and_then(|op| scalar::unary_f64(op, x)).unwrap_or(f64::NAN)
}
extern "C" fn binary_f32(op: i32, a: f32, b: f32) -> f32 {
    binary_op(op).and_then(|op| scalar::binary_f32(op, a, b)).unwrap_or(f32::NAN)
}
extern "C" fn binary_f64(op: i32, a: f64, b: f64) -> f64 {
    binary_op(op).and_then(|op| scalar::binary_f64(op, a, b)).unwrap_or(f64::NAN)
}
extern "C" fn binary_i32(op: i32, a: i32, b: i32) -> i32 {
    binary_op(op).and_then(|op| scalar::binary_i32(op, a, b)).unwrap_or(0)
}
extern "C" fn binary_i64(op: i32, a: i64, b: i64) -> i64 {
    binary_op(op).and_then(|op| scalar::binary_i64(op, a, b)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_indices_round_trip() {
        for op in UnaryOp::ALL {
            assert_eq!(unary_op(unary_index(op) as i32), Some(op));
        }
        for op in BinaryOp::ALL {
            assert_eq!(binary_op(binary_index(op) as i32), Some(op));
        }
        assert_eq!(unary_op(-1), None);
        assert_eq!(unary_op(UnaryOp::COUNT as i32), None);
    }

    #[test]
    fn helpers_compute_the_reference_rule() {
        assert_eq!(unary_f64(unary_index(UnaryOp::Sinh) as i32, 1.0), 1f64.sinh());
        assert_eq!(unary_f32(unary_index(UnaryOp::Cos) as i32, 0.5), 0.5f32.cos());
        assert_eq!(binary_i64(binary_index(BinaryOp::Pow) as i32, 3, 4), 81);
        assert_eq!(binary_f32(binary_index(BinaryOp::Rem) as i32, -1.0, 3.0), 2.0);
        assert!(unary_f32(unary_index(UnaryOp::IsNan) as i32, 1.0).is_nan());
        assert_eq!(binary_i32(99, 1, 1), 0);
    }
}
