//! Small steps the batching rules share: moving the batch axis, giving an
//! unmapped value a batch axis, inserting unit axes, emitting one op.

use tracejit_tensor::{DType, Storage};

use super::{BatchEmitter, BatchError, Bdim, R};
use crate::autodiff::Emitter;
use crate::Op;

/// Emits `op` and returns its only output.
pub(super) fn emit1<E: Emitter>(e: &mut E, op: Op, inputs: &[E::Value]) -> R<E::Value> {
    Ok(e.emit(op, inputs)?.remove(0))
}

/// The value's rank.
pub(super) fn rank<E: Emitter>(e: &E, v: &E::Value) -> usize {
    e.value_type(v).rank()
}

/// `v` with its batch axis `bdim` moved to the front (axis 0), the other
/// axes in order (`jnp.moveaxis(v, bdim, 0)`).
pub(super) fn to_front<E: Emitter>(e: &mut E, v: E::Value, bdim: usize) -> R<E::Value> {
    if bdim == 0 {
        return Ok(v);
    }
    let r = rank(e, &v);
    let perm: Vec<usize> = std::iter::once(bdim).chain((0..r).filter(|&a| a != bdim)).collect();
    emit1(e, Op::Transpose { perm }, &[v])
}

/// `v` with its batch axis (at the front) moved to `to`.
pub(super) fn from_front<E: Emitter>(e: &mut E, v: E::Value, to: usize) -> R<E::Value> {
    if to == 0 {
        return Ok(v);
    }
    let r = rank(e, &v);
    let mut perm: Vec<usize> = (1..r).collect();
    perm.insert(to, 0);
    emit1(e, Op::Transpose { perm }, &[v])
}

/// The value with a batch axis at the front: moved there when it is
/// mapped, broadcast to `size` copies when it is not (which needs the
/// batch size known).
pub(super) fn materialize<E: BatchEmitter>(e: &mut E, v: E::Value, bdim: Bdim, size: Option<usize>) -> R<E::Value> {
    if let Some(b) = bdim {
        return to_front(e, v, b);
    }
    let ty = e.value_type(&v);
    let Some(size) = size else {
        // Unknown in the trace: a select against the batch's all-true mask.
        let mask = e.batch_mask().ok_or_else(|| BatchError::UnknownSize {
            what: "an unmapped value that meets a mapped one where both need the batch axis".into(),
        })?;
        let mask = insert_units(e, mask, 1, ty.rank())?;
        let expanded = emit1(e, Op::ExpandDims { axis: 0 }, &[v])?;
        return emit1(e, Op::Select, &[mask, expanded.clone(), expanded]);
    };
    let expanded = emit1(e, Op::ExpandDims { axis: 0 }, &[v])?;
    match ty.shape() {
        Some(dims) => {
            let shape: Vec<usize> = std::iter::once(size).chain(dims).collect();
            emit1(e, Op::BroadcastTo { shape }, &[expanded])
        }
        // Unknown dims: broadcast through a select against a [size, 1, ..]
        // mask, which broadcasts by numpy's rules without naming them.
        None => {
            let ones: Vec<usize> = std::iter::once(size).chain(std::iter::repeat_n(1, ty.rank())).collect();
            let mask = e.constant(Storage::full(&ones, DType::Bool, 1.0));
            emit1(e, Op::Select, &[mask, expanded.clone(), expanded])
        }
    }
}

/// Inserts `count` unit axes at `at` (so a batched value of lower rank
/// lines up with a higher-rank operand under numpy broadcasting, which
/// aligns trailing axes).
pub(super) fn insert_units<E: Emitter>(e: &mut E, mut v: E::Value, at: usize, count: usize) -> R<E::Value> {
    for _ in 0..count {
        v = emit1(e, Op::ExpandDims { axis: at }, &[v])?;
    }
    Ok(v)
}

/// The batch size as the value's leading dim (a batched value at the
/// front), or the size the transform was given.
pub(super) fn front_size<E: Emitter>(e: &E, v: &E::Value, size: Option<usize>) -> Option<usize> {
    e.value_type(v).dims.first().copied().flatten().or(size)
}

/// The value moved to the front when mapped; unchanged when not.
pub(super) fn front_if_mapped<E: Emitter>(e: &mut E, v: E::Value, bdim: Bdim) -> R<E::Value> {
    match bdim {
        Some(b) => to_front(e, v, b),
        None => Ok(v),
    }
}

/// The per-example rank of a value with batch axis `bdim`.
pub(super) fn example_rank<E: Emitter>(e: &E, v: &E::Value, bdim: Bdim) -> usize {
    rank(e, v) - usize::from(bdim.is_some())
}

/// An integer constant of `dtype` holding `values` with shape `shape`.
pub(super) fn int_constant<E: Emitter>(e: &mut E, values: Vec<i64>, shape: &[usize], dtype: DType) -> R<E::Value> {
    let storage = Storage::from_vec(values, shape).map_err(|err| BatchError::Request(err.to_string()))?;
    let c = e.constant(storage);
    if dtype == DType::I64 {
        Ok(c)
    } else {
        emit1(e, Op::Cast { to: dtype }, &[c])
    }
}
