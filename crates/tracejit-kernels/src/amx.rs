//! The AMX micro-kernels shared by the bf16 (`tdpbf16ps`) and the int8
//! (`tdpbusd`) products (Intel Sapphire Rapids and later): 16 × 16 outputs
//! per tile register, advanced by 16 words of depth per instruction (32
//! bf16 or 64 int8 values of `k`), 8192 or 16384 multiply-adds where
//! `vdpbf16ps` does 512 and `vpdpbusd` 1024.
//!
//! A block's outputs are cut into strips of up to 2 × 2 C tiles (32 × 32
//! outputs in `tmm0`–`tmm3`); per group of 16 words a strip loads its two
//! A tiles (`tmm4`, `tmm5`: 16 rows × 16 words of the lhs, one group of an
//! [`AMX_MR`]-row panel, rows 64 bytes apart) and two B tiles (`tmm6`,
//! `tmm7`: 16 words of depth × 16 columns of an rhs panel, rows a panel
//! row, 256 bytes, apart) straight from the packed operands
//! (`crate::bf16::tiles`) and runs four products. Strips at the edges of
//! the matrix or of the block take fewer tiles (1 × 2, 2 × 1, 1 × 1). What
//! a C tile starts from and where it goes is the product's [`Output`]:
//! the bf16 product loads and stores its f32 outputs directly (through a
//! buffer for a tile not wholly inside the block, whose rows and columns
//! outside it are computed and dropped); the int8 one starts from zero
//! and dequantizes each tile from a buffer.
//!
//! What `tdpbf16ps` computes, per output (as Intel's manual defines it
//! and as checked on this Xeon, 51 200 outputs of random operands with
//! the same bits as this model): two f32 sums started at zero, one over
//! the even halves of the 16 words' products and one over the odd halves,
//! each product exact and each addition rounded to nearest even; then
//! `c + (even + odd)`. Subnormal inputs (the accumulator `c` too) are
//! read as zero and subnormal results flushed to zero (DAZ, FTZ, whatever
//! MXCSR says; checked here too), and no floating-point exception is
//! raised. The order is the same for every
//! output, wherever its tile lies: the bits do not depend on the blocks.
//! `tdpbusd` adds the 64 products `u8 · i8` of each output to its i32
//! sum, wrapping as `vpdpbusd` does: integer sums, the same whatever the
//! order.
//!
//! The tiles are configured (`ldtilecfg`) once per block, on the thread
//! that runs it, and released (`tilerelease`) before it returns. Each
//! instruction is its own `asm!` statement: the tile registers are not
//! registers the compiler allocates, so they keep their values between
//! statements of one function that calls nothing in between (the psABI
//! does not preserve them across calls). Hence the two phases of an
//! [`Output`] on each side of the tiles' life: Rust code (which may call
//! `memcpy` or a `#[target_feature]` function) runs before the first C
//! tile is loaded and after the last one is stored, never between.

use std::arch::asm;
use std::ops::Range;

use crate::bf16::tiles::{groups, lhs_slot, rhs_column, rhs_depth, AMX_MR, GROUP, NR};

/// Rows and columns of a C tile, rows of an A tile, columns of a B tile.
pub(crate) const T: usize = 16;

/// The most bytes of rhs a block reads once per row strip: three
/// quarters of a Sapphire Rapids core's 2 MiB L2.
const RHS_IN_L2: usize = 3 << 19;

/// A 64-byte tile configuration (`ldtilecfg`'s operand).
#[repr(C, align(64))]
struct Config([u8; 64]);

/// Palette 1; tiles 0 to 7 all 16 rows of 64 bytes (16 f32 of C, 16
/// words of A or of B).
static CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// A C tile's 16 rows of 16 32-bit values (f32 or i32), 64 bytes apart.
#[repr(C, align(64))]
pub(crate) struct Buffer(pub [u32; T * T]);

