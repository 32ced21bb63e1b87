//! The composites of `tracejit::nn`, each declared once ([`Composite`]:
//! name, body, native kernel with its predicate, backward kernel), and the
//! public functions that run them eagerly or record calls of them.
//!
//! Invariant: a composite body uses primitives only, never another
//! composite, so `selector(false)` on a caller means "no kernels" for what
//! it calls directly. (A backward kernel may call composites: layer norm's
//! calls `layer_norm_grad`.)

use tracejit_trace::Tensor;

use crate::bodies::{
    gelu_body, gelu_grad_body, layer_norm_body, layer_norm_grad_body, log_softmax_body, lstm_cell_body, softmax_body,
    Activation,
};
use crate::decl::{Composite, Native};
use crate::{backward, kernels, samples};

/// `tracejit.nn.gelu`. Eager calls run the native kernel; compiled code
/// runs the body, which the JIT fuses with the product's bias before it and
/// splits over threads (W9's block at two threads: 12.3 -> 10.3 ms; the
/// kernel took 1.2 ms of it on one thread, the fused region 0.3).
pub(crate) static GELU: Composite = Composite::new(
    "tracejit.nn.gelu",
    "gelu",
    |x, _| vec![gelu_body(&x[0])],
    Some(Native { accepts: kernels::gelu_accepts, run: kernels::gelu }),
    Some(backward::gelu),
    samples::unary,
)
.traced_as_body();

/// `tracejit.nn.gelu_grad`: `(x, g)` to GELU's input cotangent, the
/// backward kernel of [`GELU`]. Eager calls run the native kernel (one
/// pass); compiled code runs the body, fused with its neighbours.
pub(crate) static GELU_GRAD: Composite = Composite::new(
    "tracejit.nn.gelu_grad",
    "gelu_grad",
    |a, _| vec![gelu_grad_body(&a[0], &a[1])],
    Some(Native { accepts: kernels::gelu_grad_accepts, run: kernels::gelu_grad }),
    None,
    samples::unary_with_cotangent,
)
.traced_as_body();

/// `tracejit.nn.softmax` (last axis).
pub(crate) static SOFTMAX: Composite = Composite::new(
    "tracejit.nn.softmax",
    "softmax",
    |x, _| vec![softmax_body(&x[0])],
    Some(Native { accepts: kernels::rows_accepts, run: kernels::softmax }),
    None,
    samples::rows,
);

/// `tracejit.nn.log_softmax` (last axis).
pub(crate) static LOG_SOFTMAX: Composite = Composite::new(
    "tracejit.nn.log_softmax",
    "log_softmax",
    |x, _| vec![log_softmax_body(&x[0])],
    Some(Native { accepts: kernels::rows_accepts, run: kernels::log_softmax }),
    None,
    samples::rows,
);

/// `tracejit.nn.layer_norm`: `(x, gamma, beta, eps)`, eps a rank-0 tensor.
/// The native kernel serves eager calls; compiled code runs the body, which
/// the JIT fuses with its neighbours (a residual add) and splits over
/// threads (W9's two layer norms at one thread: 626 µs in the kernel,
/// 213 µs fused, one residual add included).
pub(crate) static LAYER_NORM: Composite = Composite::new(
    "tracejit.nn.layer_norm",
    "layer_norm",
    |a, _| vec![layer_norm_body(&a[0], &a[1], &a[2], &a[3])],
    Some(Native { accepts: kernels::layer_norm_accepts, run: kernels::layer_norm }),
    Some(backward::layer_norm),
    samples::layer_norm,
)
.traced_as_body();

/// `tracejit.nn.layer_norm_grad`: `(x, gamma, beta, eps, dy)` to `(dx,
/// dgamma, dbeta)`.
pub(crate) static LAYER_NORM_GRAD: Composite = Composite::new(
    "tracejit.nn.layer_norm_grad",
    "layer_norm_grad",
    |a, _| layer_norm_grad_body(&a[0], &a[1], &a[2], &a[3], &a[4]).to_vec(),
    Some(Native { accepts: kernels::layer_norm_grad_accepts, run: kernels::layer_norm_grad }),
    None,
    samples::layer_norm_grad,
);

