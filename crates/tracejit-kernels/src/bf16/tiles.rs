//! The layout of packed operands and the walk over a block's output tiles,
//! shared by the bf16 products and (through `crate::int8`) the int8 ones.
//!
//! Both products reduce over `k` in 32-bit *words*: a word holds two bf16
//! values of consecutive `k` (for `vdpbf16ps`) or four 8-bit values (for
//! `vpdpbusd`), the lower `k` at the lower address; a product of depth `k`
//! has `kw` words per lhs row and rhs column, the last one padded with
//! zeros. A 512-bit register holds one word for each of [`LANES`] output
//! columns, so one instruction advances 16 outputs by one word.
//!
//! - The lhs (packed per call) is cut into panels of [`MR`] rows (the last
//!   one `m % MR` rows when that is not 0). Inside a panel, words come in
//!   groups of [`GROUP`]: `[panel][group][row][GROUP]`, so that a tile
//!   reads one 64-byte line per row every 16 steps, all from one forward
//!   stream (rows laid end to end, six streams 1.5 KiB apart, ran 64×784×512
//!   at 73 G MAC/s where this runs at 116, the instruction's peak). The AMX
//!   kernels take the same layout with panels of [`AMX_MR`] rows: a group
//!   of a panel is then one A tile (16 rows of 64 bytes, 64 bytes apart).
//! - The rhs (packed once) is cut into panels of [`NR`] columns (the last
//!   padded with zero columns): `[panel][depth][NR]`, one step of a tile
//!   reading [`NV`] adjacent registers. A panel's depth is [`rhs_depth`],
//!   `kw` rounded up to whole groups with zero words: the AMX kernels read
//!   16 words of depth per B tile (16 adjacent words of 16 steps, a panel
//!   row apart), and a B tile's words past `kw` must be zeros (the lhs pads
//!   are zeros too, and `0 · Inf` would be NaN).
//!
//! A tile is at most `MR` rows by `NV` registers (6 × 64 outputs): 24
//! accumulators, 4 rhs registers and lhs words broadcast from memory fill
//! the 32 vector registers without spilling, and the operands are read at
//! about one 64-byte line per 6 instructions, well inside the L2's
//! bandwidth, so no depth blocking is needed: each output is accumulated
//! over the whole `k`, in order, by one tile — whichever block or thread
//! computes it, which is why results never depend on the thread count.
//! 6 × 64 rather than 8 × 48 (as fast per tile): the workloads' widths are
//! multiples of 64, and 48-column panels left W9's `n = 256` a last panel
//! of one register, a tile with more loads than multiply-adds (W9's down
//! projection ran at 101 G MAC/s against 110).

use std::cell::RefCell;
use std::ops::Range;

use ndarray::{s, ArrayView2};

/// f32 (or i32) lanes of a 512-bit register.
pub(crate) const LANES: usize = 16;
/// Rows of an lhs panel, and most rows of a tile.
pub(crate) const MR: usize = 6;
/// Registers of an rhs panel, and most registers of a tile.
pub(crate) const NV: usize = 4;
/// Columns of an rhs panel.
pub(crate) const NR: usize = NV * LANES;
/// Words of one row inside one group of an lhs panel (a 64-byte line).
pub(crate) const GROUP: usize = 16;
/// Rows of an lhs panel packed for the AMX kernels: the rows of a tile.
pub(crate) const AMX_MR: usize = 16;
/// Words the AMX kernels may read past a packed lhs: the A tile of a last
/// panel narrower than [`AMX_MR`] rows still loads 16 rows (the rows past
/// the panel go into outputs that are never stored).
pub(crate) const AMX_LHS_SLACK: usize = AMX_MR * GROUP;

/// A 64-byte line of words: packed operands start on a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u32; GROUP]);

/// A zeroed, line-aligned buffer of words.
#[derive(Clone)]
pub(crate) struct Words(Vec<Line>);

