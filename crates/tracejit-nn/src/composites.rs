//! The composites of `tracejit::nn`: each op's primitive body, the shared
//! `Function` that marks it `implements("tracejit.nn.<name>")`, and the
//! public entry point that runs it eagerly (through its registered kernel
//! when one accepts the arguments) or records a call of it in a trace.
//!
//! Invariant: a composite body uses primitives only, never another
//! composite, so `selector(false)` on a caller means "no kernels" for what
//! it calls directly.

use std::sync::OnceLock;

use tracejit_trace::{function, Function, Static, Tensor, TensorSpec};

/// Activation applied by [`dense`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None (identity).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// [`gelu`] (tanh form).
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
}

impl Activation {
    /// Applies the activation with primitives.
    #[track_caller]
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Linear => x.clone(),
            Activation::Relu => x.relu(),
            Activation::Gelu => gelu_body(x),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }
}

// ---- primitive bodies --------------------------------------------------------

/// W2's formula: `0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))`.
fn gelu_body(x: &Tensor) -> Tensor {
    let x3 = x * x * x;
    let inner = (x + x3 * 0.044715) * 0.7978845608;
    (x * 0.5) * (inner.tanh() + 1.0)
}

/// Softmax over the last axis, stable: `e = exp(x - max); e / sum(e)`.
fn softmax_body(x: &Tensor) -> Tensor {
    let m = x.max(&[-1], true);
    let e = (x - &m).exp();
    let s = e.sum(&[-1], true);
    e / s
}

/// Log-softmax over the last axis: `(x - max) - log(sum(exp(x - max)))`.
fn log_softmax_body(x: &Tensor) -> Tensor {
    let m = x.max(&[-1], true);
    let d = x - &m;
    let s = d.exp().sum(&[-1], true);
    d - s.log()
}

/// Layer norm over the last axis.
fn layer_norm_body(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: &Tensor) -> Tensor {
    let mean = x.mean(&[-1], true);
    let d = x - &mean;
    let var = (&d * &d).mean(&[-1], true);
    d * (var + eps).rsqrt() * gamma + beta
}

/// The gradients of [`layer_norm_body`] for the cotangent `dy` of its
/// result, in closed form: with `xhat = (x - mean) * rstd` over the last
/// axis, `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))`
/// where `dxhat = dy * gamma`; `dgamma = sum(dy * xhat)` and
/// `dbeta = sum(dy)` over the axes `gamma` and `beta` were broadcast along.
fn layer_norm_grad_body(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: &Tensor, dy: &Tensor) -> [Tensor; 3] {
    let mean = x.mean(&[-1], true);
    let xc = x - &mean;
    let rstd = ((&xc * &xc).mean(&[-1], true) + eps).rsqrt();
    let xhat = &xc * &rstd;
    let dxhat = dy * gamma;
    let dx = &rstd * (&dxhat - dxhat.mean(&[-1], true) - &xhat * (&dxhat * &xhat).mean(&[-1], true));
    let dgamma = unbroadcast(dy * &xhat, &gamma.dims());
    let dbeta = unbroadcast(dy.clone(), &beta.dims());
    [dx, dgamma, dbeta]
}

/// `g` (a cotangent of a broadcast result) summed back to `shape` (the
/// dims of an operand that was broadcast against it).
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

/// The LSTM cell (gate order i, f, g, o).
#[track_caller]
fn lstm_cell_body(x: &Tensor, h: &Tensor, c: &Tensor, w_ih: &Tensor, w_hh: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    let hidden = match h.dims().last() {
        Some(Some(n)) => *n as i64,
        _ => panic!("lstm_cell: the hidden size (last dim of h) must be known, got h of dims {:?}", h.dims()),
    };
    let gates = x.matmul(w_ih) + h.matmul(w_hh) + b;
    let gate = |k: i64| gates.slice_axis(-1, k * hidden, (k + 1) * hidden);
    let i = gate(0).sigmoid();
    let f = gate(1).sigmoid();
    let g = gate(2).tanh();
    let o = gate(3).sigmoid();
    let c2 = f * c + i * g;
    let h2 = o * c2.tanh();
    (h2, c2)
}

// ---- the composites --------------------------------------------------------

type F1 = Function<Tensor, Tensor>;

