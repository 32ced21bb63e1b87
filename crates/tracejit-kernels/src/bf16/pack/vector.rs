//! The AVX-512 BF16 packing of an f32 rhs, 16 columns per register.
//!
//! Packing a weight per call is part of every bf16 product whose weight is
//! an argument (W5's three products spent 118 µs packing against 384 µs
//! multiplying when the packing converted a line and then placed word by
//! word). Here each register is written straight into its place:
//!
//! - rows contiguous (a row-major weight): rows `2p` and `2p + 1` are
//!   rounded together (`vcvtne2ps2bf16`) and interleaved into 16 words;
//! - columns contiguous (the transpose of a row-major weight, what a
//!   backward pass multiplies by): 16 columns' next 16 words are rounded
//!   from 32 consecutive values each and transposed as a 16 × 16 block of
//!   words in registers.
//!
//! The values have the bits of the portable packing (the rounding is
//! `convert::round_pairs`, `half`'s bits for every input), so results do
//! not depend on the path.

use std::arch::x86_64::*;

use ndarray::ArrayView2;

use super::super::convert::{lane_mask, round_pairs};
use super::super::tiles::{rhs_index, rhs_len};
use crate::Isa;

/// Packs `b [k, n]` into `out` (zeroed, `rhs_len(n, ceil(k / 2))` words)
/// when `isa` has AVX-512 BF16 and `b`'s rows or columns are contiguous;
/// false (nothing written) otherwise.
pub(in super::super) fn pack_rhs_f32(b: ArrayView2<'_, f32>, out: &mut [u32], isa: Isa) -> bool {
    let (k, n) = b.dim();
    if !isa.has_avx512_bf16() || k == 0 || n == 0 {
        return false;
    }
    assert!(out.len() >= rhs_len(n, k.div_ceil(2)), "pack_rhs_f32: {} words for [{k}, {n}]", out.len());
    let [s0, s1] = [b.strides()[0], b.strides()[1]];
    if (s1 == 1 || n == 1) && n >= 16 {
        // SAFETY: the features were checked; rows are contiguous and `out`
        // holds the packed size.
        unsafe { rows(b, out) };
        return true;
    }
    if (s0 == 1 || k == 1) && n >= 16 {
        // SAFETY: as above, with contiguous columns.
        unsafe { columns(b, out) };
        return true;
    }
    false
}

/// The 16-bit lane order that turns `[lo₀..lo₁₅, hi₀..hi₁₅]` into words
/// `lo_c | hi_c << 16`.
#[target_feature(enable = "avx512f")]
fn interleave() -> __m512i {
    let mut idx = [0i16; 32];
    for c in 0..16 {
        idx[2 * c] = c as i16;
        idx[2 * c + 1] = 16 + c as i16;
    }
    // SAFETY: 32 i16 are 512 bits.
    unsafe { std::mem::transmute::<[i16; 32], __m512i>(idx) }
}

/// 16 values from `p` (the first `lane_mask` lanes; the rest 0).
///
/// # Safety
/// The masked lanes lie inside one allocation.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn load(p: *const f32, mask: u16) -> __m512 {
    // SAFETY: the caller's.
    unsafe {
        if mask == u16::MAX {
            _mm512_loadu_ps(p)
        } else {
            _mm512_maskz_loadu_ps(mask, p)
        }
    }
}

/// Row-contiguous `b`: word `(p, j)` is rows `2p`, `2p + 1` at column `j`.
///
/// # Safety
/// AVX-512F/BW/BF16; `b`'s rows are contiguous; `out` holds the packed size.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn rows(b: ArrayView2<'_, f32>, out: &mut [u32]) {
    let (k, n) = b.dim();
    let (kw, s0, idx) = (k.div_ceil(2), b.strides()[0], interleave());
    for p in 0..kw {
        let lo = b.as_ptr().wrapping_offset(2 * p as isize * s0);
        let hi = (2 * p + 1 < k).then(|| b.as_ptr().wrapping_offset((2 * p + 1) as isize * s0));
        for j in (0..n).step_by(16) {
            let mask = lane_mask(n - j);
            // SAFETY: rows `2p` (and `2p + 1`) exist and hold `n` values
            // from their start; the mask stops at `n`.
            let l = unsafe { load(lo.add(j), mask) };
            let h = match hi {
                // SAFETY: as for `l`.
                Some(h) => unsafe { load(h.add(j), mask) },
                None => _mm512_setzero_ps(),
            };
            let words = _mm512_permutexvar_epi16(idx, round_pairs(l, h));
            // `j` is a multiple of 16 inside a panel of 64: 16 adjacent words.
            let at = out.as_mut_ptr().wrapping_add(rhs_index(kw, p, j));
            // SAFETY: the (masked) words lie inside `out` (the packed size).
            // A masked store only for the tail: on Zen 4 it costs several
            // times a plain one.
            unsafe {
                if mask == u16::MAX {
                    _mm512_storeu_si512(at.cast(), words);
                } else {
                    _mm512_mask_storeu_epi32(at.cast(), mask, words);
                }
            }
        }
    }
}

