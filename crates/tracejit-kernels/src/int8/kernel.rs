//! The int8 micro-kernels: one tile of up to 6 rows × 64 columns (the
//! layout of `crate::bf16::tiles`, words of four `k`) accumulated in i32
//! over the whole depth with `vpdpbusd` (AVX-512 VNNI), `vpmaddwd` (AVX2)
//! or in portable integer code, then dequantized.
//!
//! Per step the vector tile loads its rhs registers (four `i8` of each
//! column) once and, per row, broadcasts the row's four `u8` as one 32-bit
//! element: `vpdpbusd` adds the four products `u8 · i8` to each i32 lane,
//! wrapping like the portable code's `wrapping_add`; both start from the
//! column's `−128 · Σ q`. The epilogue is the same
//! sequence of IEEE operations on both paths:
//! `c = ((acc as f32) · scale_i) · scale_j` (then `c₀ + c` with
//! `accumulate`), so the paths give the same bits.

use crate::bf16::tiles::{by_shape, walk, OutPtr, Tile, GROUP, LANES, MR, NR};
use crate::Isa;

/// What the epilogue of every tile of a product reads and writes.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    /// The output, row-major, `n` wide.
    pub c: OutPtr,
    /// The output's width.
    pub n: usize,
    /// Whether `c` is added to (else overwritten).
    pub accumulate: bool,
    /// The lhs rows' scales.
    pub row_scales: &'a [f32],
    /// Which lhs rows are stored unsigned (their sums start at 0, not at
    /// the columns' `starts`).
    pub unsigned_rows: &'a [bool],
    /// The weight columns' scales, padded to whole rhs panels.
    pub col_scales: &'a [f32],
    /// The weight columns' `−128 · Σ q` (where their sums start), padded
    /// likewise.
    pub starts: &'a [i32],
}

/// Blocks run on the AMX tiles: tests of the AMX path assert it ran.
#[cfg(test)]
pub(super) static AMX_BLOCKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Computes the output block `rows × cols` of an `m × n` product of depth
/// `kw` words from packed operands: on the AMX tiles where `isa` has AMX
/// int8 (`super::amx`), else with `vpdpbusd` or portable code.
///
/// # Safety
/// `ep.c` points to `m · n` writable values that no other thread reads or
/// writes inside this block; `lhs` and `rhs` are operands of these sizes
/// packed for `isa` (`lhs` `super::lhs_words` long), `ep`'s scales and
/// starts as long as [`Epilogue`] says.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run_block(
    lhs: &[u32],
    m: usize,
    rhs: &[u32],
    kw: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    ep: &Epilogue<'_>,
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_amx_int8() {
        // SAFETY: AMX was checked; the lhs was packed for it (in panels of
        // AMX_MR rows, with the slack); the rest is the caller's.
        #[cfg(test)]
        AMX_BLOCKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return unsafe { super::amx::run_block(lhs, m, rhs, kw, rows, cols, ep) };
    }
    let (vector, avx2) = (isa.has_avx512_vnni(), isa.width().is_some());
    walk(lhs, m, rhs, kw, rows, cols, |t| {
        #[cfg(target_arch = "x86_64")]
        {
            if vector {
                // SAFETY: the features were checked; the tile comes from
                // `walk` over packed operands; the output is the caller's.
                return unsafe { by_shape!(tile_avx512, t.rows, t.vecs, (t, kw, ep)) };
            }
            if avx2 && !force_portable() {
                // SAFETY: as above (`width` found AVX2).
                return unsafe {
                    match t.rows {
                        1 => tile_avx2::<1>(t, kw, ep),
                        2 => tile_avx2::<2>(t, kw, ep),
                        3 => tile_avx2::<3>(t, kw, ep),
                        4 => tile_avx2::<4>(t, kw, ep),
                        5 => tile_avx2::<5>(t, kw, ep),
                        _ => tile_avx2::<MR>(t, kw, ep),
                    }
                };
            }
        }
        let _ = (vector, avx2);
        #[cfg(test)]
        PORTABLE_TILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { tile_portable(t, kw, ep) }
    });
}