fn gelu_fn() -> &'static F1 {
    static F: OnceLock<F1> = OnceLock::new();
    F.get_or_init(|| function(|x: Tensor| gelu_body(&x)).name("gelu").implements("tracejit.nn.gelu"))
}

fn softmax_fn() -> &'static F1 {
    static F: OnceLock<F1> = OnceLock::new();
    F.get_or_init(|| function(|x: Tensor| softmax_body(&x)).name("softmax").implements("tracejit.nn.softmax"))
}

fn log_softmax_fn() -> &'static F1 {
    static F: OnceLock<F1> = OnceLock::new();
    F.get_or_init(|| {
        function(|x: Tensor| log_softmax_body(&x)).name("log_softmax").implements("tracejit.nn.log_softmax")
    })
}

type F4 = Function<(Tensor, Tensor, Tensor, Tensor), Tensor>;

fn layer_norm_fn() -> &'static F4 {
    static F: OnceLock<F4> = OnceLock::new();
    F.get_or_init(|| {
        function(|(x, g, b, eps): (Tensor, Tensor, Tensor, Tensor)| layer_norm_body(&x, &g, &b, &eps))
            .name("layer_norm")
            .implements("tracejit.nn.layer_norm")
    })
}

type FLnGrad = Function<(Tensor, Tensor, Tensor, Tensor, Tensor), (Tensor, Tensor, Tensor)>;

fn layer_norm_grad_fn() -> &'static FLnGrad {
    static F: OnceLock<FLnGrad> = OnceLock::new();
    F.get_or_init(|| {
        function(|(x, g, b, eps, dy): (Tensor, Tensor, Tensor, Tensor, Tensor)| {
            let [dx, dg, db] = layer_norm_grad_body(&x, &g, &b, &eps, &dy);
            (dx, dg, db)
        })
        .name("layer_norm_grad")
        .implements("tracejit.nn.layer_norm_grad")
    })
}

type FLstm = Function<(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor), (Tensor, Tensor)>;

fn lstm_cell_fn() -> &'static FLstm {
    static F: OnceLock<FLstm> = OnceLock::new();
    F.get_or_init(|| {
        function(|(x, h, c, w_ih, w_hh, b): (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)| {
            lstm_cell_body(&x, &h, &c, &w_ih, &w_hh, &b)
        })
        .name("lstm_cell")
        .implements("tracejit.nn.lstm_cell")
    })
}

type FXent = Function<(Tensor, Tensor), Tensor>;

fn xent_fn() -> &'static FXent {
    static F: OnceLock<FXent> = OnceLock::new();
    F.get_or_init(|| {
        function(|(logits, labels): (Tensor, Tensor)| -(labels * log_softmax_body(&logits)).sum(&[-1], false))
            .name("softmax_cross_entropy_with_logits")
            .implements("tracejit.nn.softmax_cross_entropy_with_logits")
    })
}

type FDense = Function<(Tensor, Tensor, Tensor, Static<Activation>), Tensor>;

fn dense_fn() -> &'static FDense {
    static F: OnceLock<FDense> = OnceLock::new();
    F.get_or_init(|| {
        function(|(x, w, b, act): (Tensor, Tensor, Tensor, Static<Activation>)| act.apply(&(x.matmul(&w) + b)))
            .name("dense")
            .implements("tracejit.nn.dense")
    })
}

