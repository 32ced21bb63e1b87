//! Batching (`vmap`) as IR -> IR: every value of a graph traced on one
//! example gets a batch axis (or none, when it does not depend on the
//! mapped inputs), one batching rule per op in one exhaustive `match`
//! ([`rules::batch_rule`], beside the VJP rules of [`crate::autodiff`]), so
//! an op added to [`Op`] does not compile until it has a rule. The design
//! is JAX's (`jax.interpreters.batching`): a rule receives each operand
//! with its batch dim (`Some(axis)` or `None`) and returns the results with
//! theirs, emitting ordinary ops, so a batched product is a batched GEMM,
//! never a loop of calls.
//!
//! Like the VJP rules, these emit through an [`Emitter`]: [`batch_graph`]
//! builds a new graph ([`GraphEmitter`]), and `tracejit::vmap` applies the
//! rules to tensors, so the batched ops run eagerly or land in the
//! enclosing trace.
//!
//! What each op does under a batch axis:
//! - elementwise ops, reductions, shape ops, slices, pads, cumsum, top_k:
//!   the batch axis moves to the front and the op's axes shift by one;
//!   an unmapped operand of a broadcasting op stays unmapped (numpy
//!   broadcasting aligns trailing axes);
//! - `matmul`: the batch axis leads the product's broadcast batch axes, so
//!   mapped @ unmapped is one GEMM over every example's rows and mapped @
//!   mapped one batched GEMM;
//! - `gather` with mapped indices and mapped params is one gather over the
//!   params with the batch folded into the gathered axis (indices are
//!   offset per example, so an index out of its example's range is not
//!   caught); `dynamic_slice` with mapped starts is a gather per axis;
//! - `cond` with any mapped operand runs both branches and selects per
//!   example (as JAX does for a batched predicate), so an effect or a
//!   panic of the branch an example does not take happens anyway;
//! - `while` carries a batch axis on every value that some iteration makes
//!   mapped; with a mapped condition it runs until every example's
//!   condition is false and stops updating each example once its own is;
//! - random draws follow their key: a shared stateless seed (i64 `[2]`)
//!   draws once for every example, as JAX's keys; a shared generator
//!   state (i64 `[3]`, a `Generator` draw) draws `[batch, ..]` at once, so
//!   every example gets its own numbers and the generator advances once
//!   per call (PyTorch's `randomness="different"`); a mapped key (one per
//!   example, e.g. a `[batch, 2]` seed mapped on axis 0) gives each
//!   example its own stream;
//! - calls and fused regions are batched through their bodies;
//! - variables are read unmapped; a generator's advance (a write of its
//!   state, the same for every example) happens once per call, any other
//!   write is an error, as is a native
//!   kernel (composites are batched through their bodies before the
//!   selector picks kernels) or a convolution's filter gradient.

mod control;
mod ghost;
mod grouped;
mod helpers;
mod indexing;
mod rules;

use std::sync::Arc;

use crate::autodiff::{AutodiffError, Emitter, GraphEmitter};
use crate::{AssignKind, Graph, Op, OpError, ValueId, VariableResource};

pub use rules::batch_rule;

/// Where a value's batch axis is: `Some(axis)`, or `None` when the value
/// is the same for every example (unmapped).
pub type Bdim = Option<usize>;

pub(crate) type R<T> = Result<T, BatchError>;

/// Why a graph could not be batched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The op has no batching rule for these operands.
    #[error("vmap of `{op}`: {message}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// Why, and what to do instead.
        message: String,
    },
    /// The batch size is unknown in the trace where a rule needs it.
    #[error(
        "vmap: the batch size is unknown in the trace and is needed for {what}; give the mapped axis a known size \
         in the function's input signature"
    )]
    UnknownSize {
        /// What needed it.
        what: String,
    },
    /// An op a rule emitted was rejected (a bug in a rule).
    #[error("vmap: {0} (this is a bug in tracejit)")]
    Emit(OpError),
    /// The request itself is wrong (axes out of range, sizes that differ).
    #[error("vmap: {0}")]
    Request(String),
}

