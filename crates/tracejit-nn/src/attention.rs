//! `scaled_dot_product_attention`: the composite at the heart of a
//! transformer, `softmax(q·kᵀ·scale, masked)·v`.
//!
//! Two composites, declared like the others: `tracejit.nn.
//! scaled_dot_product_attention` maps `(q, k, v, scale, causal[, mask])`
//! to `(out, lse)`, and `tracejit.nn.scaled_dot_product_attention_grad`
//! maps `(q, k, v, scale, causal, out, lse, dout[, mask])` to `(dq, dk,
//! dv)`. Their bodies are the plain formula (the `[.., Tq, Tk]` scores
//! materialized); their native kernels are `tracejit_kernels::attention`'s
//! flash attention, which never holds more than a tile of scores. The
//! forward also returns the rows' log-sum-exp, so the backward recomputes
//! the probabilities tile by tile instead of keeping them (FlashAttention's
//! trade): the public function returns `out` only.
//!
//! `scale` and `causal` travel as scalar tensors (constants in a trace)
//! because native kernels see argument values only; the bodies use them
//! as data too (`causal` selects between the causal pattern and "all"),
//! which constant folding resolves.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::decl::{Composite, Native};

mod native;
mod wide;

/// `tracejit.nn.scaled_dot_product_attention`.
pub(crate) static ATTENTION: Composite = Composite::new(
    "tracejit.nn.scaled_dot_product_attention",
    "scaled_dot_product_attention",
    |a, _| forward_body(a),
    Some(Native { accepts: native::forward_accepts, run: native::forward }),
    Some(backward),
    crate::samples::attention,
)
.with_mixed_precision(native::forward_bf16);

/// `tracejit.nn.scaled_dot_product_attention_grad`.
pub(crate) static ATTENTION_GRAD: Composite = Composite::new(
    "tracejit.nn.scaled_dot_product_attention_grad",
    "scaled_dot_product_attention_grad",
    |a, _| backward_body(a, None).to_vec(),
    Some(Native { accepts: native::backward_accepts, run: native::backward }),
    None,
    crate::samples::attention_grad,
);

/// Attention over the last two axes: `softmax(q·kᵀ·scale + mask)·v`.
///
/// Shapes: `q [.., Tq, d]`, `k [.., Tk, d]`, `v [.., Tk, dv]`, result
/// `[.., Tq, dv]`; the leading axes (batch, heads) broadcast. `mask`
/// broadcasts to `[.., Tq, Tk]` and is either bool, `true` = attend, or of
/// `q`'s float dtype, added to the scaled scores (PyTorch's float
/// `attn_mask`; what models exported to ONNX add for padding: 0 to attend,
/// a large negative number or `-inf` to skip, and a query whose scores
/// all become `-inf` so gets NaN, as in the formula). Under `causal`,
/// query `i` sees key `j` only when `j ≤ i + (Tk − Tq)`: aligned
/// bottom-right, so the queries at the end of a KV cache see every
/// earlier key, and `Tq = Tk` gives the usual lower triangle. Both rules
/// combine. A query that sees no key gets zeros (and zero gradients).
/// `scale` defaults to `1/√d`.
///
/// f32 runs the flash-attention kernel (tiles of 64 queries and keys,
/// a float mask added as the scores are made;
/// online softmax; the backward recomputes each tile's probabilities from
/// the forward's log-sum-exp), eagerly and inside compiled functions, on
/// the thread pool by (batch·head, tile); it agrees with the plain
/// formula to about 1e-5 relative to the magnitudes summed. bf16 and f16
/// run it on their values widened to f32, each result rounded back; f64
/// runs a kernel of its own that holds one row of scores per query. No
/// path holds the `[Tq, Tk]` scores, except an f64 call with a float mask
/// and the gradient of a call with a float mask (which includes the
/// mask's): they run the formula.
///
/// ```
/// use tracejit_trace::{DType, Tensor};
///
/// let q = Tensor::randn(&[2, 4, 5, 8], 0); // batch 2, 4 heads, 5 queries of width 8
/// let k = Tensor::randn(&[2, 4, 5, 8], 1);
/// let v = Tensor::randn(&[2, 4, 5, 8], 2);
/// let y = tracejit_nn::scaled_dot_product_attention(&q, &k, &v, None, true, None);
/// assert_eq!(y.shape(), &[2, 4, 5, 8]);
/// // The first query sees only the first key: its output is that value row.
/// let first = y.slice_axis(2, 0, 1).to_vec::<f32>()?;
/// let v0 = v.slice_axis(2, 0, 1).to_vec::<f32>()?;
/// assert!(first.iter().zip(&v0).all(|(a, b)| (a - b).abs() < 1e-5));
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// On ranks below 2, float dtypes that differ, `q` and `k` widths or `k`
/// and `v` lengths that differ, a mask neither bool nor of `q`'s dtype, or shapes that do
/// not broadcast (naming the argument and the caller's line); when `d` is
/// unknown in the trace and no `scale` is given.
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Tensor {
    check_arguments(q, k, v, mask);
    let scale = match scale {
        Some(s) => s,
        None => match q.dims().last().copied().flatten() {
            Some(d) => 1.0 / (d.max(1) as f64).sqrt(),
            None => panic!(
                "scaled_dot_product_attention: q {} has an unknown width in the trace; pass `scale` explicitly \
                 (at {})",
                q.tensor_type(),
                std::panic::Location::caller()
            ),
        },
    };
    let scale = Tensor::full(&[], scale, q.dtype());
    let causal = Tensor::scalar(causal);
    let mut inputs = vec![q, k, v, &scale, &causal];
    inputs.extend(mask);
    ATTENTION.call(&inputs, 0).swap_remove(0)
}

