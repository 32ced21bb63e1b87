//! Max pooling with channels last: `x [batch, in_h, in_w, channels]` to `y
//! [batch, out_h, out_w, channels]`, the layout the channels-last
//! convolutions keep between them (ResNet's stem pools their output).
//!
//! Each output pixel folds its window as the NCHW pool's loops do, with
//! their update (`v > m || v is NaN`): each column of the window over its
//! rows first, then the columns in order (the order decides which of +0
//! and -0 a tie keeps), a whole row of channels at a time: the same value
//! as [`super::max_forward`] gives on the transposed input, bit for bit. The channel loop is a select the
//! compiler vectorizes; output rows are cut over the thread pool in chunks
//! fixed by the sizes.

use super::{each_part, takes, Pool2dGeometry};

/// `y` = the maximum of each window (NaN if it holds NaN), channels last;
/// overwritten. Geometry and semantics as [`super::max_forward`].
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
    let (c, [oh_n, ow_n]) = (g.channels, [g.out_h(), g.out_w()]);
    let row = ow_n * c;
    let values = x.len() + y.len();
    each_part(g.batch * oh_n, y, row, values, &|r, out| {
        let (n, oh) = (r / oh_n, r % oh_n);
        let image = &x[n * g.in_h * g.in_w * c..][..g.in_h * g.in_w * c];
        let mut column = vec![0.0f32; c];
        let fold = |acc: &mut [f32], src: &[f32]| {
            for (m, &v) in acc.iter_mut().zip(src) {
                *m = if takes(v, *m) { v } else { *m };
            }
        };
        let rows = g.window(0, oh);
        for (ow, dst) in out.chunks_exact_mut(c).enumerate() {
            let mut first = true;
            for iw in g.window(1, ow).filter(|_| !rows.is_empty()) {
                for (k, ih) in rows.clone().enumerate() {
                    let src = &image[(ih * g.in_w + iw) * c..][..c];
                    if k == 0 {
                        column.copy_from_slice(src);
                    } else {
                        fold(&mut column, src);
                    }
                }
                if first {
                    dst.copy_from_slice(&column);
                    first = false;
                } else {
                    fold(dst, &column);
                }
            }
            if first {
                // A window wholly in the padding (not reachable with pads
                // below the window's size): -inf, as the NCHW pool.
                dst.fill(f32::NEG_INFINITY);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the NCHW pool on the transposed input, bit for bit, with
    /// NaN, infinities, ties of ±0, padding, strides and odd sizes.
    #[test]
    fn matches_the_nchw_pool_bit_for_bit() {
        let mut seed = 0x1234_5678u32;
        let mut next = move || {
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
        };
        let shapes = [
            ([2, 5, 7, 9], [3, 3], [2, 2], [1, 1, 1, 1]),
            ([1, 17, 12, 11], [2, 3], [1, 2], [0, 1, 1, 2]),
            ([3, 1, 4, 4], [2, 2], [2, 2], [0; 4]),
            ([1, 64, 16, 16], [3, 3], [2, 2], [1, 1, 1, 1]),
        ];
        for ([n, c, h, w], kernel, stride, pad) in shapes {
            let g = Pool2dGeometry { batch: n, channels: c, in_h: h, in_w: w, kernel, stride, pad };
            let x: Vec<f32> = (0..n * c * h * w).map(|_| next()).collect();
            let mut want = vec![0.0; n * c * g.out_h() * g.out_w()];
            super::super::max_forward(&g, &x, &mut want, crate::Isa::native());
            let last = |v: &[f32], hw: usize| {
                let mut out = vec![0.0; v.len()];
                for i in 0..n {
                    for ch in 0..c {
                        for p in 0..hw {
                            out[(i * hw + p) * c + ch] = v[(i * c + ch) * hw + p];
                        }
                    }
                }
                out
            };
            let mut got = vec![0.0; want.len()];
            max_forward_channels_last(&g, &last(&x, h * w), &mut got);
            let want = last(&want, g.out_h() * g.out_w());
            let bits =
                |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
            let (gb, wb) = (bits(&got), bits(&want));
            if let Some(i) = (0..gb.len()).find(|&i| gb[i] != wb[i]) {
                panic!("{g:?}: at {i} (pixel {}, channel {}): {} vs {}", i / c, i % c, got[i], want[i]);
            }
        }
    }
}
