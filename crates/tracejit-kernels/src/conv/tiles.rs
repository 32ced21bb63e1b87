//! The register tiles of the direct convolution ([`super::engine`]), one
//! generic body over [`Lanes`] compiled at 16 lanes (AVX-512F) and 8
//! (AVX2 + FMA).
//!
//! A tile of `A` output channels × `B` pixel vectors keeps its `A·B`
//! accumulators in registers; per tap it loads `B` vectors from the panel
//! (all at the tap's one offset from their starts) and broadcasts `A`
//! weights, then runs `A·B` FMAs — 24 of AVX-512's 32 registers at 8 × 3,
//! 12 of AVX2's 16 at 4 × 3, and 12 at 2 × 6 for groups of one or two
//! channels. `A` and `B` are constants, one instance per pair the plans use
//! (fewer at a block's or band's end), so the accumulators are registers,
//! not memory; a closure would be compiled without the entry point's
//! target features, so the hot code is written as plain loops.
//!
//! Also here: the masked loads and stores the kernels share
//! ([`StoreFirst`]) and the panel's row writer ([`VectorRows`], a masked
//! vector at a time, no library calls for rows of a few values).

use std::arch::x86_64::*;

use super::engine::{BandJob, Block, Shape};
use super::panel::{Panel, RowWriter};
use crate::simd::Lanes;

/// Vectors with masked loads and stores.
pub(super) trait StoreFirst: Lanes {
    /// Writes lanes `0..n` (`n < LANES`) to `p`, leaving the rest of memory
    /// alone.
    ///
    /// # Safety
    /// The features of `Self`; `n` writable values at `p`.
    unsafe fn store_first(self, p: *mut f32, n: usize);

    /// Lanes `lo..hi` (`lo < hi <= LANES`) read from `p + lo..p + hi`, the
    /// others zero (not read: `p` itself may lie outside the buffer).
    ///
    /// # Safety
    /// The features of `Self`; the values of lanes `lo..hi` readable.
    unsafe fn load_range(p: *const f32, lo: usize, hi: usize) -> Self;
}

impl StoreFirst for __m512 {
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, n: usize) {
        // SAFETY: the masked store writes lanes 0..n only.
        unsafe { _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as u16, self) }
    }

    #[inline(always)]
    unsafe fn load_range(p: *const f32, lo: usize, hi: usize) -> Self {
        let mask = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
        // SAFETY: the masked load reads lanes lo..hi only.
        unsafe { _mm512_maskz_loadu_ps(mask, p) }
    }
}

impl StoreFirst for __m256 {
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, n: usize) {
        // SAFETY: the masked store writes the lanes whose mask is negative:
        // 0..n.
        unsafe {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx);
            _mm256_maskstore_ps(p, mask, self)
        }
    }

    #[inline(always)]
    unsafe fn load_range(p: *const f32, lo: usize, hi: usize) -> Self {
        // SAFETY: the masked load reads the lanes whose mask is negative:
        // lo..hi.
        unsafe {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let below = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi as i32), idx);
            let from = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo as i32 - 1));
            _mm256_maskload_ps(p, _mm256_and_si256(below, from))
        }
    }
}

/// Panel rows written a vector at a time (masked at the run's ends).
pub(super) struct VectorRows<V>(std::marker::PhantomData<V>);

impl<V: StoreFirst> RowWriter for VectorRows<V> {
    #[inline(always)]
    unsafe fn row(dst: &mut [f32], first: usize, end: usize, src: &[f32]) {
        let q = dst.len();
        // The source of dst[j] is base + j (only lanes first..end are read).
        let base = src.as_ptr().wrapping_sub(first);
        let mut j = 0;
        while j < q {
            let n = (q - j).min(V::LANES);
            let lo = first.saturating_sub(j).min(n);
            let hi = end.saturating_sub(j).min(n).max(lo);
            // SAFETY: the features of `V` (the caller's); lanes lo..hi read
            // src[j + lo - first..j + hi - first]; lanes 0..n of dst from j.
            unsafe {
                let v = if hi > lo { V::load_range(base.wrapping_add(j), lo, hi) } else { V::zero() };
                if n == V::LANES {
                    v.store(dst.as_mut_ptr().add(j));
                } else {
                    v.store_first(dst.as_mut_ptr().add(j), n);
                }
            }
            j += V::LANES;
        }
    }
}