impl Words {
    /// `len` zero words (rounded up to whole lines).
    pub(crate) fn zeroed(len: usize) -> Words {
        Words(vec![Line([0; GROUP]); len.div_ceil(GROUP)])
    }

    /// The words of `lines` (packed by the caller).
    pub(crate) fn from_lines(lines: Vec<Line>) -> Words {
        Words(lines)
    }

    /// All the words.
    pub(crate) fn words(&self) -> &[u32] {
        // SAFETY: `Line` is GROUP u32 values without padding.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u32>(), self.0.len() * GROUP) }
    }

    /// All the words, writable.
    pub(crate) fn words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `words`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u32>(), self.0.len() * GROUP) }
    }
}

/// The 16-bit halves of `words` in memory order (a bf16 pair's lower `k`
/// first, whatever the byte order).
pub(crate) fn halves_mut(words: &mut [u32]) -> &mut [u16] {
    // SAFETY: u32 is two u16 without padding, and at least as aligned;
    // uniquely borrowed.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u16>(), words.len() * 2) }
}

/// The bytes of `words` in memory order.
pub(crate) fn bytes_mut(words: &mut [u32]) -> &mut [u8] {
    // SAFETY: u32 is four bytes without padding; uniquely borrowed.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 4) }
}

/// Groups of `kw` words.
pub(crate) fn groups(kw: usize) -> usize {
    kw.div_ceil(GROUP)
}

/// Words of a packed `m`-row lhs of `kw` words per row.
pub(crate) fn lhs_len(m: usize, kw: usize) -> usize {
    m * groups(kw) * GROUP
}

/// Where row `row`'s words of group `g` start in a packed `m`-row lhs
/// of panels of `mr` rows ([`MR`], or [`AMX_MR`] for the AMX kernels).
pub(crate) fn lhs_slot(mr: usize, m: usize, kw: usize, row: usize, g: usize) -> usize {
    let p0 = row / mr * mr;
    let width = mr.min(m - p0);
    p0 * groups(kw) * GROUP + (g * width + row - p0) * GROUP
}

/// Packs the rows of `a [m, k]` (any strides) into `out`
/// ([`lhs_len`]`(m, kw)` words) in panels of `mr` rows, every word of it
/// written: `encode(i, row, words)` writes row `i`'s values at the start
/// of `words`, a row of [`groups`]`(kw)` whole groups whose other words
/// hold `pad`; the row is then copied into its group slots. Rows that are
/// not contiguous (W6's `aᵀ · dy`) are first gathered a panel at a time.
pub(crate) fn pack_rows<T: Copy + Default>(
    a: ArrayView2<'_, T>,
    mr: usize,
    kw: usize,
    out: &mut [u32],
    pad: u32,
    mut encode: impl FnMut(usize, &[T], &mut [u32]),
) {
    let (m, k) = a.dim();
    let mut row_words = vec![pad; groups(kw) * GROUP];
    let mut gathered = Vec::new();
    for p0 in (0..m).step_by(mr) {
        let width = mr.min(m - p0);
        let panel = a.slice(s![p0..p0 + width, ..]);
        let slices = (0..width).all(|r| panel.row(r).to_slice().is_some());
        if !slices {
            gathered.resize(mr * k, T::default());
            gather(panel, &mut gathered);
        }
        for r in 0..width {
            let values = match panel.row(r).to_slice() {
                Some(values) if slices => values,
                _ => &gathered[r * k..(r + 1) * k],
            };
            encode(p0 + r, values, &mut row_words);
            for (g, words) in row_words.chunks_exact(GROUP).enumerate() {
                let at = lhs_slot(mr, m, kw, p0 + r, g);
                out[at..at + GROUP].copy_from_slice(words);
            }
        }
    }
}

