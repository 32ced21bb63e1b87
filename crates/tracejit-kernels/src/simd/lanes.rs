//! The vector operations the chunk recipes need, for AVX2 (`__m256`, 8
//! lanes) and AVX-512 (`__m512`, 16 lanes), so each recipe is written once
//! and both widths compute the same bits: every method is the same IEEE
//! operation lane by lane, and `min`/`max` keep x86's rule (the second
//! operand when either is NaN) at both widths.
//!
//! The methods are `#[inline(always)]` without target features of their
//! own: they compile into the `#[target_feature]` entry points that use
//! them (`simd::avx2`, `simd::avx512`, `softmax`), which is where
//! the intrinsics become instructions.

use std::arch::x86_64::*;

/// A vector of f32 lanes.
///
/// # Safety
/// Every method needs the CPU features of its width (AVX2 + FMA, or
/// AVX-512F) enabled in the function it is inlined into; `load`/`store`
/// need `LANES` readable/writable f32 values at the pointer.
#[expect(clippy::missing_safety_doc, reason = "the trait's Safety section covers every method")]
pub trait Lanes: Copy {
    /// f32 values per vector.
    const LANES: usize;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;
    /// Every lane 0.
    unsafe fn zero() -> Self;
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// Writes the lanes to `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    /// `self + b` per lane.
    unsafe fn add(self, b: Self) -> Self;
    /// `self - b` per lane.
    unsafe fn sub(self, b: Self) -> Self;
    /// `self * b` per lane.
    unsafe fn mul(self, b: Self) -> Self;
    /// `self / b` per lane.
    unsafe fn div(self, b: Self) -> Self;
    /// `vminps self, b`: `b` when either is NaN.
    unsafe fn min(self, b: Self) -> Self;
    /// `vmaxps self, b`: `b` when either is NaN.
    unsafe fn max(self, b: Self) -> Self;
    /// `self * b + c`, rounded once.
    unsafe fn fma(self, b: Self, c: Self) -> Self;
    /// `|self|` (sign bit cleared).
    unsafe fn abs(self) -> Self;
    /// `-self` (sign bit flipped).
    unsafe fn neg(self) -> Self;
    /// Per lane: `a` where `self < 0`, else `b`.
    unsafe fn where_negative(self, a: Self, b: Self) -> Self;
    /// The two powers of two whose product scales exp's polynomial:
    /// `n = bits(t) - bits(ROUND_MAGIC)` split as `n/2` (arithmetic shift)
    /// and the rest, each as `2^e`.
    unsafe fn exp_scales(t: Self, magic_bits: i32) -> (Self, Self);
    /// All-ones lanes where `self` is NaN, or-ed into `acc`.
    unsafe fn or_nan(self, acc: Self) -> Self;
    /// Any lane with a bit set.
    unsafe fn any(self) -> bool;
}

/// Eight lanes of AVX2 + FMA.
impl Lanes for __m256 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm256_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm256_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm256_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm256_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm256_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm256_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fma(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        unsafe { _mm256_xor_ps(self, _mm256_set1_ps(-0.0)) }
    }
    #[inline(always)]
    unsafe fn where_negative(self, a: Self, b: Self) -> Self {
        unsafe { _mm256_blendv_ps(b, a, _mm256_cmp_ps::<_CMP_LT_OQ>(self, _mm256_setzero_ps())) }
    }
    #[inline(always)]
    unsafe fn exp_scales(t: Self, magic_bits: i32) -> (Self, Self) {
        unsafe {
            let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(magic_bits));
            let e1 = _mm256_srai_epi32(ni, 1);
            let e2 = _mm256_sub_epi32(ni, e1);
            let bias = _mm256_set1_epi32(127);
            let s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
            let s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
            (s1, s2)
        }
    }
    #[inline(always)]
    unsafe fn or_nan(self, acc: Self) -> Self {
        unsafe { _mm256_or_ps(acc, _mm256_cmp_ps::<_CMP_UNORD_Q>(self, self)) }
    }
    #[inline(always)]
    unsafe fn any(self) -> bool {
        unsafe { _mm256_movemask_ps(self) != 0 }
    }
}

/// Sixteen lanes of AVX-512F (only F: the bitwise float ops go through
/// the integer forms, which F has).
impl Lanes for __m512 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm512_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm512_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm512_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm512_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm512_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm512_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fma(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe { _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(self), _mm512_set1_epi32(i32::MAX))) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        unsafe { _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(self), _mm512_set1_epi32(i32::MIN))) }
    }
    #[inline(always)]
    unsafe fn where_negative(self, a: Self, b: Self) -> Self {
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, _mm512_setzero_ps()), b, a) }
    }
    #[inline(always)]
    unsafe fn exp_scales(t: Self, magic_bits: i32) -> (Self, Self) {
        unsafe {
            let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(magic_bits));
            let e1 = _mm512_srai_epi32::<1>(ni);
            let e2 = _mm512_sub_epi32(ni, e1);
            let bias = _mm512_set1_epi32(127);
            let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(e1, bias)));
            let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(e2, bias)));
            (s1, s2)
        }
    }
    #[inline(always)]
    unsafe fn or_nan(self, acc: Self) -> Self {
        unsafe {
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self, self);
            _mm512_mask_mov_ps(acc, nan, _mm512_castsi512_ps(_mm512_set1_epi32(-1)))
        }
    }
    #[inline(always)]
    unsafe fn any(self) -> bool {
        unsafe {
            let v = _mm512_castps_si512(self);
            _mm512_test_epi32_mask(v, v) != 0
        }
    }
}
