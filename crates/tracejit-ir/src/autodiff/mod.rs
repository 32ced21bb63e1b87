//! Reverse-mode automatic differentiation as IR -> IR: one vector-Jacobian
//! product (VJP) rule per primitive op, in one exhaustive `match`
//! ([`rules::vjp`]), that emits IR ops.
//!
//! The rules know no closures and no tensors: they emit ops through an
//! [`Emitter`], whose values may be graph values ([`GraphEmitter`], which
//! appends nodes to a graph: the backward pass of a traced function) or
//! anything else that can apply an op (an eager tape evaluates the same
//! rules on eager tensors). [`grad_graph`] is the whole-graph transform:
//! forward, then backward, in one graph that the passes optimize and the
//! JIT fuses like any other.
//!
//! Conventions, as TensorFlow's:
//! - the cotangent of a non-scalar target is ones (the gradient of its
//!   sum);
//! - integer and bool values carry no gradient (`None`), and ops that are
//!   piecewise constant (`sign`, `floor`, `ceil`, `round`, comparisons,
//!   `argmax`, `one_hot`) give none to their inputs;
//! - at a tie, `maximum`/`minimum` send the gradient to the first operand,
//!   a `max`/`min` reduction shares it equally among the tied elements, and
//!   `clamp` passes it where `min <= x <= max`;
//! - a broadcast operand's gradient is summed back to its shape. A dim that
//!   is unknown in the trace is taken to be unbroadcast (equal to the
//!   result's), as it is for every input signature with `-1`.
//!
//! `slice` scatters back by concatenating zeros (step 1) or through a 0/1
//! selection matrix (any other step, negative too), and `gather` by
//! `one_hot(indices)ᵀ @ g`. With dims unknown in the trace, a step-1
//! slice takes its zeros from slices of the input itself (so their sizes
//! follow the run-time shape), `gather` needs its gathered axis known and
//! at most one other unknown dim, and `concat` at most one input of
//! unknown length along its axis; what remains is refused by name. `cond` and
//! `while` have their own rule (`control`). What has no rule (calls,
//! kernels and fused regions: differentiate
//! before the selector and fusion, with calls inlined) is an
//! [`AutodiffError`] naming the op, never a wrong number.
//!
//! The one call a differentiated graph keeps is a call of a
//! custom-gradient function ([`is_custom_gradient`]: the user gave its
//! gradient as a Rust closure, `tracejit::autodiff::custom_gradient`). The
//! IR cannot run that closure, so such a call is replayed and
//! differentiated by the [`Emitter`] ([`Emitter::call`],
//! [`Emitter::call_vjp`]); the tape's emitter knows the closures, a graph
//! emitter refuses by name.

mod control;
mod loops;
mod rules;

use std::collections::HashMap;

use tracejit_tensor::{DType, Storage};

use crate::primitive_ops;
use crate::{Graph, LibraryFunction, Op, OpError, TensorType, ValueId};

pub use control::{control_variables, vjp_control};
pub use rules::{vjp, vjp_wanted};

/// Why a gradient could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutodiffError {
    /// The op has no VJP rule (yet), or not for these types.
    #[error("gradient of `{op}`: {message}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// What is missing.
        message: String,
    },
    /// An op the rule emitted was rejected (a bug in a rule).
    #[error("gradient: {0} (this is a bug in tracejit)")]
    Emit(#[from] OpError),
    /// The request itself is wrong (a source that is not an input, ...).
    #[error("gradient: {0}")]
    Request(String),
}

/// Where VJP rules emit their ops.
pub trait Emitter {
    /// A value the rules read and produce.
    type Value: Clone;

    /// Applies `op` to `inputs`.
    fn emit(&mut self, op: Op, inputs: &[Self::Value]) -> Result<Vec<Self::Value>, AutodiffError>;

    /// The value's type (unknown dims as in the trace).
    fn value_type(&self, v: &Self::Value) -> TensorType;

    /// A constant.
    fn constant(&mut self, value: Storage) -> Self::Value;

    /// The outputs of a call of the custom-gradient function `func` (kept
    /// in a differentiated graph, see [`is_custom_gradient`]) on `inputs`.
    /// The default refuses: only an emitter that knows the user's closures
    /// (a gradient tape's) can run it.
    fn call(&mut self, func: &LibraryFunction, inputs: &[Self::Value]) -> Result<Vec<Self::Value>, AutodiffError> {
        let _ = inputs;
        Err(custom_gradient_unsupported(func))
    }