/// `tracejit.nn.lstm_cell`: `(x, h, c, w_ih, w_hh, b)` to `(h', c')`.
pub(crate) static LSTM_CELL: Composite = Composite::new(
    "tracejit.nn.lstm_cell",
    "lstm_cell",
    |a, _| {
        let (h, c) = lstm_cell_body(&a[0], &a[1], &a[2], &a[3], &a[4], &a[5]);
        vec![h, c]
    },
    Some(Native { accepts: kernels::lstm_accepts, run: kernels::lstm_cell }),
    None,
    samples::lstm_cell,
);

/// `tracejit.nn.softmax_cross_entropy_with_logits`: `(logits, labels)`.
pub(crate) static SOFTMAX_CROSS_ENTROPY: Composite = Composite::new(
    "tracejit.nn.softmax_cross_entropy_with_logits",
    "softmax_cross_entropy_with_logits",
    |a, _| vec![-(&a[1] * log_softmax_body(&a[0])).sum(&[-1], false)],
    None,
    Some(backward::softmax_cross_entropy),
    samples::cross_entropy,
);

/// `tracejit.nn.dense`: `(x, w, b)`, the activation's code as attribute.
pub(crate) static DENSE: Composite = Composite::new(
    "tracejit.nn.dense",
    "dense",
    |a, act| vec![Activation::from_code(act).apply(&(a[0].matmul(&a[1]) + &a[2]))],
    None,
    None,
    samples::dense,
);

/// `tracejit.nn.dropout`: `(x, state, p)`, the mask drawn from the state.
pub(crate) static DROPOUT: Composite = Composite::new(
    "tracejit.nn.dropout",
    "dropout",
    |a, _| vec![crate::dropout::dropout_body(&a[0], &a[1], &a[2])],
    Some(Native { accepts: crate::dropout::dropout_accepts, run: crate::dropout::dropout_kernel }),
    Some(crate::dropout::dropout_backward),
    samples::dropout,
);

/// Every declaration, in a fixed order ([`crate::declared`]).
pub(crate) static ALL: &[&Composite] = &[
    &GELU,
    &GELU_GRAD,
    &SOFTMAX,
    &LOG_SOFTMAX,
    &LAYER_NORM,
    &LAYER_NORM_GRAD,
    &LSTM_CELL,
    &SOFTMAX_CROSS_ENTROPY,
    &DENSE,
    &DROPOUT,
    &crate::attention::ATTENTION,
    &crate::attention::ATTENTION_GRAD,
    &crate::batch_norm::BATCH_NORM,
];

fn first(mut v: Vec<Tensor>) -> Tensor {
    v.swap_remove(0)
}

/// GELU, tanh form (W2's formula):
/// `0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))`.
#[track_caller]
pub fn gelu(x: &Tensor) -> Tensor {
    first(GELU.call(&[x], 0))
}

/// GELU's input cotangent given `g`, its result's ([`gelu`]'s backward
/// kernel).
#[track_caller]
pub(crate) fn gelu_grad(x: &Tensor, g: &Tensor) -> Tensor {
    first(GELU_GRAD.call(&[x, g], 0))
}

/// Moves `axis` last (a permutation and its inverse), or `None` when it is
/// already last.
#[track_caller]
fn axis_last(op: &str, x: &Tensor, axis: i64) -> Option<(Vec<i64>, Vec<i64>)> {
    let rank = x.rank() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    assert!(a >= 0 && a < rank, "{op}: axis {axis} is out of range for a tensor of rank {rank}");
    if a == rank - 1 {
        return None;
    }
    let mut perm: Vec<i64> = (0..rank).filter(|&i| i != a).collect();
    perm.push(a);
    let mut inv = vec![0i64; rank as usize];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as i64;
    }
    Some((perm, inv))
}

/// Softmax along `axis` (negative counts from the end), computed stably as
/// `exp(x - max) / sum(exp(x - max))`. The composite works on the last axis;
/// another axis is transposed there and back.
#[track_caller]
pub fn softmax(x: &Tensor, axis: i64) -> Tensor {
    if let Some((perm, inv)) = axis_last("softmax", x, axis) {
        return softmax(&x.transpose(&perm), -1).transpose(&inv);
    }
    first(SOFTMAX.call(&[x], 0))
}

/// Log-softmax along `axis`: `(x - max) - log(sum(exp(x - max)))`.
#[track_caller]
pub fn log_softmax(x: &Tensor, axis: i64) -> Tensor {
    if let Some((perm, inv)) = axis_last("log_softmax", x, axis) {
        return log_softmax(&x.transpose(&perm), -1).transpose(&inv);
    }
    first(LOG_SOFTMAX.call(&[x], 0))
}

