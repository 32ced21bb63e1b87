//! The general pooling loops, one plane at a time, for any window, stride
//! and padding: per output row, the window's input rows reduced column by
//! column into a row buffer (in row order), then each output reduces its
//! window's columns of the buffer (in column order). The max's backward
//! scans each window in row-major order.

use super::{takes, Pool2dGeometry};

/// `m` or `v` by PyTorch's update rule ([`takes`]).
#[inline(always)]
pub(super) fn pick(m: f32, v: f32) -> f32 {
    if takes(v, m) {
        v
    } else {
        m
    }
}

/// One plane's maxima (padding is -inf, so it never wins).
pub(super) fn max_plane(g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    let mut cols = vec![f32::NEG_INFINITY; g.in_w];
    for (oh, yr) in y.chunks_exact_mut(g.out_w()).enumerate() {
        cols.fill(f32::NEG_INFINITY);
        for ih in g.window(0, oh) {
            for (m, &v) in cols.iter_mut().zip(&x[ih * g.in_w..][..g.in_w]) {
                *m = pick(*m, v);
            }
        }
        for (ow, out) in yr.iter_mut().enumerate() {
            *out = cols[g.window(1, ow)].iter().fold(f32::NEG_INFINITY, |m, &v| pick(m, v));
        }
    }
}

/// One plane's gradient of the max: `dx` overwritten.
pub(super) fn max_backward_plane(g: &Pool2dGeometry, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    for (oh, dyr) in dy.chunks_exact(g.out_w()).enumerate() {
        let rows = g.window(0, oh);
        for (ow, &d) in dyr.iter().enumerate() {
            let cols = g.window(1, ow);
            // The first in-bounds value stands when every value is -inf.
            let (mut m, mut at) = (f32::NEG_INFINITY, rows.start * g.in_w + cols.start);
            for ih in rows.clone() {
                for iw in cols.clone() {
                    let v = x[ih * g.in_w + iw];
                    if takes(v, m) {
                        (m, at) = (v, ih * g.in_w + iw);
                    }
                }
            }
            dx[at] += d;
        }
    }
}

/// One plane's means over the windows' in-bounds values.
pub(super) fn avg_plane(g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    let mut sums = vec![0.0f32; g.in_w];
    for (oh, yr) in y.chunks_exact_mut(g.out_w()).enumerate() {
        let rows = g.window(0, oh);
        sums.fill(0.0);
        for ih in rows.clone() {
            for (s, &v) in sums.iter_mut().zip(&x[ih * g.in_w..][..g.in_w]) {
                *s += v;
            }
        }
        for (ow, out) in yr.iter_mut().enumerate() {
            let cols = g.window(1, ow);
            let n = (rows.len() * cols.len()) as f32;
            *out = sums[cols].iter().fold(0.0f32, |a, &v| a + v) / n;
        }
    }
}

/// One plane's gradient of the mean: `dx` overwritten. Per output row, the
/// shares `dy / count` spread over the columns (in output order), then
/// added to each of the window's rows.
pub(super) fn avg_backward_plane(g: &Pool2dGeometry, dy: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    let mut row = vec![0.0f32; g.in_w];
    for (oh, dyr) in dy.chunks_exact(g.out_w()).enumerate() {
        let rows = g.window(0, oh);
        row.fill(0.0);
        for (ow, &d) in dyr.iter().enumerate() {
            let cols = g.window(1, ow);
            let share = d / (rows.len() * cols.len()) as f32;
            row[cols].iter_mut().for_each(|v| *v += share);
        }
        for ih in rows {
            for (o, &v) in dx[ih * g.in_w..][..g.in_w].iter_mut().zip(&row) {
                *o += v;
            }
        }
    }
}
