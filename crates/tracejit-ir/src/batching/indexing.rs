//! Batching rules of the indexing ops (gather, scatter, dynamic windows),
//! random draws and the spatial ops: those whose per-example operands
//! cannot simply shift their axes.

use tracejit_tensor::{BinaryOp, DType, RandomDist, SliceSpec, SpatialOp};

use super::helpers::{emit1, example_rank, front_size, insert_units, int_constant, materialize, rank, to_front};
use super::{BatchEmitter, BatchError, Batched, R};
use crate::Op;

type Outs<V> = R<Vec<Batched<V>>>;

/// `gather(params, indices, axis)` per example. Mapped params with shared
/// indices gather along `axis + 1`; shared params with mapped indices give
/// the batch axis where the indices land (`axis`); both mapped fold the
/// batch into the gathered axis and offset each example's indices.
pub(super) fn gather<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    axis: usize,
    size: Option<usize>,
) -> Outs<E::Value> {
    let (x, xb) = args[0].clone();
    let (idx, ib) = args[1].clone();
    match (xb, ib) {
        (Some(b), None) => {
            let x = to_front(e, x, b)?;
            Ok(vec![(emit1(e, Op::Gather { axis: axis + 1 }, &[x, idx])?, Some(0))])
        }
        (None, Some(b)) => {
            let idx = to_front(e, idx, b)?;
            Ok(vec![(emit1(e, Op::Gather { axis }, &[x, idx])?, Some(axis))])
        }
        (Some(_), Some(_)) | (None, None) => {
            let x = materialize(e, x, xb, size)?;
            let idx = materialize(e, idx, ib, size)?;
            Ok(vec![(gather_both(e, x, idx, axis)?, Some(0))])
        }
    }
}

/// Gather with params `[B, ..]` and indices `[B, ..]`, both at the front:
/// the gathered axis moves next to the batch axis and merges with it, each
/// example's indices are offset by `b * len`, and the result's axes go back
/// to the per-example order `[B, params[..axis], indices.., params[axis+1..]]`.
pub(super) fn gather_both<E: BatchEmitter>(e: &mut E, x: E::Value, idx: E::Value, axis: usize) -> R<E::Value> {
    let xt = e.value_type(&x);
    let it = e.value_type(&idx);
    let (batch, len) = match (xt.dims[0], xt.dims[axis + 1]) {
        (Some(b), Some(l)) => (b, l),
        _ => return Err(BatchError::UnknownSize { what: "a gather whose params and indices are both mapped".into() }),
    };
    let r = xt.rank();
    let rest: Vec<Option<usize>> = (1..r).filter(|&a| a != axis + 1).map(|a| xt.dims[a]).collect();
    let perm: Vec<usize> = [0, axis + 1].into_iter().chain((1..r).filter(|&a| a != axis + 1)).collect();
    let moved = emit1(e, Op::Transpose { perm }, &[x])?;
    let mut merged_shape: Vec<i64> = vec![(batch * len) as i64];
    merged_shape.extend(rest.iter().map(|d| d.map_or(-1, |d| d as i64)));
    let merged = emit1(e, Op::Reshape { shape: merged_shape }, &[moved])?;
    // Negative indices count from each example's end, as gather's do.
    let idx_rank = it.rank();
    let len_c = int_constant(e, vec![len as i64], &[], it.dtype)?;
    let zero = int_constant(e, vec![0], &[], it.dtype)?;
    let negative = emit1(e, Op::Binary(BinaryOp::Lt), &[idx.clone(), zero])?;
    let wrapped = emit1(e, Op::Binary(BinaryOp::Add), &[idx.clone(), len_c])?;
    let idx = emit1(e, Op::Select, &[negative, wrapped, idx])?;
    let offsets: Vec<i64> = (0..batch as i64).map(|b| b * len as i64).collect();
    let mut off_shape = vec![batch];
    off_shape.extend(std::iter::repeat_n(1, idx_rank - 1));
    let offsets = int_constant(e, offsets, &off_shape, it.dtype)?;
    let idx = emit1(e, Op::Binary(BinaryOp::Add), &[idx, offsets])?;
    let out = emit1(e, Op::Gather { axis: 0 }, &[merged, idx])?;
    // out: [B, idx(rest of idx_rank - 1).., params other axes..]
    let n_idx = idx_rank - 1;
    let pre: Vec<usize> = (0..axis).map(|a| 1 + n_idx + a).collect();
    let idx_axes: Vec<usize> = (1..=n_idx).collect();
    let post: Vec<usize> = (axis..rest.len()).map(|a| 1 + n_idx + a).collect();
    let perm: Vec<usize> = std::iter::once(0).chain(pre).chain(idx_axes).chain(post).collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(out);
    }
    emit1(e, Op::Transpose { perm }, &[out])
}

