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
