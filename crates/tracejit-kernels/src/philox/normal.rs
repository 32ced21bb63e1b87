//! Box-Muller in plain f64 arithmetic: the normals' one implementation.
//!
//! `ln`, `sin` and `cos` are fdlibm's recipes (Sun, 1993, as in musl:
//! `log.c`, `__sin.c`, `__cos.c`) without their special cases, which the
//! inputs here never reach, and `sqrt` is the IEEE operation. Every step is
//! an IEEE add, subtract, multiply, divide or square root (Rust never fuses
//! or reorders them) or integer work on the bits, so the results are the
//! same bits wherever the code runs: in scalar code, in the vector code
//! LLVM makes of the same loop inside the AVX2 and AVX-512 entry points,
//! and on any other machine, independent of its libm. The functions are
//! accurate to about 1 ulp (checked against `std` in the tests).
//!
//! The angle needs no general range reduction: `2π u2` with `u2` in
//! `(0, 1]` is `q` quarter turns plus `(4 u2 - q) π/2` for the nearest
//! integer `q`, and `4 u2 - q` is exact.

use super::{pair_u64, unit_f32, unit_f64};

/// A normal element type: how the words of whole blocks become normals.
pub(super) trait Normal: Copy + Default {
    /// Elements per block.
    const PER_BLOCK: usize;
    /// The normals of the blocks in `words`, `out.len()` being
    /// `words.len() / 4 · PER_BLOCK`.
    fn from_words(words: &[u32], out: &mut [Self]);
}

impl Normal for f32 {
    const PER_BLOCK: usize = 4;
    #[inline(always)]
    fn from_words(words: &[u32], out: &mut [f32]) {
        // Words 2p and 2p + 1 are u1 and u2 of elements 2p and 2p + 1.
        for (w, z) in words.chunks_exact(2).zip(out.chunks_exact_mut(2)) {
            // 1 - u is exact: u is a multiple of 2^-23 below 1.
            let open = |w: u32| 1.0 - f64::from(unit_f32(w));
            let (z0, z1) = box_muller(open(w[0]), open(w[1]));
            z[0] = z0 as f32;
            z[1] = z1 as f32;
        }
    }
}

impl Normal for f64 {
    const PER_BLOCK: usize = 2;
    #[inline(always)]
    fn from_words(words: &[u32], out: &mut [f64]) {
        // A block's two u64 halves are u1 and u2 of its two elements.
        for (w, z) in words.chunks_exact(4).zip(out.chunks_exact_mut(2)) {
            // 1 - u is exact: u is a multiple of 2^-52 below 1.
            let open = |lo: u32, hi: u32| 1.0 - unit_f64(pair_u64(lo, hi));
            let (z0, z1) = box_muller(open(w[0], w[1]), open(w[2], w[3]));
            z[0] = z0;
            z[1] = z1;
        }
    }
}

/// `(sqrt(-2 ln u1) cos 2πu2, sqrt(-2 ln u1) sin 2πu2)` for `u1` and `u2`
/// in `(0, 1]`, `u1` at least 2^-1022.
#[inline(always)]
pub(super) fn box_muller(u1: f64, u2: f64) -> (f64, f64) {
    let r = (-2.0 * ln(u1)).sqrt();
    let (s, c) = sin_cos_turns(u2);
    (r * c, r * s)
}

/// `ln x` for positive, normal, finite `x` (fdlibm's `log`).
#[inline(always)]
pub(super) fn ln(x: f64) -> f64 {
    const LN2_HI: f64 = 0.6931471803691238;
    const LN2_LO: f64 = 1.9082149292705877e-10;
    // |(ln(1 + s) - ln(1 - s)) / s - Lg(s)| < 2^-58.45.
    const LG: [f64; 7] = [
        0.6666666666666735,
        0.3999999999940942,
        0.2857142874366239,
        0.22222198432149784,
        0.1818357216161805,
        0.15313837699209373,
        0.14798198605116586,
    ];
    // x = 2^k · m with m in [sqrt(2)/2, sqrt(2)): adding 0x3ff00000 -
    // 0x3fe6a09e to the high word carries into the exponent exactly when
    // the mantissa is at least sqrt(2)'s, and the mantissa is then
    // re-based on sqrt(2)/2's high word.
    let h = x.to_bits() + ((0x3ff0_0000u64 - 0x3fe6_a09e) << 32);
    let m = f64::from_bits((h & 0x000f_ffff_ffff_ffff) + (0x3fe6_a09eu64 << 32));
    // k as a float without an int-to-float conversion (AVX2 has none for
    // 64-bit lanes): 2^52 + (k + 1023) exactly, minus 2^52 + 1023.
    let k = f64::from_bits(0x4330_0000_0000_0000 | (h >> 52)) - (4_503_599_627_370_496.0 + 1023.0);
    let f = m - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG[1] + w * (LG[3] + w * LG[5]));
    let t2 = z * (LG[0] + w * (LG[2] + w * (LG[4] + w * LG[6])));
    s * (hfsq + (t2 + t1)) + k * LN2_LO - hfsq + f + k * LN2_HI
}

/// `(sin 2πu, cos 2πu)` for `u` in `[0, 1]`.
#[inline(always)]
pub(super) fn sin_cos_turns(u: f64) -> (f64, f64) {
    /// 1.5 · 2^52: adding it rounds a small float to an integer.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    let t = 4.0 * u;
    let q = (t + ROUND) - ROUND;
    // Exact (Sterbenz), and |x| <= π/4.
    let x = (t - q) * std::f64::consts::FRAC_PI_2;
    let (s, c) = (sin_kernel(x), cos_kernel(x));
    // sin and cos of q quarter turns plus x, q in 0..=4.
    let odd = q == 1.0 || q == 3.0;
    let (s, c) = if odd { (c, s) } else { (s, c) };
    let s = if q == 2.0 || q == 3.0 { -s } else { s };
    let c = if q == 1.0 || q == 2.0 { -c } else { c };
    (s, c)
}

/// `sin x` for `|x| <= π/4` (fdlibm's `__kernel_sin` without a tail).
#[inline(always)]
fn sin_kernel(x: f64) -> f64 {
    const S: [f64; 6] = [
        -0.16666666666666632,
        0.00833333333332249,
        -0.0001984126982985795,
        2.7557313707070068e-06,
        -2.5050760253406863e-08,
        1.58969099521155e-10,
    ];
    let z = x * x;
    let v = z * x;
    let r = S[1] + z * (S[2] + z * (S[3] + z * (S[4] + z * S[5])));
    x + v * (S[0] + z * r)
}

/// `cos x` for `|x| <= π/4` (fdlibm's `__kernel_cos` without a tail).
#[inline(always)]
fn cos_kernel(x: f64) -> f64 {
    const C: [f64; 6] = [
        0.0416666666666666,
        -0.001388888888887411,
        2.480158728947673e-05,
        -2.7557314351390663e-07,
        2.087572321298175e-09,
        -1.1359647557788195e-11,
    ];
    let z = x * x;
    let w = z * z;
    let r = z * (C[0] + z * (C[1] + z * C[2])) + w * w * (C[3] + z * (C[4] + z * C[5]));
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    w + (((1.0 - w) - hz) + z * r)
}
