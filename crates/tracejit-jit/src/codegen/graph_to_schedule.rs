//! `lower`: a graph (its regions planned) to a first schedule, one step
//! per node with one slot per value: regions compiled into kernels,
//! products, views, native kernels, variable accesses, calls and control
//! flow with their subgraphs prepared (each through the same passes), and
//! every other op left to its reference kernel.

use std::collections::HashMap;
use std::sync::Arc;

use cranelift_entity::EntityRef;
use smallvec::SmallVec;
use tracejit_ir::{FuncId, Graph, IrError, Node, NodeId, Op, ValueId};

use super::Run;

mod compile;
use crate::executor::views::View;
use crate::schedule::{Fast, Pair, Schedule, Step, StepKind};
use crate::{CompiledRegion, Executable, JitError, JitOptions};

/// Callees prepared so far, shared by the call steps of one graph.
pub(crate) type Callees = HashMap<FuncId, Arc<Executable>>;

/// The slot of every value of `g`, in arena order.
fn slot_table(g: &Graph) -> (HashMap<ValueId, usize>, usize) {
    let mut slot_of = HashMap::new();
    let mut n = 0;
    for (id, node) in g.nodes() {
        for k in 0..node.outputs.len() {
            slot_of.insert(ValueId::new(id, k as u32), n);
            n += 1;
        }
    }
    (slot_of, n)
}

/// The static type of each slot's value, in [`slot_table`]'s numbering.
pub(crate) fn slot_types(g: &Graph) -> Vec<&tracejit_ir::TensorType> {
    g.nodes().flat_map(|(_, node)| node.outputs.iter()).collect()
}

/// A step of `kind` for `node`, its slots looked up in `slot_of`.
fn step_for(g: &Graph, id: NodeId, kind: StepKind, slot_of: &HashMap<ValueId, usize>) -> Result<Step, JitError> {
    let node = g.node(id);
    let slot = |v: &ValueId| -> Result<usize, JitError> {
        slot_of.get(v).copied().ok_or_else(|| {
            JitError::Ir(IrError::Verifier {
                graph: g.name.clone(),
                node: v.node,
                message: format!("value {v} does not exist"),
            })
        })
    };
    let inputs: SmallVec<[usize; 3]> = node.inputs.iter().map(slot).collect::<Result<_, _>>()?;
    let outputs: SmallVec<[usize; 1]> =
        (0..node.outputs.len()).map(|k| slot(&ValueId::new(id, k as u32))).collect::<Result<_, _>>()?;
    let has_unknown = |node: &Node| {
        node.outputs.iter().chain(node.inputs.iter().map(|v| g.value_type(*v))).any(|t| t.shape().is_none())
    };
    let probe =
        matches!(kind, StepKind::Region(_) | StepKind::MatMul | StepKind::Primitive(..) | StepKind::Spatial(..))
            && node.outputs.iter().any(|t| {
                t.shape()
                    .and_then(|s| tracejit_ir::tensor::byte_size(t.dtype, &s))
                    .is_none_or(|b| b >= tracejit_ir::tensor::PROBE_BYTES)
            });
    // Constants are never re-checked: their values are their types.
    let check = !matches!(kind, StepKind::Constant(_)) && has_unknown(node);
    Ok(Step { kind, node: id, inputs, outputs, frees: SmallVec::new(), in_place: None, pair: Pair::None, check, probe })
}

/// The two subgraphs of a `cond` or `while`, prepared (their regions are
/// planned with the graph that holds them).
fn prepare_pair(graphs: &[Arc<Graph>; 2], opts: &JitOptions, run: &mut Run) -> Result<[Executable; 2], JitError> {
    let mut prepare = |g: &Arc<Graph>| Executable::build(g.clone(), opts, &mut Callees::new(), run);
    Ok([prepare(&graphs[0])?, prepare(&graphs[1])?])
}

