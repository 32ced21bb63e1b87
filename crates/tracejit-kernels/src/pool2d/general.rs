//! The general pooling loops, one plane at a time, for any window, stride
//! and padding: per output row, the window's input rows reduced column by
//! column into a row buffer (in row order), then each output reduces its
//! window's columns of the buffer (in column order). The max's backward
//! scans each window in row-major order.

use super::{takes, Pool2dGeometry};
use crate::Width;

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
///
/// Per output row, the window's rows are reduced into a row buffer whose
/// padding columns stay -inf; its columns are then dealt into `stride`
/// phases (`phase[p][i]` = column `i·stride + p`), so that tap `j` of
/// every output is one contiguous run (`phase[j % stride][j / stride..]`)
/// and the output row is reduced tap by tap in order. Each output folds
/// the same `kernel` values as its clipped window, in the same order,
/// from -inf: `pick(m, -inf)` is `m`, so the padding changes no bit. Both
/// steps are row-wide selects, in vector code of width `w` when given
/// (the CPU has it); the clipped scalar windows ran ResNet's 3x3 stride-2
/// stem pool at 0.6 G values/s.
pub(super) fn max_plane(w: Option<Width>, g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    let (kw, sw, left, ow_n) = (g.kernel[1], g.stride[1], g.pad[1], g.out_w());
    let len = (left + g.in_w).max((ow_n.max(1) - 1) * sw + kw);
    let plen = len.div_ceil(sw);
    let mut cols = vec![f32::NEG_INFINITY; len];
    let mut phases = vec![f32::NEG_INFINITY; if sw > 1 { sw * plen } else { 0 }];
    for (oh, yr) in y.chunks_exact_mut(ow_n).enumerate() {
        let row = &mut cols[left..left + g.in_w];
        row.fill(f32::NEG_INFINITY);
        for ih in g.window(0, oh) {
            max_row(w, row, &x[ih * g.in_w..][..g.in_w]);
        }
        if sw > 1 {
            deal(w, sw, &cols, &mut phases);
        }
        let phase = |j: usize| match sw {
            1 => &cols[j..][..ow_n],
            _ => &phases[(j % sw) * plen + j / sw..][..ow_n],
        };
        yr.fill(f32::NEG_INFINITY);
        for j in 0..kw {
            max_row(w, yr, phase(j));
        }
    }
}

/// `phases[p · plen + i] = cols[i · stride + p]` for the `stride`
/// phases of `plen` values each (stride 2 in vector code of width `w`
/// when given).
fn deal(w: Option<Width>, stride: usize, cols: &[f32], phases: &mut [f32]) {
    let plen = phases.len() / stride;
    // Values of each phase already dealt by vector code.
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if let (Some(w), 2) = (w, stride) {
        let (even, odd) = phases.split_at_mut(plen);
        // SAFETY: the caller's width came from `Isa::width` (or a test
        // that checked the CPU).
        done = unsafe { super::simd::deal2(w, cols, even, odd) };
    }
    let _ = w;
    for (p, phase) in phases.chunks_exact_mut(plen).enumerate() {
        for (d, &v) in phase[done..].iter_mut().zip(cols.iter().skip(p + done * stride).step_by(stride)) {
            *d = v;
        }
    }
}

/// `m[i] = pick(m[i], v[i])`, in vector code of width `w` when given.
fn max_row(w: Option<Width>, m: &mut [f32], v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = w {
        // SAFETY: the caller's width came from `Isa::width` (or a test
        // that checked the CPU).
        return unsafe { super::simd::max_row(w, m, v) };
    }
    let _ = w;
    for (m, &v) in m.iter_mut().zip(v) {
        *m = pick(*m, v);
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
