//! The forward pass with bf16 products (`vdpbf16ps`, AVX-512 BF16), for
//! attention under mixed precision: `S = q·kᵀ·scale` from `q·scale` and
//! `k` rounded to bf16, `P·v` from `P` and `v` rounded to bf16, both
//! accumulated in f32; the masks, the online softmax (its running max and
//! sum over the unrounded `P`), `1/l` and `lse` stay f32. What PyTorch's
//! autocast and JAX's bf16 matmuls do to attention, at twice the f32
//! multiply-add rate.
//!
//! The task walks exactly as [`super::online`]'s (it shares its tile,
//! masks, softmax and output code), with queries along the 16 lanes; what
//! changes is the products' operands, words of two bf16 values
//! consecutive along the depth (`vdpbf16ps` adds `a₁·b₁ + a₀·b₀` per
//! lane):
//!
//! - `qp [⌈d/2⌉, TILE]`: pairs of rows of `qᵀ·scale` interleaved, once per
//!   task; `kb [BLOCK, ⌈d/2⌉]`: each block's keys rounded in place order
//!   (a row of `k` already holds its pairs side by side), broadcast;
//! - `pp [BLOCK/2, TILE]`: pairs of rows of `Pᵀ` interleaved; `vb
//!   [BLOCK/2, dv]`: pairs of rows of `v`, broadcast down the columns.
//!
//! A depth of odd length ends in a word whose upper value is zero on both
//! sides; under the causal rule a group of queries whose last key in the
//! block falls on the first value of a word gets a zero probability
//! beside it, so the causal staircase runs in words.
//!
//! Rounding: `vcvtne2ps2bf16` (to nearest even; NaN stays NaN, subnormal
//! values and products flushed to zero by `vdpbf16ps`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kernel::{Rows, Start};
use super::online::{finish, normalize, start, ForwardCall, Scratch, Tile};
use super::plan::{group_first, Carve, Inputs, BLOCK, TILE};

/// Lanes of a vector (of f32 values, or of words).
const L: usize = 16;
/// Rows of the product block (8 × 2 vectors: 16 accumulators, as the f32
/// kernel at 16 lanes).
const MR: usize = 8;
/// Vectors of the product block.
const NV: usize = 2;

/// The regions past [`Scratch`]'s, in words.
struct Words {
    /// `qᵀ·scale` as pairs of rows, `[⌈d/2⌉, TILE]`.
    qp: *mut u32,
    /// The block's keys, `[BLOCK, ⌈d/2⌉]`.
    kb: *mut u32,
    /// The block's probabilities as pairs of rows, `[BLOCK/2, TILE]`.
    pp: *mut u32,
    /// The block's values as pairs of rows, `[BLOCK/2, dv]`.
    vb: *mut u32,
}

/// Both kinds of region of a task's scratch.
fn carve(c: &mut Carve, d: usize, dv: usize) -> (Scratch, Words) {
    let s = Scratch::carve(c, d, dv);
    let dw = d.div_ceil(2);
    let mut words = |n: usize| c.take(n).cast::<u32>();
    let w =
        Words { qp: words(dw * TILE), kb: words(BLOCK * dw), pp: words(BLOCK / 2 * TILE), vb: words(BLOCK / 2 * dv) };
    (s, w)
}

/// Floats of scratch a bf16 forward task needs.
pub(super) fn scratch_len(d: usize, dv: usize) -> usize {
    let mut c = Carve::new(std::ptr::null_mut());
    carve(&mut c, d, dv);
    c.used()
}

/// Forward task `t` with bf16 products.
///
/// # Safety
/// As [`super::online::task`]; the CPU has AVX-512F, BW and BF16; the
/// scratch has [`scratch_len`] floats.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn task(call: &ForwardCall<'_>, t: usize, scratch: *mut f32) {
    let x = &call.x;
    let tile = Tile::of(x, t, L);
    let (s, w) = carve(&mut Carve::new(scratch), x.p.d, x.p.dv);
    let kend = tile.key_end(x);
    // SAFETY: as the f32 task; the word regions were carved for these
    // sizes.
    unsafe {
        start::<__m512>(x, tile, &s);
        interleave_rows(s.qt, TILE, x.p.d, tile.nv * L, w.qp, TILE);
        let mut j0 = 0;
        while j0 < kend {
            let j1 = kend.min(j0 + BLOCK);
            block(x, tile, &s, &w, j0, j1);
            j0 = j1;
        }
        finish::<__m512>(call, tile, &s);
    }
}

