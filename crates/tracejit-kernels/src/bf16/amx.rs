//! The bf16 product's outputs on the AMX path (`crate::amx`): its f32 C
//! tiles start from the outputs (with `accumulate`) or from zero and are
//! stored straight back; a tile not wholly inside the block goes through
//! its buffer, only the block's outputs read and written.

use std::ops::Range;

use super::tiles::OutPtr;
use crate::amx::{each_row, tile_load, tile_store, tile_zero, whole, Buffer, Output, T};

/// Where a block's f32 outputs go.
struct F32Out {
    c: *mut f32,
    ldc: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    accumulate: bool,
}

impl F32Out {
    /// The output at row `row`, column `col` of the product.
    fn at(&self, row: usize, col: usize) -> *mut f32 {
        self.c.wrapping_add(row * self.ldc + col)
    }
}

impl Output for F32Out {
    const INT8: bool = false;

    fn block(&self) -> (&Range<usize>, &Range<usize>) {
        (&self.rows, &self.cols)
    }

    fn prepare(&self, row: usize, col: usize, buf: &mut Buffer) {
        if !self.accumulate || whole(&self.rows, &self.cols, row, col) {
            return;
        }
        each_row(&self.rows, &self.cols, row, col, |r, j, len| {
            for x in j..j + len {
                // SAFETY: an output of the block.
                buf.0[r * T + x] = unsafe { *self.at(row + r, col + x) }.to_bits();
            }
        });
    }

    #[inline(always)]
    unsafe fn start(&self, t: usize, row: usize, col: usize, buf: &mut Buffer) {
        // SAFETY: AMX, configured (the caller's); a whole tile's rows lie
        // in `c`, `ldc` apart; the buffer is 16 rows of 64 bytes.
        unsafe {
            if !self.accumulate {
                tile_zero(t);
            } else if whole(&self.rows, &self.cols, row, col) {
                tile_load(t, self.at(row, col).cast(), 4 * self.ldc);
            } else {
                tile_load(t, buf.ptr(), 4 * T);
            }
        }
    }

    #[inline(always)]
    unsafe fn store(&self, t: usize, row: usize, col: usize, buf: &mut Buffer) {
        // SAFETY: as in `start`; the outputs are written by no one else.
        unsafe {
            if whole(&self.rows, &self.cols, row, col) {
                tile_store(t, self.at(row, col).cast(), 4 * self.ldc);
            } else {
                tile_store(t, buf.ptr(), 4 * T);
            }
        }
    }

    fn finish(&self, row: usize, col: usize, buf: &Buffer) {
        if whole(&self.rows, &self.cols, row, col) {
            return;
        }
        each_row(&self.rows, &self.cols, row, col, |r, j, len| {
            for x in j..j + len {
                // SAFETY: an output of the block, written by no one else.
                unsafe { *self.at(row + r, col + x) = f32::from_bits(buf.0[r * T + x]) };
            }
        });
    }
}

/// Computes the output block `rows × cols` of an `m × n` product of depth
/// `kw` words from packed operands (the lhs in panels of
/// [`super::tiles::AMX_MR`] rows) into `c` (row-major, `n` wide): `c =`
/// or, with `accumulate`, `c +=` the product.
///
/// # Safety
/// The CPU has AMX-TILE and AMX-BF16 and the OS granted the tile state
/// (`Isa::has_amx_bf16`); `c` points to `m · n` writable values that no
/// other thread reads or writes inside this block; `lhs` is a packed lhs
/// of these sizes followed by `tiles::AMX_LHS_SLACK` readable words, `rhs`
/// a packed rhs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run_block(
    lhs: &[u32],
    m: usize,
    rhs: &[u32],
    kw: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    c: OutPtr,
    n: usize,
    accumulate: bool,
) {
    debug_assert!(cols.end <= n);
    let out = F32Out { c: c.get(), ldc: n, rows, cols, accumulate };
    // SAFETY: the caller's.
    unsafe { crate::amx::run_block(lhs, m, rhs, kw, &out) }
}
