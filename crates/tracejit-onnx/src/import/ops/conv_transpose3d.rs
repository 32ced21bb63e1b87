//! `ConvTranspose` on `[N, C, D, H, W]` inputs as one 2-D transposed
//! convolution whose output channels carry the depth taps, then a
//! scatter of those taps along depth. Composed of tensor ops (tracejit's
//! `Conv2dBackwardData`, reshape, pad, slices and adds), so gradients, the
//! JIT and export work as for any traced code.
//!
//! Input depth `i` and kernel depth tap `a` land on output depth
//! `i·s + a·d` (before the pads are cropped). The 2-D op computes, for
//! every input depth at once (depth folded into the batch), the planes of
//! all `KD` taps as `KD·M/G` output channels per group (the weights
//! `[C, M/G, KD, KH, KW]` permuted to `[C, KD·M/G, KH, KW]`); each tap's
//! planes are then spread `s` apart along depth (zeros between), shifted
//! by `a·d` and summed. The pads follow ONNX's spec: `pads`, `auto_pad`
//! (`SAME_*` make the output `input·stride`) or `output_shape` (the pads
//! derived, the odd one at the end for `SAME_UPPER`, at the start
//! otherwise), with `output_padding` added at the end.

use tracejit_tensor::{Conv2dAttrs, SpatialOp};
use tracejit_trace::{spatial, Tensor};

use crate::import::node::Node;

/// One spatial axis: the input length, kernel, stride, dilation, output
/// padding and the resolved begin/end pads.
#[derive(Clone, Copy, Debug)]
struct Axis {
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    out_pad: usize,
    pad_begin: usize,
    pad_end: usize,
}

impl Axis {
    /// The output length before the pads are cropped.
    fn full(&self) -> usize {
        self.stride * (self.input - 1) + self.out_pad + (self.kernel - 1) * self.dilation + 1
    }

    fn out(&self) -> usize {
        self.full() - self.pad_begin - self.pad_end
    }
}

fn ints(n: &Node, name: &str, default: usize, len: usize) -> Result<Vec<usize>, String> {
    let v = n.attr_ints(name)?.unwrap_or_else(|| vec![default as i64; len]);
    if v.len() != len || v.iter().any(|&x| x < 0) {
        return Err(format!("{name} {v:?} must hold {len} non-negative values"));
    }
    Ok(v.iter().map(|&x| x as usize).collect())
}

/// Resolves the three axes' pads from `n`'s attributes.
fn axes(n: &Node, input: [usize; 3], kernel: [usize; 3]) -> Result<[Axis; 3], String> {
    let stride = ints(n, "strides", 1, 3)?;
    let dilation = ints(n, "dilations", 1, 3)?;
    let out_pad = ints(n, "output_padding", 0, 3)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(format!("strides {stride:?} and dilations {dilation:?} must be positive"));
    }
    let mut ax = [0, 1, 2].map(|a| Axis {
        input: input[a],
        kernel: kernel[a],
        stride: stride[a],
        dilation: dilation[a],
        out_pad: out_pad[a],
        pad_begin: 0,
        pad_end: 0,
    });
    let auto = n.attr_s("auto_pad", "NOTSET")?;
    // `total` split with the odd element at the end (`upper`) or the start.
    let split = |a: &mut Axis, total: usize, upper: bool| {
        (a.pad_begin, a.pad_end) = if upper { (total / 2, total - total / 2) } else { (total - total / 2, total / 2) };
    };
    if let Some(shape) = n.attr_ints("output_shape")? {
        let shape = &shape[shape.len().saturating_sub(3)..];
        if shape.len() != 3 || shape.iter().any(|&v| v < 1) {
            return Err(format!("output_shape {shape:?} does not fit 3 spatial axes"));
        }
        for (a, &want) in ax.iter_mut().zip(shape) {
            let total = a.full().checked_sub(want as usize).ok_or("output_shape larger than the transposed size")?;
            split(a, total, auto == "SAME_UPPER");
        }
    } else {
        match auto.as_str() {
            "NOTSET" => {
                let pads = ints(n, "pads", 0, 6)?;
                for (i, a) in ax.iter_mut().enumerate() {
                    (a.pad_begin, a.pad_end) = (pads[i], pads[3 + i]);
                }
            }
            "VALID" => {}
            mode @ ("SAME_UPPER" | "SAME_LOWER") => {
                for a in ax.iter_mut() {
                    let total = a.full().saturating_sub(a.input * a.stride);
                    split(a, total, mode == "SAME_UPPER");
                }
            }
            other => return Err(format!("auto_pad '{other}' is not supported")),
        }
    }
    if ax.iter().any(|a| a.pad_begin + a.pad_end >= a.full()) {
        return Err(format!("the pads leave no output (input {input:?}, kernel {kernel:?})"));
    }
    Ok(ax)
}

