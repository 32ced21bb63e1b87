//! bf16 matrix products accumulated in f32, and f32 ⇄ bf16 slices: the
//! reduced-precision matmul of autocast (an f32 activation times a weight
//! rounded to bf16 once per version).
//!
//! How: the rhs `b [k, n]` is packed once ([`PackedBf16`]) as bf16 pairs
//! along `k` in panels of 64 columns; the lhs is rounded to bf16 and
//! packed per call (in a buffer each thread keeps), then the output is
//! cut into blocks fixed by the sizes ([`crate::threads::run_gemm_blocks`])
//! and each block into tiles of up to 6 × 64 outputs, each accumulated
//! over the whole depth by one `vdpbf16ps` micro-kernel (AVX-512 BF16: 32
//! multiply-adds per instruction, twice f32 FMA's rate) or by portable f32
//! code with the same order of operations. Where the CPU has AMX (Intel
//! Sapphire Rapids and later; [`Isa::has_amx_bf16`]) the blocks run on the
//! tile registers instead, 16 × 16 outputs per tile advanced by 32 values
//! of `k` per `tdpbf16ps` (`amx`), the lhs packed in panels of 16 rows.
//! The layout and the tile walk are in `tiles`, shared with
//! [`crate::int8`]. Where the CPU has no bf16 products but AVX2 (an AMD
//! Zen 3), both operands are packed widened back to f32 (`wide`) and an
//! f32 FMA tile sums them in `vdpbf16ps`'s order, with the portable
//! path's bits at the f32 GEMM's rate.
//!
//! # Accuracy
//!
//! Each input is rounded to bf16 (8 significant bits: relative error at
//! most 2⁻⁸, so at most 2⁻⁷ for a product), the products of bf16 values
//! are exact in f32, and the sums are f32 (`k` roundings of at most 2⁻²⁴
//! each). Against the f64 product of the original values, every output `c`
//! satisfies
//!
//! `|c − c_f64| ≤ (2⁻⁷ + 1.01 · k · 2⁻²⁴) · Σᵢ |aᵢ|·|bᵢ|` (plus
//! `|c₀| · k · 2⁻²⁴` for the `c₀` it starts from with `accumulate`),
//!
//! the first term from the inputs' rounding (far smaller in practice, the
//! roundings being independent: on the workloads' shapes with uniform
//! random inputs `max |c − c_f64|` is about 2·10⁻³ of `max |c_f64|`,
//! `examples/lowp_gemm.rs`), the second from the summation; inputs
//! already in bf16 have only the second. The vector, the wide and the
//! portable paths compute the same operations in the same order and give
//! the same bits (see `wide` for one corner of its FMAs), except where a subnormal
//! appears: `vdpbf16ps` flushes subnormal inputs and results to zero, the
//! portable path keeps them (both within the bound, plus
//! `2⁻¹²⁶ · (1 + |aᵢ| + |bᵢ|)` per term: a flushed input loses at most
//! `2⁻¹²⁶` times the other factor, a flushed result at most `2⁻¹²⁶`).
//! NaN and ±Inf propagate as in f32 arithmetic.
//!
//! The AMX path sums in another order, so its bits differ from the
//! others', but it is within the same bound. Per 16 words of depth
//! `tdpbf16ps` computes, for each output, two f32 sums from zero (one over
//! the products of the pairs' lower halves, one over the upper halves),
//! adds them, and adds that to the output; each product of two bf16
//! values is exact in f32 (8 + 8 significant bits), each addition rounds
//! to nearest even, and subnormal inputs (a subnormal `c₀` too) and
//! results are flushed to zero (DAZ and FTZ whatever MXCSR says, no
//! exception raised; Intel's manual, and checked on this Xeon). That is a summation tree over the `k`
//! products and `c₀` (the zero pads add nothing and round nothing), and
//! in any such tree a term passes through at most `k` roundings: the
//! bound's `1.01 · k · 2⁻²⁴` holds as for the sequential sum (with the
//! flushes' `2⁻¹²⁶` terms above). NaN and ±Inf propagate as in f32
//! arithmetic; an output whose sum would pass ±Inf only part of the way
//! (f32 overflow of a partial sum) may differ between the orders.
//!
//! # Determinism
//!
//! Every output is summed over `k` in one fixed order by one tile (on
//! the AMX path by one tile register, the same operations wherever the
//! output lies in it), whichever block or thread computes it: results keep
//! their bits for every thread count, on every path.

