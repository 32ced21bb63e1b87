//! The VJPs of the third milestone's indexing, window and scan ops, each
//! written with the others: `gather_elements` and `scatter_add` are each
//! other's adjoint, `dynamic_slice` and `dynamic_update_slice` likewise,
//! `pad`'s is a slice, `cumsum`'s a reversed cumsum, `top_k`'s a scatter
//! of the values' cotangent to their indices.

use tracejit_tensor::SliceSpec;

use super::{unsupported, B, R};
use crate::autodiff::{broadcast_like, zeros_like, Emitter};
use crate::Op;

/// `scatter_add(zeros_like(x), indices, g, axis)`: `g` added back where
/// `gather_elements` read it.
pub(super) fn gather_elements_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    axis: usize,
    x: &E::Value,
    indices: &E::Value,
    g: E::Value,
) -> R<E::Value> {
    let zeros = zeros_like(b.e, x.clone())?;
    b.op(Op::ScatterAdd { axis }, &[zeros, indices.clone(), g])
}

/// `x` passes `g` through; the updates read `g` where they were added
/// (`gather_elements` at the indices, broadcast to the updates' shape).
pub(super) fn scatter_add_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    axis: usize,
    indices: &E::Value,
    updates: &E::Value,
    g: E::Value,
) -> R<[E::Value; 2]> {
    let idx = broadcast_like(b.e, indices.clone(), updates)?;
    let gu = b.op(Op::GatherElements { axis }, &[g.clone(), idx])?;
    Ok([g, gu])
}

/// `g` written into zeros of `x`'s shape at the (clamped) starts.
pub(super) fn dynamic_slice_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    x: &E::Value,
    starts: &E::Value,
    g: E::Value,
) -> R<E::Value> {
    let zeros = zeros_like(b.e, x.clone())?;
    b.op(Op::DynamicUpdateSlice, &[zeros, g, starts.clone()])
}

/// `x` gets `g` with the window zeroed; the update gets the window of `g`.
pub(super) fn dynamic_update_slice_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    update: &E::Value,
    starts: &E::Value,
    g: E::Value,
) -> R<[E::Value; 2]> {
    let ut = b.ty(update);
    let sizes = ut.shape().ok_or_else(|| {
        unsupported(op, format!("the update {ut} has dims unknown in the trace; its window cannot be sliced back"))
    })?;
    let zeros = zeros_like(b.e, update.clone())?;
    let gx = b.op(Op::DynamicUpdateSlice, &[g.clone(), zeros, starts.clone()])?;
    let gu = b.op(Op::DynamicSlice { sizes }, &[g, starts.clone()])?;
    Ok([gx, gu])
}

/// The border cut off again: `g[lo : -hi]` on each padded axis.
pub(super) fn pad_vjp<E: Emitter>(b: &mut B<'_, E>, pads: &[(usize, usize)], g: E::Value) -> R<E::Value> {
    if pads.iter().all(|&(lo, hi)| lo == 0 && hi == 0) {
        return Ok(g);
    }
    let specs = pads
        .iter()
        .map(|&(lo, hi)| SliceSpec { start: Some(lo as i64), stop: (hi > 0).then(|| -(hi as i64)), step: 1 })
        .collect();
    b.op(Op::Slice { specs }, &[g])
}

/// Reversed along `axis` (a slice of step -1).
fn reverse<E: Emitter>(b: &mut B<'_, E>, axis: usize, v: E::Value) -> R<E::Value> {
    let mut specs = vec![SliceSpec::FULL; b.ty(&v).rank()];
    specs[axis] = SliceSpec { start: None, stop: None, step: -1 };
    b.op(Op::Slice { specs }, &[v])
}

/// `x[i]` reaches every output from `i` on: the cumsum of `g` taken from
/// the end.
pub(super) fn cumsum_vjp<E: Emitter>(b: &mut B<'_, E>, axis: usize, g: E::Value) -> R<E::Value> {
    let r = reverse(b, axis, g)?;
    let s = b.op(Op::Cumsum { axis }, &[r])?;
    reverse(b, axis, s)
}

/// The values' cotangent added back at their indices along the last axis.
pub(super) fn top_k_vjp<E: Emitter>(b: &mut B<'_, E>, x: &E::Value, indices: &E::Value, g: E::Value) -> R<E::Value> {
    let axis = b.ty(x).rank() - 1;
    let zeros = zeros_like(b.e, x.clone())?;
    b.op(Op::ScatterAdd { axis }, &[zeros, indices.clone(), g])
}