impl Buffer {
    /// Where the values start, for `tileloadd` and `tilestored`.
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

/// What a product does with its C tiles: what they start from and where
/// their sums go. For each C tile of a strip (at output `row`, `col`, with
/// its own buffer) the strip calls `prepare`, then (tiles live) `start`,
/// the products and `store`, then `finish`: `start` and `store` may only
/// run tile instructions and inline arithmetic (see the module).
pub(crate) trait Output {
    /// `tdpbusd` (u8 × i8 into i32) rather than `tdpbf16ps` (bf16 pairs
    /// into f32).
    const INT8: bool;

    /// The block's rows and columns (C tiles reach outside them at its
    /// edges; those outputs are dropped).
    fn block(&self) -> (&Range<usize>, &Range<usize>);

    /// Fills the buffer `start` may load (before any tile is live).
    fn prepare(&self, row: usize, col: usize, buf: &mut Buffer) {
        let _ = (row, col, buf);
    }

    /// Loads C tile `t` (0 to 3) with what its sums start from.
    ///
    /// # Safety
    /// AMX, configured; `row`, `col` a tile of the block's strips,
    /// `prepare`d with `buf`.
    unsafe fn start(&self, t: usize, row: usize, col: usize, buf: &mut Buffer);

    /// Stores C tile `t`'s sums (to the outputs, or to `buf` for
    /// `finish`).
    ///
    /// # Safety
    /// As [`Output::start`], which ran for this tile with this `buf`.
    unsafe fn store(&self, t: usize, row: usize, col: usize, buf: &mut Buffer);

    /// Takes the sums `store` left in `buf` to the outputs (after every
    /// tile of the strip is stored).
    fn finish(&self, row: usize, col: usize, buf: &Buffer) {
        let _ = (row, col, buf);
    }
}

/// Computes the output block of an `m`-row product of depth `kw` words
/// from packed operands (the lhs in panels of [`AMX_MR`] rows) into `out`.
///
/// # Safety
/// The CPU has AMX-TILE and the product's AMX-BF16 or AMX-INT8 and the OS
/// granted the tile state (`Isa::has_amx_bf16`, `Isa::has_amx_int8`);
/// `out`'s block lies in the product and its outputs are written by no one
/// else meanwhile; `lhs` is a packed lhs of these sizes followed by
/// `tiles::AMX_LHS_SLACK` readable words, `rhs` a packed rhs.
pub(crate) unsafe fn run_block<O: Output>(lhs: &[u32], m: usize, rhs: &[u32], kw: usize, out: &O) {
    let (rows, cols) = out.block();
    debug_assert!(rows.end <= m && kw > 0);
    // SAFETY: AMX is present and granted (the caller's contract).
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly, preserves_flags)) };
    // The C tiles' buffers, zeroed once per block (per strip, the 4 KiB
    // memset cost a tenth of a 256-deep strip's products).
    let mut buffers = [Buffer([0; T * T]), Buffer([0; T * T]), Buffer([0; T * T]), Buffer([0; T * T])];
    let mut strip_at = |row: usize, col: usize| {
        let (tall, wide) = (row + T < rows.end, col + T < cols.end);
        let b0 = rhs[rhs_column(kw, col)..].as_ptr();
        let b1 = if wide { rhs[rhs_column(kw, col + T)..].as_ptr() } else { b0 };
        // Row `row` starts a panel (a multiple of AMX_MR); a group of a
        // panel of `w` rows is `w · GROUP` words.
        let panel = |r: usize| (lhs[lhs_slot(AMX_MR, m, kw, r, 0)..].as_ptr(), AMX_MR.min(m - r) * GROUP);
        let (a0, step0) = panel(row);
        let (a1, step1) = if tall { panel(row + T) } else { (a0, step0) };
        let s = Strip { a: [a0, a1], a_step: [step0, step1], b: [b0, b1], groups: groups(kw), row, col };
        // SAFETY: the strip's tiles lie in the packed operands (the lhs's
        // slack covers a last panel's 16-row loads); the output is the
        // caller's; the tiles are configured.
        unsafe {
            match (tall, wide) {
                (true, true) => strip::<O, 2, 2>(&s, out, &mut buffers),
                (true, false) => strip::<O, 2, 1>(&s, out, &mut buffers),
                (false, true) => strip::<O, 1, 2>(&s, out, &mut buffers),
                (false, false) => strip::<O, 1, 1>(&s, out, &mut buffers),
            }
        }
    };
    // Strips start on whole tiles: rows on panels, columns on registers.
    let row_starts = (rows.start / T * T..rows.end).step_by(2 * T);
    let col_starts = (cols.start / T * T..cols.end).step_by(2 * T);
    // Row strips outside while the block's rhs columns fit in L2 with room
    // to spare (or are no larger than its lhs rows): each row strip's A
    // tiles stay in L1 while the B tiles pass from L2, and the outputs are
    // written a row strip at a time (on W9's and MiniLM's shapes 10-50%
    // faster than column strips outside, whose 32-column stores down the
    // whole output miss the caches). A larger rhs is read once per column
    // strip instead (256×1536×1536: 25% faster so).
    let (rhs_bytes, lhs_bytes) = (4 * cols.len() * rhs_depth(kw), 4 * rows.len() * rhs_depth(kw));
    if rhs_bytes <= RHS_IN_L2 || rhs_bytes <= lhs_bytes {
        for row in row_starts {
            col_starts.clone().for_each(|col| strip_at(row, col));
        }
    } else {
        for col in col_starts {
            row_starts.clone().for_each(|row| strip_at(row, col));
        }
    }
    // SAFETY: as above.
    unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
}