/// Copies the rows of `panel` (a panel's rows of `k` values, any
/// strides) into `out`, one after another, walking the source along `k`
/// so that a transposed operand (its rows adjacent in memory) is read a
/// few adjacent values at a time. At most [`MR`] rows per pass: the
/// passes' writes are that many streams `k` values apart, which for a `k`
/// of 1024 f32 all fall in one set of the 12-way L1 (16 such streams, the
/// AMX panels', made W10's int8 `hᵀ · dy` 2x slower).
fn gather<T: Copy>(panel: ArrayView2<'_, T>, out: &mut [T]) {
    let (width, k) = panel.dim();
    let (rs, cs) = (panel.strides()[0], panel.strides()[1]);
    let base = panel.as_ptr();
    let out = &mut out[..width * k];
    for r0 in (0..width).step_by(MR) {
        let rows = MR.min(width - r0);
        for kk in 0..k {
            // SAFETY: `kk < k` and `r < width` address the panel's values.
            let at = |r: usize| unsafe { *base.offset(r as isize * rs + kk as isize * cs) };
            if rows == MR {
                // A full pass unrolled: six loads of adjacent values.
                for r in r0..r0 + MR {
                    out[r * k + kk] = at(r);
                }
            } else {
                for r in r0..r0 + rows {
                    out[r * k + kk] = at(r);
                }
            }
        }
    }
}

/// Words per column of an rhs panel for `kw` words of depth: whole groups
/// (the words past `kw` stay zero).
pub(crate) fn rhs_depth(kw: usize) -> usize {
    groups(kw) * GROUP
}

/// Words of a packed `n`-column rhs of `kw` words per column.
pub(crate) fn rhs_len(n: usize, kw: usize) -> usize {
    n.div_ceil(NR) * rhs_depth(kw) * NR
}

/// Where column `col`'s word `p` lies in a packed rhs of `kw` words per
/// column.
pub(crate) fn rhs_index(kw: usize, p: usize, col: usize) -> usize {
    (col / NR * rhs_depth(kw) + p) * NR + col % NR
}

/// Where column `col`'s words start in a packed rhs of `kw` words per
/// column (step `p`'s word is `p · NR` further).
pub(crate) fn rhs_column(kw: usize, col: usize) -> usize {
    rhs_index(kw, 0, col)
}

/// One tile of a block: what a micro-kernel needs besides the output.
/// Produced by [`walk`] from packed operands, which it points into.
pub(crate) struct Tile {
    /// The tile's first row's words of the first group; row `r`'s word `p`
    /// is at `a[(p / GROUP) * a_group + r * GROUP + p % GROUP]`.
    pub a: *const u32,
    /// Words from one group of the lhs panel to the next.
    pub a_group: usize,
    /// Rows, 1 to [`MR`].
    pub rows: usize,
    /// The output row of the tile's first row.
    pub row: usize,
    /// The first register's words at step 0; register `v`'s lane `l` word
    /// `p` is at `b[p * NR + v * LANES + l]`.
    pub b: *const u32,
    /// Registers, 1 to [`NV`].
    pub vecs: usize,
    /// The output column of the first register's lane 0 (a multiple of
    /// [`LANES`]).
    pub col: usize,
    /// The lanes of each register that belong to the block (and to the
    /// matrix): the only outputs read or written.
    pub masks: [u16; NV],
}

