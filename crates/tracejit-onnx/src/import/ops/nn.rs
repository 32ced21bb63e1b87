//! Dense layers and normalizations: `MatMul`, `Gemm`, `Softmax` /
//! `LogSoftmax` / `Hardmax` (with the opset-13 change from "coerce to 2-D"
//! to "along one axis"), `BatchNormalization` (inference, and training
//! mode's batch statistics), `InstanceNormalization`,
//! `LayerNormalization`, `GroupNormalization`, `RMSNormalization`,
//! `MeanVarianceNormalization`, `LpNormalization`, `LRN`, and `Dropout` in
//! inference.
//!
//! Softmax and LogSoftmax map to `tracejit::nn`'s composites (native
//! kernels when compiled); LayerNormalization over the last axis with the
//! usual parameter shapes maps to `nn::layer_norm`. The others are the
//! spec's formulas over primitives; variances are the biased ones, as the
//! spec's reference computes them.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

fn one(t: Tensor) -> OpResult {
    Ok(vec![t])
}

/// numpy's `matmul`: 1-D operands get a unit axis that is dropped again.
pub(crate) fn matmul_np(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("MatMul operands must have rank 1 or more".into());
    }
    let a2 = if a.rank() == 1 { a.expand_dims(0) } else { a.clone() };
    let b2 = if b.rank() == 1 { b.expand_dims(-1) } else { b.clone() };
    let mut y = a2.matmul(&b2);
    // Drop the unit axes added above: [.., 1, n] / [.., m, 1] / [.., 1, 1].
    let r = y.rank() as i64;
    let mut drop = Vec::new();
    if a.rank() == 1 {
        drop.push(r - 2);
    }
    if b.rank() == 1 {
        drop.push(r - 1);
    }
    if !drop.is_empty() {
        y = y.squeeze(&drop);
    }
    Ok(y)
}

/// `MatMul`.
pub(crate) fn matmul(n: &mut Node) -> OpResult {
    one(matmul_np(n.input(0)?, n.input(1)?)?)
}

/// `Gemm`: `alpha · A' · B' + beta · C`, `C` broadcasting (optional from opset 11).
pub(crate) fn gemm(n: &mut Node) -> OpResult {
    let (a, b) = (n.input(0)?, n.input(1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return Err(format!("Gemm needs 2-D A and B, got shapes {:?} and {:?}", a.shape(), b.shape()));
    }
    let a = if n.attr_i("transA", 0)? != 0 { a.t() } else { a.clone() };
    let b = if n.attr_i("transB", 0)? != 0 { b.t() } else { b.clone() };
    let alpha = n.attr_f("alpha", 1.0)? as f64;
    let beta = n.attr_f("beta", 1.0)? as f64;
    let mut y = a.matmul(&b);
    if alpha != 1.0 {
        y = &y * scalar_like(&y, alpha);
    }
    if let Some(c) = n.opt_input(2) {
        y = if beta == 1.0 { &y + c } else { &y + &(c * scalar_like(c, beta)) };
    }
    one(y)
}

/// Runs `f` along `axis` the way the opset says: from 13 along that one
/// axis (default -1); before, on the input coerced to 2-D at `axis`
/// (default 1) and reshaped back.
fn along_axis(n: &Node, f: impl Fn(&Tensor, usize) -> Tensor) -> OpResult {
    let x = n.input(0)?;
    if n.opset >= 13 {
        let axis = normalize_axis(n.attr_i("axis", -1)?, x.rank())?;
        return one(f(x, axis));
    }
    let r = x.rank() as i64;
    let a = n.attr_i("axis", 1)?;
    let a = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&a) {
        return Err(format!("axis {a} is out of range for rank {r}"));
    }
    let (lead, rest) = x.shape().split_at(a as usize);
    let flat = x.reshape(&[lead.iter().product::<usize>() as i64, rest.iter().product::<usize>() as i64]);
    let dims: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
    one(f(&flat, 1).reshape(&dims))
}

