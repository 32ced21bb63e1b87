//! Flash attention on the CPU, forward and backward: `out =
//! softmax(q·kᵀ·scale, masked)·v` for a batch of independent problems,
//! without ever holding a `tq × tk` matrix, for tracejit's attention op and
//! its gradient.
//!
//! How: the forward walks each tile of 64 queries over the keys in blocks
//! of 64, keeping a running max and sum per query (online softmax) and the
//! output tile; the backward recomputes each block's probabilities from
//! the forward's `lse` twice, FlashAttention-2 style: once in a task per
//! tile of queries (their `dq`), once in a task per tile of keys (their
//! `dk` and `dv`). A task's own tile lies along the vectors (queries in the
//! forward, say), copied in transposed once, so the softmax statistics are
//! plain lanes and the other side's rows are read in place by broadcasts;
//! every product goes through one register-blocked kernel (`kernel.rs`),
//! 16 lanes wide with AVX-512, 8 with AVX2, or portable. Under the causal
//! rule a task skips every block past its last row's limit, and within a
//! block runs each product only as far as each group of 16 rows needs.
//!
//! Invariants:
//! - every output element is written by exactly one task, whose arithmetic
//!   depends only on the problem's sizes — never on the thread count or on
//!   which thread runs it (1, 2 and 3 threads give the same bits);
//! - the three compiled forms do the same operations in the same order on
//!   every element over the same pairs (lanes never mixed, ranges decided
//!   per 16 rows whatever the width), so they give the same bits too;
//! - a call's extra memory is one scratch per thread of
//!   `O(64·(d + dv) + 64·64)` floats (at `d = dv = 64`: 49 KiB in the
//!   forward, 99 KiB in the backward, `examples/attention.rs` counts them
//!   at tq = tk = 4096), independent of `tq` and `tk` and kept for the
//!   thread's next call when under 1 MiB, plus a list of
//!   `⌈tq/64⌉ + ⌈tk/64⌉` tiles in the backward.
//!
//! Limitation: with queries (or keys) along the vectors, a problem of
//! fewer than 16 of them — a decoding step, `tq = 1` — leaves most lanes
//! idle (up to 16 times the work of its pairs).

mod copy;
mod gradients;
mod kernel;
#[cfg(target_arch = "x86_64")]
mod lowp;
mod online;
mod paths;
mod plan;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_bf16;
#[cfg(test)]
mod tests_bias;
mod vector;

use crate::Isa;
use paths::Path;
use plan::{Inputs, OutPtr, Rule};

/// One attention call: `batch` independent problems (the product of the
/// leading axes, batch × heads), each `q [tq, d]`, `k [tk, d]`,
/// `v [tk, dv]` and `out [tq, dv]`, row-major and contiguous, problem after
/// problem.
///
/// Under `causal`, query `i` sees key `j` only when `j ≤ i + (tk - tq)`:
/// the diagonal is aligned bottom-right, so queries at the end of a KV
/// cache see every earlier key, and `tq = tk` gives the usual lower
/// triangle (with `tq > tk` the first `tq - tk` queries see nothing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    /// Independent problems.
    pub batch: usize,
    /// Queries per problem.
    pub tq: usize,
    /// Keys (and values) per problem.
    pub tk: usize,
    /// Query and key width.
    pub d: usize,
    /// Value and output width.
    pub dv: usize,
    /// Factor of the scores, usually `1/√d`.
    pub scale: f32,
    /// Whether the causal rule applies (combined with a [`Mask`]).
    pub causal: bool,
}

impl Problem {
    /// The (problem, query, key) pairs the causal rule keeps (all
    /// `batch·tq·tk` without it), before any [`Mask`]: the pairs whose
    /// scores and products a call computes, up to tile edges. A forward
    /// call does `pairs · (d + dv)` useful multiply-adds.
    ///
    /// ```
    /// use tracejit_kernels::attention::Problem;
    ///
    /// let p = Problem { batch: 2, tq: 3, tk: 3, d: 4, dv: 4, scale: 0.5, causal: true };
    /// assert_eq!(p.pairs(), 2 * (1 + 2 + 3));
    /// ```
    pub fn pairs(&self) -> u64 {
        self.batch as u64 * plan::pairs(&rule(self, None))
    }
}

