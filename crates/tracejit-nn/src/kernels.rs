//! The native kernels of `tracejit::nn`, and the predicates saying which
//! argument specs each accepts: f32 only, hand-fused loops over contiguous
//! slices. [`builtin_kernels`] lists them for
//! `composite::ensure_builtins`, which registers them lazily.
//!
//! The kernels compute `exp`, `tanh` and `sigmoid` with in-register
//! approximations and sum in several partial accumulators, so they agree
//! with the primitive bodies to about 1e-6 relative, not bitwise.

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{ArrayView2, Ix2};
use tracejit_tensor::{DType, Storage};
use tracejit_trace::{Tensor, TensorSpec};

use crate::composite::{KernelFn, KernelPredicate};

mod gemm;

/// The built-in kernels: (composite name, predicate, kernel).
pub(crate) fn builtin_kernels() -> Vec<(&'static str, Arc<KernelPredicate>, Arc<KernelFn>)> {
    vec![
        ("tracejit.nn.gelu", Arc::new(|s: &[TensorSpec]| all_f32(s, 1)), Arc::new(gelu)),
        (
            "tracejit.nn.softmax",
            Arc::new(|s: &[TensorSpec]| all_f32(s, 1) && !s[0].dims().is_empty()),
            Arc::new(softmax),
        ),
        (
            "tracejit.nn.log_softmax",
            Arc::new(|s: &[TensorSpec]| all_f32(s, 1) && !s[0].dims().is_empty()),
            Arc::new(log_softmax),
        ),
        ("tracejit.nn.layer_norm", Arc::new(layer_norm_accepts), Arc::new(layer_norm)),
        ("tracejit.nn.lstm_cell", Arc::new(lstm_accepts), Arc::new(lstm_cell)),
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

/// A contiguous f32 copy-or-view of an eager tensor's data.
fn data(t: &Tensor) -> (Vec<usize>, Cow<'_, [f32]>) {
    let s = t.storage().expect("composite kernels get eager tensors");
    let a = s.array::<f32>().expect("the predicate accepted f32 only");
    let shape = a.shape().to_vec();
    match a.as_slice() {
        Some(slice) => (shape, Cow::Borrowed(slice)),
        None => (shape, Cow::Owned(a.iter().copied().collect())),
    }
}

fn tensor(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_raw_storage(Storage::from_vec(v, shape).expect("kernel output size"))
}

fn gelu(inputs: &[Tensor]) -> Vec<Tensor> {
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

fn softmax(inputs: &[Tensor]) -> Vec<Tensor> {
    per_row(inputs, |row, o| {
        let m = fast::max(row);
        let inv = 1.0 / exp_sum(row, m, |j, e| o[j] = e);
        o.iter_mut().for_each(|v| *v *= inv);
    })
}

fn log_softmax(inputs: &[Tensor]) -> Vec<Tensor> {
    per_row(inputs, |row, o| {
        let m = fast::max(row);
        let lse = exp_sum(row, m, |_, _| {}).ln();
        for (ov, &v) in o.iter_mut().zip(row) {
            *ov = (v - m) - lse;
        }
    })
}

fn layer_norm(inputs: &[Tensor]) -> Vec<Tensor> {
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

/// Two GEMMs ([`gemm`], the JIT's GEMM) accumulating into a
/// buffer pre-filled with the bias, then one vectorized pass over the
/// gates computing both states.
fn lstm_cell(inputs: &[Tensor]) -> Vec<Tensor> {
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
