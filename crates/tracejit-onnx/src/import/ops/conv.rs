//! Convolutions and pools: `Conv`, `ConvTranspose`, `MaxPool`,
//! `AveragePool`, `LpPool` and the global pools, over tracejit's 2-D
//! spatial ops (NCHW; a 1-D op runs as 2-D with a unit height). A 3-D
//! `Conv` goes to `conv3d` (one 2-D convolution over depth-unrolled
//! channels) and a dilated or 3-D (or higher) pool to `pool_nd` (strided
//! slices); a 3-D `ConvTranspose` to `conv_transpose3d`. `Col2Im` (any rank) is a
//! scatter-add of the columns into the image.
//!
//! ONNX's padding rules are resolved here into explicit per-side pads:
//! `auto_pad` (`SAME_UPPER` puts the odd pad at the end, `SAME_LOWER` at
//! the start, `VALID` none), `ceil_mode` (extra end padding, with
//! PyTorch's rule that a window must start inside the input or its start
//! padding), and `count_include_pad` (the input padded with zeros first,
//! so the pads count). A `ConvTranspose` is the input gradient of the
//! convolution it transposes (`Conv2dBackwardData`), whose weight layout
//! ONNX shares.

use tracejit_tensor::{Conv2dAttrs, DType, Pool2dAttrs, SpatialOp};
use tracejit_trace::{spatial, Tensor};

use super::conv3d::conv3d;
use super::conv_transpose3d::conv_transpose3d;
use super::pool_nd::{self, PoolKind};
use crate::import::node::{Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

/// The spatial attributes of a Conv/Pool node, resolved for 2-D.
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    /// top, left, bottom, right.
    pad: [usize; 4],
}

/// The spatial rank of `x` (its rank minus batch and channels) on the
/// 2-D ops' path, refusing all but 1 and 2 (the callers route 3-D inputs
/// to `conv3d` and `pool_nd` first where those reach).
fn spatial_rank(n: &Node, x: &Tensor) -> Result<usize, String> {
    match x.rank() {
        3 => Ok(1),
        4 => Ok(2),
        r => Err(format!("{} on a rank-{r} input: only 1-D and 2-D spatial ops are supported", n.op_type)),
    }
}

/// `x` with a unit height inserted for a 1-D op.
fn as_2d(x: &Tensor, sr: usize) -> Tensor {
    if sr == 1 {
        x.expand_dims(2)
    } else {
        x.clone()
    }
}

fn from_2d(y: Tensor, sr: usize) -> Tensor {
    if sr == 1 {
        y.squeeze(&[2])
    } else {
        y
    }
}

/// A per-axis attribute list (`strides`, `dilations`) as 2-D, defaulting to 1.
fn pair(n: &Node, name: &str, sr: usize) -> Result<[usize; 2], String> {
    let v = n.attr_ints(name)?.unwrap_or_else(|| vec![1; sr]);
    if v.len() != sr || v.iter().any(|&s| s < 1) {
        return Err(format!("{name} {v:?} does not fit {sr} spatial axes"));
    }
    Ok(if sr == 1 { [1, v[0] as usize] } else { [v[0] as usize, v[1] as usize] })
}

/// Resolves kernel, strides, dilations and pads (`auto_pad` or `pads`)
/// for an input of spatial size `hw` (already 2-D).
fn window(n: &Node, sr: usize, hw: [usize; 2], kernel: [usize; 2]) -> Result<Window, String> {
    let stride = pair(n, "strides", sr)?;
    let dilation = pair(n, "dilations", sr)?;
    let mut pad = [0usize; 4];
    match n.attr_s("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => {
            if let Some(p) = n.attr_ints("pads")? {
                if p.len() != 2 * sr || p.iter().any(|&v| v < 0) {
                    return Err(format!("pads {p:?} do not fit {sr} spatial axes"));
                }
                let p: Vec<usize> = p.iter().map(|&v| v as usize).collect();
                pad = if sr == 1 { [0, p[0], 0, p[1]] } else { [p[0], p[1], p[2], p[3]] };
            }
        }
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for a in 0..2 {
                let out = hw[a].div_ceil(stride[a]);
                let extent = (kernel[a] - 1) * dilation[a] + 1;
                let total = ((out.saturating_sub(1)) * stride[a] + extent).saturating_sub(hw[a]);
                let small = total / 2;
                let (begin, end) = if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                pad[a] = begin;
                pad[a + 2] = end;
            }
        }
        other => return Err(format!("auto_pad '{other}' is not supported")),
    }
    Ok(Window { kernel, stride, dilation, pad })
}

