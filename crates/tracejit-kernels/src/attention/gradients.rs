//! The backward pass, FlashAttention-2 style: `dq` by tasks over (problem,
//! tile of [`TILE`] queries) and `dk`/`dv` by tasks over (problem, tile of
//! keys), each recomputing its blocks' probabilities `P = exp(S - lse)`
//! from the forward's `lse`, so every output element has one writer and
//! nothing of size `tq × tk` exists.
//!
//! As in the forward, a task's own side lies along the vectors: the `dq`
//! task holds `qᵀ·scale` and `doutᵀ` and computes `Sᵀ`, `dPᵀ` and
//! `dqᵀ += kᵀ·dSᵀ`; the key task holds `kᵀ·scale` and `vᵀ` and computes `S`,
//! `dP`, `dvᵀ += doutᵀ·P` and `dkᵀ += qᵀ·dS`, the other side's rows and
//! columns read in place by broadcasts. `dS = P ⊙ (dP − D)` with
//! `D = rowsum(dout ⊙ out)`, which both passes compute alike.
//!
//! Masked pairs get `P = dS = 0` explicitly after the arithmetic (a fully
//! masked query has `lse = -inf`, where `exp(S - lse)` is `inf`), so they
//! add nothing but `0 · x` to the products.

use super::copy::{pack, unpack, zero};
use super::kernel::{panels, staircase, Bcast, Rows, MAX_VECTORS};
use super::plan::{group_ceil, group_end, group_first, row_dot, Carve, Inputs, OutPtr, BLOCK, TILE};
use super::vector::Vector;
use super::Operand;

/// A backward call as its tasks see it.
pub(super) struct BackwardCall<'a> {
    pub x: Inputs<'a>,
    pub out: Operand<'a>,
    pub lse: &'a [f32],
    pub dout: Operand<'a>,
    pub dq: OutPtr,
    pub dk: OutPtr,
    pub dv: OutPtr,
    /// The tiles in task order (each for every problem), see [`units`].
    pub units: Vec<Unit>,
}

/// A tile of one of the two passes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unit {
    /// Queries `[t·TILE, ..)`: their `dq`.
    Queries(usize),
    /// Keys `[t·TILE, ..)`: their `dk` and `dv`.
    Keys(usize),
}

/// Both passes' tiles, largest estimated work first (ties in a fixed
/// order), so that the pool's last tasks are short ones.
pub(super) fn units(x: &Inputs<'_>) -> Vec<Unit> {
    let (p, rule) = (&x.p, &x.rule);
    let mut units: Vec<(u64, Unit)> = Vec::new();
    for t in 0..p.tq.div_ceil(TILE) {
        let (i0, i1) = (t * TILE, p.tq.min((t + 1) * TILE));
        let keys = (rule.key_end(i0) + rule.key_end(i1 - 1)) as u64 / 2;
        units.push((keys * (i1 - i0) as u64 * (2 * p.d + p.dv) as u64, Unit::Queries(t)));
    }
    for t in 0..p.tk.div_ceil(TILE) {
        let (j0, j1) = (t * TILE, p.tk.min((t + 1) * TILE));
        let queries = (2 * p.tq - rule.query_start(j0) - rule.query_start(j1 - 1)) as u64 / 2;
        units.push((queries * (j1 - j0) as u64 * (2 * p.d + 2 * p.dv) as u64, Unit::Keys(t)));
    }
    units.sort_by_key(|u| std::cmp::Reverse(u.0));
    units.into_iter().map(|u| u.1).collect()
}

/// A `dq` task's scratch regions.
struct QueryScratch {
    /// `qᵀ·scale`, `[d, TILE]`.
    qt: *mut f32,
    /// `doutᵀ`, `[dv, TILE]`.
    dot: *mut f32,
    /// A block's `Sᵀ` and `dPᵀ` (then `dSᵀ`), `[BLOCK, TILE]`.
    st: *mut f32,
    dpt: *mut f32,
    /// `dqᵀ / scale`, `[d, TILE]`.
    dqt: *mut f32,
    /// Per query: `lse` and `D`.
    lse: *mut f32,
    dd: *mut f32,
}

