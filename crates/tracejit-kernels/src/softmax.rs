//! The row softmax `y = exp(x - max(x)) / sum(exp(x - max(x)))` over f32
//! rows, in 512-bit AVX-512 or 256-bit AVX2 code with `exp` computed
//! straight into the output row; the JIT runs its f32 softmax regions
//! through [`rows`], and composite kernels call [`row`].
//!
//! Results: the max is the reference's (a NaN row is scanned again in
//! order); every `exp` is [`crate::fastmath::exp`] bit for bit; the row
//! sum adds in four partial vectors of 8 or 16 lanes, by index from the
//! row's start, so the bits depend on the row alone, not on where its
//! buffers lie (the generated kernel's sum adds in another order: outputs
//! agree with it within the sum's rounding); the last pass multiplies by
//! the sum's reciprocal when that is a normal number, else divides.
//! Without AVX2 + FMA or AVX-512F, [`row`] runs the same steps in scalar
//! code (the sum in order).

use crate::{Isa, Width};

/// `y = softmax(x)` over one row with the vector code `isa` allows on this
/// CPU, else scalar code.
///
/// ```
/// use tracejit_kernels::{softmax, Isa};
///
/// let mut y = [0.0f32; 3];
/// softmax::row(&[1.0, 2.0, 3.0], &mut y, Isa::native());
/// assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-6 && y[2] > y[1]);
/// ```
///
/// # Panics
/// If `x` and `y` differ in length.
pub fn row(x: &[f32], y: &mut [f32], isa: Isa) {
    assert_eq!(x.len(), y.len(), "softmax_row: input and output lengths differ");
    if x.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = isa.width() {
        // SAFETY: `width` found the features; the slices have equal lengths.
        unsafe {
            match w {
                Width::W16 => simd::row_x16(x, y),
                Width::W8 => simd::row_x8(x, y),
            }
        }
        return;
    }
    let _ = isa;
    scalar_row(x, y);
}

/// The portable form of [`row`].
fn scalar_row(x: &[f32], y: &mut [f32]) {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m.is_nan() || m >= v { m } else { v });
    let mut s = 0.0f32;
    for (o, &v) in y.iter_mut().zip(x) {
        *o = crate::fastmath::exp(v - m);
        s += *o;
    }
    if s.abs() >= f32::MIN_POSITIVE && s.abs() <= 2f32.powi(126) {
        let r = 1.0 / s;
        y.iter_mut().for_each(|v| *v *= r);
    } else {
        y.iter_mut().for_each(|v| *v /= s);
    }
}