use half::bf16;
use ndarray::ArrayView2;

use crate::{threads, Isa};

#[cfg(target_arch = "x86_64")]
mod amx;
mod convert;
mod kernel;
mod pack;
pub(crate) mod tiles;
mod wide;

pub use convert::{bf16_to_f32_slice, f32_to_bf16_slice};

use tiles::{lhs_len, with_scratch, OutPtr, Words, AMX_LHS_SLACK};

/// A right operand `b [k, n]` packed once for [`gemm_bf16`] and
/// [`gemm_bf16_from_f32`]: bf16 pairs along `k` (an odd `k` padded with a
/// zero), in panels of 64 columns (the last padded with zero columns) as
/// the micro-kernel reads them. Pack a weight once per version and reuse
/// it for every product.
///
/// ```
/// use ndarray::array;
/// use tracejit_kernels::bf16::PackedBf16;
///
/// let w = PackedBf16::from_f32(array![[1.0f32, 2.0, 3.0]].view());
/// assert_eq!((w.k(), w.n()), (1, 3));
/// ```
#[derive(Clone)]
pub struct PackedBf16 {
    k: usize,
    n: usize,
    words: Words,
    /// In the wide layout (`wide`): f32 slots for a CPU without bf16
    /// products.
    wide: bool,
}

impl PackedBf16 {
    /// Packs `b [k, n]` (any strides), rounding each value to bf16 as
    /// [`half::bf16::from_f32`] does, for the kernels of [`Isa::current`]
    /// (see [`PackedBf16::from_f32_for`]).
    pub fn from_f32(b: ArrayView2<'_, f32>) -> Self {
        Self::pack(b, Isa::current())
    }

    /// Packs `b [k, n]` (any strides) for the kernels of [`Isa::current`].
    pub fn from_bf16(b: ArrayView2<'_, bf16>) -> Self {
        Self::pack(b, Isa::current())
    }

    /// [`PackedBf16::from_f32`] for the kernels of `isa`: where it has no
    /// bf16 products (an AVX2 CPU) the values are widened back to f32
    /// while packed, twice the memory, for an f32 FMA kernel with the
    /// same results. A packing runs under any `Isa`; the products are
    /// fastest under the one it was packed for.
    pub fn from_f32_for(b: ArrayView2<'_, f32>, isa: Isa) -> Self {
        Self::pack(b, isa)
    }

    /// [`PackedBf16::from_bf16`] for the kernels of `isa` (see
    /// [`PackedBf16::from_f32_for`]).
    pub fn from_bf16_for(b: ArrayView2<'_, bf16>, isa: Isa) -> Self {
        Self::pack(b, isa)
    }

    fn pack<T: pack::LhsValue + Sync>(b: ArrayView2<'_, T>, isa: Isa) -> Self {
        let (k, n) = b.dim();
        let wide = wide::chosen(isa);
        let words = pack::pack_rhs_split(b, isa, wide);
        PackedBf16 { k, n, words, wide }
    }

    /// The depth (rows of `b`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The columns of `b`.
    pub fn n(&self) -> usize {
        self.n
    }
}

impl std::fmt::Debug for PackedBf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedBf16 {{ k: {}, n: {} }}", self.k, self.n)
    }
}

