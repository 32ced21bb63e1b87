//! Reductions: `ReduceSum` / `Mean` / `Max` / `Min` / `Prod` and the
//! composed `ReduceL1` / `L2` / `LogSum` / `LogSumExp` / `SumSquare`, and
//! `ArgMax` / `ArgMin` (with `select_last_index`).
//!
//! Where the axes live moved across opsets: an attribute until 12
//! (`ReduceSum`) or 17 (the others), then an optional input read at trace
//! time; an empty or absent list reduces every axis unless
//! `noop_with_empty_axes` says to return the input unchanged.

use tracejit_tensor::{DType, SliceSpec};
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

/// The opset from which each reduction takes its axes as an input.
fn axes_input_since(op: &str) -> i64 {
    if op == "ReduceSum" {
        13
    } else {
        18
    }
}

/// The axes to reduce (sorted, deduplicated), or `None` for "return the
/// input as it is" (`noop_with_empty_axes` with no axes).
fn reduce_axes(n: &Node, rank: usize) -> Result<Option<Vec<i64>>, String> {
    let axes = if n.opset >= axes_input_since(n.op_type) {
        match n.opt_input(1) {
            Some(_) => Some(n.known_i64s(1)?),
            None => None,
        }
    } else {
        n.attr_ints("axes")?
    };
    let axes = axes.unwrap_or_default();
    if axes.is_empty() {
        if n.attr_i("noop_with_empty_axes", 0)? != 0 {
            return Ok(None);
        }
        return Ok(Some((0..rank as i64).collect()));
    }
    let mut norm = axes.iter().map(|&a| normalize_axis(a, rank).map(|a| a as i64)).collect::<Result<Vec<_>, _>>()?;
    norm.sort_unstable();
    norm.dedup();
    Ok(Some(norm))
}

fn keepdims(n: &Node) -> Result<bool, String> {
    Ok(n.attr_i("keepdims", 1)? != 0)
}

/// Applies `f` over the node's axes, or returns `identity(x)` for a no-op.
fn reduce(n: &Node, f: impl Fn(&Tensor, &[i64], bool) -> Tensor, noop: impl Fn(&Tensor) -> Tensor) -> OpResult {
    let x = n.input(0)?;
    let keep = keepdims(n)?;
    Ok(vec![match reduce_axes(n, x.rank())? {
        None => noop(x),
        Some(axes) => f(x, &axes, keep),
    }])
}

/// `ReduceSum`.
pub(crate) fn sum(n: &mut Node) -> OpResult {
    reduce(n, |x, a, k| x.sum(a, k), Tensor::clone)
}

/// `ReduceMean` (integers: the sum divided and truncated, as numpy's
/// mean cast back).
pub(crate) fn mean(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if !x.dtype().is_float() {
        let d = x.dtype();
        return reduce(n, |x, a, k| x.cast(DType::F64).mean(a, k).cast(d), Tensor::clone);
    }
    reduce(n, |x, a, k| x.mean(a, k), Tensor::clone)
}

/// A reduction over an empty axis, which max and min (having no identity
/// in tracejit) refuse: ONNX gives `-inf` / `+inf` (the integer's extreme
/// for integers), in the reduced shape.
fn empty_extreme(n: &Node, x: &Tensor, is_max: bool) -> Option<OpResult> {
    let axes = reduce_axes(n, x.rank()).ok()??;
    if !axes.iter().any(|&a| x.shape()[a as usize] == 0) {
        return None;
    }
    let keep = keepdims(n).ok()?;
    let shape: Vec<usize> = (0..x.rank())
        .filter_map(|i| match (axes.contains(&(i as i64)), keep) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(x.shape()[i]),
        })
        .collect();
    let v = match (x.dtype(), is_max) {
        (DType::I32, true) => i32::MIN as f64,
        (DType::I32, false) => i32::MAX as f64,
        (DType::I64, _) => return Some(Err("max/min over an empty axis of an i64 tensor".into())),
        (_, true) => f64::NEG_INFINITY,
        (_, false) => f64::INFINITY,
    };
    Some(Ok(vec![Tensor::full(&shape, v, x.dtype())]))
}

