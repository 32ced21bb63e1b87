//! The native kernels of `tracejit::nn`, and the predicates saying which
//! argument specs each accepts: f32 only (the layer-norm backward also
//! f64), hand-fused loops over contiguous slices. Each is declared with
//! its composite in `composites.rs`.
//!
//! The kernels compute `exp`, `tanh` and `sigmoid` with
//! `tracejit_kernels::fastmath`: the JIT's own approximations, bit for bit (one
//! implementation, one ULP table, in `tracejit-jit`'s documentation), run
//! over whole slices in 256-bit AVX2 code where the CPU has it. They sum in
//! several partial accumulators and fuse differently from the primitive
//! bodies, so they agree with those to about 1e-6 relative, not bitwise.
//! Each kernel takes the [`Isa`] its caller allows (the JIT's options, or
//! the environment's for eager calls), and the call's argument values as
//! [`Storage`] ([`crate::NativeFn`]).

use std::borrow::Cow;
use std::mem::MaybeUninit;

use ndarray::{ArrayView2, Ix2};
use tracejit_kernels::{gemm, simd, Isa};
use tracejit_tensor::kernels::par;
use tracejit_tensor::{DType, Storage};
use tracejit_trace::TensorSpec;

mod layer_norm_grad;

/// f32 `x` of any shape ([`gelu`]).
pub(crate) fn gelu_accepts(s: &[TensorSpec]) -> bool {
    all_f32(s, 1)
}

/// `(x, g)`, both f32 and of one shape ([`gelu_grad`]; a broadcast
/// cotangent takes the body).
pub(crate) fn gelu_grad_accepts(s: &[TensorSpec]) -> bool {
    all_f32(s, 2) && s[0].dims() == s[1].dims()
}

/// f32 `x` of rank >= 1, rows along the last axis ([`softmax`],
/// [`log_softmax`]).
pub(crate) fn rows_accepts(s: &[TensorSpec]) -> bool {
    all_f32(s, 1) && !s[0].dims().is_empty()
}

/// See [`layer_norm_grad::accepts`].
pub(crate) fn layer_norm_grad_accepts(s: &[TensorSpec]) -> bool {
    layer_norm_grad::accepts(s)
}

/// The native backward of layer norm, f32 or f64 ([`layer_norm_grad::layer_norm_grad`]).
pub(crate) fn layer_norm_grad(inputs: &[Storage], _isa: Isa) -> Vec<Storage> {
    layer_norm_grad::layer_norm_grad(inputs)
}

fn all_f32(specs: &[TensorSpec], n: usize) -> bool {
    specs.len() == n && specs.iter().all(|s| s.dtype() == DType::F32)
}

/// x of rank >= 1; gamma and beta of shape [last] (or broadcastable rank 1);
/// eps a scalar.
pub(crate) fn layer_norm_accepts(s: &[TensorSpec]) -> bool {
    if !all_f32(s, 4) || s[0].dims().is_empty() || !s[3].dims().is_empty() {
        return false;
    }
    let last = *s[0].dims().last().expect("rank >= 1");
    s[1..3].iter().all(|p| p.dims().len() == 1 && (p.dims()[0] == last || p.dims()[0] == Some(1) || last.is_none()))
}

