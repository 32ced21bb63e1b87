//! `start_early`: a kernel that only starts work a later step finishes
//! (`ExternalKernel::starts_early`: a non-blocking collective's start)
//! moves up to just after the last step it depends on — the producers of
//! its inputs and its control inputs (the effects it is ordered after) —
//! instead of waiting for its place in program order. DDP's buckets then
//! start while the rest of the backward computes (PyTorch's reducer fires
//! a bucket from the autograd hook of its last gradient for the same
//! reason), and the wait finds the sum done or nearly.
//!
//! Moving a step earlier is safe when nothing between its new and old
//! places reads its outputs (the schedule is in dependency order, so
//! nothing before its old place does) and everything it reads or is
//! ordered after is made before its new place; effects between the two
//! places that it is not ordered after (a `print`) commute with it. A
//! control input that is not some step's node (it cannot be located)
//! keeps the step where it is.

use std::collections::HashMap;

use tracejit_ir::passes::PassResult;
use tracejit_ir::{Graph, NodeId, Op};

use super::{CodegenContext, SchedulePass};
use crate::schedule::{Schedule, Step};

/// Moves early-starting kernels up to their last dependency.
pub(crate) struct StartEarly;

impl SchedulePass for StartEarly {
    fn name(&self) -> &'static str {
        "start_early"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(start_early(&mut s.steps, cx.graph), "non-blocking starts moved up to their inputs")
    }
}

/// Whether step `s` runs a kernel that starts early.
fn starts_early(g: &Graph, s: &Step) -> bool {
    matches!(&g.node(s.node).op, Op::Kernel { kernel, .. } if kernel.starts_early())
}

/// The first position step `i` may run at: just after the last step making
/// one of its inputs or running one of its control inputs; `i` itself when
/// a control input is not found among the steps.
fn earliest(steps: &[Step], g: &Graph, i: usize) -> usize {
    let made_at: HashMap<usize, usize> =
        steps[..i].iter().enumerate().flat_map(|(j, s)| s.outputs.iter().map(move |&o| (o, j))).collect();
    let ran_at: HashMap<NodeId, usize> = steps[..i].iter().enumerate().map(|(j, s)| (s.node, j)).collect();
    let mut after: Option<usize> = None;
    for x in &steps[i].inputs {
        // A slot no earlier step makes is a parameter or constant.
        if let Some(&j) = made_at.get(x) {
            after = after.max(Some(j));
        }
    }
    for c in &g.node(steps[i].node).control_inputs {
        match ran_at.get(c) {
            Some(&j) => after = after.max(Some(j)),
            None => return i,
        }
    }
    after.map_or(0, |j| j + 1)
}

/// Moves every early-starting step to [`earliest`]; returns how many moved.
fn start_early(steps: &mut Vec<Step>, g: &Graph) -> usize {
    let mut moved = 0;
    for i in 0..steps.len() {
        if !starts_early(g, &steps[i]) {
            continue;
        }
        let to = earliest(steps, g, i);
        if to < i {
            let step = steps.remove(i);
            steps.insert(to, step);
            moved += 1;
        }
    }
    moved
}