fn kernel_attr(n: &Node, sr: usize) -> Result<[usize; 2], String> {
    let k = n.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?;
    if k.len() != sr || k.iter().any(|&v| v < 1) {
        return Err(format!("kernel_shape {k:?} does not fit {sr} spatial axes"));
    }
    Ok(if sr == 1 { [1, k[0] as usize] } else { [k[0] as usize, k[1] as usize] })
}

/// The input's spatial dims (the batch may be unknown: a model traced
/// for any batch size).
fn hw_of(x2: &Tensor) -> Result<[usize; 2], String> {
    match x2.dims()[..] {
        [_, _, Some(h), Some(w)] => Ok([h, w]),
        ref dims => Err(format!("the input's spatial dims must be known, got {dims:?}")),
    }
}

/// `Conv`.
pub(crate) fn conv(n: &mut Node) -> OpResult {
    let (x, w) = (n.input(0)?, n.input(1)?);
    Ok(vec![conv_with(n, x, w, n.opt_input(2))?])
}

/// The convolution of `x` by `w` (plus `bias`) under `n`'s Conv attributes
/// (also what `ConvInteger` and `QLinearConv` compute, on their
/// zero-point-shifted operands).
pub(crate) fn conv_with(n: &Node, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
    if let Some(k) = n.attr_ints("kernel_shape")? {
        let expect: Vec<i64> = w.shape()[2..].iter().map(|&d| d as i64).collect();
        if k != expect {
            return Err(format!("kernel_shape {k:?} differs from the weights' {expect:?}"));
        }
    }
    if x.rank() == 5 {
        return conv3d(n, x, w, bias);
    }
    let sr = spatial_rank(n, x)?;
    let (x2, w2) = (as_2d(x, sr), as_2d(w, sr));
    let kernel = [w2.shape()[2], w2.shape()[3]];
    let win = window(n, sr, hw_of(&x2)?, kernel)?;
    let group = usize::try_from(n.attr_i("group", 1)?).map_err(|_| "negative group".to_string())?;
    let attrs = Conv2dAttrs { stride: win.stride, dilation: win.dilation, pad: win.pad, groups: group };
    let op = SpatialOp::Conv2d { conv: attrs, bias: bias.is_some(), relu: false };
    let y = match bias {
        Some(b) => spatial(op, &[&x2, &w2, b]),
        None => spatial(op, &[&x2, &w2]),
    };
    Ok(from_2d(y.into_iter().next().ok_or("conv gave no output")?, sr))
}

