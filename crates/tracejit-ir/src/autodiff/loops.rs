//! Reverse mode through a loop with a static trip count (`fori_loop`), as
//! loops: tracing it costs the same for 10 trips or 10^9.
//!
//! The VJP emits two `while` nodes (JAX's `scan` transpose does the same):
//!
//! 1. a **forward** loop replays the body and stacks what the backward
//!    needs from every trip: the carried values entering it (and the
//!    values of the variables the body assigns, which the body carries
//!    too), each into a buffer `[trips, ...]` allocated once;
//! 2. a **backward** loop walks the trips in reverse: trip `t` reads row
//!    `t` of each buffer (a `gather` with the counter, which executors run
//!    as a view), replays the body on it and differentiates it
//!    ([`super::vjp_graph`]), carrying the cotangents of the carried values
//!    and summing those of the captured values and of the variables read
//!    (a read's cotangent goes to the variable, never into a value
//!    assigned before it, as elsewhere).
//!
//! The buffers need `trips` times the loop state's bytes: that is checked
//! before anything is emitted, and a size that cannot be allocated is an
//! [`AutodiffError`] naming it (a loop of 2^40 trips asked the allocator
//! for 52 TB and aborted the process), never an abort.
//!
//! A row is written into its buffer with `dynamic_update_slice` (a
//! one-hot mask and a `select` computed over the whole buffer every trip
//! before). The JIT runs that write in place when the buffer dies at it
//! and is owned, which a loop body's carried parameter is not yet: each
//! trip still copies the stack, O(trips^2) bytes in all, at memcpy speed.

use std::sync::Arc;

use tracejit_tensor::{BinaryOp, DType};

use super::{replay_state, scalar, vjp_graph, zeros_like, AutodiffError, Emitter, GraphEmitter};
use crate::{Graph, Op, TensorType, ValueId, VarId};

type R<T> = Result<T, AutodiffError>;

/// The loop and the values a VJP of it works with.
pub(super) struct LoopVjp<'a, V> {
    /// The body, calls inlined: `(carried..., captured...) -> carried`.
    pub body: &'a Graph,
    /// The static trip count (at least 1).
    pub trips: usize,
    /// The loop node's inputs: carried, then captured.
    pub inputs: &'a [V],
    /// The cotangents of the loop's outputs (the final carried values).
    pub cotangents: &'a [Option<V>],
    /// The body's variables paired with their values before the loop.
    pub bound: &'a [(VarId, V)],
}

/// The types the loops are built from.
struct Layout {
    carried: Vec<TensorType>,
    captured: Vec<TensorType>,
    /// Variables the body assigns: carried by the forward loop, stacked.
    written: Vec<(VarId, TensorType)>,
    /// Variables it only reads: captured.
    read: Vec<(VarId, TensorType)>,
}

impl Layout {
    /// The values stacked per trip: the carried ones, then the written
    /// variables'.
    fn stacked(&self) -> Vec<TensorType> {
        self.carried.iter().cloned().chain(self.written.iter().map(|(_, t)| t.clone())).collect()
    }
}

/// The cotangents of the loop's inputs and of its bound variables (aligned
/// with `l.bound`), from the two loops described in the module docs.
#[allow(clippy::type_complexity)]
pub(super) fn loop_vjp<E: Emitter>(
    e: &mut E,
    l: &LoopVjp<'_, E::Value>,
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    let n_carried = l.body.outputs.len();
    let ty = |e: &E, v: &E::Value| e.value_type(v);
    let writes =
        |var: VarId| l.body.nodes().any(|(_, n)| matches!(n.op, Op::AssignVariable { var: w, .. } if w == var));
    let layout = Layout {
        carried: l.inputs[..n_carried].iter().map(|v| ty(e, v)).collect(),
        captured: l.inputs[n_carried..].iter().map(|v| ty(e, v)).collect(),
        written: l.bound.iter().filter(|(v, _)| writes(*v)).map(|(v, x)| (*v, ty(e, x))).collect(),
        read: l.bound.iter().filter(|(v, _)| !writes(*v)).map(|(v, x)| (*v, ty(e, x))).collect(),
    };
    check_memory(l.trips, &layout.stacked())?;
    let stacks = forward(e, l, &layout)?;
    backward(e, l, &layout, stacks)
}

