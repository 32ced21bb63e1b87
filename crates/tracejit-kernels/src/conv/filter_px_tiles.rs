//! The vector code of the small-filter backward kernel
//! ([`super::filter_px`]): `A` channels × `T` taps tiles over a band's
//! pixel vectors (one generic body over [`crate::simd::Lanes`], `A` and `T` constants so
//! the accumulators are registers), and the sums of `dy` for `db`. A row's
//! last, partial vector is loaded masked.

use std::arch::x86_64::*;

use super::filter_px::PxBlock;
use super::tiles::StoreFirst;

/// Adds one tile's sums over the band into `job.partial`, the tile having
/// `a` channels and `job.offs.len()` taps.
///
/// # Safety
/// The CPU has `lanes` (16: AVX-512F; 8: AVX2 and FMA); `a ≤ 4` and the
/// taps `≤ 6` (at 8 lanes `a ≤ 3`, taps `≤ 4`); every tap's rows read the
/// panel inside it; `job.dy` holds the channels' band rows.
pub(super) unsafe fn accumulate(lanes: usize, a: usize, job: &mut PxBlock) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            accumulate_w16(a, job)
        } else {
            accumulate_w8(a, job)
        }
    }
}

/// [`dispatch`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_w16(a: usize, job: &mut PxBlock) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { dispatch::<__m512>(a, job) }
}

/// [`dispatch`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_w8(a: usize, job: &mut PxBlock) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { dispatch::<__m256>(a, job) }
}

/// Calls `tile::<V, A, T>` for the `(A, T)` pairs used.
macro_rules! pairs {
    ($v:ty, $a:expr, $t:expr, $job:expr) => {
        pairs!(@list $v, $a, $t, $job, [
            (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6),
            (2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6),
            (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (3, 6),
            (4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (4, 6),
        ])
    };
    (@list $v:ty, $a:expr, $t:expr, $job:expr, [$(($x:literal, $y:literal)),* $(,)?]) => {
        match ($a, $t) {
            $(($x, $y) => tile::<$v, $x, $y>($job),)*
            (a, t) => unreachable!("conv: no small-filter tile of {a} channels × {t} taps"),
        }
    };
}

/// The tile for the job's channels and taps.
///
/// # Safety
/// As [`accumulate`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn dispatch<V: StoreFirst>(a: usize, job: &mut PxBlock) {
    // SAFETY: forwarded.
    unsafe { pairs!(V, a, job.offs.len(), job) }
}

/// `partial[a][t] += Σ dy_a(p) · x_t(p)` over the band's pixels, a vector
/// of a row at a time (the last one masked), one FMA chain per pair.
///
/// # Safety
/// As [`dispatch`]; `job.offs.len() == T`, `job.partial` holds `A · T ·
/// LANES` values.
#[inline(always)]
unsafe fn tile<V: StoreFirst, const A: usize, const T: usize>(job: &mut PxBlock) {
    let n = V::LANES;
    let (whole, rest) = (job.ow_n / n * n, job.ow_n % n);
    // SAFETY: the features of `V`; row `r`'s pixels `0..ow_n` of every tap
    // lie in the panel and of every channel in `dy`; the masked loads read
    // the row's last `rest` pixels only.
    unsafe {
        let mut acc = [[V::zero(); T]; A];
        for r in 0..job.rows {
            let mut ys = [std::ptr::null::<f32>(); A];
            for (a, y) in ys.iter_mut().enumerate() {
                *y = job.dy.as_ptr().add(a * job.plane + r * job.ow_n);
            }
            let mut xs = [std::ptr::null::<f32>(); T];
            for (x, &o) in xs.iter_mut().zip(job.offs) {
                *x = job.panel.as_ptr().add(o as usize + r * job.row_step);
            }
            let mut p = 0;
            while p < whole {
                step::<V, A, T>(&mut acc, &ys, &xs, p, n);
                p += n;
            }
            if rest > 0 {
                step::<V, A, T>(&mut acc, &ys, &xs, whole, rest);
            }
        }
        let out = job.partial.as_mut_ptr();
        for (a, row) in acc.iter().enumerate() {
            for (t, v) in row.iter().enumerate() {
                let p = out.add((a * T + t) * n);
                V::load(p).add(*v).store(p);
            }
        }
    }
}

/// One vector of pixels `p..p + count` (`count == LANES`, or fewer: the
/// row's last, loaded masked) into the accumulators.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn step<V: StoreFirst, const A: usize, const T: usize>(
    acc: &mut [[V; T]; A],
    ys: &[*const f32; A],
    xs: &[*const f32; T],
    p: usize,
    count: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut xv = [V::zero(); T];
        for (v, &x) in xv.iter_mut().zip(xs) {
            *v = load::<V>(x.add(p), count);
        }
        for (row, &y) in acc.iter_mut().zip(ys) {
            let yv = load::<V>(y.add(p), count);
            for (a, x) in row.iter_mut().zip(&xv) {
                *a = yv.fma(*x, *a);
            }
        }
    }
}

/// `count` values from `q`: a whole vector, or fewer (the rest zero, not
/// read). A function, not a closure: a closure would not get the features.
///
/// # Safety
/// The features of `V`; the values exist.
#[inline(always)]
unsafe fn load<V: StoreFirst>(q: *const f32, count: usize) -> V {
    // SAFETY: forwarded from the caller.
    unsafe {
        if count == V::LANES {
            V::load(q)
        } else {
            V::load_range(q, 0, count)
        }
    }
}

/// `sums[c][lane] += Σ dy_c` over `pixels` adjacent values of each of
/// `channels` planes (`plane` apart), a vector at a time, the last masked.
///
/// # Safety
/// The CPU has `lanes`; the values exist; `sums` holds `channels · lanes`.
pub(super) unsafe fn sum_rows(
    lanes: usize,
    dy: &[f32],
    plane: usize,
    channels: usize,
    pixels: usize,
    sums: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if lanes == 16 {
            sum_rows_w16(dy, plane, channels, pixels, sums)
        } else {
            sum_rows_w8(dy, plane, channels, pixels, sums)
        }
    }
}

/// [`sum_rows_at`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn sum_rows_w16(dy: &[f32], plane: usize, channels: usize, pixels: usize, sums: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { sum_rows_at::<__m512>(dy, plane, channels, pixels, sums) }
}

/// [`sum_rows_at`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_rows_w8(dy: &[f32], plane: usize, channels: usize, pixels: usize, sums: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { sum_rows_at::<__m256>(dy, plane, channels, pixels, sums) }
}

/// See [`sum_rows`].
///
/// # Safety
/// As [`sum_rows`], with the features of `V` enabled in the caller.
#[inline(always)]
unsafe fn sum_rows_at<V: StoreFirst>(dy: &[f32], plane: usize, channels: usize, pixels: usize, sums: &mut [f32]) {
    let n = V::LANES;
    for c in 0..channels {
        // SAFETY: channel c's pixels and lanes of `sums` (see `sum_rows`).
        unsafe {
            let src = dy.as_ptr().add(c * plane);
            let dst = sums.as_mut_ptr().add(c * n);
            let mut acc = V::load(dst);
            let mut p = 0;
            while p + n <= pixels {
                acc = acc.add(V::load(src.add(p)));
                p += n;
            }
            if p < pixels {
                acc = acc.add(V::load_range(src.add(p), 0, pixels - p));
            }
            acc.store(dst);
        }
    }
}
