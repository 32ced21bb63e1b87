//! The vector code of the backward-filter kernel ([`super::filter`]): the
//! transposition of a band's `dy` into `dyᵀ` (square register transposes,
//! 16×16 with AVX-512F, 8×8 with AVX2), and the `T` taps × `C` channel
//! vectors tiles, one generic body over [`Lanes`] with `T` and `C`
//! constants (one instance per pair used) so the accumulators are
//! registers. Hot code is plain loops: a closure would be compiled without
//! the entry points' target features.

use std::arch::x86_64::*;

use super::filter::FilterBlock;
use crate::simd::Lanes;

/// `dyt[p·cv + o] = dy[o·stride + p]` for `o < channels`, zero for the
/// lanes up to `cv`, over `pixels` pixels.
///
/// # Safety
/// The CPU has `lanes` (16: AVX-512F; 8: AVX2 + FMA); `dy` addresses
/// `channels` rows of `pixels` values at `stride`; `dyt` holds `pixels ·
/// cv` values, `cv` a multiple of `lanes` at least `channels`.
pub(super) unsafe fn transpose(
    lanes: usize,
    dy: *const f32,
    stride: usize,
    channels: usize,
    pixels: usize,
    dyt: &mut [f32],
    cv: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            transpose_w16(dy, stride, channels, pixels, dyt, cv)
        } else {
            transpose_w8(dy, stride, channels, pixels, dyt, cv)
        }
    }
}

/// [`transpose_at`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_w16(dy: *const f32, stride: usize, channels: usize, pixels: usize, dyt: &mut [f32], cv: usize) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { transpose_at::<__m512>(dy, stride, channels, pixels, dyt, cv) }
}

/// [`transpose_at`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_w8(dy: *const f32, stride: usize, channels: usize, pixels: usize, dyt: &mut [f32], cv: usize) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { transpose_at::<__m256>(dy, stride, channels, pixels, dyt, cv) }
}

/// A square transpose of `LANES × LANES` values.
trait Square: Lanes {
    /// Column `j` of the `rows` rows at `src` (row `i` at `src + i·ss`, the
    /// rows past `rows` zero) stored at `dst + j·ds`.
    ///
    /// # Safety
    /// The features of `Self`; the rows are readable and the columns
    /// writable as described.
    unsafe fn transpose(src: *const f32, ss: usize, rows: usize, dst: *mut f32, ds: usize);
}

impl Square for __m512 {
    #[inline(always)]
    unsafe fn transpose(src: *const f32, ss: usize, rows: usize, dst: *mut f32, ds: usize) {
        // SAFETY: forwarded from the caller.
        unsafe {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, v) in r.iter_mut().enumerate().take(rows) {
                *v = _mm512_loadu_ps(src.add(i * ss));
            }
            // Pairs of rows interleaved, then pairs of pairs: each 128-bit
            // lane `l` of u[4i + k] holds column 4l + k of rows 4i..4i + 4.
            let mut u = [_mm512_setzero_ps(); 16];
            for i in 0..4 {
                let t0 = _mm512_unpacklo_ps(r[4 * i], r[4 * i + 1]);
                let t1 = _mm512_unpackhi_ps(r[4 * i], r[4 * i + 1]);
                let t2 = _mm512_unpacklo_ps(r[4 * i + 2], r[4 * i + 3]);
                let t3 = _mm512_unpackhi_ps(r[4 * i + 2], r[4 * i + 3]);
                let (t0, t1, t2, t3) =
                    (_mm512_castps_pd(t0), _mm512_castps_pd(t1), _mm512_castps_pd(t2), _mm512_castps_pd(t3));
                u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
                u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
                u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
                u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
            }
            // Then the 128-bit lanes gathered: column 4l + k is lanes l of
            // u[k], u[4 + k], u[8 + k], u[12 + k].
            for k in 0..4 {
                let v0 = _mm512_shuffle_f32x4::<0x88>(u[k], u[4 + k]);
                let v1 = _mm512_shuffle_f32x4::<0xdd>(u[k], u[4 + k]);
                let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + k], u[12 + k]);
                let v3 = _mm512_shuffle_f32x4::<0xdd>(u[8 + k], u[12 + k]);
                _mm512_storeu_ps(dst.add(k * ds), _mm512_shuffle_f32x4::<0x88>(v0, v2));
                _mm512_storeu_ps(dst.add((4 + k) * ds), _mm512_shuffle_f32x4::<0x88>(v1, v3));
                _mm512_storeu_ps(dst.add((8 + k) * ds), _mm512_shuffle_f32x4::<0xdd>(v0, v2));
                _mm512_storeu_ps(dst.add((12 + k) * ds), _mm512_shuffle_f32x4::<0xdd>(v1, v3));
            }
        }
    }
}

