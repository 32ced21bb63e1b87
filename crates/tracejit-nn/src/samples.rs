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

/// [`layer_norm`]'s arguments and a cotangent of `x`'s shape.
pub(crate) fn layer_norm_grad() -> Vec<(Vec<Tensor>, u32)> {
    layer_norm()
        .into_iter()
        .enumerate()
        .map(|(i, (mut a, attr))| {
            let dy = values(a[0].shape(), a[0].dtype(), 40 + i as u64, false);
            a.push(dy);
            (a, attr)
        })
        .collect()
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
