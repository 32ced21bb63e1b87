//! `in_place`: a region (or a `dynamic_update_slice`, or a channels-last
//! convolution over its residual) may write its output over an input that dies at
//! its step, when that input is an intermediate (the caller's inputs and
//! constants are never unique at run time) and the region allows it
//! (`CompiledRegion::may_write_in_place`: same shape and dtype, read
//! element for element). Whether the buffer really is unique is checked
//! when the step runs.

use tracejit_ir::passes::PassResult;

use super::{CodegenContext, SchedulePass};
use crate::schedule::{Fast, Schedule, StepKind};

/// Marks the input each region writes over, if any.
pub(crate) struct InPlace;

impl SchedulePass for InPlace {
    fn name(&self) -> &'static str {
        "in_place"
    }

    fn run(&self, s: &mut Schedule, _cx: &CodegenContext<'_>) -> PassResult {
        let lent: Vec<usize> = s
            .steps
            .iter()
            .filter(|st| matches!(st.kind, StepKind::Param(_) | StepKind::Constant(_)))
            .flat_map(|st| st.outputs.iter().copied())
            .collect();
        let mut marked = 0;
        for st in &mut s.steps {
            if let StepKind::Region(r) = &st.kind {
                st.in_place = (0..st.inputs.len()).find(|&p| {
                    let x = st.inputs[p];
                    st.frees.contains(&x) && !lent.contains(&x) && r.may_write_in_place(p)
                });
            } else if let StepKind::Spatial(op, _) = &st.kind {
                // A convolution's residual that dies here: the output is
                // written over it (each tile reads a vector of it and
                // stores its output there), unless it is also another
                // operand.
                let Some(p) = op.conv_epilogue().and_then(|e| e.residual) else { continue };
                let x = st.inputs[p];
                let own =
                    st.frees.contains(&x) && !lent.contains(&x) && st.inputs.iter().filter(|&&y| y == x).count() == 1;
                st.in_place = own.then_some(p);
            } else if let StepKind::Primitive(tracejit_ir::Op::DynamicUpdateSlice, fast) = &mut st.kind {
                // The updated buffer dies here and is not also the update:
                // the window is written into it (`executor::windows`).
                let x = st.inputs[0];
                let own = st.frees.contains(&x) && !lent.contains(&x) && st.inputs[1..].iter().all(|&y| y != x);
                st.in_place = own.then_some(0);
                if own {
                    *fast = Fast::UpdateInPlace;
                }
            } else {
                continue;
            }
            marked += usize::from(st.in_place.is_some());
        }
        PassResult::count(marked, "steps write in place")
    }
}