impl From<AutodiffError> for BatchError {
    fn from(e: AutodiffError) -> BatchError {
        match e {
            AutodiffError::Emit(op) => BatchError::Emit(op),
            AutodiffError::Unsupported { op, message } => BatchError::Unsupported { op, message },
            AutodiffError::Request(m) => BatchError::Request(m),
        }
    }
}

impl From<OpError> for BatchError {
    fn from(e: OpError) -> BatchError {
        BatchError::Emit(e)
    }
}

/// An [`Emitter`] the batching rules can also read variables through.
pub trait BatchEmitter: Emitter {
    /// The current value of `var` (unmapped: every example reads the same).
    fn read_variable(&mut self, var: &Arc<dyn VariableResource>) -> R<Self::Value>;

    /// Writes `value`, the same for every example, into `var` once.
    fn assign_variable(&mut self, var: &Arc<dyn VariableResource>, kind: AssignKind, value: Self::Value) -> R<()>;

    /// A bool `[batch]` of trues when the batch size is unknown in the
    /// trace, so an unmapped value can still be broadcast to the batch (a
    /// select against it); `None` when there is none.
    fn batch_mask(&mut self) -> Option<Self::Value> {
        None
    }
}

impl BatchEmitter for GraphEmitter<'_> {
    fn read_variable(&mut self, var: &Arc<dyn VariableResource>) -> R<ValueId> {
        let id = self.graph.add_variable(var.clone());
        Ok(self.emit(Op::ReadVariable { var: id, locked: false }, &[])?.remove(0))
    }

    fn assign_variable(&mut self, var: &Arc<dyn VariableResource>, kind: AssignKind, value: ValueId) -> R<()> {
        let id = self.graph.add_variable(var.clone());
        // After every earlier access of the variable, as traced.
        let earlier: Vec<crate::NodeId> = self
            .graph
            .nodes()
            .filter(|(_, n)| matches!(n.op, Op::ReadVariable { var, .. } | Op::AssignVariable { var, .. } if var == id))
            .map(|(n, _)| n)
            .collect();
        self.graph.add_node(Op::AssignVariable { var: id, kind, locked: false }, &[value], &earlier, None)?;
        Ok(())
    }
}

/// `v`, whose batch axis is `bdim`, with its batch axis at `to`: moved
/// there, or (unmapped) broadcast to `size` copies first.
pub fn place_batch_axis<E: BatchEmitter>(
    e: &mut E,
    v: E::Value,
    bdim: Bdim,
    to: usize,
    size: Option<usize>,
) -> R<E::Value> {
    let rank = e.value_type(&v).rank() + usize::from(bdim.is_none());
    if to >= rank {
        return Err(BatchError::Request(format!(
            "out_axes {to} is out of range for a result of rank {rank} (with its batch axis)"
        )));
    }
    let front = helpers::materialize(e, v, bdim, size)?;
    helpers::from_front(e, front, to)
}

/// A value with its batch dim.
pub type Batched<V> = (V, Bdim);

/// Runs `graph`'s nodes through the batching rules on `inputs` (one per
/// parameter, each with its batch dim) and returns its outputs with
/// theirs. `size` is the batch size when known.
pub fn batch_values<E: BatchEmitter>(
    e: &mut E,
    graph: &Graph,
    inputs: &[Batched<E::Value>],
    size: Option<usize>,
) -> R<Vec<Batched<E::Value>>> {
    if inputs.len() != graph.params.len() {
        return Err(BatchError::Request(format!(
            "`{}` takes {} inputs, got {}",
            graph.name,
            graph.params.len(),
            inputs.len()
        )));
    }
    let mut env: std::collections::HashMap<ValueId, Batched<E::Value>> = std::collections::HashMap::new();
    let (ghosts, skipped) = ghost::plan(graph);
    for (id, node) in graph.nodes() {
        if skipped.contains(&id) {
            continue;
        }
        let outs = match &node.op {
            Op::Parameter { index } => vec![inputs[*index].clone()],
            op @ Op::Reduce { .. } if ghosts.contains_key(&id) => {
                let g = &ghosts[&id];
                let (a, b) = (env[&g.a].clone(), env[&g.b].clone());
                ghost_sum_of_squares(e, op, a, b, size, graph)?
            }
            op => {
                let args: Vec<Batched<E::Value>> = node
                    .inputs
                    .iter()
                    .map(|v| env.get(v).cloned().expect("inputs precede their users (verified graph)"))
                    .collect();
                batch_rule(e, op, &args, size, graph)?
            }
        };
        for (i, out) in outs.into_iter().enumerate() {
            env.insert(ValueId::new(id, i as u32), out);
        }
    }
    Ok(graph.outputs.iter().map(|v| env[v].clone()).collect())
}