impl QueryScratch {
    fn carve(c: &mut Carve, d: usize, dv: usize) -> QueryScratch {
        QueryScratch {
            qt: c.take(d * TILE),
            dot: c.take(dv * TILE),
            st: c.take(BLOCK * TILE),
            dpt: c.take(BLOCK * TILE),
            dqt: c.take(d * TILE),
            lse: c.take(TILE),
            dd: c.take(TILE),
        }
    }
}

/// A `dk`/`dv` task's scratch regions.
struct KeyScratch {
    /// `kᵀ·scale`, `[d, TILE]`, and `vᵀ`, `[dv, TILE]`.
    kt: *mut f32,
    vt: *mut f32,
    /// A block's `S` (then `P`) and `dP` (then `dS`), `[BLOCK, TILE]`.
    s: *mut f32,
    dp: *mut f32,
    /// `dkᵀ / scale`, `[d, TILE]`, and `dvᵀ`, `[dv, TILE]`.
    dkt: *mut f32,
    dvt: *mut f32,
    /// Per query of the block: `lse` and `D`.
    lse: *mut f32,
    dd: *mut f32,
}

impl KeyScratch {
    fn carve(c: &mut Carve, d: usize, dv: usize) -> KeyScratch {
        KeyScratch {
            kt: c.take(d * TILE),
            vt: c.take(dv * TILE),
            s: c.take(BLOCK * TILE),
            dp: c.take(BLOCK * TILE),
            dkt: c.take(d * TILE),
            dvt: c.take(dv * TILE),
            lse: c.take(BLOCK),
            dd: c.take(BLOCK),
        }
    }
}

/// Floats of scratch a backward task (of either pass) needs.
pub(super) fn scratch_len(d: usize, dv: usize) -> usize {
    let (mut a, mut b) = (Carve::new(std::ptr::null_mut()), Carve::new(std::ptr::null_mut()));
    QueryScratch::carve(&mut a, d, dv);
    KeyScratch::carve(&mut b, d, dv);
    a.used().max(b.used())
}

/// One task's tile of its own side.
#[derive(Clone, Copy)]
struct Tile {
    /// The problem.
    b: usize,
    /// First row (query or key).
    r0: usize,
    /// Rows (at most `TILE`).
    n: usize,
    /// Vectors covering them.
    nv: usize,
}

/// Task `t`: unit `t / batch` for problem `t % batch`.
///
/// # Safety
/// `t < units.len() · batch`; `scratch` addresses [`scratch_len`] writable
/// floats at a 64-byte aligned address; the features of `V` are enabled.
#[inline(always)]
pub(super) unsafe fn task<V: Vector, const MR: usize, const NV: usize>(
    call: &BackwardCall<'_>,
    t: usize,
    scratch: *mut f32,
) {
    let p = &call.x.p;
    let (unit, b) = (call.units[t / p.batch], t % p.batch);
    let (tile, len) = match unit {
        Unit::Queries(t) => (t, p.tq),
        Unit::Keys(t) => (t, p.tk),
    };
    let r0 = tile * TILE;
    let n = TILE.min(len - r0);
    let tile = Tile { b, r0, n, nv: n.div_ceil(V::LANES) };
    // SAFETY: forwarded from the caller.
    unsafe {
        match unit {
            Unit::Queries(_) => queries::<V, MR, NV>(call, tile, scratch),
            Unit::Keys(_) => keys::<V, MR, NV>(call, tile, scratch),
        }
    }
}

