//! Slot lifetimes: `last_uses` frees each slot at the last step that
//! touches it, `drop_unread` removes the inputs and constants no step
//! reads (a constant read only inside regions, a loop condition's unused
//! state), and `renumber_slots` numbers the slots the schedule still uses
//! densely, so a call's slot table is small.

use tracejit_ir::passes::PassResult;

use super::{CodegenContext, SchedulePass};
use crate::schedule::{Schedule, StepKind};

/// Frees each slot at its last use; the graph's outputs live on.
pub(crate) struct LastUses;

impl SchedulePass for LastUses {
    fn name(&self) -> &'static str {
        "last_uses"
    }

    fn run(&self, s: &mut Schedule, _cx: &CodegenContext<'_>) -> PassResult {
        let mut last: Vec<Option<usize>> = vec![None; s.n_slots];
        for (i, step) in s.steps.iter().enumerate() {
            for &x in step.inputs.iter().chain(&step.outputs) {
                last[x] = Some(i);
            }
        }
        for &o in &s.outputs {
            last[o] = None;
        }
        let mut freed = 0;
        for (x, l) in last.iter().enumerate() {
            if let Some(i) = l {
                if !s.steps[*i].frees.contains(&x) {
                    s.steps[*i].frees.push(x);
                    freed += 1;
                }
            }
        }
        PassResult::count(freed, "slots freed at their last use")
    }
}

/// Removes parameter and constant steps whose slot nothing reads (it is
/// freed where it is made): a constant read only inside regions, an input
/// a loop condition receives but does not use.
pub(crate) struct DropUnread;

impl SchedulePass for DropUnread {
    fn name(&self) -> &'static str {
        "drop_unread"
    }

    fn run(&self, s: &mut Schedule, _cx: &CodegenContext<'_>) -> PassResult {
        let before = s.steps.len();
        let unread = |st: &crate::schedule::Step| {
            matches!(st.kind, StepKind::Constant(_) | StepKind::Param(_))
                && st.frees.len() == 1
                && st.frees[0] == st.outputs[0]
        };
        s.steps.retain(|st| !unread(st));
        PassResult::count(before - s.steps.len(), "unread inputs and constants dropped")
    }
}

/// Numbers the slots the steps use densely, in order of first mention.
pub(crate) struct RenumberSlots;

impl SchedulePass for RenumberSlots {
    fn name(&self) -> &'static str {
        "renumber_slots"
    }

    fn run(&self, s: &mut Schedule, _cx: &CodegenContext<'_>) -> PassResult {
        let mut dense: Vec<Option<usize>> = vec![None; s.n_slots];
        let mut n_used = 0;
        let mut renum = |x: &mut usize| {
            *x = *dense[*x].get_or_insert_with(|| {
                n_used += 1;
                n_used - 1
            });
        };
        for st in &mut s.steps {
            st.inputs.iter_mut().chain(st.outputs.iter_mut()).chain(st.frees.iter_mut()).for_each(&mut renum);
        }
        s.outputs.iter_mut().for_each(&mut renum);
        let before = s.n_slots;
        s.n_slots = n_used;
        PassResult::count(before - n_used, "slots no step uses removed")
    }
}
