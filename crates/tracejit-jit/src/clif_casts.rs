//! Casts in generated code: between the compiled dtypes as Rust's `as`
//! converts (the reference kernels' rule), and from or to the narrow
//! integers, which a region holds as their compute dtype's value (i32, or
//! i64 for u32) and wraps back to their width after each op ([`Emit::wrap`]).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, InstBuilder, Value};
use tracejit_ir::tensor::DType;

use crate::analysis::Scalar;
use crate::clif_ops::{sty, Emit, Mode};

impl Emit<'_, '_> {
    /// Converts `x` from `from` to `to` as Rust's `as` does.
    pub fn cast(&mut self, from: DType, to: DType, mode: Mode, x: Value) -> Value {
        use DType::*;
        if from == to {
            return x;
        }
        if from.is_narrow_int() || to.is_narrow_int() {
            return self.cast_narrow(from, to, mode, x);
        }
        if mode == Mode::Vector {
            return match (from, to) {
                (F32, I32) => self.b.ins().fcvt_to_sint_sat(types::I32X4, x),
                (I32, F32) => self.b.ins().fcvt_from_sint(types::F32X4, x),
                (Bool, I32 | I64) => self.b.ins().ineg(x),
                (Bool, F32 | F64) => {
                    let one = self.kf(to, mode, 1.0);
                    let ity = self.ty(Bool, mode);
                    let one_bits = self.bitcast(ity, one);
                    let m = self.b.ins().band(x, one_bits);
                    let fty = self.ty(to, mode);
                    self.bitcast(fty, m)
                }
                (F32 | F64, Bool) => {
                    let zero = self.kf(from, mode, 0.0);
                    self.fcmp(FloatCC::NotEqual, x, zero)
                }
                (I32 | I64, Bool) => {
                    let zero = self.ki(from, mode, 0);
                    self.icmp(IntCC::NotEqual, x, zero)
                }
                _ => self.scalarize(&[(x, from)], to, |e, xs| e.cast(from, to, Mode::Scalar, xs[0])),
            };
        }
        let tty = sty(to);
        match (from, to) {
            (F32, F64) => self.b.ins().fpromote(tty, x),
            (F64, F32) => self.b.ins().fdemote(tty, x),
            (I32 | I64, F32 | F64) => self.b.ins().fcvt_from_sint(tty, x),
            (F32 | F64, I32 | I64) => self.b.ins().fcvt_to_sint_sat(tty, x),
            (I32, I64) => self.b.ins().sextend(tty, x),
            (I64, I32) => self.b.ins().ireduce(tty, x),
            (Bool, I32 | I64) => self.b.ins().uextend(tty, x),
            (Bool, F32 | F64) => {
                let w = self.b.ins().uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(tty, w)
            }
            (F32 | F64, Bool) => {
                let zero = self.kf(from, mode, 0.0);
                self.fcmp(FloatCC::NotEqual, x, zero)
            }
            (I32 | I64, Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            _ => unreachable!("identity casts returned above"),
        }
    }

    /// A cast from or to a narrow integer (held as its compute dtype's
    /// value): the cast between the compute dtypes, then, to a narrow
    /// integer, the reference's `as`: a float saturates to the narrow
    /// range (it saturated to the compute dtype's already, NaN to 0), an
    /// integer or bool keeps its low bits.
    fn cast_narrow(&mut self, from: DType, to: DType, mode: Mode, x: Value) -> Value {
        let (fc, tc) = (from.compute(), to.compute());
        let y = self.cast(fc, tc, mode, x);
        if !to.is_narrow_int() {
            return y;
        }
        if from.is_float() {
            let (lo, hi) = to.int_range().expect("an integer dtype");
            let bound = |v: i128| if tc == DType::I32 { Scalar::I32(v as i32) } else { Scalar::I64(v as i64) };
            return self.clamp(tc, mode, y, bound(lo), bound(hi));
        }
        self.wrap(to, mode, y)
    }

    /// The value `x` of `to`'s compute dtype wrapped to the narrow integer
    /// `to` (two's complement), held again as the compute dtype's value:
    /// sign-extended from the low bits for the signed, zero-extended for
    /// the unsigned. Other dtypes pass.
    pub fn wrap(&mut self, to: DType, mode: Mode, x: Value) -> Value {
        match to {
            DType::I8 | DType::I16 => {
                let shift = if to == DType::I8 { 24 } else { 16 };
                let y = self.b.ins().ishl_imm_s(x, shift);
                self.b.ins().sshr_imm_s(y, shift)
            }
            DType::U8 | DType::U16 | DType::U32 => {
                let (_, hi) = to.int_range().expect("an integer dtype");
                let mask = self.ki(to.compute(), mode, hi as i64);
                self.b.ins().band(x, mask)
            }
            _ => x,
        }
    }
}