/// Packs a band's panel ([`Panel::pack_with`]) at `lanes` lanes.
///
/// # Safety
/// The CPU has `lanes` (16: AVX-512F; 8: AVX2 and FMA).
pub(super) unsafe fn pack(lanes: usize, p: &Panel, s: &Shape, x: &[f32], oh0: usize, panel: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            pack_w16(p, s, x, oh0, panel)
        } else {
            pack_w8(p, s, x, oh0, panel)
        }
    }
}

/// [`pack`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn pack_w16(p: &Panel, s: &Shape, x: &[f32], oh0: usize, panel: &mut [f32]) {
    // SAFETY: the features are enabled here.
    unsafe { p.pack_with::<VectorRows<__m512>>(s, x, oh0, panel) }
}

/// [`pack`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_w8(p: &Panel, s: &Shape, x: &[f32], oh0: usize, panel: &mut [f32]) {
    // SAFETY: the features are enabled here.
    unsafe { p.pack_with::<VectorRows<__m256>>(s, x, oh0, panel) }
}

/// Runs every tile of one band at the plan's width.
///
/// # Safety
/// The CPU has the features of the plan's width (16 lanes: AVX-512F; 8:
/// AVX2 and FMA); `job.panel` holds the band's panel and `job.out` the
/// group's writable output planes of the image, written by no one else
/// meanwhile.
pub(super) unsafe fn band(job: &BandJob) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if job.plan.lanes == 16 {
            band_w16(job)
        } else {
            band_w8(job)
        }
    }
}

/// [`band_at`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn band_w16(job: &BandJob) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { band_at::<__m512>(job) }
}

/// [`band_at`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn band_w8(job: &BandJob) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { band_at::<__m256>(job) }
}

/// Calls `tile::<V, A, B>` for the `(A, B)` pairs plans use: up to 8
/// channels × 3 vectors, or 2 channels × 6 vectors for small groups.
macro_rules! dispatch {
    ($v:ty, $a:expr, $b:expr, $args:tt) => {
        dispatch!(@pairs $v, $a, $b, $args, [
            (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6),
            (2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6),
            (3, 1), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3),
            (5, 1), (5, 2), (5, 3), (6, 1), (6, 2), (6, 3),
            (7, 1), (7, 2), (7, 3), (8, 1), (8, 2), (8, 3),
        ])
    };
    (@pairs $v:ty, $a:expr, $b:expr, $args:tt, [$(($x:literal, $y:literal)),* $(,)?]) => {
        match ($a, $b) {
            $(($x, $y) => tile::<$v, $x, $y> $args,)*
            (a, b) => unreachable!("conv: no tile of {a} channels × {b} vectors"),
        }
    };
}

/// Most pixel vectors of a tile.
const B_MAX: usize = 6;

/// The band's tiles: per block of output channels, its pixel vectors in
/// row-major order `b_max` at a time, each at (band row, segment).
///
/// # Safety
/// As [`band`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn band_at<V: StoreFirst>(job: &BandJob) {
    let (p, s) = (job.plan, &job.plan.shape);
    let vectors = job.rows * p.segs;
    let per_kernel_row = s.in_c * s.kernel[1];
    for block in job.blocks {
        let (mut v0, mut r, mut seg) = (0, 0, 0);
        while v0 < vectors {
            let b = (vectors - v0).min(p.b_max);
            let mut at = [(0usize, 0usize); B_MAX];
            let (mut lo, mut hi) = (u32::MAX, 0);
            for v in at.iter_mut().take(b) {
                *v = (r, seg);
                let (first, end) = p.kernel_rows[job.oh0 + r];
                if first < end {
                    (lo, hi) = (lo.min(first), hi.max(end));
                }
                seg += 1;
                if seg == p.segs {
                    (r, seg) = (r + 1, 0);
                }
            }
            let taps = if lo < hi { lo as usize * per_kernel_row..hi as usize * per_kernel_row } else { 0..0 };
            // SAFETY: forwarded; `block` and the vectors `at` are the band's.
            unsafe { dispatch!(V, block.width, b, (job, block, &at, taps)) }
            v0 += b;
        }
    }
}