/// One tile with `vpdpbusd`, `R` rows by `V` registers.
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; `t` comes from [`walk`] with `R`
/// rows and `V` registers over operands of depth `kw` words; the tile's
/// outputs in `ep.c` are written by no one else meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_avx512<const R: usize, const V: usize>(t: &Tile, kw: usize, ep: &Epilogue<'_>) {
    use std::arch::x86_64::*;
    // A signed row's sums start at `−128 · Σ q` (the shift of its
    // `+ 128`), so the epilogue has no subtraction; an unsigned row's at 0.
    let mut start = [_mm512_setzero_si512(); V];
    for (v, start) in start.iter_mut().enumerate() {
        let starts = &ep.starts[t.col + v * LANES..t.col + (v + 1) * LANES];
        // SAFETY: a full register (padded to whole panels).
        *start = unsafe { _mm512_loadu_si512(starts.as_ptr().cast()) };
    }
    let mut acc = [start; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        if ep.unsigned_rows[t.row + r] {
            *acc = [_mm512_setzero_si512(); V];
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
                let quad = _mm512_set1_epi32(unsafe { *a.add(r * GROUP + s) } as i32);
                for (acc, &bv) in acc.iter_mut().zip(&bv) {
                    *acc = _mm512_dpbusd_epi32(*acc, quad, bv);
                }
            }
        }
        p += steps;
        a = a.wrapping_add(t.a_group);
        b = b.wrapping_add(GROUP * NR);
    }
    // Masked accesses even for full registers: with a branch on the mask
    // in the body, LLVM kept these loops rolled and the accumulators went
    // through the stack at every step of the main loop (2.5x slower).
    for v in 0..V {
        let col = t.col + v * LANES;
        let scales = &ep.col_scales[col..col + LANES];
        // SAFETY: a full register (padded to whole panels).
        let col_scale = unsafe { _mm512_loadu_ps(scales.as_ptr()) };
        for (r, acc) in acc.iter().enumerate() {
            let x = _mm512_cvtepi32_ps(acc[v]);
            let y = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(ep.row_scales[t.row + r])), col_scale);
            let out = ep.c.get().wrapping_add((t.row + r) * ep.n + col);
            // SAFETY: the masked lanes are the tile's outputs inside `c`.
            unsafe {
                let y = if ep.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(t.masks[v], out), y) } else { y };
                _mm512_mask_storeu_ps(out, t.masks[v], y);
            }
        }
    }
}

/// Set by tests to run the portable tile where AVX2 would run (on every
/// thread: blocks run on the pool).
#[cfg(test)]
pub(super) static FORCE_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tiles run by [`tile_avx2`] and by [`tile_portable`]: tests assert
/// which one ran.
#[cfg(test)]
pub(super) static AVX2_TILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
#[cfg(test)]
pub(super) static PORTABLE_TILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether a test asked for the portable tile.
fn force_portable() -> bool {
    #[cfg(test)]
    return FORCE_PORTABLE.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

thread_local! {
    /// The lhs words of a tile spread for [`tile_avx2`], kept per thread.
    static SPREAD: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One tile with AVX2's `vpmaddwd` (no VNNI: AMD Zen 3, older Intel): per
/// step, the rhs word of four `i8` of each of 8 columns is widened to
/// `i16`, and each row's four `u8` (widened once per tile, [`SPREAD`]) are
/// broadcast against it: `vpmaddwd` gives each column two exact i32 sums
/// of two products (`|255 · 128 · 2| < 2³¹`), added up per column after
/// the depth loop. `vpmaddubsw`, fbgemm's AVX2 route, would be twice as
/// fast per instruction but saturates its i16 sums of two `u8 · i8`
/// products (up to 65,280), so its results would depend on the values,
/// not only on the documented quantization. Integer sums wrap like the
/// other paths' and their order does not matter; the epilogue is the same
/// sequence of IEEE operations, so the bits are the other paths' bits.
///
/// # Safety
/// The CPU has AVX2; `t` comes from [`walk`] with `R` rows over operands
/// of depth `kw` words; the tile's outputs in `ep.c` are written by no one
/// else meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2<const R: usize>(t: &Tile, kw: usize, ep: &Epilogue<'_>) {
    use std::arch::x86_64::*;
    #[cfg(test)]
    AVX2_TILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SPREAD.with_borrow_mut(|spread| {
        // Grown, never cleared: every word of the `R` rows is written below.
        if spread.len() < R * kw {
            spread.resize(R * kw, 0);
        }
        for r in 0..R {
            let row = &mut spread[r * kw..(r + 1) * kw];
            for (gi, words) in row.chunks_mut(GROUP).enumerate() {
                // Row `r`'s words of group `gi` are consecutive.
                let src = t.a.wrapping_add(gi * t.a_group + r * GROUP);
                let done = words.len() / 4 * 4;
                let mut quads = words.chunks_exact_mut(4);
                for (q, out) in (&mut quads).enumerate() {
                    // SAFETY: four words of the row inside the packed lhs
                    // (16 bytes), widened to four u16 lanes each, stored
                    // into the four u64 of `out` (32 bytes).
                    unsafe {
                        let bytes = _mm_loadu_si128(src.add(q * 4).cast());
                        _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_cvtepu8_epi16(bytes));
                    }
                }
                for (i, out) in quads.into_remainder().iter_mut().enumerate() {
                    // SAFETY: a word of the row inside the packed lhs.
                    let w = u64::from(unsafe { *src.add(done + i) });
                    // The four bytes, lower `k` first, as four u16 lanes.
                    *out = (w & 0xff) | (w & 0xff00) << 8 | (w & 0xff_0000) << 16 | (w & 0xff00_0000) << 24;
                }
            }
        }
        let rows: [*const u64; R] = std::array::from_fn(|r| spread[r * kw..].as_ptr());
        let width = t.vecs * LANES;
        let on = |j: usize| t.masks[j / LANES] >> (j % LANES) & 1 == 1;
        for g in 0..width / 8 {
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let b = t.b.wrapping_add(g * 8);
            for p in 0..kw {
                // SAFETY: 8 words of step `p` inside the rhs panel (`walk`:
                // the tile's registers are whole panels of NR columns).
                let raw = unsafe { _mm256_loadu_si256(b.add(p * NR).cast()) };
                let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
                let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(raw));
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `p < kw`, inside row `r` of the spread words.
                    let a = _mm256_set1_epi64x(unsafe { *rows[r].add(p) } as i64);
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(a, lo));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(a, hi));
                }
            }
            let col = t.col + g * 8;
            // SAFETY: 8 of the padded scales and starts (whole panels).
            let (col_scale, starts) = unsafe {
                (
                    _mm256_loadu_ps(ep.col_scales[col..col + 8].as_ptr()),
                    _mm256_loadu_si256(ep.starts[col..col + 8].as_ptr().cast()),
                )
            };
            for (r, acc) in acc.iter().enumerate() {
                // Lanes 2j and 2j+1 of `acc[0]` are column j's, of `acc[1]`
                // column 4 + j's: `hadd` gives [0, 1, 4, 5 | 2, 3, 6, 7].
                let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(acc[0], acc[1]));
                let sums = if ep.unsigned_rows[t.row + r] { sums } else { _mm256_add_epi32(sums, starts) };
                let x = _mm256_cvtepi32_ps(sums);
                let y = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(ep.row_scales[t.row + r])), col_scale);
                let mut ys = [0f32; 8];
                // SAFETY: 8 floats into a local array.
                unsafe { _mm256_storeu_ps(ys.as_mut_ptr(), y) };
                let out = ep.c.get().wrapping_add((t.row + r) * ep.n + col);
                for (j, &y) in ys.iter().enumerate().filter(|&(j, _)| on(g * 8 + j)) {
                    // SAFETY: an output of the tile.
                    unsafe { *out.add(j) = if ep.accumulate { *out.add(j) + y } else { y } };
                }
            }
        }
    });
}

