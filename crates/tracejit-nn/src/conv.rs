//! Convolution and pooling layers as PyTorch and ONNX define them: NCHW
//! activations, `[out_channels, in_channels / groups, kh, kw]` weights,
//! explicit or "same" padding, strides, dilations, groups (depthwise when
//! `groups == in_channels`), floor-mode output sizes.
//!
//! Each is one op of the IR's spatial family (not a graph of gathers):
//! eagerly the reference loops run it, a compiled function runs it through
//! the direct kernels of `tracejit_kernels::conv` / `pool2d` (f32), and its
//! gradients are the family's backward ops. A bias is added in the
//! convolution's output pass, and a compiled function also applies a
//! following `relu` there when nothing else reads the convolution.
//!
//! Which layouts and sizes take which path (f32, compiled):
//! - forward, any geometry: a direct convolution over panels of input rows
//!   (no im2col buffer), register tiles of 8 output channels × 48 pixels
//!   (AVX-512) or 4 × 24 (AVX2);
//! - input gradient: stride 1 as the same direct kernel on the flipped
//!   kernel; larger strides as a matrix product per band plus col2im;
//! - weight gradient: a direct kernel summing pixel tiles, or for filters
//!   of at most 1024 (channel, tap) pairs per group (a first layer) one
//!   over vectors of pixels;
//! - pools: general loops, and 2x2 stride-2 unpadded windows through
//!   vector code.

use tracejit_trace::{spatial, Conv2dAttrs, Pool2dAttrs, SpatialOp, Tensor};

/// A (height, width) pair given as one `usize` for both or a `[usize; 2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair(pub [usize; 2]);

impl From<usize> for Pair {
    fn from(v: usize) -> Pair {
        Pair([v, v])
    }
}

impl From<[usize; 2]> for Pair {
    fn from(v: [usize; 2]) -> Pair {
        Pair(v)
    }
}

impl From<(usize, usize)> for Pair {
    fn from((h, w): (usize, usize)) -> Pair {
        Pair([h, w])
    }
}

/// How a convolution pads its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Zeros on each side: top, left, bottom, right.
    Explicit([usize; 4]),
    /// TF's `SAME` (ONNX `SAME_UPPER`): the output is `ceil(in / stride)`
    /// long; an odd total pad puts the extra zero at the end.
    SameUpper,
    /// ONNX `SAME_LOWER`: as `SameUpper`, the extra zero at the beginning.
    SameLower,
}

/// The options of [`conv2d`], built PyTorch-style:
/// `Conv2dOptions::default().stride(2).padding(1).dilation(1).groups(1)`.
/// The defaults are stride 1, no padding, dilation 1, one group.
///
/// ```
/// use tracejit_nn::Conv2dOptions;
///
/// let o = Conv2dOptions::default().stride([2, 1]).padding(1).groups(4);
/// assert_eq!((o.stride_hw(), o.groups_count()), ([2, 1], 4));
/// let same = Conv2dOptions::default().padding_same();
/// let asymmetric = Conv2dOptions::default().pads([0, 1, 1, 0]); // top, left, bottom, right
/// # let _ = (same, asymmetric);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    stride: [usize; 2],
    dilation: [usize; 2],
    padding: Padding,
    groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Conv2dOptions {
        Conv2dOptions { stride: [1, 1], dilation: [1, 1], padding: Padding::Explicit([0; 4]), groups: 1 }
    }
}

impl Conv2dOptions {
    /// The stride: a `usize` for both axes or `[h, w]`.
    pub fn stride(mut self, s: impl Into<Pair>) -> Self {
        self.stride = s.into().0;
        self
    }

    /// Symmetric zero padding: a `usize` for every side or `[h, w]` (top
    /// and bottom `h`, left and right `w`), as PyTorch's `padding`.
    pub fn padding(mut self, p: impl Into<Pair>) -> Self {
        let [h, w] = p.into().0;
        self.padding = Padding::Explicit([h, w, h, w]);
        self
    }

