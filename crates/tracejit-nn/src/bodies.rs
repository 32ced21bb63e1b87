//! The primitive bodies of the composites of `tracejit::nn`: what each
//! computes, written with primitive ops only (never another composite, so
//! `selector(false)` on a caller means "no kernels" for what it calls
//! directly), and the [`Activation`] of `dense`.

use tracejit_trace::Tensor;

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
    /// Every activation, in the order of their codes ([`Activation::code`]).
    pub const ALL: [Activation; 5] =
        [Activation::Linear, Activation::Relu, Activation::Gelu, Activation::Tanh, Activation::Sigmoid];

    /// The activation's code, the static attribute of the `dense`
    /// composite.
    pub fn code(self) -> u32 {
        match self {
            Activation::Linear => 0,
            Activation::Relu => 1,
            Activation::Gelu => 2,
            Activation::Tanh => 3,
            Activation::Sigmoid => 4,
        }
    }

    /// The activation of a code ([`Activation::code`]).
    ///
    /// # Panics
    /// On a code no activation has.
    pub fn from_code(code: u32) -> Activation {
        *Activation::ALL.get(code as usize).unwrap_or_else(|| panic!("dense: no activation has code {code}"))
    }

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

/// W2's formula: `0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))`.
pub(crate) fn gelu_body(x: &Tensor) -> Tensor {
    let x3 = x * x * x;
    let inner = (x + x3 * 0.044715) * 0.7978845608;
    (x * 0.5) * (inner.tanh() + 1.0)
}

/// The cotangent of [`gelu_body`]'s input given its result's `g`: with
/// `t = tanh(c·(x + 0.044715·x³))`, `c = √(2/π)`,
/// `g · (0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3·0.044715·x²))`.
pub(crate) fn gelu_grad_body(x: &Tensor, g: &Tensor) -> Tensor {
    let x2 = x * x;
    let t = ((x + &x2 * x * 0.044715) * 0.7978845608).tanh();
    let slope = (-(&t * &t) + 1.0) * (x * 0.5) * (x2 * 0.134145 + 1.0) * 0.7978845608;
    ((t + 1.0) * 0.5 + slope) * g
}

/// Softmax over the last axis, stable: `e = exp(x - max); e / sum(e)`.
pub(crate) fn softmax_body(x: &Tensor) -> Tensor {
    let m = x.max(&[-1], true);
    let e = (x - &m).exp();
    let s = e.sum(&[-1], true);
    e / s
}

/// Log-softmax over the last axis: `(x - max) - log(sum(exp(x - max)))`.
pub(crate) fn log_softmax_body(x: &Tensor) -> Tensor {
    let m = x.max(&[-1], true);
    let d = x - &m;
    let s = d.exp().sum(&[-1], true);
    d - s.log()
}

/// Layer norm over the last axis.
pub(crate) fn layer_norm_body(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: &Tensor) -> Tensor {
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
pub(crate) fn layer_norm_grad_body(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: &Tensor,
    dy: &Tensor,
) -> [Tensor; 3] {
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
pub(crate) fn lstm_cell_body(
    x: &Tensor,
    h: &Tensor,
    c: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b: &Tensor,
) -> (Tensor, Tensor) {
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