/// x [B, I], h and c [B, H], w_ih [I, 4H], w_hh [H, 4H], b [4H].
pub(crate) fn lstm_accepts(s: &[TensorSpec]) -> bool {
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

/// A contiguous f32 copy-or-view of an argument's data.
fn data(s: &Storage) -> (Vec<usize>, Cow<'_, [f32]>) {
    let a = s.array::<f32>().expect("the predicate accepted f32 only");
    let shape = a.shape().to_vec();
    match a.as_slice() {
        Some(slice) => (shape, Cow::Borrowed(slice)),
        None => (shape, Cow::Owned(s.to_vec::<f32>().expect("f32"))),
    }
}

fn storage(v: Vec<f32>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("kernel output size")
}

/// Elements per step of [`gelu`]: the `tanh` arguments and results stay in
/// L1 between the three passes over them.
const GELU_CHUNK: usize = 512;

pub(crate) fn gelu(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    let (shape, x) = data(&inputs[0]);
    let mut out = vec![0.0f32; x.len()];
    for (xc, oc) in x.chunks(GELU_CHUNK).zip(out.chunks_mut(GELU_CHUNK)) {
        for (o, &x) in oc.iter_mut().zip(xc) {
            *o = (x + x * x * x * 0.044715) * 0.797_884_6;
        }
        simd::tanh_in_place_with(oc, isa);
        for (o, &x) in oc.iter_mut().zip(xc) {
            *o = (x * 0.5) * (*o + 1.0);
        }
    }
    vec![storage(out, &shape)]
}

/// GELU's derivative at `x` times the cotangent `g`, in one pass over
/// both (`crate::bodies::gelu_grad_body`'s formula): differentiating the
/// body op by op replayed its forward and wrote a [8, 128, 1024] tensor per
/// op, about 30 of them per layer of W10's eager train step.
pub(crate) fn gelu_grad(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    let (shape, x) = data(&inputs[0]);
    let (_, g) = data(&inputs[1]);
    let mut out = vec![0.0f32; x.len()];
    let pieces = x.chunks(GELU_CHUNK).zip(g.chunks(GELU_CHUNK)).zip(out.chunks_mut(GELU_CHUNK));
    for ((xc, gc), oc) in pieces {
        for (o, &x) in oc.iter_mut().zip(xc) {
            *o = (x + x * x * x * 0.044715) * 0.797_884_6;
        }
        simd::tanh_in_place_with(oc, isa);
        for ((o, &x), &g) in oc.iter_mut().zip(xc).zip(gc) {
            let t = *o;
            let slope = (1.0 - t * t) * (x * 0.5) * (x * x * 0.134_145 + 1.0) * 0.797_884_6;
            *o = ((t + 1.0) * 0.5 + slope) * g;
        }
    }
    vec![storage(out, &shape)]
}

/// Rows of the last axis.
fn rows(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// `o = exp(row - m)`, returning `Σ o` (in eight lane partials).
fn exp_shifted(row: &[f32], m: f32, o: &mut [f32], isa: Isa) -> f32 {
    for (ov, &v) in o.iter_mut().zip(row) {
        *ov = v - m;
    }
    simd::exp_in_place_with(o, isa);
    sum(o)
}

/// `f(row, out_row)` for each row along the last axis of `inputs[0]`, into
/// a new f32 array of its shape: rows in parts on the pool when there are
/// many (an attention's softmax over `[32, 12, 128, 128]` scores took
/// 18-25 ms of W15's call on one thread, its 25 MB output zero-filled as a
/// whole first); each row is zeroed in the cache just before `f` writes
/// it. Each row is computed alone, so the bits do not depend on the parts.
fn per_row(inputs: &[Storage], f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<Storage> {
    let (shape, x) = data(&inputs[0]);
    let n = rows(&shape);
    if n == 0 || x.is_empty() {
        return vec![storage(vec![0.0f32; x.len()], &shape)];
    }
    let fill = |start: usize, part: &mut [MaybeUninit<f32>]| {
        for (k, out) in part.chunks_mut(n).enumerate() {
            // Zeros first (a row is in the level-1 cache): `f` gets
            // initialized values to overwrite.
            for o in out.iter_mut() {
                o.write(0.0);
            }
            // SAFETY: every slot of `out` was written just above, and
            // `MaybeUninit<f32>` has `f32`'s layout.
            let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
            f(&x[start + k * n..][..n], out);
        }
    };
    // SAFETY: `fill` writes every slot of its part: parts are runs of whole
    // rows (`chunk` is the row length), each row's slots zeroed above.
    let out = unsafe { par::collect(x.len(), n, par::PAR_MIN, &fill) };
    vec![storage(out, &shape)]
}

pub(crate) fn softmax(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    // The JIT's row softmax: the kernel its f32 softmax regions run.
    per_row(inputs, |x, y| tracejit_kernels::softmax::row(x, y, isa))
}

pub(crate) fn log_softmax(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    per_row(inputs, |row, o| {
        let m = max(row);
        // `o` is scratch for the exponentials until the result overwrites it.
        let lse = exp_shifted(row, m, o, isa).ln();
        for (ov, &v) in o.iter_mut().zip(row) {
            *ov = (v - m) - lse;
        }
    })
}

pub(crate) fn layer_norm(inputs: &[Storage], _isa: Isa) -> Vec<Storage> {
    let (_, gamma) = data(&inputs[1]);
    let (_, beta) = data(&inputs[2]);
    let (_, eps) = data(&inputs[3]);
    let at = |p: &[f32], j: usize| if p.len() == 1 { p[0] } else { p[j] };
    per_row(inputs, |row, o| {
        let n = row.len();
        let inv_n = 1.0 / n as f32;
        let mean = sum(row) * inv_n;
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

fn view2(s: &Storage) -> ArrayView2<'_, f32> {
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
pub(crate) fn lstm_cell(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
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
        gemm::gemm_acc_f32(x, w_ih, gates, isa);
        gemm::gemm_acc_f32(h, w_hh, gates, isa);
        lstm_states(gates, &c, &mut h2, &mut c2, hidden, isa);
    });
    vec![storage(h2, &[batch, hidden]), storage(c2, &[batch, hidden])]
}

/// `c' = f·c + i·g` and `h' = o·tanh(c')` from the gates (order i, f, g,
/// o), activating the gates in place (so `gates` is scratch): the
/// activations run as whole slices through `fastmath` (256-bit code where
/// the CPU has AVX2), the products as plain loops.
fn lstm_states(gates: &mut [f32], c: &[f32], h2: &mut [f32], c2: &mut [f32], hidden: usize, isa: Isa) {
    if hidden == 0 {
        return;
    }
    let rows = gates.chunks_exact_mut(4 * hidden).zip(c.chunks_exact(hidden));
    for ((g, cr), (hr, cn)) in rows.zip(h2.chunks_exact_mut(hidden).zip(c2.chunks_exact_mut(hidden))) {
        let (ifg, go) = g.split_at_mut(3 * hidden);
        let (gif, gg) = ifg.split_at_mut(2 * hidden);
        simd::sigmoid_in_place_with(gif, isa);
        simd::tanh_in_place_with(gg, isa);
        simd::sigmoid_in_place_with(go, isa);
        let (gi, gf) = gif.split_at(hidden);
        for ((((cv, &i), &f), &gt), &c) in cn.iter_mut().zip(gi.iter()).zip(gf.iter()).zip(gg.iter()).zip(cr) {
            *cv = f * c + i * gt;
        }
        hr.copy_from_slice(cn);
        simd::tanh_in_place_with(hr, isa);
        for (h, &o) in hr.iter_mut().zip(go.iter()) {
            *h *= o;
        }
    }
}

/// The largest element, NaN ignored (a NaN then reaches the result
/// through `x - max`, as in the reference).
fn max(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    for chunk in row.chunks(8) {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// The sum in 8 partial accumulators (a fixed order the compiler
/// vectorizes).
fn sum(row: &[f32]) -> f32 {
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
    use super::*;
    use tracejit_kernels::fastmath;

    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..1500).map(|i| (i as f32 - 750.0) * 0.0137).collect();
        xs.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, -1e-40, 1e30, -1e30, 95.0, -120.0]);
        xs
    }

    fn assert_same(got: &[f32], want: impl Iterator<Item = f32>) {
        for (k, (&g, w)) in got.iter().zip(want).enumerate() {
            assert!(if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() }, "element {k}: {g:e} vs {w:e}");
        }
    }

    /// The kernels' element functions are the JIT's (`fastmath`), bit for
    /// bit, through the slice forms they call.
    #[test]
    fn kernels_compute_the_jits_approximations() {
        let xs = inputs();
        for isa in [Isa::native(), Isa::native().with_avx512(false)] {
            same_as_fastmath(&xs, isa);
        }
    }

    fn same_as_fastmath(xs: &[f32], isa: Isa) {
        let x = storage(xs.to_vec(), &[xs.len()]);
        let g = gelu(&[x], isa)[0].to_vec::<f32>().unwrap();
        assert_same(
            &g,
            xs.iter().map(|&x| (x * 0.5) * (fastmath::tanh((x + x * x * x * 0.044715) * 0.797_884_6) + 1.0)),
        );

        let finite: Vec<f32> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        let m = max(&finite);
        let mut o = vec![0.0f32; finite.len()];
        exp_shifted(&finite, m, &mut o, isa);
        assert_same(&o, finite.iter().map(|&v| fastmath::exp(v - m)));

        let hidden = xs.len() / 4;
        let mut gates = xs[..4 * hidden].to_vec();
        let c: Vec<f32> = (0..hidden).map(|j| (j as f32 * 0.37).sin() * 3.0).collect();
        let (mut h2, mut c2) = (vec![0.0f32; hidden], vec![0.0f32; hidden]);
        lstm_states(&mut gates, &c, &mut h2, &mut c2, hidden, isa);
        let gate = |k: usize, j: usize| xs[k * hidden + j];
        let want_c: Vec<f32> = (0..hidden)
            .map(|j| fastmath::sigmoid(gate(1, j)) * c[j] + fastmath::sigmoid(gate(0, j)) * fastmath::tanh(gate(2, j)))
            .collect();
        assert_same(&c2, want_c.iter().copied());
        assert_same(&h2, (0..hidden).map(|j| fastmath::sigmoid(gate(3, j)) * fastmath::tanh(want_c[j])));
    }
}
