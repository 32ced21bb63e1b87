//! Shape and movement ops: `Shape`, `Size`, `Reshape`, `Flatten`,
//! `Squeeze` / `Unsqueeze`, `Transpose`, `Concat`, `Split`, `Slice`,
//! `Expand`, `Tile`, `DepthToSpace` / `SpaceToDepth`, `CenterCropPad`, and
//! the ops that make
//! values from shapes: `Constant`, `ConstantOfShape`, `Range`, `EyeLike`,
//! `Trilu`.
//!
//! Shapes are concrete in a trace (one per input signature), so `Shape`
//! and `Size` give eager tensors, and every operand that fixes an output
//! shape (Reshape's target, Slice bounds, ...) is read as a known value.
//! Each op computes the output shape by the ONNX spec's rule and calls the
//! `Tensor` op with explicit sizes, so a spec quirk (Reshape's `0`, Slice's
//! clamping) is handled here, once.

use tracejit_tensor::SliceSpec;
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};

fn one(t: Tensor) -> OpResult {
    Ok(vec![t])
}

fn to_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// A 1-D i64 tensor.
fn i64s(v: Vec<i64>) -> Tensor {
    let n = v.len();
    Tensor::from_vec(v, &[n])
}

/// Sizes from known i64 values, refusing negatives.
fn sizes(v: &[i64], what: &str) -> Result<Vec<usize>, String> {
    v.iter().map(|&d| usize::try_from(d).map_err(|_| format!("{what} has a negative size {d} ({v:?})"))).collect()
}

/// `Shape` (with `start` / `end` since opset 15): an eager i64 tensor.
pub(crate) fn shape(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let r = x.rank() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clampi(n.attr_i("start", 0)?);
    let end = clampi(n.attr_i("end", r)?);
    let dims = to_i64(x.shape());
    one(i64s(dims[start..end.max(start)].to_vec()))
}

/// `Size`: the element count as an i64 scalar.
pub(crate) fn size(n: &mut Node) -> OpResult {
    one(Tensor::scalar(n.input(0)?.len() as i64))
}

/// The output shape of a Reshape: `0` copies the input's dim (unless
/// `allowzero`), one `-1` takes what remains.
fn reshape_target(input: &[usize], target: &[i64], allowzero: bool) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => {
                out.push(*input.get(i).ok_or_else(|| format!("shape {target:?}: 0 at {i} has no input dim to copy"))?)
            }
            d if d >= 0 => out.push(d as usize),
            _ => return Err(format!("shape {target:?} is invalid (a negative dim other than one -1)")),
        }
    }
    let total: usize = input.iter().product();
    if let Some(i) = infer {
        let rest: usize = out.iter().product();
        if rest == 0 || !total.is_multiple_of(rest) {
            return Err(format!("cannot reshape {input:?} into {target:?}"));
        }
        out[i] = total / rest;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!("cannot reshape {input:?} ({total} elements) into {target:?}"));
    }
    Ok(out)
}

/// `Reshape` (shape as an attribute before opset 5).
pub(crate) fn reshape(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let target = if n.opset < 5 { n.attr_ints("shape")?.unwrap_or_default() } else { n.known_i64s(1)? };
    let allowzero = n.attr_i("allowzero", 0)? != 0;
    let dims = x.dims();
    if dims.iter().any(Option::is_none) {
        return one(x.reshape(&symbolic_target(&dims, &target, allowzero)?));
    }
    let out = reshape_target(x.shape(), &target, allowzero)?;
    one(x.reshape(&to_i64(&out)))
}

