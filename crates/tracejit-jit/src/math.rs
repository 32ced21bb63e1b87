//! In-kernel approximations of the f32 transcendentals `exp`, `log`, `tanh`,
//! `sigmoid` and `erf`, emitted as straight-line Cranelift code that works on
//! scalars and on `f32x4` alike (no libm call per element).
//!
//! The recipes (see `CODEGEN_NOTES.md`):
//! - `exp`: Cephes `expf`: `n = round(x·log2 e)`, Cody-Waite reduction
//!   `r = x − n·C1 − n·C2`, degree-5 polynomial (by Estrin's scheme),
//!   then scaling by `2^n` split into two factors so that subnormal results
//!   round once (`n` is found with the `1.5·2^23` rounding trick, which also
//!   gives it as an integer) and overflow gives `inf` exactly where `exp`
//!   does. The argument is clamped to `[-104, 89]`, beyond which the f32
//!   result is 0 or `inf`.
//! - `log`: Eigen `plog_float`: `frexp` with subnormal inputs normalized
//!   first, mantissa moved to `[√½, √2)`, a (3,3) rational approximation of
//!   `log(1+m)`, plus `e·ln 2`; `log(±0) = -inf`, `log(x<0) = NaN`,
//!   `log(inf) = inf`.
//! - `tanh`: Eigen's fast rational (odd degree 9 / even degree 8) on the input
//!   clamped to ±8.01773357 (the FMA variant's clamp, where it reaches ±1).
//! - `sigmoid`: the reference's formula on the approximated `exp`:
//!   `e = exp(-|x|)`, then `e / (1 + e)` for `x < 0` and `1 / (1 + e)` else.
//! - `erf`: Eigen `generic_fast_erf_float`: odd 9 / even 12 rational, `±1`
//!   beyond |x| ≥ 3.8325.
//!
//! The constants of `exp`, `tanh`, `sigmoid` and `erf` are declared once, in
//! `fastmath`, which also holds the same recipes as Rust code; the vector
//! chunk functions (`tracejit_kernels::simd`, 256- and 512-bit) are a third form. All three compute the
//! same bits (`tests/kernels/agreement.rs`).
//!
//! NaN inputs give NaN and `-0.0` keeps its sign where the function is odd.
//! The measured error bounds are in the crate documentation and enforced by
//! the `ulp` test. FMA is used freely here: these are approximations with a
//! documented bound, unlike user arithmetic, which is never contracted.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use tracejit_ir::tensor::DType;

use crate::clif_ops::{Emit, Mode};
use tracejit_kernels::fastmath::{
    ERF_LIM, ERF_P, ERF_Q, EXP_MAX, EXP_MIN, EXP_NEG_LN2_HI, EXP_NEG_LN2_LO, EXP_POLY, ROUND_MAGIC, ROUND_MAGIC_BITS,
    TANH_CLAMP, TANH_P, TANH_Q,
};

const F: DType = DType::F32;

impl Emit<'_, '_> {
    // Constants come from memory at their use (`kmem`): a polynomial's
    // coefficients would otherwise fill the registers and spill in the loop.
    fn c(&mut self, mode: Mode, x: f32) -> Value {
        self.cbits(mode, x.to_bits())
    }

    fn cbits(&mut self, mode: Mode, bits: u32) -> Value {
        let ty = self.ty(F, mode);
        self.kmem(ty, u64::from(bits))
    }

    fn ci(&mut self, mode: Mode, x: i32) -> Value {
        let ty = self.ty(DType::I32, mode);
        self.kmem(ty, u64::from(x as u32))
    }

    fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.b.ins().fma(a, b, c)
    }

    /// Horner's rule with constant coefficients, highest degree first.
    fn horner(&mut self, mode: Mode, x: Value, coeffs: &[f32]) -> Value {
        let mut p = self.c(mode, coeffs[0]);
        for &k in &coeffs[1..] {
            let kk = self.c(mode, k);
            p = self.fma(p, x, kk);
        }
        p
    }

    /// A polynomial in `x` (constant coefficients, highest degree first) by
    /// Estrin's scheme: the same value as Horner's rule up to rounding, but
    /// a dependency chain of `log2(n)` steps instead of `n`, for long
    /// chains. Measured here: `exp` 1.18 -> 1.12 ns/element (softmax 1.84
    /// -> 1.77), while tanh's two short polynomials, already evaluated side
    /// by side, got slower (gelu 1.21 -> 1.33), so they keep Horner's rule.
    fn estrin(&mut self, mode: Mode, x: Value, coeffs: &[f32]) -> Value {
        // Lowest degree first: c0 + c1 x + c2 x^2 + ...
        let mut terms: Vec<Value> = Vec::new();
        let low_first: Vec<f32> = coeffs.iter().rev().copied().collect();
        for pair in low_first.chunks(2) {
            let c0 = self.c(mode, pair[0]);
            terms.push(match pair.get(1) {
                Some(&c1) => {
                    let c1 = self.c(mode, c1);
                    self.fma(c1, x, c0)
                }
                None => c0,
            });
        }
        let mut power = x;
        while terms.len() > 1 {
            power = self.b.ins().fmul(power, power);
            terms = terms
                .chunks(2)
                .map(|pair| match pair {
                    [a, b] => self.fma(*b, power, *a),
                    [a] => *a,
                    _ => unreachable!(),
                })
                .collect();
        }
        terms[0]
    }

    /// `x` clamped into `[lo, hi]`, NaN kept (the `maxps`/`minps` pattern).
    fn clamp_keep_nan(&mut self, mode: Mode, x: Value, lo: f32, hi: f32) -> Value {
        let lo = self.c(mode, lo);
        let hi = self.c(mode, hi);
        // Written as `x < lo ? lo : x` and `hi < y ? hi : y`, the shapes
        // Cranelift lowers to one `maxps` / `minps` (which return the second
        // operand, `x` or `y`, when it is NaN).
        let m = self.fcmp(FloatCC::LessThan, x, lo);
        let y = self.sel(m, lo, x);
        let m = self.fcmp(FloatCC::LessThan, hi, y);
        self.sel(m, hi, y)
    }

    /// `2^e` for an integer vector/scalar `e` in the normal exponent range.
    fn pow2i(&mut self, mode: Mode, e: Value) -> Value {
        let bias = self.ci(mode, 127);
        let biased = self.b.ins().iadd(e, bias);
        let bits = self.b.ins().ishl_imm_s(biased, 23);
        let fty = self.ty(F, mode);
        self.bitcast(fty, bits)
    }

    /// Approximate `exp(x)` for f32.
    pub fn exp_f32(&mut self, mode: Mode, x: Value) -> Value {
        let x = self.clamp_keep_nan(mode, x, EXP_MIN, EXP_MAX);
        // n = round(x·log2 e) by the 1.5·2^23 trick: adding the magic number
        // rounds to an integer in the low mantissa bits, so the integer n is
        // also the difference of the bit patterns (no float->int conversion).
        let log2e = self.c(mode, std::f32::consts::LOG2_E);
        let magic = self.c(mode, ROUND_MAGIC);
        let t = self.fma(x, log2e, magic);
        let n = self.b.ins().fsub(t, magic);
        let mc1 = self.c(mode, EXP_NEG_LN2_HI);
        let mc2 = self.c(mode, EXP_NEG_LN2_LO);
        let r = self.fma(n, mc1, x);
        let r = self.fma(n, mc2, r);
        let p = self.estrin(mode, r, &EXP_POLY);
        let r2 = self.b.ins().fmul(r, r);
        let y = self.fma(p, r2, r);
        let one = self.c(mode, 1.0);
        let y = self.b.ins().fadd(y, one);
        let ity = self.ty(DType::I32, mode);
        let tb = self.bitcast(ity, t);
        let magic_bits = self.ci(mode, ROUND_MAGIC_BITS);
        let ni = self.b.ins().isub(tb, magic_bits);
        let e1 = self.b.ins().sshr_imm_s(ni, 1);
        let e2 = self.b.ins().isub(ni, e1);
        let s1 = self.pow2i(mode, e1);
        let s2 = self.pow2i(mode, e2);
        let y = self.b.ins().fmul(y, s1);
        self.b.ins().fmul(y, s2)
    }

    /// Approximate natural `log(x)` for f32.
    pub fn log_f32(&mut self, mode: Mode, x: Value) -> Value {
        let fty = self.ty(F, mode);
        let ity = self.ty(DType::I32, mode);
        // frexp: normalize subnormals by 2^24 first.
        let min_normal = self.c(mode, f32::MIN_POSITIVE);
        let is_den = self.fcmp(FloatCC::LessThan, x, min_normal);
        let scale = self.c(mode, 16_777_216.0);
        let xs = self.b.ins().fmul(x, scale);
        let xn = self.sel(is_den, xs, x);
        let bits = self.bitcast(ity, xn);
        let eb = self.b.ins().ushr_imm_s(bits, 23);
        let mask_ff = self.ci(mode, 0xff);
        let eb = self.b.ins().band(eb, mask_ff);
        let off_norm = self.ci(mode, 126);
        let off_den = self.ci(mode, 126 + 24);
        let off = match mode {
            Mode::Vector => {
                let is_den_i = self.bitcast(ity, is_den);
                self.b.ins().bitselect(is_den_i, off_den, off_norm)
            }
            Mode::Scalar => self.b.ins().select(is_den, off_den, off_norm),
        };
        let ei = self.b.ins().isub(eb, off);
        let e = self.b.ins().fcvt_from_sint(fty, ei);
        let mant_mask = self.ci(mode, 0x807f_ffff_u32 as i32);
        let half_bits = self.ci(mode, 0x3f00_0000);
        let mb = self.b.ins().band(bits, mant_mask);
        let mb = self.b.ins().bor(mb, half_bits);
        let m = self.bitcast(fty, mb);
        // Move m to [sqrt(1/2), sqrt(2)) and subtract 1.
        let sqrthf = self.c(mode, std::f32::consts::FRAC_1_SQRT_2);
        let lt = self.fcmp(FloatCC::LessThan, m, sqrthf);
        let zero = self.c(mode, 0.0);
        let one = self.c(mode, 1.0);
        let tmp = self.sel(lt, m, zero);
        let dec = self.sel(lt, one, zero);
        let m = self.b.ins().fsub(m, one);
        let e = self.b.ins().fsub(e, dec);
        let m = self.b.ins().fadd(m, tmp);
        // Rational (3,3) approximation of log(1 + m).
        let p = self.horner(mode, m, &[0.182_562_96, 1.000_000_1, 1.000_000_1]);
        let p = self.b.ins().fmul(m, p);
        let q = self.horner(mode, m, &[0.049_616_248, 0.599_232_5, 1.5, 1.0]);
        let r = self.b.ins().fdiv(p, q);
        let ln2 = self.c(mode, std::f32::consts::LN_2);
        let r = self.fma(e, ln2, r);
        // Special inputs.
        let inf = self.c(mode, f32::INFINITY);
        let is_inf = self.fcmp(FloatCC::Equal, x, inf);
        let r = self.sel(is_inf, inf, r);
        let invalid = self.fcmp(FloatCC::UnorderedOrLessThan, x, zero);
        let nan = self.cbits(mode, 0x7fc0_0000);
        let r = self.sel(invalid, nan, r);
        let is_zero = self.fcmp(FloatCC::Equal, x, zero);
        let minf = self.c(mode, f32::NEG_INFINITY);
        self.sel(is_zero, minf, r)
    }

    /// Approximate `tanh(x)` for f32.
    pub fn tanh_f32(&mut self, mode: Mode, x: Value) -> Value {
        let x = self.clamp_keep_nan(mode, x, -TANH_CLAMP, TANH_CLAMP);
        let x2 = self.b.ins().fmul(x, x);
        let x3 = self.b.ins().fmul(x2, x);
        let p = self.horner(mode, x2, &TANH_P);
        let q = self.horner(mode, x2, &TANH_Q);
        let p = self.fma(x3, p, x);
        self.b.ins().fdiv(p, q)
    }

    /// Approximate `sigmoid(x) = 1 / (1 + exp(-x))` for f32.
    pub fn sigmoid_f32(&mut self, mode: Mode, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        let na = self.b.ins().fneg(a);
        let e = self.exp_f32(mode, na);
        let one = self.c(mode, 1.0);
        let den = self.b.ins().fadd(one, e);
        let zero = self.c(mode, 0.0);
        let neg = self.fcmp(FloatCC::LessThan, x, zero);
        let num = self.sel(neg, e, one);
        self.b.ins().fdiv(num, den)
    }

    /// Approximate `erf(x)` for f32 (`fastmath::erf`).
    pub fn erf_f32(&mut self, mode: Mode, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        let lim = self.c(mode, ERF_LIM);
        let big = self.fcmp(FloatCC::LessThanOrEqual, lim, a);
        let x2 = self.b.ins().fmul(x, x);
        let p = self.horner(mode, x2, &ERF_P);
        let p = self.b.ins().fmul(x, p);
        let q = self.horner(mode, x2, &ERF_Q);
        let r = self.b.ins().fdiv(p, q);
        // sign(x) as ±1.
        let ity = self.ty(DType::I32, mode);
        let fty = self.ty(F, mode);
        let xi = self.bitcast(ity, x);
        let sign_mask = self.ci(mode, i32::MIN);
        let one_bits = self.ci(mode, 0x3f80_0000);
        let s = self.b.ins().band(xi, sign_mask);
        let s = self.b.ins().bor(s, one_bits);
        let s = self.bitcast(fty, s);
        self.sel(big, s, r)
    }
}
