//! Reference 2-D convolution: forward, backward-data and backward-filter as
//! plain loops over f32 or f64 NCHW tensors (the oracle the fast kernels of
//! `tracejit-kernels` are tested against). See [`crate::spatial`] for the
//! semantics.
//!
//! Each output is one sum, accumulated in the element type in a fixed
//! order: the forward sums over (input channel, kernel row, kernel column)
//! then adds the bias; backward-data sums over (output channel, kernel
//! row, kernel column); backward-filter and the bias gradient over (image,
//! output row, output column). Padding is skipped, never multiplied, so a
//! non-finite weight reaches only the outputs whose windows it meets
//! inside the input.

use super::num::Float;
use crate::spatial::Conv2dAttrs;
use crate::{Storage, StorageElement};

/// The sizes of one convolution, read from its operands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub k: [usize; 2],
    pub oh: usize,
    pub ow: usize,
    pub attrs: Conv2dAttrs,
}

impl Geometry {
    /// From `x [N, C, H, W]` and weights `[O, C/g, kh, kw]`; panics with a
    /// plain message on sizes that do not fit (inference checks first).
    pub(crate) fn new(attrs: Conv2dAttrs, x: &[usize], w: &[usize]) -> Geometry {
        assert!(x.len() == 4 && w.len() == 4, "conv2d: x {x:?} and w {w:?} must be of rank 4");
        let g = attrs.groups;
        assert!(
            g > 0 && w[1] * g == x[1] && w[0].is_multiple_of(g),
            "conv2d: weights {w:?} do not fit {} input channels in {g} groups",
            x[1]
        );
        let k = [w[2], w[3]];
        let (oh, ow) = match (attrs.out_size(0, x[2], k[0]), attrs.out_size(1, x[3], k[1])) {
            (Some(oh), Some(ow)) => (oh, ow),
            _ => panic!("conv2d: the kernel {k:?} does not fit the padded input {x:?} ({attrs:?})"),
        };
        Geometry { n: x[0], c: x[1], h: x[2], w: x[3], o: w[0], k, oh, ow, attrs }
    }

    /// Input channels per group.
    fn icg(&self) -> usize {
        self.c / self.attrs.groups
    }

    /// Output channels per group.
    fn ocg(&self) -> usize {
        self.o / self.attrs.groups
    }

    /// The input row (axis 0) or column (axis 1) that output `o`'s kernel
    /// tap `t` reads, or `None` in the padding.
    #[inline]
    fn input_at(&self, axis: usize, o: usize, t: usize) -> Option<usize> {
        let a = &self.attrs;
        let i = (o * a.stride[axis] + t * a.dilation[axis]).checked_sub(a.pad[axis])?;
        (i < [self.h, self.w][axis]).then_some(i)
    }
}

/// A contiguous row-major copy of a float operand's elements.
fn values<T: StorageElement>(s: &Storage) -> Vec<T> {
    s.to_vec::<T>().unwrap_or_else(|_| panic!("conv2d: operands must share one float dtype, got {}", s.dtype()))
}

fn wrap<T: StorageElement>(v: Vec<T>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("sizes computed from the geometry")
}

/// `conv2d(x, w) + bias`, then relu when asked.
pub(crate) fn forward(attrs: Conv2dAttrs, x: &Storage, w: &Storage, bias: Option<&Storage>, relu: bool) -> Storage {
    let g = Geometry::new(attrs, x.shape(), w.shape());
    match x.dtype() {
        crate::DType::F32 => forward_t::<f32>(&g, x, w, bias, relu),
        crate::DType::F64 => forward_t::<f64>(&g, x, w, bias, relu),
        d => panic!("conv2d: takes f32 or f64, got {d}"),
    }
}

fn forward_t<T: Float>(g: &Geometry, x: &Storage, w: &Storage, bias: Option<&Storage>, relu: bool) -> Storage {
    let (xv, wv) = (values::<T>(x), values::<T>(w));
    let b = bias.map(values::<T>);
    let (icg, ocg) = (g.icg(), g.ocg());
    let mut y = Vec::with_capacity(g.n * g.o * g.oh * g.ow);
    for n in 0..g.n {
        for o in 0..g.o {
            let grp = o / ocg;
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut acc = T::ZERO;
                    for ic in 0..icg {
                        let plane = (n * g.c + grp * icg + ic) * g.h;
                        let taps = (o * icg + ic) * g.k[0];
                        for r in 0..g.k[0] {
                            let Some(iy) = g.input_at(0, oy, r) else { continue };
                            for q in 0..g.k[1] {
                                let Some(ix) = g.input_at(1, ox, q) else { continue };
                                acc = acc.plus(xv[(plane + iy) * g.w + ix].times(wv[(taps + r) * g.k[1] + q]));
                            }
                        }
                    }
                    if let Some(b) = &b {
                        acc = acc.plus(b[o]);
                    }
                    if relu && !(acc > T::ZERO || acc.is_nan_value()) {
                        acc = T::ZERO;
                    }
                    y.push(acc);
                }
            }
        }
    }
    wrap(y, &[g.n, g.o, g.oh, g.ow])
}