/// Refuses a loop whose stacked state cannot be allocated: `trips` times
/// the bytes of one trip's state (unknown dims counted as 1, the least
/// they can be; the executor checks the rest when it allocates).
fn check_memory(trips: usize, stacked: &[TensorType]) -> R<()> {
    let mut per_trip: usize = 0;
    for t in stacked {
        let elements = t.dims.iter().try_fold(1usize, |n, d| n.checked_mul(d.unwrap_or(1)));
        let bytes = elements.and_then(|n| n.checked_mul(t.dtype.size_of()));
        per_trip = match bytes.and_then(|b| per_trip.checked_add(b)) {
            Some(b) => b,
            None => return Err(too_large(trips, None, None)),
        };
    }
    let Some(total) = per_trip.checked_mul(trips) else { return Err(too_large(trips, Some(per_trip), None)) };
    if total >= tracejit_tensor::PROBE_BYTES {
        let mut probe: Vec<u8> = Vec::new();
        if probe.try_reserve_exact(total).is_err() {
            return Err(too_large(trips, Some(per_trip), Some(total)));
        }
    }
    Ok(())
}

fn too_large(trips: usize, per_trip: Option<usize>, total: Option<usize>) -> AutodiffError {
    let size = match (per_trip, total) {
        (Some(p), Some(t)) => format!("{trips} trips x {p} bytes = {t} bytes"),
        (Some(p), None) => format!("{trips} trips x {p} bytes, more than the address space"),
        (None, _) => format!("{trips} trips of a state larger than the address space"),
    };
    AutodiffError::Unsupported {
        op: "while".into(),
        message: format!(
            "reverse mode through this fori_loop keeps the loop state of every trip ({size}), which cannot be \
             allocated; run fewer trips per loop"
        ),
    }
}

/// A scalar `i64` constant.
fn int<E: Emitter>(e: &mut E, v: i64) -> E::Value {
    scalar(e, DType::I64, v as f64)
}

fn one<E: Emitter>(e: &mut E, op: Op, inputs: &[E::Value]) -> R<E::Value> {
    Ok(e.emit(op, inputs)?.remove(0))
}

/// Zeros of `[trips, ...x's shape]`, x's dtype (its shape at run time
/// when the trace does not know it).
fn zero_stack<E: Emitter>(e: &mut E, x: &E::Value, trips: usize) -> R<E::Value> {
    let t = e.value_type(x);
    if let Some(shape) = t.shape() {
        let zero = scalar(e, t.dtype, 0.0);
        let mut full = vec![trips];
        full.extend(shape);
        return one(e, Op::BroadcastTo { shape: full }, &[zero]);
    }
    let zeros = zeros_like(e, x.clone())?;
    let row = one(e, Op::ExpandDims { axis: 0 }, &[zeros])?;
    let zero = int(e, 0);
    let index = one(e, Op::BroadcastTo { shape: vec![trips] }, &[zero])?;
    one(e, Op::Gather { axis: 0 }, &[row, index])
}

/// `stack` with row `k` replaced by `x`: a `dynamic_update_slice` at
/// `[k, 0, ..]`.
fn write_row(g: &mut GraphEmitter<'_>, stack: ValueId, x: ValueId, k: ValueId) -> R<ValueId> {
    let rank = g.value_type(&x).rank();
    let row = one(g, Op::ExpandDims { axis: 0 }, &[x])?;
    let mut starts = vec![k];
    for _ in 0..rank {
        starts.push(int(g, 0));
    }
    let starts = one(g, Op::Stack { axis: 0 }, &starts)?;
    one(g, Op::DynamicUpdateSlice, &[stack, row, starts])
}

/// The condition of both loops: `(k, ...) -> k < trips`, `k` the param at
/// `counter` of a graph with `params`.
fn below(params: &[TensorType], counter: usize, trips: usize) -> R<Graph> {
    let mut g = Graph::new("vjp.cond");
    let ps: Vec<ValueId> = params.iter().map(|t| g.add_param(t.clone())).collect();
    let mut ge = GraphEmitter { graph: &mut g };
    let n = int(&mut ge, trips as i64);
    let out = one(&mut ge, Op::Binary(BinaryOp::Lt), &[ps[counter], n])?;
    g.outputs = vec![out];
    Ok(g)
}

