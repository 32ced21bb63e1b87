//! What every pass shares: the tile sizes, the masking rule, the call's
//! operands as the tasks see them, the per-thread scratch and the pool.

use std::cell::Cell;

use super::{Bias, Mask, Operand, Problem};

/// Rows of a task's own tile, the vector side of its products (queries in
/// the forward and the `dq` pass, keys in the `dk`/`dv` pass); a multiple
/// of every lane count (16).
pub(super) const TILE: usize = 64;
/// Rows of the other side a task takes at a time (keys, or queries).
pub(super) const BLOCK: usize = 64;

/// Lanes whose ranges (keys a vector of queries needs, and the like) are
/// decided together, whatever the vector width: the products then cover
/// the same pairs at every width — masked pairs included, which matters
/// only for `0 · NaN` — so every path gives the same bits.
pub(super) const GROUP: usize = 16;

/// The end of the group holding vector `v` of `l` lanes (in lanes).
#[inline(always)]
pub(super) fn group_end(v: usize, l: usize) -> usize {
    (v * l / GROUP + 1) * GROUP
}

/// The first vector of `l` lanes of the group holding lane `x`.
#[inline(always)]
pub(super) fn group_first(x: usize, l: usize) -> usize {
    x / GROUP * GROUP / l
}

/// Vectors of `l` lanes covering lanes `[0, x)` in whole groups.
#[inline(always)]
pub(super) fn group_ceil(x: usize, l: usize) -> usize {
    x.div_ceil(GROUP) * GROUP / l
}

/// Who attends to whom: the causal rule (key `j` visible to query `i` when
/// `j ≤ i + tk - tq`) and the caller's mask.
#[derive(Clone, Copy)]
pub(super) struct Rule<'a> {
    pub tq: usize,
    pub tk: usize,
    pub causal: bool,
    /// `tk - tq`: the causal diagonal's offset.
    pub off: isize,
    pub mask: Option<&'a Mask<'a>>,
    /// Added to the scaled scores before the rule and the mask (forward
    /// only).
    pub bias: Option<&'a Bias<'a>>,
}

impl Rule<'_> {
    /// The keys `[0, key_end(i))` the causal rule lets query `i` see (all
    /// `tk` without it).
    #[inline(always)]
    pub fn key_end(&self, i: usize) -> usize {
        if !self.causal {
            return self.tk;
        }
        (i as isize + self.off + 1).clamp(0, self.tk as isize) as usize
    }

    /// The queries `[query_start(j), tq)` the causal rule lets see key `j`
    /// (all of them without it).
    #[inline(always)]
    pub fn query_start(&self, j: usize) -> usize {
        if !self.causal {
            return 0;
        }
        (j as isize - self.off).clamp(0, self.tq as isize) as usize
    }

    /// The caller's mask at `(b, i, j)` (true without one).
    ///
    /// # Safety
    /// `b`, `i` and `j` are within the problem, whose mask was checked to
    /// cover it ([`super::check_strides`]).
    #[inline(always)]
    pub unsafe fn allowed(&self, b: usize, i: usize, j: usize) -> bool {
        match self.mask {
            None => true,
            // SAFETY: the caller's indices; `check_strides` bounded the
            // largest index.
            Some(m) => unsafe { *m.data.get_unchecked(b * m.batch_stride + i * m.row_stride + j * m.col_stride) },
        }
    }
}

/// One call's inputs as its tasks read them.
pub(super) struct Inputs<'a> {
    pub p: Problem,
    pub rule: Rule<'a>,
    pub q: Operand<'a>,
    pub k: Operand<'a>,
    pub v: Operand<'a>,
}

/// An output buffer the tasks write in disjoint parts.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub *mut f32);
// SAFETY: every task writes only its own tile's rows, and the call waits
// for all of them before the buffer's borrow ends.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Carves a task's scratch into regions, each at a multiple of 16 floats
/// (64 bytes) from the aligned base; with a null base it only counts.
pub(super) struct Carve {
    base: *mut f32,
    used: usize,
}

impl Carve {
    /// Regions from `base` (64-byte aligned), or counting only when null.
    pub fn new(base: *mut f32) -> Carve {
        Carve { base, used: 0 }
    }

    /// The next `n` floats.
    pub fn take(&mut self, n: usize) -> *mut f32 {
        let p = self.base.wrapping_add(self.used);
        self.used += n.next_multiple_of(16);
        p
    }

    /// Floats taken so far.
    pub fn used(&self) -> usize {
        self.used
    }
}

thread_local! {
    /// This thread's scratch, kept between tasks and calls.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Largest scratch (in floats) a thread keeps after a task: larger ones
/// (huge `d`) are freed again.
const KEEP: usize = 1 << 18;

/// Runs `f` with `len` floats of scratch at a 64-byte aligned address:
/// the thread's buffer, grown when short (its contents are whatever the
/// last task left).
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(*mut f32) -> R) -> R {
    let mut buf = SCRATCH.take();
    if buf.len() < len + 16 {
        drop(std::mem::take(&mut buf));
        buf = vec![0.0; len + 16];
    }
    let base = buf.as_mut_ptr();
    let r = f(base.wrapping_add(base.align_offset(64)));
    if buf.len() <= KEEP {
        SCRATCH.set(buf);
    }
    r
}

/// Least multiply-adds a call must have to go to the pool: a dispatch
/// costs a few µs when a worker joins, ~20 µs of attention at this size.
const PARALLEL_WORK: u64 = 1 << 20;

/// Runs `f(t)` for `t < tasks`: on the pool when the call has `work`
/// multiply-adds past [`PARALLEL_WORK`] and the thread count is above 1,
/// else in order on the calling thread. Each task writes its own outputs,
/// so the results do not depend on which thread runs it.
pub(super) fn run(tasks: usize, work: u64, f: &(dyn Fn(usize) + Sync)) {
    if tasks > 1 && work >= PARALLEL_WORK {
        if let Some(pool) = crate::threads::pool() {
            pool.run(tasks, f);
            return;
        }
    }
    (0..tasks).for_each(f);
}

/// `Σ a[c]·b[c]` over `n` values: eight partial sums (value `c` into sum
/// `c % 8`, each by fused multiply-adds in order), added pairwise at the
/// end — `rowsum(dout ⊙ out)`, computed alike by both backward passes and
/// every path. One sum was a chain of dependent FMAs, 8% of W9's backward.
///
/// # Safety
/// `a` and `b` address `n` readable values.
#[inline(always)]
pub(super) unsafe fn row_dot(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut s = [0.0f32; 8];
    let full = n / 8 * 8;
    // Whole eights first, so that the sums stay in one vector register.
    for c in (0..full).step_by(8) {
        for (u, su) in s.iter_mut().enumerate() {
            // SAFETY: `c + u < full ≤ n`.
            *su = unsafe { (*a.add(c + u)).mul_add(*b.add(c + u), *su) };
        }
    }
    for (u, su) in s.iter_mut().enumerate().take(n - full) {
        // SAFETY: `full + u < n`.
        *su = unsafe { (*a.add(full + u)).mul_add(*b.add(full + u), *su) };
    }
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// The causal pairs of one problem: `Σ_i key_end(i)` (every pair without
/// the rule).
pub(super) fn pairs(rule: &Rule<'_>) -> u64 {
    (0..rule.tq).map(|i| rule.key_end(i) as u64).sum()
}
