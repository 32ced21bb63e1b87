//! The one implementation of tracejit's f32 `exp`, `tanh`, `sigmoid` and `erf`
//! approximations, for Rust code outside the JIT (the `tracejit-nn`
//! kernels), and the constants every form of it shares.
//!
//! Three places compute these functions: the JIT's in-line Cranelift code
//! (`tracejit-jit`'s `math` module, scalar and `f32x4`), the AVX-512 and
//! AVX2 chunk functions of staged kernels (the `simd` module), and the
//! functions here. All three follow one recipe operation for operation,
//! with the constants below declared once, and every multiply-add fused
//! (one rounding, whether it is an FMA instruction, Cranelift's `fma` or
//! [`f32::mul_add`]), so they compute the same bits for every input; only
//! the sign and payload of a NaN result may differ (any NaN stands for NaN,
//! as in the rest of the JIT). `tracejit-jit`'s `tests/kernels/agreement.rs`
//! checks this over a sweep of every binade and the special values; the
//! error bounds in the crate documentation (the ULP table) therefore hold
//! for all three.
//!
//! The recipes (see `tracejit-jit`'s `math` module for the reasoning):
//! - `exp`: Cephes `expf`: clamp to `[-104, 89]`, `n = round(x·log2 e)` by
//!   the `1.5·2^23` trick, Cody-Waite reduction `r = x − n·ln2_hi − n·ln2_lo`,
//!   a degree-5 polynomial by Estrin's scheme, and scaling by `2^n` in two
//!   factors (subnormal results round once).
//! - `tanh`: Eigen's rational (odd degree 9 / even degree 8) on the input
//!   clamped to `±8.01773357`.
//! - `sigmoid`: `e = exp(-|x|)`, then `e / (1 + e)` for `x < 0` and
//!   `1 / (1 + e)` otherwise.
//! - `erf`: Eigen's rational `x·P(x²) / Q(x²)` (odd degree 9 / even
//!   degree 12), `±1` from `|x| >= 3.832507`.
//!
//! This module is the leaf of the crate's math: scalar functions and
//! constants only. The slice forms over vector code (`simd::exp_in_place`,
//! ...) and the row softmax (`softmax::row`) build on it, never the other
//! way round.
//!
//! ```
//! use tracejit_kernels::fastmath;
//!
//! assert_eq!(fastmath::exp(0.0), 1.0);
//! assert!((fastmath::exp(1.0) - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
//! assert_eq!(fastmath::tanh(f32::INFINITY), 1.0);
//! ```

/// `exp`'s input clamp: below it the f32 result is 0 (or rounds to 0),
/// above it `inf`, so clamping changes no result and keeps `n` in range.
pub const EXP_MIN: f32 = -104.0;
/// See [`EXP_MIN`].
pub const EXP_MAX: f32 = 89.0;
/// `1.5·2^23`: adding it rounds a float of magnitude below `2^22` to an
/// integer held in the low mantissa bits.
pub const ROUND_MAGIC: f32 = 12_582_912.0;
/// The bit pattern of [`ROUND_MAGIC`]: `bits(x + magic) - this` is the
/// rounded integer, without a float-to-int conversion.
pub const ROUND_MAGIC_BITS: i32 = 0x4b40_0000;
/// `-ln 2` split in two (Cody-Waite): the high part has few mantissa bits,
/// so `n · hi` is exact for the `n` that occur.
pub const EXP_NEG_LN2_HI: f32 = -0.693_359_4;
/// The rest of `-ln 2`.
pub const EXP_NEG_LN2_LO: f32 = 2.121_944_4e-4;
/// `exp`'s polynomial `p(r)` (Cephes `expf`), highest degree first:
/// `exp(r) ≈ 1 + r + r²·p(r)`.
pub const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// `tanh`'s input clamp, where Eigen's FMA variant reaches `±1`.
pub const TANH_CLAMP: f32 = 8.017_734;
/// `tanh`'s numerator in `x²`, highest degree first:
/// `tanh(x) ≈ (x + x³·P(x²)) / Q(x²)`.
pub const TANH_P: [f32; 4] = [1.394_553_6e-8, 2.102_733_6e-5, 3.520_756_7e-3, 1.340_216_1e-1];
/// `tanh`'s denominator in `x²`, highest degree first.
pub const TANH_Q: [f32; 5] = [8.015_777e-7, 3.326_951_4e-4, 2.597_254_5e-2, 4.673_548_3e-1, 1.0];