/// Runs a composite: eagerly (its registered kernel if one accepts the
/// arguments, else the primitive body) when every input is eager, else as a
/// call of its `Function` (recorded in the trace).
#[track_caller]
fn run_composite<R>(
    name: &str,
    inputs: &[&Tensor],
    kernel_result: impl FnOnce(Vec<Tensor>) -> R,
    eager_body: impl FnOnce() -> R,
    traced: impl FnOnce() -> tracejit_trace::Result<R>,
) -> R {
    crate::composite::ensure_builtins();
    // Under a gradient tape the composite runs as a call of its function,
    // which the tapes record (with its registered backward kernel, if any);
    // a bare native kernel would hide it from them.
    if inputs.iter().all(|t| !t.is_symbolic()) && !tracejit_trace::GradientTape::any_recording() {
        let specs: Vec<TensorSpec> = inputs.iter().map(|t| TensorSpec { ty: t.tensor_type() }).collect();
        return match crate::composite::lookup(name, &specs) {
            Some(kernel) => {
                let args: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
                kernel_result(kernel(&args))
            }
            None => eager_body(),
        };
    }
    // The call node takes the user's line, not this one.
    tracejit_trace::attributed_to(std::panic::Location::caller(), traced).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn first(mut v: Vec<Tensor>) -> Tensor {
    v.swap_remove(0)
}

fn triple(v: Vec<Tensor>) -> (Tensor, Tensor, Tensor) {
    let mut it = v.into_iter();
    let mut next = || it.next().expect("three results");
    (next(), next(), next())
}

fn pair(v: Vec<Tensor>) -> (Tensor, Tensor) {
    let mut it = v.into_iter();
    (it.next().expect("two results"), it.next().expect("two results"))
}

/// GELU, tanh form (W2's formula):
/// `0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))`.
#[track_caller]
pub fn gelu(x: &Tensor) -> Tensor {
    run_composite("tracejit.nn.gelu", &[x], first, || gelu_body(x), || gelu_fn().call(x.clone()))
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
    run_composite("tracejit.nn.softmax", &[x], first, || softmax_body(x), || softmax_fn().call(x.clone()))
}

/// Log-softmax along `axis`: `(x - max) - log(sum(exp(x - max)))`.
#[track_caller]
pub fn log_softmax(x: &Tensor, axis: i64) -> Tensor {
    if let Some((perm, inv)) = axis_last("log_softmax", x, axis) {
        return log_softmax(&x.transpose(&perm), -1).transpose(&inv);
    }
    run_composite("tracejit.nn.log_softmax", &[x], first, || log_softmax_body(x), || log_softmax_fn().call(x.clone()))
}

/// Layer normalization over the last axis:
/// `(x - mean) / sqrt(var + eps) * gamma + beta`, with the biased variance;
/// `gamma` and `beta` broadcast against `x` (usually shape `[last dim]`).
/// `eps` becomes a rank-0 argument of `x`'s dtype, so the kernel sees it.
#[track_caller]
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Tensor {
    let eps = Tensor::full(&[], eps, x.dtype());
    let args = [x, gamma, beta, &eps];
    run_composite(
        "tracejit.nn.layer_norm",
        &args,
        first,
        || layer_norm_body(x, gamma, beta, &eps),
        || layer_norm_fn().call((x.clone(), gamma.clone(), beta.clone(), eps.clone())),
    )
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
    run_composite(
        "tracejit.nn.layer_norm_grad",
        &[x, gamma, beta, eps, dy],
        triple,
        || {
            let [dx, dg, db] = layer_norm_grad_body(x, gamma, beta, eps, dy);
            (dx, dg, db)
        },
        || layer_norm_grad_fn().call((x.clone(), gamma.clone(), beta.clone(), eps.clone(), dy.clone())),
    )
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
    run_composite(
        "tracejit.nn.lstm_cell",
        &[x, h, c, w_ih, w_hh, b],
        pair,
        || lstm_cell_body(x, h, c, w_ih, w_hh, b),
        || lstm_cell_fn().call((x.clone(), h.clone(), c.clone(), w_ih.clone(), w_hh.clone(), b.clone())),
    )
}

/// Softmax cross-entropy per example, as TensorFlow's op of that name:
/// `-sum(labels * log_softmax(logits), axis=-1)`. `labels` has the shape of
/// `logits` (one-hot rows or any probability distributions); for integer
/// class labels pass `labels.one_hot(num_classes, logits.dtype())`. The
/// result drops the last axis (`[batch]` for `[batch, classes]` logits).
#[track_caller]
pub fn softmax_cross_entropy_with_logits(logits: &Tensor, labels: &Tensor) -> Tensor {
    run_composite(
        "tracejit.nn.softmax_cross_entropy_with_logits",
        &[logits, labels],
        first,
        || -(labels * log_softmax_body(logits)).sum(&[-1], false),
        || xent_fn().call((logits.clone(), labels.clone())),
    )
}

/// A dense layer: `activation(x @ w + b)`. The activation is a static
/// argument (one trace per activation); the fusion planner turns the bias
/// add and the activation into the matmul's epilogue region.
#[track_caller]
pub fn dense(x: &Tensor, w: &Tensor, b: &Tensor, activation: Activation) -> Tensor {
    run_composite(
        "tracejit.nn.dense",
        &[x, w, b],
        first,
        || activation.apply(&(x.matmul(w) + b)),
        || dense_fn().call((x.clone(), w.clone(), b.clone(), Static(activation))),
    )
}
