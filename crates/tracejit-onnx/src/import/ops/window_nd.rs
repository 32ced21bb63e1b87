//! The window of a Conv or pool along each spatial axis, for any number
//! of axes: kernel, stride, dilation, begin and end pads and the output
//! length, resolved from ONNX's attributes (`auto_pad`, `pads`,
//! `ceil_mode`). The N-D pools (`pool_nd`) and the 3-D convolution
//! (`conv3d`) build on it; the 1-D and 2-D paths of `conv` keep their own
//! resolution into tracejit's 2-D spatial ops.
//!
//! The rules are ONNX's reference (`onnx/reference/ops/op_pool_common.py`):
//! the effective extent of a kernel is `(k-1)·d + 1`; `SAME_UPPER` /
//! `SAME_LOWER` give `ceil(in/s)` outputs with the odd pad at the end /
//! start; explicit pads give `floor((in + pads - extent)/s) + 1` outputs,
//! or `ceil(..)` with `ceil_mode`, dropping a last window that would start
//! in the end padding. A `ceil_mode` window may reach past the end
//! padding: that overhang is not part of the input or its padding (see
//! [`AxisWindow::count`]). ONNX's reference spreads such an overhang over
//! both ends when it exceeds one element, which moves every window; like
//! ONNX Runtime, PyTorch and the 2-D path, windows here always start at
//! `o·s - pad_begin`.

use crate::import::node::Node;

/// One spatial axis of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AxisWindow {
    /// The input's length.
    pub input: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
    /// The output's length (at least 1).
    pub out: usize,
}

impl AxisWindow {
    /// `(k-1)·d + 1`: the span of one window.
    pub fn extent(&self) -> usize {
        (self.kernel - 1) * self.dilation + 1
    }

    /// The length the input must be padded to (begin pad, input, end pad
    /// and any `ceil_mode` overhang) so every window lies inside it.
    pub fn padded_len(&self) -> usize {
        ((self.out - 1) * self.stride + self.extent()).max(self.pad_begin + self.input + self.pad_end)
    }

    /// The end padding that makes [`AxisWindow::padded_len`].
    pub fn pad_end_total(&self) -> usize {
        self.padded_len() - self.pad_begin - self.input
    }

    /// Per output position, how many of its window's taps fall in
    /// `[lo, hi)` of the padded axis (the input alone is `[pad_begin,
    /// pad_begin + input)`; the input with its pads is `[0, pad_begin +
    /// input + pad_end)`).
    pub fn count(&self, lo: usize, hi: usize) -> Vec<usize> {
        (0..self.out)
            .map(|o| {
                (0..self.kernel).map(|j| o * self.stride + j * self.dilation).filter(|p| (lo..hi).contains(p)).count()
            })
            .collect()
    }
}

/// A per-axis attribute (`strides`, `dilations`), defaulting to 1.
fn per_axis(n: &Node, name: &str, sr: usize) -> Result<Vec<usize>, String> {
    let v = n.attr_ints(name)?.unwrap_or_else(|| vec![1; sr]);
    if v.len() != sr || v.iter().any(|&s| s < 1) {
        return Err(format!("{name} {v:?} does not fit {sr} spatial axes"));
    }
    Ok(v.iter().map(|&s| s as usize).collect())
}

/// Resolves `n`'s window over an input of spatial dims `input` with the
/// kernel `kernel` (from `kernel_shape` or the weights); `ceil_mode` is
/// read when the node has it (pools).
pub(crate) fn resolve(n: &Node, input: &[usize], kernel: &[usize]) -> Result<Vec<AxisWindow>, String> {
    let sr = input.len();
    if kernel.len() != sr || kernel.contains(&0) {
        return Err(format!("kernel {kernel:?} does not fit {sr} spatial axes"));
    }
    let stride = per_axis(n, "strides", sr)?;
    let dilation = per_axis(n, "dilations", sr)?;
    let ceil = n.attr_i("ceil_mode", 0)? != 0;
    let mut pads = vec![0usize; 2 * sr];
    let auto = n.attr_s("auto_pad", "NOTSET")?;
    match auto.as_str() {
        "NOTSET" => {
            if let Some(p) = n.attr_ints("pads")? {
                if p.len() != 2 * sr || p.iter().any(|&v| v < 0) {
                    return Err(format!("pads {p:?} do not fit {sr} spatial axes"));
                }
                pads = p.iter().map(|&v| v as usize).collect();
            }
        }
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for a in 0..sr {
                let out = input[a].div_ceil(stride[a]);
                let extent = (kernel[a] - 1) * dilation[a] + 1;
                let total = ((out.max(1) - 1) * stride[a] + extent).saturating_sub(input[a]);
                let small = total / 2;
                let (begin, end) = if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                pads[a] = begin;
                pads[sr + a] = end;
            }
        }
        other => return Err(format!("auto_pad '{other}' is not supported")),
    }
    (0..sr)
        .map(|a| {
            let mut w = AxisWindow {
                input: input[a],
                kernel: kernel[a],
                stride: stride[a],
                dilation: dilation[a],
                pad_begin: pads[a],
                pad_end: pads[sr + a],
                out: 0,
            };
            let padded = w.pad_begin + w.input + w.pad_end;
            let room = padded.checked_sub(w.extent()).ok_or_else(|| {
                format!(
                    "the window (kernel {kernel:?}, dilations {dilation:?}) does not fit the padded input {input:?}"
                )
            })?;
            w.out = if ceil {
                let out = room.div_ceil(w.stride) + 1;
                // A last window starting in the end padding is dropped.
                if (out - 1) * w.stride >= w.input + w.pad_begin {
                    out - 1
                } else {
                    out
                }
            } else {
                room / w.stride + 1
            };
            if w.out == 0 || w.input == 0 {
                return Err(format!("the input's spatial dims {input:?} leave no window"));
            }
            Ok(w)
        })
        .collect()
}
