//! Shape rules of the spatial family (see [`tracejit_tensor::spatial`]):
//! 2-D convolution and pooling over NCHW tensors and their gradients.
//!
//! Any dimension may be unknown (a batch traced as `-1`, an image size
//! left open): a rule checks what is known and an output dimension is
//! known only when the inputs it follows from are. Messages say what was
//! expected and what came (`conv2d: weights f32[8, 3, 3, 3] expect 3
//! input channels per group (1 group), got x f32[2, 4, 8, 8]`).

use smallvec::smallvec;
use tracejit_tensor::{Conv2dAttrs, Pool2dAttrs, SpatialOp};

use super::*;
use crate::TensorType;

/// The output types of a spatial op.
pub(super) fn spatial(op: &SpatialOp, inputs: &[TensorType]) -> Result<Outputs, String> {
    if op.is_channels_last() {
        return channels_last(op, inputs);
    }
    match *op {
        SpatialOp::Conv2d { conv, bias, .. } => {
            let (x, w) = (&inputs[0], &inputs[1]);
            float_pair("x", x, "weights", w)?;
            rank4("x", x)?;
            rank4("weights", w)?;
            check_conv(&conv)?;
            check_groups(&conv, x.dims[1], w)?;
            if bias {
                let b = &inputs[2];
                if b.dtype != x.dtype || b.rank() != 1 || !agree(b.dims[0], w.dims[0]) {
                    return Err(format!(
                        "the bias must be {}[{}] (one per output channel), got {b}",
                        x.dtype,
                        dim(w.dims[0])
                    ));
                }
            }
            let hw = conv_out(&conv, [x.dims[2], x.dims[3]], [w.dims[2], w.dims[3]], x, w)?;
            Ok(smallvec![TensorType { dtype: x.dtype, dims: smallvec![x.dims[0], w.dims[0], hw[0], hw[1]] }])
        }
        SpatialOp::Conv2dBackwardData { conv, input_hw } => {
            let (dy, w) = (&inputs[0], &inputs[1]);
            float_pair("dy", dy, "weights", w)?;
            rank4("dy", dy)?;
            rank4("weights", w)?;
            check_conv(&conv)?;
            let c = w.dims[1].map(|c| c * conv.groups);
            check_groups(&conv, c, w)?;
            let x =
                TensorType { dtype: dy.dtype, dims: smallvec![dy.dims[0], c, Some(input_hw[0]), Some(input_hw[1])] };
            let hw = conv_out(&conv, [Some(input_hw[0]), Some(input_hw[1])], [w.dims[2], w.dims[3]], &x, w)?;
            expect_dy(dy, &[dy.dims[0], w.dims[0], hw[0], hw[1]])?;
            Ok(smallvec![x])
        }
        SpatialOp::Conv2dBackwardFilter { conv, kernel, bias } => {
            let (x, dy) = (&inputs[0], &inputs[1]);
            float_pair("x", x, "dy", dy)?;
            rank4("x", x)?;
            rank4("dy", dy)?;
            check_conv(&conv)?;
            if let Some(c) = x.dims[1] {
                if !c.is_multiple_of(conv.groups) {
                    return Err(format!("{c} input channels do not split into {} groups (x {x})", conv.groups));
                }
            }
            let icg = x.dims[1].map(|c| c / conv.groups);
            let w = TensorType { dtype: x.dtype, dims: smallvec![dy.dims[1], icg, Some(kernel[0]), Some(kernel[1])] };
            check_groups(&conv, x.dims[1], &w)?;
            let hw = conv_out(&conv, [x.dims[2], x.dims[3]], [Some(kernel[0]), Some(kernel[1])], x, &w)?;
            expect_dy(dy, &[x.dims[0], dy.dims[1], hw[0], hw[1]])?;
            let mut out = smallvec![w];
            if bias {
                out.push(TensorType { dtype: x.dtype, dims: smallvec![dy.dims[1]] });
            }
            Ok(out)
        }
        SpatialOp::MaxPool2d { pool } | SpatialOp::AvgPool2d { pool } => {
            let x = &inputs[0];
            float("x", x)?;
            rank4("x", x)?;
            let hw = pool_out(&pool, [x.dims[2], x.dims[3]], x)?;
            Ok(smallvec![TensorType { dtype: x.dtype, dims: smallvec![x.dims[0], x.dims[1], hw[0], hw[1]] }])
        }
        SpatialOp::MaxPool2dBackward { pool } => {
            let (x, dy) = (&inputs[0], &inputs[1]);
            float_pair("x", x, "dy", dy)?;
            rank4("x", x)?;
            rank4("dy", dy)?;
            let hw = pool_out(&pool, [x.dims[2], x.dims[3]], x)?;
            expect_dy(dy, &[x.dims[0], x.dims[1], hw[0], hw[1]])?;
            Ok(smallvec![x.clone()])
        }
        SpatialOp::Conv2dNhwc { .. } | SpatialOp::MaxPool2dNhwc { .. } => unreachable!("taken above"),
        SpatialOp::AvgPool2dBackward { pool, input_hw } => {
            let dy = &inputs[0];
            float("dy", dy)?;
            rank4("dy", dy)?;
            let x = TensorType {
                dtype: dy.dtype,
                dims: smallvec![dy.dims[0], dy.dims[1], Some(input_hw[0]), Some(input_hw[1])],
            };
            let hw = pool_out(&pool, [Some(input_hw[0]), Some(input_hw[1])], &x)?;
            expect_dy(dy, &[dy.dims[0], dy.dims[1], hw[0], hw[1]])?;
            Ok(smallvec![x])
        }
    }
}