/// A boolean mask, true = attend, read at `data[b·batch_stride +
/// i·row_stride + j·col_stride]` for problem `b`, query `i`, key `j` (a
/// stride of 0 broadcasts that axis). It combines with the causal rule: a
/// pair counts only when both allow it.
#[derive(Clone, Copy, Debug)]
pub struct Mask<'a> {
    /// The flags.
    pub data: &'a [bool],
    /// Distance between problems.
    pub batch_stride: usize,
    /// Distance between queries.
    pub row_stride: usize,
    /// Distance between keys.
    pub col_stride: usize,
}

/// Values added to the scaled scores before the softmax, read at
/// `data[b·batch_stride + i·row_stride + j·col_stride]` for problem `b`,
/// query `i`, key `j` (a stride of 0 broadcasts that axis): PyTorch's float
/// `attn_mask`, and what models exported to ONNX add for padding (`0` for a
/// key to attend, a large negative number or `-inf` for one to skip). It
/// applies before the causal rule and a [`Mask`]; a `-inf` bias weighs its
/// pair 0 as a mask does, except that a query whose scores all become
/// `-inf` this way gets NaN, as in the plain formula.
#[derive(Clone, Copy, Debug)]
pub struct Bias<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Distance between problems.
    pub batch_stride: usize,
    /// Distance between queries.
    pub row_stride: usize,
    /// Distance between keys.
    pub col_stride: usize,
}

/// An operand laid out as a view of a larger tensor: problem `b`'s row
/// `r` (its `d` or `dv` values contiguous) starts at
/// `data[starts[b] + r·row_stride]`. What attention's q, k and v are when
/// sliced from one fused projection and seen as `[batch, heads, t, d]`:
/// [`forward_strided`] reads them in place, where a copy to contiguous rows
/// cost W10 about a quarter of its attention time.
///
/// ```
/// use tracejit_kernels::attention::Operand;
///
/// // Two problems of three rows of 4 values, the rows 8 apart (every
/// // other group of 4 of a [2, 3, 8] buffer).
/// let data = vec![0.0f32; 2 * 3 * 8];
/// let q = Operand { data: &data, starts: &[0, 24], row_stride: 8 };
/// assert_eq!(q.starts.len(), 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// The values (any elements between the rows are never read).
    pub data: &'a [f32],
    /// Where each problem's first row starts.
    pub starts: &'a [usize],
    /// Distance between a problem's rows.
    pub row_stride: usize,
}

impl Operand<'_> {
    /// Problem `b`'s row `r`.
    #[inline(always)]
    pub(crate) fn row(&self, b: usize, r: usize) -> *const f32 {
        self.data.as_ptr().wrapping_add(self.starts[b] + r * self.row_stride)
    }
}

/// The starts of `batch` problems of `rows × cols` values laid end to end.
fn packed_starts(batch: usize, rows: usize, cols: usize) -> Vec<usize> {
    (0..batch).map(|b| b * rows * cols).collect()
}

