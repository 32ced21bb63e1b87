//! `tracejit::nn`: composite ops written with primitives, each inside a
//! `Function` marked `implements("tracejit.nn.<name>")`, plus fast native
//! kernels for the ones that matter most (registered lazily with
//! [`crate::composite`]).
//!
//! Inside a trace, calling one of these records a `Call` of the composite;
//! the implementation selector then swaps in the registered kernel when it
//! accepts the argument types (f32, the shapes each kernel documents), or
//! inlines the primitive body, which the fusion planner then fuses with its
//! surroundings. Called on eager tensors, the registered kernel runs directly
//! when it accepts them, and the primitive body runs eagerly otherwise.
//!
//! Each composite is one `Function` created on first use (a `static
//! OnceLock`), so every caller shares its traces. Composite bodies use only
//! primitives (never other composites), so turning the selector off in a
//! caller really means "no kernels" for what it calls directly.
//!
//! | function | composite name | registered kernel |
//! |---|---|---|
//! | [`gelu`] | `tracejit.nn.gelu` | f32 |
//! | [`softmax`] | `tracejit.nn.softmax` (last axis) | f32, rank >= 1 |
//! | [`log_softmax`] | `tracejit.nn.log_softmax` (last axis) | f32, rank >= 1 |
//! | [`layer_norm`] | `tracejit.nn.layer_norm` | f32 |
//! | [`lstm_cell`] | `tracejit.nn.lstm_cell` | f32, rank-2 operands |
//! | [`softmax_cross_entropy_with_logits`] | `tracejit.nn.softmax_cross_entropy_with_logits` | — |
//! | [`dense`] | `tracejit.nn.dense` | — (matmul + fused epilogue) |
//!
//! The kernels compute `exp`, `tanh` and `sigmoid` with in-register
//! approximations (Cephes `expf`, about 1 ULP; `tanh` from a Cephes odd
//! polynomial below 0.625 and `1 - 2/(e^{2x}+1)` above; NaN propagates) and
//! sum in several partial accumulators, so they agree with the primitive
//! bodies to about 1e-6 relative, not bitwise.

use std::sync::{Arc, OnceLock};

use ndarray::{ArrayView2, Ix2};
use tracejit_tensor::{DType, Storage};