/// A channels-last op's types: its NCHW form's rule on the image with its
/// axes moved (`[N, H, W, C]` read as `[N, C, H, W]`), the result's moved
/// back.
fn channels_last(op: &SpatialOp, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if x.rank() != 4 {
        return Err(format!("x must be of rank 4 (NHWC), got {x}"));
    }
    let first = op.channels_first();
    let mut args = inputs[..first.num_inputs()].to_vec();
    args[0] = TensorType { dtype: x.dtype, dims: smallvec![x.dims[0], x.dims[3], x.dims[1], x.dims[2]] };
    let mut outs = spatial(&first, &args)?;
    for y in outs.iter_mut() {
        y.dims = smallvec![y.dims[0], y.dims[2], y.dims[3], y.dims[1]];
    }
    if let Some(e) = op.conv_epilogue() {
        check_epilogue(e, inputs, &outs[0])?;
    }
    Ok(outs)
}

/// A `conv2d_nhwc` epilogue's operands: f32 or f64 as x (bf16 and f16
/// would round once where the ops it stands for round at every step),
/// the scale and bias `[O]`, the residual of the result's shape.
fn check_epilogue(e: tracejit_tensor::ConvEpilogue, inputs: &[TensorType], y: &TensorType) -> Result<(), String> {
    if !matches!(y.dtype, DType::F32 | DType::F64) {
        return Err(format!("a scale or residual epilogue computes in f32 or f64, got x {}", inputs[0]));
    }
    for (name, at) in [("scale", e.scale), ("bias", e.bias)] {
        let Some(t) = at.map(|i| &inputs[i]) else { continue };
        if t.dtype != y.dtype || t.rank() != 1 || !agree(t.dims[0], y.dims[3]) {
            return Err(format!(
                "the {name} must be {}[{}] (one per output channel), got {t}",
                y.dtype,
                dim(y.dims[3])
            ));
        }
    }
    if let Some(r) = e.residual.map(|i| &inputs[i]) {
        // Unknown only where the result's is too: a residual that would
        // broadcast the result wider has no place here.
        let same =
            r.rank() == 4 && r.dims.iter().zip(&y.dims).all(|(&a, &b)| agree(a, b) && (a.is_some() || b.is_none()));
        if r.dtype != y.dtype || !same {
            return Err(format!("the residual must be of the result's type {y}, got {r}"));
        }
    }
    Ok(())
}

fn dim(d: Dim) -> String {
    d.map_or("?".to_string(), |n| n.to_string())
}