/// `ReduceMax` (bool: as `any`).
pub(crate) fn max(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if let Some(r) = empty_extreme(n, x, true) {
        return r;
    }
    if x.dtype() == DType::Bool {
        return reduce(n, |x, a, k| x.cast(DType::I32).max(a, k).cast(DType::Bool), Tensor::clone);
    }
    reduce(n, |x, a, k| x.max(a, k), Tensor::clone)
}

/// `ReduceMin` (bool: as `all`).
pub(crate) fn min(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if let Some(r) = empty_extreme(n, x, false) {
        return r;
    }
    if x.dtype() == DType::Bool {
        return reduce(n, |x, a, k| x.cast(DType::I32).min(a, k).cast(DType::Bool), Tensor::clone);
    }
    reduce(n, |x, a, k| x.min(a, k), Tensor::clone)
}

/// `ReduceProd`.
pub(crate) fn prod(n: &mut Node) -> OpResult {
    reduce(n, |x, a, k| x.prod(a, k), Tensor::clone)
}

/// `ReduceL1`: the sum of magnitudes.
pub(crate) fn l1(n: &mut Node) -> OpResult {
    reduce(n, |x, a, k| x.abs().sum(a, k), Tensor::abs)
}

/// `ReduceL2`: the Euclidean norm (integers: computed in f64, truncated).
pub(crate) fn l2(n: &mut Node) -> OpResult {
    let d = n.input(0)?.dtype();
    if !d.is_float() {
        return reduce(n, |x, a, k| x.cast(DType::F64).square().sum(a, k).sqrt().cast(d), Tensor::abs);
    }
    reduce(n, |x, a, k| x.square().sum(a, k).sqrt(), Tensor::abs)
}

/// `ReduceSumSquare`.
pub(crate) fn sum_square(n: &mut Node) -> OpResult {
    reduce(n, |x, a, k| x.square().sum(a, k), Tensor::square)
}

/// `ReduceLogSum`: `log(sum(x))`.
pub(crate) fn log_sum(n: &mut Node) -> OpResult {
    reduce(n, |x, a, k| x.sum(a, k).log(), Tensor::log)
}

/// `ReduceLogSumExp`, stably: `m + log(sum(exp(x - m)))` with `m` the
/// maximum (taken as 0 where it is infinite, so all `-inf` gives `-inf`).
pub(crate) fn log_sum_exp(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if !x.dtype().is_float() {
        let d = x.dtype();
        return reduce(n, |x, a, k| lse(&x.cast(DType::F64), a, k).cast(d), Tensor::clone);
    }
    reduce(n, lse, Tensor::clone)
}

fn lse(x: &Tensor, axes: &[i64], keep: bool) -> Tensor {
    if x.shape().iter().enumerate().any(|(i, &d)| d == 0 && axes.contains(&(i as i64))) {
        // An empty reduction: log(0) = -inf, as the reference computes.
        return x.sum(axes, keep).log();
    }
    let m = x.max(axes, true);
    let m = Tensor::select(&m.is_finite(), &m, &scalar_like(&m, 0.0));
    let s = (x - &m).exp().sum(axes, keep).log();
    let m = if keep { m } else { m.squeeze(axes) };
    s + m
}

/// `ArgMax`.
pub(crate) fn arg_max(n: &mut Node) -> OpResult {
    arg(n, true)
}

/// `ArgMin`.
pub(crate) fn arg_min(n: &mut Node) -> OpResult {
    arg(n, false)
}

/// ArgMax/ArgMin along `axis`; `select_last_index` reverses the axis,
/// takes the first extreme and maps the index back (`len - 1 - i`).
fn arg(n: &Node, is_max: bool) -> OpResult {
    let x = n.input(0)?;
    let axis = n.axis(n.attr_i("axis", 0)?, x.rank())?;
    let keep = keepdims(n)?;
    let last = n.attr_i("select_last_index", 0)? != 0;
    let pick = |t: &Tensor| if is_max { t.argmax(axis as i64, keep) } else { t.argmin(axis as i64, keep) };
    if !last {
        return Ok(vec![pick(x)]);
    }
    let len = x.shape()[axis] as i64;
    let mut specs = vec![SliceSpec::FULL; x.rank()];
    specs[axis] = SliceSpec { start: None, stop: None, step: -1 };
    let i = pick(&x.slice(&specs));
    Ok(vec![Tensor::scalar(len - 1) - i])
}