/// A Reshape's target for an input with unknown dims (a model traced for
/// any batch size): each 0 copies its input dim, an unknown one becoming
/// a `-1` the trace resolves. When the unknown dims are all copied, the
/// target's own `-1` is the known dims' quotient (`[0, -1]` flattens any
/// batch); more than one dim left to infer is refused.
fn symbolic_target(dims: &[Option<usize>], target: &[i64], allowzero: bool) -> Result<Vec<i64>, String> {
    let mut out: Vec<i64> = target
        .iter()
        .enumerate()
        .map(|(i, &d)| match (d, dims.get(i)) {
            (0, Some(Some(k))) if !allowzero => Ok(*k as i64),
            (0, Some(None)) if !allowzero => Ok(-1),
            (0, None) if !allowzero => Err(format!("shape {target:?}: 0 at {i} has no input dim to copy")),
            (d, _) if d >= -1 => Ok(d),
            _ => Err(format!("shape {target:?} is invalid (a negative dim other than one -1)")),
        })
        .collect::<Result<_, _>>()?;
    let copied_unknown =
        (0..target.len()).filter(|&i| target[i] == 0 && !allowzero && dims.get(i) == Some(&None)).count();
    let unknown = dims.iter().filter(|d| d.is_none()).count();
    if let Some(infer) = target.iter().position(|&d| d == -1) {
        if copied_unknown > 0 && copied_unknown == unknown {
            let known_in: usize = dims.iter().flatten().product();
            let known_out: i64 =
                out.iter().enumerate().filter(|&(i, &d)| i != infer && d >= 0).map(|(_, &d)| d).product();
            if known_out <= 0 || known_in as i64 % known_out != 0 {
                return Err(format!("cannot reshape {dims:?} into {target:?}"));
            }
            out[infer] = known_in as i64 / known_out;
        }
    }
    if out.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(format!(
            "shape {target:?} of an input with unknown dims {dims:?} leaves more than one dim to infer"
        ));
    }
    Ok(out)
}

/// `Flatten`: `[prod(dims[..axis]), prod(dims[axis..])]`.
pub(crate) fn flatten(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let r = x.rank() as i64;
    let a = n.attr_i("axis", 1)?;
    let a = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&a) {
        return Err(format!("axis {} is out of range for rank {r}", n.attr_i("axis", 1)?));
    }
    let (lead, rest) = x.shape().split_at(a as usize);
    one(x.reshape(&[lead.iter().product::<usize>() as i64, rest.iter().product::<usize>() as i64]))
}

/// The axes of Squeeze / Unsqueeze: an attribute before opset 13, then
/// an optional input.
fn squeeze_axes(n: &Node) -> Result<Option<Vec<i64>>, String> {
    if n.opset >= 13 {
        n.opt_input(1).map(|_| n.known_i64s(1)).transpose()
    } else {
        n.attr_ints("axes")
    }
}

/// `Squeeze`: the listed size-1 axes, or every size-1 axis.
pub(crate) fn squeeze(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let dims = x.shape();
    let axes = match squeeze_axes(n)? {
        Some(a) if !a.is_empty() => a.iter().map(|&a| normalize_axis(a, dims.len())).collect::<Result<Vec<_>, _>>()?,
        _ => (0..dims.len()).filter(|&i| dims[i] == 1).collect(),
    };
    if let Some(&a) = axes.iter().find(|&&a| dims[a] != 1) {
        return Err(format!("cannot squeeze axis {a} of size {} (shape {dims:?})", dims[a]));
    }
    let out: Vec<i64> = (0..dims.len()).filter(|i| !axes.contains(i)).map(|i| dims[i] as i64).collect();
    one(x.reshape(&out))
}

/// `Unsqueeze`: size-1 axes at the listed positions of the output.
pub(crate) fn unsqueeze(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let axes = squeeze_axes(n)?.ok_or("Unsqueeze needs axes")?;
    let out_rank = x.rank() + axes.len();
    let mut norm = axes.iter().map(|&a| normalize_axis(a, out_rank)).collect::<Result<Vec<_>, _>>()?;
    norm.sort_unstable();
    if norm.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    let mut src = x.shape().iter();
    let out: Vec<i64> =
        (0..out_rank).map(|i| if norm.contains(&i) { 1 } else { *src.next().expect("counted") as i64 }).collect();
    one(x.reshape(&out))
}