/// `rows` rows of `n` values: `x` and `y` advance by `xs` and `ys` bytes
/// per row, elements contiguous within a row, at width `w`.
///
/// # Safety
/// The pointers address `rows` rows of `n` readable (input) and writable
/// (output) f32 values at those strides, the output not aliasing the
/// input; the CPU has the features of `w` (see [`Isa::width`]).
pub unsafe fn rows(rows: usize, n: usize, x: *const f32, xs: isize, y: *mut f32, ys: isize, w: Width) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        match w {
            Width::W16 => simd::rows_x16(rows, n, x, xs, y, ys),
            Width::W8 => simd::rows_x8(rows, n, x, xs, y, ys),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, n, x, xs, y, ys, w);
        unreachable!("no vector width exists off x86_64");
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use crate::simd::lanes::Lanes;
    use crate::simd::recipes::exp;

    macro_rules! entry_points {
        ($rows:ident, $row:ident, $v:ty, $features:literal) => {
            /// `rows` rows of `n` f32 values, `x` and `y` advancing by
            /// `xs` and `ys` bytes per row, inner elements contiguous.
            ///
            /// # Safety
            /// The pointers address `rows` rows of `n` readable (input) and
            /// writable (output) f32 values at those strides, the output
            /// not aliasing the input; the CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $rows(rows: usize, n: usize, x: *const f32, xs: isize, y: *mut f32, ys: isize) {
                if n == 0 {
                    return;
                }
                for r in 0..rows as isize {
                    // SAFETY: forwarded from the caller.
                    unsafe {
                        let xr = x.byte_offset(r * xs);
                        let yr = y.byte_offset(r * ys);
                        row::<$v>(std::slice::from_raw_parts(xr, n), std::slice::from_raw_parts_mut(yr, n));
                    }
                }
            }

            /// One row: `y = softmax(x)`, `x` not empty, `y` as long.
            ///
            /// # Safety
            /// The CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $row(x: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { row::<$v>(x, y) }
            }
        };
    }
    entry_points!(rows_x8, row_x8, __m256, "avx2,fma");
    entry_points!(rows_x16, row_x16, __m512, "avx512f");

    /// Lanes of `v`, first to last.
    #[inline(always)]
    unsafe fn lanes<V: Lanes>(v: V) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: `out` has room for every width's lanes.
        unsafe { v.store(out.as_mut_ptr()) };
        out
    }

    /// One row at width `V`, `x` not empty, `y` as long.
    #[inline(always)]
    unsafe fn row<V: Lanes>(x: &[f32], y: &mut [f32]) {
        let (n, w) = (x.len(), V::LANES);
        // SAFETY: the caller enabled `V`'s features; every load and store
        // below is at an index `i` with `i + w <= n` (vectors) or `i < n`
        // (scalars).
        unsafe {
            let px = x.as_ptr();
            let py = y.as_mut_ptr();
            // Max: one `vmaxps` per vector, NaNs noted aside.
            let mut acc = [V::splat(f32::NEG_INFINITY); 4];
            let mut nan = V::zero();
            let mut i = 0;
            while i + 4 * w <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let v = V::load(px.add(i + w * k));
                    *a = v.max(*a);
                    nan = v.or_nan(nan);
                }
                i += 4 * w;
            }
            while i + w <= n {
                let v = V::load(px.add(i));
                acc[0] = v.max(acc[0]);
                nan = v.or_nan(nan);
                i += w;
            }
            let v = acc[0].max(acc[1]).max(acc[2].max(acc[3]));
            let mut m = lanes(v)[..w].iter().fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
            let mut tail_nan = false;
            for &v in &x[i..] {
                tail_nan |= v.is_nan();
                m = if v > m { v } else { m };
            }
            if tail_nan || nan.any() {
                // The reference's max: its first NaN, payload and all.
                m = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m.is_nan() || m >= v { m } else { v });
            }
            // exp(x - m) into `t`, summed in four partial vectors (and the
            // tail aside): `y`, or a scratch row on the stack where
            // `y` lies a few bytes past a multiple of 4 KiB from `x` (two
            // heap blocks allocated one after the other): there every load
            // of `x` would wait for the store to `y` just before it, whose
            // address matches in the low 12 bits (4K aliasing; W3 ran 15%
            // slower with such buffers).
            let mut scratch = [std::mem::MaybeUninit::<f32>::uninit(); SCRATCH + SCRATCH_SLACK];
            let t = if n <= SCRATCH && aliases(px, py) {
                scratch_row(scratch.as_mut_ptr().cast::<f32>(), px, py)
            } else {
                py
            };
            let mv = V::splat(m);
            let mut sum = [V::zero(); 4];
            let mut i = 0;
            while i + 4 * w <= n {
                for (k, s) in sum.iter_mut().enumerate() {
                    let e = exp(V::load(px.add(i + w * k)).sub(mv));
                    e.store(t.add(i + w * k));
                    *s = s.add(e);
                }
                i += 4 * w;
            }
            while i + w <= n {
                let e = exp(V::load(px.add(i)).sub(mv));
                e.store(t.add(i));
                sum[0] = sum[0].add(e);
                i += w;
            }
            let v = sum[0].add(sum[1]).add(sum[2].add(sum[3]));
            let mut s = lanes(v)[..w].iter().sum::<f32>();
            for (j, &xj) in x.iter().enumerate().skip(i) {
                let e = crate::fastmath::exp(xj - m);
                *t.add(j) = e;
                s += e;
            }
            // y = t / s, as t * (1 / s) when 1 / s is a normal number.
            let scale = s.abs() >= f32::MIN_POSITIVE && s.abs() <= 2f32.powi(126);
            let (r, sv) = (1.0 / s, V::splat(s));
            let rv = V::splat(r);
            let mut i = 0;
            // Both loops written out: a closure would be compiled without
            // the entry point's target features.
            if scale {
                while i + w <= n {
                    V::load(t.add(i)).mul(rv).store(py.add(i));
                    i += w;
                }
                (i..n).for_each(|j| *py.add(j) = *t.add(j) * r);
            } else {
                while i + w <= n {
                    V::load(t.add(i)).div(sv).store(py.add(i));
                    i += w;
                }
                (i..n).for_each(|j| *py.add(j) = *t.add(j) / s);
            }
        }
    }

    /// Longest row that goes through the stack scratch row when its
    /// buffers alias (16 KiB, with the input and output rows within L1).
    const SCRATCH: usize = 4096;
    /// Room to place the scratch row away from both buffers' 4 KiB offsets.
    const SCRATCH_SLACK: usize = 1024;
    /// Distance in bytes, modulo 4 KiB, below which a store to one buffer
    /// and a load from the other are taken for the same address.
    const NEAR: usize = 256;

    /// Circular distance of two addresses' offsets within a 4 KiB page.
    fn page_distance(a: *const f32, b: *const f32) -> usize {
        let d = (a as usize).wrapping_sub(b as usize) % 4096;
        d.min(4096 - d)
    }

    /// True when a row of `x` and the row of `y` at the same index are
    /// nearly a multiple of 4 KiB apart.
    fn aliases(x: *const f32, y: *const f32) -> bool {
        page_distance(x, y) < NEAR
    }

    /// A place for a row in `buf` (`SCRATCH + SCRATCH_SLACK` floats),
    /// 64-byte aligned and at least [`NEAR`] bytes (modulo 4 KiB) from both
    /// `x` and `y`: at most 16 of a page's 64 aligned offsets are near one
    /// of them, and the slack spans 63.
    fn scratch_row(buf: *mut f32, x: *const f32, y: *const f32) -> *mut f32 {
        let base = buf.wrapping_add((buf as usize).wrapping_neg() % 64 / 4);
        (0..SCRATCH_SLACK / 16 - 1)
            .map(|k| base.wrapping_add(16 * k))
            .find(|&t| page_distance(t, x) >= NEAR && page_distance(t, y) >= NEAR)
            .unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every width against the scalar form, over odd lengths, a NaN row and
    /// rows of infinities: equal within the sum's rounding, NaN where the
    /// scalar form gives NaN.
    #[test]
    fn every_width_matches_the_scalar_row() {
        let mut seed = 0x1234_5678u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 20_001) as f32 / 1000.0 - 10.0
        };
        let mut rows: Vec<Vec<f32>> =
            [1, 3, 5, 15, 16, 17, 63, 64, 65, 1023].iter().map(|&n| (0..n).map(|_| rnd()).collect()).collect();
        rows.push(vec![1.0, f32::NAN, 2.0]);
        rows.push(vec![f32::NEG_INFINITY, 0.0, 1.0]);
        rows.push(vec![f32::INFINITY, 0.0]);
        for x in &rows {
            let mut want = vec![0.0; x.len()];
            scalar_row(x, &mut want);
            for isa in [Isa::native(), Isa::native().with_avx512(false)] {
                let mut got = vec![0.0; x.len()];
                row(x, &mut got, isa);
                for (g, w) in got.iter().zip(&want) {
                    let close = (g - w).abs() <= 1e-6 * w.abs().max(1e-30) + 1e-7;
                    assert!(close || (g.is_nan() && w.is_nan()), "{isa:?} on {} values: {g} vs {w}", x.len());
                }
            }
        }
    }
}