use crate::composite::{KernelFn, KernelPredicate};
use crate::{function, Function, Static, Tensor, TensorSpec};

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
    traced: impl FnOnce() -> crate::Result<R>,
) -> R {
    if inputs.iter().all(|t| !t.is_symbolic()) {
        let specs: Vec<TensorSpec> = inputs.iter().map(|t| TensorSpec { ty: t.tensor_type() }).collect();
        return match crate::composite::lookup(name, &specs) {
            Some(kernel) => {
                let args: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
                kernel_result(kernel(&args))
            }
            None => eager_body(),
        };
    }
    traced().unwrap_or_else(|e| panic!("{name}: {e}"))
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

// ---- registered kernels ------------------------------------------------------

/// The built-in kernels, registered on the first use of the registry.
pub(crate) fn builtin_kernels() -> Vec<(&'static str, Arc<KernelPredicate>, Arc<KernelFn>)> {
    vec![
        ("tracejit.nn.gelu", Arc::new(|s: &[TensorSpec]| all_f32(s, 1)), Arc::new(kernels::gelu)),
        (
            "tracejit.nn.softmax",
            Arc::new(|s: &[TensorSpec]| all_f32(s, 1) && !s[0].dims().is_empty()),
            Arc::new(kernels::softmax),
        ),
        (
            "tracejit.nn.log_softmax",
            Arc::new(|s: &[TensorSpec]| all_f32(s, 1) && !s[0].dims().is_empty()),
            Arc::new(kernels::log_softmax),
        ),
        ("tracejit.nn.layer_norm", Arc::new(layer_norm_accepts), Arc::new(kernels::layer_norm)),
        ("tracejit.nn.lstm_cell", Arc::new(lstm_accepts), Arc::new(kernels::lstm_cell)),
    ]
}

fn all_f32(specs: &[TensorSpec], n: usize) -> bool {
    specs.len() == n && specs.iter().all(|s| s.dtype() == DType::F32)
}

/// x of rank >= 1; gamma and beta of shape [last] (or broadcastable rank 1);
/// eps a scalar.
fn layer_norm_accepts(s: &[TensorSpec]) -> bool {
    if !all_f32(s, 4) || s[0].dims().is_empty() || !s[3].dims().is_empty() {
        return false;
    }
    let last = *s[0].dims().last().expect("rank >= 1");
    s[1..3].iter().all(|p| p.dims().len() == 1 && (p.dims()[0] == last || p.dims()[0] == Some(1) || last.is_none()))
}

/// x [B, I], h and c [B, H], w_ih [I, 4H], w_hh [H, 4H], b [4H].
fn lstm_accepts(s: &[TensorSpec]) -> bool {
    if !all_f32(s, 6) {
        return false;
    }
    let d: Vec<&[Option<usize>]> = s.iter().map(|t| t.dims()).collect();
    let ranks_ok = d[..5].iter().all(|x| x.len() == 2) && d[5].len() == 1;
    if !ranks_ok {
        return false;
    }
    let fits = |a: Option<usize>, b: Option<usize>| a.is_none() || b.is_none() || a == b;
    let hidden = d[1][1];
    let four = hidden.map(|h| 4 * h);
    fits(d[0][0], d[1][0])
        && fits(d[1][0], d[2][0])
        && fits(d[2][1], hidden)
        && fits(d[3][0], d[0][1])
        && fits(d[3][1], four)
        && fits(d[4][0], hidden)
        && fits(d[4][1], four)
        && fits(d[5][0], four)
        && hidden.is_some()
}

mod gemm;

/// The native kernels: f32 only (the predicates check), hand-fused loops
/// over contiguous slices.
mod kernels {
    use super::*;
    use crate::nn::gemm;

    /// A contiguous f32 copy-or-view of an eager tensor's data.
    fn data(t: &Tensor) -> (Vec<usize>, std::borrow::Cow<'_, [f32]>) {
        let s = t.storage().expect("composite kernels get eager tensors");
        let a = s.array::<f32>().expect("the predicate accepted f32 only");
        let shape = a.shape().to_vec();
        match a.as_slice() {
            Some(slice) => (shape, std::borrow::Cow::Borrowed(slice)),
            None => (shape, std::borrow::Cow::Owned(a.iter().copied().collect())),
        }
    }

    fn tensor(v: Vec<f32>, shape: &[usize]) -> Tensor {
        Tensor::from_storage(Storage::from_vec(v, shape).expect("kernel output size"))
    }

    pub(super) fn gelu(inputs: &[Tensor]) -> Vec<Tensor> {
        let (shape, x) = data(&inputs[0]);
        let out: Vec<f32> = x
            .iter()
            .map(|&x| {
                let inner = (x + x * x * x * 0.044715) * 0.797_884_6;
                (x * 0.5) * (fast::tanh(inner) + 1.0)
            })
            .collect();
        vec![tensor(out, &shape)]
    }

    /// Rows of the last axis.
    fn rows(shape: &[usize]) -> usize {
        shape.last().copied().unwrap_or(1)
    }

    /// `Σ exp(v - m)` over `row` in eight lane partials (a fixed order the
    /// compiler vectorizes), handing each `exp` to `each(index, value)`.
    #[inline(always)]
    fn exp_sum(row: &[f32], m: f32, mut each: impl FnMut(usize, f32)) -> f32 {
        let mut acc = [0.0f32; 8];
        for (c, chunk) in row.chunks(8).enumerate() {
            for (j, (a, &v)) in acc.iter_mut().zip(chunk).enumerate() {
                let e = fast::exp(v - m);
                each(c * 8 + j, e);
                *a += e;
            }
        }
        acc.iter().sum()
    }

    /// Runs `f(row, out_row)` over the rows of the last axis of the
    /// kernel's first input, into a fresh output of its shape.
    fn per_row(inputs: &[Tensor], mut f: impl FnMut(&[f32], &mut [f32])) -> Vec<Tensor> {
        let (shape, x) = data(&inputs[0]);
        let n = rows(&shape);
        let mut out = vec![0.0f32; x.len()];
        if n > 0 {
            for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
                f(row, o);
            }
        }
        vec![tensor(out, &shape)]
    }

    pub(super) fn softmax(inputs: &[Tensor]) -> Vec<Tensor> {
        per_row(inputs, |row, o| {
            let m = fast::max(row);
            let inv = 1.0 / exp_sum(row, m, |j, e| o[j] = e);
            o.iter_mut().for_each(|v| *v *= inv);
        })
    }

    pub(super) fn log_softmax(inputs: &[Tensor]) -> Vec<Tensor> {
        per_row(inputs, |row, o| {
            let m = fast::max(row);
            let lse = exp_sum(row, m, |_, _| {}).ln();
            for (ov, &v) in o.iter_mut().zip(row) {
                *ov = (v - m) - lse;
            }
        })
    }

    pub(super) fn layer_norm(inputs: &[Tensor]) -> Vec<Tensor> {
        let (_, gamma) = data(&inputs[1]);
        let (_, beta) = data(&inputs[2]);
        let (_, eps) = data(&inputs[3]);
        let at = |p: &[f32], j: usize| if p.len() == 1 { p[0] } else { p[j] };
        per_row(inputs, |row, o| {
            let n = row.len();
            let inv_n = 1.0 / n as f32;
            let mean = fast::sum(row) * inv_n;
            let mut acc = [0.0f32; 8];
            for chunk in row.chunks(8) {
                for (a, &v) in acc.iter_mut().zip(chunk) {
                    let d = v - mean;
                    *a += d * d;
                }
            }
            let var = acc.iter().sum::<f32>() * inv_n;
            let r = 1.0 / (var + eps[0]).sqrt();
            if gamma.len() == n && beta.len() == n {
                for (((ov, &v), &g), &b) in o.iter_mut().zip(row).zip(gamma.iter()).zip(beta.iter()) {
                    *ov = (v - mean) * r * g + b;
                }
            } else {
                for (j, (ov, &v)) in o.iter_mut().zip(row).enumerate() {
                    *ov = (v - mean) * r * at(&gamma, j) + at(&beta, j);
                }
            }
        })
    }

    fn view2(t: &Tensor) -> ArrayView2<'_, f32> {
        let s = t.storage().expect("composite kernels get eager tensors");
        s.array::<f32>().expect("f32").view().into_dimensionality::<Ix2>().expect("rank 2")
    }

    thread_local! {
        /// The gates of the last `lstm_cell` call on this thread, kept so
        /// that a step takes no fresh pages (`[batch, 4·hidden]` is often
        /// past malloc's mmap threshold).
        static GATES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Two GEMMs ([`super::gemm`], the JIT's GEMM) accumulating into a
    /// buffer pre-filled with the bias, then one vectorized pass over the
    /// gates computing both states.
    pub(super) fn lstm_cell(inputs: &[Tensor]) -> Vec<Tensor> {
        let (x, h, w_ih, w_hh) = (view2(&inputs[0]), view2(&inputs[1]), view2(&inputs[3]), view2(&inputs[4]));
        let (_, c) = data(&inputs[2]);
        let (_, b) = data(&inputs[5]);
        let (batch, hidden) = (h.nrows(), h.ncols());
        let four = 4 * hidden;
        assert!(
            x.nrows() == batch && w_ih.dim() == (x.ncols(), four) && w_hh.dim() == (hidden, four) && b.len() == four,
            "lstm_cell: inconsistent shapes x {:?}, h {:?}, w_ih {:?}, w_hh {:?}, b [{}]",
            x.dim(),
            h.dim(),
            w_ih.dim(),
            w_hh.dim(),
            b.len()
        );
        let mut h2 = vec![0.0f32; batch * hidden];
        let mut c2 = vec![0.0f32; batch * hidden];
        GATES.with(|g| {
            // A re-entrant call (a kernel calling a kernel) finds the buffer
            // taken and uses a fresh one.
            let mut owned = Vec::new();
            let mut guard = g.try_borrow_mut();
            let gates = match guard.as_deref_mut() {
                Ok(v) => v,
                Err(_) => &mut owned,
            };
            gates.clear();
            gates.reserve(batch * four);
            for _ in 0..batch {
                gates.extend_from_slice(&b);
            }
            gemm::gemm_acc(x, w_ih, gates);
            gemm::gemm_acc(h, w_hh, gates);
            lstm_states(gates, &c, &mut h2, &mut c2, hidden);
        });
        vec![tensor(h2, &[batch, hidden]), tensor(c2, &[batch, hidden])]
    }

    /// `c' = f·c + i·g` and `h' = o·tanh(c')` from the gates (order i, f, g,
    /// o), with AVX2 + FMA code when the CPU has them (the same arithmetic,
    /// eight lanes at a time).
    fn lstm_states(gates: &[f32], c: &[f32], h2: &mut [f32], c2: &mut [f32], hidden: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { lstm_states_avx2(gates, c, h2, c2, hidden) };
            return;
        }
        lstm_states_portable(gates, c, h2, c2, hidden);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn lstm_states_avx2(gates: &[f32], c: &[f32], h2: &mut [f32], c2: &mut [f32], hidden: usize) {
        lstm_states_portable(gates, c, h2, c2, hidden);
    }

    #[inline(always)]
    fn lstm_states_portable(gates: &[f32], c: &[f32], h2: &mut [f32], c2: &mut [f32], hidden: usize) {
        if hidden == 0 {
            return;
        }
        let rows = gates.chunks_exact(4 * hidden).zip(c.chunks_exact(hidden));
        for ((g, cr), (hr, cn)) in rows.zip(h2.chunks_exact_mut(hidden).zip(c2.chunks_exact_mut(hidden))) {
            let (gi, rest) = g.split_at(hidden);
            let (gf, rest) = rest.split_at(hidden);
            let (gg, go) = rest.split_at(hidden);
            for j in 0..hidden {
                let i = fast::sigmoid(gi[j]);
                let f = fast::sigmoid(gf[j]);
                let gt = fast::tanh(gg[j]);
                let o = fast::sigmoid(go[j]);
                let cv = f * cr[j] + i * gt;
                cn[j] = cv;
                hr[j] = o * fast::tanh(cv);
            }
        }
    }
}

/// Branch-free f32 approximations that the compiler keeps in registers (and
/// vectorizes). NaN propagates through each.
mod fast {
    /// `e^x`: Cephes `expf` (range reduction by `ln 2` in two parts, degree-5
    /// polynomial, exponent assembled from bits); about 1 ULP on
    /// `[-87, 88]`, inputs clamped to that range.
    #[inline(always)]
    pub fn exp(x: f32) -> f32 {
        // Comparisons (not f32::min/max) so that NaN stays NaN.
        let x = if x > 88.0 { 88.0 } else { x };
        let x = if x < -87.0 { -87.0 } else { x };
        // n = round(x / ln 2) with the 1.5 * 2^23 trick.
        let t = x * std::f32::consts::LOG2_E + 12_582_912.0;
        let n = t - 12_582_912.0;
        let k = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
        let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
        let r2 = r * r;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let y = p * r2 + r + 1.0;
        y * f32::from_bits(((k + 127) as u32) << 23)
    }

    /// `tanh(x)`: Cephes' odd polynomial for `|x| < 0.625`, else
    /// `1 - 2 / (e^{2|x|} + 1)` with the sign restored.
    #[inline(always)]
    pub fn tanh(x: f32) -> f32 {
        let z = x * x;
        let small = ((((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328e-1)
            * z
            * x
            + x;
        let ax = x.abs();
        let ax = if ax > 10.0 { 10.0 } else { ax };
        let big = (1.0 - 2.0 / (exp(2.0 * ax) + 1.0)).copysign(x);
        if ax < 0.625 {
            small
        } else {
            big
        }
    }

    /// `1 / (1 + e^-x)`.
    #[inline(always)]
    pub fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + exp(-x))
    }

    /// The largest element, NaN ignored (a NaN then reaches the result
    /// through `x - max`, as in the reference).
    pub fn max(row: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; 8];
        for chunk in row.chunks(8) {
            for (a, &v) in acc.iter_mut().zip(chunk) {
                *a = if v > *a { v } else { *a };
            }
        }
        acc.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    }

    /// The sum in 8 partial accumulators.
    pub fn sum(row: &[f32]) -> f32 {
        let mut acc = [0.0f32; 8];
        for chunk in row.chunks(8) {
            for (a, &v) in acc.iter_mut().zip(chunk) {
                *a += v;
            }
        }
        acc.iter().sum()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn approximations_are_close() {
            let mut worst = [0.0f64; 3];
            let mut x = -30.0f32;
            while x < 30.0 {
                let e = (super::exp(x) as f64 - (x as f64).exp()).abs() / (x as f64).exp();
                let t = (super::tanh(x) as f64 - (x as f64).tanh()).abs();
                let s = (super::sigmoid(x) as f64 - 1.0 / (1.0 + (-x as f64).exp())).abs();
                worst = [worst[0].max(e), worst[1].max(t), worst[2].max(s)];
                x += 0.001_37;
            }
            assert!(worst[0] < 3e-7 && worst[1] < 3e-7 && worst[2] < 3e-7, "{worst:?}");
            assert!(super::exp(f32::NAN).is_nan() && super::tanh(f32::NAN).is_nan());
            assert_eq!(super::tanh(f32::INFINITY), 1.0);
            assert_eq!(super::tanh(f32::NEG_INFINITY), -1.0);
            assert_eq!(super::exp(f32::NEG_INFINITY), super::exp(-87.0));
        }
    }
}
