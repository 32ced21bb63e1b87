//! What the registered backward kernels of `layer_norm` and
//! `softmax_cross_entropy_with_logits` buy: a compiled gradient step timed
//! with them, then with them unregistered (the VJP of the primitive body).
//!
//! `cargo run --release --example backward_kernels`

use std::time::Instant;

use tracejit::prelude::*;

/// Median µs of 30 calls after a warm-up.
fn median_us<A: Nest + Clone, R: Nest>(f: &Function<A, R>, args: A) -> f64 {
    f.call(args.clone()).unwrap();
    let mut t: Vec<f64> = (0..30)
        .map(|_| {
            let s = Instant::now();
            f.call(args.clone()).unwrap();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn layer_norm_grad() -> Function<(Tensor, Tensor, Tensor), Vec<Tensor>> {
    function(|(x, g, b): (Tensor, Tensor, Tensor)| {
        let tape = GradientTape::new();
        for t in [&x, &g, &b] {
            tape.watch(t);
        }
        let y = (tracejit::nn::layer_norm(&x, &g, &b, 1e-5) * &x).sum_all();
        tape.gradient(&y, &[&x, &g, &b]).unwrap().into_iter().map(Option::unwrap).collect()
    })
}

fn xent_grad() -> Function<(Tensor, Tensor), Tensor> {
    function(|(logits, labels): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&logits);
        let onehot = labels.one_hot(1000, DType::F32);
        let y = tracejit::nn::softmax_cross_entropy_with_logits(&logits, &onehot).mean_all();
        tape.gradient(&y, &[&logits]).unwrap().remove(0).unwrap()
    })
}

fn main() {
    let x = Tensor::randn(&[1024, 1024], 1);
    let (g, b) = (Tensor::randn(&[1024], 2), Tensor::randn(&[1024], 3));
    let logits = Tensor::randn(&[256, 1000], 4);
    let labels = Tensor::from_vec((0..256).map(|i| (i * 37 % 1000) as i64).collect(), &[256]);

    let ln_kernel = median_us(&layer_norm_grad(), (x.clone(), g.clone(), b.clone()));
    let xe_kernel = median_us(&xent_grad(), (logits.clone(), labels.clone()));
    tracejit::composite::unregister_gradient("tracejit.nn.layer_norm");
    tracejit::composite::unregister_gradient("tracejit.nn.softmax_cross_entropy_with_logits");
    let ln_body = median_us(&layer_norm_grad(), (x, g, b));
    let xe_body = median_us(&xent_grad(), (logits, labels));

    println!("gradient step (traced, JIT)          backward kernel   body VJP");
    println!("layer_norm [1024, 1024]              {ln_kernel:>10.0} µs {ln_body:>8.0} µs");
    println!("softmax cross-entropy [256, 1000]    {xe_kernel:>10.0} µs {xe_body:>8.0} µs");
}
