//! W13 `per_example_grads` and W13b `per_example_grad_norms` on the inputs
//! `shared/peers/bench_peers.py` builds for W13 (`pe_x`, `pe_y`, and W5's
//! `mlp_p`, through the same generator: [`gen`], [`gen_labels`]), written
//! as a JAX user writes them: one example's loss, its gradient with
//! respect to the parameters, mapped over the batch with
//! `vmap_axes(.., [None; 6] + [Some(0); 2], ..)`.
//!
//! W13 returns the per-example gradients (`[128, 784, 512]` and so on,
//! 343 MB in all); W13b only each example's gradient norm (`[128]`, the
//! DP-SGD case), which the batching walker computes without building the
//! weights' per-example gradients (`tracejit::ir::batching`'s ghost norms).

use tracejit::{GradientTape, Tensor};

use crate::transformer::{gen, gen_labels};
use crate::workloads::{Body, Case};

/// W13's arguments: x `[128, 784]`, i64 labels `[128]`, then W5's six
/// parameters `w1 [784, 512], b1, w2 [512, 512], b2, w3 [512, 10], b3`.
pub type PerExampleArgs = (Tensor, Tensor, Vec<Tensor>);

/// One example's softmax cross-entropy (`-log_softmax(mlp(x))[y]`, x
/// `[784]`, y a scalar label) and its gradients with respect to the six
/// parameters, which come first in `xs` (then x and y).
pub fn example_grads(xs: Vec<Tensor>) -> Vec<Tensor> {
    let (p, x, y) = (&xs[..6], &xs[6], &xs[7]);
    let tape = GradientTape::new();
    for q in p {
        tape.watch(q);
    }
    let h = (x.reshape(&[1, -1]).matmul(&p[0]) + &p[1]).relu();
    let h = (h.matmul(&p[2]) + &p[3]).relu();
    let logits = h.matmul(&p[4]) + &p[5];
    let picked = tracejit::nn::log_softmax(&logits, -1) * y.one_hot(10, logits.dtype());
    let loss = -picked.sum_all();
    let refs: Vec<&Tensor> = p.iter().collect();
    let grads = tape.gradient(&loss, &refs).expect("every parameter is differentiable");
    grads.into_iter().map(|g| g.expect("every parameter reaches the loss")).collect()
}

/// `[None; 6]` (the parameters, shared) then x and y mapped on axis 0.
const IN_AXES: [Option<usize>; 8] = [None, None, None, None, None, None, Some(0), Some(0)];

fn args(x: Tensor, y: Tensor, params: Vec<Tensor>) -> Vec<Tensor> {
    params.into_iter().chain([x, y]).collect()
}

/// W13's closure: every example's gradients, `[batch, ..]` per parameter.
pub fn per_example_grads((x, y, params): PerExampleArgs) -> Vec<Tensor> {
    tracejit::vmap_axes(example_grads, &IN_AXES, &[0; 6])(args(x, y, params))
}

/// One example's gradient norm: the root of the sum of its parameters'
/// squared gradients.
pub fn example_grad_norm(xs: Vec<Tensor>) -> Vec<Tensor> {
    let squares: Vec<Tensor> = example_grads(xs).iter().map(|g| (g * g).sum_all()).collect();
    let total = squares.into_iter().reduce(|a, b| a + b).expect("six parameters");
    vec![total.sqrt()]
}

/// W13b's closure: every example's gradient norm, `[batch]`.
pub fn per_example_grad_norms((x, y, params): PerExampleArgs) -> Tensor {
    tracejit::vmap_axes(example_grad_norm, &IN_AXES, &[0])(args(x, y, params)).remove(0)
}

/// W5's parameters as `make_data`'s `mlp_p`: U(-a, a) weights with
/// `a = 1/sqrt(fan_in)`, U(-0.1, 0.1) biases.
pub fn mlp_params() -> Vec<Tensor> {
    let (a1, a2) = (1.0 / 784f64.sqrt(), 1.0 / 512f64.sqrt());
    vec![
        gen(8, &[784, 512], -a1, a1),
        gen(9, &[512], -0.1, 0.1),
        gen(10, &[512, 512], -a2, a2),
        gen(11, &[512], -0.1, 0.1),
        gen(12, &[512, 10], -a2, a2),
        gen(13, &[10], -0.1, 0.1),
    ]
}