/// `P = exp(S - lse)` and `dS = P ⊙ (dP - D)` over `n` vectors: `P` back
/// into `s` when `keep_p`, `dS` into `dp`; `step` floats between vectors.
///
/// # Safety
/// `n` vectors at `s` and `dp`, `step` apart; the features of `V`.
#[inline(always)]
unsafe fn probabilities<V: Vector>(n: usize, step: usize, s: *mut f32, dp: *mut f32, lse: V, dd: V, keep_p: bool) {
    for u in 0..n {
        // SAFETY: the caller's vectors.
        unsafe {
            let (s, dp) = (s.add(u * step), dp.add(u * step));
            let p = V::load(s).sub(lse).exp_flushed();
            if keep_p {
                p.store(s);
            }
            p.mul(V::load(dp).sub(dd)).store(dp);
        }
    }
}

/// The `dq` of one tile of queries: for each block of the keys they see,
/// `Sᵀ`, `dPᵀ`, `dSᵀ` and `dqᵀ += kᵀ·dSᵀ`.
///
/// # Safety
/// As [`task`], for a tile of queries.
#[inline(always)]
unsafe fn queries<V: Vector, const MR: usize, const NV: usize>(call: &BackwardCall<'_>, tile: Tile, scratch: *mut f32) {
    let (x, l) = (&call.x, V::LANES);
    let (p, rule) = (&x.p, &x.rule);
    let s = QueryScratch::carve(&mut Carve::new(scratch), p.d, p.dv);
    let row0 = tile.b * p.tq + tile.r0;
    let width = tile.nv * l;
    // SAFETY: the tile's rows of the inputs and of `dq` (this task's
    // alone), key rows `< tk` of the problem, the scratch regions.
    unsafe {
        let (q, dout) = (x.q.row(tile.b, tile.r0), call.dout.row(tile.b, tile.r0));
        pack::<V>(q, x.q.row_stride, tile.n, p.d, p.scale, s.qt, width);
        pack::<V>(dout, call.dout.row_stride, tile.n, p.dv, 1.0, s.dot, width);
        zero::<V>(s.dqt, p.d, width);
        for lane in 0..width {
            let (mut lse, mut dd) = (0.0, 0.0);
            if lane < tile.n {
                let i = tile.r0 + lane;
                lse = call.lse[row0 + lane];
                dd = row_dot(call.dout.row(tile.b, i), call.out.row(tile.b, i), p.dv);
            }
            *s.lse.add(lane) = lse;
            *s.dd.add(lane) = dd;
        }
        let kend = rule.key_end(tile.r0 + tile.n - 1);
        let mut j0 = 0;
        while j0 < kend {
            let j1 = kend.min(j0 + BLOCK);
            query_block::<V, MR, NV>(x, tile, &s, j0, j1);
            j0 = j1;
        }
        unpack::<V>(s.dqt, tile.n, p.d, p.scale, call.dq.0.add(row0 * p.d));
    }
}

