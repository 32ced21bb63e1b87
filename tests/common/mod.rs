//! Helpers shared by the integration tests that declare `mod common;`.

use tracejit::prelude::*;

/// W8's arguments from `seed`: `xs [steps, batch, k]`, `wx [k, hidden]`,
/// `wh [hidden, hidden]` and `b [hidden]`, with `special` (a NaN or an
/// infinity) written over one element of `xs` when given.
pub fn rnn_args(
    (steps, batch, k, hidden): (usize, usize, usize, usize),
    seed: u64,
    special: Option<f32>,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let mut x = Tensor::randn(&[steps, batch, k], seed).to_vec::<f32>().unwrap();
    if let (Some(v), false) = (special, x.is_empty()) {
        let i = seed as usize % x.len();
        x[i] = v;
    }
    let xs = Tensor::from_vec(x, &[steps, batch, k]);
    let wx = Tensor::randn(&[k, hidden], seed + 1) * 0.5;
    let wh = Tensor::randn(&[hidden, hidden], seed + 2) * 0.5;
    let b = Tensor::randn(&[hidden], seed + 3) * 0.1;
    (xs, wx, wh, b)
}
