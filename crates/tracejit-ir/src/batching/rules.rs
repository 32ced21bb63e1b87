//! The batching rule of every op, in one exhaustive `match` (no catch-all
//! arm: a new op is a compile error here until it has a rule).

use tracejit_tensor::SliceSpec;

use super::helpers::{emit1, example_rank, front_if_mapped, front_size, insert_units, materialize, rank, to_front};
use super::{control, indexing, BatchEmitter, BatchError, Batched, R};
use crate::{Graph, Op};

/// The outputs of `op` applied per example to `args` (each operand with
/// its batch dim), with their batch dims, emitted through `e`. `graph` is
/// the graph holding the node (its function library resolves calls);
/// `size` is the batch size when known.
pub fn batch_rule<E: BatchEmitter>(
    e: &mut E,
    op: &Op,
    args: &[Batched<E::Value>],
    size: Option<usize>,
    graph: &Graph,
) -> R<Vec<Batched<E::Value>>> {
    if args.iter().all(|(_, b)| b.is_none()) && is_stateless(op) {
        let values: Vec<E::Value> = args.iter().map(|(v, _)| v.clone()).collect();
        return Ok(e.emit(op.clone(), &values)?.into_iter().map(|v| (v, None)).collect());
    }
    let one = |v: E::Value| Ok(vec![(v, Some(0))]);
    match op {
        Op::Parameter { .. } => {
            Err(BatchError::Request("a parameter node reached the rules (a bug in tracejit)".into()))
        }
        Op::Constant { value } => Ok(vec![(e.constant(value.clone()), None)]),
        // One operand, elementwise: the batch axis stays where it is.
        Op::Unary(_) | Op::Cast { .. } | Op::Clamp { .. } | Op::OneHot { .. } => {
            let (v, b) = args[0].clone();
            Ok(vec![(emit1(e, op.clone(), &[v])?, b)])
        }
        Op::Binary(_) | Op::Select => one(broadcasting(e, op, args)?),
        Op::Reduce { op: r, axes, keepdims } => {
            let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
            let axes = axes.iter().map(|a| a + 1).collect();
            one(emit1(e, Op::Reduce { op: *r, axes, keepdims: *keepdims }, &[x])?)
        }
        Op::ArgReduce { op: r, axis, keepdims } => {
            let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
            one(emit1(e, Op::ArgReduce { op: *r, axis: axis + 1, keepdims: *keepdims }, &[x])?)
        }
        Op::Cumsum { axis } => unary_front(e, args, size, Op::Cumsum { axis: axis + 1 }),
        Op::TopK { k } => {
            let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
            Ok(e.emit(Op::TopK { k: *k }, &[x])?.into_iter().map(|v| (v, Some(0))).collect())
        }
        Op::MatMul => one(matmul(e, args)?),
        Op::Reshape { shape } => one(reshape(e, args, shape, size)?),
        Op::Transpose { perm } => {
            let perm = std::iter::once(0).chain(perm.iter().map(|p| p + 1)).collect();
            unary_front(e, args, size, Op::Transpose { perm })
        }
        Op::BroadcastTo { shape } => one(broadcast_to(e, args, shape, size)?),
        Op::ExpandDims { axis } => unary_front(e, args, size, Op::ExpandDims { axis: axis + 1 }),
        Op::Squeeze { axes } => unary_front(e, args, size, Op::Squeeze { axes: axes.iter().map(|a| a + 1).collect() }),
        Op::Concat { axis } => all_front(e, args, size, Op::Concat { axis: axis + 1 }),
        Op::Stack { axis } => all_front(e, args, size, Op::Stack { axis: axis + 1 }),
        Op::Slice { specs } => {
            let specs = std::iter::once(SliceSpec::FULL).chain(specs.iter().copied()).collect();
            unary_front(e, args, size, Op::Slice { specs })
        }
        Op::Pad { pads, value } => {
            let pads = std::iter::once((0, 0)).chain(pads.iter().copied()).collect();
            unary_front(e, args, size, Op::Pad { pads, value: *value })
        }
        Op::Gather { axis } => indexing::gather(e, args, *axis, size),
        Op::GatherElements { axis } => all_front(e, args, size, Op::GatherElements { axis: axis + 1 }),
        Op::ScatterAdd { axis } => indexing::scatter_add(e, args, *axis, size),
        Op::DynamicSlice { sizes } => indexing::dynamic_slice(e, args, sizes, size),
        Op::DynamicUpdateSlice => indexing::dynamic_update_slice(e, args, size),
        Op::Random { dist, dtype, shape } => indexing::random(e, args, *dist, *dtype, shape.as_deref(), size),
        Op::Spatial(sp) => indexing::spatial(e, sp, args, size),
        Op::Call { func } => {
            let callee = graph.library.try_get(*func).ok_or_else(|| {
                BatchError::Request(format!("a call of {func} that `{}`'s library does not hold", graph.name))
            })?;
            super::batch_values(e, &callee.graph.clone(), args, size)
        }
        Op::Fused { body } => super::batch_values(e, body, args, size),
        Op::Cond { branches } => control::cond(e, branches, args, size),
        Op::While { parts, trip_count, cancel } => control::while_loop(e, parts, *trip_count, cancel, args, size),
        Op::Kernel { .. } => kernel(e, op, args, size),
        Op::ReadVariable { var, .. } => {
            let resource =
                graph.variables.get(*var).cloned().ok_or_else(|| {
                    BatchError::Request(format!("a read of {var} that `{}` does not hold", graph.name))
                })?;
            Ok(vec![(e.read_variable(&resource)?, None)])
        }
        // A generator's advance, the same for every example, is written
        // once per call (its draws cover the batch); any other write would
        // be one per example.
        Op::AssignVariable { var, kind, .. } => match (args[0].1, graph.variables.get(*var)) {
            (None, Some(resource)) if resource.is_random_state() => {
                e.assign_variable(resource, *kind, args[0].0.clone())?;
                Ok(Vec::new())
            }
            (_, resource) => Err(BatchError::Unsupported {
                op: kind.name().into(),
                message: format!(
                    "a write of variable `{}` inside vmap (each example would write its own value); return the \
                     values from the mapped function and write them after it",
                    resource.map(|v| v.name()).unwrap_or_else(|| var.to_string())
                ),
            }),
        },
    }
}