/// `out = softmax(q·kᵀ·scale, masked)·v` per problem, and `lse[b, i]`, the
/// log-sum-exp of query `i`'s scaled, masked scores (what [`backward`]
/// needs), with the vector code `isa` allows (the same bits at every
/// width) on the thread pool ([`crate::threads::pool`]) when large.
///
/// Semantics:
/// - a masked pair (causal rule or `mask`) weighs exactly 0;
/// - a query with no unmasked key (or `tk = 0`) gets zeros in `out` and
///   `lse = -inf`; any size may be 0 (`d = 0` gives zero scores);
/// - NaN and Inf propagate as in the plain formula: a NaN score makes its
///   row NaN, and so does a `+inf` score (`inf - inf`) or unmasked scores
///   that are all `-inf` (`0 / 0`; `lse` is then `-inf`, and the backward
///   gives the row NaN gradients). A NaN or Inf in `v` reaches, as in the
///   plain formula's `P·v` (`0 · NaN` for a masked pair), the queries that
///   see its key and the others computed with them (their group of 16);
///   blocks the causal rule skips contribute nothing;
/// - accuracy: `exp` is [`crate::fastmath::exp`] (1 ULP), products
///   accumulate in f32 in order over `d` and over the keys. Against an f64
///   evaluation each output is within `1e-5 · Σ_j p_ij·|v_jc|` (its terms'
///   magnitudes) and `lse` within `1e-5·(1 + |lse|)`, as tested with
///   inputs in `[-2, 2]` and `d` up to 130 (a score's rounding, about
///   `|s|·2⁻²⁴`, is a relative error in its probability).
///
/// ```
/// use tracejit_kernels::attention::{forward, Problem};
/// use tracejit_kernels::Isa;
///
/// // One problem, two queries, three keys; the second query is at the end
/// // of the keys, so under `causal` the first one sees keys 0 and 1.
/// let p = Problem { batch: 1, tq: 2, tk: 3, d: 1, dv: 1, scale: 1.0, causal: true };
/// let (q, k, v) = ([0.0f32, 0.0], [1.0f32, 2.0, 3.0], [10.0f32, 20.0, 30.0]);
/// let (mut out, mut lse) = ([0.0f32; 2], [0.0f32; 2]);
/// forward(&p, &q, &k, &v, None, &mut out, &mut lse, Isa::native());
/// // Zero queries give equal weights: the mean of the visible values.
/// assert!((out[0] - 15.0).abs() < 1e-5 && (out[1] - 20.0).abs() < 1e-5);
/// assert!((lse[0] - 2f32.ln()).abs() < 1e-6);
/// ```
///
/// # Panics
/// If a slice's length does not match the problem (`q`: `batch·tq·d`,
/// `k`: `batch·tk·d`, `v`: `batch·tk·dv`, `out`: `batch·tq·dv`, `lse`:
/// `batch·tq`), or the mask is too short for its strides.
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn forward(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&Mask<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: Isa,
) {
    let (qs, ks) = (packed_starts(p.batch, p.tq, p.d), packed_starts(p.batch, p.tk, p.d));
    let vs = packed_starts(p.batch, p.tk, p.dv);
    let q = Operand { data: q, starts: &qs, row_stride: p.d };
    let k = Operand { data: k, starts: &ks, row_stride: p.d };
    let v = Operand { data: v, starts: &vs, row_stride: p.dv };
    forward_on(Path::of(isa), p, q, k, v, mask, None, out, lse);
}

/// [`forward`] with `q`, `k` and `v` read in place from views
/// ([`Operand`]); `out` and `lse` as in [`forward`]. The same bits as
/// [`forward`] on contiguous copies of the operands.
///
/// # Panics
/// If an operand's `starts` is not `batch` long or its rows reach past its
/// data, if `out` or `lse` does not match the problem, or the mask is too
/// short for its strides.
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn forward_strided(
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: Isa,
) {
    forward_on(Path::of(isa), p, q, k, v, mask, None, out, lse);
}

/// [`forward_strided`] with a [`Bias`] added to the scaled scores:
/// `softmax(q·kᵀ·scale + bias, masked)·v`. The bias is read once per key
/// when it does not depend on the query (`row_stride` 0, a padding bias),
/// else once per pair. The accuracy is [`forward`]'s, the bias counted
/// among a score's terms.
///
/// ```
/// use tracejit_kernels::attention::{forward_strided_biased, Bias, Operand, Problem};
/// use tracejit_kernels::Isa;
///
/// fn rows(data: &[f32]) -> Operand<'_> {
///     Operand { data, starts: &[0], row_stride: 1 }
/// }
/// let p = Problem { batch: 1, tq: 1, tk: 3, d: 1, dv: 1, scale: 1.0, causal: false };
/// let (q, k, v) = ([0.0f32], [1.0f32, 2.0, 3.0], [10.0f32, 20.0, 30.0]);
/// // The last key is padding.
/// let bias = Bias { data: &[0.0, 0.0, f32::NEG_INFINITY], batch_stride: 0, row_stride: 0, col_stride: 1 };
/// let (mut out, mut lse) = ([0.0f32], [0.0f32]);
/// forward_strided_biased(&p, rows(&q), rows(&k), rows(&v), None, Some(&bias), &mut out, &mut lse, Isa::native());
/// assert!((out[0] - 15.0).abs() < 1e-5);
/// ```
///
/// # Panics
/// As [`forward_strided`], and if the bias is too short for its strides.
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn forward_strided_biased(
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    bias: Option<&Bias<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: Isa,
) {
    forward_on(Path::of(isa), p, q, k, v, mask, bias, out, lse);
}