/// One block of keys `[j0, j1)`: scores, the softmax, `P·V`.
///
/// # Safety
/// As [`task`]; `j0 < j1 ≤ tk`, `j1 - j0 ≤ BLOCK`.
#[inline(always)]
unsafe fn block(x: &Inputs<'_>, tile: Tile, s: &Scratch, w: &Words, j0: usize, j1: usize) {
    let (p, rule) = (&x.p, &x.rule);
    let (n, dw) = (j1 - j0, p.d.div_ceil(2));
    let hi = tile.key_ends(x, j0, j1, L);
    // SAFETY: key rows `[j0, j1)` of `k` and `v`; the scratch regions.
    unsafe {
        round_rows(x.k.row(tile.b, j0), x.k.row_stride, n, p.d, w.kb, dw);
        // Sᵀ = k·qᵀ by panels of keys, each from the first group of
        // queries that sees its first key.
        let mut r0 = 0;
        while r0 < n {
            let rows = MR.min(n - r0);
            let first = group_first(rule.query_start(j0 + r0).saturating_sub(tile.i0), L).min(tile.nv);
            let mut v = first;
            while v < tile.nv {
                let nv = NV.min(tile.nv - v);
                let a = Broadcast { ptr: w.kb.add(r0 * dw), rs: dw, ks: 1 };
                let b = w.qp.add(v * L);
                let c = Rows { ptr: s.st.add(r0 * TILE + v * L), stride: TILE };
                tile_n(nv, rows, dw, a, b, c, Start::Zero);
                v += nv;
            }
            r0 += rows;
        }
        normalize::<__m512>(x, tile, s, j0, &hi);
        // Each vector's words of `P`: `⌈(hi - j0)/2⌉`, the value after an
        // odd count zero.
        let mut hw = [0usize; super::kernel::MAX_VECTORS];
        for v in 0..tile.nv {
            let keys = hi[v] - j0;
            if keys % 2 == 1 {
                _mm512_storeu_ps(s.st.add(keys * TILE + v * L), _mm512_setzero_ps());
            }
            hw[v] = keys.div_ceil(2);
        }
        let words = hw[..tile.nv].iter().copied().max().unwrap_or(0);
        interleave_rows(s.st, TILE, 2 * words, tile.nv * L, w.pp, TILE);
        interleave_rows(x.v.row(tile.b, j0), x.v.row_stride, n, p.dv, w.vb, p.dv);
        // oᵀ = oᵀ·alpha + vᵀ·Pᵀ, each vector over its own words.
        staircase(p.dv, &hw[..tile.nv], w, s);
    }
}

/// `oᵀ[c, v] = oᵀ[c, v]·alpha[v] + Σ_{k < hw[v]} vb[k, c] · pp[k, v]` for
/// each vector `v` with words (`hw` non-decreasing; a vector without any
/// is left alone): within a block of [`NV`] vectors, the words all live
/// ones share first (scaling them), then those the later ones have alone.
///
/// # Safety
/// As [`block`], with `pp` and `vb` filled for those words.
#[inline(always)]
unsafe fn staircase(dv: usize, hw: &[usize], w: &Words, s: &Scratch) {
    let mut v0 = 0;
    while v0 < hw.len() {
        let end = (v0 + NV).min(hw.len());
        let mut done = 0;
        for (v, &words) in hw.iter().enumerate().take(end).skip(v0) {
            if words <= done {
                continue;
            }
            let start = if done == 0 { Start::Scaled(s.alpha.wrapping_add(v * L)) } else { Start::Load };
            let mut r0 = 0;
            while r0 < dv {
                let rows = MR.min(dv - r0);
                let a = Broadcast { ptr: w.vb.wrapping_add(done * dv + r0), rs: 1, ks: dv };
                let b = w.pp.wrapping_add(done * TILE + v * L);
                let c = Rows { ptr: s.ot.wrapping_add(r0 * TILE + v * L), stride: TILE };
                // SAFETY: rows `[r0, r0 + rows)` of `oᵀ`, words `[done,
                // hw[v])` of vectors `[v, end)`, all filled.
                unsafe { tile_n(end - v, rows, words - done, a, b, c, start) };
                r0 += rows;
            }
            done = words;
        }
        v0 = end;
    }
}

/// A matrix of words read by broadcasts: `(r, k)` at `ptr + r·rs + k·ks`.
#[derive(Clone, Copy)]
struct Broadcast {
    ptr: *const u32,
    rs: usize,
    ks: usize,
}

/// [`tile`] for `nv ≤ NV` vectors.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn tile_n(nv: usize, rows: usize, depth: usize, a: Broadcast, b: *const u32, c: Rows, start: Start) {
    // SAFETY: forwarded.
    unsafe {
        match nv {
            1 => tile::<1>(rows, depth, a, b, c, start),
            2 => tile::<2>(rows, depth, a, b, c, start),
            _ => unreachable!("attention (bf16): {nv} vectors in a block of {NV}"),
        }
    }
}

