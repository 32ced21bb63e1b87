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
//! (`tiles`: lhs `[panel][group][row][GROUP]`, rhs `[panel][kw][NR]`), so
//! a range of whole panels packs alone, at the same place and with the
//! same bits as in one pass: the results do not depend on the split.

use ndarray::{s, ArrayView2};

use super::super::tiles::{groups, rhs_len, Line, Words, GROUP, MR, NR};
use super::{pack_lhs, pack_rhs, LhsValue};
use crate::Isa;

/// Least values an operand has before its packing is split: a dispatch
/// costs a few µs, packing 64 Ki values about 20.
const SPLIT_VALUES: usize = 1 << 16;

/// The pool and the number of parts for an operand of `values` values in
/// `panels` panels, when it is worth splitting and there is a pool.
fn parts(values: usize, panels: usize) -> Option<(std::sync::Arc<crate::threads::Pool>, usize)> {
    if values < SPLIT_VALUES || panels < 2 {
        return None;
    }
    let pool = crate::threads::pool()?;
    let n = pool.threads().min(panels);
    Some((pool, n))
}

/// A packed buffer the parts write in disjoint ranges.
#[derive(Clone, Copy)]
struct WordsPtr(*mut u32);
// SAFETY: each part writes only its own range, and the call waits for all
// of them before the buffer's borrow ends.
unsafe impl Send for WordsPtr {}
// SAFETY: as above.
unsafe impl Sync for WordsPtr {}

impl WordsPtr {
    /// `len` words from word `at` (a method, so that closures capture the
    /// whole wrapper).
    ///
    /// # Safety
    /// The range lies in the buffer, and no other part uses it meanwhile.
    unsafe fn range<'a>(self, at: usize, len: usize) -> &'a mut [u32] {
        // SAFETY: the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// [`pack_lhs`] over the pool when `a` is large: each part packs a range
/// of whole row panels.
pub(in super::super) fn pack_lhs_split<T: LhsValue + Sync>(a: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let (m, k) = a.dim();
    let panels = m.div_ceil(MR);
    let Some((pool, n)) = parts(m * k, panels) else {
        return pack_lhs(a, out, isa);
    };
    let row_words = groups(k.div_ceil(2)) * GROUP;
    assert!(out.len() >= m * row_words, "pack_lhs_split: {} words for [{m}, {k}]", out.len());
    let per = panels.div_ceil(n) * MR;
    let ptr = WordsPtr(out.as_mut_ptr());
    pool.run(n, &|t| {
        let (r0, r1) = (t * per, m.min((t + 1) * per));
        if r0 < r1 {
            // SAFETY: rows `[r0, r1)` (whole panels from `r0`, a multiple
            // of MR) are words `[r0, r1) · row_words` of the packed lhs,
            // inside `out` and this part's alone.
            let part = unsafe { ptr.range(r0 * row_words, (r1 - r0) * row_words) };
            pack_lhs(a.slice(s![r0..r1, ..]), part, isa);
        }
    });
}

/// The packed words of `b [k, n]` ([`pack_rhs`]'s layout), over the pool
/// when `b` is large: each part zeroes and packs a range of whole column
/// panels (the zeroing too, which on one thread cost as much as a fast
/// packing).
pub(in super::super) fn pack_rhs_split<T: LhsValue + Sync>(b: ArrayView2<'_, T>, isa: Isa) -> Words {
    let (k, n) = b.dim();
    let (kw, panels) = (k.div_ceil(2), n.div_ceil(NR));
    let len = rhs_len(n, kw);
    let Some((pool, parts)) = parts(k * n, panels) else {
        let mut words = Words::zeroed(len);
        pack_rhs(b, words.words_mut(), isa);
        return words;
    };
    // `rhs_len` is whole panels of `kw · NR` words, and NR a multiple of
    // GROUP: whole lines.
    debug_assert_eq!(len % GROUP, 0);
    let mut lines: Vec<Line> = Vec::with_capacity(len / GROUP);
    let ptr = WordsPtr(lines.as_mut_ptr().cast::<u32>());
    let per = panels.div_ceil(parts) * NR;
    pool.run(parts, &|t| {
        let (c0, c1) = (t * per, n.min((t + 1) * per));
        if c0 < c1 {
            let (w0, w1) = (c0 / NR * kw * NR, c1.div_ceil(NR) * kw * NR);
            // SAFETY: columns `[c0, c1)` (whole panels from `c0`, a multiple
            // of NR) are words `[w0, w1)` of the packed rhs, inside the
            // allocation and this part's alone; zeroed before the slice is
            // made, so it is initialized.
            let part = unsafe {
                std::ptr::write_bytes(ptr.0.add(w0), 0, w1 - w0);
                ptr.range(w0, w1 - w0)
            };
            pack_rhs(b.slice(s![.., c0..c1]), part, isa);
        }
    });
    // SAFETY: the parts zeroed (then packed) every word: their ranges
    // cover the panels `[0, panels)`, which are all `len` words.
    unsafe { lines.set_len(len / GROUP) };
    Words::from_lines(lines)
}
