//! f32 ⇄ bf16 over slices, with the bits of `half::bf16::from_f32` and
//! `to_f32`: f32 to bf16 rounds to nearest even over the whole range (a
//! NaN stays a NaN, made quiet, with its sign and top payload bits; ±Inf
//! stays ±Inf; subnormals round like any value), bf16 to f32 is exact.
//!
//! The vector path converts 32 values per `vcvtne2ps2bf16`, which rounds
//! the same way except that it flushes subnormal inputs to zero (checked
//! on this Zen 4 against `half` over 6.4 M random bit patterns: only
//! subnormals differ); the few registers holding a subnormal are redone
//! with the integer form of the rounding, so every value keeps `half`'s
//! bits.

use half::bf16;

use crate::{Isa, Width};

/// Rounds `src` to bf16 into `dst`, with the bits of
/// [`half::bf16::from_f32`] for every input (nearest even; NaN quiet;
/// ±Inf kept; subnormals kept), 32 values per `vcvtne2ps2bf16` where
/// `isa` has AVX-512 BF16, 8 per AVX2 register where it has AVX2.
///
/// ```
/// use half::bf16;
/// use tracejit_kernels::{bf16::f32_to_bf16_slice, Isa};
///
/// let src = [1.0f32, 1.0 + 1.0 / 256.0, f32::INFINITY, 1e-40];
/// let mut dst = [bf16::ZERO; 4];
/// f32_to_bf16_slice(&src, &mut dst, Isa::native());
/// assert_eq!(dst[0].to_f32(), 1.0);
/// assert_eq!(dst[1].to_f32(), 1.0); // a tie, to the even neighbour
/// assert_eq!(dst[2], bf16::INFINITY);
/// assert_eq!(dst[3], bf16::from_f32(1e-40)); // subnormals kept
/// ```
///
/// # Panics
/// If the slices' lengths differ.
pub fn f32_to_bf16_slice(src: &[f32], dst: &mut [bf16], isa: Isa) {
    assert_eq!(src.len(), dst.len(), "f32_to_bf16_slice: {} values into {}", src.len(), dst.len());
    // SAFETY: bf16 is a transparent u16.
    let out = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u16>(), dst.len()) };
    to_bits(src, out, isa);
}

/// Widens `src` to f32 into `dst` (exact), 16 values per instruction pair
/// where `isa` allows AVX-512.
///
/// ```
/// use half::bf16;
/// use tracejit_kernels::{bf16::bf16_to_f32_slice, Isa};
///
/// let src = [bf16::from_f32(0.5), bf16::NEG_INFINITY];
/// let mut dst = [0.0f32; 2];
/// bf16_to_f32_slice(&src, &mut dst, Isa::native());
/// assert_eq!(dst, [0.5, f32::NEG_INFINITY]);
/// ```
///
/// # Panics
/// If the slices' lengths differ.
pub fn bf16_to_f32_slice(src: &[bf16], dst: &mut [f32], isa: Isa) {
    assert_eq!(src.len(), dst.len(), "bf16_to_f32_slice: {} values into {}", src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa.width() == Some(Width::W16) {
        // SAFETY: `width` found AVX-512F; the lengths are equal.
        return unsafe { widen_avx512(src, dst) };
    }
    let _ = isa;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// [`f32_to_bf16_slice`] into raw bf16 bits (the packing's form).
pub(crate) fn to_bits(src: &[f32], dst: &mut [u16], isa: Isa) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx512_bf16() {
        // SAFETY: the features were checked; the lengths are equal.
        return unsafe { round_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.width().is_some() {
        // SAFETY: `width` found AVX2; the lengths are equal.
        return unsafe { round_avx2(src, Out::Bits(dst)) };
    }
    let _ = isa;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(s).to_bits();
    }
}

/// `src` rounded to bf16 and widened back, as f32 bits into `dst` (the
/// wide layout's slots, `super::wide`): one pass where AVX2 is allowed.
pub(crate) fn to_wide_bits(src: &[f32], dst: &mut [u32], isa: Isa) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa.width().is_some() {
        // SAFETY: `width` found AVX2; the lengths are equal.
        return unsafe { round_avx2(src, Out::Wide(dst)) };
    }
    let _ = isa;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = u32::from(bf16::from_f32(s).to_bits()) << 16;
    }
}