impl Square for __m256 {
    #[inline(always)]
    unsafe fn transpose(src: *const f32, ss: usize, rows: usize, dst: *mut f32, ds: usize) {
        // SAFETY: forwarded from the caller.
        unsafe {
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, v) in r.iter_mut().enumerate().take(rows) {
                *v = _mm256_loadu_ps(src.add(i * ss));
            }
            // Each 128-bit half `h` of u[4i + k] holds column 4h + k of rows
            // 4i..4i + 4.
            let mut u = [_mm256_setzero_ps(); 8];
            for i in 0..2 {
                let t0 = _mm256_unpacklo_ps(r[4 * i], r[4 * i + 1]);
                let t1 = _mm256_unpackhi_ps(r[4 * i], r[4 * i + 1]);
                let t2 = _mm256_unpacklo_ps(r[4 * i + 2], r[4 * i + 3]);
                let t3 = _mm256_unpackhi_ps(r[4 * i + 2], r[4 * i + 3]);
                u[4 * i] = _mm256_shuffle_ps::<0x44>(t0, t2);
                u[4 * i + 1] = _mm256_shuffle_ps::<0xee>(t0, t2);
                u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
                u[4 * i + 3] = _mm256_shuffle_ps::<0xee>(t1, t3);
            }
            for k in 0..4 {
                _mm256_storeu_ps(dst.add(k * ds), _mm256_permute2f128_ps::<0x20>(u[k], u[4 + k]));
                _mm256_storeu_ps(dst.add((4 + k) * ds), _mm256_permute2f128_ps::<0x31>(u[k], u[4 + k]));
            }
        }
    }
}

/// See [`transpose`]: whole `LANES × LANES` blocks, the last pixels one by
/// one.
///
/// # Safety
/// As [`transpose`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn transpose_at<V: Square>(
    dy: *const f32,
    stride: usize,
    channels: usize,
    pixels: usize,
    dyt: &mut [f32],
    cv: usize,
) {
    let n = V::LANES;
    let whole = pixels / n * n;
    let out = dyt.as_mut_ptr();
    for p0 in (0..whole).step_by(n) {
        for o0 in (0..cv).step_by(n) {
            let rows = channels.saturating_sub(o0).min(n);
            // SAFETY: rows `o0..o0 + rows` of the band, pixels `p0..p0 + n`;
            // `dyt` rows `p0..p0 + n`, lanes `o0..o0 + n` (see `transpose`).
            unsafe { V::transpose(dy.add(o0 * stride + p0), stride, rows, out.add(p0 * cv + o0), cv) };
        }
    }
    for p in whole..pixels {
        for o in 0..cv {
            // SAFETY: as above, one value at a time.
            dyt[p * cv + o] = if o < channels { unsafe { *dy.add(o * stride + p) } } else { 0.0 };
        }
    }
}

/// `sums[c] += Σ_p dyt[p·cv + c]` over `pixels` pixels, in pixel order.
///
/// # Safety
/// The CPU has `lanes`; `dyt` holds `pixels · cv` values, `sums` holds
/// `cv`, a multiple of `lanes`.
pub(super) unsafe fn sum_pixels(lanes: usize, dyt: &[f32], pixels: usize, cv: usize, sums: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            sum_pixels_w16(dyt, pixels, cv, sums)
        } else {
            sum_pixels_w8(dyt, pixels, cv, sums)
        }
    }
}

/// [`sum_pixels_at`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn sum_pixels_w16(dyt: &[f32], pixels: usize, cv: usize, sums: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { sum_pixels_at::<__m512>(dyt, pixels, cv, sums) }
}

/// [`sum_pixels_at`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_pixels_w8(dyt: &[f32], pixels: usize, cv: usize, sums: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { sum_pixels_at::<__m256>(dyt, pixels, cv, sums) }
}

