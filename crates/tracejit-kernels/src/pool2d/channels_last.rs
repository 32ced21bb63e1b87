//! Max and average pooling with channels last: `x [batch, in_h, in_w,
//! channels]` to `y [batch, out_h, out_w, channels]`, the layout the
//! channels-last convolutions keep between them (ResNet's stem pools their
//! output, its head averages the last block's).
//!
//! Each output pixel folds its window as the NCHW pool's general loops do,
//! a whole row of channels at a time: each column of the window over its
//! rows first, then the columns in order. The max takes `v > m || v is
//! NaN` (the order decides which of +0 and -0 a tie keeps); the mean sums
//! each column from 0 over the rows, the columns from 0, and divides by
//! the in-bounds count. So the values are the bits [`super::max_forward`]
//! and [`super::avg_forward`] give on the transposed input. The channel
//! loops are selects and adds that the compiler vectorizes, compiled once
//! per vector width the CPU may have (ResNet-50's stem pool at batch 8,
//! `[8, 112, 112, 64]`: 3.1 ms in the baseline's 128-bit code); output
//! rows are cut over the thread pool in chunks fixed by the sizes.

use super::{each_part, takes, Pool2dGeometry};
use crate::{Isa, Width};

/// `y` = the maximum of each window (NaN if it holds NaN), channels last;
/// overwritten. Geometry and semantics as [`super::max_forward`], in the
/// widest vector code of the CPU the current [`Isa`] allows.
///
/// ```
/// use tracejit_kernels::pool2d::{self, Pool2dGeometry};
///
/// // Two channels of a 2x2 image, [h, w, c] order; one 2x2 window.
/// let g = Pool2dGeometry { batch: 1, channels: 2, in_h: 2, in_w: 2, kernel: [2, 2], stride: [1, 1], pad: [0; 4] };
/// let mut y = [0.0; 2];
/// pool2d::max_forward_channels_last(&g, &[1.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0], &mut y);
/// assert_eq!(y, [4.0, -1.0]);
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn max_forward_channels_last(g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    g.check("max_forward_channels_last", &[("x", x.len(), true), ("y", y.len(), false)]);
    forward(Kind::Max, g, x, y, Isa::current().width());
}

/// `y` = the mean of each window's in-bounds values, channels last;
/// overwritten. Geometry and semantics as [`super::avg_forward`]
/// (`count_include_pad = false`), in the widest vector code of the CPU
/// `isa` allows.
///
/// ```
/// use tracejit_kernels::pool2d::{self, Pool2dGeometry};
/// use tracejit_kernels::Isa;
///
/// // Two channels of a 2x2 image, [h, w, c] order; a global mean.
/// let g = Pool2dGeometry { batch: 1, channels: 2, in_h: 2, in_w: 2, kernel: [2, 2], stride: [1, 1], pad: [0; 4] };
/// let mut y = [0.0; 2];
/// pool2d::avg_forward_channels_last(&g, &[1.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0], &mut y, Isa::native());
/// assert_eq!(y, [2.5, -2.5]);
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn avg_forward_channels_last(g: &Pool2dGeometry, x: &[f32], y: &mut [f32], isa: Isa) {
    g.check("avg_forward_channels_last", &[("x", x.len(), true), ("y", y.len(), false)]);
    forward(Kind::Avg, g, x, y, isa.width());
}

/// Which reduction a pass runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Max,
    Avg,
}

/// Every output row `(image, oh)` of `kind`, rows cut over the pool, each
/// in the vector code of `width` (`None`: the baseline's).
fn forward(kind: Kind, g: &Pool2dGeometry, x: &[f32], y: &mut [f32], width: Option<Width>) {
    let (c, oh_n) = (g.channels, g.out_h());
    let row = g.out_w() * c;
    let values = x.len() + y.len();
    each_part(g.batch * oh_n, y, row, values, &|r, out| {
        let (n, oh) = (r / oh_n, r % oh_n);
        let image = &x[n * g.in_h * g.in_w * c..][..g.in_h * g.in_w * c];
        COLUMNS.with_borrow_mut(|columns| {
            columns.resize(g.in_w * c, 0.0);
            let columns = &mut columns[..g.in_w * c];
            match width {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::width` gave W16 only where the CPU has AVX-512F.
                Some(Width::W16) => unsafe { row_w16(kind, g, image, oh, out, columns) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::width` gave W8 only where the CPU has AVX2.
                Some(Width::W8) => unsafe { row_w8(kind, g, image, oh, out, columns) },
                _ => output_row(kind, g, image, oh, out, columns),
            }
        });
    });
}

