//! `vmap` and `vmap_axes`: JAX's vectorizing map over closures.
//!
//! The closure is traced once on one example's shapes (its mapped axes
//! removed) into a graph; the IR's batching rules
//! ([`tracejit_ir::batching`]) then apply every node to the whole batch,
//! through the same op path as any tensor code: eagerly the batched ops
//! run now, inside a traced function they become nodes of its one trace,
//! under a gradient tape they are recorded. So `vmap` composes with
//! `function` (either way round), with itself, and with `grad`
//! (`vmap(grad(f))` traces the closure's forward and backward, then
//! batches both: per-example gradients from one batched graph).
//!
//! Misuse (an axis out of range, mapped sizes that differ, an op with no
//! batching rule for its operands, a variable written inside the map)
//! panics with a message naming it; inside a traced function the panic is
//! the `Err` of the call.

use std::sync::Arc;

use tracejit_ir::autodiff::{AutodiffError, Emitter};
use tracejit_ir::batching::{batch_values, place_batch_axis, BatchEmitter, BatchError, Bdim};
use tracejit_ir::{AssignKind, Op, TensorType, VariableResource};
use tracejit_tensor::{DType, Storage};

use crate::context::{self, push_context, subgraph_context};
use crate::tape::TensorEmitter;
use crate::{Tensor, Variable};

/// A function of one tensor that `vmap` accepts: a closure taking a
/// `&Tensor` or a `Tensor` (the marker `M`, [`ByRef`] or [`ByValue`], is
/// inferred).
pub trait TensorFn<M> {
    /// Calls the function.
    fn call_tensor(&self, x: &Tensor) -> Tensor;
}

/// The [`TensorFn`] marker of closures taking `&Tensor`.
pub struct ByRef;
/// The [`TensorFn`] marker of closures taking `Tensor`.
pub struct ByValue;

impl<F: Fn(&Tensor) -> Tensor> TensorFn<ByRef> for F {
    fn call_tensor(&self, x: &Tensor) -> Tensor {
        self(x)
    }
}

impl<F: Fn(Tensor) -> Tensor> TensorFn<ByValue> for F {
    fn call_tensor(&self, x: &Tensor) -> Tensor {
        self(x.clone())
    }
}

/// Maps `f` over axis 0 of its argument and its result: `vmap(f)(xs)[i]`
/// is `f(xs[i])`, computed as one batched graph (a product becomes one
/// batched GEMM, never a loop of calls).
///
/// ```
/// use tracejit_trace::{grad, vmap, Tensor};
///
/// let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]);
/// let dot = vmap(move |x: &Tensor| (x * &w).sum_all());
/// let xs = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 0.0, 1.0, 1.0], &[2, 3]);
/// assert_eq!(dot(&xs).to_vec::<f64>()?, [1.0, 5.0]);
///
/// // Per-example gradients of a loss, from one trace of its backward.
/// let per_example = vmap(grad(|x: &Tensor| (x * x).sum_all()));
/// assert_eq!(per_example(&xs).to_vec::<f64>()?, [2.0, 0.0, 0.0, 0.0, 2.0, 2.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
///
/// When the argument is a scalar (no axis to map), or the function uses
/// an op it cannot batch (named in the message).
pub fn vmap<M, F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone
where
    F: TensorFn<M> + Clone,
{
    move |x: &Tensor| {
        let call = |xs: Vec<Tensor>| vec![f.call_tensor(&xs[0])];
        batch_call("vmap", &call, vec![x.clone()], &[Some(0)], &[0]).remove(0)
    }
}

