//! The spatial op family: 2-D convolution and pooling over NCHW tensors and
//! their gradients ([`SpatialOp`]), with their attributes
//! ([`Conv2dAttrs`], [`Pool2dAttrs`]) and the output-size rule they share.
//!
//! Semantics are ONNX's (`Conv`, `MaxPool`, `AveragePool`) and PyTorch's:
//! activations `[batch, channels, height, width]`, convolution weights
//! `[out_channels, in_channels / groups, kh, kw]`, explicit zero padding
//! per side (top, left, bottom, right), strides, dilations, groups
//! (depthwise when `groups == in_channels`), floor mode for output sizes
//! (`(in + pads - ((k - 1) · dilation + 1)) / stride + 1`). Pools take
//! each pad below the window's size; max pooling treats padding as -inf
//! (it never wins), average pooling leaves it out of the count (ONNX
//! `count_include_pad = 0`, TF). The gradient ops exist so that a
//! differentiated graph keeps one op per product (not a graph of
//! gathers) that executors run through fast kernels.

/// The attributes of a 2-D convolution (the kernel's size comes from the
/// weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dAttrs {
    /// Stride (height, width), each at least 1.
    pub stride: [usize; 2],
    /// Dilation (height, width), each at least 1.
    pub dilation: [usize; 2],
    /// Zero padding: top, left, bottom, right.
    pub pad: [usize; 4],
    /// Groups: channels split into this many independent convolutions.
    pub groups: usize,
}

impl Conv2dAttrs {
    /// Stride 1, dilation 1, no padding, one group.
    pub const DEFAULT: Conv2dAttrs = Conv2dAttrs { stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };

    /// The output size on `axis` (0: height, 1: width) of an input of `n`
    /// and a kernel of `k`, or `None` when the dilated kernel does not fit
    /// the padded input.
    pub fn out_size(&self, axis: usize, n: usize, k: usize) -> Option<usize> {
        out_size(n, self.pad[axis] + self.pad[axis + 2], k, self.stride[axis], self.dilation[axis])
    }
}

/// The attributes of a 2-D pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dAttrs {
    /// Window (height, width).
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Padding: top, left, bottom, right, each below the window's size on
    /// its axis.
    pub pad: [usize; 4],
}

impl Pool2dAttrs {
    /// The output size on `axis` of an input of `n`, or `None` when the
    /// window does not fit the padded input.
    pub fn out_size(&self, axis: usize, n: usize) -> Option<usize> {
        out_size(n, self.pad[axis] + self.pad[axis + 2], self.kernel[axis], self.stride[axis], 1)
    }

    /// What is wrong with the attributes themselves (a zero size, a pad
    /// not below the window), or `None`.
    pub fn problem(&self) -> Option<String> {
        for (name, v) in [
            ("kernel height", self.kernel[0]),
            ("kernel width", self.kernel[1]),
            ("stride height", self.stride[0]),
            ("stride width", self.stride[1]),
        ] {
            if v == 0 {
                return Some(format!("{name} is 0"));
            }
        }
        for (i, side) in ["top", "left", "bottom", "right"].iter().enumerate() {
            let k = self.kernel[i % 2];
            if self.pad[i] >= k {
                return Some(format!("padding {side} {} must be smaller than the window's {k}", self.pad[i]));
            }
        }
        None
    }
}

/// Floor-mode output size, `None` when the dilated kernel exceeds the
/// padded input (or a size is 0).
fn out_size(n: usize, pads: usize, k: usize, stride: usize, dilation: usize) -> Option<usize> {
    if k == 0 || stride == 0 || dilation == 0 {
        return None;
    }
    let extent = (k - 1).checked_mul(dilation)?.checked_add(1)?;
    let room = n.checked_add(pads)?.checked_sub(extent)?;
    Some(room / stride + 1)
}