/// Keys `[j0, j1)` of a `dq` task.
///
/// # Safety
/// As [`queries`]; `j0 < j1 ≤ tk`, `j1 - j0 ≤ BLOCK`.
#[inline(always)]
unsafe fn query_block<V: Vector, const MR: usize, const NV: usize>(
    x: &Inputs<'_>,
    tile: Tile,
    s: &QueryScratch,
    j0: usize,
    j1: usize,
) {
    let (p, rule, l) = (&x.p, &x.rule, V::LANES);
    let lo = [j0; MAX_VECTORS];
    let mut hi = [j0; MAX_VECTORS];
    for (v, h) in hi.iter_mut().enumerate().take(tile.nv) {
        *h = rule.key_end(tile.r0 + tile.n.min(group_end(v, l)) - 1).clamp(j0, j1);
    }
    let (krows, vrows) = (x.k.row(tile.b, j0), x.v.row(tile.b, j0));
    let cols = |r0: usize, _: usize| {
        let first = group_first(rule.query_start(j0 + r0).saturating_sub(tile.r0), l);
        (first.min(tile.nv), tile.nv)
    };
    let (st, dpt) = (Rows { ptr: s.st, stride: TILE }, Rows { ptr: s.dpt, stride: TILE });
    // SAFETY: key rows `[j0, j1)`; the scratch regions.
    unsafe {
        let a = Bcast { ptr: krows, rs: x.k.row_stride, ks: 1 };
        panels::<V, MR, NV>(j1 - j0, p.d, a, Rows { ptr: s.qt, stride: TILE }, st, cols);
        let a = Bcast { ptr: vrows, rs: x.v.row_stride, ks: 1 };
        panels::<V, MR, NV>(j1 - j0, p.dv, a, Rows { ptr: s.dot, stride: TILE }, dpt, cols);
        for (v, &h) in hi.iter().enumerate().take(tile.nv) {
            if h > j0 {
                let (lse, dd) = (V::load(s.lse.add(v * l)), V::load(s.dd.add(v * l)));
                probabilities(h - j0, TILE, s.st.add(v * l), s.dpt.add(v * l), lse, dd, false);
            }
        }
        // Masked pairs: dS = 0.
        if rule.causal || rule.mask.is_some() {
            for lane in 0..tile.n {
                let (i, end) = (tile.r0 + lane, hi[lane / l]);
                let limit = rule.key_end(i).clamp(j0, end);
                let col = s.dpt.add(lane);
                for j in limit..end {
                    *col.add((j - j0) * TILE) = 0.0;
                }
                if rule.mask.is_some() {
                    for j in j0..limit {
                        if !rule.allowed(tile.b, i, j) {
                            *col.add((j - j0) * TILE) = 0.0;
                        }
                    }
                }
            }
        }
        let a = Bcast { ptr: krows, rs: 1, ks: x.k.row_stride };
        staircase::<V, MR, NV>(
            p.d,
            j0,
            &lo[..tile.nv],
            &hi[..tile.nv],
            a,
            dpt,
            Rows { ptr: s.dqt, stride: TILE },
            None,
        );
    }
}

/// The `dk` and `dv` of one tile of keys: for each block of the queries
/// that see them, `S`, `dP`, `P`, `dS`, `dvᵀ += doutᵀ·P` and `dkᵀ += qᵀ·dS`.
///
/// # Safety
/// As [`task`], for a tile of keys.
#[inline(always)]
unsafe fn keys<V: Vector, const MR: usize, const NV: usize>(call: &BackwardCall<'_>, tile: Tile, scratch: *mut f32) {
    let (x, l) = (&call.x, V::LANES);
    let (p, rule) = (&x.p, &x.rule);
    let s = KeyScratch::carve(&mut Carve::new(scratch), p.d, p.dv);
    let row0 = tile.b * p.tk + tile.r0;
    let width = tile.nv * l;
    // SAFETY: the tile's rows of the inputs and of `dk`, `dv` (this task's
    // alone), query rows `< tq` of the problem, the scratch regions.
    unsafe {
        let (k, v) = (x.k.row(tile.b, tile.r0), x.v.row(tile.b, tile.r0));
        pack::<V>(k, x.k.row_stride, tile.n, p.d, p.scale, s.kt, width);
        pack::<V>(v, x.v.row_stride, tile.n, p.dv, 1.0, s.vt, width);
        zero::<V>(s.dkt, p.d, width);
        zero::<V>(s.dvt, p.dv, width);
        let mut i0 = rule.query_start(tile.r0);
        while i0 < p.tq {
            let i1 = p.tq.min(i0 + BLOCK);
            key_block::<V, MR, NV>(call, tile, &s, i0, i1);
            i0 = i1;
        }
        unpack::<V>(s.dkt, tile.n, p.d, p.scale, call.dk.0.add(row0 * p.d));
        unpack::<V>(s.dvt, tile.n, p.dv, 1.0, call.dv.0.add(row0 * p.dv));
    }
}

