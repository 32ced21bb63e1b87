//! `Conv` on `[N, C, D, H, W]` inputs as one 2-D convolution: the depth
//! axis is unrolled into channels. Composed of tensor ops (pad, strided
//! slices, stack, reshape, transpose and tracejit's 2-D convolution), so
//! gradients, the JIT and export work as for any traced code.
//!
//! Output depth `od` sums, over the kernel's depth taps `a`, the 2-D
//! convolution of input depth `od·s + a·d` (in the depth-padded input)
//! with the weights' slice `W[:, :, a]`. Stacking the `KD` strided depth
//! slices beside the channels turns that sum into one convolution of
//! `[N·OD, KD·C, H, W]` by `[M, KD·C/G, KH, KW]`: within each group the
//! channels run (tap, channel), the weights are permuted to match, and
//! `group` stays the 2-D op's `groups`. Height and width keep their
//! strides, dilations and pads in the 2-D op. The cost is the input copied
//! `KD/sd` times; the multiply-adds are those of the 3-D convolution.

use tracejit_tensor::{Conv2dAttrs, SliceSpec, SpatialOp};
use tracejit_trace::{spatial, Tensor};

use super::window_nd::resolve;
use crate::import::node::Node;

/// The convolution of `x` `[N, C, D, H, W]` (the batch may be unknown) by
/// `w` `[M, C/group, KD, KH, KW]` plus `bias` under `n`'s attributes.
pub(crate) fn conv3d(n: &Node, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
    let dims = x.dims();
    let (Some(c), Some(d), Some(h), Some(wd)) = (dims[1], dims[2], dims[3], dims[4]) else {
        return Err(format!("the input's channel and spatial dims must be known, got {dims:?}"));
    };
    let ws = w.shape().to_vec();
    if ws.len() != 5 {
        return Err(format!("weights {ws:?} for a rank-5 input must be of rank 5"));
    }
    let group = usize::try_from(n.attr_i("group", 1)?).map_err(|_| "negative group".to_string())?;
    let (m, cg) = (ws[0], ws[1]);
    if group == 0 || c % group != 0 || m % group != 0 || cg * group != c {
        return Err(format!("weights {ws:?} and group {group} do not fit an input of {c} channels"));
    }
    let axes = resolve(n, &[d, h, wd], &ws[2..])?;
    let [depth, rows, cols] = [axes[0], axes[1], axes[2]];
    // Pad the depth only; the 2-D op pads height and width.
    let xp = if depth.pad_begin + depth.pad_end_total() > 0 {
        x.pad(&[(0, 0), (0, 0), (depth.pad_begin, depth.pad_end_total()), (0, 0), (0, 0)], 0.0)
    } else {
        x.clone()
    };
    let mut specs = vec![SliceSpec::FULL; 5];
    let slices: Vec<Tensor> = (0..depth.kernel)
        .map(|a| {
            let start = (a * depth.dilation) as i64;
            let stop = start + ((depth.out - 1) * depth.stride) as i64 + 1;
            specs[2] = SliceSpec { start: Some(start), stop: Some(stop), step: depth.stride as i64 };
            xp.slice(&specs)
        })
        .collect();
    let (g, kd, od) = (group as i64, depth.kernel as i64, depth.out as i64);
    let (cg, h, wd) = (cg as i64, h as i64, wd as i64);
    // [N, KD, C, OD, H, W] -> [N, KD, G, C/G, OD, H, W] -> [N, OD, G, KD, C/G, H, W].
    let x2 = Tensor::stack(&slices, 1)
        .reshape(&[-1, kd, g, cg, od, h, wd])
        .transpose(&[0, 4, 2, 1, 3, 5, 6])
        .reshape(&[-1, g * kd * cg, h, wd]);
    // [M, C/G, KD, KH, KW] -> [M, KD, C/G, KH, KW] -> [M, KD·C/G, KH, KW].
    let w2 = w.transpose(&[0, 2, 1, 3, 4]).reshape(&[m as i64, kd * cg, ws[3] as i64, ws[4] as i64]);
    let attrs = Conv2dAttrs {
        stride: [rows.stride, cols.stride],
        dilation: [rows.dilation, cols.dilation],
        pad: [rows.pad_begin, cols.pad_begin, rows.pad_end, cols.pad_end],
        groups: group,
    };
    let op = SpatialOp::Conv2d { conv: attrs, bias: bias.is_some(), relu: false };
    let y = match bias {
        Some(b) => spatial(op, &[&x2, &w2, b]),
        None => spatial(op, &[&x2, &w2]),
    };
    let y = y.into_iter().next().ok_or("conv gave no output")?;
    // [N·OD, M, OH, OW] -> [N, OD, M, OH, OW] -> [N, M, OD, OH, OW].
    Ok(y.reshape(&[-1, od, m as i64, rows.out as i64, cols.out as i64]).transpose(&[0, 2, 1, 3, 4]))
}