/// One tile in portable integer code, with the vector tile's results: per
/// step, the rhs bytes are widened once into four rows of i32 and every
/// row of the tile runs over them, loops that LLVM vectorizes.
///
/// # Safety
/// `t` comes from [`walk`] over operands of depth `kw` words; the tile's
/// outputs in `ep.c` are written by no one else meanwhile.
#[inline(always)]
unsafe fn tile_portable(t: &Tile, kw: usize, ep: &Epilogue<'_>) {
    let width = t.vecs * LANES;
    let on = |j: usize| t.masks[j / LANES] >> (j % LANES) & 1 == 1;
    let mut acc = [[0i32; NR]; MR];
    for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
        if !ep.unsigned_rows[t.row + r] {
            acc[..width].copy_from_slice(&ep.starts[t.col..t.col + width]);
        }
    }
    // Products `u8 · i8` fit in i16 (|255 · 127| < 2¹⁵): 16-bit multiplies
    // where LLVM would otherwise emit slow 32-bit ones.
    let mut w = [[0i16; NR]; 4];
    for p in 0..kw {
        // SAFETY: step `p` of the tile's registers lies in the packed rhs;
        // a word's four values come lower `k` first in memory.
        let bytes = unsafe { std::slice::from_raw_parts(t.b.add(p * NR).cast::<[u8; 4]>(), width) };
        for (j, b) in bytes.iter().enumerate() {
            for q in 0..4 {
                w[q][j] = i16::from(b[q] as i8);
            }
        }
        for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
            // SAFETY: row `r`'s word `p` lies in the packed lhs.
            let a = unsafe { *t.a.add(p / GROUP * t.a_group + r * GROUP + p % GROUP).cast::<[u8; 4]>() };
            let a = a.map(i16::from);
            for (j, acc) in acc[..width].iter_mut().enumerate() {
                let dot = (0..4).map(|q| i32::from(a[q] * w[q][j])).sum::<i32>();
                *acc = acc.wrapping_add(dot);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(t.rows) {
        let out = ep.c.get().wrapping_add((t.row + r) * ep.n + t.col);
        for (j, &acc) in acc.iter().enumerate().take(width).filter(|&(j, _)| on(j)) {
            let y = acc as f32 * ep.row_scales[t.row + r] * ep.col_scales[t.col + j];
            // SAFETY: an output of the tile.
            unsafe { *out.add(j) = if ep.accumulate { *out.add(j) + y } else { y } };
        }
    }
}
