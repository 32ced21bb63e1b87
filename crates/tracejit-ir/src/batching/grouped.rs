//! Convolutions whose weights differ per example, and filter gradients
//! per example: the batch folds into the channels as groups.
//!
//! Folding the batch into the images (`[B, N, ..]` -> `[B·N, ..]`) needs
//! the weights shared and the op to keep images apart; a filter gradient
//! sums over the images, and mapped weights are many filters. Instead
//! example `b`'s channels become group block `b` of one grouped
//! convolution: images `[B, N, C, H, W]` -> `[N, B·C, H, W]`, weights
//! `[B, O, C/g, kh, kw]` -> `[B·O, C/g, kh, kw]`, bias `[B, O]` ->
//! `[B·O]`, and `groups` -> `B·g`. Group block `b` reads only example
//! `b`'s channels and filters, so each example's result is its own
//! convolution (or filter gradient, summed over its own images): one op
//! for the batch (`torch.func`'s rule for `conv` under `vmap` over
//! weights), never a loop of calls.

use tracejit_tensor::SpatialOp;

use super::helpers::{emit1, materialize};
use super::{BatchEmitter, BatchError, Batched, R};
use crate::Op;

/// What an operand or result of a convolution op is to the fold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Images `[N, ch, H, W]`: the batch joins the channels.
    Images,
    /// Weights `[O, C/g, kh, kw]`: the batch joins the output channels.
    Weights,
    /// A bias `[O]`.
    Bias,
}

/// The roles of `sp`'s inputs and outputs, for the convolution ops.
fn roles(sp: &SpatialOp) -> Option<(Vec<Role>, Vec<Role>)> {
    use Role::*;
    Some(match *sp {
        SpatialOp::Conv2d { bias, .. } => {
            let mut ins = vec![Images, Weights];
            if bias {
                ins.push(Bias);
            }
            (ins, vec![Images])
        }
        SpatialOp::Conv2dBackwardData { .. } => (vec![Images, Weights], vec![Images]),
        SpatialOp::Conv2dBackwardFilter { bias, .. } => {
            let mut outs = vec![Weights];
            if bias {
                outs.push(Bias);
            }
            (vec![Images, Images], outs)
        }
        _ => return None,
    })
}

/// `sp` with its groups multiplied by `batch`.
fn regrouped(sp: &SpatialOp, batch: usize) -> SpatialOp {
    let mut sp = *sp;
    match &mut sp {
        SpatialOp::Conv2d { conv, .. }
        | SpatialOp::Conv2dBackwardData { conv, .. }
        | SpatialOp::Conv2dBackwardFilter { conv, .. } => conv.groups *= batch,
        _ => {}
    }
    sp
}

/// A convolution op per example, the batch folded into the channels as
/// groups (see the module). Needs the batch size and every dim but the
/// images' N known.
pub(super) fn spatial<E: BatchEmitter>(
    e: &mut E,
    sp: &SpatialOp,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> R<Vec<Batched<E::Value>>> {
    let refuse = |why: String| BatchError::Unsupported { op: sp.name().into(), message: why };
    let (ins, outs) = roles(sp).ok_or_else(|| refuse("its operands cannot differ per example".into()))?;
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let batch = size.ok_or_else(|| BatchError::UnknownSize { what: format!("{} per example", sp.name()) })?;
    if batch == 0 {
        return empty(e, sp, args);
    }
    let mut inputs = Vec::with_capacity(args.len());
    for ((v, b), role) in args.iter().zip(&ins) {
        let v = materialize(e, v.clone(), *b, Some(batch))?;
        inputs.push(fold(e, sp, v, *role, batch)?);
    }
    let results = e.emit(Op::Spatial(regrouped(sp, batch)), &inputs)?;
    results.into_iter().zip(&outs).map(|(v, role)| Ok((unfold(e, sp, v, *role, batch)?, Some(0)))).collect()
}

/// The known dims of `v` from `from` on, as reshape targets.
fn known_tail<E: BatchEmitter>(e: &E, sp: &SpatialOp, v: &E::Value, from: usize) -> R<Vec<i64>> {
    let dims = e.value_type(v).dims;
    let tail: Option<Vec<i64>> = dims[from..].iter().map(|d| d.map(|d| d as i64)).collect();
    tail.ok_or_else(|| BatchError::UnknownSize { what: format!("{}'s channel and image dims", sp.name()) })
}

/// A batched operand (batch axis in front) in the grouped op's layout.
fn fold<E: BatchEmitter>(e: &mut E, sp: &SpatialOp, v: E::Value, role: Role, batch: usize) -> R<E::Value> {
    let b = batch as i64;
    match role {
        // [B, N, ch, H, W] -> [N, B, ch, H, W] -> [N, B·ch, H, W]
        Role::Images => {
            let t = known_tail(e, sp, &v, 2)?;
            let v = emit1(e, Op::Transpose { perm: vec![1, 0, 2, 3, 4] }, &[v])?;
            emit1(e, Op::Reshape { shape: vec![-1, b * t[0], t[1], t[2]] }, &[v])
        }
        // [B, O, c, kh, kw] -> [B·O, c, kh, kw]; [B, O] -> [B·O]
        Role::Weights | Role::Bias => {
            let t = known_tail(e, sp, &v, 1)?;
            let shape = std::iter::once(b * t[0]).chain(t[1..].iter().copied()).collect();
            emit1(e, Op::Reshape { shape }, &[v])
        }
    }
}

/// A result of the grouped op back to the batched layout (batch in front).
fn unfold<E: BatchEmitter>(e: &mut E, sp: &SpatialOp, v: E::Value, role: Role, batch: usize) -> R<E::Value> {
    let b = batch as i64;
    match role {
        // [N, B·ch, h, w] -> [N, B, ch, h, w] -> [B, N, ch, h, w]
        Role::Images => {
            let t = known_tail(e, sp, &v, 1)?;
            let v = emit1(e, Op::Reshape { shape: vec![-1, b, t[0] / b, t[1], t[2]] }, &[v])?;
            emit1(e, Op::Transpose { perm: vec![1, 0, 2, 3, 4] }, &[v])
        }
        // [B·O, ..] -> [B, O, ..]
        Role::Weights | Role::Bias => {
            let t = known_tail(e, sp, &v, 0)?;
            let shape = [b, t[0] / b].into_iter().chain(t[1..].iter().copied()).collect();
            emit1(e, Op::Reshape { shape }, &[v])
        }
    }
}

/// An empty batch: empty results of each example's result type.
pub(super) fn empty<E: BatchEmitter>(
    e: &mut E,
    sp: &SpatialOp,
    args: &[Batched<E::Value>],
) -> R<Vec<Batched<E::Value>>> {
    let types: Vec<crate::TensorType> = args
        .iter()
        .map(|(v, b)| {
            let mut t = e.value_type(v);
            if let Some(a) = *b {
                t.dims.remove(a);
            }
            t
        })
        .collect();
    let outs = crate::infer(&Op::Spatial(*sp), &types, None).map_err(|err| BatchError::Request(err.to_string()))?;
    outs.into_iter()
        .map(|t| {
            let shape: Option<Vec<usize>> = std::iter::once(Some(0)).chain(t.dims.iter().copied()).collect();
            let shape =
                shape.ok_or_else(|| BatchError::UnknownSize { what: format!("{}'s result dims", sp.name()) })?;
            Ok((e.constant(tracejit_tensor::Storage::full(&shape, t.dtype, 0.0)), Some(0)))
        })
        .collect()
}
