//! The one product kernel behind every matrix product of the attention
//! passes, and the two ways the passes walk it.
//!
//! Every product has the form `C (+)= A·B` with `A` read by broadcasts at
//! any strides (rows of `k`, or columns of `v` read down its rows) and `B`,
//! `C` rows of whole vectors in the task's scratch, so no operand of the
//! other side ever needs a transposed copy. [`tile`] keeps an `MR × NV`
//! block of `C` in registers and walks the depth in order, one fused
//! multiply-add per element and step, so an element's bits depend only on
//! its operands and the depth order — not on the block shape, the width,
//! or how a product is cut into calls (a cut stores and reloads `C`
//! exactly).
//!
//! [`panels`] walks a product row panel by row panel, each with its own
//! range of column vectors (a causal tile's scores: later keys need fewer
//! queries); [`staircase`] walks one whose column vectors each have their
//! own depth range (a causal tile's `P·V`: a vector of queries stops at
//! its last query's last key), cutting the depth where the set of live
//! vectors changes.

use super::vector::Vector;

/// How a [`tile`]'s accumulators start.
#[derive(Clone, Copy)]
pub(super) enum Start {
    /// At zero: `C = A·B`.
    Zero,
    /// At `C`: `C += A·B`.
    Load,
    /// At `C` times a per-column factor (a vector per column vector, at the
    /// pointer, aligned with `C`'s columns): the online softmax's rescale.
    Scaled(*const f32),
}

/// A matrix read by broadcasts: element `(r, k)` at `ptr + r·rs + k·ks`.
#[derive(Clone, Copy)]
pub(super) struct Bcast {
    /// Element `(0, 0)`.
    pub ptr: *const f32,
    /// Distance between rows.
    pub rs: usize,
    /// Distance between depth steps.
    pub ks: usize,
}

impl Bcast {
    /// The same matrix from row `r`, depth `k` on.
    #[inline(always)]
    pub fn at(self, r: usize, k: usize) -> Bcast {
        Bcast { ptr: self.ptr.wrapping_add(r * self.rs + k * self.ks), ..self }
    }
}

/// Rows of vectors: element `(r, col)` at `ptr + r·stride + col`.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    /// Element `(0, 0)`.
    pub ptr: *mut f32,
    /// Distance between rows (a multiple of the lane count).
    pub stride: usize,
}

impl Rows {
    /// Element `(r, col)`'s address.
    #[inline(always)]
    pub fn at(self, r: usize, col: usize) -> *mut f32 {
        self.ptr.wrapping_add(r * self.stride + col)
    }
}