thread_local! {
    /// A row's column reductions, kept between rows and calls on this
    /// thread (a fresh 28 KiB per output row of ResNet's stem pool was
    /// an allocation and a clearing per 14 KiB of output).
    static COLUMNS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`output_row`] compiled for AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn row_w16(kind: Kind, g: &Pool2dGeometry, image: &[f32], oh: usize, out: &mut [f32], columns: &mut [f32]) {
    output_row(kind, g, image, oh, out, columns)
}

/// [`output_row`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_w8(kind: Kind, g: &Pool2dGeometry, image: &[f32], oh: usize, out: &mut [f32], columns: &mut [f32]) {
    output_row(kind, g, image, oh, out, columns)
}

/// Output row `oh` of one image (`out`: its `out_w · channels` values),
/// `columns` room for a row of `in_w · channels` values: first every input
/// column's reduction over the window's rows, then each output's over its
/// window's columns (a column serves every window that holds it: with
/// ResNet's 3-wide stride-2 windows, two in three columns are computed
/// once instead of twice). A first step takes two operands, never a copy
/// of one (the copies were a third of the pool's time).
#[inline(always)]
fn output_row(kind: Kind, g: &Pool2dGeometry, image: &[f32], oh: usize, out: &mut [f32], columns: &mut [f32]) {
    let c = g.channels;
    let rows = g.window(0, oh);
    let pixel = |ih: usize, iw: usize| &image[(ih * g.in_w + iw) * c..][..c];
    if !rows.is_empty() {
        for (iw, col) in columns.chunks_exact_mut(c).enumerate() {
            let mut rest = rows.clone();
            let first = pixel(rest.next().unwrap_or_default(), iw);
            match (kind, rest.next()) {
                (Kind::Max, Some(ih)) => max_of(col, first, pixel(ih, iw)),
                (Kind::Max, None) => col.copy_from_slice(first),
                (Kind::Avg, next) => {
                    zero_plus(col, first);
                    if let Some(ih) = next {
                        add_into(col, pixel(ih, iw));
                    }
                }
            }
            for ih in rest {
                fold(kind, col, pixel(ih, iw));
            }
        }
    }
    let column = |iw: usize| &columns[iw * c..][..c];
    for (ow, dst) in out.chunks_exact_mut(c).enumerate() {
        let cols = g.window(1, ow);
        if rows.is_empty() || cols.is_empty() {
            // A window wholly in the padding (not reachable with pads
            // below the window's size): the NCHW pools' -inf and 0 / 0.
            dst.fill(if kind == Kind::Max { f32::NEG_INFINITY } else { f32::NAN });
            continue;
        }
        let count = (rows.len() * cols.len()) as f32;
        let mut rest = cols;
        let first = column(rest.next().unwrap_or_default());
        match (kind, rest.next()) {
            (Kind::Max, Some(iw)) => max_of(dst, first, column(iw)),
            (Kind::Max, None) => dst.copy_from_slice(first),
            (Kind::Avg, next) => {
                zero_plus(dst, first);
                if let Some(iw) = next {
                    add_into(dst, column(iw));
                }
            }
        }
        for iw in rest {
            fold(kind, dst, column(iw));
        }
        if kind == Kind::Avg {
            for v in dst.iter_mut() {
                *v /= count;
            }
        }
    }
}

/// One more term of a reduction: the max or the sum.
#[inline(always)]
fn fold(kind: Kind, acc: &mut [f32], src: &[f32]) {
    match kind {
        Kind::Max => max_into(acc, src),
        Kind::Avg => add_into(acc, src),
    }
}

/// `out = a`, then `b` where it takes the max (as a copy of `a` and a
/// [`max_into`] of `b`).
#[inline(always)]
fn max_of(out: &mut [f32], a: &[f32], b: &[f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = if takes(b, a) { b } else { a };
    }
}

/// `acc = v` where `v` takes the max (greater, or NaN).
#[inline(always)]
fn max_into(acc: &mut [f32], src: &[f32]) {
    for (m, &v) in acc.iter_mut().zip(src) {
        *m = if takes(v, *m) { v } else { *m };
    }
}