/// `Softmax`.
pub(crate) fn softmax(n: &mut Node) -> OpResult {
    along_axis(n, |x, a| tracejit_nn::softmax(x, a as i64))
}

/// `LogSoftmax`.
pub(crate) fn log_softmax(n: &mut Node) -> OpResult {
    along_axis(n, |x, a| tracejit_nn::log_softmax(x, a as i64))
}

/// `Hardmax`: 1 at the first maximum along the axis, 0 elsewhere.
pub(crate) fn hardmax(n: &mut Node) -> OpResult {
    along_axis(n, |x, a| {
        let i = x.argmax(a as i64, true);
        let mut shape = vec![1usize; x.rank()];
        shape[a] = x.shape()[a];
        let iota = Tensor::arange(0.0, x.shape()[a] as f64, 1.0, DType::I64)
            .reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
        iota.eq(&i).cast(x.dtype())
    })
}

/// `[1, C, 1, 1, ..]`-shaped view of a per-channel parameter for an input of `rank`.
fn per_channel(p: &Tensor, rank: usize) -> Tensor {
    let mut shape = vec![1i64; rank.max(2)];
    shape[1] = p.len() as i64;
    p.reshape(&shape)
}

/// The axes of an NC... tensor other than the channel axis.
fn non_channel_axes(rank: usize) -> Vec<i64> {
    (0..rank as i64).filter(|&a| a != 1).collect()
}

/// `BatchNormalization`: inference with the given statistics (as `x · s +
/// t`, `s = scale / sqrt(var + eps)`, `t = bias - mean · s`), or (opset
/// 14's `training_mode`) normalization by the batch's biased statistics
/// with the running ones updated: `running = running · momentum + batch ·
/// (1 - momentum)`.
pub(crate) fn batch_norm(n: &mut Node) -> OpResult {
    let (x, scale, bias, mean, var) = (n.input(0)?, n.input(1)?, n.input(2)?, n.input(3)?, n.input(4)?);
    let eps = n.attr_f("epsilon", 1e-5)? as f64;
    let training = n.attr_i("training_mode", 0)? != 0;
    if n.opset < 9 && n.attr_i("spatial", 1)? == 0 {
        return Err("spatial=0 (per-activation statistics) is not supported".into());
    }
    let r = x.rank();
    let normalize = |m: &Tensor, v: &Tensor| {
        (x - per_channel(m, r)) / (per_channel(v, r) + scalar_like(v, eps)).sqrt() * per_channel(scale, r)
            + per_channel(bias, r)
    };
    if !training {
        // Inference folds the statistics into one scale and shift per
        // channel (computed on the `[C]` vectors, once per call), so the
        // activation sees a multiply-add instead of a subtract, a square
        // root and a divide per element; the rounding is that of ONNX
        // Runtime's BatchNormalization folded into a Conv.
        let s = scale / (var + scalar_like(var, eps)).sqrt();
        let t = bias - mean * &s;
        return one(x * per_channel(&s, r) + per_channel(&t, r));
    }
    let momentum = n.attr_f("momentum", 0.9)? as f64;
    let axes = non_channel_axes(r);
    let bm = x.mean(&axes, false);
    let bv = (x - per_channel(&bm, r)).square().mean(&axes, false);
    let y = normalize(&bm, &bv);
    let rm = mean * scalar_like(mean, momentum) + &bm * scalar_like(&bm, 1.0 - momentum);
    let rv = var * scalar_like(var, momentum) + &bv * scalar_like(&bv, 1.0 - momentum);
    Ok(vec![y, rm, rv])
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (kept), with the mean and
/// `1 / sqrt(var + eps)`.
fn standardize(x: &Tensor, axes: &[i64], eps: f64) -> (Tensor, Tensor, Tensor) {
    let m = x.mean(axes, true);
    let d = x - &m;
    let inv = (d.square().mean(axes, true) + scalar_like(x, eps)).rsqrt();
    (&d * &inv, m, inv)
}

/// `InstanceNormalization`: per (sample, channel) over the spatial axes.
pub(crate) fn instance_norm(n: &mut Node) -> OpResult {
    let (x, scale, bias) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let eps = n.attr_f("epsilon", 1e-5)? as f64;
    let axes: Vec<i64> = (2..x.rank() as i64).collect();
    let (y, _, _) = standardize(x, &axes, eps);
    one(y * per_channel(scale, x.rank()) + per_channel(bias, x.rank()))
}

/// The compute dtype `stash_type` asks for (f32 by default; f64 is kept).
fn stash(n: &Node, x: &Tensor) -> Result<DType, String> {
    match n.attr_i("stash_type", 1)? {
        1 => Ok(if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 }),
        11 => Ok(DType::F64),
        t => Err(format!("stash_type {t} is not supported")),
    }
}

