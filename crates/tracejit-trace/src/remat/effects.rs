//! The state a checkpointed block touches, kept from its forward and
//! replayed by its recomputation (JAX's and PyTorch's remat semantics).
//!
//! A block's forward runs in a *record* frame: every variable read (a
//! weight, a generator's state, a moving average) is kept, in order, per
//! variable. Its recomputation in the backward runs in a *replay* frame:
//! each read returns the value the forward read instead of the variable's
//! current one, and writes (assignments, a generator's advance) do
//! nothing. So the recomputation draws the forward's random numbers (a
//! draw is a pure function of the state it read), sees the weights the
//! forward saw, and writes no state twice; and the kept reads of
//! trainable variables are what the enclosing tapes differentiate with
//! respect to, which gives those variables their gradients.
//!
//! A frame applies to the trace depth it was opened at: a function traced
//! inside the block (or a control-flow subgraph) reads and writes its
//! variables as usual. Frames nest (a checkpoint inside a checkpoint): a
//! read asks the innermost replay frame at its depth and is kept by every
//! record frame inside it.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use crate::{context, Tensor, Variable};

/// What one checkpoint does with the variable accesses of its block.
enum Frame {
    /// The forward: every read is kept, in program order.
    Record { depth: usize, reads: Vec<(Variable, Tensor)> },
    /// The recomputation: reads return the forward's values (per variable,
    /// in order); writes are dropped.
    Replay { depth: usize, reads: HashMap<u64, VecDeque<Tensor>> },
}

impl Frame {
    fn depth(&self) -> usize {
        match self {
            Frame::Record { depth, .. } | Frame::Replay { depth, .. } => *depth,
        }
    }
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// The variable reads a block's forward made, in program order.
pub(crate) type Reads = Vec<(Variable, Tensor)>;

/// Pops the frame it was pushed with (also on unwind).
struct Pop;

impl Drop for Pop {
    fn drop(&mut self) {
        FRAMES.with(|f| f.borrow_mut().pop());
    }
}

/// Runs the forward `f`, keeping every variable read it makes.
pub(crate) fn recording<T>(f: impl FnOnce() -> T) -> (T, Reads) {
    FRAMES.with(|fr| fr.borrow_mut().push(Frame::Record { depth: context::depth(), reads: Vec::new() }));
    let pop = Pop;
    let out = f();
    let reads = FRAMES.with(|fr| match fr.borrow_mut().last_mut() {
        Some(Frame::Record { reads, .. }) => std::mem::take(reads),
        _ => Vec::new(),
    });
    drop(pop);
    (out, reads)
}

/// Runs the recomputation `f` with `reads` (what the forward read) replayed
/// and every variable write dropped.
pub(crate) fn replaying<T>(reads: &Reads, f: impl FnOnce() -> T) -> T {
    let mut queues: HashMap<u64, VecDeque<Tensor>> = HashMap::new();
    for (v, t) in reads {
        queues.entry(v.id()).or_default().push_back(t.clone());
    }
    FRAMES.with(|fr| fr.borrow_mut().push(Frame::Replay { depth: context::depth(), reads: queues }));
    let _pop = Pop;
    f()
}

/// Whether a read of `var` was replayed, and its value.
pub(crate) enum Read {
    /// No frame applies, or a replay had no value left: read the variable.
    Live,
    /// The forward's value (the recomputation must not read again).
    Replayed(Tensor),
}

/// A read of `var` is about to happen: the replayed value, if a replay
/// frame at this depth holds one.
pub(crate) fn read(var: &Variable) -> Read {
    let depth = context::depth();
    FRAMES.with(|fr| {
        let mut frames = fr.borrow_mut();
        for frame in frames.iter_mut().rev().filter(|f| f.depth() == depth) {
            if let Frame::Replay { reads, .. } = frame {
                return reads.get_mut(&var.id()).and_then(VecDeque::pop_front).map_or(Read::Live, Read::Replayed);
            }
        }
        Read::Live
    })
}

/// A read of `var` gave `value`: every record frame at this depth inside
/// the innermost replay keeps it.
pub(crate) fn note_read(var: &Variable, value: &Tensor) {
    let depth = context::depth();
    FRAMES.with(|fr| {
        let mut frames = fr.borrow_mut();
        for frame in frames.iter_mut().rev().filter(|f| f.depth() == depth) {
            match frame {
                Frame::Record { reads, .. } => reads.push((var.clone(), value.clone())),
                Frame::Replay { .. } => return,
            }
        }
    });
}

/// True while a recomputation runs at this depth: a write is dropped (the
/// forward made it already).
pub(crate) fn writes_dropped() -> bool {
    let depth = context::depth();
    FRAMES.with(|fr| fr.borrow().iter().any(|f| f.depth() == depth && matches!(f, Frame::Replay { .. })))
}

/// True when no frame is open on this thread (the common case, checked
/// first so reads outside checkpoints cost one thread-local test).
pub(crate) fn idle() -> bool {
    FRAMES.with(|fr| fr.borrow().is_empty())
}
