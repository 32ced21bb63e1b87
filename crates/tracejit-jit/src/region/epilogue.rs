//! A region run as the epilogue of the matrix product it consumes: the
//! product's rows are computed in blocks, and each block's rows of the
//! region right after, by the same thread
//! ([`CompiledRegion::try_run_after`]).
//!
//! Why: a recurrent step's `tanh(x_t + h · wh + b)` run as two steps on two
//! threads computes the product in halves, one per thread, and then the
//! region on the calling thread alone, reading the half the other core
//! wrote from that core's cache (W8: 2.7 µs per step against 2.0 on one
//! thread). Here each thread finishes its own rows — product, then
//! `tanh` — and the next step's product reads the rows of `h` its own
//! core wrote.

use std::ops::Range;

use smallvec::SmallVec;
use tracejit_ir::tensor::Storage;

use super::{BufPool, CompiledRegion};
use crate::analysis::KernelKind;
use crate::dispatch::{Calls, ELEMENT_GRANULE};

/// Where the rows of a product lie in the launch of the region that
/// consumes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowMap {
    /// Product rows `a..b` are the launch's rows `a·q..b·q`.
    Rows(usize),
    /// The launch is one row of the product's `m·n` elements (an
    /// elementwise region over inputs of one shape): product rows `a..b`
    /// are its elements `a·n..b·n`.
    Elements,
}

/// The product a region runs after ([`CompiledRegion::try_run_after`]).
pub(crate) struct Product<'a> {
    /// Its rows and columns.
    pub m: usize,
    pub n: usize,
    /// Where its rows lie in the region's launch.
    pub map: RowMap,
    /// Ranges of its rows, tiling `0..m`.
    pub blocks: &'a [Range<usize>],
    /// Computes the given rows.
    pub rows: &'a (dyn Fn(Range<usize>) + Sync),
}

impl CompiledRegion {
    /// Where the rows of an `[m, n]` product that this region reads as one
    /// of its inputs lie in its static launch, when the launch covers the
    /// product's elements exactly, row by row in order, and a block
    /// boundary at product row `cut` keeps every element in its place in
    /// the kernel's vector loops (whole launch rows, or a multiple of
    /// [`ELEMENT_GRANULE`] elements); `None` for column reductions and
    /// regions without a static launch.
    pub(crate) fn product_row_map(&self, m: usize, n: usize, cut: usize) -> Option<RowMap> {
        let l = self.static_launch.as_ref()?;
        if self.an.kind == KernelKind::Column || m == 0 {
            return None;
        }
        let total: usize = l.outer.iter().map(|d| d.0).product::<usize>() * l.rows;
        let q = total / m;
        if total.is_multiple_of(m) && l.n.checked_mul(q) == Some(n) {
            return Some(RowMap::Rows(q));
        }
        let flat = total == 1 && self.an.kind == KernelKind::Elementwise && l.n == m * n;
        (flat && (cut * n).is_multiple_of(ELEMENT_GRANULE)).then_some(RowMap::Elements)
    }

    /// Runs the region on `inputs`, one of which is an `[m, n]` product
    /// still to be computed: for each of its `blocks` of rows, its
    /// `rows` computes them, then the kernel runs on the region's part
    /// that reads them — the blocks across the
    /// pool when it has more than one thread, else in order on this one.
    /// `None` (nothing run) when the inputs are not of the region's static
    /// shapes or the launch does not walk the product's rows
    /// ([`CompiledRegion::product_row_map`]): the caller runs the
    /// product and the region apart.
    ///
    /// `alias` as for `try_run_pooled` (an in-place output over the
    /// product: each block's rows are read before they are written, by
    /// the thread that made them).
    pub(crate) fn try_run_after(
        &self,
        inputs: &[&Storage],
        pool: &mut BufPool,
        alias: Option<(usize, i64)>,
        product: Product<'_>,
    ) -> Option<SmallVec<[Storage; 2]>> {
        let Product { m, n, map, blocks, rows: compute } = product;
        let shapes = self.static_shapes.as_ref()?;
        let fits =
            inputs.len() == shapes.len()
                && inputs.iter().zip(shapes).zip(&self.param_types).all(|((x, s), t)| {
                    x.dtype() == t.dtype && super::same_shape(x.shape(), s) && x.is_standard_layout()
                });
        let cuts_fit = blocks.iter().all(|b| self.product_row_map(m, n, b.start) == Some(map));
        let tiled = blocks.first().is_some_and(|b| b.start == 0)
            && blocks.last().is_some_and(|b| b.end == m)
            && blocks.windows(2).all(|w| w[0].end == w[1].start);
        if !fits || !tiled || !cuts_fit {
            return None;
        }
        let launch = self.static_launch.as_ref()?;
        let threads = if blocks.len() > 1 { crate::threads::pool() } else { None };
        let mut run = |calls: &Calls<'_>, scratch: &mut Vec<u64>| {
            let len = calls.scratch_len;
            // Kernels write their scratch before reading it: capacity suffices.
            scratch.clear();
            scratch.reserve(len * blocks.len());
            let at = scratch.as_mut_ptr() as i64;
            let task = |t: usize| {
                let rows = blocks[t].clone();
                compute(rows.clone());
                let scratch = at + (t * len * 8) as i64;
                // SAFETY: `launch_with` resolved the pointers; the blocks
                // tile the product's rows, which `map` places in the
                // launch, so the tasks cover the domain once, each with
                // scratch of its own.
                match map {
                    RowMap::Rows(q) => unsafe { calls.rows_part(rows.start * q..rows.end * q, scratch) },
                    RowMap::Elements => unsafe { calls.elements_part(rows.start * n..rows.end * n, scratch) },
                }
            };
            match &threads {
                Some(p) => p.run(blocks.len(), &task),
                None => (0..blocks.len()).for_each(task),
            }
        };
        // SAFETY: `run` calls the kernel over the whole domain: the blocks
        // tile `0..m`, placed in the launch by `map`.
        Some(unsafe { self.launch_with(inputs, launch, pool, alias, &mut run) })
    }
}