/// `LayerNormalization` over axes `axis..rank`, with the optional `Mean`
/// and `InvStdDev` outputs (keepdims shape).
pub(crate) fn layer_norm(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let scale = n.input(1)?;
    let bias = n.opt_input(2);
    let eps = n.attr_f("epsilon", 1e-5)? as f64;
    let axis = normalize_axis(n.attr_i("axis", -1)?, x.rank())?;
    let last = x.rank() - 1;
    let simple = axis == last
        && !n.wants(1)
        && !n.wants(2)
        && x.dtype() == DType::F32
        && scale.shape() == [x.shape()[last]]
        && bias.is_none_or(|b| b.shape() == scale.shape());
    if simple {
        let zero = Tensor::zeros(scale.shape(), x.dtype());
        return one(tracejit_nn::layer_norm(x, scale, bias.unwrap_or(&zero), eps));
    }
    let c = stash(n, x)?;
    let axes: Vec<i64> = (axis as i64..x.rank() as i64).collect();
    let (y, m, inv) = standardize(&x.cast(c), &axes, eps);
    let mut y = y.cast(x.dtype()) * scale;
    if let Some(b) = bias {
        y = y + b;
    }
    Ok(vec![y, m, inv])
}

/// `RMSNormalization` (opset 23): `x / sqrt(mean(x²) + eps) · scale`.
pub(crate) fn rms_norm(n: &mut Node) -> OpResult {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    let eps = n.attr_f("epsilon", 1e-5)? as f64;
    let axis = normalize_axis(n.attr_i("axis", -1)?, x.rank())?;
    let c = stash(n, x)?;
    let axes: Vec<i64> = (axis as i64..x.rank() as i64).collect();
    let xc = x.cast(c);
    let inv = (xc.square().mean(&axes, true) + scalar_like(&xc, eps)).rsqrt();
    one((xc * inv).cast(x.dtype()) * scale)
}

/// `GroupNormalization`: channels split into `num_groups`, each
/// standardized over its channels and space; the scale and bias are per
/// group before opset 21 and per channel from it.
pub(crate) fn group_norm(n: &mut Node) -> OpResult {
    let (x, scale, bias) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let eps = n.attr_f("epsilon", 1e-5)? as f64;
    let g = n.attr_i("num_groups", 0)?;
    let dims = x.shape().to_vec();
    if dims.len() < 2 || g <= 0 || dims[1] % g as usize != 0 {
        return Err(format!("num_groups {g} does not divide the channels of {dims:?}"));
    }
    let full: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let grouped = x.cast(stash(n, x)?).reshape(&[dims[0] as i64, g, -1]);
    let (y, _, _) = standardize(&grouped, &[2], eps);
    let y = y.cast(x.dtype());
    if n.opset < 21 && scale.len() as i64 == g {
        let s = scale.reshape(&[1, g, 1]);
        let b = bias.reshape(&[1, g, 1]);
        return one((y * s + b).reshape(&full));
    }
    one(y.reshape(&full) * per_channel(scale, dims.len()) + per_channel(bias, dims.len()))
}

