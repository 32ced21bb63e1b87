//! The VJPs of the ops that read part of a tensor — `slice`, `gather`,
//! `concat` — which scatter a cotangent back into zeros of the input's
//! shape, including shapes with dims unknown in the trace.

use tracejit_tensor::SliceSpec;

use super::{unsupported, B, R};
use crate::autodiff::{zeros_like, Emitter};
use crate::Op;

/// `g` (a slice's cotangent, `count` long on `axis`) scattered back into
/// `n` entries at `start, start + step, ...` (any step, negative too): a
/// product with the 0/1 selection matrix `[count, n]`, the axis moved last
/// and the other axes flattened so any rank works.
pub(super) fn strided_scatter<E: Emitter>(
    b: &mut B<'_, E>,
    g: E::Value,
    axis: usize,
    n: usize,
    start: i64,
    count: usize,
    step: i64,
) -> R<E::Value> {
    let gshape = b.ty(&g).shape().expect("the input's shape is known, so the slice's is");
    let dtype = b.ty(&g).dtype;
    let rank = gshape.len();
    let perm: Vec<usize> = (0..rank).filter(|&a| a != axis).chain([axis]).collect();
    let rest: usize = perm[..rank - 1].iter().map(|&a| gshape[a]).product();
    let mut select = vec![0.0f64; count * n];
    for k in 0..count {
        let i = start + k as i64 * step;
        select[k * n + i as usize] = 1.0;
    }
    let select = tracejit_tensor::Storage::from_vec(select, &[count, n]).expect("count * n entries");
    let select = b.e.constant(tracejit_tensor::kernels::cast(&select, dtype));
    let moved = b.op(Op::Transpose { perm: perm.clone() }, &[g])?;
    let flat = b.op(Op::Reshape { shape: vec![rest as i64, count as i64] }, &[moved])?;
    let scattered = b.op(Op::MatMul, &[flat, select])?;
    let mut moved_shape: Vec<i64> = perm[..rank - 1].iter().map(|&a| gshape[a] as i64).collect();
    moved_shape.push(n as i64);
    let unflat = b.op(Op::Reshape { shape: moved_shape }, &[scattered])?;
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    b.op(Op::Transpose { perm: inverse }, &[unflat])
}

/// `g` placed back into zeros of `x`'s shape where a slice read it: per
/// sliced axis, padded with zeros before and after (step 1) or a 0/1
/// selection matrix (other steps). Inputs with dims unknown in the trace
/// take [`slice_vjp_unknown`].
pub(super) fn slice_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    specs: &[SliceSpec],
    x: &E::Value,
    g: E::Value,
) -> R<E::Value> {
    let t = b.ty(x);
    let Some(shape) = t.shape() else {
        return slice_vjp_unknown(b, op, specs, x, g);
    };
    let mut g = g;
    for (axis, spec) in specs.iter().enumerate() {
        let (start, count, step) = spec.resolve(shape[axis]);
        if step == 1 && count == shape[axis] {
            continue;
        }
        if step != 1 {
            g = strided_scatter(b, g, axis, shape[axis], start, count, step)?;
            continue;
        }
        let before = start as usize;
        let after = shape[axis] - before - count;
        let mut pads = vec![(0, 0); shape.len()];
        pads[axis] = (before, after);
        g = b.op(Op::Pad { pads, value: 0.0 }, &[g])?;
    }
    Ok(g)
}

/// [`slice_vjp`] for an input whose shape is not fully known in the trace
/// (an input signature with `-1`): the zeros around `g` on each sliced axis
/// are slices of `x` itself (`x[..start]` and `x[stop..]`, zeroed by
/// `select`), so their sizes are right whatever the run-time length. That
/// partition of the axis holds for step 1 when both bounds have one sign
/// (or are absent); `x[s:e]` with `s >= 0 > e` is `x[s:][:e]`, done in two
/// steps. A bound pair that is empty for every length gives zeros. What
/// remains (a strided slice, or `s < 0 <= e`, of an axis of unknown
/// length) is an error naming the slice.
fn slice_vjp_unknown<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    specs: &[SliceSpec],
    x: &E::Value,
    g: E::Value,
) -> R<E::Value> {
    let t = b.ty(x);
    let mut g = g;
    for (axis, spec) in specs.iter().enumerate() {
        if *spec == SliceSpec::FULL {
            continue;
        }
        if let Some(n) = t.dims[axis] {
            let (_, count, step) = spec.resolve(n);
            if step == 1 && count == n {
                continue;
            }
        }
        if spec.step != 1 {
            return Err(unsupported(
                op,
                format!(
                    "a slice with step {} of {t}, whose dims are not all known in the trace: a strided slice \
                     differentiates only with its input's shape known (trace with a concrete shape)",
                    spec.step
                ),
            ));
        }
        // The shape `g` has now on every other axis: `x` whole on this and
        // the earlier (already restored) axes, sliced on the later ones.
        let mut ref_specs = specs.to_vec();
        for s in &mut ref_specs[..=axis] {
            *s = SliceSpec::FULL;
        }
        let reference = if ref_specs.iter().all(|s| *s == SliceSpec::FULL) {
            x.clone()
        } else {
            b.op(Op::Slice { specs: ref_specs }, std::slice::from_ref(x))?
        };
        let (start, stop) = (spec.start, spec.stop);
        let always_empty = matches!((start, stop), (Some(s), Some(e)) if (s >= 0) == (e >= 0) && s >= e);
        if always_empty {
            return zeros_like(b.e, x.clone());
        }
        g = match (start, stop) {
            (Some(s), Some(e)) if s < 0 && e >= 0 => {
                return Err(unsupported(
                    op,
                    format!(
                        "slice {s}..{e} of axis {axis} of {t}, whose length is unknown in the trace: with a negative \
                         start and a non-negative stop, which elements it reads depends on the length; give both \
                         bounds one sign"
                    ),
                ));
            }
            (Some(s), Some(e)) if s > 0 && e < 0 => {
                // x[s:e] = x[s:][:e]: restore the tail, then the head.
                let tail_spec = SliceSpec { start: Some(s), stop: None, step: 1 };
                let tail = axis_slice(b, &reference, axis, tail_spec)?;
                let g_tail = pad_axis(b, g, &tail, axis, None, Some(e))?;
                pad_axis(b, g_tail, &reference, axis, Some(s), None)?
            }
            _ => pad_axis(b, g, &reference, axis, start, stop)?,
        };
    }
    Ok(g)
}