/// Up to 2 × 2 C tiles of outputs from row `row` and column `col`.
struct Strip {
    /// The first group of each A tile's panel.
    a: [*const u32; 2],
    /// Words from one group of each panel to the next.
    a_step: [usize; 2],
    /// Step 0 of each B tile's first column.
    b: [*const u32; 2],
    groups: usize,
    row: usize,
    col: usize,
}

/// One strip of `R` × `C` tiles (C tile `2i + j` is rows `16i`, columns
/// `16j` of it) over the whole depth; `buffers[t]` is tile `t`'s buffer
/// (what earlier strips left in it is never used).
///
/// # Safety
/// As [`run_block`], with the tile configuration loaded; the strip's tiles
/// lie in the packed operands.
#[inline(always)]
unsafe fn strip<O: Output, const R: usize, const C: usize>(s: &Strip, out: &O, buffers: &mut [Buffer; 4]) {
    let at = |t: usize| (s.row + T * (t / 2), s.col + T * (t % 2));
    let tiles = || (0..R).flat_map(|i| (0..C).map(move |j| 2 * i + j));
    for t in tiles() {
        let (row, col) = at(t);
        out.prepare(row, col, &mut buffers[t]);
    }
    for t in tiles() {
        let (row, col) = at(t);
        // SAFETY: a tile of the strip, configured, prepared.
        unsafe { out.start(t, row, col, &mut buffers[t]) };
    }
    /// `tdpbusd` or `tdpbf16ps` on the given tiles.
    macro_rules! dot {
        ($tiles:literal) => {
            if O::INT8 {
                asm!(concat!("tdpbusd ", $tiles), options(nostack, nomem, preserves_flags))
            } else {
                asm!(concat!("tdpbf16ps ", $tiles), options(nostack, nomem, preserves_flags))
            }
        };
    }
    let [mut a0, mut a1] = s.a.map(|a| a.cast::<u8>());
    let [mut b0, mut b1] = s.b.map(|b| b.cast::<u8>());
    for _ in 0..s.groups {
        // SAFETY: the group's A and B tiles lie in the packed operands.
        unsafe {
            tile_load(4, a0, 4 * GROUP);
            if R == 2 {
                tile_load(5, a1, 4 * GROUP);
            }
            tile_load(6, b0, 4 * NR);
            if C == 2 {
                tile_load(7, b1, 4 * NR);
            }
            dot!("tmm0, tmm4, tmm6");
            if C == 2 {
                dot!("tmm1, tmm4, tmm7");
            }
            if R == 2 {
                dot!("tmm2, tmm5, tmm6");
                if C == 2 {
                    dot!("tmm3, tmm5, tmm7");
                }
            }
        }
        a0 = a0.wrapping_add(4 * s.a_step[0]);
        a1 = a1.wrapping_add(4 * s.a_step[1]);
        b0 = b0.wrapping_add(4 * GROUP * NR);
        b1 = b1.wrapping_add(4 * GROUP * NR);
    }
    for t in tiles() {
        let (row, col) = at(t);
        // SAFETY: as above, after its `start`.
        unsafe { out.store(t, row, col, &mut buffers[t]) };
    }
    for t in tiles() {
        let (row, col) = at(t);
        out.finish(row, col, &buffers[t]);
    }
}