/// `scatter_add(x, indices, updates, axis)` per example: every operand
/// gets the batch axis (the indices with unit axes up to the updates'
/// rank, so they still broadcast against them).
pub(super) fn scatter_add<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    axis: usize,
    size: Option<usize>,
) -> Outs<E::Value> {
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
    let idx_rank = example_rank(e, &args[1].0, args[1].1);
    let upd_rank = example_rank(e, &args[2].0, args[2].1);
    let idx = materialize(e, args[1].0.clone(), args[1].1, size)?;
    let idx = insert_units(e, idx, 1, upd_rank - idx_rank)?;
    let upd = materialize(e, args[2].0.clone(), args[2].1, size)?;
    Ok(vec![(emit1(e, Op::ScatterAdd { axis: axis + 1 }, &[x, idx, upd])?, Some(0))])
}

/// A start of 0 for the batch axis ahead of shared starts.
fn lead_zero<E: BatchEmitter>(e: &mut E, starts: E::Value) -> R<E::Value> {
    let dtype = e.value_type(&starts).dtype;
    let zero = int_constant(e, vec![0], &[1], dtype)?;
    emit1(e, Op::Concat { axis: 0 }, &[zero, starts])
}

/// `dynamic_slice(x, starts)` per example. Shared starts: one window over
/// the batch; mapped starts: each axis's window is a gather of
/// `clamp(start) + 0..size` per example.
pub(super) fn dynamic_slice<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    sizes: &[usize],
    size: Option<usize>,
) -> Outs<E::Value> {
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
    let batch = front_size(e, &x, size).ok_or_else(|| BatchError::UnknownSize { what: "a dynamic_slice".into() })?;
    let (starts, sb) = args[1].clone();
    if sb.is_none() {
        let starts = lead_zero(e, starts)?;
        let sizes = std::iter::once(batch).chain(sizes.iter().copied()).collect();
        return Ok(vec![(emit1(e, Op::DynamicSlice { sizes }, &[x, starts])?, Some(0))]);
    }
    let starts = materialize(e, starts, sb, Some(batch))?;
    let dtype = e.value_type(&starts).dtype;
    let dims = e.value_type(&x).dims.clone();
    let mut cur = x;
    for (j, &window) in sizes.iter().enumerate() {
        let dim =
            dims[j + 1].ok_or_else(|| BatchError::UnknownSize { what: "a dynamic_slice with mapped starts".into() })?;
        let spec = SliceSpec { start: Some(j as i64), stop: Some(j as i64 + 1), step: 1 };
        let s = emit1(e, Op::Slice { specs: vec![SliceSpec::FULL, spec] }, std::slice::from_ref(&starts))?;
        let s = emit1(e, Op::Clamp { min: 0.0, max: (dim - window) as f64 }, &[s])?;
        let steps = int_constant(e, (0..window as i64).collect(), &[1, window], dtype)?;
        let idx = emit1(e, Op::Binary(BinaryOp::Add), &[s, steps])?;
        cur = gather_both(e, cur, idx, j)?;
    }
    Ok(vec![(cur, Some(0))])
}

/// `dynamic_update_slice(x, update, starts)` per example, with shared
/// starts (one window over the batch). Mapped starts are refused by name.
pub(super) fn dynamic_update_slice<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> Outs<E::Value> {
    if args[2].1.is_some() {
        return Err(BatchError::Unsupported {
            op: "dynamic_update_slice".into(),
            message: "the window's starts differ per example; write each example's window with a select over a \
                      mask, or keep the starts the same for every example"
                .into(),
        });
    }
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
    let upd = materialize(e, args[1].0.clone(), args[1].1, size)?;
    let starts = lead_zero(e, args[2].0.clone())?;
    Ok(vec![(emit1(e, Op::DynamicUpdateSlice, &[x, upd, starts])?, Some(0))])
}