/// A native kernel: one call on the batch when it maps over a leading
/// axis, else refused by name.
fn kernel<E: BatchEmitter>(
    e: &mut E,
    op: &Op,
    args: &[Batched<E::Value>],
    size: Option<usize>,
) -> R<Vec<Batched<E::Value>>> {
    let Op::Kernel { name, kernel, outputs, .. } = op else {
        return Err(BatchError::Request(format!("`{}` is not a kernel (a bug in tracejit)", op.name())));
    };
    if !kernel.maps_leading_axis() {
        return Err(BatchError::Unsupported {
            op: format!("kernel {name}"),
            message: "a native kernel has no batch axis; vmap the function before its composites are replaced by \
                      kernels (a traced function called inside vmap is batched through its optimized graph: \
                      call the closure itself instead)"
                .into(),
        });
    }
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let mut values = Vec::with_capacity(args.len());
    for (v, b) in args {
        values.push(materialize(e, v.clone(), *b, size)?);
    }
    let inputs = values.iter().map(|v| e.value_type(v)).collect();
    let outputs = outputs
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.dims.insert(0, size);
            t
        })
        .collect();
    let op = Op::Kernel { name: name.clone(), kernel: kernel.clone(), inputs, outputs };
    Ok(e.emit(op, &values)?.into_iter().map(|v| (v, Some(0))).collect())
}

/// Ops that compute the same for every example when no operand is
/// mapped, so run once, unmapped. Calls resolve against their graph's library and
/// variable accesses go through the emitter, so those have rules.
fn is_stateless(op: &Op) -> bool {
    match op {
        // A draw from a generator's state differs per example even when
        // nothing is mapped (`indexing::random`).
        Op::Call { .. } | Op::ReadVariable { .. } | Op::AssignVariable { .. } | Op::Random { .. } => false,
        Op::Parameter { .. } | Op::Constant { .. } => false,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::Clamp { .. }
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::MatMul
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::BroadcastTo { .. }
        | Op::ExpandDims { .. }
        | Op::Squeeze { .. }
        | Op::Concat { .. }
        | Op::Stack { .. }
        | Op::Slice { .. }
        | Op::Gather { .. }
        | Op::OneHot { .. }
        | Op::GatherElements { .. }
        | Op::ScatterAdd { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::Pad { .. }
        | Op::Cumsum { .. }
        | Op::TopK { .. }
        | Op::Spatial(_)
        | Op::Fused { .. }
        | Op::Cond { .. }
        | Op::While { .. }
        | Op::Kernel { .. } => true,
    }
}

/// A one-operand op whose axes were shifted past a leading batch axis.
fn unary_front<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    size: Option<usize>,
    shifted: Op,
) -> R<Vec<Batched<E::Value>>> {
    let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
    Ok(vec![(emit1(e, shifted, &[x])?, Some(0))])
}