/// Whether the whole C tile at `row`, `col` lies inside the block.
#[inline(always)]
pub(crate) fn whole(rows: &Range<usize>, cols: &Range<usize>, row: usize, col: usize) -> bool {
    rows.start <= row && row + T <= rows.end && cols.start <= col && col + T <= cols.end
}

/// Calls `f(r, j, row_len)` for each row `r` of the C tile at `row`, `col`
/// inside the block: its outputs `j..j + row_len` (tile columns) are.
pub(crate) fn each_row(
    rows: &Range<usize>,
    cols: &Range<usize>,
    row: usize,
    col: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let (r0, r1) = (rows.start.max(row), rows.end.min(row + T));
    let (c0, c1) = (cols.start.max(col), cols.end.min(col + T));
    if c0 < c1 {
        for r in r0..r1 {
            f(r - row, c0 - col, c1 - c0);
        }
    }
}

/// `tilezero tmm{t}` for a C tile (0 to 3).
///
/// # Safety
/// AMX, configured.
#[inline(always)]
pub(crate) unsafe fn tile_zero(t: usize) {
    // SAFETY: the caller's.
    unsafe {
        match t {
            0 => asm!("tilezero tmm0", options(nostack, nomem, preserves_flags)),
            1 => asm!("tilezero tmm1", options(nostack, nomem, preserves_flags)),
            2 => asm!("tilezero tmm2", options(nostack, nomem, preserves_flags)),
            3 => asm!("tilezero tmm3", options(nostack, nomem, preserves_flags)),
            _ => unreachable!("C tiles are tmm0 to tmm3"),
        }
    }
}

/// `tileloadd tmm{t}, [p + stride]`: 16 rows of 64 bytes, `stride` bytes
/// apart.
///
/// # Safety
/// AMX, configured; the rows are readable.
#[inline(always)]
pub(crate) unsafe fn tile_load(t: usize, p: *const u8, stride: usize) {
    macro_rules! load {
        ($tmm:literal) => {
            asm!(concat!("tileloadd ", $tmm, ", [{p} + {s}*1]"), p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly, preserves_flags))
        };
    }
    // SAFETY: the caller's.
    unsafe {
        match t {
            0 => load!("tmm0"),
            1 => load!("tmm1"),
            2 => load!("tmm2"),
            3 => load!("tmm3"),
            4 => load!("tmm4"),
            5 => load!("tmm5"),
            6 => load!("tmm6"),
            7 => load!("tmm7"),
            _ => unreachable!("eight tiles"),
        }
    }
}

/// `tilestored [p + stride], tmm{t}` for a C tile (0 to 3).
///
/// # Safety
/// AMX, configured; the rows are writable and no one else's.
#[inline(always)]
pub(crate) unsafe fn tile_store(t: usize, p: *mut u8, stride: usize) {
    macro_rules! store {
        ($tmm:literal) => {
            asm!(concat!("tilestored [{p} + {s}*1], ", $tmm), p = in(reg) p, s = in(reg) stride,
                options(nostack, preserves_flags))
        };
    }
    // SAFETY: the caller's.
    unsafe {
        match t {
            0 => store!("tmm0"),
            1 => store!("tmm1"),
            2 => store!("tmm2"),
            3 => store!("tmm3"),
            _ => unreachable!("C tiles are tmm0 to tmm3"),
        }
    }
}
