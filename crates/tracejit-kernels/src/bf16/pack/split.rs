//! Packing over the pool's threads: the lhs by ranges of row panels, the
//! rhs by ranges of column panels, each range packed by the one-thread
//! code into its own part of the packed buffer.
//!
//! Why: the packing ran on the calling thread before the product's blocks
//! went to the pool, and in a training step most products pack both
//! operands per call (a weight gradient multiplies two activations). In
//! W10's bf16 step at two threads that was about 5 ms of 47 with the
//! second core idle.
//!
//! A packed operand's layout puts each panel in one contiguous run
//! (`tiles`: lhs `[panel][group][row][GROUP]`, rhs `[panel][depth][NR]`), so
//! a range of whole panels packs alone, at the same place and with the
//! same bits as in one pass: the results do not depend on the split.

use ndarray::{s, ArrayView2};

use super::super::tiles::{groups, rhs_depth, rhs_len, Line, Words, GROUP, MR, NR};
use super::super::wide;
use super::{pack_lhs, pack_rhs, LhsValue};
use crate::Isa;

/// Least values an operand has before its packing is split: a dispatch
/// costs a few µs, packing 64 Ki values about 20.
const SPLIT_VALUES: usize = 1 << 16;

/// Whether an operand of `values` values in `panels` panels is worth
/// splitting and there is a pool to split it over.
fn splits(values: usize, panels: usize) -> bool {
    values >= SPLIT_VALUES && panels >= 2 && crate::threads::pool().is_some()
}

/// The lhs packing of the layout: wide (`super::super::wide`) or pairs.
fn pack_lhs_one<T: LhsValue>(a: ArrayView2<'_, T>, out: &mut [u32], isa: Isa, wide: bool) {
    if wide {
        wide::pack_lhs(a, out, isa)
    } else {
        pack_lhs(a, out, isa)
    }
}

/// [`pack_lhs`] (or the wide layout's, if `wide`) over the pool when `a`
/// is large: each part packs a range of whole row panels.
pub(in super::super) fn pack_lhs_split<T: LhsValue + Sync>(
    a: ArrayView2<'_, T>,
    out: &mut [u32],
    isa: Isa,
    wide: bool,
) {
    let (m, k) = a.dim();
    let (mr, depth) = match wide {
        true => (MR, wide::slots(k.div_ceil(2))),
        false => (super::panel_rows(isa), k.div_ceil(2)),
    };
    if !splits(m * k, m.div_ceil(mr)) {
        return pack_lhs_one(a, out, isa, wide);
    }
    let row_words = groups(depth) * GROUP;
    assert!(out.len() >= m * row_words, "pack_lhs_split: {} words for [{m}, {k}]", out.len());
    // Rows `[r0, r1)` (whole panels from `r0`, a multiple of `mr`) are
    // words `[r0, r1) · row_words` of the packed lhs.
    crate::threads::for_each_part(&mut out[..m * row_words], mr * row_words, 0, &|start, part| {
        let r0 = start / row_words;
        pack_lhs_one(a.slice(s![r0..r0 + part.len() / row_words, ..]), part, isa, wide);
    });
}

/// The rhs packing of the layout: wide or pairs.
fn pack_rhs_one<T: LhsValue>(b: ArrayView2<'_, T>, out: &mut [u32], isa: Isa, wide: bool) {
    if wide {
        wide::pack_rhs(b, out, isa)
    } else {
        pack_rhs(b, out, isa)
    }
}

/// The packed words of `b [k, n]` ([`pack_rhs`]'s layout, or the wide
/// one if `wide`), over the pool when `b` is large: each part zeroes and
/// packs a range of whole column panels (the zeroing too, which on one
/// thread cost as much as a fast packing).
pub(in super::super) fn pack_rhs_split<T: LhsValue + Sync>(b: ArrayView2<'_, T>, isa: Isa, wide: bool) -> Words {
    let (k, n) = b.dim();
    let panels = n.div_ceil(NR);
    let depth = if wide { wide::slots(k.div_ceil(2)) } else { k.div_ceil(2) };
    let len = rhs_len(n, depth);
    if !splits(k * n, panels) {
        let mut words = Words::zeroed(len);
        pack_rhs_one(b, words.words_mut(), isa, wide);
        return words;
    }
    // `rhs_len` is whole panels of `rhs_depth(depth) · NR` words, and NR a
    // multiple of GROUP: whole lines, a panel `rhs_depth(depth) · NR / GROUP`
    // of them.
    debug_assert_eq!(len % GROUP, 0);
    let mut lines: Vec<Line> = Vec::with_capacity(len / GROUP);
    let panel_lines = rhs_depth(depth) * NR / GROUP;
    let spare = &mut lines.spare_capacity_mut()[..len / GROUP];
    crate::threads::for_each_part(spare, panel_lines, 0, &|start, part| {
        let (c0, count) = (start / panel_lines * NR, part.len() / panel_lines * NR);
        // SAFETY: `part` is this part's whole lines, zeroed here (every
        // bit pattern of a `Line` is valid), so initialized words.
        let words = unsafe {
            std::ptr::write_bytes(part.as_mut_ptr(), 0, part.len());
            std::slice::from_raw_parts_mut(part.as_mut_ptr().cast::<u32>(), part.len() * GROUP)
        };
        pack_rhs_one(b.slice(s![.., c0..n.min(c0 + count)]), words, isa, wide);
    });
    // SAFETY: the parts zeroed (then packed) every line: they cover the
    // panels `[0, panels)`, which are all `len / GROUP` lines.
    unsafe { lines.set_len(len / GROUP) };
    Words::from_lines(lines)
}