/// A spatial op. Inputs and outputs, per variant:
///
/// | op | inputs | outputs |
/// |---|---|---|
/// | `conv2d` | x `[N, C, H, W]`, w `[O, C/g, kh, kw]`, bias `[O]` if `bias` | y `[N, O, oh, ow]` (`max(y, 0)` if `relu`) |
/// | `conv2d_backward_data` | dy `[N, O, oh, ow]`, w | dx `[N, C, input_hw]` |
/// | `conv2d_backward_filter` | x, dy | dw `[O, C/g, kernel]`, and db `[O]` if `bias` |
/// | `max_pool2d`, `avg_pool2d` | x `[N, C, H, W]` | y `[N, C, oh, ow]` |
/// | `max_pool2d_backward` | x, dy | dx (each `dy` at its window's first maximum) |
/// | `avg_pool2d_backward` | dy | dx `[N, C, input_hw]` |
/// | `conv2d_nhwc` | x `[N, H, W, C]`, w, scale `[O]` if `scale`, bias `[O]` if `bias`, residual `[N, oh, ow, O]` if `residual` | y `[N, oh, ow, O]`: `conv · scale + bias + residual`, then `max(y, 0)` if `relu` |
/// | `max_pool2d_nhwc` | x `[N, H, W, C]` | y `[N, oh, ow, C]` |
///
/// The channels-last forms compute exactly what their NCHW forms compute
/// on the transposed operands, a `conv2d_nhwc`'s scale and residual then
/// as the elementwise ops they stand for; the optimizer's layout pass
/// makes them for inference graphs (chains of convolutions then keep
/// channels last between them) and its epilogue pass gives convolutions
/// their batch norms, residual adds and relus. Their gradients are the
/// NCHW rules' on transposed operands (with the epilogue's own steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpatialOp {
    /// Convolution, with the bias added and relu applied in its output
    /// pass when asked.
    Conv2d {
        /// Strides, dilations, padding, groups.
        conv: Conv2dAttrs,
        /// A third input, the bias, is added per output channel.
        bias: bool,
        /// The result goes through `max(y, 0)` (set by the optimizer when a
        /// relu is the convolution's only reader).
        relu: bool,
    },
    /// The gradient of a convolution with respect to its input: the
    /// transposed convolution of `dy` with `w`.
    Conv2dBackwardData {
        /// The forward convolution's attributes.
        conv: Conv2dAttrs,
        /// The forward input's (height, width), which a strided
        /// convolution's output does not determine.
        input_hw: [usize; 2],
    },
    /// The gradient of a convolution with respect to its weights (and its
    /// bias: the sum of `dy` over batch and space).
    Conv2dBackwardFilter {
        /// The forward convolution's attributes.
        conv: Conv2dAttrs,
        /// The kernel's (height, width).
        kernel: [usize; 2],
        /// Also return the bias gradient (a second output).
        bias: bool,
    },
    /// Max pooling.
    MaxPool2d {
        /// Window, stride, padding.
        pool: Pool2dAttrs,
    },
    /// The gradient of a max pooling: `dy` routed to each window's first
    /// maximum in row-major order (a NaN window: its last NaN), summed
    /// where windows overlap.
    MaxPool2dBackward {
        /// Window, stride, padding.
        pool: Pool2dAttrs,
    },
    /// Average pooling (padding left out of the count).
    AvgPool2d {
        /// Window, stride, padding.
        pool: Pool2dAttrs,
    },
    /// The gradient of an average pooling: each `dy` divided by its
    /// window's count and spread over it.
    AvgPool2dBackward {
        /// Window, stride, padding.
        pool: Pool2dAttrs,
        /// The forward input's (height, width).
        input_hw: [usize; 2],
    },
    /// [`SpatialOp::Conv2d`] with channels last: x `[N, H, W, C]`, y `[N,
    /// oh, ow, O]`; the weights stay `[O, C/g, kh, kw]`. Its epilogue can
    /// hold what a ResNet block does to a convolution's sums before the
    /// next convolution reads them: `y = relu(conv · scale + bias +
    /// residual)`, each step present or not and rounded as its own
    /// elementwise op (`mul`, `add`, `add`, `relu`) would round it. Inputs:
    /// x, w, then the scale `[O]`, the bias `[O]` and the residual (y's
    /// shape) that are present, in that order.
    Conv2dNhwc {
        /// Strides, dilations, padding, groups.
        conv: Conv2dAttrs,
        /// An input of one factor per output channel multiplies the sums
        /// (a batch norm's scale).
        scale: bool,
        /// An input of one term per output channel is added (after the
        /// scale).
        bias: bool,
        /// An input of the result's shape is added (after the bias): a
        /// residual connection.
        residual: bool,
        /// The result goes through `max(y, 0)`.
        relu: bool,
    },
    /// [`SpatialOp::MaxPool2d`] with channels last: x `[N, H, W, C]`, y
    /// `[N, oh, ow, C]`.
    MaxPool2dNhwc {
        /// Window, stride, padding.
        pool: Pool2dAttrs,
    },
}

