//! Backward kernels of composites (declared with them in `composites.rs`
//! and registered on first use of `tracejit::nn`):
//! the closed-form gradients of `softmax_cross_entropy_with_logits`,
//! `layer_norm` and `gelu`, in place of differentiating their primitive
//! bodies.
//!
//! Why: the body's VJP replays the forward and walks it op by op (for the
//! cross-entropy, log-softmax's max/sub/exp/sum/log and their cotangents);
//! the closed forms need one softmax (itself a composite with a native
//! kernel) or one pass of row statistics. The cross-entropy's is written
//! with tensor ops, so it runs eagerly and, inside a traced function,
//! becomes nodes the passes fuse like any other. Layer norm's calls
//! another composite, [`crate::layer_norm_grad`], whose native kernel
//! (f32 and f64) the selector picks inside traced functions exactly as it
//! picks forward kernels: fused as tensor ops its closed form still made
//! three regions that read `x` and the cotangent several times. Their
//! results equal the bodies' VJPs within rounding (checked against finite
//! differences in `tests/api/gradients.rs` and
//! `crates/tracejit-nn/tests/layer_norm_grad.rs`).

use tracejit_trace::Tensor;

/// `d/dlogits = (softmax(logits) * sum(labels) - labels) * g` and
/// `d/dlabels = -log_softmax(logits) * g`, per row.
pub(crate) fn softmax_cross_entropy(
    inputs: &[Tensor],
    _outputs: &[Tensor],
    cts: &[Option<Tensor>],
) -> Vec<Option<Tensor>> {
    let (logits, labels) = (&inputs[0], &inputs[1]);
    let Some(g) = cts.first().cloned().flatten() else { return vec![None, None] };
    let g = g.expand_dims(-1);
    let p = crate::softmax(logits, -1);
    let mass = labels.sum(&[-1], true);
    let dlogits = (p * mass - labels) * &g;
    let dlabels = -crate::log_softmax(logits, -1) * &g;
    vec![Some(dlogits), Some(dlabels)]
}

/// `layer_norm_grad` (a composite with a native kernel) for the
/// cotangent of the result; `eps` gets none.
pub(crate) fn layer_norm(inputs: &[Tensor], _outputs: &[Tensor], cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    let (x, gamma, beta, eps) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
    let Some(g) = cts.first().cloned().flatten() else { return vec![None; 4] };
    let (dx, dgamma, dbeta) = crate::composites::layer_norm_grad_with(x, gamma, beta, eps, &g);
    vec![Some(dx), Some(dgamma), Some(dbeta), None]
}

/// `gelu_grad` (a composite with a native kernel, traced as its body) for
/// the cotangent of the result: eagerly one pass over `x` and `g` instead
/// of the body's VJP, op by op.
pub(crate) fn gelu(inputs: &[Tensor], _outputs: &[Tensor], cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    let Some(g) = cts.first().cloned().flatten() else { return vec![None] };
    vec![Some(crate::composites::gelu_grad(&inputs[0], &g))]
}