/// A called function, prepared once per graph: its regions planned (a
/// library function is a graph of its own, never fused with its caller).
fn callee(
    g: &Graph,
    id: NodeId,
    func: FuncId,
    opts: &JitOptions,
    callees: &mut Callees,
    run: &mut Run,
) -> Result<Arc<Executable>, JitError> {
    if func.index() >= g.library.len() {
        return Err(JitError::Ir(IrError::Verifier {
            graph: g.name.clone(),
            node: id,
            message: format!("unknown function {func}"),
        }));
    }
    if let Some(e) = callees.get(&func) {
        return Ok(e.clone());
    }
    let planned = super::plan_regions(&g.library.get(func).graph);
    let e = Arc::new(Executable::build(Arc::new(planned), opts, &mut Callees::new(), run)?);
    callees.insert(func, e.clone());
    Ok(e)
}

/// What node `id` runs as. Every op is listed: a new op is a compile error
/// here until the JIT handles it (or sends it to the reference kernels).
/// A fused node takes its region from `regions` (compiled beforehand).
fn kind_of(
    g: &Graph,
    id: NodeId,
    opts: &JitOptions,
    callees: &mut Callees,
    run: &mut Run,
    regions: &mut HashMap<NodeId, Arc<CompiledRegion>>,
) -> Result<StepKind, JitError> {
    let node = g.node(id);
    Ok(match &node.op {
        Op::Parameter { index } => StepKind::Param(*index),
        Op::Constant { value } => StepKind::Constant(value.clone()),
        Op::MatMul => StepKind::MatMul,
        Op::Call { func } => StepKind::Call(callee(g, id, *func, opts, callees, run)?),
        Op::Cond { branches } => StepKind::Cond(Box::new(prepare_pair(branches, opts, run)?)),
        Op::While { parts, .. } => {
            StepKind::While(Box::new(prepare_pair(parts, opts, run)?), parts[1].outputs.len(), None)
        }
        Op::ReadVariable { var, .. } => StepKind::Read(*var),
        Op::AssignVariable { var, kind, .. } => StepKind::Assign(*var, *kind),
        // A region planned by the fusion pass: compiled (`compile`) when
        // this JIT supports it, else its body is interpreted (a fallback).
        Op::Fused { .. } => match regions.remove(&id) {
            Some(region) => StepKind::Region(region),
            None => StepKind::Primitive(node.op.clone(), Fast::None),
        },
        // A registered native kernel runs as itself.
        Op::Kernel { .. } => StepKind::External(node.op.clone()),
        // Convolutions and pools run through their direct kernels.
        Op::Spatial(op) => StepKind::Spatial(*op, None),
        Op::Transpose { perm } => StepKind::View(View::Transpose(perm.clone())),
        Op::Gather { axis } if g.value_type(node.inputs[1]).rank() == 0 => StepKind::View(View::Index(*axis)),
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::Clamp { .. }
        | Op::Reduce { .. }
        | Op::BroadcastTo { .. }
        | Op::ExpandDims { .. }
        | Op::ArgReduce { .. }
        | Op::Reshape { .. }
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
        | Op::Random { .. } => StepKind::Primitive(node.op.clone(), Fast::of(g, node)),
    })
}

/// The first schedule of `g`: one step per node in arena (topological)
/// order, one slot per value, the graph's outputs' slots.
pub(crate) fn lower(g: &Graph, opts: &JitOptions, callees: &mut Callees, run: &mut Run) -> Result<Schedule, JitError> {
    let (slot_of, n_slots) = slot_table(g);
    let mut steps = Vec::with_capacity(g.len());
    let mut regions = compile::compile_regions(g, opts)?;
    for (id, _) in g.nodes() {
        let kind = kind_of(g, id, opts, callees, run, &mut regions)?;
        steps.push(step_for(g, id, kind, &slot_of)?);
    }
    let outputs = g
        .outputs
        .iter()
        .map(|v| {
            slot_of.get(v).copied().ok_or_else(|| {
                JitError::Ir(IrError::Verifier {
                    graph: g.name.clone(),
                    node: v.node,
                    message: format!("output {v} does not exist"),
                })
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Schedule { steps, n_slots, outputs })
}
