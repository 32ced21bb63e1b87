//! The forward pass: one task per (problem, tile of [`TILE`] queries),
//! walking the keys in blocks of [`BLOCK`] with the online softmax.
//!
//! Everything is laid out transposed, queries along the vectors: the task
//! copies its queries once as `qᵀ·scale` (`[d, TILE]`), each block's scores
//! come out as `Sᵀ = k·qᵀ` (`[BLOCK, TILE]`, rows of `k` broadcast as they
//! lie), and the output accumulates as `oᵀ += vᵀ·Pᵀ` (`[dv, TILE]`, columns of
//! `v` broadcast down its rows), copied out transposed at the end. So the
//! running max `m` and sum `l` of each query are lanes of vectors, updated
//! with no horizontal reduction, and no operand of the keys' side is ever
//! copied.
//!
//! Under the causal rule the blocks stop at the tile's last query's last
//! key; within a block the rows of `Sᵀ` start at the first group of 16
//! queries that sees them, and `P·V` stops each group at its last query's
//! last key ([`staircase`]).
//!
//! Masked scores become `-inf` before the softmax (so they weigh exactly
//! 0); whether a query saw any key at all is tracked aside, because a row
//! whose unmasked scores are all `-inf` must come out NaN as in the plain
//! formula, while a fully masked one comes out 0. The max subtracted is
//! `max(m, -f32::MAX)`, which keeps `-inf - -inf` (NaN) out of a row that
//! has seen only `-inf` so far.

use super::copy::{pack, unpack, zero};
use super::kernel::{panels, staircase, Bcast, Rows, MAX_VECTORS};
use super::plan::{group_end, group_first, Carve, Inputs, OutPtr, BLOCK, TILE};
use super::vector::Vector;
use super::Bias;

/// A forward call as its tasks see it.
pub(super) struct ForwardCall<'a> {
    pub x: Inputs<'a>,
    pub out: OutPtr,
    pub lse: OutPtr,
}

/// A task's scratch regions (the bf16 forward, [`super::lowp`], adds its
/// own after them).
pub(super) struct Scratch {
    /// `qᵀ·scale`, `[d, TILE]`.
    pub qt: *mut f32,
    /// A block's scores, then probabilities, `[BLOCK, TILE]`.
    pub st: *mut f32,
    /// The output accumulator, `oᵀ`, `[dv, TILE]`.
    pub ot: *mut f32,
    /// Per query: running max, running sum, the block's rescale factor,
    /// and 1 once a key passed the mask.
    pub m: *mut f32,
    pub l: *mut f32,
    pub alpha: *mut f32,
    pub seen: *mut f32,
}

impl Scratch {
    pub(super) fn carve(c: &mut Carve, d: usize, dv: usize) -> Scratch {
        Scratch {
            qt: c.take(d * TILE),
            st: c.take(BLOCK * TILE),
            ot: c.take(dv * TILE),
            m: c.take(TILE),
            l: c.take(TILE),
            alpha: c.take(TILE),
            seen: c.take(TILE),
        }
    }
}

/// Floats of scratch a forward task needs.
pub(super) fn scratch_len(d: usize, dv: usize) -> usize {
    let mut c = Carve::new(std::ptr::null_mut());
    Scratch::carve(&mut c, d, dv);
    c.used()
}

/// The forward's tasks.
pub(super) fn tasks(x: &Inputs<'_>) -> usize {
    x.p.batch * x.p.tq.div_ceil(TILE)
}

/// One task's queries.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// The problem.
    pub b: usize,
    /// First query.
    pub i0: usize,
    /// Queries (at most `TILE`).
    pub nq: usize,
    /// Vectors of `l` lanes covering them.
    pub nv: usize,
}

impl Tile {
    /// Task `t`'s queries: tiles in decreasing order (under the causal
    /// rule the last queries see the most keys, so the largest tasks start
    /// first), each tile for every problem.
    pub(super) fn of(x: &Inputs<'_>, t: usize, l: usize) -> Tile {
        let tiles = x.p.tq.div_ceil(TILE);
        let i0 = (tiles - 1 - t / x.p.batch) * TILE;
        let nq = TILE.min(x.p.tq - i0);
        Tile { b: t % x.p.batch, i0, nq, nv: nq.div_ceil(l) }
    }

    /// The keys past the last one the tile needs (its last query's).
    pub(super) fn key_end(&self, x: &Inputs<'_>) -> usize {
        x.rule.key_end(self.i0 + self.nq - 1)
    }

