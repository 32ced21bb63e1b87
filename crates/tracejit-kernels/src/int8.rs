//! Dynamically quantized int8 matrix products: an f32 activation
//! quantized per row at run time times a weight quantized per column once
//! per version, summed exactly in i32 and scaled back to f32.
//!
//! How: [`PackedI8::quantize`] rounds each weight column to `i8` with its
//! own scale and packs four consecutive `k` per 32-bit word in panels of
//! 64 columns, keeping `−128 · Σ q` per column; [`gemm_dynamic_i8`]
//! quantizes each lhs row with its own scale into `u8 = q + 128` (the
//! unsigned operand of `vpdpbusd`), or, for a row with no negative value
//! (after a relu), into `u ∈ [0, 255]` with half the step, packs it (in a buffer each thread
//! keeps), and computes the output in blocks fixed by the sizes over the
//! thread pool, each tile of up to 6 × 64 outputs summed over the whole
//! depth by one `vpdpbusd` micro-kernel (AVX-512 VNNI: 64 multiply-adds
//! per instruction, four times f32 FMA's rate), by AVX2's `vpmaddwd` on
//! widened values (AMD Zen 3 and other CPUs without VNNI: 17-48 G
//! multiply-adds/s on the workloads' shapes on the Xeon held to AVX2,
//! 0.5-1.4x f32's FMA kernels beside it, against 2-6 for the
//! auto-vectorized code before it) or by portable integer
//! code; where the CPU has AMX ([`Isa::has_amx_int8`]) the blocks run on
//! the tile registers instead, 16 × 16 outputs advanced by 64 values of
//! `k` per `tdpbusd` (`u8 · i8` like `vpdpbusd`), each tile dequantized
//! from a buffer by the same operations. The layout and the tile walk are
//! `crate::bf16::tiles`'.
//!
//! # Results
//!
//! For row `i` and column `j`: `acc = Σₚ (qa[i,p] + 128) · qw[p,j] −
//! 128 · Σₚ qw[p,j]` (a signed row) or `acc = Σₚ ua[i,p] · qw[p,j]` (an
//! unsigned one), exact in i32 (wrapping sums whose result is exact for
//! `k ≤ 2¹⁷`, the most accepted; unsigned rows only up to `2¹⁶`), then `c[i,j] = ((acc as f32) ·
//! scale_a[i]) · scale_w[j]`, added to `c` with `accumulate`. Every path
//! performs the same operations (the AMX one sums in another order, but
//! integer sums are the same in any order): their results have the same
//! bits, for every thread count too.
//!
//! The error against the f64 product is that of the quantization: with
//! `δa = scale_a[i] / 2` and `δw = scale_w[j] / 2` (each value is within
//! half a step of its level),
//!
//! `|c − c_f64| ≤ Σₚ (|a[i,p]| · δw + |w[p,j]| · δa + δa · δw)`
//!
//! plus a few f32 roundings of `c` (and of `acc` past 2²⁴). The rounding
//! errors being independent, the error is far smaller in practice: on the
//! workloads' shapes with uniform random inputs, `max |c − c_f64|` is
//! 5-6·10⁻³ of `max |c_f64|` (`examples/lowp_gemm.rs`).
//!
//! Non-finite values: a row of `a` holding a NaN or ±Inf gives a row of
//! NaN (its scale is NaN), and so does a column of `w` for a column of
//! `c` (its [`PackedI8::scales`] entry is NaN); an f32 product would give
//! ±Inf or NaN there.

use ndarray::ArrayView2;

use crate::bf16::tiles::{lhs_len, rhs_len, with_scratch, OutPtr, Words, AMX_LHS_SLACK, AMX_MR, MR, NR};
use crate::{threads, Isa};

#[cfg(target_arch = "x86_64")]
mod amx;
mod kernel;
mod quantize;

/// The deepest product accepted: its i32 sums cannot overflow
/// (`127² · 2¹⁷ < 2³¹`).
pub const MAX_K: usize = 1 << 17;

/// A weight `w [k, n]` quantized per output column once per weight
/// version: `scale_j = max_i |w[i, j]| / 127` (1 where that is 0, NaN where
/// the column holds a non-finite value), `q = round_half_even(w / scale)`
/// in `[-127, 127]`, packed for `vpdpbusd` (four consecutive `k` per
/// 32-bit lane, panels of 64 columns), with each column's `Σ q` for the
/// lhs's `u8` shift.
///
/// ```
/// use ndarray::array;
/// use tracejit_kernels::int8::PackedI8;
///
/// let w = PackedI8::quantize(array![[1.0f32, 0.0], [-254.0, 0.0]].view());
/// assert_eq!((w.k(), w.n()), (2, 2));
/// assert_eq!(w.scales(), [2.0, 1.0]); // 254 / 127; an all-zero column
/// ```
#[derive(Clone)]
pub struct PackedI8 {
    k: usize,
    n: usize,
    words: Words,
    /// Per column, padded to whole panels (with 1).
    scales: Vec<f32>,
    /// Per column `−128 · Σ q` (where the sums start, for the lhs's
    /// `+ 128`), padded to whole panels (with 0).
    starts: Vec<i32>,
}