/// See [`sum_pixels`].
///
/// # Safety
/// As [`sum_pixels`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn sum_pixels_at<V: Lanes>(dyt: &[f32], pixels: usize, cv: usize, sums: &mut [f32]) {
    for c0 in (0..cv).step_by(V::LANES) {
        // SAFETY: lanes `c0..c0 + LANES` of `sums` and of every pixel.
        unsafe {
            let mut acc = V::load(sums.as_ptr().add(c0));
            for p in 0..pixels {
                acc = acc.add(V::load(dyt.as_ptr().add(p * cv + c0)));
            }
            acc.store(sums.as_mut_ptr().add(c0));
        }
    }
}

/// Adds one tile's sums into `job.dwt` at `lanes` lanes.
///
/// # Safety
/// The CPU has `lanes`; `job.offs` holds at most 12 taps (fewer with more
/// channel vectors, see `filter::taps_per_tile`) whose reads of the rows'
/// pixels stay inside the panel; `job.dyt` and `job.dwt` hold what
/// [`FilterBlock`] says.
pub(super) unsafe fn accumulate(lanes: usize, job: &mut FilterBlock) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            accumulate_w16(job)
        } else {
            accumulate_w8(job)
        }
    }
}

/// [`dispatch`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_w16(job: &mut FilterBlock) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { dispatch::<__m512>(job) }
}

/// [`dispatch`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_w8(job: &mut FilterBlock) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { dispatch::<__m256>(job) }
}

/// Calls `tile::<V, T, C>` for the `(T, C)` pairs plans use.
macro_rules! pairs {
    ($v:ty, $t:expr, $c:expr, $job:expr) => {
        pairs!(@list $v, $t, $c, $job, [
            (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1),
            (7, 1), (8, 1), (9, 1), (10, 1), (11, 1), (12, 1),
            (1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 2),
            (7, 2), (8, 2), (9, 2), (10, 2), (11, 2), (12, 2),
            (1, 3), (2, 3), (3, 3), (4, 3), (5, 3), (6, 3),
            (7, 3), (8, 3), (1, 4), (2, 4), (3, 4), (4, 4),
            (5, 4), (6, 4),
        ])
    };
    (@list $v:ty, $t:expr, $c:expr, $job:expr, [$(($x:literal, $y:literal)),* $(,)?]) => {
        match ($t, $c) {
            $(($x, $y) => tile::<$v, $x, $y>($job),)*
            (t, c) => unreachable!("conv: no filter tile of {t} taps × {c} vectors"),
        }
    };
}

/// The tile for the job's taps and channel vectors.
///
/// # Safety
/// As [`accumulate`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn dispatch<V: Lanes>(job: &mut FilterBlock) {
    // SAFETY: forwarded.
    unsafe { pairs!(V, job.offs.len(), job.cv / V::LANES, job) }
}

/// `dwt[t][c] += Σ_(r, ow) x_t(r, ow) · dyt[(r, ow)][c]`: the band's pixels
/// in order, one FMA chain per accumulator.
///
/// # Safety
/// As [`dispatch`]; `job.offs.len() == T`, `job.cv == C · V::LANES`.
#[inline(always)]
unsafe fn tile<V: Lanes, const T: usize, const C: usize>(job: &mut FilterBlock) {
    // SAFETY: the features of `V`; every tap's row `r` holds `ow_n` values
    // from its base; `dyt` holds `rows · ow_n` pixels of `cv` values; `dwt`
    // holds `T · cv` values.
    unsafe {
        let mut acc = [[V::zero(); C]; T];
        let mut d = job.dyt.as_ptr();
        for r in 0..job.rows {
            let mut base = [std::ptr::null::<f32>(); T];
            for (b, &o) in base.iter_mut().zip(job.offs) {
                *b = job.panel.as_ptr().add(o as usize + r * job.row_step);
            }
            for ow in 0..job.ow_n {
                let mut ys = [V::zero(); C];
                for (c, y) in ys.iter_mut().enumerate() {
                    *y = V::load(d.add(c * V::LANES));
                }
                for t in 0..T {
                    let xb = V::splat(*base[t].add(ow));
                    for c in 0..C {
                        acc[t][c] = ys[c].fma(xb, acc[t][c]);
                    }
                }
                d = d.add(job.cv);
            }
        }
        let out = job.dwt.as_mut_ptr();
        for (t, row) in acc.iter().enumerate() {
            for (c, a) in row.iter().enumerate() {
                let p = out.add(t * job.cv + c * V::LANES);
                V::load(p).add(*a).store(p);
            }
        }
    }
}