/// `c = a · b` (or `c += a · b` with `accumulate`) for a bf16 `a [m, k]`
/// (any strides, packed per call) and a packed `b [k, n]`, accumulated in
/// f32 into `c [m, n]` (row-major, contiguous); see the module for the
/// accuracy. Runs on the AMX tiles where `isa` has AMX bf16, `vdpbf16ps`
/// where it has AVX-512 BF16, portable f32 code otherwise, over the thread
/// pool for large products (the same bits for every thread count).
///
/// ```
/// use half::bf16;
/// use ndarray::array;
/// use tracejit_kernels::{bf16::{gemm_bf16, PackedBf16}, Isa};
///
/// let a = array![[1.0f32, 2.0], [3.0, 4.0]].mapv(bf16::from_f32);
/// let b = PackedBf16::from_f32(array![[1.0f32, 0.5], [0.25, 2.0]].view());
/// let mut c = [1.0f32; 4];
/// gemm_bf16(a.view(), &b, &mut c, true, Isa::native());
/// assert_eq!(c, [2.5, 5.5, 5.0, 10.5]);
/// ```
///
/// # Panics
/// If `a`'s columns are not `b.k()` or `c` does not hold `m · n` values.
pub fn gemm_bf16(a: ArrayView2<'_, bf16>, b: &PackedBf16, c: &mut [f32], accumulate: bool, isa: Isa) {
    product("gemm_bf16", a, b, c, accumulate, isa);
}

/// [`gemm_bf16`] with an f32 lhs, rounded to bf16 (nearest even) while it
/// is packed: autocast's matmul of an f32 activation by a bf16 weight.
///
/// ```
/// use ndarray::array;
/// use tracejit_kernels::{bf16::{gemm_bf16_from_f32, PackedBf16}, Isa};
///
/// let a = array![[1.0f32, 2.0, 3.0]];
/// let b = PackedBf16::from_f32(array![[1.0f32], [1.0], [1.0]].view());
/// let mut c = [0.0f32];
/// gemm_bf16_from_f32(a.view(), &b, &mut c, false, Isa::native());
/// assert_eq!(c, [6.0]);
/// ```
///
/// # Panics
/// If `a`'s columns are not `b.k()` or `c` does not hold `m · n` values.
pub fn gemm_bf16_from_f32(a: ArrayView2<'_, f32>, b: &PackedBf16, c: &mut [f32], accumulate: bool, isa: Isa) {
    product("gemm_bf16_from_f32", a, b, c, accumulate, isa);
}

/// Both entry points: checks, packs `a`, runs the blocks.
fn product<T: pack::LhsValue + Sync>(
    name: &str,
    a: ArrayView2<'_, T>,
    b: &PackedBf16,
    c: &mut [f32],
    accumulate: bool,
    isa: Isa,
) {
    let ((m, k), n) = (a.dim(), b.n);
    assert!(
        k == b.k && c.len() == m * n,
        "{name}: a [{m}, {k}] times a packed b [{}, {n}] into {} values (want k = {} and {} values)",
        b.k,
        c.len(),
        b.k,
        m * n
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let (kw, wide) = (k.div_ceil(2), b.wide);
    with_scratch(lhs_words(m, kw, isa, wide), |lhs| {
        pack::pack_lhs_split(a, lhs, isa, wide);
        let (lhs, rhs, out) = (&*lhs, b.words.words(), OutPtr(c.as_mut_ptr()));
        threads::run_gemm_blocks(m, n, k, &|rows, cols| {
            // SAFETY: `out` is `c`, `m · n` values that outlive the blocks,
            // and blocks are disjoint parts of it; the operands are packed
            // for these sizes, both in `b`'s layout.
            unsafe { kernel::run_block(lhs, m, rhs, kw, rows, cols, out, n, accumulate, isa, wide) }
        });
    });
}

/// Words of the buffer a packed `m`-row lhs of `kw` words per row needs
/// under `isa`, in the wide layout or the pair layout: the AMX kernels
/// read up to [`AMX_LHS_SLACK`] words past it.
fn lhs_words(m: usize, kw: usize, isa: Isa, wide: bool) -> usize {
    if wide {
        return lhs_len(m, wide::slots(kw));
    }
    lhs_len(m, kw) + if isa.has_amx_bf16() { AMX_LHS_SLACK } else { 0 }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_amx;
#[cfg(test)]
mod tests_wide;
