//! Reverse mode through control flow.
//!
//! - **`cond`**: the cotangent of a conditional is a conditional of the
//!   branches' VJPs. Each backward branch takes the operands, the values of
//!   the variables the branches read, and the cotangents of the float
//!   outputs, replays its forward and returns dense cotangents (zeros where
//!   its branch does not use an operand), so both branches return the same
//!   types. Only the branch the forward took runs in the backward.
//! - **`while` with a static trip count** (`fori_loop`): two loops, a
//!   forward one stacking each trip's state and a backward one walking the
//!   trips in reverse (`loops`), so tracing costs the same for any trip
//!   count and a state too large to stack is an error, not an abort. A
//!   body calling a custom-gradient function (whose backward is a Rust
//!   closure, which cannot go into a graph) is unrolled instead, up to
//!   `UNROLL_CUSTOM_GRADIENTS` trips.
//! - **`while` with a data-dependent trip count** refuses reverse mode, as
//!   JAX does: how many iterations to undo is not known until run time.
//!
//! Variables read inside the subgraphs need their values (`variables`, by
//! resource id): the gradient tape reads them around the node and receives
//! their cotangents. Without them (a conditional nested in other code) a
//! read is an error, never a silently missing gradient.

use std::collections::HashMap;
use std::sync::Arc;

use super::loops::{loop_vjp, LoopVjp};
use super::{accumulate, backprop_replayed, replay, vjp_graph, zeros_like, AutodiffError, Emitter, GraphEmitter};
use crate::passes::{Inline, Pass, PassContext};
use crate::{primitive_ops, Graph, Op, TensorType, ValueId, VarId, VariableResource};

type R<T> = Result<T, AutodiffError>;

/// The cotangents of a `cond` or `while` node's inputs (`None` for the
/// predicate and non-float values) and of the variables its subgraphs
/// read, given their values in `variables` (resource id, value); the second
/// result is aligned with `variables`.
#[allow(clippy::type_complexity)]
pub fn vjp_control<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    variables: &[(u64, E::Value)],
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    match op {
        Op::Cond { branches } => cond_vjp(e, branches, inputs, outputs, cotangents, variables),
        Op::While { parts, trip_count: Some(n), .. } => while_vjp(e, &parts[1], *n, inputs, cotangents, variables),
        Op::While { trip_count: None, .. } => Err(AutodiffError::Unsupported {
            op: "while".into(),
            message: "reverse-mode differentiation needs a static trip count, and this loop's depends on the data \
                      it computes; write it with fori_loop (a static trip count), as JAX requires"
                .into(),
        }),
        Op::Parameter { .. }
        | Op::Constant { .. }
        | primitive_ops!()
        | Op::Call { .. }
        | Op::Fused { .. }
        | Op::Kernel { .. }
        | Op::ReadVariable { .. }
        | Op::AssignVariable { .. } => {
            Err(AutodiffError::Request(format!("vjp_control: `{}` is not control flow", op.name())))
        }
    }
}

/// The variables the subgraphs of a `cond` or `while` read (one entry per
/// variable): what [`vjp_control`] needs values for.
pub fn control_variables(op: &Op) -> Vec<Arc<dyn VariableResource>> {
    let mut out: Vec<Arc<dyn VariableResource>> = Vec::new();
    for g in op.subgraphs() {
        for (vid, res) in g.variables.iter() {
            if reads(g, vid) && !out.iter().any(|o| o.id() == res.id()) {
                out.push(res.clone());
            }
        }
    }
    out
}

fn reads(g: &Graph, var: VarId) -> bool {
    g.nodes().any(|(_, n)| matches!(n.op, Op::ReadVariable { var: v, .. } if v == var))
}

/// `g` with its calls inlined (the VJP rules differentiate primitives),
/// except custom-gradient calls: their body's VJP is not their gradient, so
/// they stay and the emitter refuses them by name rather than give a wrong
/// number.
fn inlined(g: &Graph) -> Graph {
    let mut g = g.clone();
    if g.nodes().any(|(_, n)| matches!(n.op, Op::Call { .. })) {
        let cx = PassContext { keep_custom_gradients: true, ..PassContext::new(g.name.clone()) };
        Inline.run(&mut g, &cx);
    }
    g
}

