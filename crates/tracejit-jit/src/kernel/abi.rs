//! The kernel ABI: how the launcher (`crate::region`) passes a region's
//! buffers and sizes to a compiled kernel.
//!
//! A kernel is `extern "C" fn(args: *const i64)`. `args` holds, in order,
//! `rows`, `n` (the inner extent), `flags`, a scratch pointer, `count` (the
//! reduced element count of a column region), then for every slot (inputs
//! first, then outputs) its base pointer and its byte stride per row. The
//! kernel runs `rows` rows of `n` inner elements; the launcher
//! (`crate::region`) collapses the domain into this shape and loops over any
//! further outer dimensions itself.

use cranelift_entity::{entity_impl, EntityRef};

use crate::analysis::LoadId;

/// Byte offsets in the argument block.
pub(crate) const ARG_ROWS: i32 = 0;
pub(super) const ARG_N: i32 = 8;
pub(super) const ARG_FLAGS: i32 = 16;
pub(super) const ARG_SCRATCH: i32 = 24;
pub(super) const ARG_COUNT: i32 = 32;
/// First slot: (pointer, row stride) pairs follow.
pub(crate) const ARG_SLOTS: usize = 5;
/// Column kernels: initialize the accumulators.
pub(crate) const FLAG_INIT: i64 = 1;
/// Column kernels: write the kept-size outputs.
pub(crate) const FLAG_FINAL: i64 = 2;

/// An argument slot of a kernel (`slot3`): the kernel's loads first, in
/// [`LoadId`] order, then its outputs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SlotId(u32);
entity_impl!(SlotId, "slot");

impl SlotId {
    /// The slot of input `l`.
    pub(crate) fn of_load(l: LoadId) -> SlotId {
        SlotId::new(l.index())
    }

    /// The slot of output `o` of a kernel with `loads` inputs.
    pub(crate) fn of_output(loads: usize, o: usize) -> SlotId {
        SlotId::new(loads + o)
    }
}
