//! The spatial ops on tensors: one entry, [`spatial`], that runs a
//! convolution, pooling or one of their gradients eagerly or records it
//! in the current trace (with its gradient rule for tapes). The
//! user-facing layer with options and PyTorch-style arguments is
//! `tracejit::nn` (`conv2d`, `max_pool2d`, `avg_pool2d`), built on this.

use tracejit_ir::Op;
use tracejit_tensor::SpatialOp;

use crate::interpreters::apply;
use crate::Tensor;

/// Applies the spatial op `op` to `inputs` (in the order
/// [`SpatialOp`] lists them): eagerly when every input is eager, otherwise
/// as a node of the innermost trace. A tape differentiates it with the
/// IR's rules (the backward ops of the same family).
///
/// ```
/// use tracejit_trace::{spatial, Conv2dAttrs, SpatialOp, Tensor};
///
/// let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[1, 1, 4, 4]);
/// let w = Tensor::ones(&[1, 1, 2, 2], tracejit_trace::DType::F32);
/// let op = SpatialOp::Conv2d { conv: Conv2dAttrs { stride: [2, 2], ..Conv2dAttrs::DEFAULT }, bias: false, relu: false };
/// let y = spatial(op, &[&x, &w]).remove(0);
/// assert_eq!(y.to_vec::<f32>()?, [10.0, 18.0, 42.0, 50.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// As every op does on operands its type rule rejects (wrong rank or
/// dtype, channels that do not fit the weights, a kernel larger than the
/// padded input): the message names the op, what it expected and what it
/// got, and while tracing the function and the caller's line.
#[track_caller]
pub fn spatial(op: SpatialOp, inputs: &[&Tensor]) -> Vec<Tensor> {
    apply(Op::Spatial(op), inputs).into_vec()
}
