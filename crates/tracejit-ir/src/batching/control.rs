//! Batching rules of `cond` and `while`.
//!
//! A `cond` with any mapped operand runs both branches on the batch and
//! selects each example's result by its predicate (JAX does the same when
//! the predicate is batched; here also when only operands are, which
//! keeps one rule). A `while` is rebuilt with batched subgraphs: the
//! carried values that some iteration makes mapped are mapped from the
//! start (a fixed point, as JAX's `_while_loop_batching_rule`), and a
//! mapped condition makes the loop run while any example's holds, each
//! example's state frozen (a select) once its own condition fails.

use std::sync::Arc;

use tracejit_tensor::{BinaryOp, DType, ReduceOp, Storage};

use super::helpers::{emit1, materialize, rank};
use super::rules::broadcasting;
use super::{batch_values, BatchEmitter, Batched, Bdim, R};
use crate::autodiff::GraphEmitter;
use crate::control::CancelToken;
use crate::{Graph, Op, TensorType, ValueId};

/// `cond(pred, operands..)` per example: both branches on the batch, then
/// a select per output.
pub(super) fn cond<E: BatchEmitter>(
    e: &mut E,
    branches: &[Arc<Graph>; 2],
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> R<Vec<Batched<E::Value>>> {
    let pred = args[0].clone();
    let then = batch_values(e, &branches[0], &args[1..], size)?;
    let other = batch_values(e, &branches[1], &args[1..], size)?;
    let mut outs = Vec::with_capacity(then.len());
    for (t, o) in then.into_iter().zip(other) {
        let v = broadcasting(e, &Op::Select, &[pred.clone(), t, o])?;
        outs.push((v, Some(0)));
    }
    Ok(outs)
}

/// The batched type of a value: its type with the batch axis first.
fn batched_type(ty: &TensorType, mapped: bool, size: Option<usize>) -> TensorType {
    let mut ty = ty.clone();
    if mapped {
        ty.dims.insert(0, size);
    }
    ty
}

/// Emits a batched subgraph's outputs from its batched parameters.
type Finish<'f> = dyn FnMut(&mut GraphEmitter<'_>, &[Batched<ValueId>]) -> R<Vec<ValueId>> + 'f;

/// Batches `graph` into a new graph whose parameters have the batch axis
/// first where `mapped` says; returns it with its outputs' batch dims
/// (outputs left where the rules put them).
fn batch_subgraph(graph: &Graph, mapped: &[bool], size: Option<usize>, finish: &mut Finish<'_>) -> R<Graph> {
    let mut out = Graph::new(format!("vmap({})", graph.name));
    let inputs: Vec<Batched<ValueId>> = graph
        .param_types()
        .iter()
        .zip(mapped)
        .map(|(ty, &m)| (out.add_param(batched_type(ty, m, size)), m.then_some(0)))
        .collect();
    let mut e = GraphEmitter { graph: &mut out };
    let outputs = finish(&mut e, &inputs)?;
    out.outputs = outputs;
    Ok(out)
}

/// The loop's subgraphs batched once with the carried values mapped as
/// `carry`: the body's results' batch dims, and the condition's.
fn probe(parts: &[Arc<Graph>; 2], carry: &[bool], captured: &[bool], size: Option<usize>) -> R<(Vec<Bdim>, Bdim)> {
    let mapped: Vec<bool> = carry.iter().chain(captured).copied().collect();
    let mut body_dims = Vec::new();
    batch_subgraph(&parts[1], &mapped, size, &mut |e, ins| {
        let outs = batch_values(e, &parts[1], ins, size)?;
        body_dims = outs.iter().map(|(_, b)| *b).collect();
        Ok(outs.into_iter().map(|(v, _)| v).collect())
    })?;
    let mut pred_dim = None;
    batch_subgraph(&parts[0], &mapped, size, &mut |e, ins| {
        let outs = batch_values(e, &parts[0], ins, size)?;
        pred_dim = outs[0].1;
        Ok(vec![outs[0].0])
    })?;
    Ok((body_dims, pred_dim))
}

/// `while(carried.., captured..)` per example.
pub(super) fn while_loop<E: BatchEmitter>(
    e: &mut E,
    parts: &[Arc<Graph>; 2],
    trip_count: Option<usize>,
    cancel: &Option<CancelToken>,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> R<Vec<Batched<E::Value>>> {
    let n_carried = parts[1].outputs.len();
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let captured: Vec<bool> = args[n_carried..].iter().map(|(_, b)| b.is_some()).collect();
    let mut carry: Vec<bool> = args[..n_carried].iter().map(|(_, b)| b.is_some()).collect();
    // The fixed point: at most one more mapped value per round.
    let pred_mapped = loop {
        let (body_dims, pred_dim) = probe(parts, &carry, &captured, size)?;
        let mut changed = false;
        for (c, b) in carry.iter_mut().zip(&body_dims) {
            let now = *c || b.is_some() || pred_dim.is_some();
            changed |= now != *c;
            *c = now;
        }
        if !changed {
            break pred_dim.is_some();
        }
    };
    let mapped: Vec<bool> = carry.iter().chain(&captured).copied().collect();
    let cond_graph = batch_subgraph(&parts[0], &mapped, size, &mut |e, ins| {
        let pred = batch_values(e, &parts[0], ins, size)?.remove(0);
        Ok(vec![any_example(e, pred)?])
    })?;
    let body_graph = batch_subgraph(&parts[1], &mapped, size, &mut |e, ins| {
        let new = batch_values(e, &parts[1], ins, size)?;
        let pred = if pred_mapped { Some(batch_values(e, &parts[0], ins, size)?.remove(0)) } else { None };
        let mut outs = Vec::with_capacity(new.len());
        for ((v, b), (old, _)) in new.into_iter().zip(ins) {
            let v = if mapped[outs.len()] { materialize(e, v, b, size)? } else { v };
            outs.push(match &pred {
                Some(p) => broadcasting(e, &Op::Select, &[*p, (v, Some(0)), (*old, Some(0))])?,
                None => v,
            });
        }
        Ok(outs)
    })?;
    let mut inputs = Vec::with_capacity(args.len());
    for ((v, b), &m) in args.iter().zip(&mapped) {
        inputs.push(if m { materialize(e, v.clone(), *b, size)? } else { v.clone() });
    }
    let op = Op::While {
        parts: [Arc::new(cond_graph), Arc::new(body_graph)],
        trip_count: if pred_mapped { None } else { trip_count },
        cancel: cancel.clone(),
    };
    let outs = e.emit(op, &inputs)?;
    Ok(outs.into_iter().zip(carry).map(|(v, m)| (v, m.then_some(0))).collect())
}

/// True while some example's condition holds (a mapped predicate), or the
/// shared predicate itself.
fn any_example(e: &mut GraphEmitter<'_>, (pred, b): Batched<ValueId>) -> R<ValueId> {
    if b.is_none() {
        return Ok(pred);
    }
    debug_assert_eq!(rank(e, &pred), 1);
    let as_int = emit1(e, Op::Cast { to: DType::I32 }, &[pred])?;
    // A sum, not a max: it is 0 over an empty batch, which then stops.
    let count = emit1(e, Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: false }, &[as_int])?;
    let zero = e.graph.add_constant(Storage::scalar(0i32));
    emit1(e, Op::Binary(BinaryOp::Gt), &[count, zero])
}