/// `ConvTranspose`: the data gradient of a convolution with the same
/// attributes, its output size `s·(in-1) + output_padding + ((k-1)·d + 1)
/// - pads` (or `output_shape`, the pads then derived).
pub(crate) fn conv_transpose(n: &mut Node) -> OpResult {
    let (x, w) = (n.input(0)?, n.input(1)?);
    if x.rank() == 5 {
        return Ok(vec![conv_transpose3d(n, x, w, n.opt_input(2))?]);
    }
    let sr = spatial_rank(n, x)?;
    let (x2, w2) = (as_2d(x, sr), as_2d(w, sr));
    let kernel = [w2.shape()[2], w2.shape()[3]];
    let stride = pair(n, "strides", sr)?;
    let dilation = pair(n, "dilations", sr)?;
    let group = usize::try_from(n.attr_i("group", 1)?).map_err(|_| "negative group".to_string())?;
    let out_pad = n.attr_ints("output_padding")?.unwrap_or_else(|| vec![0; sr]);
    if out_pad.len() != sr || out_pad.iter().any(|&v| v < 0) {
        return Err(format!("output_padding {out_pad:?} does not fit {sr} spatial axes"));
    }
    let op2: [usize; 2] = if sr == 1 { [0, out_pad[0] as usize] } else { [out_pad[0] as usize, out_pad[1] as usize] };
    let input = hw_of(&x2)?;
    let full = |a: usize| stride[a] * (input[a] - 1) + op2[a] + (kernel[a] - 1) * dilation[a] + 1;
    let auto = n.attr_s("auto_pad", "NOTSET")?;
    let mut pad = [0usize; 4];
    let out_shape = n.attr_ints("output_shape")?;
    if let Some(os) = out_shape.as_ref().filter(|_| auto == "NOTSET" || auto == "VALID") {
        let os: Vec<usize> = os.iter().map(|&v| v.max(0) as usize).collect();
        let os: [usize; 2] = if sr == 1 { [1, os[0]] } else { [os[0], os[1]] };
        for a in 0..2 {
            let total = full(a).checked_sub(os[a]).ok_or("output_shape larger than the transposed size")?;
            pad[a] = total / 2;
            pad[a + 2] = total - total / 2;
        }
    } else {
        match auto.as_str() {
            "NOTSET" | "VALID" => {
                if let Some(p) = n.attr_ints("pads")?.filter(|_| auto == "NOTSET") {
                    if p.len() != 2 * sr || p.iter().any(|&v| v < 0) {
                        return Err(format!("pads {p:?} do not fit {sr} spatial axes"));
                    }
                    let p: Vec<usize> = p.iter().map(|&v| v as usize).collect();
                    pad = if sr == 1 { [0, p[0], 0, p[1]] } else { [p[0], p[1], p[2], p[3]] };
                }
            }
            mode @ ("SAME_UPPER" | "SAME_LOWER") => {
                for a in 0..2 {
                    let total = full(a).saturating_sub(input[a] * stride[a]);
                    let small = total / 2;
                    let (b, e) = if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                    pad[a] = b;
                    pad[a + 2] = e;
                }
            }
            other => return Err(format!("auto_pad '{other}' is not supported")),
        }
    }
    let out_hw = [0, 1].map(|a| full(a).saturating_sub(pad[a] + pad[a + 2]));
    let attrs = Conv2dAttrs { stride, dilation, pad, groups: group };
    let op = SpatialOp::Conv2dBackwardData { conv: attrs, input_hw: out_hw };
    let mut y = spatial(op, &[&x2, &w2]).into_iter().next().ok_or("conv_transpose gave no output")?;
    if let Some(b) = n.opt_input(2) {
        y = y + b.reshape(&[1, b.len() as i64, 1, 1]);
    }
    Ok(vec![from_2d(y, sr)])
}

/// The pool window, with `ceil_mode`'s extra end padding.
fn pool_window(n: &Node, sr: usize, hw: [usize; 2]) -> Result<Window, String> {
    let kernel = kernel_attr(n, sr)?;
    let mut win = window(n, sr, hw, kernel)?;
    if win.dilation != [1, 1] {
        return Err(format!("dilations {:?} in pooling are not supported", win.dilation));
    }
    if n.attr_i("ceil_mode", 0)? != 0 {
        for a in 0..2 {
            let padded = hw[a] + win.pad[a] + win.pad[a + 2];
            let Some(room) = padded.checked_sub(kernel[a]) else { continue };
            let mut out = room.div_ceil(win.stride[a]) + 1;
            // A last window starting in the end padding is dropped (PyTorch's rule).
            if (out - 1) * win.stride[a] >= hw[a] + win.pad[a] {
                out -= 1;
            }
            let need = (out - 1) * win.stride[a] + kernel[a];
            win.pad[a + 2] += need.saturating_sub(padded);
        }
    }
    Ok(win)
}