/// The checks of [`scaled_dot_product_attention`]'s arguments: a panic
/// naming the argument and the caller's line.
#[track_caller]
fn check_arguments(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) {
    let at = std::panic::Location::caller();
    let fail = |what: String| -> ! { panic!("scaled_dot_product_attention: {what} (at {at})") };
    for (what, t) in [("q", q), ("k", k), ("v", v)] {
        if t.rank() < 2 {
            fail(format!("{what} {} needs rank 2 or more ([.., T, d])", t.tensor_type()));
        }
        if !t.dtype().is_float() || t.dtype() != q.dtype() {
            fail(format!("{what} is {}, q is {}: q, k and v take one float dtype", t.dtype(), q.dtype()));
        }
    }
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let fits = |a: Option<usize>, b: Option<usize>| a.is_none() || b.is_none() || a == b;
    if !fits(qd[qd.len() - 1], kd[kd.len() - 1]) {
        fail(format!("q {} and k {} differ in width (the last axis)", q.tensor_type(), k.tensor_type()));
    }
    if !fits(kd[kd.len() - 2], vd[vd.len() - 2]) {
        fail(format!("k {} and v {} differ in length (the second-last axis)", k.tensor_type(), v.tensor_type()));
    }
    if let Some(m) = mask.filter(|m| m.dtype() != DType::Bool && m.dtype() != q.dtype()) {
        fail(format!(
            "mask is {}, expected bool (true = attend) or q's {} (added to the scores)",
            m.dtype(),
            q.dtype()
        ));
    }
}

/// Whether `inputs` (of either composite) hold a mask: the last input is
/// bool and not the scalar `causal`.
fn has_mask(inputs: &[Tensor], without: usize) -> bool {
    inputs.len() == without + 1
}

/// The optional last input of either composite (after `without` inputs)
/// as `(bool mask, float bias)`: a bool one masks, a float one is added
/// to the scores.
fn mask_and_bias(inputs: &[Tensor], without: usize) -> (Option<&Tensor>, Option<&Tensor>) {
    match inputs.get(without).filter(|_| has_mask(inputs, without)) {
        Some(m) if m.dtype() == DType::Bool => (Some(m), None),
        Some(b) => (None, Some(b)),
        None => (None, None),
    }
}

