//! sentence-transformers' pooling: the mean of a sequence's token states
//! over its attention mask, then scaling to unit length — what
//! all-MiniLM-L6-v2's `1_Pooling` (mean tokens) and `2_Normalize` modules
//! compute, with the same guards (a count clamped to 1e-9, a norm to
//! 1e-12), so an all-padding row gives zeros, not NaN.

use tracejit::prelude::*;

/// The mean over `seq` of `hidden [batch, seq, h]` where `mask [batch,
/// seq]` is nonzero (any dtype): `[batch, h]`.
///
/// ```
/// use tracejit::prelude::*;
///
/// let h = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 100.0, 100.0], &[1, 3, 2]);
/// let mask = Tensor::from_vec(vec![1i64, 1, 0], &[1, 3]);
/// assert_eq!(tracejit_models::mean_pool(&h, &mask).to_vec::<f32>()?, [2.0, 3.0]);
/// # Ok::<(), tracejit::Error>(())
/// ```
#[track_caller]
pub fn mean_pool(hidden: &Tensor, mask: &Tensor) -> Tensor {
    let m = mask.cast(DType::Bool).cast(hidden.dtype()).expand_dims(-1);
    let sum = (hidden * &m).sum(&[1], false);
    let count = m.sum(&[1], false).maximum(Tensor::full(&[], 1e-9, hidden.dtype()));
    sum / count
}

/// Each row of `x [.., h]` over its Euclidean norm (at least 1e-12), as
/// `torch.nn.functional.normalize` does.
///
/// ```
/// use tracejit::prelude::*;
///
/// let x = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], &[2, 2]);
/// assert_eq!(tracejit_models::l2_normalize(&x).to_vec::<f32>()?, [0.6, 0.8, 0.0, 0.0]);
/// # Ok::<(), tracejit::Error>(())
/// ```
#[track_caller]
pub fn l2_normalize(x: &Tensor) -> Tensor {
    let norm = x.square().sum(&[-1], true).sqrt().maximum(Tensor::full(&[], 1e-12, x.dtype()));
    x / norm
}