/// `v[..]` with `spec` on `axis` only.
fn axis_slice<E: Emitter>(b: &mut B<'_, E>, v: &E::Value, axis: usize, spec: SliceSpec) -> R<E::Value> {
    let mut specs = vec![SliceSpec::FULL; b.ty(v).rank()];
    specs[axis] = spec;
    b.op(Op::Slice { specs }, std::slice::from_ref(v))
}

/// `g` (the cotangent of `reference[start:stop]` on `axis`) with zeros
/// shaped like `reference[..start]` before and `reference[stop..]` after.
fn pad_axis<E: Emitter>(
    b: &mut B<'_, E>,
    g: E::Value,
    reference: &E::Value,
    axis: usize,
    start: Option<i64>,
    stop: Option<i64>,
) -> R<E::Value> {
    let mut parts = Vec::with_capacity(3);
    if let Some(s) = start.filter(|&s| s != 0) {
        let head = axis_slice(b, reference, axis, SliceSpec { start: None, stop: Some(s), step: 1 })?;
        parts.push(zeros_like(b.e, head)?);
    }
    parts.push(g);
    if let Some(e) = stop {
        let rest = axis_slice(b, reference, axis, SliceSpec { start: Some(e), stop: None, step: 1 })?;
        parts.push(zeros_like(b.e, rest)?);
    }
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    b.op(Op::Concat { axis }, &parts)
}

/// `g` added back into zeros of `params`' shape at the gathered indices,
/// duplicates summed: a `scatter_add` along `axis`, with the indices
/// flattened into one axis of `g` and broadcast along the others (so no
/// index tensor of `g`'s size is made). An embedding's gradient this way is
/// a scatter of the cotangent rows, not a dense one-hot product. Of the
/// dims of `params` but the gathered one and the indices' element count,
/// one may be unknown in the trace.
pub(super) fn gather_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    axis: usize,
    params: &E::Value,
    indices: &E::Value,
    g: E::Value,
) -> R<E::Value> {
    let (pt, it) = (b.ty(params), b.ty(indices));
    let m: Option<usize> = it.dims.iter().copied().product();
    let size = |d: Option<usize>| d.map_or(-1, |d| d as i64);
    let mut gshape: Vec<i64> = pt.dims.iter().map(|&d| size(d)).collect();
    gshape[axis] = size(m);
    if gshape.iter().filter(|&&d| d < 0).count() > 1 {
        return Err(unsupported(
            op,
            format!(
                "params {pt} with indices {it}: more than one of the dims of params (but the gathered one) and \
                 the indices' count is unknown in the trace; trace with more of them known"
            ),
        ));
    }
    let g = b.op(Op::Reshape { shape: gshape }, &[g])?;
    let mut ishape = vec![1i64; pt.rank()];
    ishape[axis] = size(m);
    let idx = b.op(Op::Reshape { shape: ishape }, std::slice::from_ref(indices))?;
    let zeros = zeros_like(b.e, params.clone())?;
    b.op(Op::ScatterAdd { axis }, &[zeros, idx, g])
}

/// Each input's part of `g` along the concatenated axis. One input may
/// have a length unknown in the trace: parts before it start at known
/// offsets, parts after it are counted from the end.
pub(super) fn concat_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    axis: usize,
    inputs: &[E::Value],
    g: &E::Value,
) -> R<Vec<Option<E::Value>>> {
    let lens: Vec<Option<usize>> = inputs.iter().map(|x| b.ty(x).dims[axis]).collect();
    if lens.iter().filter(|l| l.is_none()).count() > 1 {
        let types: Vec<String> = inputs.iter().map(|x| b.ty(x).to_string()).collect();
        return Err(unsupported(
            op,
            format!(
                "inputs {} have more than one size unknown in the trace along the concatenated axis {axis}",
                types.join(", ")
            ),
        ));
    }
    let mut out = Vec::with_capacity(inputs.len());
    let mut start = Some(0i64);
    for (i, len) in lens.iter().enumerate() {
        // Every length after this one is known (at most one is unknown).
        let after: i64 = lens[i + 1..].iter().map(|l| l.unwrap_or(0) as i64).sum();
        let spec = match (start, len) {
            (_, Some(0)) => SliceSpec::range(0, 0),
            (Some(s), Some(l)) => SliceSpec::range(s, s + *l as i64),
            (Some(s), None) => SliceSpec { start: Some(s), stop: (after > 0).then_some(-after), step: 1 },
            (None, Some(l)) => {
                SliceSpec { start: Some(-(*l as i64 + after)), stop: (after > 0).then_some(-after), step: 1 }
            }
            (None, None) => unreachable!("at most one length is unknown"),
        };
        out.push(Some(axis_slice(b, g, axis, spec)?));
        start = match (start, len) {
            (Some(s), Some(l)) => Some(s + *l as i64),
            _ => None,
        };
    }
    Ok(out)
}
