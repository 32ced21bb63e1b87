//! bf16 products on a CPU without bf16 instructions (an AMD Zen 3, any
//! AVX2 machine): operands rounded to bf16 once, widened to f32 while they
//! are packed, and multiplied by an f32 FMA tile with `vdpbf16ps`'s order
//! of operations — the same bits as the other paths, at f32's rate.
//!
//! Why: the pair layout of [`super::tiles`] feeds `vdpbf16ps`; without it
//! a tile must widen both halves of every word it reads, two integer
//! operations per broadcast and per rhs register, and the portable tile
//! compiled for AVX2 ran 64×784×512 in 2.0 ms where the f32 GEMM took 0.6
//! (W5 under `mixed_precision` at 2.4x its f32 time). Widening at packing
//! costs one pass over each operand (a weight once per version) and
//! leaves the inner loop an f32 micro-kernel.
//!
//! The *wide* layout is the pair layout with every word replaced by two
//! f32 *slots*, the lower `k` first: a product of `kw` words has `2 · kw`
//! slots per lhs row and rhs column, laid out as [`super::tiles`] lays out
//! `2 · kw` words (so [`walk`], `lhs_slot` and `rhs_index` serve as they
//! are). An odd `k`'s last pair has a zero slot on both sides.
//!
//! Per word the tile computes `(acc + a₁·b₁) + a₀·b₀` as two FMAs, upper
//! slot first: a product of two bf16 values is exact in f32, so an FMA
//! rounds exactly where `vdpbf16ps`'s sum rounds, and the result has the
//! portable tile's bits (`vdpbf16ps`'s, where no subnormal appears). The
//! one case apart: a product past f32's range that the accumulator would
//! bring back inside it (the unfused sum gives ±Inf, the FMA the finite
//! value); both are within the module's bound wherever it is finite.

use ndarray::ArrayView2;

use super::pack::{as_slice, LhsValue};
use super::tiles::{pack_rows, rhs_index, walk, OutPtr, Tile, GROUP, LANES, MR, NR};
use crate::Isa;

