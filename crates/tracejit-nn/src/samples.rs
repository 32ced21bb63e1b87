//! Argument sets each composite is tested on by iterating
//! [`crate::declared`]: odd sizes (0, 1, 3, 5, 17), both float dtypes
//! (f64 where the native kernel declines, so the body runs), and NaN and
//! infinities among the values.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::Activation;

/// Normal samples of `shape` and `dtype` from `seed`, with a NaN and an
/// infinity written over two elements when `specials` and the tensor has
/// room for them.
pub(crate) fn values(shape: &[usize], dtype: DType, seed: u64, specials: bool) -> Tensor {
    let mut v = Tensor::randn(shape, seed).to_vec::<f32>().expect("f32 samples");
    if specials && v.len() >= 4 {
        v[1] = f32::NAN;
        v[2] = f32::INFINITY;
    }
    Tensor::from_vec(v, shape).cast(dtype)
}

/// One argument: shapes from a scalar to a few rows, both float dtypes.
pub(crate) fn unary() -> Vec<(Vec<Tensor>, u32)> {
    let shapes: [&[usize]; 5] = [&[], &[0], &[1], &[3, 5], &[17]];
    let mut out = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            out.push((vec![values(s, dtype, i as u64, i == 3)], 0));
        }
    }
    out
}

/// One argument of rank >= 1 (rows along the last axis), a NaN row among
/// them.
pub(crate) fn rows() -> Vec<(Vec<Tensor>, u32)> {
    let shapes: [&[usize]; 5] = [&[1], &[3, 5], &[2, 3, 17], &[0, 4], &[5, 1]];
    let mut out = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            out.push((vec![values(s, dtype, 10 + i as u64, i == 1)], 0));
        }
    }
    out
}

/// `(x, gamma, beta, eps)` for rows of 1, 5 and 17.
pub(crate) fn layer_norm() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for (i, (rows, n)) in [(3usize, 5usize), (1, 17), (4, 1)].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            let seed = 20 + i as u64;
            let x = values(&[rows, n], dtype, seed, i == 0);
            let gamma = values(&[n], dtype, seed + 1, false);
            let beta = values(&[n], dtype, seed + 2, false);
            out.push((vec![x, gamma, beta, Tensor::full(&[], 1e-5, dtype)], 0));
        }
    }
    out
}

/// `samples` with a cotangent of the first argument's shape appended to
/// each (seeds from `seed`).
fn with_cotangent(samples: Vec<(Vec<Tensor>, u32)>, seed: u64) -> Vec<(Vec<Tensor>, u32)> {
    samples
        .into_iter()
        .enumerate()
        .map(|(i, (mut a, attr))| {
            let g = values(a[0].shape(), a[0].dtype(), seed + i as u64, false);
            a.push(g);
            (a, attr)
        })
        .collect()
}

/// [`unary`]'s arguments and a cotangent of the same shape (`gelu_grad`).
pub(crate) fn unary_with_cotangent() -> Vec<(Vec<Tensor>, u32)> {
    with_cotangent(unary(), 30)
}

/// [`layer_norm`]'s arguments and a cotangent of `x`'s shape.
pub(crate) fn layer_norm_grad() -> Vec<(Vec<Tensor>, u32)> {
    with_cotangent(layer_norm(), 40)
}

/// `(x, h, c, w_ih, w_hh, b)` for batches of 1 and 3, hidden 5.
pub(crate) fn lstm_cell() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for (i, (batch, input, hidden)) in [(1usize, 3usize, 5usize), (3, 4, 5)].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            let s = 50 + 10 * i as u64;
            let scaled = |shape: &[usize], seed| values(shape, dtype, seed, false) * 0.5;
            out.push((
                vec![
                    scaled(&[batch, input], s),
                    scaled(&[batch, hidden], s + 1),
                    scaled(&[batch, hidden], s + 2),
                    scaled(&[input, 4 * hidden], s + 3),
                    scaled(&[hidden, 4 * hidden], s + 4),
                    scaled(&[4 * hidden], s + 5),
                ],
                0,
            ));
        }
    }
    out
}

/// `(logits, labels)`: one-hot rows and soft labels.
pub(crate) fn cross_entropy() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        let logits = values(&[3, 5], dtype, 70, false);
        let hot = Tensor::from_vec(vec![0i64, 4, 2], &[3]).one_hot(5, dtype);
        out.push((vec![logits.clone(), hot], 0));
        let soft = crate::softmax(&values(&[3, 5], dtype, 71, false), -1);
        out.push((vec![logits, soft], 0));
    }
    out
}

/// `(x, w, b)` with each activation.
pub(crate) fn dense() -> Vec<(Vec<Tensor>, u32)> {
    Activation::ALL
        .iter()
        .enumerate()
        .map(|(i, act)| {
            let s = 80 + 3 * i as u64;
            let dtype = if i % 2 == 0 { DType::F32 } else { DType::F64 };
            (
                vec![
                    values(&[3, 4], dtype, s, false),
                    values(&[4, 5], dtype, s + 1, false),
                    values(&[5], dtype, s + 2, false),
                ],
                act.code(),
            )
        })
        .collect()
}

/// `(x, state, p)`: sizes across a chunk boundary, both float dtypes.
pub(crate) fn dropout() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for (i, shape) in [&[1usize][..], &[3, 5], &[4097], &[0, 2]].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            let state = Tensor::from_vec(vec![i as i64, 7, 42], &[3]);
            let p = Tensor::full(&[], 0.3, dtype);
            out.push((vec![values(shape, dtype, 100 + i as u64, i == 1), state, p], 0));
        }
    }
    out
}