/// `C[r, ..NV·L] (+)= Σ_k A[r, k] · B[k, ..NV·L]` for `r < rows` (`1 ≤
/// rows ≤ MR`): rows past `rows` repeat the last one and are not stored,
/// so `A` is never read past its last row. `ADJACENT` says `A`'s rows are
/// adjacent (`a.rs == 1`).
///
/// # Safety
/// `A` has `rows` rows of `depth` readable values, `B` `depth` rows of
/// `NV·L` readable values, `C` `rows` rows of `NV·L` writable values (and
/// readable unless `start` is `Zero`, the factors too when `Scaled`); the
/// features of `V` are enabled in the caller.
#[inline(always)]
#[allow(clippy::needless_range_loop, reason = "indexed loops over constant bounds keep the block in registers")]
unsafe fn tile<V: Vector, const MR: usize, const NV: usize, const ADJACENT: bool>(
    rows: usize,
    depth: usize,
    a: Bcast,
    b: Rows,
    c: Rows,
    start: Start,
) {
    let l = V::LANES;
    // SAFETY: every access below is inside the matrices the caller
    // described: rows `< rows` of `C`, row `min(r, rows - 1)` of `A`.
    unsafe {
        let mut acc = [[V::zero(); NV]; MR];
        match start {
            Start::Zero => {}
            Start::Load | Start::Scaled(_) => {
                for r in 0..MR.min(rows) {
                    for v in 0..NV {
                        let x = V::load(c.at(r, v * l));
                        acc[r][v] = match start {
                            Start::Scaled(f) => x.mul(V::load(f.add(v * l))),
                            _ => x,
                        };
                    }
                }
            }
        }
        if ADJACENT && rows == MR {
            // One pointer, the rows at constant offsets: with a pointer
            // per row the loop ran out of registers and reloaded them.
            for k in 0..depth {
                let bk = b.at(k, 0);
                let mut bv = [V::zero(); NV];
                for v in 0..NV {
                    bv[v] = V::load(bk.add(v * l));
                }
                let ak = a.ptr.add(k * a.ks);
                for r in 0..MR {
                    let x = V::splat(*ak.add(r));
                    for v in 0..NV {
                        acc[r][v] = x.fma(bv[v], acc[r][v]);
                    }
                }
            }
        } else {
            let mut arow = [a.ptr; MR];
            for r in 0..MR {
                arow[r] = a.ptr.add(r.min(rows - 1) * a.rs);
            }
            for k in 0..depth {
                let bk = b.at(k, 0);
                let mut bv = [V::zero(); NV];
                for v in 0..NV {
                    bv[v] = V::load(bk.add(v * l));
                }
                let ak = k * a.ks;
                for r in 0..MR {
                    let x = V::splat(*arow[r].add(ak));
                    for v in 0..NV {
                        acc[r][v] = x.fma(bv[v], acc[r][v]);
                    }
                }
            }
        }
        for r in 0..MR.min(rows) {
            for v in 0..NV {
                acc[r][v].store(c.at(r, v * l));
            }
        }
    }
}

/// [`tile`] for `nv` column vectors (`1 ≤ nv ≤ NV ≤ 4`).
///
/// # Safety
/// As [`tile`] with `nv` vectors.
#[inline(always)]
unsafe fn tile_n<V: Vector, const MR: usize, const NV: usize, const ADJACENT: bool>(
    nv: usize,
    rows: usize,
    depth: usize,
    a: Bcast,
    b: Rows,
    c: Rows,
    start: Start,
) {
    // SAFETY: forwarded; each arm runs exactly `nv` vectors.
    unsafe {
        match nv {
            1 => tile::<V, MR, 1, ADJACENT>(rows, depth, a, b, c, start),
            2 if NV >= 2 => tile::<V, MR, 2, ADJACENT>(rows, depth, a, b, c, start),
            3 if NV >= 3 => tile::<V, MR, 3, ADJACENT>(rows, depth, a, b, c, start),
            4 if NV >= 4 => tile::<V, MR, 4, ADJACENT>(rows, depth, a, b, c, start),
            _ => unreachable!("attention: {nv} vectors in a block of {NV}"),
        }
    }
}

/// `C[r, cols(r)] = A[r, ..depth] · B[.., cols(r)]` for `r < rows`, by row
/// panels of `MR`: `cols(r0, r1)` gives the column vectors `[lo, hi)` a
/// panel of rows `[r0, r1)` needs (the union of its rows' needs); other
/// columns of `C` are left as they were.
///
/// # Safety
/// As [`tile`] for every panel and the column vectors `cols` gives, which
/// stay within `B`'s and `C`'s rows.
#[inline(always)]
pub(super) unsafe fn panels<V: Vector, const MR: usize, const NV: usize>(
    rows: usize,
    depth: usize,
    a: Bcast,
    b: Rows,
    c: Rows,
    cols: impl Fn(usize, usize) -> (usize, usize),
) {
    let l = V::LANES;
    let mut r0 = 0;
    while r0 < rows {
        let n = MR.min(rows - r0);
        let (lo, hi) = cols(r0, r0 + n);
        let mut v = lo;
        while v < hi {
            let nv = NV.min(hi - v);
            let (bv, cv) = (Rows { ptr: b.at(0, v * l), ..b }, Rows { ptr: c.at(r0, v * l), ..c });
            // SAFETY: forwarded; rows `[r0, r0 + n)`, vectors `[v, v + nv)`.
            unsafe { tile_n::<V, MR, NV, false>(nv, n, depth, a.at(r0, 0), bv, cv, Start::Zero) };
            v += nv;
        }
        r0 += n;
    }
}