/// The forward loop; returns the stacks (carried values, then written
/// variables), each `[trips, ...]`.
fn forward<E: Emitter>(e: &mut E, l: &LoopVjp<'_, E::Value>, layout: &Layout) -> R<Vec<E::Value>> {
    let (nc, nw) = (layout.carried.len(), layout.written.len());
    let stacked = layout.stacked();
    // Params: carried, written, k, stacks, captured, read.
    let mut params: Vec<TensorType> = stacked.clone();
    params.push(TensorType::known(DType::I64, &[]));
    params.extend(stacked.iter().map(|t| stacked_type(t, l.trips)));
    params.extend(layout.captured.iter().cloned());
    params.extend(layout.read.iter().map(|(_, t)| t.clone()));
    let mut g = Graph::new(format!("{}.vjp_forward", l.body.name));
    let ps: Vec<ValueId> = params.iter().map(|t| g.add_param(t.clone())).collect();
    let (state, rest) = ps.split_at(nc + nw);
    let (k, rest) = (rest[0], &rest[1..]);
    let (stacks, rest) = rest.split_at(nc + nw);
    let (captured, read) = rest.split_at(layout.captured.len());
    let mut ge = GraphEmitter { graph: &mut g };
    let mut inputs: Vec<ValueId> = state[..nc].to_vec();
    inputs.extend_from_slice(captured);
    let vars: Vec<(VarId, ValueId)> = layout
        .written
        .iter()
        .zip(&state[nc..])
        .map(|((v, _), x)| (*v, *x))
        .chain(layout.read.iter().zip(read).map(|((v, _), x)| (*v, *x)))
        .collect();
    // `after` lists the variables in `vars`' order, the written ones first.
    let (vals, after) = replay_state(&mut ge, l.body, &inputs, &vars)?;
    let mut outs: Vec<ValueId> = l.body.outputs.iter().map(|o| vals[o]).collect();
    outs.extend(after[..nw].iter().map(|(_, x)| *x));
    let step = int(&mut ge, 1);
    outs.push(one(&mut ge, Op::Binary(BinaryOp::Add), &[k, step])?);
    for (s, x) in stacks.iter().zip(state) {
        outs.push(write_row(&mut ge, *s, *x, k)?);
    }
    g.outputs = outs;
    let cond = below(&params, nc + nw, l.trips)?;
    // Initial values, in the params' order up to the captured ones.
    let mut args: Vec<E::Value> = l.inputs[..nc].to_vec();
    for (v, _) in &layout.written {
        args.push(bound_value(l, *v));
    }
    args.push(int(e, 0));
    for i in 0..nc + nw {
        let like = args[i].clone();
        args.push(zero_stack(e, &like, l.trips)?);
    }
    args.extend_from_slice(&l.inputs[nc..]);
    for (v, _) in &layout.read {
        args.push(bound_value(l, *v));
    }
    let op = Op::While { parts: [Arc::new(cond), Arc::new(g)], trip_count: Some(l.trips), cancel: None };
    let outs = e.emit(op, &args)?;
    Ok(outs[nc + nw + 1..].to_vec())
}

fn stacked_type(t: &TensorType, trips: usize) -> TensorType {
    let mut dims = vec![Some(trips)];
    dims.extend(t.dims.iter().copied());
    TensorType { dtype: t.dtype, dims: dims.into_iter().collect() }
}

fn bound_value<V: Clone>(l: &LoopVjp<'_, V>, var: VarId) -> V {
    l.bound.iter().find(|(v, _)| *v == var).map(|(_, x)| x.clone()).expect("the variable is bound")
}

/// Which inputs and variables get cotangents: float ones.
struct Flows {
    /// Indices of the float carried values.
    carried: Vec<usize>,
    /// Indices of the float captured values.
    captured: Vec<usize>,
    /// Indices into `bound` of the float variables.
    vars: Vec<usize>,
}

/// The backward loop, from the forward loop's `stacks`.
#[allow(clippy::type_complexity)]
fn backward<E: Emitter>(
    e: &mut E,
    l: &LoopVjp<'_, E::Value>,
    layout: &Layout,
    stacks: Vec<E::Value>,
) -> R<(Vec<Option<E::Value>>, Vec<Option<E::Value>>)> {
    let float = |t: &TensorType| t.dtype.is_float();
    let flows = Flows {
        carried: (0..layout.carried.len()).filter(|&i| float(&layout.carried[i])).collect(),
        captured: (0..layout.captured.len()).filter(|&i| float(&layout.captured[i])).collect(),
        vars: (0..l.bound.len()).filter(|&i| float(&e.value_type(&l.bound[i].1))).collect(),
    };
    let g = backward_body(l, layout, &flows)?;
    let cond = below(&g.param_types(), 0, l.trips)?;
    // Initial values: k, carried cotangents, accumulators; then captured.
    let mut args: Vec<E::Value> = vec![int(e, 0)];
    for &i in &flows.carried {
        args.push(match l.cotangents.get(i).cloned().flatten() {
            Some(ct) => ct,
            None => zeros_like(e, l.inputs[i].clone())?,
        });
    }
    let nc = layout.carried.len();
    for &j in &flows.captured {
        args.push(zeros_like(e, l.inputs[nc + j].clone())?);
    }
    for &b in &flows.vars {
        args.push(zeros_like(e, l.bound[b].1.clone())?);
    }
    args.extend(stacks);
    args.extend_from_slice(&l.inputs[nc..]);
    for (v, _) in &layout.read {
        args.push(bound_value(l, *v));
    }
    let op = Op::While { parts: [Arc::new(cond), Arc::new(g)], trip_count: Some(l.trips), cancel: None };
    let outs = e.emit(op, &args)?;
    let mut in_cts: Vec<Option<E::Value>> = vec![None; l.inputs.len()];
    let mut at = 1;
    for &i in &flows.carried {
        in_cts[i] = Some(outs[at].clone());
        at += 1;
    }
    for &j in &flows.captured {
        in_cts[nc + j] = Some(outs[at].clone());
        at += 1;
    }
    let mut var_cts: Vec<Option<E::Value>> = vec![None; l.bound.len()];
    for &b in &flows.vars {
        var_cts[b] = Some(outs[at].clone());
        at += 1;
    }
    Ok((in_cts, var_cts))
}