/// `Transpose` (default: reverse the axes).
pub(crate) fn transpose(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let perm = n.attr_ints("perm")?.unwrap_or_else(|| (0..x.rank() as i64).rev().collect());
    if perm.len() != x.rank() {
        return Err(format!("perm {perm:?} does not fit rank {}", x.rank()));
    }
    one(x.transpose(&perm))
}

/// `Concat`.
pub(crate) fn concat(n: &mut Node) -> OpResult {
    let xs: Vec<Tensor> = n.inputs.iter().flatten().cloned().collect();
    let first = xs.first().ok_or("Concat needs at least one input")?;
    let axis = normalize_axis(n.attr_i("axis", 0)?, first.rank())?;
    one(Tensor::concat(&xs, axis as i64))
}

/// `Split`: sizes from the `split` attribute (before 13) or input, else
/// equal parts (`num_outputs` since 18: the last part may be smaller).
pub(crate) fn split(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let axis = normalize_axis(n.attr_i("axis", 0)?, x.rank())?;
    let len = x.shape()[axis];
    let given =
        if n.opset >= 13 { n.opt_input(1).map(|_| n.known_i64s(1)).transpose()? } else { n.attr_ints("split")? };
    let parts = match given {
        Some(s) if !s.is_empty() => sizes(&s, "split")?,
        _ => {
            let k = if n.opset >= 18 && n.has_attr("num_outputs") {
                n.attr_i("num_outputs", 1)? as usize
            } else {
                n.num_outputs
            };
            if k == 0 {
                return Err("Split into 0 parts".into());
            }
            let chunk = len.div_ceil(k);
            if n.opset < 18 && len % k != 0 {
                return Err(format!("axis of {len} does not split into {k} equal parts"));
            }
            (0..k).map(|i| chunk.min(len.saturating_sub(i * chunk))).collect()
        }
    };
    if parts.iter().sum::<usize>() != len {
        return Err(format!("split sizes {parts:?} do not add up to the axis' {len}"));
    }
    let mut start = 0;
    Ok(parts
        .iter()
        .map(|&p| {
            let t = x.slice_axis(axis as i64, start as i64, (start + p) as i64);
            start += p;
            t
        })
        .collect())
}

/// One axis of an ONNX Slice, clamped as the spec says, as a Python slice.
fn slice_spec(start: i64, end: i64, step: i64, dim: usize) -> Result<SliceSpec, String> {
    if step == 0 {
        return Err("Slice step 0".into());
    }
    let d = dim as i64;
    if d == 0 {
        return Ok(SliceSpec { start: Some(0), stop: Some(0), step: 1 });
    }
    let s = if start < 0 { start.saturating_add(d) } else { start };
    let e = if end < 0 { end.saturating_add(d) } else { end };
    Ok(if step > 0 {
        SliceSpec { start: Some(s.clamp(0, d)), stop: Some(e.clamp(0, d)), step }
    } else {
        let e = e.clamp(-1, d - 1);
        SliceSpec { start: Some(s.clamp(0, d - 1)), stop: if e < 0 { None } else { Some(e) }, step }
    })
}

/// `Slice`: bounds as attributes before opset 10, then inputs.
pub(crate) fn slice(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (starts, ends, axes, steps) = if n.opset < 10 {
        let starts = n.attr_ints("starts")?.ok_or("Slice needs starts")?;
        let ends = n.attr_ints("ends")?.ok_or("Slice needs ends")?;
        (starts, ends, n.attr_ints("axes")?, None)
    } else {
        let axes = n.opt_input(3).map(|_| n.known_i64s(3)).transpose()?;
        let steps = n.opt_input(4).map(|_| n.known_i64s(4)).transpose()?;
        (n.known_i64s(1)?, n.known_i64s(2)?, axes, steps)
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice's starts, ends, axes and steps differ in length".into());
    }
    let mut specs = vec![SliceSpec::FULL; x.rank()];
    for i in 0..starts.len() {
        let a = normalize_axis(axes[i], x.rank())?;
        specs[a] = slice_spec(starts[i], ends[i], steps[i], x.shape()[a])?;
    }
    one(x.slice(&specs))
}