#[cfg(test)]
thread_local! {
    /// Tiles run by [`tile_avx2`] and by [`tile_portable`] on this thread:
    /// tests assert which one ran (their products kept on the calling
    /// thread; per thread, so that other tests running at the same time
    /// cannot move the counts).
    pub(super) static AVX2_TILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(super) static PORTABLE_TILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Tests force the portable tile (a CPU without AVX2's) while set
/// (process-wide: blocks run on the pool's threads).
#[cfg(test)]
pub(super) static FORCE_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether operands packed for `isa` take the wide layout: where it has
/// no bf16 products (neither AVX-512 BF16 nor AMX) but AVX2 and FMA.
pub(super) fn chosen(isa: Isa) -> bool {
    !isa.has_avx512_bf16() && !isa.has_amx_bf16() && isa.width().is_some()
}

/// Slots per row or column of a product of `kw` words.
pub(super) fn slots(kw: usize) -> usize {
    2 * kw
}

/// Packs `a [m, k]` (any strides) into `out` (`tiles::lhs_len(m,
/// slots(kw))` words) in panels of [`MR`] rows, each value rounded to bf16
/// and widened back.
pub(super) fn pack_lhs<T: LhsValue>(a: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let k = a.ncols();
    // Slots past `k` keep the pad, 0.
    pack_rows(a, MR, slots(k.div_ceil(2)), out, 0, |_, row, words| T::to_wide(row, &mut words[..k], isa));
}

/// Packs `b [k, n]` (any strides) into `out` (`tiles::rhs_len(n,
/// slots(kw))` zeroed words), each value rounded to bf16 and widened back:
/// a row of `b` at a time, or a column where `b`'s columns are contiguous
/// (the transpose of a row-major weight).
pub(super) fn pack_rhs<T: LhsValue>(b: ArrayView2<'_, T>, out: &mut [u32], isa: Isa) {
    let (k, n) = b.dim();
    let depth = slots(k.div_ceil(2));
    let mut wide = vec![0u32; k.max(n)];
    let mut line = Vec::new();
    if b.strides()[0] == 1 && n > 1 {
        for j in 0..n {
            T::to_wide(as_slice(b.column(j), &mut line), &mut wide[..k], isa);
            for (p, &w) in wide[..k].iter().enumerate() {
                out[rhs_index(depth, p, j)] = w;
            }
        }
        return;
    }
    for p in 0..k {
        T::to_wide(as_slice(b.row(p), &mut line), &mut wide[..n], isa);
        for (panel, w) in wide[..n].chunks(NR).enumerate() {
            let at = rhs_index(depth, p, panel * NR);
            out[at..at + w.len()].copy_from_slice(w);
        }
    }
}

/// [`super::kernel::run_block`] for operands in the wide layout: the AVX2
/// tile where `isa` allows 8 lanes, else portable code with its bits.
///
/// # Safety
/// As `run_block`, with `lhs` and `rhs` packed by this module's functions
/// for a depth of `kw` words.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run_block(
    lhs: &[u32],
    m: usize,
    rhs: &[u32],
    kw: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    c: OutPtr,
    n: usize,
    accumulate: bool,
    isa: Isa,
) {
    #[cfg(test)]
    let avx2 = isa.width().is_some() && !FORCE_PORTABLE.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    let avx2 = isa.width().is_some();
    walk(lhs, m, rhs, slots(kw), rows, cols, |t| {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            #[cfg(test)]
            AVX2_TILES.with(|n| n.set(n.get() + 1));
            // SAFETY: `width` found AVX2 and FMA; the tile comes from
            // `walk` over wide operands; the output is the caller's.
            return unsafe {
                match t.rows {
                    1 => tile_avx2::<1>(t, kw, c.get(), n, accumulate),
                    2 => tile_avx2::<2>(t, kw, c.get(), n, accumulate),
                    3 => tile_avx2::<3>(t, kw, c.get(), n, accumulate),
                    4 => tile_avx2::<4>(t, kw, c.get(), n, accumulate),
                    5 => tile_avx2::<5>(t, kw, c.get(), n, accumulate),
                    _ => tile_avx2::<MR>(t, kw, c.get(), n, accumulate),
                }
            };
        }
        let _ = avx2;
        #[cfg(test)]
        PORTABLE_TILES.with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { tile_portable(t, kw, c.get(), n, accumulate) }
    });
}

/// Slots of depth a tile's registers take in one pass (a multiple of
/// [`GROUP`]): the lhs rows' 6 × 512 slots (12 KiB) stay in L1 while the
/// tile's four registers pass over them, where W9's `k = 1024` rows
/// (48 KiB) were read from L2 four times (1024×1024×256 at 0.84x the f32
/// GEMM). Between passes the partial sums wait in the output, exact.
const DEPTH_BLOCK: usize = 32 * GROUP;

/// Where row `r`'s slot `s` lies in a tile's packed lhs.
///
/// # Safety
/// `s` is below the operands' slots and `r` below the tile's rows.
#[inline(always)]
unsafe fn lhs_at(t: &Tile, r: usize, s: usize) -> *const f32 {
    t.a.wrapping_add(s / GROUP * t.a_group + r * GROUP + s % GROUP).cast()
}