/// An op whose every operand needs the batch axis at the front.
fn all_front<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    size: Option<usize>,
    shifted: Op,
) -> R<Vec<Batched<E::Value>>> {
    let size = args.iter().find_map(|(v, b)| b.and_then(|a| e.value_type(v).dims[a])).or(size);
    let mut values = Vec::with_capacity(args.len());
    for (v, b) in args {
        values.push(materialize(e, v.clone(), *b, size)?);
    }
    Ok(vec![(emit1(e, shifted, &values)?, Some(0))])
}

/// Elementwise ops with numpy broadcasting (`binary`, `select`): mapped
/// operands get their batch axis in front and unit axes up to the widest
/// operand's rank; unmapped ones broadcast as they are. The result's batch
/// axis is 0.
pub(super) fn broadcasting<E: BatchEmitter>(e: &mut E, op: &Op, args: &[Batched<E::Value>]) -> R<E::Value> {
    let out_rank = args.iter().map(|(v, b)| example_rank(e, v, *b)).max().unwrap_or(0);
    let mut values = Vec::with_capacity(args.len());
    for (v, b) in args {
        let r = example_rank(e, v, *b);
        values.push(match b {
            Some(axis) => {
                let front = to_front(e, v.clone(), *axis)?;
                insert_units(e, front, 1, out_rank - r)?
            }
            None => v.clone(),
        });
    }
    emit1(e, op.clone(), &values)
}

/// `a @ b` per example: the batch axis leads the product's batch axes (unit
/// axes line the operands' ranks up), so a mapped operand times a shared
/// one is one GEMM over every example's rows, and two mapped operands one
/// batched GEMM.
fn matmul<E: BatchEmitter>(e: &mut E, args: &[Batched<E::Value>]) -> R<E::Value> {
    let ranks: Vec<usize> = args.iter().map(|(v, b)| example_rank(e, v, *b)).collect();
    let widest = ranks[0].max(ranks[1]);
    let mut values = Vec::with_capacity(2);
    for ((v, b), r) in args.iter().zip(&ranks) {
        values.push(match b {
            Some(axis) => {
                let front = to_front(e, v.clone(), *axis)?;
                insert_units(e, front, 1, widest - r)?
            }
            None => v.clone(),
        });
    }
    emit1(e, Op::MatMul, &values)
}

/// A reshape of each example: the batch axis leads the new shape. A `-1`
/// in the target is resolved from the example's element count (so an
/// empty batch reshapes as each example would); with that count unknown
/// the batch size must be known, as two `-1`s cannot be reshaped.
fn reshape<E: BatchEmitter>(e: &mut E, args: &[Batched<E::Value>], shape: &[i64], size: Option<usize>) -> R<E::Value> {
    let x = materialize(e, args[0].0.clone(), args[0].1, size)?;
    let ty = e.value_type(&x);
    let mut target: Vec<i64> = shape.to_vec();
    let count: Option<usize> = ty.dims[1..].iter().try_fold(1usize, |acc, d| d.map(|d| acc * d));
    let known: i64 = target.iter().filter(|&&d| d != -1).product();
    if let (Some(at), Some(n)) = (target.iter().position(|&d| d == -1), count) {
        if known > 0 {
            target[at] = n as i64 / known;
        }
    }
    let lead = match ty.dims[0] {
        Some(b) => b as i64,
        None if !target.contains(&-1) => -1,
        None => return Err(BatchError::UnknownSize { what: format!("a reshape to {shape:?}") }),
    };
    target.insert(0, lead);
    emit1(e, Op::Reshape { shape: target }, &[x])
}

/// A broadcast of each example to `shape`: unit axes after the batch axis
/// up to the target's rank, then a broadcast to `[batch, shape..]`.
fn broadcast_to<E: BatchEmitter>(
    e: &mut E,
    args: &[Batched<E::Value>],
    shape: &[usize],
    size: Option<usize>,
) -> R<E::Value> {
    let (v, b) = args[0].clone();
    let r = example_rank(e, &v, b);
    let x = front_if_mapped(e, v, b)?;
    let batch = front_size(e, &x, size).ok_or_else(|| BatchError::UnknownSize { what: "a broadcast_to".into() })?;
    let x = insert_units(e, x, 1, shape.len().saturating_sub(r))?;
    debug_assert_eq!(rank(e, &x), shape.len() + 1);
    let target = std::iter::once(batch).chain(shape.iter().copied()).collect();
    emit1(e, Op::BroadcastTo { shape: target }, &[x])
}