/// The graph's variables paired with the value standing for each, looked
/// up by resource id in `given`; a variable the graph reads without a
/// given value is an error.
fn bind_variables<V: Clone>(g: &Graph, given: &[(u64, V)], what: &str) -> R<Vec<(VarId, V)>> {
    let mut out = Vec::new();
    for (vid, res) in g.variables.iter() {
        match given.iter().find(|(id, _)| *id == res.id()) {
            Some((_, v)) => out.push((vid, v.clone())),
            None if reads(g, vid) => {
                return Err(AutodiffError::Unsupported {
                    op: what.into(),
                    message: format!(
                        "it reads variable `{}` inside a subgraph with no value given for it; differentiate \
                         it with a GradientTape around the {what} itself",
                        res.name()
                    ),
                })
            }
            None => {}
        }
    }
    Ok(out)
}

#[allow(clippy::type_complexity)]
fn cond_vjp<E: Emitter>(
    e: &mut E,
    branches: &[Arc<Graph>; 2],
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    variables: &[(u64, E::Value)],
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    let operands = &inputs[1..];
    // Dense cotangents of the float outputs: both backward branches take
    // the same arguments.
    let mut cts: Vec<(usize, E::Value)> = Vec::new();
    for (j, o) in outputs.iter().enumerate() {
        if !e.value_type(o).dtype.is_float() {
            continue;
        }
        let ct = match cotangents.get(j).cloned().flatten() {
            Some(ct) => ct,
            None => zeros_like(e, o.clone())?,
        };
        cts.push((j, ct));
    }
    let float_operands: Vec<usize> =
        (0..operands.len()).filter(|&i| e.value_type(&operands[i]).dtype.is_float()).collect();
    if cotangents.iter().all(Option::is_none) || float_operands.is_empty() && variables.is_empty() {
        return Ok((vec![None; inputs.len()], vec![None; variables.len()]));
    }
    let sig = Signature {
        operands: operands.iter().map(|v| e.value_type(v)).collect(),
        variables: variables.iter().map(|(id, v)| (*id, e.value_type(v))).collect(),
        cotangents: cts.iter().map(|(j, v)| (*j, e.value_type(v))).collect(),
        float_operands: float_operands.clone(),
    };
    let backward = [backward_branch(&branches[0], &sig)?, backward_branch(&branches[1], &sig)?];
    let mut args: Vec<E::Value> = inputs.to_vec();
    args.extend(variables.iter().map(|(_, v)| v.clone()));
    args.extend(cts.into_iter().map(|(_, v)| v));
    let outs = e.emit(Op::Cond { branches: backward.map(Arc::new) }, &args)?;
    let mut in_cts: Vec<Option<E::Value>> = vec![None; inputs.len()];
    for (k, &i) in float_operands.iter().enumerate() {
        in_cts[1 + i] = Some(outs[k].clone());
    }
    let var_cts = outs[float_operands.len()..].iter().cloned().map(Some).collect();
    Ok((in_cts, var_cts))
}

/// What a backward branch takes and returns.
struct Signature {
    operands: Vec<TensorType>,
    /// Resource id and type of each variable value passed in.
    variables: Vec<(u64, TensorType)>,
    /// Output index and type of each cotangent passed in.
    cotangents: Vec<(usize, TensorType)>,
    /// Operands that get a cotangent.
    float_operands: Vec<usize>,
}

/// The VJP of one branch as a graph: `(operands..., variables...,
/// cotangents...) -> (operand cotangents..., variable cotangents...)`.
fn backward_branch(branch: &Graph, sig: &Signature) -> R<Graph> {
    let branch = inlined(branch);
    let mut g = Graph::new(format!("{}.vjp", branch.name));
    let xs: Vec<ValueId> = sig.operands.iter().map(|t| g.add_param(t.clone())).collect();
    let vs: Vec<(u64, ValueId)> = sig.variables.iter().map(|(id, t)| (*id, g.add_param(t.clone()))).collect();
    let mut cot: Vec<Option<ValueId>> = vec![None; branch.outputs.len()];
    for (j, t) in &sig.cotangents {
        let p = g.add_param(t.clone());
        if let Some(slot) = cot.get_mut(*j) {
            *slot = Some(p);
        }
    }
    let bound = bind_variables(&branch, &vs, "cond")?;
    let mut ge = GraphEmitter { graph: &mut g };
    let (in_cts, var_cts) = vjp_graph(&mut ge, &branch, &xs, &bound, &cot)?;
    let mut outs = Vec::new();
    for &i in &sig.float_operands {
        outs.push(match in_cts[i] {
            Some(ct) => ct,
            None => zeros_like(&mut ge, xs[i])?,
        });
    }
    for (id, v) in &vs {
        let ct =
            bound.iter().zip(&var_cts).find(|((vid, _), _)| branch.variables[*vid].id() == *id).and_then(|(_, ct)| *ct);
        outs.push(match ct {
            Some(ct) => ct,
            None => zeros_like(&mut ge, *v)?,
        });
    }
    g.outputs = outs;
    Ok(g)
}