/// Where [`round_avx2`] writes: bf16 bits, or f32 bits of the bf16 values.
#[cfg(target_arch = "x86_64")]
enum Out<'a> {
    Bits(&'a mut [u16]),
    Wide(&'a mut [u32]),
}

/// The rounding 8 values per register with AVX2, on the bits as `half`
/// does it (no AVX2 instruction rounds to bf16): nearest even by adding
/// `0x7fff` plus the kept part's lowest bit (±Inf and overflow to ±Inf
/// come out right, the carry never reaching past the sign), a NaN's top
/// bits with the quiet bit set. The packing of every bf16 product on an
/// AVX2 machine goes through it (the scalar loop took 1 ms per million
/// values, a training step's weight-gradient operands each call).
///
/// # Safety
/// The CPU has AVX2; `dst` is as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn round_avx2(src: &[f32], mut dst: Out<'_>) {
    use std::arch::x86_64::*;
    let whole = src.len() / 8 * 8;
    let (one, half, magnitude, inf, quiet) = (
        _mm256_set1_epi32(1),
        _mm256_set1_epi32(0x7fff),
        _mm256_set1_epi32(0x7fff_ffff),
        _mm256_set1_epi32(0x7f80_0000),
        _mm256_set1_epi32(0x40),
    );
    for i in (0..whole).step_by(8) {
        // SAFETY: 8 values from `i` lie inside `src`, 8 halves inside `dst`.
        unsafe {
            let bits = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            let top = _mm256_srli_epi32::<16>(bits);
            let rounded =
                _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(bits, half), _mm256_and_si256(top, one)));
            let nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), inf);
            let r = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
            match &mut dst {
                Out::Bits(dst) => {
                    // Each value fits 16 bits: packing saturates nothing;
                    // the two 128-bit lanes' halves are then brought together.
                    let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(r, r));
                    _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), _mm256_castsi256_si128(packed));
                }
                Out::Wide(dst) => _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm256_slli_epi32::<16>(r)),
            }
        }
    }
    let tail = src[whole..].iter().map(|&s| half::bf16::from_f32(s).to_bits());
    match dst {
        Out::Bits(dst) => dst[whole..].iter_mut().zip(tail).for_each(|(d, b)| *d = b),
        Out::Wide(dst) => dst[whole..].iter_mut().zip(tail).for_each(|(d, b)| *d = u32::from(b) << 16),
    }
}

/// The vector rounding (see the module).
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `dst` is as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn round_avx512(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let len = src.len();
    let mut i = 0;
    while i < len {
        let rest = len - i;
        // Masked loads and stores only for the tail: on Zen 4 a masked
        // 512-bit store costs several times a plain one.
        let (lo, hi) = if rest >= 32 {
            // SAFETY: 32 values from `i` lie inside `src`.
            unsafe { (_mm512_loadu_ps(src.as_ptr().add(i)), _mm512_loadu_ps(src.as_ptr().add(i + 16))) }
        } else {
            let (m_lo, m_hi) = (lane_mask(rest), lane_mask(rest.saturating_sub(16)));
            // SAFETY: masked loads touch only the lanes inside `src`.
            unsafe {
                (
                    _mm512_maskz_loadu_ps(m_lo, src.as_ptr().add(i)),
                    _mm512_maskz_loadu_ps(m_hi, src.as_ptr().add(i).wrapping_add(16)),
                )
            }
        };
        let pairs = round_pairs(lo, hi);
        if rest >= 32 {
            // SAFETY: 32 values from `i` lie inside `dst`.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), pairs) };
        } else {
            // SAFETY: the store's mask covers only the lanes inside `dst`.
            unsafe { _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), lane_mask32(rest), pairs) };
        }
        i += 32;
    }
}

/// `lo` and `hi` rounded to bf16 with [`half::bf16::from_f32`]'s bits:
/// `lo`'s 16 values in the 16-bit lanes 0-15, `hi`'s in 16-31.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) fn round_pairs(lo: std::arch::x86_64::__m512, hi: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: both types are 512 plain bits.
    let pairs = unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) };
    let sub = subnormals(lo) as u32 | (subnormals(hi) as u32) << 16;
    if sub == 0 {
        return pairs;
    }
    // Rare: redo the register's subnormal lanes exactly.
    let exact = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(round_int(lo)), round_int(hi));
    _mm512_mask_blend_epi16(sub, pairs, exact)
}

/// The lanes of 16 holding subnormal values (exponent 0, mantissa not 0).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn subnormals(x: std::arch::x86_64::__m512) -> u16 {
    use std::arch::x86_64::*;
    let bits = _mm512_castps_si512(x);
    let exp = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7f80_0000));
    let mant = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007f_ffff));
    !exp & mant
}

/// Round to nearest even of finite values, on the bits: add `0x7fff` plus
/// the kept part's lowest bit, keep the top 16 (exact for subnormals,
/// which is all it is used for).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn round_int(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let bits = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb);
    _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(rounded))
}

/// The first `min(rest, 16)` lanes.
pub(super) fn lane_mask(rest: usize) -> u16 {
    if rest >= 16 {
        u16::MAX
    } else {
        ((1u32 << rest) - 1) as u16
    }
}

/// The first `min(rest, 32)` lanes.
fn lane_mask32(rest: usize) -> u32 {
    if rest >= 32 {
        u32::MAX
    } else {
        ((1u64 << rest) - 1) as u32
    }
}

/// The vector widening: each u16 zero-extended and shifted to the top.
///
/// # Safety
/// The CPU has AVX-512F; `dst` is as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(src: &[bf16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let len = src.len();
    let mut i = 0;
    while i < len {
        let mask = lane_mask(len - i);
        // SAFETY: a full register's 16 values lie inside both slices; the
        // tail goes value by value inside them.
        unsafe {
            if mask == u16::MAX {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), w);
            } else {
                for j in i..len {
                    *dst.get_unchecked_mut(j) = src.get_unchecked(j).to_f32();
                }
            }
        }
        i += 16;
    }
}
