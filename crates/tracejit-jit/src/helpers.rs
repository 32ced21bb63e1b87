//! Rust helpers called from generated code, one per element, for the float
//! functions the kernels do not approximate in-line (f64 transcendentals,
//! `expm1`, `log1p`, `sin`, `cos`, `pow`, float `rem`) and for integer `pow`.
//!
//! Each helper calls exactly the function the reference kernel calls (Rust's
//! `std`, or `libm` for `erf`) or repeats the reference algorithm line for
//! line, so results are bit-identical to the interpreter. They are
//! `extern "C"`, never panic and never allocate.

use tracejit_ir::tensor::kernels::scalar;
use tracejit_ir::tensor::{BinaryOp, DType, UnaryOp};

/// A helper function the JIT can call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub(crate) enum Helper {
    ExpF64,
    LogF64,
    TanhF64,
    SigmoidF64,
    ErfF64,
    Expm1F32,
    Expm1F64,
    Log1pF32,
    Log1pF64,
    SinF32,
    SinF64,
    CosF32,
    CosF64,
    PowF32,
    PowF64,
    RemF32,
    RemF64,
    PowI32,
    PowI64,
}

impl Helper {
    /// The helper computing unary `op` on `t`, if there is one.
    pub fn unary(op: UnaryOp, t: DType) -> Option<Helper> {
        use Helper::*;
        use UnaryOp as U;
        Some(match (op, t) {
            (U::Exp, DType::F64) => ExpF64,
            (U::Log, DType::F64) => LogF64,
            (U::Tanh, DType::F64) => TanhF64,
            (U::Sigmoid, DType::F64) => SigmoidF64,
            (U::Erf, DType::F64) => ErfF64,
            (U::Expm1, DType::F32) => Expm1F32,
            (U::Expm1, DType::F64) => Expm1F64,
            (U::Log1p, DType::F32) => Log1pF32,
            (U::Log1p, DType::F64) => Log1pF64,
            (U::Sin, DType::F32) => SinF32,
            (U::Sin, DType::F64) => SinF64,
            (U::Cos, DType::F32) => CosF32,
            (U::Cos, DType::F64) => CosF64,
            _ => return None,
        })
    }

    /// The helper computing binary `op` on `t`, if there is one.
    pub fn binary(op: BinaryOp, t: DType) -> Option<Helper> {
        use Helper::*;
        Some(match (op, t) {
            (BinaryOp::Pow, DType::F32) => PowF32,
            (BinaryOp::Pow, DType::F64) => PowF64,
            (BinaryOp::Pow, DType::I32) => PowI32,
            (BinaryOp::Pow, DType::I64) => PowI64,
            (BinaryOp::Rem, DType::F32) => RemF32,
            (BinaryOp::Rem, DType::F64) => RemF64,
            _ => return None,
        })
    }

