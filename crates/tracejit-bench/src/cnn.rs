//! W11 `conv_block` and W12 `cnn_train_step`, on the very inputs
//! `shared/peers/bench_peers.py` builds (`cb_x`, `cb_p`, `cnn_x`, `cnn_p`,
//! `cnn_y`, through the same generator as W9/W10: [`gen`], [`gen_labels`],
//! [`he`]), written as a tracejit user writes a CNN: `nn::conv2d`,
//! `relu`, `nn::max_pool2d`, `nn::softmax_cross_entropy_with_logits`.
//!
//! W12 is a pure function as JAX writes train steps (parameters in,
//! updated ones and the loss out), so the harness can call it again and
//! again on the same inputs and compare modes.

use tracejit::nn::{conv2d, max_pool2d, Conv2dOptions};
use tracejit::Tensor;

use crate::transformer::{gen, gen_labels, he};
use crate::workloads::{Body, Case};

/// W11's arguments: x `[32, 32, 32, 32]`, w `[64, 32, 3, 3]`, b `[64]`.
pub type ConvBlockArgs = (Tensor, Tensor, Tensor);

/// W11's closure: a 3x3 convolution (padding 1) plus bias, relu, and a
/// 2x2 max pool of stride 2.
pub fn conv_block((x, w, b): ConvBlockArgs) -> Tensor {
    let y = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1)).relu();
    max_pool2d(&y, [2, 2], [2, 2], [0, 0])
}

/// W11's inputs, as `make_data`'s `cb_x` and `cb_p`.
pub fn build_conv_block() -> Body {
    let x = gen(90, &[32, 32, 32, 32], -1.0, 1.0);
    let w = gen(91, &[64, 32, 3, 3], -he(288), he(288));
    let b = gen(92, &[64], -0.1, 0.1);
    Body::Runnable(Box::new(Case::new("conv_block", (x, w, b), conv_block)))
}

/// W12's arguments: x `[64, 1, 28, 28]`, i64 labels `[64]`, and the six
/// parameters `w1 [16, 1, 5, 5], b1, w2 [32, 16, 5, 5], b2, wd [1568, 10],
/// bd`.
pub type CnnArgs = (Tensor, Tensor, Vec<Tensor>);

/// The CNN's logits: two blocks of 5x5 convolution (padding 2) + bias,
/// relu and a 2x2 max pool, flattened as `(c, h, w)`, then a dense layer.
pub fn cnn_logits(x: &Tensor, p: &[Tensor]) -> Tensor {
    let block = |h: &Tensor, w: &Tensor, b: &Tensor| {
        let y = conv2d(h, w, Some(b), Conv2dOptions::default().padding(2)).relu();
        max_pool2d(&y, [2, 2], [2, 2], [0, 0])
    };
    let h = block(x, &p[0], &p[1]);
    let h = block(&h, &p[2], &p[3]);
    h.reshape(&[-1, 1568]).matmul(&p[4]) + &p[5]
}

/// W12's closure: the mean softmax cross-entropy on integer labels, its
/// gradients through a tape, and SGD (lr 0.01) on every parameter.
/// Returns the loss, then the updated parameters.
pub fn cnn_train_step((x, labels, params): CnnArgs) -> Vec<Tensor> {
    let tape = tracejit::GradientTape::new();
    for p in &params {
        tape.watch(p);
    }
    let logits = cnn_logits(&x, &params);
    let onehot = labels.one_hot(10, logits.dtype());
    let loss = tracejit::nn::softmax_cross_entropy_with_logits(&logits, &onehot).mean_all();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = tape.gradient(&loss, &refs).expect("every parameter is differentiable");
    let mut out = vec![loss];
    for (p, g) in params.iter().zip(grads) {
        out.push(p - g.expect("every parameter reaches the loss") * 0.01);
    }
    out
}

/// W12's parameters, as `make_data`'s `cnn_p`.
pub fn cnn_params() -> Vec<Tensor> {
    vec![
        gen(94, &[16, 1, 5, 5], -he(25), he(25)),
        gen(95, &[16], -0.1, 0.1),
        gen(96, &[32, 16, 5, 5], -he(400), he(400)),
        gen(97, &[32], -0.1, 0.1),
        gen(98, &[1568, 10], -he(1568), he(1568)),
        gen(99, &[10], -0.1, 0.1),
    ]
}

/// W12's inputs: `cnn_x`, `cnn_y`, `cnn_p`.
pub fn build_cnn_train_step() -> Body {
    let x = gen(93, &[64, 1, 28, 28], 0.0, 1.0);
    let y = gen_labels(100, 64, 10);
    Body::Runnable(Box::new(Case::new("cnn_train_step", (x, y, cnn_params()), cnn_train_step)))
}

/// Multiply-adds of W11 and W12 as `bench_peers.py --macs` counts them:
/// W12's backward computes each product's weight gradient and, but for
/// the first convolution's input, its input gradient.
pub fn macs() -> (u64, u64) {
    let w11 = 32 * 64 * 32 * 32 * 32 * 9;
    let (c1, c2, dense) = (64 * 16 * 28 * 28 * 25, 64 * 32 * 14 * 14 * 16 * 25, 64 * 1568 * 10);
    (w11, (c1 + c2 + dense) + (c1 + 2 * c2 + 2 * dense))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracejit::DType;

    #[test]
    fn the_floors_are_the_issues() {
        // Issue #33: W11 is 604 M multiply-adds, W12 525 M.
        let (w11, w12) = macs();
        let millions = |n: u64| (n + 500_000) / 1_000_000;
        assert_eq!((millions(w11), millions(w12)), (604, 525));
    }

    #[test]
    fn a_small_block_and_step_run_and_the_loss_is_near_log_10() {
        let x = gen(90, &[2, 32, 8, 8], -1.0, 1.0);
        let y = conv_block((x, gen(91, &[64, 32, 3, 3], -he(288), he(288)), gen(92, &[64], -0.1, 0.1)));
        assert_eq!(y.shape(), &[2, 64, 4, 4]);
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v >= 0.0), "relu before the max");
        let x = gen(93, &[4, 1, 28, 28], 0.0, 1.0);
        let out = cnn_train_step((x, gen_labels(100, 4, 10), cnn_params()));
        let loss = out[0].to_scalar::<f32>().unwrap();
        assert!(loss.is_finite() && (loss - 10f32.ln()).abs() < 1.5, "{loss}");
        assert_eq!(out.len(), 7);
        assert_eq!(out[5].dtype(), DType::F32);
    }
}