    /// Per vector of `l` lanes, the end of the keys of `[j0, j1)` its
    /// group of queries needs (its last query's last, clamped to the
    /// block; `j0` when it needs none).
    #[inline(always)]
    pub(super) fn key_ends(&self, x: &Inputs<'_>, j0: usize, j1: usize, l: usize) -> [usize; MAX_VECTORS] {
        let mut hi = [j0; MAX_VECTORS];
        for (v, h) in hi.iter_mut().enumerate().take(self.nv) {
            let last = self.i0 + self.nq.min(group_end(v, l)) - 1;
            *h = x.rule.key_end(last).clamp(j0, j1);
        }
        hi
    }
}

/// Task `t` ([`Tile::of`]).
///
/// # Safety
/// `t < tasks(x)`; `scratch` addresses [`scratch_len`] writable floats at
/// a 64-byte aligned address; the features of `V` are enabled.
#[inline(always)]
pub(super) unsafe fn task<V: Vector, const MR: usize, const NV: usize>(
    call: &ForwardCall<'_>,
    t: usize,
    scratch: *mut f32,
) {
    let x = &call.x;
    let tile = Tile::of(x, t, V::LANES);
    let s = Scratch::carve(&mut Carve::new(scratch), x.p.d, x.p.dv);
    let kend = tile.key_end(x);
    // SAFETY: the scratch regions and the tile's rows of the inputs and
    // outputs exist (the caller's `t` and scratch, `forward`'s checks).
    unsafe {
        start::<V>(x, tile, &s);
        let mut j0 = 0;
        while j0 < kend {
            let j1 = kend.min(j0 + BLOCK);
            block::<V, MR, NV>(x, tile, &s, j0, j1);
            j0 = j1;
        }
        finish::<V>(call, tile, &s);
    }
}

/// Copies the queries in as `qᵀ·scale` (padding lanes zero) and clears the
/// accumulators.
///
/// # Safety
/// As [`task`].
#[inline(always)]
pub(super) unsafe fn start<V: Vector>(x: &Inputs<'_>, tile: Tile, s: &Scratch) {
    let (p, width) = (&x.p, tile.nv * V::LANES);
    // SAFETY: the tile's query rows; rows `< d`, `< dv` of `[_, TILE]`
    // regions, lanes `< width ≤ TILE`.
    unsafe {
        pack::<V>(x.q.row(tile.b, tile.i0), x.q.row_stride, tile.nq, p.d, p.scale, s.qt, width);
        zero::<V>(s.ot, p.dv, width);
        for lane in 0..width {
            *s.m.add(lane) = f32::NEG_INFINITY;
            *s.l.add(lane) = 0.0;
            // Without a mask, a query sees a key iff the causal rule gives
            // it one; with one, the blocks find out.
            let seen = x.rule.mask.is_none() && lane < tile.nq && x.rule.key_end(tile.i0 + lane) > 0;
            *s.seen.add(lane) = if seen { 1.0 } else { 0.0 };
        }
    }
}

/// One block of keys `[j0, j1)`: scores, masks, the online softmax, `P·V`.
///
/// # Safety
/// As [`task`]; `j0 < j1 ≤ tk`, `j1 - j0 ≤ BLOCK`.
#[inline(always)]
unsafe fn block<V: Vector, const MR: usize, const NV: usize>(
    x: &Inputs<'_>,
    tile: Tile,
    s: &Scratch,
    j0: usize,
    j1: usize,
) {
    let (p, rule, l) = (&x.p, &x.rule, V::LANES);
    // Each group of queries needs the keys up to its last query's last.
    let lo = [j0; MAX_VECTORS];
    let hi = tile.key_ends(x, j0, j1, l);
    let (krows, vrows) = (x.k.row(tile.b, j0), x.v.row(tile.b, j0));
    // SAFETY: key rows `[j0, j1)` of `k` and `v`; the scratch regions.
    unsafe {
        // Sᵀ = k·qᵀ, each panel of keys from the first group of queries
        // that sees its first key.
        let cols = |r0: usize, _: usize| {
            let first = group_first(rule.query_start(j0 + r0).saturating_sub(tile.i0), l);
            (first.min(tile.nv), tile.nv)
        };
        let a = Bcast { ptr: krows, rs: x.k.row_stride, ks: 1 };
        let (qt, st) = (Rows { ptr: s.qt, stride: TILE }, Rows { ptr: s.st, stride: TILE });
        panels::<V, MR, NV>(j1 - j0, p.d, a, qt, st, cols);
        normalize::<V>(x, tile, s, j0, &hi);
        // oᵀ = oᵀ·alpha + vᵀ·Pᵀ.
        let a = Bcast { ptr: vrows, rs: 1, ks: x.v.row_stride };
        let ot = Rows { ptr: s.ot, stride: TILE };
        staircase::<V, MR, NV>(p.dv, j0, &lo[..tile.nv], &hi[..tile.nv], a, st, ot, Some(s.alpha));
    }
}