impl PackedI8 {
    /// Quantizes and packs `w [k, n]` (any strides).
    pub fn quantize(w: ndarray::ArrayView2<'_, f32>) -> Self {
        let (k, n) = w.dim();
        let mut words = Words::zeroed(rhs_len(n, k.div_ceil(4)));
        let (mut scales, mut starts) = quantize::pack_weight(w, words.words_mut());
        let padded = n.next_multiple_of(NR);
        scales.resize(padded, 1.0);
        starts.resize(padded, 0);
        PackedI8 { k, n, words, scales, starts }
    }

    /// Each column's scale (NaN for a column holding NaN or ±Inf).
    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.n]
    }

    /// The depth (rows of `w`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The columns of `w`.
    pub fn n(&self) -> usize {
        self.n
    }
}

impl std::fmt::Debug for PackedI8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedI8 {{ k: {}, n: {} }}", self.k, self.n)
    }
}

/// `c = dequantize(quantize_rows(a) · w)` (or `c +=` with `accumulate`)
/// for an f32 `a [m, k]` (any strides) and a quantized `w [k, n]`, into
/// `c [m, n]` (row-major, contiguous); see the module for the arithmetic
/// and its error. Runs on the AMX tiles where `isa` has AMX int8,
/// `vpdpbusd` where it has AVX-512 VNNI, portable integer code otherwise,
/// all with the same bits, over the thread pool for large products (the
/// same bits for every thread count).
///
/// ```
/// use ndarray::array;
/// use tracejit_kernels::{int8::{gemm_dynamic_i8, PackedI8}, Isa};
///
/// let w = PackedI8::quantize(array![[1.0f32, -1.0], [0.5, 2.0]].view());
/// let a = array![[2.0f32, 4.0]];
/// let mut c = [0.0f32; 2];
/// gemm_dynamic_i8(a.view(), &w, &mut c, false, Isa::native());
/// assert!((c[0] - 4.0).abs() < 0.05 && (c[1] - 6.0).abs() < 0.05, "{c:?}");
/// ```
///
/// # Panics
/// If `a`'s columns are not `w.k()`, `c` does not hold `m · n` values, or
/// `k` exceeds [`MAX_K`].
pub fn gemm_dynamic_i8(a: ArrayView2<'_, f32>, w: &PackedI8, c: &mut [f32], accumulate: bool, isa: Isa) {
    let ((m, k), n) = (a.dim(), w.n);
    assert!(
        k == w.k && c.len() == m * n && k <= MAX_K,
        "gemm_dynamic_i8: a [{m}, {k}] times a quantized w [{}, {n}] into {} values \
         (want k = {} up to {MAX_K} and {} values)",
        w.k,
        c.len(),
        w.k,
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
    let kw = k.div_ceil(4);
    let mut forms = vec![quantize::RowForm { scale: 0.0, unsigned: false }; m];
    with_scratch(lhs_words(m, kw, isa), |lhs| {
        quantize::pack_lhs(a, lhs, &mut forms, isa);
        let row_scales: Vec<f32> = forms.iter().map(|f| f.scale).collect();
        let unsigned_rows: Vec<bool> = forms.iter().map(|f| f.unsigned).collect();
        let ep = kernel::Epilogue {
            c: OutPtr(c.as_mut_ptr()),
            n,
            accumulate,
            row_scales: &row_scales,
            unsigned_rows: &unsigned_rows,
            col_scales: &w.scales,
            starts: &w.starts,
        };
        let (lhs, rhs) = (&*lhs, w.words.words());
        threads::run_gemm_blocks(m, n, k, &|rows, cols| {
            // SAFETY: `ep.c` is `c`, `m · n` values that outlive the blocks,
            // and blocks are disjoint parts of it; the operands, scales and
            // starts are packed for these sizes.
            unsafe { kernel::run_block(lhs, m, rhs, kw, rows, cols, &ep, isa) }
        });
    });
}

/// Rows of the lhs panels the kernels of `isa` read: [`AMX_MR`] for the
/// AMX tiles, else [`MR`].
fn panel_rows(isa: Isa) -> usize {
    if isa.has_amx_int8() {
        AMX_MR
    } else {
        MR
    }
}

/// Words of the buffer a packed `m`-row lhs of `kw` words per row needs
/// under `isa`: the AMX kernels read up to [`AMX_LHS_SLACK`] words past it.
fn lhs_words(m: usize, kw: usize, isa: Isa) -> usize {
    lhs_len(m, kw) + if isa.has_amx_int8() { AMX_LHS_SLACK } else { 0 }
}

#[cfg(test)]
mod tests;