/// `MeanVarianceNormalization` over `axes` (default `[0, 2, 3]`):
/// `(x - mean) / (sqrt(var) + 1e-9)`, as the spec's function body.
pub(crate) fn mvn(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let axes = n.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let axes = axes.iter().map(|&a| normalize_axis(a, x.rank()).map(|a| a as i64)).collect::<Result<Vec<_>, _>>()?;
    let m = x.mean(&axes, true);
    let d = x - &m;
    let sd = d.square().mean(&axes, true).sqrt();
    one(d / (sd + scalar_like(x, 1e-9)))
}

/// `LpNormalization` along `axis` (p = 1 or 2). A slice whose norm is 0
/// (all zeros) gives zeros, as ONNX's reference does, not `0 / 0`: it is
/// divided by 1 instead, which also keeps NaN out of the gradient of the
/// branch not taken.
pub(crate) fn lp_norm(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let axis = normalize_axis(n.attr_i("axis", -1)?, x.rank())? as i64;
    let norm = match n.attr_i("p", 2)? {
        1 => x.abs().sum(&[axis], true),
        2 => x.square().sum(&[axis], true).sqrt(),
        p => return Err(format!("p = {p} is not 1 or 2")),
    };
    let zero = norm.eq(scalar_like(x, 0.0));
    let safe = Tensor::select(&zero, &scalar_like(x, 1.0), &norm);
    one(x / safe)
}

/// `LRN` across channels: `x / (bias + alpha / size · Σ x²)^beta` over a
/// window of `size` channels (`floor((size-1)/2)` before, the rest after).
pub(crate) fn lrn(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let size = n.attr_i("size", 0)?;
    if size <= 0 || x.rank() < 3 {
        return Err(format!("size {size} / rank {} not supported", x.rank()));
    }
    let alpha = n.attr_f("alpha", 1e-4)? as f64;
    let beta = n.attr_f("beta", 0.75)? as f64;
    let bias = n.attr_f("bias", 1.0)? as f64;
    let size = size as usize;
    let before = (size - 1) / 2;
    let after = size - 1 - before;
    let c = x.shape()[1];
    let mut pads = vec![(0, 0); x.rank()];
    pads[1] = (before, after);
    let sq = x.square().pad(&pads, 0.0);
    let mut sum = sq.slice_axis(1, 0, c as i64);
    for k in 1..size {
        sum = sum + sq.slice_axis(1, k as i64, (k + c) as i64);
    }
    let denom = (sum * scalar_like(x, alpha / size as f64) + scalar_like(x, bias)).pow(scalar_like(x, beta));
    one(x / denom)
}

/// `Dropout` in inference: the identity, and an all-true mask. Training
/// mode with a nonzero ratio draws random numbers no reference can
/// reproduce: refused.
pub(crate) fn dropout(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (ratio, training) = if n.opset >= 12 {
        let ratio = match n.opt_input(1) {
            Some(_) => n.known_scalar(1)?,
            None => 0.5,
        };
        let training = match n.opt_input(2) {
            Some(t) => {
                if t.is_symbolic() {
                    return Err("training_mode must be known at trace time".into());
                }
                t.cast(DType::I64).to_vec::<i64>().map_err(|e| e.to_string())?.first().copied().unwrap_or(0) != 0
            }
            None => false,
        };
        (ratio, training)
    } else {
        (n.attr_f("ratio", 0.5)? as f64, n.opset < 7 && n.attr_i("is_test", 0)? == 0)
    };
    if training && ratio != 0.0 {
        return Err("Dropout in training mode (random masks) is not supported; export the model for inference".into());
    }
    Ok(vec![x.clone(), Tensor::ones(x.shape(), DType::Bool)])
}