/// Most column vectors a [`staircase`] takes.
pub(super) const MAX_VECTORS: usize = 16;

/// `C[r, v] (+)= Σ_{k ∈ [lo[v], hi[v])} A[r, k] · B[k, v]` for `r < rows`
/// (`A`'s rows adjacent, `a.rs == 1`: a column of `v`, `k` or `q`)
/// and column vectors `v < lo.len()`, `A` and `B` indexed from depth
/// `base`, with `lo` and `hi` each non-decreasing (a vector with `lo ≥ hi`
/// is left alone). With `scale`, a vector's accumulators are first
/// multiplied by its factors — which needs every vector that has a range
/// to start at the same depth (the forward's rescale).
///
/// Column vectors go in blocks of `NV`; within a block the depth is cut
/// where a vector starts or stops, and each piece runs the vectors alive
/// throughout it, which are adjacent because the bounds are monotone.
///
/// # Safety
/// As [`tile`] for every piece: `A` readable at rows `< rows`, depths
/// `[base, max hi)`; `B` at those depths for every vector; `C` (and the
/// factors) at every vector.
#[inline(always)]
#[allow(clippy::too_many_arguments, reason = "the operands of one product")]
pub(super) unsafe fn staircase<V: Vector, const MR: usize, const NV: usize>(
    rows: usize,
    base: usize,
    lo: &[usize],
    hi: &[usize],
    a: Bcast,
    b: Rows,
    c: Rows,
    scale: Option<*const f32>,
) {
    let l = V::LANES;
    let nvec = lo.len();
    debug_assert!(hi.len() == nvec && nvec <= MAX_VECTORS && NV <= 4 && a.rs == 1);
    let mut v0 = 0;
    while v0 < nvec {
        let n = NV.min(nvec - v0);
        // The block's cuts: every bound of a live vector, sorted.
        let mut cuts = [0usize; 8];
        let mut ncuts = 0;
        for v in v0..v0 + n {
            if lo[v] < hi[v] {
                for x in [lo[v], hi[v]] {
                    let mut i = ncuts;
                    while i > 0 && cuts[i - 1] > x {
                        cuts[i] = cuts[i - 1];
                        i -= 1;
                    }
                    cuts[i] = x;
                    ncuts += 1;
                }
            }
        }
        for w in 0..ncuts.saturating_sub(1) {
            let (x, y) = (cuts[w], cuts[w + 1]);
            if x == y {
                continue;
            }
            let live = |v: usize| lo[v] <= x && y <= hi[v];
            let Some(first) = (v0..v0 + n).find(|&v| live(v)) else { continue };
            let last = (first..v0 + n).take_while(|&v| live(v)).last().unwrap_or(first);
            // Every live vector starts at `cuts[0]` when scaling, so the one
            // piece from there scales each of them once.
            let start = match scale {
                Some(f) if x == cuts[0] => Start::Scaled(f.wrapping_add(first * l)),
                _ => Start::Load,
            };
            let mut r0 = 0;
            while r0 < rows {
                let nr = MR.min(rows - r0);
                let bp = Rows { ptr: b.at(x - base, first * l), ..b };
                let cp = Rows { ptr: c.at(r0, first * l), ..c };
                // SAFETY: forwarded; rows `[r0, r0 + nr)`, depths `[x, y)`,
                // vectors `[first, last]`, all live there.
                unsafe { tile_n::<V, MR, NV, true>(last - first + 1, nr, y - x, a.at(r0, x - base), bp, cp, start) };
                r0 += nr;
            }
        }
        v0 += n;
    }
}