/// `q·kᵀ·scale`, plus the float mask if any.
fn scores(q: &Tensor, k: &Tensor, scale: &Tensor, bias: Option<&Tensor>) -> Tensor {
    let s = q.matmul(&k.t()) * scale;
    match bias {
        Some(b) => s + b,
        None => s,
    }
}

/// Which pairs count, broadcastable to `s` (`[.., Tq, Tk]`): the mask and,
/// where `causal` holds, the causal pattern. `None` when nothing is masked.
fn allowed(s: &Tensor, causal: &Tensor, mask: Option<&Tensor>) -> Option<Tensor> {
    let dims = s.dims();
    let (tq, tk) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let pattern = match (tq, tk) {
        // Positions as [tq, 1] and [1, tk] constants, compared by a
        // broadcast: a [tq, tk] constant would sit in every trace of the
        // composite (16 MiB at T = 4096) though the kernel never reads it.
        (Some(tq), Some(tk)) => {
            let i = Tensor::arange(0.0, tq as f64, 1.0, DType::I64).reshape(&[tq as i64, 1]);
            let j = Tensor::arange(0.0, tk as f64, 1.0, DType::I64).reshape(&[1, tk as i64]);
            (j + tq as i64).le(&(i + tk as i64))
        }
        _ => causal_pattern_of_unknown(s),
    };
    let causal = pattern.logical_or(causal.logical_not());
    Some(match mask {
        Some(m) => causal.logical_and(m),
        None => causal,
    })
}

/// The causal pattern when the trace does not know `Tq` or `Tk`: positions
/// counted with cumulative sums over a tensor of ones of `s`'s shape.
fn causal_pattern_of_unknown(s: &Tensor) -> Tensor {
    let nan = s.is_nan();
    let ones = nan.logical_or(nan.logical_not()).cast(DType::I64);
    let i = ones.cumsum(-2);
    let j = ones.cumsum(-1);
    let tq = ones.sum(&[-2], true);
    let tk = ones.sum(&[-1], true);
    // j ≤ i + (tk − tq), with i and j counted from 1 (the offsets cancel).
    (j + tq).le(&(i + tk))
}

/// Probabilities and log-sum-exp (`[.., Tq]`) of scores under `allowed`.
fn probabilities(s: &Tensor, allowed: Option<&Tensor>) -> (Tensor, Tensor) {
    let dtype = s.dtype();
    let neg_inf = Tensor::full(&[], f64::NEG_INFINITY, dtype);
    let zero = Tensor::zeros(&[], dtype);
    let masked = match allowed {
        Some(a) => Tensor::select(a, s, &neg_inf),
        None => s.clone(),
    };
    // max has no identity: where no key may exist (Tk = 0 or unknown), a
    // column of -inf keeps the reduction defined.
    let keyed = match s.dims().last().copied().flatten() {
        Some(tk) if tk > 0 => masked.clone(),
        _ => {
            let mut pads = vec![(0, 0); s.rank()];
            pads[s.rank() - 1] = (0, 1);
            masked.pad(&pads, f64::NEG_INFINITY)
        }
    };
    let m = keyed.max(&[-1], true);
    // A row with nothing to see has max -inf: shift it by 0 instead (its
    // exponentials are all 0), so it gets zeros rather than NaN.
    let m = Tensor::select(&m.eq(&neg_inf), &zero, &m);
    let e = (&masked - &m).exp();
    let z = e.sum(&[-1], true);
    let p = match allowed {
        Some(a) => {
            // Only a row with no allowed key divides by 1; unmasked scores
            // that are all -inf still give 0/0 = NaN, as the formula does.
            let any = a.cast(dtype).sum(&[-1], true).gt(0.0);
            let one = Tensor::full(&[], 1.0, dtype);
            &e / &Tensor::select(&any, &z, &one)
        }
        None => &e / &z,
    };
    let lse = (z.log() + m).squeeze(&[-1]);
    (p, lse)
}

/// The forward body: `(out, lse)`.
fn forward_body(a: &[Tensor]) -> Vec<Tensor> {
    let (q, k, v, scale, causal) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
    let (mask, bias) = mask_and_bias(a, 5);
    let s = scores(q, k, scale, bias);
    let allowed = allowed(&s, causal, mask);
    let (p, lse) = probabilities(&s, allowed.as_ref());
    vec![p.matmul(v), lse]
}