/// numpy's broadcast of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let r = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, r - s.len()).chain(s.iter().copied()).collect() };
    let (a2, b2) = (pad(a), pad(b));
    a2.iter()
        .zip(&b2)
        .map(|(&x, &y)| match (x, y) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// `Expand`: broadcast against the given shape (either side may be 1).
pub(crate) fn expand(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let target = sizes(&n.known_i64s(1)?, "shape")?;
    let out = broadcast_shapes(x.shape(), &target)?;
    one(x.broadcast_to(&out))
}

/// `Tile`: each axis repeated, as a broadcast of an interleaved reshape
/// (`[1, d0, 1, d1, ..] -> [r0, d0, r1, d1, ..] -> [r0·d0, r1·d1, ..]`).
pub(crate) fn tile(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let reps = sizes(&n.known_i64s(1)?, "repeats")?;
    if reps.len() != x.rank() {
        return Err(format!("repeats {reps:?} do not fit rank {}", x.rank()));
    }
    let dims = x.shape();
    let inter: Vec<i64> = dims.iter().flat_map(|&d| [1, d as i64]).collect();
    let wide: Vec<usize> = dims.iter().zip(&reps).flat_map(|(&d, &r)| [r, d]).collect();
    let out: Vec<i64> = dims.iter().zip(&reps).map(|(&d, &r)| (d * r) as i64).collect();
    one(x.reshape(&inter).broadcast_to(&wide).reshape(&out))
}

/// `Constant`: from whichever value attribute is set.
pub(crate) fn constant(n: &mut Node) -> OpResult {
    if let Some(t) = n.attr_tensor("value")? {
        return one(t);
    }
    if n.has_attr("value_float") {
        return one(Tensor::scalar(n.attr_f("value_float", 0.0)?));
    }
    if let Some(v) = n.attr_floats("value_floats")? {
        let len = v.len();
        return one(Tensor::from_vec(v, &[len]));
    }
    if n.has_attr("value_int") {
        return one(Tensor::scalar(n.attr_i("value_int", 0)?));
    }
    if let Some(v) = n.attr_ints("value_ints")? {
        return one(i64s(v));
    }
    Err("Constant has no value attribute tracejit reads (value, value_float(s), value_int(s))".into())
}

/// `ConstantOfShape`: the one-element `value` (default f32 0) broadcast.
pub(crate) fn constant_of_shape(n: &mut Node) -> OpResult {
    let shape = sizes(&n.known_i64s(0)?, "shape")?;
    let value = n.attr_tensor("value")?.unwrap_or_else(|| Tensor::scalar(0.0f32));
    if value.len() != 1 {
        return Err(format!("value must hold one element, got {}", value.len()));
    }
    one(value.reshape(&[]).broadcast_to(&shape))
}

/// `Range`: `start + i · delta` for `i < max(ceil((limit - start) / delta), 0)`.
pub(crate) fn range(n: &mut Node) -> OpResult {
    let d = n.input(0)?.dtype();
    if d.is_int() {
        let (s, l, dl) = (n.known_i64s(0)?, n.known_i64s(1)?, n.known_i64s(2)?);
        let (s, l, dl) = (s[0], l[0], dl[0]);
        if dl == 0 {
            return Err("Range delta 0".into());
        }
        let count = ((l - s) as f64 / dl as f64).ceil().max(0.0) as i64;
        let v: Vec<i64> = (0..count).map(|i| s + i * dl).collect();
        return one(i64s(v).cast(d));
    }
    let (s, l, dl) = (n.known_scalar(0)?, n.known_scalar(1)?, n.known_scalar(2)?);
    if dl == 0.0 {
        return Err("Range delta 0".into());
    }
    let count = ((l - s) / dl).ceil().max(0.0);
    if count > 1e9 {
        return Err(format!("Range of {count} elements"));
    }
    let v: Vec<f64> = (0..count as usize).map(|i| s + i as f64 * dl).collect();
    let len = v.len();
    one(Tensor::from_vec(v, &[len]).cast(d))
}

/// `EyeLike`: ones on the diagonal `k` of a 2-D shape.
pub(crate) fn eye_like(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if x.rank() != 2 {
        return Err(format!("EyeLike needs a 2-D input, got rank {}", x.rank()));
    }
    let dtype = n.attr_dtype("dtype", x.dtype())?;
    let k = n.attr_i("k", 0)?;
    let (r, c) = (x.shape()[0], x.shape()[1]);
    let v: Vec<f64> = (0..r * c).map(|i| f64::from(u8::from((i % c) as i64 - (i / c) as i64 == k))).collect();
    one(Tensor::from_vec(v, &[r, c]).cast(dtype))
}

/// `Trilu`: keeps the upper (`j - i >= k`) or lower (`j - i <= k`) triangle
/// of the last two axes, zeroing the rest.
pub(crate) fn trilu(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if x.rank() < 2 {
        return Err(format!("Trilu needs rank 2 or more, got {}", x.rank()));
    }
    let k = match n.opt_input(1) {
        Some(_) => n.known_i64s(1)?[0],
        None => 0,
    };
    let upper = n.attr_i("upper", 1)? != 0;
    let (r, c) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    let keep: Vec<bool> = (0..r * c)
        .map(|i| {
            let d = (i % c) as i64 - (i / c) as i64;
            if upper {
                d >= k
            } else {
                d <= k
            }
        })
        .collect();
    let mask = Tensor::from_vec(keep, &[r, c]);
    one(Tensor::select(&mask, x, &Tensor::zeros(&[], x.dtype())))
}

/// `DepthToSpace` (modes DCR and CRD).
pub(crate) fn depth_to_space(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let [b, c, h, w] = dims4(x)?;
    let s = n.attr_i("blocksize", 0)?;
    let bs = usize::try_from(s).ok().filter(|&s| s > 0 && c % (s * s) == 0).ok_or(format!("bad blocksize {s}"))?;
    let c2 = (c / (bs * bs)) as i64;
    let (b, h, w, bs) = (b as i64, h as i64, w as i64, bs as i64);
    let y = match n.attr_s("mode", "DCR")?.as_str() {
        "DCR" => x.reshape(&[b, bs, bs, c2, h, w]).transpose(&[0, 3, 4, 1, 5, 2]),
        "CRD" => x.reshape(&[b, c2, bs, bs, h, w]).transpose(&[0, 1, 4, 2, 5, 3]),
        m => return Err(format!("mode '{m}' is not DCR or CRD")),
    };
    one(y.reshape(&[b, c2, h * bs, w * bs]))
}

/// `SpaceToDepth`.
pub(crate) fn space_to_depth(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let [b, c, h, w] = dims4(x)?;
    let s = n.attr_i("blocksize", 0)?;
    let bs = usize::try_from(s)
        .ok()
        .filter(|&s| s > 0 && h % s == 0 && w % s == 0)
        .ok_or(format!("bad blocksize {s} for {h}x{w}"))?;
    let (b, c, h, w, bs) = (b as i64, c as i64, h as i64, w as i64, bs as i64);
    let y = x.reshape(&[b, c, h / bs, bs, w / bs, bs]).transpose(&[0, 3, 5, 1, 2, 4]);
    one(y.reshape(&[b, c * bs * bs, h / bs, w / bs]))
}

fn dims4(x: &Tensor) -> Result<[usize; 4], String> {
    x.shape().try_into().map_err(|_| format!("needs a 4-D input, got shape {:?}", x.shape()))
}

/// `CenterCropPad` (opset 18): each listed axis (all by default) cropped
/// or zero-padded to its target size around the centre; an odd
/// difference puts the extra element at the end, as the spec's reference
/// does.
pub(crate) fn center_crop_pad(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let target = n.known_i64s(1)?;
    let rank = x.rank();
    let axes: Vec<usize> = match n.attr_ints("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if axes.len() != target.len() || (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        return Err(format!("shape {target:?} must give one size per distinct axis of {axes:?}"));
    }
    let mut y = x.clone();
    for (&a, &size) in axes.iter().zip(&target) {
        let dim = y.shape()[a];
        let size = usize::try_from(size).map_err(|_| format!("target size {size} is negative"))?;
        if size < dim {
            let start = (dim - size) / 2;
            y = y.slice_axis(a as i64, start as i64, (start + size) as i64);
        } else if size > dim {
            let mut pads = vec![(0, 0); rank];
            let before = (size - dim) / 2;
            pads[a] = (before, size - dim - before);
            y = y.pad(&pads, 0.0);
        }
    }
    one(y)
}

/// `AffineGrid` (opset 20): the sampling grid of `theta` (`[N, 2, 3]` or
/// `[N, 3, 4]`) over a static `size` (`[N, C, H, W]` or `[N, C, D, H, W]`):
/// each output point is `theta · (x, y[, z], 1)` with the normalized
/// coordinates in [-1, 1] (pixel centres, or corners under
/// `align_corners`), computed in f64 as constants and multiplied in one
/// matmul.
pub(crate) fn affine_grid(n: &mut Node) -> OpResult {
    let theta = n.input(0)?;
    let size = n.known_i64s(1)?;
    let nd = size.len().saturating_sub(2);
    let ts = theta.shape();
    if !theta.dtype().is_float() || !(nd == 2 || nd == 3) || ts != [size[0] as usize, nd, nd + 1] {
        return Err(format!(
            "theta {} {ts:?} and size {size:?} must be [N, 2, 3] with [N, C, H, W] or [N, 3, 4] with [N, C, D, H, W]",
            theta.dtype()
        ));
    }
    let dims: Vec<usize> = size[2..]
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("size {size:?} has a negative dim")))
        .collect::<Result<_, _>>()?;
    let align = n.attr_i("align_corners", 0)? != 0;
    let coord = |i: usize, len: usize| -> f64 {
        match (align, len) {
            (true, 1) => -1.0,
            (true, _) => -1.0 + 2.0 * i as f64 / (len - 1) as f64,
            (false, _) => -1.0 + (2 * i + 1) as f64 / len as f64,
        }
    };
    // Rows (x, y[, z], 1) of every point, spatial dims in order, x the last (fastest) one.
    // The grid is built here, so its size is bounded like a tensor's in the file.
    let points = dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d)).filter(|&p| p <= 1 << 28);
    let points = points.ok_or_else(|| format!("size {size:?} asks for more than 2^28 grid points"))?;
    let mut base = Vec::with_capacity(points * (nd + 1));
    for p in 0..points {
        let mut rest = p;
        let mut idx = vec![0; nd];
        for a in (0..nd).rev() {
            idx[a] = rest % dims[a];
            rest /= dims[a];
        }
        base.extend((0..nd).rev().map(|a| coord(idx[a], dims[a])));
        base.push(1.0);
    }
    let base = Tensor::from_vec(base, &[points, nd + 1]).cast(theta.dtype());
    let grid = theta.matmul(&base.t()).transpose(&[0, 2, 1]);
    let mut shape = vec![size[0]];
    shape.extend(dims.iter().map(|&d| d as i64));
    shape.push(nd as i64);
    one(grid.reshape(&shape))
}
