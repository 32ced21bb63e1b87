//! The AVX-512 BF16 packing of an f32 lhs whose columns are contiguous:
//! the transpose of a row-major matrix, what a weight gradient multiplies
//! (`xᵀ · dy`). Gathering it value by value (six rows of a panel at a time)
//! and then a transposing copy to f32 rows each took ~3% of W10's bf16
//! step; here each value is read once and its packed word written once.
//!
//! 16 rows × 32 values of `k` at a time: 32 runs of 16 adjacent values
//! (one per `k`, the rows side by side in memory), transposed in registers
//! as two 16 × 16 blocks, so that each row holds its 32 values of `k` in
//! two registers, rounded together into that row's 16 words of the group
//! (`vcvtne2ps2bf16`, the portable packing's bits) and stored as one line.
//! Values past `k` load as zeros: the pads of the last group.

use std::arch::x86_64::*;

use ndarray::ArrayView2;

use super::super::convert::{lane_mask, round_pairs};
use super::super::tiles::{groups, lhs_len, lhs_slot, GROUP};
use super::vector::{load, transpose};
use crate::Isa;

/// Packs `a [m, k]` into `out` ([`lhs_len`] words, every one written) when
/// `isa` has AVX-512 BF16 and `a`'s columns are contiguous (and it has
/// more than one row and column); false (nothing written) otherwise.
pub(in super::super) fn pack_lhs_f32(a: ArrayView2<'_, f32>, out: &mut [u32], isa: Isa) -> bool {
    let (m, k) = a.dim();
    if !isa.has_avx512_bf16() || m < 2 || k < 2 || a.strides()[0] != 1 {
        return false;
    }
    assert!(out.len() >= lhs_len(m, k.div_ceil(2)), "pack_lhs_f32: {} words for [{m}, {k}]", out.len());
    // SAFETY: the features were checked; `a`'s columns are contiguous and
    // `out` holds the packed size.
    unsafe { columns(a, out, super::panel_rows(isa)) };
    true
}

/// [`pack_lhs_f32`]'s loop over blocks of 16 rows and groups of 16 words,
/// into panels of `mr` rows.
///
/// # Safety
/// AVX-512F/BW/BF16; `a`'s columns are contiguous; `out` holds the packed
/// size.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn columns(a: ArrayView2<'_, f32>, out: &mut [u32], mr: usize) {
    let (m, k) = a.dim();
    let (kw, s1) = (k.div_ceil(2), a.strides()[1]);
    // Value `(r, c)` is at `r + c·s1` from the first.
    let at = |r: usize, c: usize| a.as_ptr().wrapping_offset(r as isize + c as isize * s1);
    // Groups outside: a group's 32 columns (pages apart when `a` is a
    // large transpose) stay in the TLB and the prefetcher's streams while
    // every block of rows passes.
    for g in 0..groups(kw) {
        for r0 in (0..m).step_by(16) {
            let mask = lane_mask(m - r0);
            let mut lo = [_mm512_setzero_si512(); 16];
            let mut hi = [_mm512_setzero_si512(); 16];
            for i in 0..16 {
                let (c_lo, c_hi) = (32 * g + i, 32 * g + 16 + i);
                // SAFETY: column `c < k` holds rows `r0..m`, the masked lanes.
                unsafe {
                    if c_lo < k {
                        lo[i] = _mm512_castps_si512(load(at(r0, c_lo), mask));
                    }
                    if c_hi < k {
                        hi[i] = _mm512_castps_si512(load(at(r0, c_hi), mask));
                    }
                }
            }
            // Row `r0 + r`'s values `32g..32g + 16` in `lo[r]`, the next 16
            // in `hi[r]`.
            let (lo, hi) = (transpose(lo), transpose(hi));
            for r in 0..16.min(m - r0) {
                let words = round_pairs(_mm512_castsi512_ps(lo[r]), _mm512_castsi512_ps(hi[r]));
                let slot = lhs_slot(mr, m, kw, r0 + r, g);
                debug_assert!(slot + GROUP <= out.len());
                // SAFETY: a row's group is GROUP words inside `out`.
                unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(slot).cast(), words) };
            }
        }
    }
}