/// Maps `f` over axis `in_axes[i]` of its `i`-th argument (`None`: the
/// argument is shared by every example) and puts the batch axis of its
/// `j`-th result at `out_axes[j]` (`jax.vmap(f, in_axes, out_axes)`).
///
/// ```
/// use tracejit_trace::{vmap_axes, Tensor};
///
/// // A batch of vectors times one shared matrix, the batch in axis 1.
/// let f = vmap_axes(|xs: Vec<Tensor>| vec![xs[0].reshape(&[1, 2]).matmul(&xs[1])], &[Some(1), None], &[0]);
/// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]); // columns (1, 3) and (2, 4)
/// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2]);
/// let out = f(vec![xs, w]);
/// assert_eq!((out[0].shape(), out[0].to_vec::<f32>()?), (&[2usize, 1, 2][..], vec![1.0, 3.0, 2.0, 4.0]));
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
///
/// When `in_axes` has not one entry per argument, `out_axes` not one per
/// result, an axis is out of range, no argument is mapped, or the mapped
/// axes' sizes differ; messages name the argument and both sides.
pub fn vmap_axes<F>(f: F, in_axes: &[Option<usize>], out_axes: &[usize]) -> impl Fn(Vec<Tensor>) -> Vec<Tensor> + Clone
where
    F: Fn(Vec<Tensor>) -> Vec<Tensor> + Clone,
{
    let in_axes = in_axes.to_vec();
    let out_axes = out_axes.to_vec();
    move |xs: Vec<Tensor>| batch_call("vmap_axes", &f, xs, &in_axes, &out_axes)
}

/// The batch size of the mapped arguments (`None` when unknown in the
/// trace) and each argument's per-example type; panics on misuse.
fn example_types(what: &str, xs: &[Tensor], in_axes: &[Bdim]) -> (Option<usize>, Vec<TensorType>) {
    assert!(
        xs.len() == in_axes.len(),
        "{what}: expected {} arguments (one per in_axes entry), got {}",
        in_axes.len(),
        xs.len()
    );
    assert!(in_axes.iter().any(Option::is_some), "{what}: in_axes maps no argument (every entry is None)");
    let mut size: Option<(usize, usize)> = None;
    let mut types = Vec::with_capacity(xs.len());
    for (i, (x, axis)) in xs.iter().zip(in_axes).enumerate() {
        let mut ty = x.tensor_type();
        if let Some(a) = *axis {
            assert!(a < ty.rank(), "{what}: in_axes[{i}] = {a} is out of range for argument {i} of type {ty}");
            if let Some(n) = ty.dims.remove(a) {
                match size {
                    Some((j, m)) if m != n => panic!(
                        "{what}: mapped axes have different sizes: argument {j} has {m} examples, argument {i} has {n}"
                    ),
                    _ => size = Some((i, n)),
                }
            }
        }
        types.push(ty);
    }
    (size.map(|(_, n)| n), types)
}

/// A traced closure: its graph and the enclosing traces' tensors it uses
/// (its parameters after the explicit ones).
struct Traced {
    graph: tracejit_ir::Graph,
    captures: Vec<Tensor>,
}