/// A block's scores `[j0, hi[v])` per vector `v` to probabilities: the
/// masks, then the online softmax.
///
/// # Safety
/// As [`block`]; the scores of those keys computed.
#[inline(always)]
pub(super) unsafe fn normalize<V: Vector>(x: &Inputs<'_>, tile: Tile, s: &Scratch, j0: usize, hi: &[usize]) {
    let l = V::LANES;
    // SAFETY: forwarded.
    unsafe {
        mask::<V>(x, tile, s, j0, &hi[..tile.nv]);
        for (v, &h) in hi.iter().enumerate().take(tile.nv) {
            if h > j0 {
                let o = v * l;
                softmax::<V>(h - j0, s.st.add(o), s.m.add(o), s.l.add(o), s.alpha.add(o));
            }
        }
    }
}

/// Sets the masked scores of keys `[j0, hi[v])` (queries of vector `v` of
/// `l` lanes) to `-inf` and marks the queries that passed the caller's mask.
///
/// # Safety
/// As [`block`].
#[inline(always)]
unsafe fn mask<V: Vector>(x: &Inputs<'_>, tile: Tile, s: &Scratch, j0: usize, hi: &[usize]) {
    let (rule, l) = (&x.rule, V::LANES);
    if let Some(bias) = rule.bias {
        // SAFETY: forwarded.
        unsafe { add_bias::<V>(bias, tile, s, j0, hi) };
    }
    if !rule.causal && rule.mask.is_none() {
        return;
    }
    // A key mask (one row for every query, as a padding mask is) is read
    // once per key instead of once per pair.
    let key_mask = rule.mask.is_some_and(|m| m.row_stride == 0);
    for lane in 0..tile.nq {
        let (i, end) = (tile.i0 + lane, hi[lane / l]);
        let col = s.st.wrapping_add(lane);
        // Keys from the causal limit on, then the mask before it.
        let limit = rule.key_end(i).clamp(j0, end.max(j0));
        // SAFETY: rows `[j0, end)` of the block, lane `< TILE`; the mask
        // at indices within the problem.
        unsafe {
            for j in limit..end {
                *col.add((j - j0) * TILE) = f32::NEG_INFINITY;
            }
            if rule.mask.is_some() && !key_mask {
                let mut seen = false;
                for j in j0..limit {
                    if rule.allowed(tile.b, i, j) {
                        seen = true;
                    } else {
                        *col.add((j - j0) * TILE) = f32::NEG_INFINITY;
                    }
                }
                if seen {
                    *s.seen.add(lane) = 1.0;
                }
            }
        }
    }
    if key_mask {
        // SAFETY: as above.
        unsafe { key_mask_block::<V>(x, tile, s, j0, hi) };
    }
}

/// Adds the caller's bias to the block's scores `[j0, hi[v])` (before the
/// causal rule and the mask, which then set their pairs to `-inf`
/// whatever the bias): a row of keys a vector at a time when the bias does
/// not depend on the query, else pair by pair. Lanes past the tile's
/// queries get a value too and are never stored.
///
/// # Safety
/// As [`block`]; the bias covers the problem ([`super::check_strides`]).
#[inline(always)]
unsafe fn add_bias<V: Vector>(bias: &Bias<'_>, tile: Tile, s: &Scratch, j0: usize, hi: &[usize]) {
    let l = V::LANES;
    let base = tile.b * bias.batch_stride;
    // SAFETY: rows `[j0, hi[v])` of vector `v` of the block, lanes `< TILE`;
    // the bias at indices within the problem.
    unsafe {
        if bias.row_stride == 0 {
            let end = hi.iter().take(tile.nv).copied().max().unwrap_or(j0);
            for j in j0..end {
                let add = V::splat(*bias.data.get_unchecked(base + j * bias.col_stride));
                let row = s.st.add((j - j0) * TILE);
                for (v, &h) in hi.iter().enumerate().take(tile.nv) {
                    if j < h {
                        V::load(row.add(v * l)).add(add).store(row.add(v * l));
                    }
                }
            }
        } else {
            for lane in 0..tile.nq {
                let (i, end) = (tile.i0 + lane, hi[lane / l]);
                let at = base + i * bias.row_stride;
                for j in j0..end {
                    *s.st.add((j - j0) * TILE + lane) += *bias.data.get_unchecked(at + j * bias.col_stride);
                }
            }
        }
    }
}

