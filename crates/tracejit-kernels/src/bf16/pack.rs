//! Packing the bf16 products' operands into the layout of [`super::tiles`]:
//! the lhs per call (f32 rounded to bf16 on the way, or bf16 copied), the
//! rhs once per weight. Words hold bf16 pairs of consecutive `k`, the
//! lower `k` first in memory; an odd `k` leaves the last word's upper half
//! zero on both sides, and the pads' product 0 · 0 adds nothing. Every
//! word of the packed lhs is written, so it may go into a reused buffer.

use half::bf16;
use ndarray::ArrayView2;

use super::tiles::{halves_mut, pack_rows, rhs_index, AMX_MR, MR, NR};
use crate::Isa;

mod split;
#[cfg(target_arch = "x86_64")]
mod vector;
#[cfg(target_arch = "x86_64")]
mod vector_lhs;

pub(super) use split::{pack_lhs_split, pack_rhs_split};

/// An lhs element: f32 (rounded to nearest even while packing) or bf16.
pub(super) trait LhsValue: Copy + Default {
    /// Writes `row`'s values as bf16 bits into `out` (as long as `row`).
    fn to_bits(row: &[Self], out: &mut [u16], isa: Isa);

    /// Writes `row`'s values rounded to bf16 as f32 bits into `out` (as
    /// long as `row`): the wide layout's slots.
    fn to_wide(row: &[Self], out: &mut [u32], isa: Isa);

    /// Packs `b` as [`pack_rhs`] does, with the same bits, when a vector
    /// path takes its layout; false (nothing written) otherwise.
    fn pack_rhs_vector(b: ArrayView2<'_, Self>, out: &mut [u32], isa: Isa) -> bool {
        let _ = (b, out, isa);
        false
    }

    /// Packs `a` as [`pack_lhs`] does, with the same bits, when a vector
    /// path takes its layout; false (nothing written) otherwise.
    fn pack_lhs_vector(a: ArrayView2<'_, Self>, out: &mut [u32], isa: Isa) -> bool {
        let _ = (a, out, isa);
        false
    }
}

impl LhsValue for f32 {
    fn to_bits(row: &[f32], out: &mut [u16], isa: Isa) {
        super::convert::to_bits(row, out, isa);
    }

    fn to_wide(row: &[f32], out: &mut [u32], isa: Isa) {
        super::convert::to_wide_bits(row, out, isa);
    }

    fn pack_rhs_vector(b: ArrayView2<'_, f32>, out: &mut [u32], isa: Isa) -> bool {
        #[cfg(target_arch = "x86_64")]
        return vector::pack_rhs_f32(b, out, isa);
        #[cfg(not(target_arch = "x86_64"))]
        return {
            let _ = (b, out, isa);
            false
        };
    }

    fn pack_lhs_vector(a: ArrayView2<'_, f32>, out: &mut [u32], isa: Isa) -> bool {
        #[cfg(target_arch = "x86_64")]
        return vector_lhs::pack_lhs_f32(a, out, isa);
        #[cfg(not(target_arch = "x86_64"))]
        return {
            let _ = (a, out, isa);
            false
        };
    }
}

impl LhsValue for bf16 {
    fn to_bits(row: &[bf16], out: &mut [u16], _: Isa) {
        for (o, v) in out.iter_mut().zip(row) {
            *o = v.to_bits();
        }
    }

    fn to_wide(row: &[bf16], out: &mut [u32], _: Isa) {
        for (o, v) in out.iter_mut().zip(row) {
            *o = u32::from(v.to_bits()) << 16;
        }
    }
}

/// Rows of the lhs panels the kernels of `isa` read: [`AMX_MR`] for the
/// AMX tiles, else [`MR`].
pub(super) fn panel_rows(isa: Isa) -> usize {
    if isa.has_amx_bf16() {
        AMX_MR
    } else {
        MR
    }
}

/// Packs `a` [m, k] (any strides) into `out` (`tiles::lhs_len(m, kw)`
/// words, `kw = ceil(k / 2)`) in panels of [`panel_rows`]`(isa)` rows,
/// rounding f32 values to bf16.
pub(super) fn pack_lhs<T: LhsValue>(a: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let k = a.ncols();
    if T::pack_lhs_vector(a, out, isa) {
        return;
    }
    // Halves past `k` keep the pad, 0.
    let mr = panel_rows(isa);
    pack_rows(a, mr, k.div_ceil(2), out, 0, |_, row, words| T::to_bits(row, &mut halves_mut(words)[..k], isa));
}

/// Packs `b` [k, n] (any strides) into `out` (`tiles::rhs_len(n, kw)`
/// zeroed words), rounding f32 values to bf16. Each contiguous line of `b`
/// (a row, or a column of a transposed view) is converted in one vector
/// pass ([`LhsValue::to_bits`]) and then placed: a weight's packing costs
/// about as much as reading it, not a strided walk per element.
pub(super) fn pack_rhs<T: LhsValue>(b: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let (k, n) = b.dim();
    if k == 0 || n == 0 || T::pack_rhs_vector(b, out, isa) {
        return;
    }
    if b.strides()[0] == 1 && n > 1 {
        return pack_rhs_columns(b, out, isa);
    }
    let kw = k.div_ceil(2);
    let mut lo = vec![0u16; n];
    let mut hi = vec![0u16; n];
    let mut line = Vec::new();
    for p in 0..kw {
        T::to_bits(as_slice(b.row(2 * p), &mut line), &mut lo, isa);
        if 2 * p + 1 < k {
            T::to_bits(as_slice(b.row(2 * p + 1), &mut line), &mut hi, isa);
        } else {
            hi.fill(0);
        }
        for (panel, (l, h)) in lo.chunks(NR).zip(hi.chunks(NR)).enumerate() {
            let at = rhs_index(kw, p, panel * NR);
            for ((w, &l), &h) in out[at..at + l.len()].iter_mut().zip(l).zip(h) {
                *w = u32::from(l) | (u32::from(h) << 16);
            }
        }
    }
}

/// [`pack_rhs`] for a `b` whose columns are contiguous (the transpose of
/// a row-major weight): each column's bf16 bits are, pair by pair, the
/// words of its packed column.
fn pack_rhs_columns<T: LhsValue>(b: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let (k, n) = b.dim();
    let kw = k.div_ceil(2);
    let mut bits = vec![0u16; 2 * kw];
    let mut line = Vec::new();
    for j in 0..n {
        T::to_bits(as_slice(b.column(j), &mut line), &mut bits[..k], isa);
        for (p, pair) in bits.chunks_exact(2).enumerate() {
            out[rhs_index(kw, p, j)] = u32::from(pair[0]) | (u32::from(pair[1]) << 16);
        }
    }
}

/// Runs `f` on `v`'s values as a slice: `v` itself when contiguous, else
/// a copy gathered into `line` (reused between calls).
pub(super) fn as_slice<'a, T: Copy>(v: ndarray::ArrayView1<'a, T>, line: &'a mut Vec<T>) -> &'a [T] {
    match v.to_slice() {
        Some(s) => s,
        None => {
            line.clear();
            line.extend(v.iter().copied());
            line
        }
    }
}