    /// The cotangents of a custom-gradient call's inputs, by the user's
    /// gradient rule. The default refuses, as [`Emitter::call`] does.
    #[allow(clippy::type_complexity)]
    fn call_vjp(
        &mut self,
        func: &LibraryFunction,
        inputs: &[Self::Value],
        outputs: &[Self::Value],
        cotangents: &[Option<Self::Value>],
    ) -> Result<Vec<Option<Self::Value>>, AutodiffError> {
        let _ = (inputs, outputs, cotangents);
        Err(custom_gradient_unsupported(func))
    }
}

/// The `implements` names of custom-gradient functions start with this
/// (`tracejit.custom_gradient.<n>`); the name is reserved for them.
pub const CUSTOM_GRADIENT_PREFIX: &str = "tracejit.custom_gradient.";

/// True when `func` is a custom-gradient function: its gradient is a rule
/// the user wrote, not the VJP of its body, so a differentiated graph keeps
/// its calls ([`crate::passes::PassContext::keep_custom_gradients`]).
pub fn is_custom_gradient(func: &LibraryFunction) -> bool {
    func.implements().is_some_and(|n| n.starts_with(CUSTOM_GRADIENT_PREFIX))
}

fn custom_gradient_unsupported(func: &LibraryFunction) -> AutodiffError {
    AutodiffError::Unsupported {
        op: "call".into(),
        message: format!(
            "`{}` has a custom gradient (a Rust closure) and sits inside a `cond` branch or loop body that is \
             differentiated as a whole; differentiate inside the branch or body (a GradientTape there), or move \
             the custom_gradient call out of the control flow",
            func.name
        ),
    }
}

/// An [`Emitter`] appending nodes to a graph.
pub struct GraphEmitter<'g> {
    /// The graph the nodes go into.
    pub graph: &'g mut Graph,
}

impl Emitter for GraphEmitter<'_> {
    type Value = ValueId;

    fn emit(&mut self, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, AutodiffError> {
        let id = self.graph.add_node(op, inputs, &[], None)?;
        Ok((0..self.graph.node(id).outputs.len()).map(|i| ValueId::new(id, i as u32)).collect())
    }

    fn value_type(&self, v: &ValueId) -> TensorType {
        self.graph.value_type(*v).clone()
    }

    fn constant(&mut self, value: Storage) -> ValueId {
        self.graph.add_constant(value)
    }
}

/// `graph` extended with the gradients of its first output with respect to
/// the parameters `wrt` (by index): the result's outputs are the original
/// outputs followed by one gradient per `wrt` entry, of the parameter's
/// type (zeros where the output does not depend on it).
///
/// ```
/// use tracejit_ir::autodiff::grad_graph;
/// use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage};
/// use tracejit_ir::{interpret, Graph, Op, TensorType, ValueId};
///
/// // f(x) = sum(x * x); df/dx = 2x.
/// let mut g = Graph::new("f");
/// let x = g.add_param(TensorType::known(DType::F64, &[3]));
/// let sq = ValueId::from(g.add_node(Op::Binary(BinaryOp::Mul), &[x, x], &[], None)?);
/// let op = Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: false };
/// let s = ValueId::from(g.add_node(op, &[sq], &[], None)?);
/// g.outputs.push(s);
/// let dg = grad_graph(&g, &[0])?;
/// let out = interpret(&dg, &[Storage::from_vec(vec![1.0f64, 2.0, 3.0], &[3])?])?;
/// assert_eq!(out[1].to_vec::<f64>()?, vec![2.0, 4.0, 6.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn grad_graph(graph: &Graph, wrt: &[usize]) -> Result<Graph, AutodiffError> {
    let target = *graph.outputs.first().ok_or_else(|| AutodiffError::Request("the graph has no output".into()))?;
    for &p in wrt {
        if p >= graph.params.len() {
            return Err(AutodiffError::Request(format!(
                "source {p} is not an input (the graph has {} inputs)",
                graph.params.len()
            )));
        }
    }
    // The backward nodes go into a copy; the forward's values keep their ids.
    let mut g = graph.clone();
    let mut e = GraphEmitter { graph: &mut g };
    let seed = ones_like(&mut e, target)?;
    let cts = backprop(&mut e, graph, &|v| v, HashMap::from([(target, seed)]))?;
    let mut grads = Vec::with_capacity(wrt.len());
    for &p in wrt {
        let param = ValueId::from(e.graph.params[p]);
        let grad = match cts.get(&param) {
            Some(v) => *v,
            None => zeros_like(&mut e, param)?,
        };
        grads.push(grad);
    }
    g.outputs.extend(grads);
    g.name = format!("{}.grad", graph.name);
    Ok(g)
}