    /// Zero padding per side, `[top, left, bottom, right]` (ONNX `pads`
    /// order for two spatial axes: begins, then ends).
    pub fn pads(mut self, pads: [usize; 4]) -> Self {
        self.padding = Padding::Explicit(pads);
        self
    }

    /// TF's `SAME` padding (ONNX `auto_pad = SAME_UPPER`): the output is
    /// `ceil(in / stride)` long, the pads computed from the input's size
    /// when the op is applied (the height and width must then be known).
    pub fn padding_same(mut self) -> Self {
        self.padding = Padding::SameUpper;
        self
    }

    /// ONNX `auto_pad = SAME_LOWER`: as [`Conv2dOptions::padding_same`],
    /// with an odd total pad's extra zero at the beginning.
    pub fn padding_same_lower(mut self) -> Self {
        self.padding = Padding::SameLower;
        self
    }

    /// The dilation: a `usize` for both axes or `[h, w]`.
    pub fn dilation(mut self, d: impl Into<Pair>) -> Self {
        self.dilation = d.into().0;
        self
    }

    /// Groups: input and output channels split into this many independent
    /// convolutions (`in_channels` for depthwise).
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }

    /// The stride `[h, w]`.
    pub fn stride_hw(&self) -> [usize; 2] {
        self.stride
    }

    /// The dilation `[h, w]`.
    pub fn dilation_hw(&self) -> [usize; 2] {
        self.dilation
    }

    /// The padding rule.
    pub fn padding_rule(&self) -> Padding {
        self.padding
    }

    /// The group count.
    pub fn groups_count(&self) -> usize {
        self.groups
    }

    /// The IR attributes for an input of height and width `hw` and a
    /// kernel of `k` (which "same" padding needs).
    #[track_caller]
    fn attrs(&self, hw: [Option<usize>; 2], k: [Option<usize>; 2]) -> Conv2dAttrs {
        let pad = match self.padding {
            Padding::Explicit(p) => p,
            Padding::SameUpper | Padding::SameLower => {
                let mut p = [0; 4];
                for axis in 0..2 {
                    let (Some(n), Some(k)) = (hw[axis], k[axis]) else {
                        panic!(
                            "conv2d: \"same\" padding needs the input's height and width and the kernel's size \
                             known, got input {hw:?} and kernel {k:?} (use explicit padding for open sizes)"
                        );
                    };
                    let [lo, hi] = same_pads(n, k, self.stride[axis].max(1), self.dilation[axis].max(1));
                    let (lo, hi) = if self.padding == Padding::SameLower { (hi, lo) } else { (lo, hi) };
                    p[axis] = lo;
                    p[axis + 2] = hi;
                }
                p
            }
        };
        Conv2dAttrs { stride: self.stride, dilation: self.dilation, pad, groups: self.groups }
    }
}

/// The (begin, end) pads that make an axis of `n` come out `ceil(n /
/// stride)` long, the odd one at the end.
fn same_pads(n: usize, k: usize, stride: usize, dilation: usize) -> [usize; 2] {
    let out = n.div_ceil(stride);
    let extent = (k.max(1) - 1) * dilation + 1;
    let total = ((out.max(1) - 1) * stride + extent).saturating_sub(n);
    [total / 2, total - total / 2]
}

