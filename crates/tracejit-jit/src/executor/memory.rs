//! Preparing an executable's first call before it is made: what its
//! buffers will take, known from the schedule, and the heap warmed with
//! it ([`Executable::warm_memory`]); its convolutions' filters packed
//! ([`Executable::prepack_filters`]).

use std::collections::{HashMap, VecDeque};

use tracejit_ir::tensor::Storage;

use crate::codegen::graph_to_schedule::slot_types;
use crate::schedule::{Step, StepKind};
use crate::Executable;

impl Executable {
    /// A static estimate of the heap a first call's values take: the
    /// schedule walked in order, each step's outputs counted from their
    /// static types when it writes a new buffer (not a parameter, a
    /// constant, a view, a variable's value or a region writing over a
    /// dying input), served from a buffer freed earlier of the same size
    /// when there is one, as the executable's pool serves a call that has
    /// no reuse plan yet — the first — keeping every freed buffer (at most
    /// [`crate::pool::POOL_MAX`], then the oldest goes back to the
    /// allocator); a `call`, `cond` or `while` step adds its subgraphs'
    /// own, which keep their own pools. Values of unknown size count as
    /// nothing; the kernels' scratch (products' packing, attention's
    /// tiles) is not counted.
    pub fn first_call_bytes(&self) -> usize {
        let sizes = slot_bytes(self);
        let mut held = vec![0usize; self.schedule.n_slots];
        let mut heap = FirstCallHeap::default();
        for step in &self.schedule.steps {
            for (_, sub) in step.kind.subgraphs() {
                heap.total = heap.total.saturating_add(sub.first_call_bytes());
            }
            match step.in_place {
                // The output takes the dying input's buffer.
                Some(k) => {
                    if let (Some(&i), Some(&o)) = (step.inputs.get(k), step.outputs.first()) {
                        held[o] = std::mem::take(&mut held[i]);
                    }
                }
                None if writes_new_buffers(&step.kind) => {
                    for &o in &step.outputs {
                        held[o] = sizes[o];
                        heap.take(sizes[o]);
                    }
                }
                None => {}
            }
            for &f in &step.frees {
                heap.give(std::mem::take(&mut held[f]));
            }
        }
        heap.total
    }

    /// Gives back the buffers its pool keeps between calls, and its
    /// subgraphs' pools, returning their bytes: for memory that another
    /// executable is about to use, such as a function's new trace for
    /// another shape, which then takes the heap these held instead of
    /// fresh pages. The next call allocates anew, and its pool fills
    /// again. A pool in use by a call now is left alone.
    pub fn release_buffers(&self) -> usize {
        let own = self.pool.try_lock().map_or(0, |mut p| p.release());
        let subs: usize =
            self.schedule.steps.iter().flat_map(|s| s.kind.subgraphs()).map(|(_, e)| e.release_buffers()).sum();
        own + subs
    }

    /// Faults in the heap a first call will use ([`crate::malloc::warm`]):
    /// [`Executable::first_call_bytes`] and a thread's share of it on the
    /// calling thread, and that share on each worker of the pool: each
    /// thread runs its share of the split kernels and packs its products'
    /// operands in its own heap (W10's training step, loaded at two
    /// threads on the Zen 5: 2,100 of its first call's 2,900 page faults
    /// were on the worker, packing). For a program that prepares an executable long before its
    /// first call, such as a loaded artifact: the pages are then fresh at
    /// the preparation, not in the call.
    pub fn warm_memory(&self) -> crate::Warmed {
        let bytes = self.first_call_bytes();
        self.target.enter(|| {
            let threads = self.target.resolved_threads();
            // Each thread's share of the scratch, the caller's on top of
            // the values'.
            let share = (bytes / threads).min(crate::malloc::WARM_WORKER_MAX);
            crate::malloc::warm(bytes.saturating_add(share), if threads > 1 { share } else { 0 })
        })
    }

    /// Packs now the filters that the convolutions by a variable's value
    /// or a constant keep (see `spatial::prepack`), in this graph and its
    /// subgraphs, from the values the variables hold now; returns how many
    /// were packed. A convolution whose input has a dim unknown here is
    /// left to pack when called.
    pub fn prepack_filters(&self) -> usize {
        let types = slot_types(&self.graph);
        let producer: HashMap<usize, &Step> =
            self.schedule.steps.iter().flat_map(|s| s.outputs.iter().map(move |&o| (o, s))).collect();
        let mut packed = 0;
        for step in &self.schedule.steps {
            packed += step.kind.subgraphs().iter().map(|(_, e)| e.prepack_filters()).sum::<usize>();
            let StepKind::Spatial(op, Some(kept)) = &step.kind else { continue };
            let (Some(&x), Some(&w)) = (step.inputs.first(), step.inputs.get(1)) else { continue };
            let value: Option<Storage> = match producer.get(&w).map(|s| &s.kind) {
                Some(StepKind::Read(var)) => self.graph.variables.get(*var).map(|v| v.read()),
                Some(StepKind::Constant(c)) => Some(c.clone()),
                _ => None,
            };
            let shape = types.get(x).and_then(|t| t.shape());
            if let (Some(w), Some(x)) = (value, shape) {
                packed += usize::from(crate::spatial::prepack(op, &x, &w, self.target.isa, kept));
            }
        }
        packed
    }
}

/// The heap of [`Executable::first_call_bytes`]'s walk: the pool's freed
/// buffers by size, what went back to the allocator, and what was taken
/// fresh.
#[derive(Default)]
struct FirstCallHeap {
    kept: VecDeque<usize>,
    returned: usize,
    total: usize,
}

impl FirstCallHeap {
    /// A buffer of `bytes`: a kept one of that size, else the allocator's
    /// (from what was returned to it first).
    fn take(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        if let Some(i) = self.kept.iter().position(|&k| k == bytes) {
            self.kept.remove(i);
            return;
        }
        let reused = self.returned.min(bytes);
        self.returned -= reused;
        self.total = self.total.saturating_add(bytes - reused);
    }

    /// A buffer of `bytes` freed: kept by the pool, whose oldest goes
    /// back to the allocator past its size.
    fn give(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.kept.push_back(bytes);
        if self.kept.len() > crate::pool::POOL_MAX {
            self.returned += self.kept.pop_front().unwrap_or(0);
        }
    }
}

/// Whether a step of `kind` writes its outputs into new buffers.
fn writes_new_buffers(kind: &StepKind) -> bool {
    !matches!(
        kind,
        StepKind::Param(_) | StepKind::Constant(_) | StepKind::View(_) | StepKind::Read(_) | StepKind::Assign(..)
    )
}

/// The bytes of each slot's value from its static type (0 when a dim is
/// unknown).
fn slot_bytes(exe: &Executable) -> Vec<usize> {
    let mut sizes: Vec<usize> = slot_types(&exe.graph)
        .into_iter()
        .map(|t| t.shape().and_then(|s| tracejit_ir::tensor::byte_size(t.dtype, &s)).unwrap_or(0))
        .collect();
    sizes.resize(exe.schedule.n_slots, 0);
    sizes
}
