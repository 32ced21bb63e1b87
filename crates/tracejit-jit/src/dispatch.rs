//! Calling a region kernel over a launch's whole domain: in one piece on
//! the calling thread, or — when the estimated work is large and more than
//! one thread is allowed — in parts across the pool ([`crate::threads`]).
//!
//! # Where a launch splits
//!
//! Only where the parts' outputs are independent, so that the result is
//! bit-identical whatever the thread count:
//! - **row** reductions (softmax, layernorm) by whole rows: every row is
//!   reduced by one kernel call, exactly as unsplit;
//! - **elementwise** kernels by rows when there are enough of them, else by
//!   element ranges at multiples of [`ELEMENT_GRANULE`] (a multiple of
//!   every vector step and of the staged chunk, so each element keeps its
//!   place in the vector loops and chunks);
//! - **column** reductions (bias gradients) by ranges of columns at
//!   multiples of [`COLUMN_GRANULE`]: each column is still accumulated over
//!   all its rows, in the reference's order, by one thread.
//!
//! No reduction is ever split along the axis it reduces, so no partial
//! results are combined across threads.
//!
//! # When
//!
//! A launch's work is its element count times a per-element cost estimated
//! from the kernel's ops ([`cost_per_element`]); it splits into at most one
//! part per thread and at most one part per
//! [`split_threshold`](crate::threads::split_threshold) units. Small
//! launches (W1's 16 elements, W8's `[32, 128]` steps) never reach the pool.

use std::ops::Range;

use smallvec::SmallVec;
use tracejit_ir::tensor::{Cost, Exactness};

use cranelift_entity::EntityRef;

use crate::analysis::{Analysis, KernelKind, LOp, LoadId};
use crate::jit::KernelCode;
use crate::kernel::{ARG_SLOTS, FLAG_FINAL, FLAG_INIT};

/// Elementwise kernels split their inner extent at multiples of this many
/// elements (the staged chunk, a multiple of every vector step).
pub(crate) const ELEMENT_GRANULE: usize = 512;
/// Column reductions split their columns at multiples of this many
/// (a multiple of every vector step, and of a cache line).
pub(crate) const COLUMN_GRANULE: usize = 64;

/// Estimated cost of one domain element in units of about a vector lane's
/// simple op: one per load, store and cheap op; more for the f32
/// transcendentals computed in-line or in chunk functions; much more for
/// ops that call a Rust helper per element.
pub(crate) fn cost_per_element(an: &Analysis) -> u64 {
    let mut units = (an.loads.len() + an.outputs.len()) as u64;
    for node in an.nodes.values().filter(|n| n.varying) {
        units += match &node.op {
            LOp::Load(_) | LOp::Const(_) => 0,
            LOp::Select | LOp::Cast | LOp::Clamp(..) | LOp::Reduce(_) => 1,
            LOp::Unary(u) => match (u.cost(), u.exactness()) {
                (Cost::Cheap, _) => 1,
                (Cost::Expensive, Exactness::ApproxF32) if node.dtype == tracejit_ir::tensor::DType::F32 => 8,
                (Cost::Expensive, _) => 40,
            },
            LOp::Binary(b) => match b.cost() {
                Cost::Cheap => 1,
                Cost::Expensive => 40,
            },
        };
    }
    units
}

/// How a launch is shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// Ranges of (flattened outer × kernel) rows.
    Rows(usize),
    /// Ranges of the inner extent, every row each.
    Cols(usize),
}

/// One launch, with every pointer resolved.
pub(crate) struct Calls<'a> {
    pub code: &'a KernelCode,
    pub an: &'a Analysis,
    /// [`cost_per_element`] of `an`.
    pub cost: u64,
    /// Kernel rows per call.
    pub rows: usize,
    /// Inner extent.
    pub n: usize,
    /// Column regions: the reduced element count.
    pub count: usize,
    /// Base pointer per slot (loads, then outputs).
    pub base: &'a [i64],
    /// Byte stride of a kernel row, per slot.
    pub row_strides: &'a [isize],
    /// Outer dims looped over here (outermost first): size and byte strides.
    pub outer: &'a [(usize, SmallVec<[isize; 8]>)],
    /// 8-byte scratch elements one call needs.
    pub scratch_len: usize,
}