/// Runs the VJP rules over `graph`'s nodes backwards, from the cotangents
/// `cts` (by value id), reading the forward value of a node's inputs and
/// outputs through `value`; returns every accumulated cotangent.
fn backprop<E: Emitter>(
    e: &mut E,
    graph: &Graph,
    value: &dyn Fn(ValueId) -> E::Value,
    mut cts: HashMap<ValueId, E::Value>,
) -> Result<HashMap<ValueId, E::Value>, AutodiffError> {
    let ids: Vec<crate::NodeId> = graph.nodes().map(|(id, _)| id).collect();
    for &id in ids.iter().rev() {
        let node = graph.node(id);
        let outs: Vec<ValueId> = (0..node.outputs.len()).map(|i| ValueId::new(id, i as u32)).collect();
        let out_cts: Vec<Option<E::Value>> = outs.iter().map(|v| cts.get(v).cloned()).collect();
        if out_cts.iter().all(Option::is_none) || node.inputs.is_empty() {
            continue;
        }
        let in_vals: Vec<E::Value> = node.inputs.iter().map(|&v| value(v)).collect();
        let out_vals: Vec<E::Value> = outs.iter().map(|&v| value(v)).collect();
        let in_cts = match &node.op {
            Op::Call { func } if is_custom_gradient(graph.library.get(*func)) => {
                e.call_vjp(graph.library.get(*func), &in_vals, &out_vals, &out_cts)?
            }
            op => vjp(e, op, &in_vals, &out_vals, &out_cts)?,
        };
        for (x, ct) in node.inputs.iter().zip(in_cts) {
            if let Some(ct) = ct {
                accumulate(e, &mut cts, *x, ct)?;
            }
        }
    }
    Ok(cts)
}

/// `cts[key] += ct` (or `= ct` when there is none yet).
fn accumulate<E: Emitter>(
    e: &mut E,
    cts: &mut HashMap<ValueId, E::Value>,
    key: ValueId,
    ct: E::Value,
) -> Result<(), AutodiffError> {
    let sum = match cts.remove(&key) {
        Some(prev) => e.emit(Op::Binary(tracejit_tensor::BinaryOp::Add), &[prev, ct])?.remove(0),
        None => ct,
    };
    cts.insert(key, sum);
    Ok(())
}

/// The cotangents of `graph`'s inputs, given its `inputs` and the
/// cotangents of its outputs: the graph's forward is replayed through `e`
/// (recomputing what the backward needs, as a rematerializing VJP does),
/// then differentiated. This is how a call of a traced function is
/// differentiated under a tape: `graph` is the callee with its own calls
/// inlined (its composites' primitive bodies included).
///
/// `variables` gives the value each variable the graph reads holds (read
/// by the caller around the call); the second result holds their
/// cotangents, in the same order. A graph that writes a variable is an
/// error.
#[allow(clippy::type_complexity)]
pub fn vjp_graph<E: Emitter>(
    e: &mut E,
    graph: &Graph,
    inputs: &[E::Value],
    variables: &[(crate::VarId, E::Value)],
    cotangents: &[Option<E::Value>],
) -> Result<(Vec<Option<E::Value>>, Vec<Option<E::Value>>), AutodiffError> {
    let vals = replay(e, graph, inputs, variables)?;
    backprop_replayed(e, graph, &vals, variables, cotangents)
}

/// `graph`'s forward replayed through `e` on `inputs` (variables read as
/// `variables` gives them, their values before the call): every value of
/// the graph, by id.
///
/// A variable the graph assigns is read afterwards with the value it was
/// given (`assign`, `assign_add`, `assign_sub` replayed on the values), as
/// the call read it; the write itself is not differentiated (as in
/// TensorFlow, a read's cotangent goes to the variable, never into the
/// value assigned before it).
pub(crate) fn replay<E: Emitter>(
    e: &mut E,
    graph: &Graph,
    inputs: &[E::Value],
    variables: &[(crate::VarId, E::Value)],
) -> Result<HashMap<ValueId, E::Value>, AutodiffError> {
    Ok(replay_state(e, graph, inputs, variables)?.0)
}

