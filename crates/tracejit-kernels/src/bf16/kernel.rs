//! The bf16 micro-kernels: one tile of up to 6 rows × 64 columns
//! ([`super::tiles`]) accumulated in f32 over the whole depth, with
//! `vdpbf16ps` (AVX-512 BF16) or in portable f32 code.
//!
//! Per step (one word: a pair of `k`) the vector tile loads its rhs
//! registers once and, per row, broadcasts the row's pair as one 32-bit
//! element into `vdpbf16ps`, which computes `acc + a₁·b₁ + a₀·b₀` lane by
//! lane. Its arithmetic (checked on this Zen 4 over 10⁶ random operands,
//! and as Intel's manual defines it) is `(acc + a₁·b₁) + a₀·b₀` in f32
//! with each product exact, each sum rounded to nearest even — except that
//! subnormal inputs and results are flushed to zero. The portable tile
//! computes exactly that, in that order, keeping subnormals: the two paths
//! give the same bits wherever no subnormal appears.

use super::tiles::{by_shape, walk, OutPtr, Tile, GROUP, LANES, MR, NR};
use crate::Isa;

/// Blocks run on the AMX tiles: tests of the AMX path assert it ran.
#[cfg(test)]
pub(super) static AMX_BLOCKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Computes the output block `rows × cols` of an `m × n` product of depth
/// `kw` words from packed operands into `c` (row-major, `n` wide): `c =`
/// or, with `accumulate`, `c +=` the product. Operands in the wide layout
/// run the f32 tiles of [`super::wide`]; else where `isa` has AMX bf16 the
/// block runs on the tiles ([`super::amx`]).
///
/// # Safety
/// `c` points to `m · n` writable values that no other thread reads or
/// writes inside this block; `lhs` and `rhs` are operands of these sizes
/// packed for `isa` (`lhs` [`super::lhs_words`] long), both in the wide
/// layout if `wide`, else both in the pair layout.
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
    wide: bool,
) {
    if wide {
        // SAFETY: forwarded; both operands are wide.
        return unsafe { super::wide::run_block(lhs, m, rhs, kw, rows, cols, c, n, accumulate, isa) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_amx_bf16() {
        // SAFETY: AMX was checked; the lhs was packed for it (`pack::panel_rows`)
        // with the slack `lhs_words` adds; the rest is the caller's.
        #[cfg(test)]
        AMX_BLOCKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return unsafe { super::amx::run_block(lhs, m, rhs, kw, rows, cols, c, n, accumulate) };
    }
    let (vector, avx2) = (isa.has_avx512_bf16(), isa.width().is_some());
    walk(lhs, m, rhs, kw, rows, cols, |t| {
        #[cfg(target_arch = "x86_64")]
        {
            if vector {
                // SAFETY: the features were checked; the tile comes from
                // `walk` over packed operands; the output is the caller's.
                return unsafe { by_shape!(tile_avx512, t.rows, t.vecs, (t, kw, c.get(), n, accumulate)) };
            }
            if avx2 {
                // SAFETY: as above (`width` found AVX2).
                return unsafe { tile_portable_avx2(t, kw, c.get(), n, accumulate) };
            }
        }
        let _ = (vector, avx2);
        // SAFETY: as above.
        unsafe { tile_portable(t, kw, c.get(), n, accumulate) }
    });
}

/// One tile with `vdpbf16ps`, `R` rows by `V` registers.
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `t` comes from [`walk`] with `R`
/// rows and `V` registers over operands of depth `kw` words; `c` (`ldc`
/// wide) holds the tile's outputs, written by no one else meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile_avx512<const R: usize, const V: usize>(t: &Tile, kw: usize, c: *mut f32, ldc: usize, accumulate: bool) {
    use std::arch::x86_64::*;
    let out = |r: usize, v: usize| c.wrapping_add((t.row + r) * ldc + t.col + v * LANES);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (v, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the masked lanes are the tile's outputs inside `c`.
                *acc = unsafe { _mm512_maskz_loadu_ps(t.masks[v], out(r, v)) };
            }
        }
    }
    let (mut a, mut b) = (t.a, t.b);
    let mut p = 0;
    while p < kw {
        let steps = GROUP.min(kw - p);
        for s in 0..steps {
            let mut bv = [_mm512_setzero_si512(); V];
            for (v, bv) in bv.iter_mut().enumerate() {
                // SAFETY: step `p + s` of the tile's registers lies in the
                // packed rhs (`walk`).
                *bv = unsafe { _mm512_loadu_si512(b.add(s * NR + v * LANES).cast()) };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row `r`'s word `p + s` lies in the packed lhs.
                let pair = _mm512_set1_epi32(unsafe { *a.add(r * GROUP + s) } as i32);
                // SAFETY: 512 plain bits reinterpreted as 32 bf16 values.
                let pair = unsafe { std::mem::transmute::<__m512i, __m512bh>(pair) };
                for (acc, &bv) in acc.iter_mut().zip(&bv) {
                    // SAFETY: as above.
                    let bv = unsafe { std::mem::transmute::<__m512i, __m512bh>(bv) };
                    *acc = _mm512_dpbf16_ps(*acc, pair, bv);
                }
            }
        }
        p += steps;
        a = a.wrapping_add(t.a_group);
        b = b.wrapping_add(GROUP * NR);
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            // SAFETY: the masked lanes are the tile's outputs inside `c`.
            unsafe { _mm512_mask_storeu_ps(out(r, v), t.masks[v], acc) };
        }
    }
}

