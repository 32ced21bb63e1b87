//! Batch normalization over the channel axis (axis 1) of NCHW activations
//! (or `[N, C]` features, or any rank from 2 with channels second), as
//! ONNX `BatchNormalization`, TF's `batch_normalization` and PyTorch's
//! `batch_norm`.
//!
//! It is written with primitives, so its gradients (for `x`, `gamma` and
//! `beta`, through the batch statistics in training) are the tape's usual
//! rules and a compiled step fuses its elementwise parts. Inference runs
//! the composite `tracejit.nn.batch_norm` (the same formula), which ONNX
//! export writes as `BatchNormalization`.
//!
//! The moving statistics are `Variable`s the caller owns (create them
//! non-trainable, `Variable::new(..).with_trainable(false)`, so optimizers
//! leave them alone; a module that holds them checkpoints them with its
//! weights). Training assigns them; inference only reads them.

use tracejit_trace::{Tensor, Variable};

use crate::decl::Composite;

/// `tracejit.nn.batch_norm`: inference-mode batch normalization `(x,
/// gamma, beta, mean, var, eps)` with per-channel `[C]` statistics and a
/// rank-0 `eps`. A composite (no native kernel: its body fuses) so that
/// ONNX export can write it as one `BatchNormalization` node.
pub static BATCH_NORM: Composite = Composite::new(
    "tracejit.nn.batch_norm",
    "batch_norm",
    |a, _| {
        vec![normalize(
            &a[0],
            &a[1],
            &a[2],
            &(&a[0] - per_channel(&a[3], a[0].rank())),
            &per_channel(&a[4], a[0].rank()),
            &a[5],
        )]
    },
    None,
    None,
    crate::samples::batch_norm,
);

/// How many values each channel's statistics average.
enum Count {
    /// Known while tracing (every dim but the channels' known).
    Known(usize),
    /// Only at run time: a `[C]` tensor of counts.
    Unknown(Tensor),
}

/// The number of elements per channel of `x` (reduced over `axes`).
fn batch_count(x: &Tensor, axes: &[i64]) -> Count {
    let dims = x.dims();
    let known: Option<usize> = axes.iter().map(|&a| dims[a as usize]).product();
    match known {
        Some(n) => Count::Known(n),
        // A dim unknown while tracing: count at run time (ones of x's
        // shape, summed; x == x or x != x is true everywhere).
        None => {
            let ones = x.eq(x).logical_or(x.ne(x)).cast(x.dtype());
            Count::Unknown(ones.sum(axes, false))
        }
    }
}

/// `[C]` as `[1, C, 1, ..]` for a rank-`rank` input.
fn per_channel(t: &Tensor, rank: usize) -> Tensor {
    let mut shape = vec![1i64; rank.max(2)];
    shape[1] = -1;
    t.reshape(&shape)
}

/// `centered / sqrt(var + eps) * gamma + beta`, per channel.
fn normalize(x: &Tensor, gamma: &Tensor, beta: &Tensor, centered: &Tensor, var: &Tensor, eps: &Tensor) -> Tensor {
    let rank = x.rank();
    let scale = (var + eps).rsqrt() * per_channel(gamma, rank);
    centered * scale + per_channel(beta, rank)
}

