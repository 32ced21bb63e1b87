//! Packing the bf16 products' operands into the layout of [`super::tiles`]:
//! the lhs per call (f32 rounded to bf16 on the way, or bf16 copied), the
//! rhs once per weight. Words hold bf16 pairs of consecutive `k`, the
//! lower `k` first in memory; an odd `k` leaves the last word's upper half
//! zero on both sides, and the pads' product 0 · 0 adds nothing. Every
//! word of the packed lhs is written, so it may go into a reused buffer.

use half::bf16;
use ndarray::ArrayView2;

use super::tiles::{halves_mut, pack_rows, rhs_index};
use crate::Isa;

/// An lhs element: f32 (rounded to nearest even while packing) or bf16.
pub(super) trait LhsValue: Copy + Default {
    /// Writes `row`'s values as bf16 bits into `out` (as long as `row`).
    fn to_bits(row: &[Self], out: &mut [u16], isa: Isa);
}

impl LhsValue for f32 {
    fn to_bits(row: &[f32], out: &mut [u16], isa: Isa) {
        super::convert::to_bits(row, out, isa);
    }
}

impl LhsValue for bf16 {
    fn to_bits(row: &[bf16], out: &mut [u16], _: Isa) {
        for (o, v) in out.iter_mut().zip(row) {
            *o = v.to_bits();
        }
    }
}

/// Packs `a` [m, k] (any strides) into `out` (`tiles::lhs_len(m, kw)`
/// words, `kw = ceil(k / 2)`), rounding f32 values to bf16.
pub(super) fn pack_lhs<T: LhsValue>(a: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let k = a.ncols();
    // Halves past `k` keep the pad, 0.
    pack_rows(a, k.div_ceil(2), out, 0, |_, row, words| T::to_bits(row, &mut halves_mut(words)[..k], isa));
}

/// Packs `b` [k, n] (any strides) into `out` (`tiles::rhs_len(n, kw)`
/// zeroed words) as bf16 bits given by `bits`, reading `b` row by row.
pub(super) fn pack_rhs<T: Copy>(b: ArrayView2<'_, T>, out: &mut [u32], bits: impl Fn(T) -> u16) {
    let kw = b.nrows().div_ceil(2);
    let out = halves_mut(out);
    for (kk, row) in b.rows().into_iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[2 * rhs_index(kw, kk / 2, j) + kk % 2] = bits(v);
        }
    }
}
