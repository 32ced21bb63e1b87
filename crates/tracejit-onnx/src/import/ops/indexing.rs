//! Indexing ops: `Gather`, `GatherElements`, `GatherND`,
//! `ScatterElements` / `Scatter`, `ScatterND`, `OneHot`, `TopK`, `CumSum`, `CumProd`,
//! `ReverseSequence`,
//! `Pad`, and the value-dependent `NonZero` / `Compress` (whose inputs are
//! static: their output shape depends on the values).
//!
//! ONNX indices may be negative (counted from the end of their axis); they
//! are normalized with a select before the `Tensor` op, which takes
//! non-negative ones. N-dimensional indices become linear indices into a
//! flattened view, so `GatherND` is one `gather` and `ScatterND` one
//! `scatter_add`. Scatters without a reduction are exact when indices do
//! not repeat (the spec leaves repeated ones undefined): a scatter of ones
//! marks the written positions, and a select keeps the data elsewhere.

use tracejit_tensor::{DType, SliceSpec};
use tracejit_trace::Tensor;

use crate::import::node::{known_i64s, normalize_axis, Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

fn one(t: Tensor) -> OpResult {
    Ok(vec![t])
}

/// Indices as i64 with negatives wrapped by `dim` (a tensor broadcasting
/// against them, or a size).
fn wrap(indices: &Tensor, dim: &Tensor) -> Tensor {
    let i = indices.cast(DType::I64);
    let zero = Tensor::scalar(0i64);
    Tensor::select(&i.lt(&zero), &(&i + dim), &i)
}

fn size_i64(d: usize) -> Tensor {
    Tensor::scalar(d as i64)
}

/// `Gather`.
pub(crate) fn gather(n: &mut Node) -> OpResult {
    let (x, i) = (n.input(0)?, n.input(1)?);
    let axis = normalize_axis(n.attr_i("axis", 0)?, x.rank())?;
    one(x.gather(&wrap(i, &size_i64(x.shape()[axis])), axis as i64))
}

/// `GatherElements`.
pub(crate) fn gather_elements(n: &mut Node) -> OpResult {
    let (x, i) = (n.input(0)?, n.input(1)?);
    let axis = normalize_axis(n.attr_i("axis", 0)?, x.rank())?;
    one(x.gather_elements(axis as i64, &wrap(i, &size_i64(x.shape()[axis]))))
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The linear index (i64, shape `indices.shape[..-1]`) of each index tuple
/// in the last axis of `indices` into `dims` (negatives wrapped).
fn linear_index(indices: &Tensor, dims: &[usize]) -> Result<Tensor, String> {
    let k = *indices.shape().last().ok_or("indices must have rank 1 or more")?;
    if k > dims.len() || k != dims.len() && dims.is_empty() {
        return Err(format!("index tuples of {k} do not fit data dims {dims:?}"));
    }
    let st = strides(dims);
    let r = indices.rank() as i64;
    let mut lin: Option<Tensor> = None;
    for (j, &stride) in st.iter().enumerate().take(k) {
        let ij = wrap(&indices.slice_axis(r - 1, j as i64, j as i64 + 1).squeeze(&[r - 1]), &size_i64(dims[j]));
        let term = ij * Tensor::scalar(stride as i64);
        lin = Some(match lin {
            None => term,
            Some(l) => l + term,
        });
    }
    Ok(lin.unwrap_or_else(|| Tensor::zeros(&indices.shape()[..indices.rank() - 1], DType::I64)))
}

/// `GatherND` with `batch_dims`.
pub(crate) fn gather_nd(n: &mut Node) -> OpResult {
    let (x, i) = (n.input(0)?, n.input(1)?);
    let b = n.attr_i("batch_dims", 0)?.max(0) as usize;
    let k = *i.shape().last().ok_or("indices must have rank 1 or more")?;
    let dims = x.shape();
    if b + k > dims.len() || i.rank() <= b {
        return Err(format!("batch_dims {b} and index tuples of {k} do not fit data {dims:?}"));
    }
    let batch: usize = dims[..b].iter().product();
    let block: usize = dims[b..b + k].iter().product();
    let rest = &dims[b + k..];
    let mut lin = linear_index(i, &dims[b..b + k])?;
    if b > 0 {
        // Each batch's rows follow the previous batch's.
        let mut bshape: Vec<i64> = i.shape()[..b].iter().map(|&d| d as i64).collect();
        bshape.extend(std::iter::repeat_n(1, i.rank() - 1 - b));
        let base = Tensor::arange(0.0, batch as f64, 1.0, DType::I64).reshape(&bshape) * Tensor::scalar(block as i64);
        lin = lin + base;
    }
    let mut flat: Vec<i64> = vec![(batch * block) as i64];
    flat.extend(rest.iter().map(|&d| d as i64));
    one(x.reshape(&flat).gather(&lin, 0))
}

/// Writes `updates` at `indices` along `axis` of `data` by `reduction`
/// (`none` or `add`).
fn scatter_along(
    data: &Tensor,
    axis: usize,
    indices: &Tensor,
    updates: &Tensor,
    reduction: &str,
) -> Result<Tensor, String> {
    if !data.dtype().is_numeric() {
        return Err(format!("scatter into {} data is not supported", data.dtype()));
    }
    match reduction {
        "add" => Ok(data.scatter_add(axis as i64, indices, updates)),
        "none" => {
            let zeros = Tensor::zeros(data.shape(), data.dtype());
            let ones = Tensor::ones(updates.shape(), data.dtype());
            let written = zeros.scatter_add(axis as i64, indices, &ones).gt(scalar_like(data, 0.0));
            Ok(Tensor::select(&written, &zeros.scatter_add(axis as i64, indices, updates), data))
        }
        r => Err(format!("reduction '{r}' needs a scatter primitive tracejit lacks (it has add)")),
    }
}

/// `ScatterElements` (and the deprecated `Scatter`).
pub(crate) fn scatter_elements(n: &mut Node) -> OpResult {
    let (x, i, u) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let axis = normalize_axis(n.attr_i("axis", 0)?, x.rank())?;
    let i = wrap(i, &size_i64(x.shape()[axis]));
    one(scatter_along(x, axis, &i, u, &n.attr_s("reduction", "none")?)?)
}

/// `ScatterND`: the data viewed as `[prod(dims[..k]), rest..]` rows, the
/// index tuples as row numbers.
pub(crate) fn scatter_nd(n: &mut Node) -> OpResult {
    let (x, i, u) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let k = *i.shape().last().ok_or("indices must have rank 1 or more")?;
    let dims = x.shape().to_vec();
    if k > dims.len() {
        return Err(format!("index tuples of {k} do not fit data {dims:?}"));
    }
    let rows: usize = dims[..k].iter().product();
    let rest: Vec<i64> = dims[k..].iter().map(|&d| d as i64).collect();
    let lin = linear_index(i, &dims[..k])?;
    let count = lin.len() as i64;
    let mut ushape = vec![count];
    ushape.extend(&rest);
    let mut ishape = vec![count];
    ishape.extend(std::iter::repeat_n(1, rest.len()));
    let mut xshape = vec![rows as i64];
    xshape.extend(&rest);
    let y = scatter_along(
        &x.reshape(&xshape),
        0,
        &lin.reshape(&ishape).broadcast_to(&ushape.iter().map(|&d| d as usize).collect::<Vec<_>>()),
        &u.reshape(&ushape),
        &n.attr_s("reduction", "none")?,
    )?;
    one(y.reshape(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
}

/// `OneHot(indices, depth, [off, on])` along `axis` (negative indices
/// count from `depth`; out-of-range ones give an all-`off` row).
pub(crate) fn one_hot(n: &mut Node) -> OpResult {
    let i = n.input(0)?;
    let depth = n.known_f64s(1)?.first().copied().ok_or("depth is empty")? as i64;
    let values = n.input(2)?;
    if values.len() != 2 {
        return Err(format!("values must hold [off, on], got {} elements", values.len()));
    }
    let out_rank = i.rank() + 1;
    let axis = normalize_axis(n.attr_i("axis", -1)?, out_rank)?;
    let idx = wrap(&i.cast(DType::I64), &Tensor::scalar(depth)).expand_dims(axis as i64);
    let mut shape = vec![1i64; out_rank];
    shape[axis] = depth;
    let iota = Tensor::arange(0.0, depth as f64, 1.0, DType::I64).reshape(&shape);
    let off = values.slice_axis(0, 0, 1).reshape(&[]);
    let on = values.slice_axis(0, 1, 2).reshape(&[]);
    one(Tensor::select(&iota.eq(&idx), &on, &off))
}

/// Moves `axis` last (returns the permutation to apply and its inverse).
fn axis_last(rank: usize, axis: usize) -> (Vec<i64>, Vec<i64>) {
    let mut perm: Vec<i64> = (0..rank as i64).filter(|&a| a != axis as i64).collect();
    perm.push(axis as i64);
    let mut inv = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as i64;
    }
    (perm, inv)
}

/// `TopK` along `axis`, largest or smallest, sorted (ties: lower index first).
pub(crate) fn top_k(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let k = if n.opset < 10 { n.attr_i("k", 0)? } else { n.known_i64s(1)?.first().copied().ok_or("K is empty")? };
    let axis = normalize_axis(n.attr_i("axis", -1)?, x.rank())?;
    let k = usize::try_from(k).map_err(|_| format!("negative K {k}"))?;
    if k > x.shape()[axis] {
        return Err(format!("K {k} exceeds the axis' {}", x.shape()[axis]));
    }
    let largest = n.attr_i("largest", 1)? != 0;
    let last = axis == x.rank() - 1;
    let (perm, inv) = axis_last(x.rank(), axis);
    let xt = if last { x.clone() } else { x.transpose(&perm) };
    let key = if largest { xt.clone() } else { xt.neg() };
    let (_, idx) = key.top_k(k);
    let values = xt.gather_elements(-1, &idx);
    if last {
        return Ok(vec![values, idx]);
    }
    Ok(vec![values.transpose(&inv), idx.transpose(&inv)])
}

/// `x` reversed along `axis`.
pub(crate) fn flip(x: &Tensor, axis: usize) -> Tensor {
    let mut specs = vec![SliceSpec::FULL; x.rank()];
    specs[axis] = SliceSpec { start: None, stop: None, step: -1 };
    x.slice(&specs)
}

/// `CumSum` with `exclusive` (shifted by one, a zero first: exact, unlike
/// subtracting `x`) and `reverse`.
pub(crate) fn cumsum(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let axis = normalize_axis(n.known_i64s(1)?.first().copied().ok_or("axis is empty")?, x.rank())?;
    let reverse = n.attr_i("reverse", 0)? != 0;
    let exclusive = n.attr_i("exclusive", 0)? != 0;
    let mut t = if reverse { flip(x, axis) } else { x.clone() };
    if exclusive {
        let len = t.shape()[axis] as i64;
        let mut pads = vec![(0, 0); t.rank()];
        pads[axis] = (1, 0);
        t = t.pad(&pads, 0.0).slice_axis(axis as i64, 0, len);
    }
    let y = t.cumsum(axis as i64);
    one(if reverse { flip(&y, axis) } else { y })
}

/// `CumProd` (opset 26) with `exclusive` (shifted by one, a one first) and
/// `reverse`.
///
/// tracejit has no product scan, so this is the Hillis–Steele scan:
/// ⌈log₂ n⌉ steps, each multiplying by the running products shifted by
/// 1, 2, 4, ... along the axis. Integer products wrap and are exact in any
/// order; a float output is the same n factors multiplied as a tree, so it
/// is within (n − 1) roundings of the sequential product, like any other
/// order (only where an intermediate product overflows or underflows can
/// the order decide between a finite result and ±Inf or 0).
pub(crate) fn cumprod(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if x.dtype() == DType::Bool {
        return Err("CumProd takes numbers, not bool".into());
    }
    let axis = normalize_axis(n.known_i64s(1)?.first().copied().ok_or("axis is empty")?, x.rank())?;
    let reverse = n.attr_i("reverse", 0)? != 0;
    let exclusive = n.attr_i("exclusive", 0)? != 0;
    let len = x.shape()[axis];
    let shift = |t: &Tensor, by: usize| {
        let mut pads = vec![(0, 0); t.rank()];
        pads[axis] = (by.min(len), 0);
        t.slice_axis(axis as i64, 0, len.saturating_sub(by) as i64).pad(&pads, 1.0)
    };
    let mut t = if reverse { flip(x, axis) } else { x.clone() };
    if exclusive {
        t = shift(&t, 1);
    }
    let mut step = 1;
    while step < len {
        t = &t * &shift(&t, step);
        step *= 2;
    }
    one(if reverse { flip(&t, axis) } else { t })
}

/// `NonZero` (input known at trace time): `[rank, count]` i64 coordinates.
pub(crate) fn non_zero(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if x.is_symbolic() {
        return Err("NonZero's input must be known at trace time (its output shape depends on it)".into());
    }
    let v = x.cast(DType::F64).to_vec::<f64>().map_err(|e| e.to_string())?;
    let dims = x.shape();
    let st = strides(dims);
    let hits: Vec<usize> = v.iter().enumerate().filter(|(_, &e)| e != 0.0).map(|(i, _)| i).collect();
    let mut out = Vec::with_capacity(hits.len() * dims.len());
    for (a, &s) in st.iter().enumerate() {
        out.extend(hits.iter().map(|&h| ((h / s) % dims[a]) as i64));
    }
    one(Tensor::from_vec(out, &[dims.len(), hits.len()]))
}

/// `Compress` (condition known at trace time): the slices where it holds.
pub(crate) fn compress(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let cond = n.input(1)?;
    if cond.is_symbolic() {
        return Err("Compress's condition must be known at trace time".into());
    }
    let c = cond.cast(DType::I64).to_vec::<i64>().map_err(|e| e.to_string())?;
    let (x, axis) = match n.has_attr("axis") {
        true => (x.clone(), normalize_axis(n.attr_i("axis", 0)?, x.rank())?),
        false => (x.reshape(&[-1]), 0),
    };
    let keep: Vec<i64> = c.iter().enumerate().filter(|(_, &v)| v != 0).map(|(i, _)| i as i64).collect();
    if keep.last().is_some_and(|&i| i as usize >= x.shape()[axis]) {
        return Err("condition selects past the end of the axis".into());
    }
    let len = keep.len();
    one(x.gather(&Tensor::from_vec(keep, &[len]), axis as i64))
}

/// `Pad`: modes constant, reflect, edge and wrap; negative pads crop.
pub(crate) fn pad(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let r = x.rank();
    let (pads, value, axes) = if n.opset < 11 {
        let p = n.attr_ints("pads")?.or(n.attr_ints("paddings")?).ok_or("Pad needs pads")?;
        (p, n.attr_f("value", 0.0)? as f64, None)
    } else {
        let value = match n.opt_input(2) {
            Some(_) => n.known_scalar(2)?,
            None => 0.0,
        };
        let axes = n.opt_input(3).map(known_i64s).transpose().map_err(|e| format!("axes {e}"))?;
        (n.known_i64s(1)?, value, axes)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| normalize_axis(a, r)).collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("pads {pads:?} do not fit {} axes", axes.len()));
    }
    let mut begin = vec![0i64; r];
    let mut end = vec![0i64; r];
    for (j, &a) in axes.iter().enumerate() {
        begin[a] = pads[j];
        end[a] = pads[j + axes.len()];
    }
    // Crop first (negative pads), then pad.
    let mut specs = vec![SliceSpec::FULL; r];
    for a in 0..r {
        let d = x.shape()[a] as i64;
        specs[a] = SliceSpec::range((-begin[a]).max(0), d - (-end[a]).max(0));
    }
    let xc = x.slice(&specs);
    let grow: Vec<(usize, usize)> = (0..r).map(|a| (begin[a].max(0) as usize, end[a].max(0) as usize)).collect();
    let mode = n.attr_s("mode", "constant")?;
    if mode == "constant" {
        return one(xc.pad(&grow, value));
    }
    let mut y = xc;
    for (a, &(b, e)) in grow.iter().enumerate() {
        if b == 0 && e == 0 {
            continue;
        }
        let d = y.shape()[a] as i64;
        if d == 0 {
            return Err(format!("{mode} padding of an empty axis"));
        }
        let idx: Vec<i64> = (-(b as i64)..d + e as i64)
            .map(|i| match mode.as_str() {
                "edge" => Ok(i.clamp(0, d - 1)),
                "wrap" => Ok(i.rem_euclid(d)),
                "reflect" => {
                    if d == 1 {
                        return Ok(0);
                    }
                    let period = 2 * (d - 1);
                    let m = i.rem_euclid(period);
                    Ok(if m >= d { period - m } else { m })
                }
                m => Err(format!("mode '{m}' is not constant, reflect, edge or wrap")),
            })
            .collect::<Result<_, String>>()?;
        let len = idx.len();
        y = y.gather(&Tensor::from_vec(idx, &[len]), a as i64);
    }
    one(y)
}

/// `ReverseSequence`: along `time_axis`, each batch entry's first
/// `sequence_lens[b]` elements reversed, the rest kept, as one
/// `gather_elements` whose index is `len − 1 − t` before `len` and `t`
/// after (the lengths may be runtime values; they are clamped to the axis).
pub(crate) fn reverse_sequence(n: &mut Node) -> OpResult {
    let (x, lens) = (n.input(0)?, n.input(1)?);
    let rank = x.rank();
    if rank < 2 {
        return Err(format!("input {:?} needs rank 2 or more", x.shape()));
    }
    let batch_axis = normalize_axis(n.attr_i("batch_axis", 1)?, rank)?;
    let time_axis = normalize_axis(n.attr_i("time_axis", 0)?, rank)?;
    if batch_axis > 1 || time_axis > 1 || batch_axis == time_axis {
        return Err(format!("batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 in some order"));
    }
    let (b, t) = (x.shape()[batch_axis], x.shape()[time_axis]);
    if !lens.dtype().is_int() || lens.shape() != [b] {
        return Err(format!("sequence_lens {} {:?} must be integers of shape [{b}]", lens.dtype(), lens.shape()));
    }
    let along =
        |axis: usize, len: usize| -> Vec<i64> { (0..rank).map(|a| if a == axis { len as i64 } else { 1 }).collect() };
    let len = lens.cast(DType::I64).clamp(0.0, t as f64).reshape(&along(batch_axis, b));
    let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64).reshape(&along(time_axis, t));
    let reversed = &(&len - 1i64) - &pos;
    let index = Tensor::select(&pos.lt(&len), &reversed, &pos);
    one(x.gather_elements(time_axis as i64, &index.broadcast_to(x.shape())))
}
