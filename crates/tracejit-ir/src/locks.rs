//! Update locks of variables (TensorFlow's `use_locking=True`): a
//! read-modify-write of a variable and the slots that go with it (an
//! optimizer step's `w`, `m`, `v`) is atomic with respect to every other
//! locked update of any of them, eagerly and inside compiled functions.
//!
//! Each variable may carry an [`UpdateLock`] (a re-entrant mutex:
//! [`crate::VariableResource::update_lock`]). Eager code takes the locks of
//! an update's variables, in id order, around the update. In a graph, the
//! accesses of a locked update are marked (`read_variable[var=v0, locked]`,
//! `assign_variable[.., locked]`); an executor running a schedule builds a
//! [`LockPlan`] once and, per run, takes the locks of *every* locked
//! variable of the schedule at its first locked step (in id order, so two
//! runs never wait for each other in a cycle), and releases each after the
//! last step that accesses it under the lock: conservative two-phase
//! locking, so concurrent runs behave as if their updates ran one after
//! the other. A `cond`, `while` or call whose subgraphs hold locked
//! accesses counts as a locked access of those variables (its subgraph
//! runs re-enter the locks the caller holds).
//!
//! Unlocked accesses take no lock: a forward pass reading a weight while
//! another thread updates it reads the value before or after the update,
//! never a torn one (a read is a snapshot of the value), as in Hogwild
//! training. A graph without locked accesses pays nothing.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;

use cranelift_entity::EntityRef;

use crate::{Graph, Op, VariableResource};

/// A re-entrant lock serializing the locked updates of one variable.
#[derive(Debug, Default)]
pub struct UpdateLock {
    owner: Mutex<Owner>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Owner {
    thread: Option<ThreadId>,
    depth: usize,
}

impl UpdateLock {
    /// A free lock.
    pub fn new() -> UpdateLock {
        UpdateLock::default()
    }

    /// Takes the lock, waiting while another thread holds it; a thread
    /// that holds it already takes it again (a compiled step's subgraph,
    /// or an eager update inside a debugging callback of one).
    pub fn lock(&self) -> UpdateGuard<'_> {
        let me = std::thread::current().id();
        let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        while owner.thread.is_some_and(|t| t != me) {
            owner = self.freed.wait(owner).unwrap_or_else(|e| e.into_inner());
        }
        owner.thread = Some(me);
        owner.depth += 1;
        UpdateGuard { lock: self }
    }
}

/// Holds an [`UpdateLock`] until dropped.
#[derive(Debug)]
pub struct UpdateGuard<'a> {
    lock: &'a UpdateLock,
}

impl Drop for UpdateGuard<'_> {
    fn drop(&mut self) {
        let mut owner = self.lock.owner.lock().unwrap_or_else(|e| e.into_inner());
        owner.depth = owner.depth.saturating_sub(1);
        if owner.depth == 0 {
            owner.thread = None;
            drop(owner);
            self.lock.freed.notify_one();
        }
    }
}

/// Takes the update locks of `vars` (those that have one) in id order,
/// each once: an eager update's locks.
pub fn lock_all(vars: &[Arc<dyn VariableResource>]) -> Vec<UpdateGuard<'_>> {
    let mut order: Vec<&Arc<dyn VariableResource>> = vars.iter().collect();
    order.sort_by_key(|v| v.id());
    order.dedup_by_key(|v| v.id());
    order.iter().filter_map(|v| v.update_lock()).map(UpdateLock::lock).collect()
}

/// The variables `op` accesses under their update lock: its own locked
/// access, or the locked accesses inside its subgraphs and callees.
pub fn locked_variables(op: &Op, graph: &Graph) -> Vec<Arc<dyn VariableResource>> {
    let mut out = Vec::new();
    collect(op, graph, &mut out);
    out
}

fn collect(op: &Op, graph: &Graph, out: &mut Vec<Arc<dyn VariableResource>>) {
    let mut push = |res: &Arc<dyn VariableResource>| {
        if !out.iter().any(|o| o.id() == res.id()) {
            out.push(res.clone());
        }
    };
    match op {
        Op::ReadVariable { var, locked: true } | Op::AssignVariable { var, locked: true, .. } => {
            if let Some(res) = graph.variables.get(*var) {
                push(res);
            }
        }
        Op::Call { func } => {
            if func.index() < graph.library.len() {
                let callee = &graph.library.get(*func).graph;
                callee.nodes().for_each(|(_, n)| collect(&n.op, callee, out));
            }
        }
        Op::Cond { .. } | Op::While { .. } | Op::Fused { .. } => {
            for sub in op.subgraphs() {
                sub.nodes().for_each(|(_, n)| collect(&n.op, sub, out));
            }
        }
        Op::ReadVariable { locked: false, .. }
        | Op::AssignVariable { locked: false, .. }
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Kernel { .. }
        | crate::primitive_ops!() => {}
    }
}

/// When one run of a schedule takes and releases update locks (see the
/// module documentation). Built once per schedule.
#[derive(Debug)]
pub struct LockPlan {
    /// The step at which every lock is taken.
    first: usize,
    /// The locks in the order they are taken (by variable id).
    locks: Vec<Arc<dyn VariableResource>>,
    /// `(after which step, index into locks)`, by step.
    releases: Vec<(usize, usize)>,
}

impl LockPlan {
    /// The plan for a schedule whose steps run `ops` in order; `None` when
    /// no step accesses a variable under its lock.
    pub fn new<'a>(ops: impl IntoIterator<Item = &'a Op>, graph: &Graph) -> Option<LockPlan> {
        let mut first = None;
        let mut last: Vec<(Arc<dyn VariableResource>, usize)> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            for res in locked_variables(op, graph) {
                first.get_or_insert(i);
                match last.iter_mut().find(|(r, _)| r.id() == res.id()) {
                    Some(entry) => entry.1 = i,
                    None => last.push((res, i)),
                }
            }
        }
        let first = first?;
        last.retain(|(r, _)| r.update_lock().is_some());
        last.sort_by_key(|(r, _)| r.id());
        let mut releases: Vec<(usize, usize)> = last.iter().enumerate().map(|(k, (_, step))| (*step, k)).collect();
        releases.sort_unstable();
        Some(LockPlan { first, locks: last.into_iter().map(|(r, _)| r).collect(), releases })
    }

    /// The locks of one run, none taken yet.
    pub fn start(&self) -> HeldLocks<'_> {
        HeldLocks { plan: self, guards: Vec::new(), released: 0 }
    }
}

/// The update locks one run holds; dropping it releases what is left (an
/// error or a panic mid-run included).
#[derive(Debug)]
pub struct HeldLocks<'p> {
    plan: &'p LockPlan,
    /// One per lock of the plan once taken (`None` once released).
    guards: Vec<Option<UpdateGuard<'p>>>,
    /// How many of `plan.releases` have happened.
    released: usize,
}

impl HeldLocks<'_> {
    /// Called before step `step` runs (steps in increasing order): takes
    /// every lock at the plan's first locked step, and releases those whose
    /// last locked step came before `step`.
    #[inline]
    pub fn before(&mut self, step: usize) {
        if step == self.plan.first && self.guards.is_empty() {
            self.guards = self.plan.locks.iter().map(|r| r.update_lock().map(UpdateLock::lock)).collect();
        }
        while let Some(&(after, k)) = self.plan.releases.get(self.released) {
            if after >= step || self.guards.is_empty() {
                break;
            }
            self.guards[k] = None;
            self.released += 1;
        }
    }
}