/// Layer normalization over the last axis:
/// `(x - mean) / sqrt(var + eps) * gamma + beta`, with the biased variance;
/// `gamma` and `beta` broadcast against `x` (usually shape `[last dim]`).
/// `eps` becomes a rank-0 argument of `x`'s dtype, so the kernel sees it.
#[track_caller]
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Tensor {
    let eps = Tensor::full(&[], eps, x.dtype());
    first(LAYER_NORM.call(&[x, gamma, beta, &eps], 0))
}

/// The gradients of [`layer_norm`]`(x, gamma, beta, eps)` with respect to
/// `x`, `gamma` and `beta`, given `dy`, the cotangent of its result (of
/// `x`'s shape): `(dx, dgamma, dbeta)`, of the shapes of `x`, `gamma` and
/// `beta`. This is the backward kernel gradient tapes use for
/// [`layer_norm`]; it is itself a composite,
/// `tracejit.nn.layer_norm_grad`, whose native kernel (f32 and f64) reads
/// `x` and `dy` once, so inside a traced function the selector runs it as
/// one step.
///
/// ```
/// use tracejit_trace::Tensor;
///
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 4.0], &[1, 3]);
/// let (gamma, beta) = (Tensor::ones(&[3], x.dtype()), Tensor::zeros(&[3], x.dtype()));
/// let dy = Tensor::ones(&[1, 3], x.dtype());
/// let (dx, dgamma, dbeta) = tracejit_nn::layer_norm_grad(&x, &gamma, &beta, 1e-5, &dy);
/// // A normalized row sums to 0 whatever x is: a uniform dy gives x no gradient.
/// assert!(dx.to_vec::<f64>()?.iter().all(|v| v.abs() < 1e-9));
/// assert_eq!(dbeta.to_vec::<f64>()?, vec![1.0; 3]);
/// assert_eq!(dgamma.shape(), &[3]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn layer_norm_grad(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64, dy: &Tensor) -> (Tensor, Tensor, Tensor) {
    let eps = Tensor::full(&[], eps, x.dtype());
    layer_norm_grad_with(x, gamma, beta, &eps, dy)
}

/// [`layer_norm_grad`] with `eps` as the rank-0 tensor [`layer_norm`]
/// passes its composite.
#[track_caller]
pub(crate) fn layer_norm_grad_with(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: &Tensor,
    dy: &Tensor,
) -> (Tensor, Tensor, Tensor) {
    let mut it = LAYER_NORM_GRAD.call(&[x, gamma, beta, eps, dy], 0).into_iter();
    let mut next = || it.next().expect("three results");
    (next(), next(), next())
}

/// One step of an LSTM cell.
///
/// Shapes: `x [batch, input]`, `h` and `c [batch, hidden]`,
/// `w_ih [input, 4*hidden]`, `w_hh [hidden, 4*hidden]`, `b [4*hidden]`.
/// The gate pre-activations `x @ w_ih + h @ w_hh + b` are split along the
/// last axis in the order **i, f, g, o** (input, forget, cell, output, as
/// PyTorch and Keras): `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)`,
/// `h' = sigmoid(o) * tanh(c')`. Returns `(h', c')`.
#[track_caller]
pub fn lstm_cell(x: &Tensor, h: &Tensor, c: &Tensor, w_ih: &Tensor, w_hh: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    let mut it = LSTM_CELL.call(&[x, h, c, w_ih, w_hh, b], 0).into_iter();
    (it.next().expect("two results"), it.next().expect("two results"))
}

/// Softmax cross-entropy per example, as TensorFlow's op of that name:
/// `-sum(labels * log_softmax(logits), axis=-1)`. `labels` has the shape of
/// `logits` (one-hot rows or any probability distributions); for integer
/// class labels pass `labels.one_hot(num_classes, logits.dtype())`. The
/// result drops the last axis (`[batch]` for `[batch, classes]` logits).
#[track_caller]
pub fn softmax_cross_entropy_with_logits(logits: &Tensor, labels: &Tensor) -> Tensor {
    first(SOFTMAX_CROSS_ENTROPY.call(&[logits, labels], 0))
}

/// A dense layer: `activation(x @ w + b)`. The activation is a static
/// argument (one trace per activation); the fusion planner turns the bias
/// add and the activation into the matmul's epilogue region.
#[track_caller]
pub fn dense(x: &Tensor, w: &Tensor, b: &Tensor, activation: Activation) -> Tensor {
    first(DENSE.call(&[x, w, b], activation.code()))
}
