//! `sparse_updates`: `assign_sub(w, x)` where `x` is `scatter_add(zeros,
//! ids, rows)`, or that times a scalar in a one-multiply region (what the
//! IR's `sparse_update` pass leaves of plain SGD on an embedding's
//! gradient), becomes one step that subtracts the (scaled) rows from the
//! variable's buffer in place, on the rows the ids name
//! (`executor::sparse_update`): the zero table, the scatter into it, the
//! scaled copy and the subtraction over the whole variable are gone. The
//! step keeps the assignment's node, so it holds the variable's update
//! lock as the assignment did.
//!
//! Runs first after `lower`, before any pass that records step indices.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::passes::PassResult;
use tracejit_ir::tensor::BinaryOp;
use tracejit_ir::{AssignKind, Graph, Op};

use super::{CodegenContext, SchedulePass};
use crate::executor::sparse_update::{Scale, SparseUpdate};
use crate::schedule::{Schedule, StepKind};

/// Turns subtractions of scattered rows from a variable into sparse updates.
pub(crate) struct SparseUpdates;

impl SchedulePass for SparseUpdates {
    fn name(&self) -> &'static str {
        "sparse_updates"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(rewrite(s, cx.graph), "variable updates on the named rows only")
    }
}

/// The schedule's slots: who writes each, and how often each is read
/// (graph outputs count as readers that never end).
struct Uses {
    producer: HashMap<usize, usize>,
    reads: HashMap<usize, usize>,
}

impl Uses {
    fn of(s: &Schedule) -> Uses {
        let producer = s.steps.iter().enumerate().flat_map(|(i, st)| st.outputs.iter().map(move |&o| (o, i))).collect();
        let mut reads: HashMap<usize, usize> = HashMap::new();
        for &x in s.steps.iter().flat_map(|st| st.inputs.iter()) {
            *reads.entry(x).or_default() += 1;
        }
        for &o in &s.outputs {
            *reads.entry(o).or_default() += 2;
        }
        Uses { producer, reads }
    }

    /// The step writing `slot` when that step's only reader is one step.
    fn sole_producer(&self, slot: usize) -> Option<usize> {
        (self.reads.get(&slot) == Some(&1)).then(|| self.producer.get(&slot).copied())?
    }
}

fn rewrite(s: &mut Schedule, g: &Graph) -> usize {
    let uses = Uses::of(s);
    let mut dropped: HashSet<usize> = HashSet::new();
    let mut changed = 0;
    for i in 0..s.steps.len() {
        let StepKind::Assign(var, AssignKind::Sub) = s.steps[i].kind else { continue };
        let Some(p) = uses.sole_producer(s.steps[i].inputs[0]) else { continue };
        let (scatter, scale, region) = match &s.steps[p].kind {
            StepKind::Primitive(Op::ScatterAdd { .. }, _) => (p, (Scale::One, None), None),
            StepKind::Region(_) | StepKind::Primitive(Op::Binary(BinaryOp::Mul), _) => {
                let Some((operand, scale)) = scaled_operand(g, s, p) else { continue };
                let Some(q) = uses.sole_producer(operand) else { continue };
                (q, scale, Some(p))
            }
            _ => continue,
        };
        let StepKind::Primitive(Op::ScatterAdd { axis }, _) = s.steps[scatter].kind else { continue };
        let base = s.steps[scatter].inputs[0];
        let Some(&zeros) = uses.producer.get(&base).filter(|&&z| makes_zeros(g, s, z)) else { continue };
        let (ids, rows) = (s.steps[scatter].inputs[1], s.steps[scatter].inputs[2]);
        let mut inputs: SmallVec<[usize; 3]> = [ids, rows].into_iter().collect();
        inputs.extend(scale.1);
        let step = &mut s.steps[i];
        step.kind = StepKind::SparseUpdate(Arc::new(SparseUpdate { var, axis, scale: scale.0 }));
        step.inputs = inputs;
        // The zeros go too unless another step reads them.
        let zeros = uses.sole_producer(base).map(|_| zeros);
        dropped.extend([scatter].into_iter().chain(zeros).chain(region));
        changed += 1;
    }
    let mut k = 0;
    s.steps.retain(|_| {
        k += 1;
        !dropped.contains(&(k - 1))
    });
    changed
}

/// For a step `p` computing only `mul(a, c)` with `c` a scalar (a region
/// with a constant or a 0-d input as `c`, or the reference multiply the
/// fusion planner leaves empty and one-element work to): the slot of `a`,
/// and the scale.
fn scaled_operand(g: &Graph, s: &Schedule, p: usize) -> Option<(usize, (Scale, Option<usize>))> {
    let step = &s.steps[p];
    let node = g.node(step.node);
    if let StepKind::Primitive(..) = step.kind {
        let scalar = |k: usize| g.value_type(node.inputs[k]).rank() == 0;
        let (a, c) = if scalar(1) { (0, 1) } else { (1, 0) };
        return scalar(c).then(|| (step.inputs[a], (Scale::Input, Some(step.inputs[c]))));
    }
    let Op::Fused { body } = &node.op else { return None };
    let mut work = body.nodes().filter(|(_, n)| !n.op.is_source());
    let (id, mul) = work.next()?;
    if work.next().is_some() || !matches!(mul.op, Op::Binary(BinaryOp::Mul)) {
        return None;
    }
    if body.outputs.len() != 1 || body.outputs[0].node != id || step.outputs.len() != 1 {
        return None;
    }
    let input = |v: tracejit_ir::ValueId| {
        let Op::Parameter { index } = body.node(v.node).op else { return None };
        step.inputs.get(index).copied()
    };
    let scalar = |v: tracejit_ir::ValueId| -> Option<(Scale, Option<usize>)> {
        if body.value_type(v).rank() != 0 {
            return None;
        }
        if let Op::Constant { value } = &body.node(v.node).op {
            return Some((Scale::Constant(value.clone()), None));
        }
        Some((Scale::Input, Some(input(v)?)))
    };
    let (a, b) = (mul.inputs[0], mul.inputs[1]);
    match (scalar(b), scalar(a)) {
        (Some(sc), _) => Some((input(a)?, sc)),
        (None, Some(sc)) => Some((input(b)?, sc)),
        (None, None) => None,
    }
}

/// True when step `z` produces a tensor of `+0.0`s: a constant, or a
/// region broadcasting a constant scalar `+0.0`.
fn makes_zeros(g: &Graph, s: &Schedule, z: usize) -> bool {
    let step = &s.steps[z];
    match &step.kind {
        StepKind::Constant(c) => c.is_all_positive_zeros(),
        StepKind::Region(_) => {
            let Op::Fused { body } = &g.node(step.node).op else { return false };
            step.inputs.is_empty()
                && body.outputs.len() == 1
                && body.nodes().all(|(_, n)| {
                    if let Op::Constant { value } = &n.op {
                        value.is_all_positive_zeros()
                    } else {
                        matches!(n.op, Op::BroadcastTo { .. })
                    }
                })
        }
        _ => false,
    }
}