/// [`forward_strided`] for mixed precision: the two products (`q·kᵀ` and
/// `P·v`) read their operands rounded to bf16 (`q·scale`, `k`, the
/// probabilities and `v`, to nearest even) and accumulate in f32 with
/// `vdpbf16ps` where `isa` has AVX-512 BF16, at twice the f32 rate; the
/// masks, the softmax and `lse` stay f32. Elsewhere it is
/// [`forward_strided`] (f32 products): the same results within the
/// tolerance below. What PyTorch's autocast does to attention; tracejit's
/// `auto_mixed_precision` pass chooses it for the attention op.
///
/// Accuracy: each rounding is relative `2⁻⁹`, so a score is within
/// `2⁻⁸·scale·Σ_c |q_ic·k_jc|` (plus the f32 error) of the exact one, a
/// probability within about that relative error, and an output within
/// `2⁻⁷·(1 + max_j |s_ij|)·Σ_j p_ij·|v_jc|`-ish of the f64 formula — the
/// bound the tests check. Subnormal operands and products count as zero
/// (`vdpbf16ps` flushes them). The other semantics (masks, NaN, empty
/// rows, sizes) are [`forward`]'s, except that `P·v` runs in pairs of
/// keys: a NaN or Inf in the value row just past a group of queries' last
/// key can reach that group through the zero probability beside it (as it
/// reaches every query in the plain formula).
///
/// ```
/// use tracejit_kernels::attention::{forward_strided_bf16, Operand, Problem};
/// use tracejit_kernels::Isa;
///
/// fn rows(data: &[f32]) -> Operand<'_> {
///     Operand { data, starts: &[0], row_stride: 1 }
/// }
/// let p = Problem { batch: 1, tq: 2, tk: 3, d: 1, dv: 1, scale: 1.0, causal: true };
/// let (q, k, v) = ([0.0f32, 0.0], [1.0f32, 2.0, 3.0], [10.0f32, 20.0, 30.0]);
/// let (mut out, mut lse) = ([0.0f32; 2], [0.0f32; 2]);
/// forward_strided_bf16(&p, rows(&q), rows(&k), rows(&v), None, &mut out, &mut lse, Isa::native());
/// // Equal weights over the visible values (all exact in bf16).
/// assert!((out[0] - 15.0).abs() < 1e-5 && (out[1] - 20.0).abs() < 1e-5);
/// ```
///
/// # Panics
/// As [`forward_strided`].
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn forward_strided_bf16(
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: Isa,
) {
    forward_on(Path::of_bf16(isa), p, q, k, v, mask, None, out, lse);
}

/// [`forward_strided_bf16`] with a [`Bias`], as [`forward_strided_biased`]
/// (the bias added in f32).
///
/// # Panics
/// As [`forward_strided_biased`].
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn forward_strided_bf16_biased(
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    bias: Option<&Bias<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: Isa,
) {
    forward_on(Path::of_bf16(isa), p, q, k, v, mask, bias, out, lse);
}

/// [`forward`] on a given path (the tests force each one).
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
fn forward_on(
    path: Path,
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    bias: Option<&Bias<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    const NAME: &str = "attention::forward";
    let x = inputs(NAME, p, q, k, v, mask, bias);
    check_len(NAME, "out", out.len(), &[("batch", p.batch), ("tq", p.tq), ("dv", p.dv)]);
    check_len(NAME, "lse", lse.len(), &[("batch", p.batch), ("tq", p.tq)]);
    let work = p.pairs() * (p.d + p.dv) as u64;
    let tasks = online::tasks(&x);
    let call = online::ForwardCall { x, out: OutPtr(out.as_mut_ptr()), lse: OutPtr(lse.as_mut_ptr()) };
    let len = path.forward_scratch(p.d, p.dv);
    plan::run(tasks, work, &|t| {
        plan::with_scratch(len, |scratch| {
            // SAFETY: `t < tasks`; the scratch has `len` floats, aligned;
            // `inputs` and the checks above matched every slice to the
            // problem; `path` comes from `Path::of` or is portable.
            unsafe { paths::forward(path, &call, t, scratch) }
        })
    });
}