/// One tile of `R` rows, a 16-column register of the layout at a time as
/// two 8-lane halves: 2·R accumulators, two rhs registers and a broadcast
/// fill 15 of AVX2's 16 registers. Each output is summed over every slot
/// in one order, as [`tile_portable`] sums it.
///
/// # Safety
/// The CPU has AVX2 and FMA; `t` comes from [`walk`] with `R` rows over
/// wide operands of `kw` words; `c` (`ldc` wide) holds the tile's
/// outputs, written by no one else meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(t: &Tile, kw: usize, c: *mut f32, ldc: usize, accumulate: bool) {
    use std::arch::x86_64::*;
    let lanes = |bits: u16| {
        let b = i32::from(bits);
        _mm256_setr_epi32(
            -(b & 1),
            -(b >> 1 & 1),
            -(b >> 2 & 1),
            -(b >> 3 & 1),
            -(b >> 4 & 1),
            -(b >> 5 & 1),
            -(b >> 6 & 1),
            -(b >> 7 & 1),
        )
    };
    let total = slots(kw);
    let mut s0 = 0;
    while s0 < total {
        let s1 = total.min(s0 + DEPTH_BLOCK);
        // The accumulators start from the output (the partial sums of the
        // slots before `s0`, exact in f32) but in the first block.
        let from_c = accumulate || s0 > 0;
        for v in 0..t.vecs {
            let masks = [lanes(t.masks[v] & 0xff), lanes(t.masks[v] >> 8)];
            let out = |r: usize, h: usize| c.wrapping_add((t.row + r) * ldc + t.col + v * LANES + h * 8);
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            if from_c {
                for (r, acc) in acc.iter_mut().enumerate() {
                    for (h, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: the masked lanes are the tile's outputs in `c`.
                        *acc = unsafe { _mm256_maskload_ps(out(r, h), masks[h]) };
                    }
                }
            }
            let a = t.a.wrapping_add(s0 / GROUP * t.a_group).cast::<f32>();
            let b = t.b.wrapping_add(s0 * NR + v * LANES).cast::<f32>();
            // SAFETY: the block's slots lie in the packed operands.
            unsafe { block_avx2(&mut acc, a, t.a_group, b, s1 - s0) };
            for (r, acc) in acc.iter().enumerate() {
                for (h, &acc) in acc.iter().enumerate() {
                    // SAFETY: the masked lanes are the tile's outputs in `c`.
                    unsafe { _mm256_maskstore_ps(out(r, h), masks[h], acc) };
                }
            }
        }
        s0 = s1;
    }
}

/// Adds `slots` slots (whole groups but perhaps the last, whole pairs) of
/// one 16-column register to `acc`, row `r`'s slot `s` at `a[(s / GROUP) *
/// a_group + r * GROUP + s % GROUP]` and the register's at `b[s * NR..]`.
///
/// # Safety
/// The CPU has AVX2 and FMA; the operands hold those slots.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn block_avx2<const R: usize>(
    acc: &mut [[std::arch::x86_64::__m256; 2]; R],
    mut a: *const f32,
    a_group: usize,
    mut b: *const f32,
    slots: usize,
) {
    use std::arch::x86_64::*;
    let mut s0 = 0;
    while s0 < slots {
        // A group's slots: whole pairs (GROUP and the slots are even).
        let steps = GROUP.min(slots - s0);
        for pair in (0..steps).step_by(2) {
            // The upper slot of the pair first, as `vdpbf16ps` adds it.
            for s in [pair + 1, pair] {
                // SAFETY: slot `s0 + s` of this register lies in the packed
                // rhs (`walk`: panels padded to NR columns).
                let bv = unsafe { [_mm256_loadu_ps(b.add(s * NR)), _mm256_loadu_ps(b.add(s * NR + 8))] };
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: row `r`'s slot `s0 + s` lies in the packed lhs.
                    let x = unsafe { _mm256_broadcast_ss(&*a.add(r * GROUP + s)) };
                    acc[0] = _mm256_fmadd_ps(x, bv[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, bv[1], acc[1]);
                }
            }
        }
        s0 += steps;
        a = a.wrapping_add(a_group);
        b = b.wrapping_add(GROUP * NR);
    }
}

/// [`tile_avx2`]'s arithmetic in portable code (products exact, so the
/// unfused sum rounds where the FMA does).
///
/// # Safety
/// As [`tile_avx2`], without the CPU features.
unsafe fn tile_portable(t: &Tile, kw: usize, c: *mut f32, ldc: usize, accumulate: bool) {
    let on = |j: usize| t.masks[j / LANES] >> (j % LANES) & 1 == 1;
    for r in 0..t.rows {
        for j in (0..t.vecs * LANES).filter(|&j| on(j)) {
            let out = c.wrapping_add((t.row + r) * ldc + t.col + j);
            // SAFETY: an output of the tile.
            let mut acc = if accumulate { unsafe { *out } } else { 0.0 };
            for s in (0..slots(kw)).map(|s| s ^ 1) {
                // SAFETY: slot `s` of row `r` and of column `j` lie in the
                // packed operands.
                let (a, b) = unsafe { (*lhs_at(t, r, s), *t.b.add(s * NR + j).cast::<f32>()) };
                acc += a * b;
            }
            // SAFETY: an output of the tile.
            unsafe { *out = acc };
        }
    }
}
