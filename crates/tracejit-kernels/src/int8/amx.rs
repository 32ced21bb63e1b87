//! The int8 product's outputs on the AMX path (`crate::amx`): its i32 C
//! tiles start from zero, and each is stored to its buffer and
//! dequantized from there by the vector tile's epilogue (`kernel`): the
//! sum plus the column's start (for a signed row), wrapping, to f32, times
//! the row's then the column's scale, added to the output with
//! `accumulate`. Integer sums are the same in any order, so the outputs
//! have the other paths' bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::kernel::Epilogue;
use crate::amx::{each_row, tile_store, tile_zero, Buffer, Output, T};

/// Where a block's outputs go, and how they are dequantized.
struct I8Out<'a> {
    ep: &'a Epilogue<'a>,
    rows: Range<usize>,
    cols: Range<usize>,
}

impl Output for I8Out<'_> {
    const INT8: bool = true;

    fn block(&self) -> (&Range<usize>, &Range<usize>) {
        (&self.rows, &self.cols)
    }

    #[inline(always)]
    unsafe fn start(&self, t: usize, _: usize, _: usize, _: &mut Buffer) {
        // SAFETY: AMX, configured (the caller's).
        unsafe { tile_zero(t) };
    }

    #[inline(always)]
    unsafe fn store(&self, t: usize, _: usize, _: usize, buf: &mut Buffer) {
        // SAFETY: as in `start`; the buffer is 16 rows of 64 bytes.
        unsafe { tile_store(t, buf.ptr(), 4 * T) };
    }

    fn finish(&self, row: usize, col: usize, buf: &Buffer) {
        each_row(&self.rows, &self.cols, row, col, |r, j, len| {
            // SAFETY: AVX-512 (`has_amx_int8` implies VNNI's AVX-512F/BW);
            // the row's outputs `j..j + len` are the block's.
            unsafe { dequantize_row(self.ep, &buf.0[r * T..(r + 1) * T], row + r, col, j, len) };
        });
    }
}

/// Dequantizes one row of a C tile's sums (`sums`, the tile's 16
/// columns from `col`) into the outputs `col + j .. col + j + len` of row
/// `row`, with the vector tile's operations.
///
/// # Safety
/// AVX-512F/BW; those outputs lie in `ep.c` and are written by no one else
/// meanwhile; `ep`'s starts and scales cover `col + 16` (padded to whole
/// panels).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dequantize_row(ep: &Epilogue<'_>, sums: &[u32], row: usize, col: usize, j: usize, len: usize) {
    let mask = ((1u32 << (j + len)) - (1u32 << j)) as u16;
    // SAFETY: 16 values each (the buffer's row; the padded starts and
    // scales); the masked lanes are the block's outputs.
    unsafe {
        let sum = _mm512_loadu_si512(sums.as_ptr().cast());
        let start = if ep.unsigned_rows[row] {
            _mm512_setzero_si512()
        } else {
            _mm512_loadu_si512(ep.starts[col..col + T].as_ptr().cast())
        };
        let x = _mm512_cvtepi32_ps(_mm512_add_epi32(sum, start));
        let col_scale = _mm512_loadu_ps(ep.col_scales[col..col + T].as_ptr());
        let y = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(ep.row_scales[row])), col_scale);
        let out = ep.c.get().wrapping_add(row * ep.n + col);
        let y = if ep.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), y) } else { y };
        _mm512_mask_storeu_ps(out, mask, y);
    }
}

/// Computes the output block `rows × cols` of an `m`-row product of depth
/// `kw` words from packed operands (the lhs in panels of
/// `tiles::AMX_MR` rows) into `ep`.
///
/// # Safety
/// The CPU has AMX-TILE and AMX-INT8 and the OS granted the tile state
/// (`Isa::has_amx_int8`); as `kernel::run_block`, with the lhs followed by
/// `tiles::AMX_LHS_SLACK` readable words.
pub(super) unsafe fn run_block(
    lhs: &[u32],
    m: usize,
    rhs: &[u32],
    kw: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    ep: &Epilogue<'_>,
) {
    let out = I8Out { ep, rows, cols };
    // SAFETY: the caller's.
    unsafe { crate::amx::run_block(lhs, m, rhs, kw, &out) }
}