/// `reduce(square(a @ b))` for an inner dim of 1, as
/// `reduce(sum(a²) · sum(b²))` with the matrix axes' sums kept as unit
/// axes (see [`ghost`]): the reduction then sums size-1 axes there, so
/// its result has the original's shape.
fn ghost_sum_of_squares<E: BatchEmitter>(
    e: &mut E,
    reduce: &Op,
    a: Batched<E::Value>,
    b: Batched<E::Value>,
    size: Option<usize>,
    graph: &Graph,
) -> R<Vec<Batched<E::Value>>> {
    let mut sums = Vec::with_capacity(2);
    for x in [a, b] {
        let r = e.value_type(&x.0).rank() - usize::from(x.1.is_some());
        let sq = batch_rule(e, &Op::Unary(tracejit_tensor::UnaryOp::Square), &[x], size, graph)?.remove(0);
        let sum = Op::Reduce { op: tracejit_tensor::ReduceOp::Sum, axes: vec![r - 2, r - 1], keepdims: true };
        sums.push(batch_rule(e, &sum, &[sq], size, graph)?.remove(0));
    }
    let product = batch_rule(e, &Op::Binary(tracejit_tensor::BinaryOp::Mul), &sums, size, graph)?;
    batch_rule(e, reduce, &product, size, graph)
}

/// `graph` batched as a new graph: parameter `i` of the result has a batch
/// axis at `in_axes[i]` of size `size` (`None`: the parameter is unmapped,
/// of its type in `graph`), and every output has its batch axis at the
/// front (unmapped outputs are broadcast to `size`).
///
/// ```
/// use tracejit_ir::batching::batch_graph;
/// use tracejit_ir::tensor::{BinaryOp, DType, Storage};
/// use tracejit_ir::{interpret, Graph, Op, TensorType, ValueId};
///
/// // f(x, w) = x * w per example, with x mapped and w shared.
/// let mut g = Graph::new("f");
/// let x = g.add_param(TensorType::known(DType::F64, &[2]));
/// let w = g.add_param(TensorType::known(DType::F64, &[2]));
/// let y = ValueId::from(g.add_node(Op::Binary(BinaryOp::Mul), &[x, w], &[], None)?);
/// g.outputs.push(y);
/// let batched = batch_graph(&g, &[Some(0), None], 3)?;
/// let xs = Storage::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let out = interpret(&batched, &[xs, Storage::from_vec(vec![10.0f64, 100.0], &[2])?])?;
/// assert_eq!(out[0].to_vec::<f64>()?, [10.0, 200.0, 30.0, 400.0, 50.0, 600.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn batch_graph(graph: &Graph, in_axes: &[Bdim], size: usize) -> R<Graph> {
    if in_axes.len() != graph.params.len() {
        return Err(BatchError::Request(format!(
            "expected one in_axes entry per input of `{}` ({}), got {}",
            graph.name,
            graph.params.len(),
            in_axes.len()
        )));
    }
    let mut out = Graph::new(format!("vmap({})", graph.name));
    let mut inputs = Vec::with_capacity(in_axes.len());
    for (ty, &axis) in graph.param_types().into_iter().zip(in_axes) {
        let mut ty = ty;
        if let Some(a) = axis {
            if a > ty.rank() {
                return Err(BatchError::Request(format!("in_axes {a} is out of range for an input of type {ty}")));
            }
            ty.dims.insert(a, Some(size));
        }
        inputs.push((out.add_param(ty), axis));
    }
    let mut e = GraphEmitter { graph: &mut out };
    let results = batch_values(&mut e, graph, &inputs, Some(size))?;
    let mut outputs = Vec::with_capacity(results.len());
    for (v, bdim) in results {
        outputs.push(helpers::materialize(&mut e, v, bdim, Some(size))?);
    }
    out.outputs = outputs;
    Ok(out)
}