/// The gradients of [`forward`]'s `out` for its cotangent `dout`:
/// `dq`, `dk` and `dv` are overwritten (not accumulated). The probabilities
/// are recomputed block by block from `lse` (never the `[tq, tk]` matrix),
/// once by tasks over (problem, tile of queries) for `dq` and once by tasks
/// over (problem, tile of keys) for `dk` and `dv`.
///
/// Pass `forward`'s own `out` and `lse`. Each gradient is within `1e-5`
/// of the f64 closed form `dS = P ⊙ (dP − rowsum(dP ⊙ P))` relative to
/// the sum of its terms' magnitudes (`dP − D` cancels), as for
/// [`forward`]. Masked pairs get `P = dS = 0`, so they contribute nothing
/// but `0 ·` their operands: as in the plain formula's products, a NaN in
/// `k` reaches `dq` of the queries computed with its key, and a NaN in `q`
/// or `dout` reaches `dk`/`dv` of keys computed with its query, masked or
/// not (blocks the causal rule skips contribute nothing). A fully masked
/// query gets `dq = 0` when `k` is finite.
///
/// # Panics
/// If a slice's length does not match the problem (as for [`forward`];
/// `dout` as `out`, `dq` as `q`, `dk` as `k`, `dv` as `v`), or the mask is
/// too short for its strides.
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn backward(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&Mask<'_>>,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    isa: Isa,
) {
    let grads = Grads { dq, dk, dv };
    let (qs, ks) = (packed_starts(p.batch, p.tq, p.d), packed_starts(p.batch, p.tk, p.d));
    let (vs, os) = (packed_starts(p.batch, p.tk, p.dv), packed_starts(p.batch, p.tq, p.dv));
    let q = Operand { data: q, starts: &qs, row_stride: p.d };
    let k = Operand { data: k, starts: &ks, row_stride: p.d };
    let v = Operand { data: v, starts: &vs, row_stride: p.dv };
    let out = Operand { data: out, starts: &os, row_stride: p.dv };
    let dout = Operand { data: dout, starts: &os, row_stride: p.dv };
    backward_on(Path::of(isa), p, [q, k, v], mask, out, lse, dout, grads);
}

/// [`backward`] with `q`, `k`, `v`, `out` and `dout` read in place from
/// views ([`Operand`]); `lse` and the gradients contiguous as in
/// [`backward`]. The same bits as [`backward`] on contiguous copies.
///
/// # Panics
/// As [`forward_strided`], and if `dq`, `dk` or `dv` does not match the
/// problem.
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
pub fn backward_strided(
    p: &Problem,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<&Mask<'_>>,
    out: Operand<'_>,
    lse: &[f32],
    dout: Operand<'_>,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    isa: Isa,
) {
    backward_on(Path::of(isa), p, [q, k, v], mask, out, lse, dout, Grads { dq, dk, dv });
}

/// [`backward`]'s outputs.
struct Grads<'a> {
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

/// [`backward`] on a given path (the tests force each one).
#[allow(clippy::too_many_arguments, reason = "the operands of one attention call")]
fn backward_on(
    path: Path,
    p: &Problem,
    [q, k, v]: [Operand<'_>; 3],
    mask: Option<&Mask<'_>>,
    out: Operand<'_>,
    lse: &[f32],
    dout: Operand<'_>,
    g: Grads<'_>,
) {
    const NAME: &str = "attention::backward";
    let x = inputs(NAME, p, q, k, v, mask, None);
    let (rows_out, rows_q, rows_k) = (
        [("batch", p.batch), ("tq", p.tq), ("dv", p.dv)],
        [("batch", p.batch), ("tq", p.tq), ("d", p.d)],
        [("batch", p.batch), ("tk", p.tk), ("d", p.d)],
    );
    check_operand(NAME, "out", &out, &rows_out);
    check_len(NAME, "lse", lse.len(), &[("batch", p.batch), ("tq", p.tq)]);
    check_operand(NAME, "dout", &dout, &rows_out);
    check_len(NAME, "dq", g.dq.len(), &rows_q);
    check_len(NAME, "dk", g.dk.len(), &rows_k);
    check_len(NAME, "dv", g.dv.len(), &[("batch", p.batch), ("tk", p.tk), ("dv", p.dv)]);
    let work = p.pairs() * (4 * p.d + 3 * p.dv) as u64;
    let units = gradients::units(&x);
    let tasks = units.len() * p.batch;
    let call = gradients::BackwardCall {
        x,
        out,
        lse,
        dout,
        dq: OutPtr(g.dq.as_mut_ptr()),
        dk: OutPtr(g.dk.as_mut_ptr()),
        dv: OutPtr(g.dv.as_mut_ptr()),
        units,
    };
    let len = gradients::scratch_len(p.d, p.dv);
    plan::run(tasks, work, &|t| {
        plan::with_scratch(len, |scratch| {
            // SAFETY: as in `forward_on`.
            unsafe { paths::backward(path, &call, t, scratch) }
        })
    });
}

/// The causal rule and mask of `p`.
fn rule<'a>(p: &Problem, mask: Option<&'a Mask<'a>>) -> Rule<'a> {
    let off = p.tk as isize - p.tq as isize;
    Rule { tq: p.tq, tk: p.tk, causal: p.causal, off, mask, bias: None }
}

/// The inputs, checked against the problem.
fn inputs<'a>(
    name: &str,
    p: &Problem,
    q: Operand<'a>,
    k: Operand<'a>,
    v: Operand<'a>,
    mask: Option<&'a Mask<'a>>,
    bias: Option<&'a Bias<'a>>,
) -> Inputs<'a> {
    check_operand(name, "q", &q, &[("batch", p.batch), ("tq", p.tq), ("d", p.d)]);
    check_operand(name, "k", &k, &[("batch", p.batch), ("tk", p.tk), ("d", p.d)]);
    check_operand(name, "v", &v, &[("batch", p.batch), ("tk", p.tk), ("dv", p.dv)]);
    if let Some(m) = mask {
        check_strides(name, "mask", p, m.data.len(), [m.batch_stride, m.row_stride, m.col_stride]);
    }
    if let Some(b) = bias {
        check_strides(name, "bias", p, b.data.len(), [b.batch_stride, b.row_stride, b.col_stride]);
    }
    Inputs { p: *p, rule: Rule { bias, ..rule(p, mask) }, q, k, v }
}