/// A random draw per example. A shared seed (an i64 `[2]`, a stateless
/// draw's JAX-style key) draws once, shared by every example (the same key
/// gives the same numbers; a draw shaped like a mapped value takes one
/// example's shape); a shared generator state (an i64 `[3]`, what a
/// `Generator` draw reads) draws once for the whole batch, `[batch, ..]`,
/// so each example gets numbers of its own (PyTorch's `randomness =
/// "different"`) and the generator advances once; a mapped state (one key
/// per example) draws from each example's key, each its own stream, and
/// stacks the draws.
pub(super) fn random<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    dist: RandomDist,
    dtype: DType,
    shape: Option<&[usize]>,
    size: Option<usize>,
) -> Outs<E::Value> {
    let (state, sb) = args[0].clone();
    let example_shape: Vec<usize> = match shape {
        Some(s) => s.to_vec(),
        None => {
            let (like, lb) = &args[1];
            let ty = e.value_type(like);
            let dims: Vec<Option<usize>> =
                ty.dims.iter().enumerate().filter(|(a, _)| Some(*a) != *lb).map(|(_, d)| *d).collect();
            dims.into_iter().collect::<Option<Vec<usize>>>().ok_or_else(|| BatchError::UnknownSize {
                what: "a random draw shaped like a value of unknown dims".into(),
            })?
        }
    };
    let draw = Op::Random { dist, dtype, shape: Some(example_shape.clone()) };
    let Some(b) = sb else {
        if e.value_type(&state).dims[..] != [Some(3)] {
            return Ok(vec![(emit1(e, draw, &[state])?, None)]);
        }
        let batch = size.ok_or_else(|| BatchError::UnknownSize { what: "a generator's draw per example".into() })?;
        let shape = std::iter::once(batch).chain(example_shape).collect();
        return Ok(vec![(emit1(e, Op::Random { dist, dtype, shape: Some(shape) }, &[state])?, Some(0))]);
    };
    let states = to_front(e, state, b)?;
    let batch = e.value_type(&states).dims[0]
        .ok_or_else(|| BatchError::UnknownSize { what: "random draws from one key per example".into() })?;
    let mut draws = Vec::with_capacity(batch);
    for i in 0..batch as i64 {
        let spec = SliceSpec { start: Some(i), stop: Some(i + 1), step: 1 };
        let one = emit1(e, Op::Slice { specs: vec![spec, SliceSpec::FULL] }, std::slice::from_ref(&states))?;
        let one = emit1(e, Op::Squeeze { axes: vec![0] }, &[one])?;
        draws.push(emit1(e, draw.clone(), &[one])?);
    }
    if draws.is_empty() {
        let full: Vec<usize> = std::iter::once(0).chain(example_shape).collect();
        let zero = e.constant(tracejit_tensor::Storage::full(&full, dtype, 0.0));
        return Ok(vec![(zero, Some(0))]);
    }
    Ok(vec![(emit1(e, Op::Stack { axis: 0 }, &draws)?, Some(0))])
}

/// Which inputs of a spatial op carry the N axis (the rest are weights,
/// shared for this fold), or `None` when the op sums over N (a filter
/// gradient) and so cannot fold the batch into it.
fn spatial_data_inputs(sp: &SpatialOp, n_inputs: usize) -> Option<Vec<usize>> {
    match sp {
        SpatialOp::Conv2d { .. } | SpatialOp::Conv2dBackwardData { .. } => Some(vec![0]),
        // A residual is of the result's shape: it carries N too.
        SpatialOp::Conv2dNhwc { .. } => {
            Some(std::iter::once(0).chain(sp.conv_epilogue().and_then(|e| e.residual)).collect())
        }
        SpatialOp::MaxPool2d { .. }
        | SpatialOp::MaxPool2dNhwc { .. }
        | SpatialOp::AvgPool2d { .. }
        | SpatialOp::AvgPool2dBackward { .. } => Some(vec![0]),
        SpatialOp::MaxPool2dBackward { .. } => Some((0..n_inputs).collect()),
        SpatialOp::Conv2dBackwardFilter { .. } => None,
    }
}