fn pool_attrs(win: &Window) -> Pool2dAttrs {
    Pool2dAttrs { kernel: win.kernel, stride: win.stride, pad: win.pad }
}

/// `MaxPool` (the `Indices` output is not supported).
pub(crate) fn max_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if n.wants(1) {
        return Err("MaxPool's Indices output is not supported".into());
    }
    // Integers of at most 16 bits are exact in f32, and a max picks one of
    // its inputs: their pool is the f32 pool cast back.
    let small_int = matches!(x.dtype(), DType::I8 | DType::U8 | DType::I16 | DType::U16);
    let xf = if small_int { x.cast(DType::F32) } else { x.clone() };
    let y = if pool_nd::needed(n, &xf)? {
        pool_nd::pool(n, &xf, PoolKind::Max)?
    } else {
        let sr = spatial_rank(n, &xf)?;
        let x2 = as_2d(&xf, sr);
        let win = pool_window(n, sr, hw_of(&x2)?)?;
        from_2d(spatial(SpatialOp::MaxPool2d { pool: pool_attrs(&win) }, &[&x2]).remove(0), sr)
    };
    Ok(vec![if small_int { y.cast(x.dtype()) } else { y }])
}

/// `x` padded with zeros by `pad` (top, left, bottom, right), so a pool counts the pads.
fn zero_padded(x2: &Tensor, pad: [usize; 4]) -> Tensor {
    let [t, l, b, r] = pad;
    x2.pad(&[(0, 0), (0, 0), (t, b), (l, r)], 0.0)
}

/// `AveragePool`; `count_include_pad=1` pads with zeros first (ceil mode's
/// extra end padding stays a pool padding, left out of the count, as the
/// reference does).
pub(crate) fn average_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let count_include_pad = n.attr_i("count_include_pad", 0)? != 0;
    if pool_nd::needed(n, x)? {
        return Ok(vec![pool_nd::pool(n, x, PoolKind::Average { count_include_pad })?]);
    }
    let sr = spatial_rank(n, x)?;
    let x2 = as_2d(x, sr);
    let hw = hw_of(&x2)?;
    let full = pool_window(n, sr, hw)?;
    let y = if count_include_pad {
        let explicit = window(n, sr, hw, full.kernel)?.pad;
        let xp = zero_padded(&x2, explicit);
        let extra = [0, 0, full.pad[2] - explicit[2], full.pad[3] - explicit[3]];
        let pool = Pool2dAttrs { kernel: full.kernel, stride: full.stride, pad: extra };
        spatial(SpatialOp::AvgPool2d { pool }, &[&xp]).remove(0)
    } else {
        spatial(SpatialOp::AvgPool2d { pool: pool_attrs(&full) }, &[&x2]).remove(0)
    };
    Ok(vec![from_2d(y, sr)])
}

/// `LpPool`: `(Σ |x|^p)^(1/p)` over each window (pads count as zeros).
pub(crate) fn lp_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let p = n.attr_i("p", 2)? as f64;
    if pool_nd::needed(n, x)? {
        return Ok(vec![pool_nd::pool(n, x, PoolKind::Lp { p })?]);
    }
    let sr = spatial_rank(n, x)?;
    let x2 = as_2d(x, sr);
    let win = pool_window(n, sr, hw_of(&x2)?)?;
    let xp = zero_padded(&x2.abs().pow(scalar_like(x, p)), win.pad);
    let pool = Pool2dAttrs { kernel: win.kernel, stride: win.stride, pad: [0; 4] };
    let avg = spatial(SpatialOp::AvgPool2d { pool }, &[&xp]).remove(0);
    let count = (win.kernel[0] * win.kernel[1]) as f64;
    let y = (avg * scalar_like(x, count)).pow(scalar_like(x, 1.0 / p));
    Ok(vec![from_2d(y, sr)])
}