/// Panics unless `len` is the product of `dims`, naming the function, the
/// operand and the sizes.
fn check_len(name: &str, what: &str, len: usize, dims: &[(&str, usize)]) {
    let want = dims.iter().try_fold(1usize, |n, d| n.checked_mul(d.1));
    if want != Some(len) {
        let sizes: Vec<String> = dims.iter().map(|(n, d)| format!("{n} {d}")).collect();
        let want = want.map_or("more than usize::MAX".to_string(), |w| w.to_string());
        panic!("{name}: {what} has {len} values, expected {} = {want}", sizes.join(" × "));
    }
}

/// Panics unless `x` has a start per problem and every row of
/// `[batch, rows, cols]` inside its data (for packed operands, that the
/// length is the product, as [`check_len`] words it).
fn check_operand(name: &str, what: &str, x: &Operand<'_>, dims: &[(&str, usize); 3]) {
    let [(_, batch), (_, rows), (_, cols)] = *dims;
    let size = rows.checked_mul(cols);
    let packed = x.row_stride == cols
        && x.starts.iter().enumerate().all(|(b, &s)| Some(s) == size.and_then(|size| b.checked_mul(size)));
    if packed && x.starts.len() == batch {
        return check_len(name, what, x.data.len(), dims);
    }
    if x.starts.len() != batch {
        panic!("{name}: {what} has {} problem starts, expected batch {batch}", x.starts.len());
    }
    if rows == 0 || cols == 0 {
        return;
    }
    let end = |s: usize| {
        (rows - 1).checked_mul(x.row_stride).and_then(|r| r.checked_add(s)).and_then(|r| r.checked_add(cols))
    };
    if let Some((b, s)) = x.starts.iter().enumerate().find(|(_, &s)| end(s).is_none_or(|e| e > x.data.len())) {
        panic!(
            "{name}: {what}'s problem {b} ({rows} rows of {cols} values from {s}, {} apart) reaches past its {} values",
            x.row_stride,
            x.data.len()
        );
    }
}

/// Panics unless the largest index of a mask or bias (`what`, `len`
/// values at `strides`) is inside its data.
fn check_strides(name: &str, what: &str, p: &Problem, len: usize, strides: [usize; 3]) {
    if p.batch == 0 || p.tq == 0 || p.tk == 0 {
        return;
    }
    let last = [(p.batch, strides[0]), (p.tq, strides[1]), (p.tk, strides[2])]
        .iter()
        .try_fold(0usize, |at, &(n, s)| (n - 1).checked_mul(s).and_then(|x| at.checked_add(x)));
    if last.is_none_or(|last| last >= len) {
        panic!(
            "{name}: {what} of {len} values is too short for batch {} × tq {} × tk {} at strides ({}, {}, {})",
            p.batch, p.tq, p.tk, strides[0], strides[1], strides[2]
        );
    }
}