/// Sums `t` down to `like`'s shape (the axes broadcasting added or
/// stretched).
fn sum_to(t: Tensor, like: &Tensor) -> Tensor {
    let extra = t.rank() - like.rank();
    let t = if extra > 0 { t.sum(&(0..extra as i64).collect::<Vec<_>>(), false) } else { t };
    let (td, ld) = (t.dims(), like.dims());
    let stretched: Vec<i64> =
        (0..ld.len()).filter(|&i| ld[i] == Some(1) && td[i] != Some(1)).map(|i| i as i64).collect();
    if stretched.is_empty() {
        t
    } else {
        t.sum(&stretched, true)
    }
}

/// The backward body: `(dq, dk, dv)` from the forward's `out` and `lse`,
/// the cotangent `dout`, and `dlse` when the log-sum-exp has a cotangent
/// too (only when the composite is differentiated directly).
fn backward_body(a: &[Tensor], dlse: Option<&Tensor>) -> [Tensor; 3] {
    let ([dq, dk, dv], _) = backward_body_with_scores(a, dlse);
    [dq, dk, dv]
}

/// [`backward_body`] and the scores' gradient `dS` (`[.., Tq, Tk]`), which
/// is a float mask's gradient before it is summed to the mask's shape.
fn backward_body_with_scores(a: &[Tensor], dlse: Option<&Tensor>) -> ([Tensor; 3], Tensor) {
    let (q, k, v, scale, causal) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
    let (out, lse, dout) = (&a[5], &a[6], &a[7]);
    let (mask, bias) = mask_and_bias(a, 8);
    let s = scores(q, k, scale, bias);
    let p = (&s - &lse.expand_dims(-1)).exp();
    let p = match allowed(&s, causal, mask) {
        Some(allowed) => Tensor::select(&allowed, &p, &Tensor::zeros(&[], s.dtype())),
        None => p,
    };
    let dv = p.t().matmul(dout);
    let dp = dout.matmul(&v.t());
    let row = (dout * out).sum(&[-1], true);
    let centred = match dlse {
        Some(g) => dp - row + g.expand_dims(-1),
        None => dp - row,
    };
    let ds = &p * &centred;
    let dq = ds.matmul(k) * scale;
    let dk = ds.t().matmul(q) * scale;
    ([sum_to(dq, q), sum_to(dk, k), sum_to(dv, v)], ds)
}

/// The forward's backward kernel: the gradient composite (its native
/// kernel under f32), or, when the log-sum-exp has a cotangent, the
/// gradient body with it.
fn backward(inputs: &[Tensor], outputs: &[Tensor], cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    let n = inputs.len();
    let dout = match &cts[0] {
        Some(g) => g.clone(),
        None => Tensor::zeros_like(&outputs[0]),
    };
    let mut args: Vec<Tensor> = inputs[..5].to_vec();
    args.extend([outputs[0].clone(), outputs[1].clone(), dout]);
    args.extend(inputs[5..].iter().cloned());
    if let (_, Some(bias)) = mask_and_bias(inputs, 5) {
        // A float mask has a gradient of its own, `dS` summed to its
        // shape: the formula gives it with the others.
        let ([dq, dk, dv], ds) = backward_body_with_scores(&args, cts[1].as_ref());
        let dbias = sum_to(ds, bias);
        return vec![Some(dq), Some(dk), Some(dv), None, None, Some(dbias)];
    }
    let [dq, dk, dv] = match &cts[1] {
        Some(dlse) => backward_body(&args, Some(dlse)),
        None => {
            let refs: Vec<&Tensor> = args.iter().collect();
            let mut it = ATTENTION_GRAD.call(&refs, 0).into_iter();
            let mut next = || it.next().expect("three gradients");
            [next(), next(), next()]
        }
    };
    let mut grads = vec![Some(dq), Some(dk), Some(dv)];
    grads.resize(n, None);
    grads
}
