//! `row_loops`: a `while` loop whose batch rows never meet runs, with more
//! than one thread, as one loop per block of rows, each on its own thread
//! (see `executor/row_blocks.rs` for the rule and `crate::row_blocks` for how the
//! rows are found). The block subgraphs are retyped and prepared on first
//! use, since the thread count may change between calls.

use tracejit_ir::passes::PassResult;
use tracejit_ir::Op;

use super::{CodegenContext, SchedulePass};
use crate::executor::row_blocks;
use crate::schedule::{Schedule, StepKind};

/// Gives each loop whose rows never meet its split.
pub(crate) struct RowLoops;

impl SchedulePass for RowLoops {
    fn name(&self) -> &'static str {
        "row_loops"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        let mut split = 0;
        for st in &mut s.steps {
            let StepKind::While(_, carried, plan) = &mut st.kind else { continue };
            let Op::While { parts, trip_count, .. } = &cx.graph.node(st.node).op else { continue };
            *plan = row_blocks::plan(parts, *carried, *trip_count, cx.opts, cx.gemm_threshold).map(Box::new);
            split += usize::from(plan.is_some());
        }
        PassResult::count(split, "loops run in row blocks")
    }
}