fn spatial_axes(x: &Tensor) -> Vec<i64> {
    (2..x.rank() as i64).collect()
}

/// `GlobalAveragePool`.
pub(crate) fn global_average_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    Ok(vec![x.mean(&spatial_axes(x), true)])
}

/// `GlobalMaxPool`.
pub(crate) fn global_max_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    Ok(vec![x.max(&spatial_axes(x), true)])
}

/// `GlobalLpPool`.
pub(crate) fn global_lp_pool(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let p = n.attr_i("p", 2)? as f64;
    let s = x.abs().pow(scalar_like(x, p)).sum(&spatial_axes(x), true);
    Ok(vec![s.pow(scalar_like(x, 1.0 / p))])
}

/// `Col2Im` (opset 18): the columns `[N, C·∏block, L]` summed back into
/// an image `[N, C, ..image_shape]` (the adjoint of im2col), with strides,
/// dilations and pads. Where each column entry lands is static (the shapes
/// are), so the op is one `scatter_add` into the flattened image plus a
/// spare slot that takes the entries falling in the padding.
pub(crate) fn col2im(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (image, block) = (n.known_i64s(1)?, n.known_i64s(2)?);
    let nd = image.len();
    let xs = x.shape().to_vec();
    let attr = |name: &str, default: i64, len: usize| -> Result<Vec<i64>, String> {
        Ok(n.attr_ints(name)?.unwrap_or_else(|| vec![default; len]))
    };
    let (strides, dilations, pads) = (attr("strides", 1, nd)?, attr("dilations", 1, nd)?, attr("pads", 0, 2 * nd)?);
    let bad = || format!("input {xs:?}, image_shape {image:?} and block_shape {block:?} do not fit");
    if nd == 0
        || block.len() != nd
        || strides.len() != nd
        || dilations.len() != nd
        || pads.len() != 2 * nd
        || xs.len() != 3
    {
        return Err(bad());
    }
    if image.iter().chain(&block).chain(&strides).chain(&dilations).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) {
        return Err(bad());
    }
    let k: i64 = block.iter().product();
    // Blocks along each axis.
    let blocks: Vec<i64> = (0..nd)
        .map(|d| (image[d] + pads[d] + pads[nd + d] - dilations[d] * (block[d] - 1) - 1) / strides[d] + 1)
        .collect();
    let l: i64 = blocks.iter().product();
    let size: i64 = image.iter().product();
    if blocks.iter().any(|&b| b < 1) || xs[1] as i64 % k != 0 || xs[2] as i64 != l || k * l > 1 << 26 {
        return Err(bad());
    }
    let (nb, c) = (xs[0], xs[1] / k as usize);
    // For entry (kernel offset ki, block li): its flat image index, or `size` (the spare slot).
    let unflat = |mut v: i64, dims: &[i64]| -> Vec<i64> {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = v % dims[d];
            v /= dims[d];
        }
        idx
    };
    let mut target = Vec::with_capacity((k * l) as usize);
    for ki in 0..k {
        let kk = unflat(ki, &block);
        for li in 0..l {
            let bl = unflat(li, &blocks);
            let mut flat = 0;
            let mut inside = true;
            for d in 0..nd {
                let p = bl[d] * strides[d] - pads[d] + kk[d] * dilations[d];
                inside &= (0..image[d]).contains(&p);
                flat = flat * image[d] + p;
            }
            target.push(if inside { flat } else { size });
        }
    }
    let index = Tensor::from_vec(target, &[1, 1, (k * l) as usize]).broadcast_to(&[nb, c, (k * l) as usize]);
    let cols = x.reshape(&[nb as i64, c as i64, k * l]);
    let canvas = Tensor::zeros(&[nb, c, size as usize + 1], x.dtype());
    let summed = canvas.scatter_add(2, &index, &cols).slice_axis(2, 0, size);
    let mut shape = vec![nb as i64, c as i64];
    shape.extend(&image);
    Ok(vec![summed.reshape(&shape)])
}