/// Queries `[i0, i1)` of a `dk`/`dv` task.
///
/// # Safety
/// As [`keys`]; `i0 < i1 ≤ tq`, `i1 - i0 ≤ BLOCK`.
#[inline(always)]
unsafe fn key_block<V: Vector, const MR: usize, const NV: usize>(
    call: &BackwardCall<'_>,
    tile: Tile,
    s: &KeyScratch,
    i0: usize,
    i1: usize,
) {
    let (x, l) = (&call.x, V::LANES);
    let (p, rule) = (&x.p, &x.rule);
    // Query `i` needs the key groups up to its last visible key.
    let ends = |i: usize| group_ceil(rule.key_end(i).saturating_sub(tile.r0), l).min(tile.nv);
    // A key group is seen from its first key's first query on.
    let mut lo = [i1; MAX_VECTORS];
    let hi = [i1; MAX_VECTORS];
    for (v, o) in lo.iter_mut().enumerate().take(tile.nv) {
        *o = rule.query_start(tile.r0 + group_first(v * l, l) * l).clamp(i0, i1);
    }
    let row0 = tile.b * p.tq + i0;
    let (qrows, orows) = (x.q.row(tile.b, i0), call.dout.row(tile.b, i0));
    let (qs, os) = (x.q.row_stride, call.dout.row_stride);
    let (sr, dpr) = (Rows { ptr: s.s, stride: TILE }, Rows { ptr: s.dp, stride: TILE });
    // SAFETY: query rows `[i0, i1)`; the scratch regions.
    unsafe {
        let cols = |_: usize, r1: usize| (0, ends(i0 + r1 - 1));
        panels::<V, MR, NV>(
            i1 - i0,
            p.d,
            Bcast { ptr: qrows, rs: qs, ks: 1 },
            Rows { ptr: s.kt, stride: TILE },
            sr,
            cols,
        );
        let a = Bcast { ptr: orows, rs: os, ks: 1 };
        panels::<V, MR, NV>(i1 - i0, p.dv, a, Rows { ptr: s.vt, stride: TILE }, dpr, cols);
        for r in 0..i1 - i0 {
            *s.lse.add(r) = call.lse[row0 + r];
            let (dout, out) = (call.dout.row(tile.b, i0 + r), call.out.row(tile.b, i0 + r));
            *s.dd.add(r) = row_dot(dout, out, p.dv);
            let (lse, dd) = (V::splat(*s.lse.add(r)), V::splat(*s.dd.add(r)));
            probabilities(ends(i0 + r), l, s.s.add(r * TILE), s.dp.add(r * TILE), lse, dd, true);
        }
        // Masked pairs: P = dS = 0.
        if rule.causal || rule.mask.is_some() {
            for r in 0..i1 - i0 {
                let i = i0 + r;
                let end = (tile.r0 + ends(i) * l).min(tile.r0 + tile.n);
                let limit = rule.key_end(i).clamp(tile.r0, end);
                let (ps, dps) = (s.s.add(r * TILE).wrapping_sub(tile.r0), s.dp.add(r * TILE).wrapping_sub(tile.r0));
                // The caller's mask only before the causal limit.
                let from = if rule.mask.is_some() { tile.r0 } else { limit };
                for j in (limit..end).chain((from..limit).filter(|&j| !rule.allowed(tile.b, i, j))) {
                    *ps.wrapping_add(j) = 0.0;
                    *dps.wrapping_add(j) = 0.0;
                }
            }
        }
        let (lo, hi) = (&lo[..tile.nv], &hi[..tile.nv]);
        let a = Bcast { ptr: orows, rs: 1, ks: os };
        staircase::<V, MR, NV>(p.dv, i0, lo, hi, a, sr, Rows { ptr: s.dvt, stride: TILE }, None);
        let a = Bcast { ptr: qrows, rs: 1, ks: qs };
        staircase::<V, MR, NV>(p.d, i0, lo, hi, a, dpr, Rows { ptr: s.dkt, stride: TILE }, None);
    }
}