impl Calls<'_> {
    /// Calls the kernel over the whole domain, split across the pool when
    /// the work is large. `scratch` is kept between launches (it grows to
    /// one `scratch_len` per part).
    ///
    /// # Safety
    /// Every base pointer addresses a live buffer (inputs, materialized
    /// inputs, constants, outputs with capacity for their shapes) that the
    /// rows, strides, outer dims and `n` were derived from; outputs alias
    /// no input.
    pub(crate) unsafe fn run(&self, scratch: &mut Vec<u64>) {
        let total_outer: usize = self.outer.iter().map(|d| d.0).product();
        let column = self.an.kind == KernelKind::Column;
        let empty = self.rows == 0 || total_outer == 0 || (self.an.kind == KernelKind::Elementwise && self.n == 0);
        if !column && empty {
            return;
        }
        let total_rows = total_outer * self.rows;
        let split = self.split(total_rows).and_then(|s| Some((crate::threads::pool()?, s)));
        let parts = match split {
            Some((pool, s)) => {
                let parts = match s {
                    Split::Rows(t) | Split::Cols(t) => t.min(pool.threads()),
                };
                (parts > 1).then_some((pool, s, parts))
            }
            None => None,
        };
        let len = self.scratch_len;
        // Kernels write their scratch before reading it: capacity suffices.
        scratch.clear();
        scratch.reserve(len * parts.as_ref().map_or(1, |p| p.2));
        let all_cols = 0..self.n;
        match parts {
            None => self.part(0..total_rows, all_cols, scratch.as_mut_ptr() as i64),
            Some((pool, s, parts)) => {
                let at = scratch.as_mut_ptr() as i64;
                let (granule, units) = match s {
                    Split::Rows(_) => (1, total_rows),
                    Split::Cols(_) => {
                        let g = if column { COLUMN_GRANULE } else { ELEMENT_GRANULE };
                        (g, self.n.div_ceil(g))
                    }
                };
                pool.run(parts, &|p| {
                    let (a, b) = (units * p / parts, units * (p + 1) / parts);
                    let scratch = at + (p * len * 8) as i64;
                    match s {
                        Split::Rows(_) => self.part(a..b, 0..self.n, scratch),
                        Split::Cols(_) => self.part(0..total_rows, a * granule..(b * granule).min(self.n), scratch),
                    }
                });
            }
        }
    }

    /// Calls the kernel on flattened rows `rows`, every column, with
    /// scratch at `scratch` (`scratch_len` elements of its own); for
    /// elementwise and row kernels (a column reduction runs whole).
    ///
    /// # Safety
    /// As [`Calls::run`]; concurrent calls take disjoint rows and scratch.
    pub(crate) unsafe fn rows_part(&self, rows: Range<usize>, scratch: i64) {
        debug_assert!(self.an.kind != KernelKind::Column);
        self.part(rows, 0..self.n, scratch)
    }

    /// Calls an elementwise kernel of one row on its elements `cols`
    /// (at multiples of [`ELEMENT_GRANULE`], but for the last).
    ///
    /// # Safety
    /// As [`Calls::rows_part`].
    pub(crate) unsafe fn elements_part(&self, cols: Range<usize>, scratch: i64) {
        debug_assert!(self.an.kind == KernelKind::Elementwise && self.total_rows() == 1);
        self.part(0..1, cols, scratch)
    }

    /// Flattened rows of the domain (outer dims times kernel rows).
    fn total_rows(&self) -> usize {
        self.outer.iter().map(|d| d.0).product::<usize>() * self.rows
    }

    /// How to share out `total_rows` rows of `n`, if the work is worth it
    /// (the part count here is an upper bound; the pool's size caps it).
    fn split(&self, total_rows: usize) -> Option<Split> {
        let threads = crate::threads::num_threads();
        if threads <= 1 {
            return None;
        }
        let elements = (total_rows as u64).saturating_mul(self.n.max(1) as u64);
        let work = elements.saturating_mul(self.cost);
        let by_work = usize::try_from(work / crate::threads::split_threshold()).unwrap_or(usize::MAX);
        let parts = threads.min(by_work);
        if parts < 2 {
            return None;
        }
        let split = match self.an.kind {
            KernelKind::Row => Split::Rows(parts.min(total_rows)),
            KernelKind::Elementwise => {
                // Rows when there are enough of them, else whichever gives
                // more parts.
                let (by_rows, by_cols) = (parts.min(total_rows), parts.min(self.n.div_ceil(ELEMENT_GRANULE)));
                if by_rows >= by_cols {
                    Split::Rows(by_rows)
                } else {
                    Split::Cols(by_cols)
                }
            }
            KernelKind::Column => Split::Cols(parts.min(self.n.div_ceil(COLUMN_GRANULE))),
        };
        match split {
            Split::Rows(t) | Split::Cols(t) if t < 2 => None,
            s => Some(s),
        }
    }

    /// Byte offset of each slot at outer index `o` (flattened).
    fn outer_offsets(&self, mut o: usize, out: &mut [i64]) {
        out.fill(0);
        for (size, st) in self.outer.iter().rev() {
            let i = o % size;
            o /= size;
            for (x, s) in out.iter_mut().zip(st) {
                *x += i as i64 * *s as i64;
            }
        }
    }

    /// Byte step of one inner element per slot: the element size where the
    /// slot varies along the inner extent, 0 where it broadcasts (or, for a
    /// row region's kept outputs, holds one value per row).
    fn col_step(&self, slot: usize) -> i64 {
        let an = self.an;
        let nl = an.loads.len();
        if slot < nl {
            let load = &an.loads[LoadId::new(slot)];
            if load.contig {
                load.dtype.size_of() as i64
            } else {
                0
            }
        } else {
            let o = &an.outputs[slot - nl];
            match an.kind {
                KernelKind::Row if o.kept => 0,
                KernelKind::Row | KernelKind::Elementwise | KernelKind::Column => o.dtype.size_of() as i64,
            }
        }
    }

    /// Calls the kernel on flattened rows `rows` and inner range `cols`,
    /// with scratch at `scratch` (`scratch_len` elements of its own); only
    /// reached through `run`, whose contract makes the pointers valid.
    fn part(&self, rows: Range<usize>, cols: Range<usize>, scratch: i64) {
        let nslots = self.base.len();
        let mut args: SmallVec<[i64; 32]> = SmallVec::from_elem(0, ARG_SLOTS + 2 * nslots);
        args[1] = cols.len() as i64;
        args[3] = scratch;
        args[4] = self.count as i64;
        let mut start: SmallVec<[i64; 8]> = SmallVec::from_elem(0, nslots);
        for (s, p) in start.iter_mut().enumerate() {
            *p = self.base[s] + cols.start as i64 * self.col_step(s);
            args[ARG_SLOTS + 2 * s + 1] = self.row_strides[s] as i64;
        }
        let mut off: SmallVec<[i64; 8]> = SmallVec::from_elem(0, nslots);
        if self.an.kind == KernelKind::Column {
            // Every row of every outer index, accumulated in order.
            let total_outer: usize = self.outer.iter().map(|d| d.0).product();
            let calls = total_outer.max(1);
            args[0] = if total_outer == 0 { 0 } else { self.rows as i64 };
            for call in 0..calls {
                self.outer_offsets(call, &mut off);
                for s in 0..nslots {
                    args[ARG_SLOTS + 2 * s] = start[s] + off[s];
                }
                let mut flags = 0;
                if call == 0 {
                    flags |= FLAG_INIT;
                }
                if call + 1 == calls {
                    flags |= FLAG_FINAL;
                }
                args[2] = flags;
                // SAFETY: `run`'s contract; this part's columns and scratch
                // are its own.
                unsafe { self.call(&args) };
            }
            return;
        }
        args[2] = FLAG_INIT | FLAG_FINAL;
        let mut f = rows.start;
        while f < rows.end {
            let (o, r0) = (f / self.rows, f % self.rows);
            let r1 = self.rows.min(r0 + (rows.end - f));
            self.outer_offsets(o, &mut off);
            for s in 0..nslots {
                args[ARG_SLOTS + 2 * s] = start[s] + off[s] + r0 as i64 * self.row_strides[s] as i64;
            }
            args[0] = (r1 - r0) as i64;
            // SAFETY: `run`'s contract; this part's rows (or columns) and
            // scratch are its own.
            unsafe { self.call(&args) };
            f += r1 - r0;
        }
    }

    /// # Safety
    /// `args` addresses live buffers for the rows, strides and inner extent
    /// it gives (the launcher derived them from the buffers' shapes), with
    /// scratch of `scratch_len` elements; concurrent calls write disjoint
    /// rows or columns and their own scratch.
    unsafe fn call(&self, args: &[i64]) {
        // SAFETY: forwarded from the caller.
        unsafe { self.code.call(args) }
    }
}
