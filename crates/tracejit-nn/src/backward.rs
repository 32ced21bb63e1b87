//! Backward kernels of composites (registered with
//! [`crate::composite::register_gradient`] on first use of `tracejit::nn`):
//! the closed-form gradients of `softmax_cross_entropy_with_logits` and
//! `layer_norm`, in place of differentiating their primitive bodies.
//!
//! Why: the body's VJP replays the forward and walks it op by op (for the
//! cross-entropy, log-softmax's max/sub/exp/sum/log and their cotangents);
//! the closed forms need one softmax (itself a composite with a native
//! kernel) or one pass of row statistics. They are written with tensor ops,
//! so they run eagerly and, inside a traced function, become nodes the
//! passes fuse like any other. Their results equal the bodies' VJPs within
//! rounding (checked against finite differences in `tests/gradients.rs`).

use tracejit_trace::Tensor;

/// `g` (a cotangent of `x`'s broadcast result) summed back to `shape`
/// (the dims of an operand that was broadcast against it).
fn unbroadcast(g: Tensor, shape: &[Option<usize>]) -> Tensor {
    let dims = g.dims();
    let lead = dims.len().saturating_sub(shape.len());
    let mut g = g;
    if lead > 0 {
        let axes: Vec<i64> = (0..lead as i64).collect();
        g = g.sum(&axes, false);
    }
    let gd = g.dims();
    let axes: Vec<i64> =
        (0..shape.len()).filter(|&i| shape[i] == Some(1) && gd[i] != Some(1)).map(|i| i as i64).collect();
    if axes.is_empty() {
        g
    } else {
        g.sum(&axes, true)
    }
}

/// `d/dlogits = (softmax(logits) * sum(labels) - labels) * g` and
/// `d/dlabels = -log_softmax(logits) * g`, per row.
fn softmax_cross_entropy_backward(
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

/// With `xhat = (x - mean) * rstd` over the last axis:
/// `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))` where
/// `dxhat = g * gamma`; `dgamma = sum(g * xhat)`, `dbeta = sum(g)` over
/// the broadcast axes; `eps` gets none.
fn layer_norm_backward(inputs: &[Tensor], _outputs: &[Tensor], cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    let (x, gamma, beta, eps) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
    let Some(g) = cts.first().cloned().flatten() else { return vec![None; 4] };
    let mean = x.mean(&[-1], true);
    let xc = x - &mean;
    let rstd = ((&xc * &xc).mean(&[-1], true) + eps).rsqrt();
    let xhat = &xc * &rstd;
    let dxhat = &g * gamma;
    let dx = &rstd * (&dxhat - dxhat.mean(&[-1], true) - &xhat * (&dxhat * &xhat).mean(&[-1], true));
    let dgamma = unbroadcast(&g * &xhat, &gamma.dims());
    let dbeta = unbroadcast(g, &beta.dims());
    vec![Some(dx), Some(dgamma), Some(dbeta), None]
}

/// Registers the backward kernels (once per process, with the kernels).
pub(crate) fn register() {
    crate::composite::register_gradient(
        "tracejit.nn.softmax_cross_entropy_with_logits",
        softmax_cross_entropy_backward,
    );
    crate::composite::register_gradient("tracejit.nn.layer_norm", layer_norm_backward);
}