/// One attention case: leading axes of q and of k/v, `(tq, tk, d, dv)`,
/// causal, the mask's shape, dtype, a NaN in `q`.
type AttentionCase = (&'static [usize], &'static [usize], [usize; 4], bool, Option<&'static [usize]>, DType, bool);

/// `(q, k, v, scale, causal[, mask])`: one element; batch and heads with
/// the causal rule; k and v broadcast along the batch with a mask that
/// hides one query's every key; a key-padding mask in f64 (the body
/// runs); no queries; no keys; more queries than keys; a NaN; more than
/// one tile of 64.
pub(crate) fn attention() -> Vec<(Vec<Tensor>, u32)> {
    let cases: [AttentionCase; 9] = [
        (&[1], &[1], [1, 1, 1, 1], false, None, DType::F32, false),
        (&[2, 3], &[2, 3], [5, 7, 4, 3], true, None, DType::F32, false),
        (&[2, 3], &[1, 3], [6, 6, 5, 5], true, Some(&[2, 1, 6, 6]), DType::F32, false),
        (&[2], &[2], [3, 5, 4, 4], false, Some(&[5]), DType::F64, false),
        (&[1, 2], &[1, 2], [0, 3, 2, 2], false, None, DType::F32, false),
        (&[2], &[2], [4, 0, 3, 3], false, None, DType::F32, false),
        (&[3], &[3], [17, 9, 8, 8], true, None, DType::F32, false),
        (&[2], &[2], [3, 3, 4, 4], false, None, DType::F32, true),
        (&[2], &[2], [70, 70, 16, 16], true, None, DType::F32, false),
    ];
    cases
        .iter()
        .enumerate()
        .map(|(i, &(ql, kl, [tq, tk, d, dv], causal, mask, dtype, nan))| {
            let shape = |lead: &[usize], t: usize, w: usize| [lead, &[t, w]].concat();
            let seed = 120 + 4 * i as u64;
            let q = values(&shape(ql, tq, d), dtype, seed, nan);
            let k = values(&shape(kl, tk, d), dtype, seed + 1, false);
            let v = values(&shape(kl, tk, dv), dtype, seed + 2, false);
            let scale = Tensor::full(&[], 1.0 / (d as f64).sqrt(), dtype);
            let mut args = vec![q, k, v, scale, Tensor::scalar(causal)];
            if let Some(m) = mask {
                let n: usize = m.iter().product();
                // Every fifth pair hidden, and the first query's every key.
                let last = *m.last().expect("rank >= 1");
                let flags = (0..n).map(|j| j % 5 != 3 && (m.len() < 2 || j >= last)).collect();
                args.push(Tensor::from_vec(flags, m));
            }
            (args, 0)
        })
        .chain(float_masks())
        .collect()
}

/// `(q, k, v, scale, causal, mask)` with float masks added to the scores:
/// a padding bias per key of each batch row (0, a large negative number,
/// `-inf` on the last keys) over heads with the causal rule, and random
/// values per pair in f32 and f64.
fn float_masks() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for (i, (lead, [tq, tk, d], mask, dtype, causal)) in [
        (&[2usize, 3][..], [6usize, 6, 4], &[2usize, 1, 1, 6][..], DType::F32, true),
        (&[2], [5, 7, 3], &[5, 7], DType::F32, false),
        (&[2], [3, 4, 2], &[2, 3, 4], DType::F64, false),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 160 + 4 * i as u64;
        let shape = |t: usize| [lead, &[t, d]].concat();
        let q = values(&shape(tq), dtype, seed, false);
        let k = values(&shape(tk), dtype, seed + 1, false);
        let v = values(&shape(tk), dtype, seed + 2, false);
        let bias = if i == 0 {
            let pad = [0.0, 0.0, 0.0, 0.0, -10_000.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0e38, f32::NEG_INFINITY];
            Tensor::from_vec(pad.to_vec(), mask).cast(dtype)
        } else {
            values(mask, dtype, seed + 3, false)
        };
        let scale = Tensor::full(&[], 1.0 / (d as f64).sqrt(), dtype);
        out.push((vec![q, k, v, scale, Tensor::scalar(causal), bias], 0));
    }
    out
}

/// `(q, k, v, scale, causal, out, lse, dout[, mask])` from the forward's
/// samples, `out` and `lse` computed by its body.
pub(crate) fn attention_grad() -> Vec<(Vec<Tensor>, u32)> {
    attention()
        .into_iter()
        .enumerate()
        .map(|(i, (a, attr))| {
            let outs = crate::attention::ATTENTION.run_body(&a, attr);
            let dout = values(outs[0].shape(), a[0].dtype(), 200 + i as u64, false);
            let mut args = a[..5].to_vec();
            args.extend([outs[0].clone(), outs[1].clone(), dout]);
            args.extend(a[5..].iter().cloned());
            (args, attr)
        })
        .collect()
}

/// Batch norm in inference: `(x [N, C, ..], gamma, beta, mean, var [C],
/// eps)`, NCHW and `[N, C]`, a batch of 0 among them.
pub(crate) fn batch_norm() -> Vec<(Vec<Tensor>, u32)> {
    let mut out = Vec::new();
    for (i, shape) in [&[2usize, 3, 4, 5][..], &[0, 2, 3, 3], &[5, 4]].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            let (c, seed) = (shape[1], 40 + 10 * i as u64);
            let var = values(&[c], dtype, seed + 4, false).abs() + 0.5;
            out.push((
                vec![
                    values(shape, dtype, seed, i == 0),
                    values(&[c], dtype, seed + 1, false),
                    values(&[c], dtype, seed + 2, false),
                    values(&[c], dtype, seed + 3, false),
                    var,
                    Tensor::full(&[], 1e-5, dtype),
                ],
                0,
            ));
        }
    }
    out
}