    /// The symbol name registered with the JIT.
    pub fn name(self) -> &'static str {
        use Helper::*;
        match self {
            ExpF64 => "tj_exp_f64",
            LogF64 => "tj_log_f64",
            TanhF64 => "tj_tanh_f64",
            SigmoidF64 => "tj_sigmoid_f64",
            ErfF64 => "tj_erf_f64",
            Expm1F32 => "tj_expm1_f32",
            Expm1F64 => "tj_expm1_f64",
            Log1pF32 => "tj_log1p_f32",
            Log1pF64 => "tj_log1p_f64",
            SinF32 => "tj_sin_f32",
            SinF64 => "tj_sin_f64",
            CosF32 => "tj_cos_f32",
            CosF64 => "tj_cos_f64",
            PowF32 => "tj_pow_f32",
            PowF64 => "tj_pow_f64",
            RemF32 => "tj_rem_f32",
            RemF64 => "tj_rem_f64",
            PowI32 => "tj_pow_i32",
            PowI64 => "tj_pow_i64",
        }
    }

    /// The element dtype of the arguments and the result.
    pub fn dtype(self) -> DType {
        use Helper::*;
        match self {
            Expm1F32 | Log1pF32 | SinF32 | CosF32 | PowF32 | RemF32 => DType::F32,
            PowI32 => DType::I32,
            PowI64 => DType::I64,
            _ => DType::F64,
        }
    }

    /// Number of arguments.
    pub fn arity(self) -> usize {
        use Helper::*;
        match self {
            PowF32 | PowF64 | RemF32 | RemF64 | PowI32 | PowI64 => 2,
            _ => 1,
        }
    }

    /// The address of the function.
    pub fn address(self) -> *const u8 {
        use Helper::*;
        match self {
            ExpF64 => exp_f64 as *const u8,
            LogF64 => log_f64 as *const u8,
            TanhF64 => tanh_f64 as *const u8,
            SigmoidF64 => sigmoid_f64 as *const u8,
            ErfF64 => erf_f64 as *const u8,
            Expm1F32 => expm1_f32 as *const u8,
            Expm1F64 => expm1_f64 as *const u8,
            Log1pF32 => log1p_f32 as *const u8,
            Log1pF64 => log1p_f64 as *const u8,
            SinF32 => sin_f32 as *const u8,
            SinF64 => sin_f64 as *const u8,
            CosF32 => cos_f32 as *const u8,
            CosF64 => cos_f64 as *const u8,
            PowF32 => pow_f32 as *const u8,
            PowF64 => pow_f64 as *const u8,
            RemF32 => rem_f32 as *const u8,
            RemF64 => rem_f64 as *const u8,
            PowI32 => pow_i32 as *const u8,
            PowI64 => pow_i64 as *const u8,
        }
    }

    /// Every helper.
    pub const ALL: [Helper; 19] = [
        Helper::ExpF64,
        Helper::LogF64,
        Helper::TanhF64,
        Helper::SigmoidF64,
        Helper::ErfF64,
        Helper::Expm1F32,
        Helper::Expm1F64,
        Helper::Log1pF32,
        Helper::Log1pF64,
        Helper::SinF32,
        Helper::SinF64,
        Helper::CosF32,
        Helper::CosF64,
        Helper::PowF32,
        Helper::PowF64,
        Helper::RemF32,
        Helper::RemF64,
        Helper::PowI32,
        Helper::PowI64,
    ];
}

extern "C" fn exp_f64(x: f64) -> f64 {
    x.exp()
}
extern "C" fn log_f64(x: f64) -> f64 {
    x.ln()
}
extern "C" fn tanh_f64(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn sigmoid_f64(x: f64) -> f64 {
    scalar::sigmoid_f64(x)
}
extern "C" fn erf_f64(x: f64) -> f64 {
    libm::erf(x)
}
extern "C" fn expm1_f32(x: f32) -> f32 {
    x.exp_m1()
}
extern "C" fn expm1_f64(x: f64) -> f64 {
    x.exp_m1()
}
extern "C" fn log1p_f32(x: f32) -> f32 {
    x.ln_1p()
}
extern "C" fn log1p_f64(x: f64) -> f64 {
    x.ln_1p()
}
extern "C" fn sin_f32(x: f32) -> f32 {
    x.sin()
}
extern "C" fn sin_f64(x: f64) -> f64 {
    x.sin()
}
extern "C" fn cos_f32(x: f32) -> f32 {
    x.cos()
}
extern "C" fn cos_f64(x: f64) -> f64 {
    x.cos()
}
extern "C" fn pow_f32(a: f32, b: f32) -> f32 {
    a.powf(b)
}
extern "C" fn pow_f64(a: f64, b: f64) -> f64 {
    a.powf(b)
}

// Remainder and integer power follow the reference's element rules exactly.
extern "C" fn rem_f32(a: f32, b: f32) -> f32 {
    scalar::rem_f32(a, b)
}
extern "C" fn rem_f64(a: f64, b: f64) -> f64 {
    scalar::rem_f64(a, b)
}

extern "C" fn pow_i32(a: i32, b: i32) -> i32 {
    scalar::pow_i32(a, b)
}
extern "C" fn pow_i64(a: i64, b: i64) -> i64 {
    scalar::pow_i64(a, b)
}
