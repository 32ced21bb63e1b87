//! f32 `exp`, `tanh` and `sigmoid` over a chunk of memory, in place, with
//! 256-bit AVX2 + FMA code compiled by rustc.
//!
//! Why: Cranelift lowers 128-bit vectors only, and these functions are most
//! of the work of the regions that use them (gelu, softmax, LSTM gates).
//! On this machine the same tanh recipe runs 1.04 ns/element with 128-bit
//! code and 0.55 with 256-bit code. A kernel therefore stores the argument
//! of such a function into a scratch chunk, calls one of these, and reads
//! the results back (see `kernel.rs`, "staged" nodes).
//!
//! The recipes are exactly those of [`crate::math`] (the constants of
//! [`crate::fastmath`], same operation order, same FMAs, Estrin's scheme for
//! exp's polynomial), so a staged kernel computes the same bits as the
//! in-kernel code and as `fastmath`, and the documented ULP bounds hold for
//! all three (`tests/agreement.rs`). The tail of a chunk that does not
//! fill a vector is padded, computed as a vector and copied back.
//!
//! Only x86_64 CPUs with AVX2 and FMA get these; elsewhere kernels compute
//! everything in-line.

use tracejit_ir::tensor::UnaryOp;

/// A chunk function: `p[i] = f(p[i])` for `i < n`.
pub(crate) type ChunkFn = unsafe extern "C" fn(*mut f32, i64);

/// The chunk function for `op` on this CPU, with its symbol name.
pub(crate) fn chunk_fn(op: UnaryOp) -> Option<(&'static str, ChunkFn)> {
    #[cfg(target_arch = "x86_64")]
    {
        if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
            return None;
        }
        match op {
            UnaryOp::Exp => Some(("tracejit_chunk_exp_f32", avx2::exp_chunk as ChunkFn)),
            UnaryOp::Tanh => Some(("tracejit_chunk_tanh_f32", avx2::tanh_chunk as ChunkFn)),
            UnaryOp::Sigmoid => Some(("tracejit_chunk_sigmoid_f32", avx2::sigmoid_chunk as ChunkFn)),
            // No 256-bit version: computed in-line or by a helper.
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
            | UnaryOp::Erf
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Sinh
            | UnaryOp::Cosh
            | UnaryOp::Softplus
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::LogicalNot
            | UnaryOp::IsNan
            | UnaryOp::IsFinite => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = op;
        None
    }
}