/// [`tile_portable`] compiled for AVX2: the same operations, 8 lanes wide
/// (64×784×512: 4.7 ms at SSE2's 4 lanes, 2.0 at 8; the f32 GEMM at 8
/// lanes takes 0.6).
///
/// # Safety
/// The CPU has AVX2; as [`tile_portable`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_portable_avx2(t: &Tile, kw: usize, c: *mut f32, ldc: usize, accumulate: bool) {
    // SAFETY: forwarded.
    unsafe { tile_portable(t, kw, c, ldc, accumulate) }
}

/// One tile in portable f32 code, with `vdpbf16ps`'s order of operations:
/// per step, the rhs words are widened once into two rows of f32 and every
/// row of the tile runs over them, loops that LLVM vectorizes.
///
/// # Safety
/// `t` comes from [`walk`] over operands of depth `kw` words; `c` (`ldc`
/// wide) holds the tile's outputs, written by no one else meanwhile.
#[inline(always)]
unsafe fn tile_portable(t: &Tile, kw: usize, c: *mut f32, ldc: usize, accumulate: bool) {
    let widen = |h: u16| f32::from_bits(u32::from(h) << 16);
    let width = t.vecs * LANES;
    let on = |j: usize| t.masks[j / LANES] >> (j % LANES) & 1 == 1;
    let out = |r: usize, j: usize| c.wrapping_add((t.row + r) * ldc + t.col + j);
    let mut acc = [[0f32; NR]; MR];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
            for (j, acc) in acc.iter_mut().enumerate().take(width).filter(|&(j, _)| on(j)) {
                // SAFETY: an output of the tile.
                *acc = unsafe { *out(r, j) };
            }
        }
    }
    let (mut b0, mut b1) = ([0f32; NR], [0f32; NR]);
    for p in 0..kw {
        // SAFETY: step `p` of the tile's registers lies in the packed rhs;
        // a word's two values come lower `k` first in memory.
        let halves = unsafe { std::slice::from_raw_parts(t.b.add(p * NR).cast::<u16>(), 2 * width) };
        for ((b0, b1), h) in b0.iter_mut().zip(&mut b1).zip(halves.chunks_exact(2)) {
            (*b0, *b1) = (widen(h[0]), widen(h[1]));
        }
        for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
            // SAFETY: row `r`'s word `p` lies in the packed lhs.
            let h = unsafe { *t.a.add(p / GROUP * t.a_group + r * GROUP + p % GROUP).cast::<[u16; 2]>() };
            let (a0, a1) = (widen(h[0]), widen(h[1]));
            for ((acc, &b0), &b1) in acc[..width].iter_mut().zip(&b0).zip(&b1) {
                *acc = (*acc + a1 * b1) + a0 * b0;
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(t.rows) {
        for (j, &acc) in acc.iter().enumerate().take(width).filter(|&(j, _)| on(j)) {
            // SAFETY: an output of the tile.
            unsafe { *out(r, j) = acc };
        }
    }
}