/// W13's inputs: `pe_x`, `pe_y`, `mlp_p`.
pub fn inputs() -> PerExampleArgs {
    (gen(101, &[128, 784], 0.0, 1.0), gen_labels(102, 128, 10), mlp_params())
}

/// W13's case.
pub fn build_per_example_grads() -> Body {
    Body::Runnable(Box::new(Case::new("per_example_grads", inputs(), per_example_grads)))
}

/// W13b's case.
pub fn build_per_example_grad_norms() -> Body {
    Body::Runnable(Box::new(Case::new("per_example_grad_norms", inputs(), per_example_grad_norms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracejit::DType;

    /// Per-example gradients by hand, as `np_per_example_grads`.
    fn by_hand(x: &Tensor, y: &Tensor, p: &[Tensor]) -> Vec<Tensor> {
        let z1 = x.matmul(&p[0]) + &p[1];
        let h1 = z1.relu();
        let z2 = h1.matmul(&p[2]) + &p[3];
        let h2 = z2.relu();
        let lg = h2.matmul(&p[4]) + &p[5];
        let dlg = tracejit::nn::softmax(&lg, -1) - y.one_hot(10, DType::F32);
        let dz2 = dlg.matmul(&p[4].t()) * z2.gt(0.0).cast(DType::F32);
        let dz1 = dz2.matmul(&p[2].t()) * z1.gt(0.0).cast(DType::F32);
        let outer = |a: &Tensor, b: &Tensor| a.expand_dims(2) * b.expand_dims(1);
        vec![outer(x, &dz1), dz1.clone(), outer(&h1, &dz2), dz2, outer(&h2, &dlg), dlg]
    }

    /// `bench_peers.py`'s `checksum`: `sum_k (k+1) * sum_i a_k[i] * (1 + i % 7)`.
    fn checksum(outs: &[Tensor]) -> f64 {
        let mut total = 0.0;
        for (k, a) in outs.iter().enumerate() {
            let v = a.to_vec::<f32>().unwrap();
            let s: f64 = v.iter().enumerate().map(|(i, &x)| f64::from(x) * (1.0 + (i % 7) as f64)).sum();
            total += (k + 1) as f64 * s;
        }
        total
    }

    #[test]
    fn the_inputs_are_bench_peers_w13() {
        // bench_peers.py's float64 reference checksum of W13 on these inputs
        // (JAX's own is within 3.4e-7 of it).
        let got = checksum(&per_example_grads(inputs()));
        let reference = 5689.8534842579;
        assert!(((got - reference) / reference).abs() < 1e-5, "{got} vs {reference}");
    }

    #[test]
    fn per_example_gradients_and_norms_match_the_hand_written_backward() {
        let (x, y, p) = inputs();
        let (x, y) = (x.slice_axis(0, 0, 5), y.slice_axis(0, 0, 5));
        let got = per_example_grads((x.clone(), y.clone(), p.clone()));
        let want = by_hand(&x, &y, &p);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape());
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            assert!(g.iter().zip(&w).all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-4 * b.abs()));
        }
        let norms = per_example_grad_norms((x, y, p)).to_vec::<f32>().unwrap();
        for (i, n) in norms.iter().enumerate() {
            let sq: f32 = want
                .iter()
                .map(|w| {
                    (w.slice_axis(0, i as i64, i as i64 + 1) * w.slice_axis(0, i as i64, i as i64 + 1))
                        .sum_all()
                        .to_scalar::<f32>()
                        .unwrap()
                })
                .sum();
            assert!((n - sq.sqrt()).abs() <= 1e-4 * sq.sqrt(), "{n} vs {}", sq.sqrt());
        }
    }
}