/// `C[r, ..V·16] (+)= Σ_k A[r, k] · B[k, ..V·16]` over `depth` words for
/// `r < rows ≤ MR`, `B`'s rows `TILE` words apart: the f32 kernel's block
/// with a `vdpbf16ps` per word (rows past `rows` repeat the last and are
/// not stored).
///
/// # Safety
/// `A` has `rows` rows of `depth` readable words, `B` `depth` rows of
/// `V·16`, `C` `rows` rows of `V·16` writable floats (readable unless
/// `start` is `Zero`; the factors too when `Scaled`); the CPU has the
/// features of [`task`].
#[inline(always)]
#[allow(clippy::needless_range_loop, reason = "indexed loops over constant bounds keep the block in registers")]
unsafe fn tile<const V: usize>(rows: usize, depth: usize, a: Broadcast, b: *const u32, c: Rows, start: Start) {
    // SAFETY: accesses within the matrices the caller described.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; MR];
        if let Start::Load | Start::Scaled(_) = start {
            for r in 0..MR.min(rows) {
                for v in 0..V {
                    let x = _mm512_loadu_ps(c.at(r, v * L));
                    acc[r][v] = match start {
                        Start::Scaled(f) => _mm512_mul_ps(x, _mm512_loadu_ps(f.add(v * L))),
                        _ => x,
                    };
                }
            }
        }
        let mut arow = [a.ptr; MR];
        for r in 0..MR {
            arow[r] = a.ptr.add(r.min(rows - 1) * a.rs);
        }
        for k in 0..depth {
            let mut bv = [_mm512_setzero_si512(); V];
            for v in 0..V {
                bv[v] = _mm512_loadu_si512(b.add(k * TILE + v * L).cast());
            }
            let ak = k * a.ks;
            for r in 0..MR {
                let pair: __m512bh = std::mem::transmute(_mm512_set1_epi32(*arow[r].add(ak) as i32));
                for v in 0..V {
                    acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pair, std::mem::transmute::<__m512i, __m512bh>(bv[v]));
                }
            }
        }
        for r in 0..MR.min(rows) {
            for v in 0..V {
                _mm512_storeu_ps(c.at(r, v * L), acc[r][v]);
            }
        }
    }
}

/// The mask of the first `n ≤ 16` lanes.
#[inline(always)]
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// `dst[k·ds + c] = (src[2k, c], src[2k + 1, c])` rounded to bf16 (the
/// first value in the lower half) for `k < ⌈rows/2⌉`, `c < cols`, rows
/// `ss` apart; a missing last row reads as zeros.
///
/// # Safety
/// `src` has `rows` rows of `cols` readable floats, `dst` `⌈rows/2⌉` rows
/// of `cols` writable words; the features of [`task`].
#[inline(always)]
unsafe fn interleave_rows(src: *const f32, ss: usize, rows: usize, cols: usize, dst: *mut u32, ds: usize) {
    // SAFETY: rows `< rows`, columns `< cols` (masked at the edge).
    unsafe {
        // Word `i` takes 16-bit lanes `i` (the even row) and `16 + i`.
        let order = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
            1, 16, 0,
        );
        for k in 0..rows.div_ceil(2) {
            let (even, odd) = (src.add(2 * k * ss), src.wrapping_add((2 * k + 1) * ss));
            let mut c = 0;
            while c < cols {
                let m = lanes(cols - c);
                let lo = _mm512_maskz_loadu_ps(m, even.add(c));
                let hi = if 2 * k + 1 < rows { _mm512_maskz_loadu_ps(m, odd.add(c)) } else { _mm512_setzero_ps() };
                let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_mask_storeu_epi32(dst.add(k * ds + c).cast(), m, _mm512_permutexvar_epi16(order, halves));
                c += L;
            }
        }
    }
}

/// `dst[r·dw + i] = (src[r, 2i], src[r, 2i + 1])` rounded to bf16 for `r <
/// rows`, `i < dw = ⌈cols/2⌉` (an odd row's last word ends in zero), rows
/// `ss` apart: a row's values in memory order are already its pairs.
///
/// # Safety
/// `src` has `rows` rows of `cols` readable floats, `dst` `rows` rows of
/// `dw` writable words; the features of [`task`].
#[inline(always)]
unsafe fn round_rows(src: *const f32, ss: usize, rows: usize, cols: usize, dst: *mut u32, dw: usize) {
    // SAFETY: rows `< rows`, columns `< cols` (masked at the edge).
    unsafe {
        for r in 0..rows {
            let row = src.add(r * ss);
            let mut c = 0;
            while c < cols {
                let lo = _mm512_maskz_loadu_ps(lanes(cols - c), row.add(c));
                let hi = _mm512_maskz_loadu_ps(lanes((cols - c).saturating_sub(L)), row.wrapping_add(c + L));
                let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let words = (cols - c).min(2 * L).div_ceil(2);
                _mm512_mask_storeu_epi32(dst.add(r * dw + c / 2).cast(), lanes(words), halves);
                c += 2 * L;
            }
        }
    }
}