#[allow(clippy::type_complexity)]
fn while_vjp<E: Emitter>(
    e: &mut E,
    body: &Graph,
    trips: usize,
    inputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    variables: &[(u64, E::Value)],
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    let body = inlined(body);
    let carried = body.outputs.len();
    let bound = bind_variables(&body, variables, "while")?;
    if trips == 0 || cotangents.iter().all(Option::is_none) {
        // No trip: the outputs are the inputs.
        let mut in_cts: Vec<Option<E::Value>> = cotangents.to_vec();
        in_cts.resize(inputs.len(), None);
        in_cts.truncate(inputs.len());
        return Ok((in_cts, vec![None; variables.len()]));
    }
    let (in_cts, bound_cts) = if trips <= UNROLL_CUSTOM_GRADIENTS && has_custom_gradient(&body) {
        unrolled_vjp(e, &body, trips, inputs, cotangents, &bound)?
    } else {
        let cotangents = &cotangents[..carried.min(cotangents.len())];
        loop_vjp(e, &LoopVjp { body: &body, trips, inputs, cotangents, bound: &bound })?
    };
    // Back to the caller's variable order.
    let var_cts = variables
        .iter()
        .map(|(id, _)| {
            bound.iter().position(|(vid, _)| body.variables[*vid].id() == *id).and_then(|k| bound_cts[k].clone())
        })
        .collect();
    Ok((in_cts, var_cts))
}

/// Trip counts up to which a loop whose body calls a custom-gradient
/// function is differentiated unrolled: the user's backward is a Rust
/// closure, which only the caller's emitter can run, so it cannot go into
/// the backward loop's graph ([`loop_vjp`]). Past this, the error says so.
const UNROLL_CUSTOM_GRADIENTS: usize = 1024;

/// True when `body` calls a custom-gradient function.
fn has_custom_gradient(body: &Graph) -> bool {
    body.nodes().any(|(_, n)| matches!(&n.op, Op::Call { func } if super::is_custom_gradient(body.library.get(*func))))
}

/// The loop's VJP unrolled: every trip replayed and differentiated with
/// the caller's emitter (which runs custom gradients); tracing grows with
/// `trips`, so only for short loops.
#[allow(clippy::type_complexity)]
fn unrolled_vjp<E: Emitter>(
    e: &mut E,
    body: &Graph,
    trips: usize,
    inputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    bound: &[(VarId, E::Value)],
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    let carried = body.outputs.len();
    // Forward: every trip's values, kept for the backward.
    let mut saved: Vec<HashMap<ValueId, E::Value>> = Vec::with_capacity(trips);
    let mut state: Vec<E::Value> = inputs[..carried].to_vec();
    for _ in 0..trips {
        let mut args = state.clone();
        args.extend_from_slice(&inputs[carried..]);
        let vals = replay(e, body, &args, bound)?;
        state = body.outputs.iter().map(|o| vals[o].clone()).collect();
        saved.push(vals);
    }
    // Backward, last trip first.
    let mut ct_state: Vec<Option<E::Value>> = cotangents.to_vec();
    ct_state.resize(carried, None);
    let mut ct_rest: HashMap<ValueId, E::Value> = HashMap::new();
    let mut var_totals: Vec<Option<E::Value>> = vec![None; bound.len()];
    for vals in saved.iter().rev() {
        if ct_state.iter().all(Option::is_none) {
            break;
        }
        let (in_cts, var_cts) = backprop_replayed(e, body, vals, bound, &ct_state)?;
        ct_state = in_cts[..carried].to_vec();
        for (i, ct) in in_cts.into_iter().enumerate().skip(carried) {
            if let Some(ct) = ct {
                // Keyed by the parameter, as `accumulate` wants a value id.
                accumulate(e, &mut ct_rest, ValueId::from(body.params[i]), ct)?;
            }
        }
        for (total, ct) in var_totals.iter_mut().zip(var_cts) {
            if let Some(ct) = ct {
                *total = Some(match total.take() {
                    Some(prev) => e.emit(Op::Binary(tracejit_tensor::BinaryOp::Add), &[prev, ct])?.remove(0),
                    None => ct,
                });
            }
        }
    }
    let mut in_cts = ct_state;
    in_cts.extend((carried..inputs.len()).map(|i| ct_rest.remove(&ValueId::from(body.params[i]))));
    Ok((in_cts, var_totals))
}
