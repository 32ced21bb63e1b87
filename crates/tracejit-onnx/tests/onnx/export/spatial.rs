//! Convolutional layers exported and run in tract against tracejit's own
//! results: `Conv` (bias, strides, dilations, asymmetric and "same" pads,
//! groups, depthwise; a fused relu as `Relu`), `MaxPool` and
//! `AveragePool` (`count_include_pad = 0`, padded windows), batch norm in
//! inference, and a small CNN with an unknown batch.

use crate::common;

use tracejit_nn::{avg_pool2d, batch_norm, conv2d, max_pool2d, Conv2dOptions};
use tracejit_trace::{function, Tensor, TensorSpec, Variable};

fn spec(t: &Tensor, unknown_batch: bool) -> TensorSpec {
    let mut dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    if unknown_batch {
        dims[0] = -1;
    }
    TensorSpec::new(t.dtype(), &dims)
}

/// Exports `f` for `x` (batch unknown when asked) and compares.
fn check(name: &str, f: impl Fn(Tensor) -> Tensor + Send + Sync + 'static, x: Tensor, unknown_batch: bool) {
    let cf = function(f).name(name).get_concrete_function(spec(&x, unknown_batch)).unwrap();
    common::check(name, &cf, &[x], 1e-5);
}

fn data(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, seed)
}

#[test]
fn conv_geometries() {
    let cases: [(&str, usize, usize, usize, Conv2dOptions); 6] = [
        ("conv_plain", 3, 4, 1, Conv2dOptions::default()),
        ("conv_strided_asymmetric", 3, 4, 1, Conv2dOptions::default().stride([2, 1]).pads([1, 0, 2, 1])),
        ("conv_dilated", 2, 3, 1, Conv2dOptions::default().dilation(2).padding(2)),
        ("conv_grouped", 4, 6, 2, Conv2dOptions::default().groups(2).padding(1)),
        ("conv_depthwise", 3, 3, 3, Conv2dOptions::default().groups(3).padding(1)),
        ("conv_same", 3, 2, 1, Conv2dOptions::default().padding_same().stride(2)),
    ];
    for (i, (name, cin, cout, groups, opts)) in cases.into_iter().enumerate() {
        let w = data(&[cout, cin / groups, 3, 2], 10 + i as u64);
        let b = data(&[cout], 20 + i as u64);
        let x = data(&[2, cin, 7, 6], 30 + i as u64);
        check(name, move |x| conv2d(&x, &w, Some(&b), opts), x, false);
    }
    // Without a bias, and a relu the compiled graph fuses (exported as
    // Conv then Relu), with an unknown batch.
    let w = data(&[4, 3, 3, 3], 40);
    check("conv_no_bias", move |x| conv2d(&x, &w, None, Conv2dOptions::default()), data(&[1, 3, 5, 5], 41), false);
    let (w, b) = (data(&[4, 3, 3, 3], 42), data(&[4], 43));
    check(
        "conv_relu",
        move |x| conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1)).relu(),
        data(&[3, 3, 5, 5], 44),
        true,
    );
}

#[test]
fn pools() {
    let x = data(&[2, 3, 7, 6], 50);
    check("max_pool_2x2", |x| max_pool2d(&x, [2, 2], [2, 2], [0, 0]), x.clone(), true);
    check("max_pool_padded", |x| max_pool2d(&x, [3, 2], [2, 1], [1, 1]), x.clone(), false);
    check("avg_pool_padded", |x| avg_pool2d(&x, [3, 3], [1, 1], [1, 1]), x.clone(), false);
    check("avg_pool_strided", |x| avg_pool2d(&x, [2, 3], [2, 2], [1, 0]), x, true);
}

#[test]
fn batch_norm_inference_and_a_small_cnn() {
    let mean = Variable::new(data(&[4], 60) * 0.1).with_trainable(false);
    let var = Variable::new(data(&[4], 61) * 0.2 + 1.0).with_trainable(false);
    let (gamma, beta) = (data(&[4], 62) + 1.0, data(&[4], 63));
    let (w, b) = (data(&[4, 1, 3, 3], 64), data(&[4], 65));
    let dense = data(&[36, 10], 66);
    check(
        "small_cnn",
        move |x| {
            let h = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1));
            let h = batch_norm(&h, &gamma, &beta, &mean, &var, 0.9, 1e-5, false).relu();
            let h = max_pool2d(&h, [2, 2], [2, 2], [0, 0]);
            h.reshape(&[-1, 36]).matmul(&dense)
        },
        Tensor::rand_uniform(&[5, 1, 6, 6], 0.0, 1.0, 67),
        true,
    );
}