/// `erf`'s saturation: from `|x| >= ERF_LIM` on the result is `±1`.
pub const ERF_LIM: f32 = 3.832_507;
/// `erf`'s numerator in `x²`, highest degree first (Eigen's minimax
/// rational, whose last coefficient is near `2/√π`): `erf(x) ≈ x·P(x²) /
/// Q(x²)`.
#[expect(clippy::approx_constant, reason = "Eigen's minimax coefficient, not exactly 2/sqrt(pi)")]
pub const ERF_P: [f32; 5] = [2.290_506_6e-4, 3.408_291e-3, 5.095_569_5e-2, 1.852_083_2e-1, 1.128_379_1];
/// `erf`'s denominator in `x²`, highest degree first.
pub const ERF_Q: [f32; 7] =
    [-1.179_160_3e-7, 2.354_796_6e-5, 1.017_962_5e-3, 1.407_047e-2, 1.109_850_5e-1, 4.974_692_5e-1, 1.0];

/// `x < lo ? lo : x`, then `hi < y ? hi : y`: NaN stays NaN (the
/// `maxps`/`minps` pattern of the vector forms).
#[inline(always)]
fn clamp_keep_nan(x: f32, lo: f32, hi: f32) -> f32 {
    let y = if x < lo { lo } else { x };
    if hi < y {
        hi
    } else {
        y
    }
}

/// The polynomial `coeffs` (highest degree first) at `x` by Horner's
/// rule, each step one fused multiply-add.
#[inline(always)]
fn horner(x: f32, coeffs: &[f32]) -> f32 {
    coeffs[1..].iter().fold(coeffs[0], |p, &c| p.mul_add(x, c))
}

/// `2^e` for `e` in the normal exponent range (wrapping otherwise, which
/// only happens for a NaN input, whose result is NaN anyway).
#[inline(always)]
fn pow2i(e: i32) -> f32 {
    f32::from_bits((e.wrapping_add(127) as u32) << 23)
}

/// `e^x`, at most 1 ULP from the correctly rounded result.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = clamp_keep_nan(x, EXP_MIN, EXP_MAX);
    let t = x.mul_add(std::f32::consts::LOG2_E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = n.mul_add(EXP_NEG_LN2_HI, x);
    let r = n.mul_add(EXP_NEG_LN2_LO, r);
    // Estrin's scheme, pairing coefficients from the lowest degree up.
    let [c5, c4, c3, c2, c1, c0] = EXP_POLY;
    let t0 = c1.mul_add(r, c0);
    let t1 = c3.mul_add(r, c2);
    let t2 = c5.mul_add(r, c4);
    let r2 = r * r;
    let t01 = t1.mul_add(r2, t0);
    let r4 = r2 * r2;
    let p = t2.mul_add(r4, t01);
    let y = p.mul_add(r2, r) + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC_BITS);
    let e1 = ni >> 1;
    let e2 = ni.wrapping_sub(e1);
    y * pow2i(e1) * pow2i(e2)
}

/// `tanh(x)`, at most 4 ULP from the correctly rounded result.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let x = clamp_keep_nan(x, -TANH_CLAMP, TANH_CLAMP);
    let x2 = x * x;
    let x3 = x2 * x;
    x3.mul_add(horner(x2, &TANH_P), x) / horner(x2, &TANH_Q)
}

/// `1 / (1 + e^-x)`, at most 2 ULP from the correctly rounded result.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let num = if x < 0.0 { e } else { 1.0 };
    num / (1.0 + e)
}

/// `erf(x)`, at most 6 ULP from the correctly rounded result (its worst
/// input, 3.4492028, found by checking every f32 in `[0, 4]`).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x2 = x * x;
    let r = x * horner(x2, &ERF_P) / horner(x2, &ERF_Q);
    if ERF_LIM <= x.abs() {
        1.0f32.copysign(x)
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan() && tanh(f32::NAN).is_nan() && sigmoid(f32::NAN).is_nan());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