/// [`replay`], also returning each variable's value after the graph (as
/// its assignments left it): what a loop body hands the next trip.
#[allow(clippy::type_complexity)]
pub(crate) fn replay_state<E: Emitter>(
    e: &mut E,
    graph: &Graph,
    inputs: &[E::Value],
    variables: &[(crate::VarId, E::Value)],
) -> Result<(HashMap<ValueId, E::Value>, Vec<(crate::VarId, E::Value)>), AutodiffError> {
    let mut vals: HashMap<ValueId, E::Value> = HashMap::new();
    let mut variables: Vec<(crate::VarId, E::Value)> = variables.to_vec();
    for (id, node) in graph.nodes() {
        let outs: Vec<E::Value> = match &node.op {
            Op::Parameter { index } => vec![inputs
                .get(*index)
                .cloned()
                .ok_or_else(|| AutodiffError::Request(format!("input {index} of `{}` is missing", graph.name)))?],
            Op::Constant { value } => vec![e.constant(value.clone())],
            Op::ReadVariable { var, .. } => {
                let value = variables.iter().find(|(v, _)| v == var).map(|(_, x)| x.clone());
                vec![value.ok_or_else(|| AutodiffError::Request(format!("no value given for variable {var}")))?]
            }
            Op::AssignVariable { var, kind, .. } => {
                // Only a later read needs the new value; without one the
                // variable was given no value (nothing reads it).
                if let Some(slot) = variables.iter().position(|(v, _)| v == var) {
                    let x = vals[&node.inputs[0]].clone();
                    let old = variables[slot].1.clone();
                    let new = match kind {
                        crate::AssignKind::Assign => x,
                        crate::AssignKind::Add => {
                            e.emit(Op::Binary(tracejit_tensor::BinaryOp::Add), &[old, x])?.remove(0)
                        }
                        crate::AssignKind::Sub => {
                            e.emit(Op::Binary(tracejit_tensor::BinaryOp::Sub), &[old, x])?.remove(0)
                        }
                    };
                    variables[slot].1 = new;
                }
                vec![]
            }
            Op::Call { func } if is_custom_gradient(graph.library.get(*func)) => {
                let ins: Vec<E::Value> = node.inputs.iter().map(|v| vals[v].clone()).collect();
                e.call(graph.library.get(*func), &ins)?
            }
            Op::Call { .. } | Op::Kernel { .. } | Op::Fused { .. } => {
                return Err(AutodiffError::Unsupported {
                    op: node.op.name().to_string(),
                    message: format!(
                        "inside the differentiated function `{}` (differentiate it with its calls inlined, before \
                         the implementation selector and fusion; a bug in tracejit)",
                        graph.name
                    ),
                });
            }
            // Nested control flow is replayed as itself (its rule, not
            // this walk, differentiates it); one that writes is refused.
            op @ (Op::Cond { .. } | Op::While { .. }) if !op.effects(&graph.library).writes() => {
                let ins: Vec<E::Value> = node.inputs.iter().map(|v| vals[v].clone()).collect();
                e.emit(op.clone(), &ins)?
            }
            op @ (Op::Cond { .. } | Op::While { .. }) => {
                let written: Vec<String> = op
                    .subgraphs()
                    .iter()
                    .flat_map(|sub| {
                        sub.nodes().filter_map(|(_, n)| {
                            let Op::AssignVariable { var, .. } = n.op else { return None };
                            Some(format!("`{}`", sub.variables[var].name()))
                        })
                    })
                    .collect();
                return Err(AutodiffError::Unsupported {
                    op: op.name().to_string(),
                    message: format!(
                        "it writes a variable ({}) inside a branch or loop body of the function `{}` called under \
                         the tape{}; a tape differentiates a call whose control flow only reads variables (assign \
                         outside the `cond`/`while_loop`)",
                        written.join(", "),
                        graph.name,
                        node.location.map(|l| format!(", at {}:{}", l.file(), l.line())).unwrap_or_default()
                    ),
                });
            }
            op @ (primitive_ops!()) => {
                let ins: Vec<E::Value> = node.inputs.iter().map(|v| vals[v].clone()).collect();
                e.emit(op.clone(), &ins)?
            }
        };
        for (i, v) in outs.into_iter().enumerate() {
            vals.insert(ValueId::new(id, i as u32), v);
        }
    }
    Ok((vals, variables))
}