/// A spatial op per example: the batch folds into N (`[B, N, C, H, W]` ->
/// `[B*N, C, H, W]`), the op runs once, and N unfolds again. With the
/// weights mapped, or for a filter gradient (which sums over N), the
/// batch folds into the channels as groups instead ([`super::grouped`]).
pub(super) fn spatial<E: BatchEmitter>(
    e: &mut E,
    sp: &SpatialOp,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> Outs<E::Value> {
    if let Some(ep) = sp.conv_epilogue() {
        let mapped = |i: Option<usize>| i.is_some_and(|i| args[i].1.is_some());
        if args[1].1.is_some() || mapped(ep.scale) || mapped(ep.bias) {
            return epilogue_as_ops(e, sp, ep, args, size);
        }
    }
    let Some(data) = spatial_data_inputs(sp, args.len()) else {
        return super::grouped::spatial(e, sp, args, size);
    };
    if args.iter().enumerate().any(|(i, (_, b))| b.is_some() && !data.contains(&i)) {
        return super::grouped::spatial(e, sp, args, size);
    }
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a]));
    let batch = size.ok_or_else(|| BatchError::UnknownSize { what: sp.name().into() })?;
    if batch == 0 {
        // No examples: a reshape could not recover N from 0 elements.
        return super::grouped::empty(e, sp, args);
    }
    let mut inputs = Vec::with_capacity(args.len());
    for (i, (v, b)) in args.iter().enumerate() {
        if !data.contains(&i) {
            inputs.push(v.clone());
            continue;
        }
        let x = materialize(e, v.clone(), *b, Some(batch))?;
        let dims = e.value_type(&x).dims.clone();
        let tail: Option<Vec<i64>> = dims[2..].iter().map(|d| d.map(|d| d as i64)).collect();
        let tail = tail.ok_or_else(|| BatchError::UnknownSize { what: format!("{}'s image dims", sp.name()) })?;
        let shape = std::iter::once(-1).chain(tail).collect();
        inputs.push(emit1(e, Op::Reshape { shape }, &[x])?);
    }
    let outs = e.emit(Op::Spatial(*sp), &inputs)?;
    let mut result = Vec::with_capacity(outs.len());
    for out in outs {
        let dims = e.value_type(&out).dims.clone();
        let tail: Option<Vec<i64>> = dims[1..].iter().map(|d| d.map(|d| d as i64)).collect();
        let tail = tail.ok_or_else(|| BatchError::UnknownSize { what: format!("{}'s output dims", sp.name()) })?;
        let shape = [batch as i64, -1].into_iter().chain(tail).collect();
        debug_assert!(rank(e, &out) >= 1);
        result.push((emit1(e, Op::Reshape { shape }, &[out])?, Some(0)));
    }
    Ok(result)
}

/// A `conv2d_nhwc` epilogue whose scale or bias differ per example (or
/// its weights, which the bare convolution's rule then refuses, as it
/// refuses them without an epilogue): the bare convolution (per example
/// when its image is, else once), then the epilogue's ops on the batched
/// result, each example's `[C]` operand broadcast over its own `[N, H,
/// W]`.
fn epilogue_as_ops<E: BatchEmitter>(
    e: &mut E,
    sp: &SpatialOp,
    ep: tracejit_tensor::ConvEpilogue,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> Outs<E::Value> {
    let SpatialOp::Conv2dNhwc { conv, .. } = *sp else { unreachable!("an epilogue is a conv2d_nhwc's") };
    let bare = SpatialOp::Conv2dNhwc { conv, scale: false, bias: false, residual: false, relu: false };
    let (y, b) = if args[..2].iter().all(|(_, b)| b.is_none()) {
        let xw: Vec<E::Value> = args[..2].iter().map(|(v, _)| v.clone()).collect();
        (emit1(e, Op::Spatial(bare), &xw)?, None)
    } else {
        spatial(e, &bare, &args[..2], size)?.remove(0)
    };
    let size = size.or_else(|| b.and_then(|b| e.value_type(&y).dims[b]));
    let mut y = materialize(e, y, b, size)?;
    for (at, op) in [(ep.scale, BinaryOp::Mul), (ep.bias, BinaryOp::Add), (ep.residual, BinaryOp::Add)] {
        let Some(i) = at else { continue };
        let (v, vb) = args[i].clone();
        let v = match vb {
            // `[B, C]` -> `[B, 1, 1, 1, C]`; a residual is `[B, N, H, W, C]`.
            Some(vb) if at != ep.residual => {
                let v = to_front(e, v, vb)?;
                insert_units(e, v, 1, 3)?
            }
            Some(vb) => to_front(e, v, vb)?,
            None => v,
        };
        y = emit1(e, Op::Binary(op), &[y, v])?;
    }
    if ep.relu {
        y = emit1(e, Op::Unary(tracejit_tensor::UnaryOp::Relu), &[y])?;
    }
    Ok(vec![(y, Some(0))])
}