/// Every chunk function this CPU has: (symbol name, address).
pub(crate) fn symbols() -> Vec<(&'static str, *const u8)> {
    [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid]
        .into_iter()
        .filter_map(chunk_fn)
        .map(|(name, f)| (name, f as *const u8))
        .collect()
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use crate::fastmath::{
        EXP_MAX, EXP_MIN, EXP_NEG_LN2_HI, EXP_NEG_LN2_LO, EXP_POLY, ROUND_MAGIC, ROUND_MAGIC_BITS, TANH_CLAMP, TANH_P,
        TANH_Q,
    };

    /// Eight f32 lanes.
    pub(crate) type V = __m256;

    #[inline(always)]
    unsafe fn k(x: f32) -> V {
        // SAFETY: AVX is enabled in every caller.
        unsafe { _mm256_set1_ps(x) }
    }

    /// `x < lo ? lo : x`, then `hi < y ? hi : y` (NaN kept): `maxps` /
    /// `minps` return their second operand when either is NaN.
    #[inline(always)]
    unsafe fn clamp(x: V, lo: f32, hi: f32) -> V {
        // SAFETY: AVX is enabled in every caller.
        unsafe { _mm256_min_ps(k(hi), _mm256_max_ps(k(lo), x)) }
    }

    #[inline(always)]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        // SAFETY: FMA is enabled in every caller.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    /// `math::exp_f32`, `fastmath::exp`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, enabled in the caller.
    #[inline(always)]
    pub(crate) unsafe fn exp(x: V) -> V {
        // SAFETY: AVX2 and FMA are enabled in every caller.
        unsafe {
            let x = clamp(x, EXP_MIN, EXP_MAX);
            let magic = k(ROUND_MAGIC);
            let t = fma(x, k(std::f32::consts::LOG2_E), magic);
            let n = _mm256_sub_ps(t, magic);
            let r = fma(n, k(EXP_NEG_LN2_HI), x);
            let r = fma(n, k(EXP_NEG_LN2_LO), r);
            // Estrin, pairing coefficients from the lowest degree up.
            let [c5, c4, c3, c2, c1, c0] = EXP_POLY;
            let t0 = fma(k(c1), r, k(c0));
            let t1 = fma(k(c3), r, k(c2));
            let t2 = fma(k(c5), r, k(c4));
            let r2 = _mm256_mul_ps(r, r);
            let t01 = fma(t1, r2, t0);
            let r4 = _mm256_mul_ps(r2, r2);
            let p = fma(t2, r4, t01);
            let y = fma(p, r2, r);
            let y = _mm256_add_ps(y, k(1.0));
            let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND_MAGIC_BITS));
            let e1 = _mm256_srai_epi32(ni, 1);
            let e2 = _mm256_sub_epi32(ni, e1);
            let bias = _mm256_set1_epi32(127);
            let s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
            let s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
            _mm256_mul_ps(_mm256_mul_ps(y, s1), s2)
        }
    }

    /// `math::tanh_f32`, `fastmath::tanh`.
    #[inline(always)]
    unsafe fn tanh(x: V) -> V {
        // SAFETY: AVX2 and FMA are enabled in every caller.
        unsafe {
            let x = clamp(x, -TANH_CLAMP, TANH_CLAMP);
            let x2 = _mm256_mul_ps(x, x);
            let x3 = _mm256_mul_ps(x2, x);
            let mut p = k(TANH_P[0]);
            for c in &TANH_P[1..] {
                p = fma(p, x2, k(*c));
            }
            let mut q = k(TANH_Q[0]);
            for c in &TANH_Q[1..] {
                q = fma(q, x2, k(*c));
            }
            let p = fma(x3, p, x);
            _mm256_div_ps(p, q)
        }
    }

    /// `math::sigmoid_f32`, `fastmath::sigmoid`.
    #[inline(always)]
    unsafe fn sigmoid(x: V) -> V {
        // SAFETY: AVX2 and FMA are enabled in every caller.
        unsafe {
            let a = _mm256_andnot_ps(k(-0.0), x);
            let na = _mm256_xor_ps(a, k(-0.0));
            let e = exp(na);
            let den = _mm256_add_ps(k(1.0), e);
            let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x, k(0.0));
            let num = _mm256_blendv_ps(k(1.0), e, neg);
            _mm256_div_ps(num, den)
        }
    }

    /// Applies `f` to `n` values at `p`, eight at a time; the last partial
    /// vector goes through a padded copy.
    #[inline(always)]
    unsafe fn apply(p: *mut f32, n: i64, f: impl Fn(V) -> V) {
        let n = usize::try_from(n).unwrap_or(0);
        let mut i = 0;
        // SAFETY: the caller passes `n` valid, writable f32 values at `p`;
        // AVX is enabled in every caller.
        unsafe {
            while i + 8 <= n {
                let v = _mm256_loadu_ps(p.add(i));
                _mm256_storeu_ps(p.add(i), f(v));
                i += 8;
            }
            if i < n {
                let mut tail = [0.0f32; 8];
                std::ptr::copy_nonoverlapping(p.add(i), tail.as_mut_ptr(), n - i);
                let v = f(_mm256_loadu_ps(tail.as_ptr()));
                _mm256_storeu_ps(tail.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(tail.as_ptr(), p.add(i), n - i);
            }
        }
    }

    macro_rules! chunk {
        ($name:ident, $f:ident) => {
            /// In place over `n` f32 values at `p`.
            ///
            /// # Safety
            /// `p` addresses `n` writable f32 values; the CPU has AVX2 and
            /// FMA ([`super::chunk_fn`] hands it out only then).
            #[target_feature(enable = "avx2,fma")]
            pub(super) unsafe extern "C" fn $name(p: *mut f32, n: i64) {
                // SAFETY: forwarded from the caller.
                unsafe { apply(p, n, |v| $f(v)) }
            }
        };
    }
    chunk!(exp_chunk, exp);
    chunk!(tanh_chunk, tanh);
    chunk!(sigmoid_chunk, sigmoid);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunk functions agree with the in-kernel code bit for bit is
    /// checked by the ULP and region tests; here: NaN, the tail path and the
    /// special values.
    #[test]
    fn chunks_handle_tails_and_specials() {
        for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid] {
            let Some((_, f)) = chunk_fn(op) else { return };
            let mut v: Vec<f32> =
                vec![f32::NAN, 0.0, -0.0, 1.0, -1.0, 100.0, -100.0, f32::INFINITY, f32::NEG_INFINITY, 0.5, 3.0];
            let want: Vec<f64> = v
                .iter()
                .map(|&x| {
                    let x = f64::from(x);
                    let y = if op == UnaryOp::Exp {
                        x.exp()
                    } else if op == UnaryOp::Tanh {
                        x.tanh()
                    } else {
                        1.0 / (1.0 + (-x).exp())
                    };
                    // Rounded to f32: exp(100) overflows to inf there.
                    f64::from(y as f32)
                })
                .collect();
            // SAFETY: `v` holds `v.len()` f32 values.
            unsafe { f(v.as_mut_ptr(), v.len() as i64) };
            for (g, w) in v.iter().zip(&want) {
                let g = f64::from(*g);
                let ok = (g.is_nan() && w.is_nan()) || g == *w || (g - w).abs() <= 1e-6 * w.abs().max(1e-30);
                assert!(ok || (w.abs() < 1e-38 && g.abs() < 1e-38), "{op:?}: {g} vs {w}");
            }
        }
    }
}