/// The backward loop's body: `(k, carried cotangents, captured sums,
/// variable sums, stacks, captured, read variables)` to the next
/// `(k, carried cotangents, captured sums, variable sums)`.
fn backward_body<V>(l: &LoopVjp<'_, V>, layout: &Layout, flows: &Flows) -> R<Graph> {
    let (nc, nw) = (layout.carried.len(), layout.written.len());
    let mut g = Graph::new(format!("{}.vjp_backward", l.body.name));
    let k = g.add_param(TensorType::known(DType::I64, &[]));
    let cts: Vec<ValueId> = flows.carried.iter().map(|&i| g.add_param(layout.carried[i].clone())).collect();
    let cap_sums: Vec<ValueId> = flows.captured.iter().map(|&j| g.add_param(layout.captured[j].clone())).collect();
    let var_types: Vec<TensorType> = flows.vars.iter().map(|&b| var_type(layout, l.bound[b].0)).collect();
    let var_sums: Vec<ValueId> = var_types.iter().map(|t| g.add_param(t.clone())).collect();
    let stacks: Vec<ValueId> = layout.stacked().iter().map(|t| g.add_param(stacked_type(t, l.trips))).collect();
    let captured: Vec<ValueId> = layout.captured.iter().map(|t| g.add_param(t.clone())).collect();
    let read: Vec<ValueId> = layout.read.iter().map(|(_, t)| g.add_param(t.clone())).collect();
    let mut ge = GraphEmitter { graph: &mut g };
    // Trip t = trips - 1 - k: its state is row t of each stack.
    let last = int(&mut ge, l.trips as i64 - 1);
    let t = one(&mut ge, Op::Binary(BinaryOp::Sub), &[last, k])?;
    let mut rows = Vec::with_capacity(nc + nw);
    for s in &stacks {
        rows.push(one(&mut ge, Op::Gather { axis: 0 }, &[*s, t])?);
    }
    let mut inputs: Vec<ValueId> = rows[..nc].to_vec();
    inputs.extend_from_slice(&captured);
    let vars: Vec<(VarId, ValueId)> = layout
        .written
        .iter()
        .zip(&rows[nc..])
        .map(|((v, _), x)| (*v, *x))
        .chain(layout.read.iter().zip(&read).map(|((v, _), x)| (*v, *x)))
        .collect();
    let mut seeds: Vec<Option<ValueId>> = vec![None; nc];
    for (&i, &ct) in flows.carried.iter().zip(&cts) {
        seeds[i] = Some(ct);
    }
    let (in_cts, var_cts) = vjp_graph(&mut ge, l.body, &inputs, &vars, &seeds)?;
    let step = int(&mut ge, 1);
    let mut outs = vec![one(&mut ge, Op::Binary(BinaryOp::Add), &[k, step])?];
    for &i in &flows.carried {
        outs.push(match in_cts[i] {
            Some(ct) => ct,
            None => zeros_like(&mut ge, rows[i])?,
        });
    }
    for (&j, &sum) in flows.captured.iter().zip(&cap_sums) {
        outs.push(match in_cts[nc + j] {
            Some(ct) => one(&mut ge, Op::Binary(BinaryOp::Add), &[sum, ct])?,
            None => sum,
        });
    }
    for (&b, &sum) in flows.vars.iter().zip(&var_sums) {
        let var = l.bound[b].0;
        let ct = vars.iter().position(|(v, _)| *v == var).and_then(|p| var_cts[p]);
        outs.push(match ct {
            Some(ct) => one(&mut ge, Op::Binary(BinaryOp::Add), &[sum, ct])?,
            None => sum,
        });
    }
    g.outputs = outs;
    Ok(g)
}

/// The type of a bound variable's value.
fn var_type(layout: &Layout, var: VarId) -> TensorType {
    layout.written.iter().chain(&layout.read).find(|(v, _)| *v == var).map(|(_, t)| t.clone()).expect("bound")
}