/// Column-contiguous `b`: column `j`'s words are its values rounded, pair
/// by pair; 16 columns × 16 words at a time are transposed into place.
/// Columns past the last multiple of 16 go through [`column`].
///
/// # Safety
/// AVX-512F/BW/BF16; `b`'s columns are contiguous; `out` holds the packed
/// size.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn columns(b: ArrayView2<'_, f32>, out: &mut [u32]) {
    let (k, n) = b.dim();
    let (kw, s1) = (k.div_ceil(2), b.strides()[1]);
    let col = |j: usize| b.as_ptr().wrapping_offset(j as isize * s1);
    for j0 in (0..n - n % 16).step_by(16) {
        for p0 in (0..kw).step_by(16) {
            let rest = k - 2 * p0;
            let (m_lo, m_hi) = (lane_mask(rest), lane_mask(rest.saturating_sub(16)));
            let mut r = [_mm512_setzero_si512(); 16];
            for (c, r) in r.iter_mut().enumerate() {
                let at = col(j0 + c).wrapping_add(2 * p0);
                // SAFETY: column `j0 + c` holds `k` values; the masks stop there.
                *r = unsafe { round_pairs(load(at, m_lo), load(at.wrapping_add(16), m_hi)) };
            }
            let t = transpose(r);
            for (q, t) in t.iter().enumerate().take(kw - p0) {
                let at = out.as_mut_ptr().wrapping_add(rhs_index(kw, p0 + q, j0));
                // SAFETY: 16 adjacent words of one panel, inside `out`.
                unsafe { _mm512_storeu_si512(at.cast(), *t) };
            }
        }
    }
    for j in n - n % 16..n {
        // SAFETY: as above, for one column.
        unsafe { column(col(j), k, kw, j, out) };
    }
}

/// One column of `k` contiguous values at `at` into column `j` of `out`.
///
/// # Safety
/// AVX-512F/BW/BF16; `at` holds `k` values; `out` the packed size.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn column(at: *const f32, k: usize, kw: usize, j: usize, out: &mut [u32]) {
    for p0 in (0..kw).step_by(16) {
        let rest = k - 2 * p0;
        let (m_lo, m_hi) = (lane_mask(rest), lane_mask(rest.saturating_sub(16)));
        // SAFETY: the masks stop at `k`.
        let words = unsafe { round_pairs(load(at.add(2 * p0), m_lo), load(at.add(2 * p0).wrapping_add(16), m_hi)) };
        // SAFETY: 16 u32 are 512 bits.
        let words = unsafe { std::mem::transmute::<__m512i, [u32; 16]>(words) };
        for (q, w) in words.iter().enumerate().take(kw - p0) {
            out[rhs_index(kw, p0 + q, j)] = *w;
        }
    }
}

/// The 16 × 16 transpose of 32-bit lanes: `t[q]` lane `c` is `r[c]` lane `q`.
#[target_feature(enable = "avx512f")]
pub(super) fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
    // Pairs of rows interleaved by 32 then 64 bits: `b[4i + m]`'s 128-bit
    // lane `L` holds lanes `4L + m` of rows `4i..4i + 4`.
    let mut a = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut b = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    // Then 128-bit lanes gathered across the four groups of rows.
    let mut t = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let (x, y, z, w) = (b[m], b[4 + m], b[8 + m], b[12 + m]);
        let (u0, u1) = (_mm512_shuffle_i32x4::<0x44>(x, y), _mm512_shuffle_i32x4::<0xEE>(x, y));
        let (v0, v1) = (_mm512_shuffle_i32x4::<0x44>(z, w), _mm512_shuffle_i32x4::<0xEE>(z, w));
        t[m] = _mm512_shuffle_i32x4::<0x88>(u0, v0);
        t[4 + m] = _mm512_shuffle_i32x4::<0xDD>(u0, v0);
        t[8 + m] = _mm512_shuffle_i32x4::<0x88>(u1, v1);
        t[12 + m] = _mm512_shuffle_i32x4::<0xDD>(u1, v1);
    }
    t
}