/// Two dims that may be equal (equal, or one unknown).
fn agree(a: Dim, b: Dim) -> bool {
    !matches!((a, b), (Some(a), Some(b)) if a != b)
}

fn float(what: &str, t: &TensorType) -> Result<(), String> {
    // bf16 and f16 compute in f32 and round each result, as every op does.
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be a float tensor (f32, f64, bf16 or f16), got {t}"))
    }
}

fn float_pair(a: &str, at: &TensorType, b: &str, bt: &TensorType) -> Result<(), String> {
    float(a, at)?;
    if at.dtype != bt.dtype {
        return Err(format!("{a} and {b} must share one dtype, got {at} and {bt}"));
    }
    Ok(())
}

fn rank4(what: &str, t: &TensorType) -> Result<(), String> {
    if t.rank() == 4 {
        Ok(())
    } else {
        let layout = if what == "weights" { "[out_channels, in_channels / groups, kh, kw]" } else { "NCHW" };
        Err(format!("{what} must be of rank 4 ({layout}), got {t}"))
    }
}

fn check_conv(c: &Conv2dAttrs) -> Result<(), String> {
    if c.groups == 0 || c.stride.contains(&0) || c.dilation.contains(&0) {
        return Err(format!(
            "groups, strides and dilations must be at least 1, got groups {}, stride {:?}, dilation {:?}",
            c.groups, c.stride, c.dilation
        ));
    }
    Ok(())
}

/// `w`'s channels fit `c` input channels in the groups, and its output
/// channels split into them.
fn check_groups(c: &Conv2dAttrs, channels: Dim, w: &TensorType) -> Result<(), String> {
    let g = c.groups;
    if let Some(o) = w.dims[0] {
        if !o.is_multiple_of(g) {
            return Err(format!("{o} output channels (weights {w}) do not split into {g} groups"));
        }
    }
    if let (Some(ch), Some(icg)) = (channels, w.dims[1]) {
        if icg * g != ch {
            let groups = if g == 1 { "1 group".to_string() } else { format!("{g} groups") };
            return Err(format!("weights {w} expect {} input channels ({icg} per group, {groups}), got {ch}", icg * g));
        }
    }
    Ok(())
}

/// The output (height, width) of a convolution of an input of `hw` by a
/// kernel of `k`.
fn conv_out(c: &Conv2dAttrs, hw: [Dim; 2], k: [Dim; 2], x: &TensorType, w: &TensorType) -> Result<[Dim; 2], String> {
    let mut out = [None; 2];
    for axis in 0..2 {
        if let (Some(n), Some(k)) = (hw[axis], k[axis]) {
            out[axis] = Some(c.out_size(axis, n, k).ok_or_else(|| {
                let ext = k.saturating_sub(1) * c.dilation[axis] + 1;
                format!(
                    "the kernel {w} (extent {ext} with dilation {}) does not fit the {} of x {x} padded to {}",
                    c.dilation[axis],
                    ["height", "width"][axis],
                    n + c.pad[axis] + c.pad[axis + 2]
                )
            })?);
        }
    }
    Ok(out)
}

fn pool_out(p: &Pool2dAttrs, hw: [Dim; 2], x: &TensorType) -> Result<[Dim; 2], String> {
    if let Some(problem) = p.problem() {
        return Err(problem);
    }
    let mut out = [None; 2];
    for axis in 0..2 {
        if let Some(n) = hw[axis] {
            out[axis] = Some(p.out_size(axis, n).ok_or_else(|| {
                format!(
                    "the window {:?} does not fit the {} of x {x} padded to {}",
                    p.kernel,
                    ["height", "width"][axis],
                    n + p.pad[axis] + p.pad[axis + 2]
                )
            })?);
        }
    }
    Ok(out)
}

/// `dy` has the forward output's shape (where both are known).
fn expect_dy(dy: &TensorType, want: &[Dim]) -> Result<(), String> {
    if dy.dims.iter().zip(want).all(|(&a, &b)| agree(a, b)) {
        Ok(())
    } else {
        let want: Vec<String> = want.iter().map(|&d| dim(d)).collect();
        Err(format!("dy must be the forward output's shape [{}], got {dy}", want.join(", ")))
    }
}