/// A 2-D convolution of `x [N, C, H, W]` by `w [O, C / groups, kh, kw]`,
/// plus `bias [O]` when given: `y [N, O, oh, ow]` with `oh = (H + pads -
/// ((kh - 1) · dilation + 1)) / stride + 1` (floor). ONNX `Conv` and
/// `torch.nn.functional.conv2d`. f32 or f64; gradients for `x`, `w` and
/// `bias`.
///
/// ```
/// use tracejit_nn::{conv2d, Conv2dOptions};
/// use tracejit_trace::{DType, Tensor};
///
/// // ONNX Conv's example: a 5x5 ramp, a 3x3 kernel of ones, padding 1.
/// let x = Tensor::from_vec((0..25).map(|i| i as f32).collect(), &[1, 1, 5, 5]);
/// let w = Tensor::ones(&[1, 1, 3, 3], DType::F32);
/// let y = conv2d(&x, &w, None, Conv2dOptions::default().padding(1));
/// assert_eq!(y.shape(), [1, 1, 5, 5]);
/// assert_eq!(y.to_vec::<f32>()?[..5], [12.0, 21.0, 27.0, 33.0, 24.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// On operands that do not fit (the message names `conv2d`, what it
/// expected and what it got, and the caller's line): ranks other than 4,
/// channels that do not match the weights and groups, a bias not `[O]`,
/// a kernel larger than the padded input, mixed dtypes.
#[track_caller]
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, options: Conv2dOptions) -> Tensor {
    let (xd, wd) = (x.dims(), w.dims());
    let at = |d: &[Option<usize>], i: usize| d.get(i).copied().flatten();
    let conv = options.attrs([at(&xd, 2), at(&xd, 3)], [at(&wd, 2), at(&wd, 3)]);
    let op = SpatialOp::Conv2d { conv, bias: bias.is_some(), relu: false };
    match bias {
        Some(b) => spatial(op, &[x, w, b]),
        None => spatial(op, &[x, w]),
    }
    .remove(0)
}

/// Max pooling of `x [N, C, H, W]` over `kernel` windows (height, width)
/// moved by `stride`, with `padding` (height, width) on both sides of each
/// axis, each below the window: ONNX `MaxPool` (floor mode) and
/// `torch.nn.functional.max_pool2d`. Padding never wins (it is -inf); a
/// window holding NaN gives NaN. The gradient goes to each window's first
/// maximum in row-major order (PyTorch's and ONNX's choice on ties),
/// summed where windows overlap.
///
/// ```
/// use tracejit_nn::max_pool2d;
/// use tracejit_trace::Tensor;
///
/// let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[1, 1, 4, 4]);
/// let y = max_pool2d(&x, [2, 2], [2, 2], [0, 0]);
/// assert_eq!(y.to_vec::<f32>()?, [5.0, 7.0, 13.0, 15.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn max_pool2d(x: &Tensor, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Tensor {
    let pool = pool_attrs(kernel, stride, padding);
    spatial(SpatialOp::MaxPool2d { pool }, &[x]).remove(0)
}

/// Average pooling of `x [N, C, H, W]`, arguments as [`max_pool2d`]'s:
/// each window's mean over its values inside the input, the padding left
/// out of the count (ONNX `AveragePool` with `count_include_pad = 0`, TF's
/// `avg_pool`, PyTorch's `count_include_pad=False`).
///
/// ```
/// use tracejit_nn::avg_pool2d;
/// use tracejit_trace::Tensor;
///
/// let x = Tensor::from_vec((1..=9).map(|i| i as f32).collect(), &[1, 1, 3, 3]);
/// let y = avg_pool2d(&x, [3, 3], [1, 1], [1, 1]);
/// assert_eq!(y.to_vec::<f32>()?[0], 3.0); // (1 + 2 + 4 + 5) / 4
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn avg_pool2d(x: &Tensor, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Tensor {
    let pool = pool_attrs(kernel, stride, padding);
    spatial(SpatialOp::AvgPool2d { pool }, &[x]).remove(0)
}

fn pool_attrs(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Pool2dAttrs {
    Pool2dAttrs { kernel, stride, pad: [padding[0], padding[1], padding[0], padding[1]] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_matches_tf() {
        // TF: out = ceil(in / stride), pad_total = max((out-1)·s + k - in, 0),
        // the extra at the end.
        assert_eq!(same_pads(32, 3, 1, 1), [1, 1]);
        assert_eq!(same_pads(32, 4, 1, 1), [1, 2]);
        assert_eq!(same_pads(7, 3, 2, 1), [1, 1]);
        assert_eq!(same_pads(8, 3, 2, 1), [0, 1]);
        assert_eq!(same_pads(5, 3, 1, 2), [2, 2]);
        assert_eq!(same_pads(1, 1, 3, 1), [0, 0]);
    }
}