/// `acc += src`.
#[inline(always)]
fn add_into(acc: &mut [f32], src: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(src) {
        *a += v;
    }
}

/// `acc = 0 + src`: the first term of a sum from 0 (so -0 becomes +0, as
/// the NCHW loops' sums do).
#[inline(always)]
fn zero_plus(acc: &mut [f32], src: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(src) {
        *a = 0.0 + v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values with NaN, infinities and both zeros among ordinary ones.
    fn values(len: usize, mut seed: u32) -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                match seed % 23 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    _ => (seed % 1000) as f32 / 100.0 - 5.0,
                }
            })
            .collect()
    }

    /// `[n, c, hw]` values as `[n, hw, c]`.
    fn last(v: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
        let mut out = vec![0.0; v.len()];
        for i in 0..n {
            for ch in 0..c {
                for p in 0..hw {
                    out[(i * hw + p) * c + ch] = v[(i * c + ch) * hw + p];
                }
            }
        }
        out
    }

    /// Against the NCHW pools on the transposed input, bit for bit (any
    /// NaN as NaN), at every vector width the CPU has, with NaN, infinities,
    /// ties of ±0, padding, strides, odd sizes and a global window.
    #[test]
    fn matches_the_nchw_pools_bit_for_bit() {
        let shapes = [
            ([2, 5, 7, 9], [3, 3], [2, 2], [1, 1, 1, 1]),
            ([1, 17, 12, 11], [2, 3], [1, 2], [0, 1, 1, 2]),
            ([3, 1, 4, 4], [2, 2], [2, 2], [0; 4]),
            ([1, 64, 16, 16], [3, 3], [2, 2], [1, 1, 1, 1]),
            ([2, 37, 7, 7], [7, 7], [1, 1], [0; 4]),
        ];
        let widths = [None, Isa::native().width().filter(|w| *w == Width::W8), Isa::native().width()];
        for (s, ([n, c, h, w], kernel, stride, pad)) in shapes.into_iter().enumerate() {
            let g = Pool2dGeometry { batch: n, channels: c, in_h: h, in_w: w, kernel, stride, pad };
            let x = values(n * c * h * w, 0x1234_5678 + s as u32);
            let bits =
                |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
            for kind in [Kind::Max, Kind::Avg] {
                let mut want = vec![0.0; n * c * g.out_h() * g.out_w()];
                match kind {
                    Kind::Max => super::super::max_forward(&g, &x, &mut want, Isa::native()),
                    Kind::Avg => super::super::avg_forward(&g, &x, &mut want, Isa::native()),
                }
                let want = last(&want, n, c, g.out_h() * g.out_w());
                for width in widths {
                    let mut got = vec![0.0; want.len()];
                    forward(kind, &g, &last(&x, n, c, h * w), &mut got, width);
                    let (gb, wb) = (bits(&got), bits(&want));
                    if let Some(i) = (0..gb.len()).find(|&i| gb[i] != wb[i]) {
                        panic!(
                            "{g:?} {} at {width:?}: at {i} (pixel {}, channel {}): {} vs {}",
                            if kind == Kind::Max { "max" } else { "avg" },
                            i / c,
                            i % c,
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }

    /// The public entry points run the same loops.
    #[test]
    fn entry_points_agree_with_the_loops() {
        let g = Pool2dGeometry {
            batch: 2,
            channels: 19,
            in_h: 9,
            in_w: 6,
            kernel: [3, 2],
            stride: [2, 1],
            pad: [1, 0, 1, 1],
        };
        let x = values(2 * 19 * 9 * 6, 99);
        let len = 2 * 19 * g.out_h() * g.out_w();
        // NaN as one value: which NaN a sum of NaN and ∞ - ∞ keeps depends
        // on the operands' order in the compiled code.
        let bits = |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
        let (mut a, mut b) = (vec![0.0; len], vec![0.0; len]);
        max_forward_channels_last(&g, &x, &mut a);
        forward(Kind::Max, &g, &x, &mut b, None);
        assert_eq!(bits(&a), bits(&b));
        avg_forward_channels_last(&g, &x, &mut a, Isa::native());
        forward(Kind::Avg, &g, &x, &mut b, None);
        assert_eq!(bits(&a), bits(&b));
    }
}