/// The transposed convolution of `x` `[N, C, D, H, W]` (the batch may be
/// unknown) by `w` `[C, M/group, KD, KH, KW]` plus `bias`.
pub(crate) fn conv_transpose3d(n: &Node, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
    let dims = x.dims();
    let (Some(c), Some(d), Some(h), Some(wd)) = (dims[1], dims[2], dims[3], dims[4]) else {
        return Err(format!("the input's channel and spatial dims must be known, got {dims:?}"));
    };
    let ws = w.shape().to_vec();
    let group = usize::try_from(n.attr_i("group", 1)?).map_err(|_| "negative group".to_string())?;
    if ws.len() != 5 || group == 0 || ws[0] != c || c % group != 0 || ws[2..].contains(&0) {
        return Err(format!("weights {ws:?} and group {group} do not fit an input of {c} channels"));
    }
    let [depth, rows, cols] = axes(n, [d, h, wd], [ws[2], ws[3], ws[4]])?;
    // The 2-D op's input is the forward convolution's output, which an
    // output padding of a stride or more would change.
    if rows.out_pad >= rows.stride || cols.out_pad >= cols.stride {
        return Err(format!(
            "output_padding {:?} at or above the strides {:?} of height or width is not supported",
            [rows.out_pad, cols.out_pad],
            [rows.stride, cols.stride]
        ));
    }
    let (mg, kd, m) = (ws[1] as i64, ws[2] as i64, (ws[1] * group) as i64);
    let (g, id) = (group as i64, d as i64);
    // Depth into the batch: [N, C, D, H, W] -> [N·D, C, H, W].
    let x2 = x.transpose(&[0, 2, 1, 3, 4]).reshape(&[-1, c as i64, h as i64, wd as i64]);
    let w2 = w.transpose(&[0, 2, 1, 3, 4]).reshape(&[c as i64, kd * mg, ws[3] as i64, ws[4] as i64]);
    let (oh, ow) = (rows.out(), cols.out());
    let attrs = Conv2dAttrs {
        stride: [rows.stride, cols.stride],
        dilation: [rows.dilation, cols.dilation],
        pad: [rows.pad_begin, cols.pad_begin, rows.pad_end, cols.pad_end],
        groups: group,
    };
    let op = SpatialOp::Conv2dBackwardData { conv: attrs, input_hw: [oh, ow] };
    let planes = spatial(op, &[&x2, &w2]).into_iter().next().ok_or("conv_transpose gave no output")?;
    // [N·D, G·KD·M/G, OH, OW] -> [N, D, G, KD, M/G, OH, OW].
    let planes = planes.reshape(&[-1, id, g, kd, mg, oh as i64, ow as i64]);
    let (s, spread) = (depth.stride, (d - 1) * depth.stride + 1);
    let mut sum: Option<Tensor> = None;
    for a in 0..depth.kernel {
        // Tap a's planes [N, D, M, OH, OW], input depths s apart.
        let tap = planes.slice_axis(3, a as i64, a as i64 + 1).reshape(&[-1, id, m, oh as i64, ow as i64]);
        let tap = if s > 1 {
            tap.expand_dims(2)
                .pad(&[(0, 0), (0, 0), (0, s - 1), (0, 0), (0, 0), (0, 0)], 0.0)
                .reshape(&[-1, id * s as i64, m, oh as i64, ow as i64])
                .slice_axis(1, 0, spread as i64)
        } else {
            tap
        };
        let shift = a * depth.dilation;
        let placed = tap.pad(&[(0, 0), (shift, depth.full() - shift - spread), (0, 0), (0, 0), (0, 0)], 0.0);
        sum = Some(match sum {
            None => placed,
            Some(t) => t + placed,
        });
    }
    let full = sum.ok_or("a kernel has at least one depth tap")?;
    let cropped = full.slice_axis(1, depth.pad_begin as i64, (depth.full() - depth.pad_end) as i64);
    let y = cropped.transpose(&[0, 2, 1, 3, 4]);
    Ok(match bias {
        Some(b) => y + b.reshape(&[1, m, 1, 1, 1]),
        None => y,
    })
}