thread_local! {
    /// How many `vmap` traces are under way on this thread.
    static TRACING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// True while `vmap` traces a closure on this thread: a compiled function
/// called there is recorded with its graph as traced (see
/// `ConcreteFunction::callee_graph`).
pub(crate) fn tracing() -> bool {
    TRACING.with(|t| t.get() > 0)
}

struct Tracing;

impl Tracing {
    fn start() -> Tracing {
        TRACING.with(|t| t.set(t.get() + 1));
        Tracing
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        TRACING.with(|t| t.set(t.get() - 1));
    }
}

/// Traces `f` on placeholders of `types` into a graph of its own. No tape
/// records while tracing (the batched ops are what tapes see).
fn trace(what: &str, f: &dyn Fn(Vec<Tensor>) -> Vec<Tensor>, types: &[TensorType]) -> Traced {
    let _tracing = Tracing::start();
    let guard = push_context(subgraph_context(format!("{what}.body")));
    let placeholders: Vec<Tensor> = guard.with(|ctx| {
        types
            .iter()
            .map(|ty| {
                let v = ctx.graph.add_param(ty.clone());
                ctx.symbolic(v)
            })
            .collect()
    });
    let outs = crate::tape::without_recording(|| f(placeholders));
    let refs: Vec<&Tensor> = outs.iter().collect();
    let outputs = context::values_in_current(&refs).expect("the map's context is live");
    let mut ctx = guard.finish();
    ctx.graph.outputs = outputs;
    for v in &ctx.created_variables {
        context::note_variable_created(v);
    }
    Traced { graph: ctx.graph, captures: ctx.outer_captures.into_iter().map(|(t, _)| t).collect() }
}

/// The batching rules over tensors: ops run eagerly or land in the
/// enclosing trace (through the tape's emitter); variables are read
/// through their handles.
struct VmapEmitter {
    /// All-true `[batch]`, when the batch size is unknown in the trace.
    mask: Option<Tensor>,
}

impl Emitter for VmapEmitter {
    type Value = Tensor;

    fn emit(&mut self, op: Op, inputs: &[Tensor]) -> Result<Vec<Tensor>, AutodiffError> {
        if crate::debug::is_debug_node(&op) {
            // In program order with the other debug nodes and state.
            let refs: Vec<&Tensor> = inputs.iter().collect();
            crate::debug::record(op, &refs);
            return Ok(Vec::new());
        }
        TensorEmitter.emit(op, inputs)
    }

    fn value_type(&self, v: &Tensor) -> TensorType {
        v.tensor_type()
    }

    fn constant(&mut self, value: Storage) -> Tensor {
        Tensor::from_storage(value)
    }
}

impl BatchEmitter for VmapEmitter {
    fn read_variable(&mut self, var: &Arc<dyn VariableResource>) -> Result<Tensor, BatchError> {
        let handle = Variable::by_id(var.id())
            .ok_or_else(|| BatchError::Request(format!("variable `{}` was dropped while mapped", var.name())))?;
        Ok(handle.read())
    }

    fn assign_variable(
        &mut self,
        var: &Arc<dyn VariableResource>,
        kind: AssignKind,
        value: Tensor,
    ) -> Result<(), BatchError> {
        let handle = Variable::by_id(var.id())
            .ok_or_else(|| BatchError::Request(format!("variable `{}` was dropped while mapped", var.name())))?;
        match kind {
            AssignKind::Assign => handle.assign(&value),
            AssignKind::Add => handle.assign_add(&value),
            AssignKind::Sub => handle.assign_sub(&value),
        }
        Ok(())
    }

    fn batch_mask(&mut self) -> Option<Tensor> {
        self.mask.clone()
    }
}

/// An all-true bool `[batch]` from a mapped argument whose batch size is
/// unknown in the trace: its first entry of every example (a slice, not
/// a reshape, so an empty batch works), true whatever its value.
fn batch_mask(x: &Tensor, axis: usize) -> Tensor {
    let rank = x.rank() as i64;
    let mut perm: Vec<i64> = vec![axis as i64];
    perm.extend((0..rank).filter(|&a| a != axis as i64));
    let mut first = x.transpose(&perm);
    for _ in 1..rank {
        first = first.slice_axis(1, 0, 1).squeeze(&[1]);
    }
    let b = first.cast(DType::Bool);
    b.logical_or(b.logical_not())
}

/// `f` mapped over `xs` per `in_axes`, its results' batch axes at `out_axes`.
#[track_caller]
fn batch_call(
    what: &str,
    f: &dyn Fn(Vec<Tensor>) -> Vec<Tensor>,
    xs: Vec<Tensor>,
    in_axes: &[Bdim],
    out_axes: &[usize],
) -> Vec<Tensor> {
    let (size, types) = example_types(what, &xs, in_axes);
    let traced = trace(what, f, &types);
    assert!(
        traced.graph.outputs.len() == out_axes.len(),
        "{what}: expected {} results (one per out_axes entry), the function returned {}",
        out_axes.len(),
        traced.graph.outputs.len()
    );
    let inputs: Vec<(Tensor, Bdim)> =
        xs.into_iter().zip(in_axes.iter().copied()).chain(traced.captures.into_iter().map(|t| (t, None))).collect();
    let mask = match size {
        Some(_) => None,
        None => inputs.iter().find_map(|(t, b)| b.map(|a| batch_mask(t, a))),
    };
    let mut e = VmapEmitter { mask };
    let fail = |err: BatchError| -> ! { panic!("{err}") };
    let results = batch_values(&mut e, &traced.graph, &inputs, size).unwrap_or_else(|err| fail(err));
    results
        .into_iter()
        .zip(out_axes)
        .map(|((v, b), &to)| place_batch_axis(&mut e, v, b, to, size).unwrap_or_else(|err| fail(err)))
        .collect()
}
