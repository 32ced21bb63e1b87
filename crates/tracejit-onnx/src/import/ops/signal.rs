//! Signal processing: `HannWindow`, `HammingWindow` and `BlackmanWindow`
//! (opset 17) of a static length, periodic (the default) or symmetric,
//! computed in f64 and rounded once to `output_datatype` (ONNX's reference
//! computes them in the output type, a few ulps apart); and `DFT` (opset
//! 17, its axis an input from 20): forward, inverse, one-sided (rfft and
//! irfft), `dft_length` truncating or zero-padding, as products with the
//! cosine and sine matrices (f64 constants rounded to the input type): a
//! direct DFT, O(n²) per transform, within n roundings of the magnitudes
//! like any summation order.

use std::f64::consts::PI;

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};

/// The attributes the windows read.
pub(crate) const WINDOW_ATTRS: &[&str] = &["output_datatype", "periodic"];

/// The longest window built (it is a constant of the trace).
const MAX_LEN: i64 = 1 << 28;

/// The three windows, by op type.
pub(crate) fn window(n: &mut Node) -> OpResult {
    let len = n.known_scalar(0)? as i64;
    if !(0..=MAX_LEN).contains(&len) {
        return Err(format!("size {len} must be between 0 and {MAX_LEN}"));
    }
    let dtype = n.attr_dtype("output_datatype", DType::F32)?;
    let periodic = n.attr_i("periodic", 1)? != 0;
    // The period: N for a periodic window, N - 1 for a symmetric one.
    let period = if periodic { len } else { len - 1 } as f64;
    let op = n.op_type;
    let w: Vec<f64> = (0..len)
        .map(|i| {
            let x = 2.0 * PI * i as f64 / period;
            match op {
                "HannWindow" => 0.5 - 0.5 * x.cos(),
                "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * x.cos(),
                _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .collect();
    Ok(vec![Tensor::from_vec(w, &[len as usize]).cast(dtype)])
}

/// The attributes `DFT` reads.
pub(crate) const DFT_ATTRS: &[&str] = &["axis", "inverse", "onesided"];

/// `t` with `axis` moved last (`back`: from last to `axis`).
fn to_last(t: &Tensor, axis: usize, back: bool) -> Tensor {
    let r = t.rank();
    let mut perm: Vec<i64> = (0..r as i64).filter(|&a| a != axis as i64).collect();
    if back {
        // Output axis `axis` is the input's last.
        let mut p: Vec<i64> = (0..r as i64 - 1).collect();
        p.insert(axis, r as i64 - 1);
        perm = p;
    } else {
        perm.push(axis as i64);
    }
    t.transpose(&perm)
}

/// `t` (`[.., n]`) truncated or zero-padded to `len` along its last axis.
fn fit(t: &Tensor, len: usize) -> Tensor {
    let n = *t.shape().last().unwrap_or(&0);
    if n >= len {
        return t.slice_axis(-1, 0, len as i64);
    }
    let mut pads = vec![(0, 0); t.rank()];
    pads[t.rank() - 1] = (0, len - n);
    t.pad(&pads, 0.0)
}

/// `f(j, k)` for `j < rows`, `k < cols`, as a `[rows, cols]` matrix of `dtype`.
fn matrix(rows: usize, cols: usize, dtype: DType, f: impl Fn(usize, usize) -> f64) -> Tensor {
    let v: Vec<f64> = (0..rows * cols).map(|i| f(i / cols, i % cols)).collect();
    Tensor::from_vec(v, &[rows, cols]).cast(dtype)
}

/// `2π·j·k / len`, reduced first so large products stay exact.
fn angle(j: usize, k: usize, len: usize) -> f64 {
    2.0 * std::f64::consts::PI * ((j * k) % len) as f64 / len as f64
}

/// The direct transform of `a + i·b` along the last axis (`len` long):
/// the first `cols` outputs `(re, im)`, forward or inverse (scaled 1/len).
fn direct(a: &Tensor, b: Option<&Tensor>, cols: usize, inverse: bool) -> (Tensor, Tensor) {
    let (len, dtype) = (*a.shape().last().unwrap_or(&1), a.dtype());
    let scale = if inverse { 1.0 / len as f64 } else { 1.0 };
    // e^{∓iθ}: the forward transform's sine enters negated.
    let sign = if inverse { 1.0 } else { -1.0 };
    let c = matrix(len, cols, dtype, |j, k| angle(j, k, len).cos() * scale);
    let s = matrix(len, cols, dtype, |j, k| sign * angle(j, k, len).sin() * scale);
    let (mut re, mut im) = (a.matmul(&c), a.matmul(&s));
    if let Some(b) = b {
        re = &re - &b.matmul(&s);
        im = &im + &b.matmul(&c);
    }
    (re, im)
}

/// `DFT`.
pub(crate) fn dft(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (rank, dtype) = (x.rank(), x.dtype());
    let parts = x.shape().last().copied().unwrap_or(0);
    if !dtype.is_float() || rank < 2 || !(parts == 1 || parts == 2) {
        return Err(format!("input {dtype} {:?} must be floats ending in 1 (real) or 2 (complex)", x.shape()));
    }
    let axis = if n.opset >= 20 {
        if n.opt_input(2).is_some() {
            n.known_scalar(2)? as i64
        } else {
            -2
        }
    } else {
        n.attr_i("axis", 1)?
    };
    let axis = normalize_axis(axis, rank)?;
    if axis == rank - 1 {
        return Err("axis must not be the last (real/imaginary) axis".into());
    }
    let (inverse, onesided) = (n.attr_i("inverse", 0)? != 0, n.attr_i("onesided", 0)? != 0);
    let len_in = x.shape()[axis];
    let len = match n.opt_input(1) {
        Some(_) => n.known_scalar(1)? as i64,
        None if inverse && onesided => 2 * (len_in as i64 - 1),
        None => len_in as i64,
    };
    // A direct DFT holds L × L constants: bounded like a tensor in the file.
    if !(1..=4096).contains(&len) {
        return Err(format!("dft_length {len} must be between 1 and 4096 (the importer's DFT is direct, O(L²))"));
    }
    let len = len as usize;
    let part = |k: i64| to_last(&x.slice_axis(-1, k, k + 1).squeeze(&[-1]), axis, false);
    let a = part(0);
    let b = (parts == 2).then(|| part(1));
    let angle = |j: usize, k: usize| angle(j, k, len);
    let (re, im) = if inverse && onesided {
        // irfft: the first len/2 + 1 coefficients, Hermitian symmetry for the rest.
        let kk = len / 2 + 1;
        let weight = |k: usize| if k == 0 || (len.is_multiple_of(2) && k == len / 2) { 1.0 } else { 2.0 };
        let c = matrix(kk, len, dtype, |k, j| weight(k) * angle(j, k).cos() / len as f64);
        let s = matrix(kk, len, dtype, |k, j| weight(k) * angle(j, k).sin() / len as f64);
        let mut re = fit(&a, kk).matmul(&c);
        if let Some(b) = &b {
            re = &re - &fit(b, kk).matmul(&s);
        }
        (re, None)
    } else {
        let cols = if onesided && !inverse { len / 2 + 1 } else { len };
        let (re, im) = direct(&fit(&a, len), b.as_ref().map(|b| fit(b, len)).as_ref(), cols, inverse);
        (re, Some(im))
    };
    let back = |t: Tensor| to_last(&t, axis, true).expand_dims(-1);
    Ok(vec![match im {
        Some(im) => Tensor::concat(&[back(re), back(im)], -1),
        None => back(re),
    }])
}

/// The attributes `STFT` reads.
pub(crate) const STFT_ATTRS: &[&str] = &["onesided"];

/// `STFT` (opset 17): frames of `frame_length` (or the window's length)
/// every `frame_step` samples, weighted by the window, each transformed
/// directly: `[batch, frames, bins, 2]`.
pub(crate) fn stft(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (dtype, xs) = (x.dtype(), x.shape().to_vec());
    if !dtype.is_float() || xs.len() != 3 || !(xs[2] == 1 || xs[2] == 2) {
        return Err(format!("signal {dtype} {xs:?} must be [batch, length, 1 or 2] floats"));
    }
    let step = n.known_scalar(1)? as i64;
    let window = n.opt_input(2);
    let len = match (n.opt_input(3), window) {
        (Some(_), _) => n.known_scalar(3)? as i64,
        (None, Some(w)) if w.rank() == 1 => w.len() as i64,
        _ => return Err("STFT needs frame_length or a 1-D window".into()),
    };
    if step < 1 || !(1..=4096).contains(&len) || len > xs[1] as i64 {
        return Err(format!(
            "frame_step {step} and frame_length {len} must be positive, the length at most 4096 and the signal's {}",
            xs[1]
        ));
    }
    if let Some(w) = window.filter(|w| w.shape() != [len as usize] || w.dtype() != dtype) {
        return Err(format!("window {} {:?} must be {dtype} [{len}]", w.dtype(), w.shape()));
    }
    let (step, len) = (step as usize, len as usize);
    let frames = 1 + (xs[1] - len) / step;
    let idx: Vec<i64> = (0..frames * len).map(|i| ((i / len) * step + i % len) as i64).collect();
    let idx = Tensor::from_vec(idx, &[frames, len]);
    // [batch, frames, len], weighted by the window.
    let part = |k: i64| {
        let p = x.slice_axis(-1, k, k + 1).squeeze(&[-1]).gather(&idx, 1);
        match window {
            Some(w) => &p * w,
            None => p,
        }
    };
    let (a, b) = (part(0), (xs[2] == 2).then(|| part(1)));
    let cols = if n.attr_i("onesided", 1)? != 0 { len / 2 + 1 } else { len };
    let (re, im) = direct(&a, b.as_ref(), cols, false);
    Ok(vec![Tensor::stack(&[re, im], -1)])
}