/// `dx [N, C, input_hw]` from `dy` and `w`.
pub(crate) fn backward_data(attrs: Conv2dAttrs, input_hw: [usize; 2], dy: &Storage, w: &Storage) -> Storage {
    let (d, ws) = (dy.shape(), w.shape());
    assert!(d.len() == 4 && ws.len() == 4, "conv2d_backward_data: dy {d:?} and w {ws:?} must be of rank 4");
    let x_shape = [d[0], ws[1] * attrs.groups, input_hw[0], input_hw[1]];
    let g = Geometry::new(attrs, &x_shape, ws);
    assert!(
        [g.n, g.o, g.oh, g.ow] == [d[0], d[1], d[2], d[3]],
        "conv2d_backward_data: dy {d:?} is not the output of a convolution of {x_shape:?} by {ws:?}"
    );
    match dy.dtype() {
        crate::DType::F32 => backward_data_t::<f32>(&g, dy, w),
        crate::DType::F64 => backward_data_t::<f64>(&g, dy, w),
        t => panic!("conv2d_backward_data: takes f32 or f64, got {t}"),
    }
}

fn backward_data_t<T: Float>(g: &Geometry, dy: &Storage, w: &Storage) -> Storage {
    let (dyv, wv) = (values::<T>(dy), values::<T>(w));
    let (icg, ocg) = (g.icg(), g.ocg());
    let a = &g.attrs;
    let mut dx = Vec::with_capacity(g.n * g.c * g.h * g.w);
    for n in 0..g.n {
        for c in 0..g.c {
            let (grp, ic) = (c / icg, c % icg);
            for iy in 0..g.h {
                for ix in 0..g.w {
                    let mut acc = T::ZERO;
                    for oc in 0..ocg {
                        let o = grp * ocg + oc;
                        for r in 0..g.k[0] {
                            // Output row oy reads row iy at tap r when
                            // oy·s + r·d - pad = iy.
                            let Some(oy) = tap_output(iy, r, a.stride[0], a.dilation[0], a.pad[0], g.oh) else {
                                continue;
                            };
                            for q in 0..g.k[1] {
                                let Some(ox) = tap_output(ix, q, a.stride[1], a.dilation[1], a.pad[1], g.ow) else {
                                    continue;
                                };
                                let wi = (((o * icg + ic) * g.k[0]) + r) * g.k[1] + q;
                                let di = ((n * g.o + o) * g.oh + oy) * g.ow + ox;
                                acc = acc.plus(wv[wi].times(dyv[di]));
                            }
                        }
                    }
                    dx.push(acc);
                }
            }
        }
    }
    wrap(dx, &[g.n, g.c, g.h, g.w])
}

/// The output index whose tap `t` reads input `i`, if there is one.
fn tap_output(i: usize, t: usize, stride: usize, dilation: usize, pad: usize, out: usize) -> Option<usize> {
    let num = (i + pad).checked_sub(t * dilation)?;
    (num % stride == 0 && num / stride < out).then_some(num / stride)
}

/// `dw [O, C/g, kernel]` from `x` and `dy`, and `db [O]` when `bias`.
pub(crate) fn backward_filter(
    attrs: Conv2dAttrs,
    kernel: [usize; 2],
    bias: bool,
    x: &Storage,
    dy: &Storage,
) -> Vec<Storage> {
    let (xs, d) = (x.shape(), dy.shape());
    assert!(xs.len() == 4 && d.len() == 4, "conv2d_backward_filter: x {xs:?} and dy {d:?} must be of rank 4");
    let groups = attrs.groups.max(1);
    assert!(xs[1].is_multiple_of(groups), "conv2d_backward_filter: {} input channels in {groups} groups", xs[1]);
    let w_shape = [d[1], xs[1] / groups, kernel[0], kernel[1]];
    let g = Geometry::new(attrs, xs, &w_shape);
    assert!(
        [g.n, g.o, g.oh, g.ow] == [d[0], d[1], d[2], d[3]],
        "conv2d_backward_filter: dy {d:?} is not the output of a convolution of {xs:?} by {w_shape:?}"
    );
    let mut out = match x.dtype() {
        crate::DType::F32 => vec![backward_filter_t::<f32>(&g, x, dy)],
        crate::DType::F64 => vec![backward_filter_t::<f64>(&g, x, dy)],
        t => panic!("conv2d_backward_filter: takes f32 or f64, got {t}"),
    };
    if bias {
        out.push(match dy.dtype() {
            crate::DType::F32 => bias_grad::<f32>(&g, dy),
            _ => bias_grad::<f64>(&g, dy),
        });
    }
    out
}