/// Normalizes `x` per channel (axis 1): `(x - mean) / sqrt(var + eps) *
/// gamma + beta`, `gamma` and `beta` of shape `[C]`.
///
/// - `training`: `mean` and `var` are the batch's statistics over every
///   axis but 1 (`var` biased: divided by the count, as every framework
///   normalizes), and the moving averages are assigned
///   `moving = momentum · moving + (1 - momentum) · batch` (TF's and
///   ONNX's form: `momentum` is the weight of the old value, 0.9 or 0.99
///   typically; PyTorch's `momentum=0.1` is `0.9` here). The moving
///   variance takes the **biased** batch variance, as TF/Keras and ONNX's
///   training mode do (PyTorch's `running_var` takes the unbiased one,
///   larger by `n / (n - 1)`). An empty batch (no values per channel)
///   leaves the moving values unchanged (its own output is empty).
/// - inference: `mean` and `var` are the moving values, read.
///
/// Eagerly the assignments happen at once; in a traced function they are
/// state updates of the compiled step, in program order.
///
/// ```
/// use tracejit_nn::batch_norm;
/// use tracejit_trace::{DType, Tensor, Variable};
///
/// let x = Tensor::from_vec(vec![1.0f32, 3.0, 10.0, 30.0], &[2, 2, 1, 1]); // 2 images, 2 channels
/// let (gamma, beta) = (Tensor::ones(&[2], DType::F32), Tensor::zeros(&[2], DType::F32));
/// let mean = Variable::new(Tensor::zeros(&[2], DType::F32)).with_trainable(false);
/// let var = Variable::new(Tensor::ones(&[2], DType::F32)).with_trainable(false);
/// let y = batch_norm(&x, &gamma, &beta, &mean, &var, 0.9, 0.0, true);
/// assert_eq!(y.to_vec::<f32>()?, [-1.0, -1.0, 1.0, 1.0]);
/// // Channel 0's batch mean is 5.5: 0.9 · 0 + 0.1 · 5.5.
/// assert!((mean.value().to_vec::<f32>()?[0] - 0.55).abs() < 1e-6);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// When `x` has rank below 2, or `gamma`, `beta` or the moving variables
/// are not `[C]` of `x`'s dtype (the message names `batch_norm` and the
/// shapes), or `momentum` is outside `[0, 1]` or `eps` is negative or not
/// finite (the message names the value).
#[track_caller]
#[expect(clippy::too_many_arguments, reason = "DESIGN.md's signature, as TF's and PyTorch's")]
pub fn batch_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    moving_mean: &Variable,
    moving_var: &Variable,
    momentum: f64,
    eps: f64,
    training: bool,
) -> Tensor {
    let dims = x.dims();
    assert!(dims.len() >= 2, "batch_norm: x must be [N, C, ...] (rank 2 or more), got rank {}", dims.len());
    assert!(
        (0.0..=1.0).contains(&momentum),
        "batch_norm: momentum must be in [0, 1] (the weight of the old moving value), got {momentum}"
    );
    assert!(eps >= 0.0 && eps.is_finite(), "batch_norm: eps must be finite and >= 0, got {eps}");
    let c = dims[1];
    for (what, d, dtype) in [
        ("gamma", gamma.dims(), gamma.dtype()),
        ("beta", beta.dims(), beta.dtype()),
        ("moving_mean", moving_mean.shape().iter().map(|&d| Some(d)).collect(), moving_mean.dtype()),
        ("moving_var", moving_var.shape().iter().map(|&d| Some(d)).collect(), moving_var.dtype()),
    ] {
        let fits = d.len() == 1 && (c.is_none() || d[0].is_none() || d[0] == c) && dtype == x.dtype();
        assert!(
            fits,
            "batch_norm: {what} must be {}[{}] (one per channel of x {:?}), got {dtype}{d:?}",
            x.dtype(),
            c.map_or("?".to_string(), |c| c.to_string()),
            dims
        );
    }
    let eps_t = Tensor::full(&[], eps, x.dtype());
    if !training {
        let (mean, var) = (moving_mean.read(), moving_var.read());
        return BATCH_NORM.call(&[x, gamma, beta, &mean, &var, &eps_t], 0).remove(0);
    }
    let axes: Vec<i64> = (0..dims.len() as i64).filter(|&a| a != 1).collect();
    let (centered, var) = {
        let mean = x.mean(&axes, true);
        let centered = x - &mean;
        let var = (&centered * &centered).mean(&axes, true);
        let count = batch_count(x, &axes);
        let keep = |old: &Variable, batch: &Tensor| {
            let prev = old.read();
            let new = &prev * momentum + batch.reshape(&[-1]) * (1.0 - momentum);
            // An empty batch has no statistics (its mean is 0/0): the
            // moving values stay as they are.
            match &count {
                Count::Known(0) => {}
                Count::Known(_) => old.assign(&new),
                Count::Unknown(n) => old.assign(&Tensor::select(&n.gt(0.0), &new, &prev)),
            }
        };
        keep(moving_mean, &mean);
        keep(moving_var, &var);
        (centered, var)
    };
    normalize(x, gamma, beta, &centered, &var, &eps_t)
}