/// [`mask`] for a mask that does not depend on the query: each masked key
/// clears its row of scores a vector at a time (lanes past a query's causal
/// limit are `-inf` already, so clearing them again changes nothing), and a
/// query saw a key iff the block's first allowed key lies before its limit.
///
/// # Safety
/// As [`block`]; the causal part of [`mask`] done.
#[inline(always)]
unsafe fn key_mask_block<V: Vector>(x: &Inputs<'_>, tile: Tile, s: &Scratch, j0: usize, hi: &[usize]) {
    let (rule, l) = (&x.rule, V::LANES);
    let end = hi.iter().take(tile.nv).copied().max().unwrap_or(j0);
    let mut first = end;
    // SAFETY: rows `[j0, hi[v])` of vector `v` of the block; the mask at
    // indices within the problem (query 0 stands for all of them).
    unsafe {
        let ninf = V::splat(f32::NEG_INFINITY);
        for j in j0..end {
            if rule.allowed(tile.b, 0, j) {
                first = first.min(j);
                continue;
            }
            let row = s.st.add((j - j0) * TILE);
            for (v, &h) in hi.iter().enumerate().take(tile.nv) {
                if j < h {
                    ninf.store(row.add(v * l));
                }
            }
        }
        for lane in 0..tile.nq {
            let limit = rule.key_end(tile.i0 + lane).clamp(j0, hi[lane / l].max(j0));
            if first < limit {
                *s.seen.add(lane) = 1.0;
            }
        }
    }
}

/// The online softmax of one vector of queries over `rows` keys of the
/// block (`st`, rows `TILE` apart): `m` becomes the running max, the
/// scores `exp(s - max(m, -f32::MAX))`, `l` the running sum rescaled by
/// `alpha = exp(old - new)`, which `P·V` applies to the output.
///
/// # Safety
/// `rows` rows of a vector at `st`, a vector at each of `m`, `l`,
/// `alpha`; the features of `V`.
#[inline(always)]
unsafe fn softmax<V: Vector>(rows: usize, st: *mut f32, m: *mut f32, l: *mut f32, alpha: *mut f32) {
    // SAFETY: the caller's vectors.
    unsafe {
        let old = V::load(m);
        // `s.max(acc)` keeps `acc` when `s` is NaN: a NaN score reaches
        // the row through its own `exp` instead.
        let mut acc = [old; 4];
        let mut j = 0;
        while j + 4 <= rows {
            for (u, a) in acc.iter_mut().enumerate() {
                *a = V::load(st.add((j + u) * TILE)).max(*a);
            }
            j += 4;
        }
        while j < rows {
            acc[0] = V::load(st.add(j * TILE)).max(acc[0]);
            j += 1;
        }
        let new = acc[0].max(acc[1]).max(acc[2].max(acc[3]));
        let floor = V::splat(-f32::MAX);
        let (from, to) = (floor.max(old), floor.max(new));
        let a = from.sub(to).exp_flushed();
        let mut sum = V::zero();
        for j in 0..rows {
            let p = st.add(j * TILE);
            let e = V::load(p).sub(to).exp_flushed();
            e.store(p);
            sum = sum.add(e);
        }
        new.store(m);
        V::load(l).fma(a, sum).store(l);
        a.store(alpha);
    }
}

/// Writes the tile's outputs: `o / l` and `lse = max(m, -f32::MAX) + ln l`,
/// or zeros and `-inf` for a query that saw no key.
///
/// # Safety
/// As [`task`].
#[inline(always)]
pub(super) unsafe fn finish<V: Vector>(call: &ForwardCall<'_>, tile: Tile, s: &Scratch) {
    let (p, l) = (&call.x.p, V::LANES);
    let row0 = tile.b * p.tq + tile.i0;
    // SAFETY: the tile's rows of `out` and `lse` (this task's alone);
    // lanes `< nv·L` of the scratch regions.
    unsafe {
        // oᵀ times 1/l per query, then transposed out.
        for lane in 0..tile.nv * l {
            *s.alpha.add(lane) = 1.0 / *s.l.add(lane);
        }
        for c in 0..p.dv {
            for v in 0..tile.nv {
                let o = s.ot.add(c * TILE + v * l);
                V::load(o).mul(V::load(s.alpha.add(v * l))).store(o);
            }
        }
        unpack::<V>(s.ot, tile.nq, p.dv, 1.0, call.out.0.add(row0 * p.dv));
        for lane in 0..tile.nq {
            let lse = call.lse.0.add(row0 + lane);
            if *s.seen.add(lane) == 0.0 {
                std::ptr::write_bytes(call.out.0.add((row0 + lane) * p.dv), 0, p.dv);
                *lse = f32::NEG_INFINITY;
            } else {
                *lse = s.m.add(lane).read().max(-f32::MAX) + s.l.add(lane).read().ln();
            }
        }
    }
}