fn backward_filter_t<T: Float>(g: &Geometry, x: &Storage, dy: &Storage) -> Storage {
    let (xv, dyv) = (values::<T>(x), values::<T>(dy));
    let (icg, ocg) = (g.icg(), g.ocg());
    let mut dw = Vec::with_capacity(g.o * icg * g.k[0] * g.k[1]);
    for o in 0..g.o {
        let grp = o / ocg;
        for ic in 0..icg {
            for r in 0..g.k[0] {
                for q in 0..g.k[1] {
                    let mut acc = T::ZERO;
                    for n in 0..g.n {
                        let plane = (n * g.c + grp * icg + ic) * g.h;
                        for oy in 0..g.oh {
                            let Some(iy) = g.input_at(0, oy, r) else { continue };
                            for ox in 0..g.ow {
                                let Some(ix) = g.input_at(1, ox, q) else { continue };
                                let di = ((n * g.o + o) * g.oh + oy) * g.ow + ox;
                                acc = acc.plus(xv[(plane + iy) * g.w + ix].times(dyv[di]));
                            }
                        }
                    }
                    dw.push(acc);
                }
            }
        }
    }
    wrap(dw, &[g.o, icg, g.k[0], g.k[1]])
}

/// The sum of `dy` over images and pixels, per output channel.
fn bias_grad<T: Float>(g: &Geometry, dy: &Storage) -> Storage {
    let dyv = values::<T>(dy);
    let plane = g.oh * g.ow;
    let db = (0..g.o)
        .map(|o| {
            let mut acc = T::ZERO;
            for n in 0..g.n {
                for &v in &dyv[(n * g.o + o) * plane..][..plane] {
                    acc = acc.plus(v);
                }
            }
            acc
        })
        .collect();
    wrap(db, &[g.o])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;

    fn attrs(stride: usize, pad: usize, dilation: usize, groups: usize) -> Conv2dAttrs {
        Conv2dAttrs { stride: [stride; 2], dilation: [dilation; 2], pad: [pad; 4], groups }
    }

    #[test]
    fn forward_matches_the_onnx_conv_example() {
        // ONNX Conv's documented example: x = 0..25 as [1, 1, 5, 5], a 3x3
        // kernel of ones; with padding 1 and without.
        let x = t((0..25).map(|i| i as f32).collect(), &[1, 1, 5, 5]);
        let w = t(vec![1.0f32; 9], &[1, 1, 3, 3]);
        let y = forward(attrs(1, 1, 1, 1), &x, &w, None, false);
        assert_eq!(
            v::<f32>(&y),
            vec![
                12., 21., 27., 33., 24., 33., 54., 63., 72., 51., 63., 99., 108., 117., 81., 93., 144., 153., 162.,
                111., 72., 111., 117., 123., 84.
            ]
        );
        let y = forward(attrs(1, 0, 1, 1), &x, &w, None, false);
        assert_eq!(v::<f32>(&y), vec![54., 63., 72., 99., 108., 117., 144., 153., 162.]);
    }

    #[test]
    fn bias_and_relu_apply_after_the_sum_and_keep_nan() {
        let x = t(vec![1.0f64, -2.0, f64::NAN, 3.0], &[1, 1, 2, 2]);
        let w = t(vec![2.0f64], &[1, 1, 1, 1]);
        let y = forward(attrs(1, 0, 1, 1), &x, &w, Some(&t(vec![1.0f64], &[1])), true);
        let got = v::<f64>(&y);
        assert_eq!((got[0], got[1], got[3]), (3.0, 0.0, 7.0));
        assert!(got[2].is_nan());
    }

    #[test]
    fn backward_data_is_the_adjoint_of_forward() {
        // <conv(x), dy> == <x, backward_data(dy)> for a strided, dilated,
        // grouped, padded geometry.
        let a = Conv2dAttrs { stride: [2, 1], dilation: [1, 2], pad: [1, 0, 0, 2], groups: 2 };
        let xs: Vec<f64> = (0..2 * 4 * 5 * 6).map(|i| ((i * 7 % 11) as f64) - 5.0).collect();
        let ws: Vec<f64> = (0..6 * 2 * 3 * 2).map(|i| ((i * 5 % 7) as f64) - 3.0).collect();
        let (x, w) = (t(xs.clone(), &[2, 4, 5, 6]), t(ws, &[6, 2, 3, 2]));
        let y = forward(a, &x, &w, None, false);
        let dys: Vec<f64> = (0..y.len()).map(|i| ((i * 3 % 5) as f64) - 2.0).collect();
        let dy = t(dys.clone(), y.shape());
        let dx = backward_data(a, [5, 6], &dy, &w);
        let lhs: f64 = v::<f64>(&y).iter().zip(&dys).map(|(a, b)| a * b).sum();
        let rhs: f64 = v::<f64>(&dx).iter().zip(&xs).map(|(a, b)| a * b).sum();
        assert_eq!(lhs, rhs);
        let dw = &backward_filter(a, [3, 2], true, &x, &dy)[0];
        let lhs_w: f64 = v::<f64>(dw).iter().zip(v::<f64>(&w)).map(|(a, b)| a * b).sum();
        assert_eq!(lhs, lhs_w);
    }
}