impl SpatialOp {
    /// The op's name in listings and errors.
    pub fn name(&self) -> &'static str {
        match self {
            SpatialOp::Conv2d { .. } => "conv2d",
            SpatialOp::Conv2dBackwardData { .. } => "conv2d_backward_data",
            SpatialOp::Conv2dBackwardFilter { .. } => "conv2d_backward_filter",
            SpatialOp::MaxPool2d { .. } => "max_pool2d",
            SpatialOp::MaxPool2dBackward { .. } => "max_pool2d_backward",
            SpatialOp::AvgPool2d { .. } => "avg_pool2d",
            SpatialOp::AvgPool2dBackward { .. } => "avg_pool2d_backward",
            SpatialOp::Conv2dNhwc { .. } => "conv2d_nhwc",
            SpatialOp::MaxPool2dNhwc { .. } => "max_pool2d_nhwc",
        }
    }

    /// The NCHW form of a channels-last op (itself for the others). A
    /// `conv2d_nhwc` with a scale or a residual has none (`conv2d` has no
    /// such epilogue): its NCHW form is the bare convolution, to which
    /// the caller applies the epilogue ([`SpatialOp::conv_epilogue`]).
    pub fn channels_first(&self) -> SpatialOp {
        match *self {
            SpatialOp::Conv2dNhwc { conv, scale: false, bias, residual: false, relu } => {
                SpatialOp::Conv2d { conv, bias, relu }
            }
            SpatialOp::Conv2dNhwc { conv, .. } => SpatialOp::Conv2d { conv, bias: false, relu: false },
            SpatialOp::MaxPool2dNhwc { pool } => SpatialOp::MaxPool2d { pool },
            op => op,
        }
    }

    /// A `conv2d_nhwc`'s epilogue beyond what its NCHW form
    /// ([`SpatialOp::channels_first`]) computes, as the input index of
    /// the scale, bias and residual (those present) and whether relu
    /// ends it; `None` for any other op, and for a convolution whose NCHW
    /// form is all of it.
    pub fn conv_epilogue(&self) -> Option<ConvEpilogue> {
        match *self {
            SpatialOp::Conv2dNhwc { scale, bias, residual, relu, .. } if scale || residual => {
                let mut next = 2..;
                let mut take = |on: bool| on.then(|| next.next().expect("unbounded"));
                Some(ConvEpilogue { scale: take(scale), bias: take(bias), residual: take(residual), relu })
            }
            _ => None,
        }
    }

    /// Whether the op takes and gives channels-last tensors.
    pub fn is_channels_last(&self) -> bool {
        matches!(self, SpatialOp::Conv2dNhwc { .. } | SpatialOp::MaxPool2dNhwc { .. })
    }

    /// Every name, for parsers.
    pub const NAMES: [&'static str; 9] = [
        "conv2d",
        "conv2d_backward_data",
        "conv2d_backward_filter",
        "max_pool2d",
        "max_pool2d_backward",
        "avg_pool2d",
        "avg_pool2d_backward",
        "conv2d_nhwc",
        "max_pool2d_nhwc",
    ];

    /// How many inputs it takes.
    pub fn num_inputs(&self) -> usize {
        match self {
            SpatialOp::Conv2d { bias, .. } => 2 + usize::from(*bias),
            SpatialOp::Conv2dNhwc { scale, bias, residual, .. } => {
                2 + usize::from(*scale) + usize::from(*bias) + usize::from(*residual)
            }
            SpatialOp::Conv2dBackwardData { .. }
            | SpatialOp::Conv2dBackwardFilter { .. }
            | SpatialOp::MaxPool2dBackward { .. } => 2,
            SpatialOp::MaxPool2d { .. }
            | SpatialOp::MaxPool2dNhwc { .. }
            | SpatialOp::AvgPool2d { .. }
            | SpatialOp::AvgPool2dBackward { .. } => 1,
        }
    }

    /// How many outputs it returns.
    pub fn num_outputs(&self) -> usize {
        match self {
            SpatialOp::Conv2dBackwardFilter { bias, .. } => 1 + usize::from(*bias),
            SpatialOp::Conv2d { .. }
            | SpatialOp::Conv2dNhwc { .. }
            | SpatialOp::MaxPool2dNhwc { .. }
            | SpatialOp::Conv2dBackwardData { .. }
            | SpatialOp::MaxPool2d { .. }
            | SpatialOp::MaxPool2dBackward { .. }
            | SpatialOp::AvgPool2d { .. }
            | SpatialOp::AvgPool2dBackward { .. } => 1,
        }
    }
}

/// Where a `conv2d_nhwc`'s epilogue finds its operands
/// ([`SpatialOp::conv_epilogue`]): input indices, in the order the steps
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvEpilogue {
    /// The per-channel factor's input.
    pub scale: Option<usize>,
    /// The per-channel term's input.
    pub bias: Option<usize>,
    /// The residual's input (the result's shape).
    pub residual: Option<usize>,
    /// Whether relu ends it.
    pub relu: bool,
}