/// One tile: the block's `A` channels × the `B` vectors at `at` (band
/// row, segment) over `taps`, then the output pass (bias, relu, store; a
/// partial vector masked).
///
/// # Safety
/// As [`band_at`]; `block.width == A`, the vectors lie in the band.
#[inline(always)]
unsafe fn tile<V: StoreFirst, const A: usize, const B: usize>(
    job: &BandJob,
    block: &Block,
    at: &[(usize, usize); B_MAX],
    taps: std::ops::Range<usize>,
) {
    let (p, s) = (job.plan, &job.plan.shape);
    let [oh_n, ow_n] = s.out_hw;
    // Panel values between the starts of two output rows.
    let row_step = p.panel.row_step(s);
    let mut srcs = [std::ptr::null::<f32>(); B];
    let mut outs = [std::ptr::null_mut::<f32>(); B];
    let mut valid = [0usize; B];
    for (i, &(r, seg)) in at.iter().take(B).enumerate() {
        // SAFETY: row `r` of the band and segment `seg` of the row: the
        // panel holds `rows` rows of `segs · lanes` reads past every tap's
        // offset (`Panel::q`); the output row lies in the planes.
        unsafe {
            srcs[i] = job.panel.as_ptr().add(r * row_step + seg * V::LANES);
            outs[i] = job.out.add((block.oc * oh_n + job.oh0 + r) * ow_n + seg * V::LANES);
        }
        valid[i] = (ow_n - seg * V::LANES).min(V::LANES);
    }
    // SAFETY: the block's weights hold `A` values per tap; every tap's
    // offset plus a vector stays inside the panel (see above).
    let acc = unsafe {
        accumulate::<V, A, B>(&p.offs[taps.clone()], p.weights.as_ptr().add(block.at + taps.start * A), &srcs)
    };
    let plane = oh_n * ow_n;
    for (a, acc) in acc.iter().enumerate() {
        let bias = job.bias.map_or(0.0, |b| b[block.oc + a]);
        for i in 0..B {
            // SAFETY: the features of `V`; channel `block.oc + a`'s row
            // segment holds `valid[i]` writable values at `outs[i]`.
            unsafe {
                let mut v = acc[i].add(V::splat(bias));
                if job.relu {
                    // `max` returns its second operand when either is NaN:
                    // NaN stays NaN.
                    v = V::zero().max(v);
                }
                let dst = outs[i].add(a * plane);
                if valid[i] == V::LANES {
                    v.store(dst);
                } else {
                    v.store_first(dst, valid[i]);
                }
            }
        }
    }
}

/// `acc[a][b] = Σ_t w[t][a] · src_b[offs[t]..]` over the taps in order,
/// one FMA each.
///
/// # Safety
/// The features of `V`; `w` holds `A · offs.len()` values; every
/// `srcs[b] + offs[t]` addresses `V::LANES` readable values.
#[inline(always)]
unsafe fn accumulate<V: Lanes, const A: usize, const B: usize>(
    offs: &[u32],
    mut w: *const f32,
    srcs: &[*const f32; B],
) -> [[V; B]; A] {
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut acc = [[V::zero(); B]; A];
        for &o in offs {
            let o = o as usize;
            let mut xs = [V::zero(); B];
            for b in 0..B {
                xs[b] = V::load(srcs[b].add(o));
            }
            for row in acc.iter_mut() {
                let wa = V::splat(*w);
                w = w.add(1);
                for b in 0..B {
                    row[b] = xs[b].fma(wa, row[b]);
                }
            }
        }
        acc
    }
}