/// The second half of [`vjp_graph`]: `graph` differentiated from its
/// `cotangents`, its forward values being `vals` (from [`replay`]).
#[allow(clippy::type_complexity)]
pub(crate) fn backprop_replayed<E: Emitter>(
    e: &mut E,
    graph: &Graph,
    vals: &HashMap<ValueId, E::Value>,
    variables: &[(crate::VarId, E::Value)],
    cotangents: &[Option<E::Value>],
) -> Result<(Vec<Option<E::Value>>, Vec<Option<E::Value>>), AutodiffError> {
    let mut seeds: HashMap<ValueId, E::Value> = HashMap::new();
    for (o, ct) in graph.outputs.iter().zip(cotangents) {
        if let Some(ct) = ct {
            accumulate(e, &mut seeds, *o, ct.clone())?;
        }
    }
    let mut cts = backprop(e, graph, &|v| vals[&v].clone(), seeds)?;
    let input_cts = graph.params.iter().map(|&p| cts.remove(&ValueId::from(p))).collect();
    // A variable's cotangent: the sum over the graph's reads of it.
    let mut var_cts = Vec::with_capacity(variables.len());
    for (var, _) in variables {
        let mut total: Option<E::Value> = None;
        for (id, node) in graph.nodes() {
            if matches!(node.op, Op::ReadVariable { var: v, .. } if v == *var) {
                if let Some(ct) = cts.remove(&ValueId::new(id, 0)) {
                    total = Some(match total {
                        Some(prev) => e.emit(Op::Binary(tracejit_tensor::BinaryOp::Add), &[prev, ct])?.remove(0),
                        None => ct,
                    });
                }
            }
        }
        var_cts.push(total);
    }
    Ok((input_cts, var_cts))
}

/// A scalar constant of `dtype`.
pub(crate) fn scalar<E: Emitter>(e: &mut E, dtype: DType, v: f64) -> E::Value {
    let value = match dtype {
        DType::F32 => Storage::from_vec(vec![v as f32], &[]),
        DType::F64 => Storage::from_vec(vec![v], &[]),
        DType::I32 => Storage::from_vec(vec![v as i32], &[]),
        DType::I64 => Storage::from_vec(vec![v as i64], &[]),
        DType::Bool => Storage::from_vec(vec![v != 0.0], &[]),
        DType::BF16 => Storage::from_vec(vec![tracejit_tensor::bf16::from_f64(v)], &[]),
        DType::F16 => Storage::from_vec(vec![tracejit_tensor::f16::from_f64(v)], &[]),
        DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32 | DType::U64 => Ok(Storage::scalar_of(dtype, v)),
    };
    e.constant(value.expect("a scalar has one element"))
}

/// A bool tensor of `x`'s shape, all true: `is_nan(x) | !is_nan(x)` for
/// floats (true for NaN too), `x == x` otherwise. It gives other values
/// `x`'s shape through `select` when that shape is unknown in the trace.
pub(crate) fn true_like<E: Emitter>(e: &mut E, x: &E::Value) -> Result<E::Value, AutodiffError> {
    use tracejit_tensor::{BinaryOp, UnaryOp};
    let t = e.value_type(x);
    if t.dtype.is_float() {
        let nan = e.emit(Op::Unary(UnaryOp::IsNan), std::slice::from_ref(x))?.remove(0);
        let not = e.emit(Op::Unary(UnaryOp::LogicalNot), std::slice::from_ref(&nan))?.remove(0);
        Ok(e.emit(Op::Binary(BinaryOp::LogicalOr), &[nan, not])?.remove(0))
    } else {
        Ok(e.emit(Op::Binary(BinaryOp::Eq), &[x.clone(), x.clone()])?.remove(0))
    }
}

/// `v` (a scalar or anything broadcastable to `like`) broadcast to the
/// shape of `like`.
pub(crate) fn broadcast_like<E: Emitter>(e: &mut E, v: E::Value, like: &E::Value) -> Result<E::Value, AutodiffError> {
    let t = e.value_type(like);
    if e.value_type(&v).dims == t.dims {
        return Ok(v);
    }
    match t.shape() {
        Some(shape) => Ok(e.emit(Op::BroadcastTo { shape }, &[v])?.remove(0)),
        None => {
            let c = true_like(e, like)?;
            Ok(e.emit(Op::Select, &[c, v.clone(), v])?.remove(0))
        }
    }
}

/// Ones of `x`'s type (its shape, even where unknown in the trace).
pub fn ones_like<E: Emitter>(e: &mut E, x: E::Value) -> Result<E::Value, AutodiffError> {
    let one = scalar(e, e.value_type(&x).dtype, 1.0);
    broadcast_like(e, one, &x)
}

/// Zeros of `x`'s type (its shape, even where unknown in the trace).
pub fn zeros_like<E: Emitter>(e: &mut E, x: E::Value) -> Result<E::Value, AutodiffError> {
    let zero = scalar(e, e.value_type(&x).dtype, 0.0);
    broadcast_like(e, zero, &x)
}