/// Calls `tile` for each tile of the output block `rows × cols` of an `m`
/// by `n` product of depth `kw` words, given its packed operands:
/// rhs panels in the outer loop (a panel's chunk stays in L2 while every
/// lhs panel passes), lhs panels inside. Any block works: one starting
/// inside an lhs panel starts its tiles there, one starting inside a
/// register masks the lanes before it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk(
    lhs: &[u32],
    m: usize,
    rhs: &[u32],
    kw: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    mut tile: impl FnMut(&Tile),
) {
    debug_assert!(lhs.len() >= lhs_len(m, kw) && rows.end <= m);
    let mut v = cols.start / LANES;
    let v_end = cols.end.div_ceil(LANES);
    while v < v_end {
        let (panel, first) = (v / NV, v % NV);
        let vecs = (NV - first).min(v_end - v);
        let mut masks = [0u16; NV];
        for (i, mask) in masks.iter_mut().enumerate().take(vecs) {
            let c0 = (v + i) * LANES;
            let (lo, hi) = (cols.start.max(c0) - c0, cols.end.min(c0 + LANES) - c0);
            *mask = ((1u32 << hi) - (1u32 << lo)) as u16;
        }
        let b = rhs[rhs_column(kw, panel * NR + first * LANES)..].as_ptr();
        let mut r = rows.start;
        while r < rows.end {
            let p0 = r / MR * MR;
            let width = MR.min(m - p0);
            let end = rows.end.min(p0 + width);
            let a = lhs[lhs_slot(MR, m, kw, r, 0)..].as_ptr();
            tile(&Tile { a, a_group: width * GROUP, rows: end - r, row: r, b, vecs, col: v * LANES, masks });
            r = end;
        }
        v += vecs;
    }
}

/// Calls `$f::<R, V>` for the tile shape `(rows, vecs)` (1..=MR, 1..=NV)
/// with the given arguments.
macro_rules! by_shape {
    ($f:ident, $rows:expr, $vecs:expr, ($($arg:expr),*)) => {
        match ($rows, $vecs) {
            (1, 1) => $f::<1, 1>($($arg),*), (1, 2) => $f::<1, 2>($($arg),*),
            (1, 3) => $f::<1, 3>($($arg),*), (1, 4) => $f::<1, 4>($($arg),*),
            (2, 1) => $f::<2, 1>($($arg),*), (2, 2) => $f::<2, 2>($($arg),*),
            (2, 3) => $f::<2, 3>($($arg),*), (2, 4) => $f::<2, 4>($($arg),*),
            (3, 1) => $f::<3, 1>($($arg),*), (3, 2) => $f::<3, 2>($($arg),*),
            (3, 3) => $f::<3, 3>($($arg),*), (3, 4) => $f::<3, 4>($($arg),*),
            (4, 1) => $f::<4, 1>($($arg),*), (4, 2) => $f::<4, 2>($($arg),*),
            (4, 3) => $f::<4, 3>($($arg),*), (4, 4) => $f::<4, 4>($($arg),*),
            (5, 1) => $f::<5, 1>($($arg),*), (5, 2) => $f::<5, 2>($($arg),*),
            (5, 3) => $f::<5, 3>($($arg),*), (5, 4) => $f::<5, 4>($($arg),*),
            (6, 1) => $f::<6, 1>($($arg),*), (6, 2) => $f::<6, 2>($($arg),*),
            (6, 3) => $f::<6, 3>($($arg),*), (6, 4) => $f::<6, 4>($($arg),*),
            shape => unreachable!("tile shape {shape:?} past the largest, (MR, NV)"),
        }
    };
}
pub(crate) use by_shape;

/// The output pointer shared with the pool's workers (the caller waits for
/// them; blocks write disjoint parts).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: the output outlives the call that waits for the blocks, and
// blocks write disjoint parts of it.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// The largest lhs buffer (in words, 16 MiB) a thread keeps between
/// products; a larger one is freed after its product.
const KEEP_SCRATCH: usize = 1 << 22;

thread_local! {
    /// Each thread's buffer for packed lhs operands, grown to the largest
    /// and kept, so that a steady-state call allocates nothing (a 2 MiB
    /// buffer allocated per call costs its page faults every time).
    static SCRATCH: RefCell<Words> = const { RefCell::new(Words(Vec::new())) };
}

/// Runs `f` with `len` words of this thread's scratch (contents
/// unspecified; a nested call gets a fresh buffer).
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.0.len() * GROUP < len {
                *buf = Words::zeroed(len);
            }
            let out = f(&mut buf.words_mut()[..len]);
            if buf.0.len() * GROUP > KEEP_SCRATCH {
                *buf = Words(Vec::new());
            }
            out
        }
        Err(_) => f(&mut Words::zeroed(len).words_mut()[..len]),
    })
}
