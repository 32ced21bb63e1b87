//! Measures the layer-norm backward inside a traced function at W4's size
//! (`[1024, 1024]` f32, gamma and beta of `[1024]`): the native
//! `tracejit.nn.layer_norm_grad` kernel against the closed form it
//! replaces (the composite's body, which the selector inlines and the
//! fusion planner fuses once the kernel is unregistered). The two compiled
//! functions run alternately in one process, so load on a shared machine
//! hits both alike; medians and minimums over the rounds.
//!
//! `taskset -c 0 cargo run --release -p tracejit-nn --example layer_norm_grad [rounds]`

use std::time::Instant;

use tracejit_trace::{function, Function, GradientTape, Tensor};

type Args = (Tensor, Tensor, Tensor, Tensor);
type Grads = (Tensor, Tensor, Tensor);

/// The gradients of `sum(layer_norm(x, gamma, beta) * up)` (W4-bwd's step).
fn grads((x, gamma, beta, up): Args) -> Grads {
    let tape = GradientTape::new();
    for t in [&x, &gamma, &beta] {
        tape.watch(t);
    }
    let y = (tracejit_nn::layer_norm(&x, &gamma, &beta, 1e-5) * &up).sum_all();
    let g = tape.gradient(&y, &[&x, &gamma, &beta]).expect("differentiable");
    let mut it = g.into_iter().map(|g| g.expect("connected"));
    let mut next = || it.next().expect("three gradients");
    (next(), next(), next())
}

fn time(f: &Function<Args, Grads>, args: &Args) -> f64 {
    let t = Instant::now();
    let out = f.call(args.clone()).expect("runs");
    std::hint::black_box(&out);
    t.elapsed().as_secs_f64() * 1e6
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let args = (
        Tensor::randn(&[1024, 1024], 4),
        Tensor::rand_uniform(&[1024], 0.5, 1.5, 41),
        Tensor::randn(&[1024], 42) * 0.1,
        Tensor::randn(&[1024, 1024], 43),
    );
    let kernel = function(grads);
    let k = kernel.call(args.clone()).expect("runs");
    // Functions traced from now on find no kernel: the body is inlined.
    assert!(tracejit_nn::composite::unregister("tracejit.nn.layer_norm_grad"));
    let closed = function(grads);
    let c = closed.call(args.clone()).expect("runs");
    for (a, b) in [(&k.0, &c.0), (&k.1, &c.1), (&k.2, &c.2)] {
        let (a, b) = (a.to_vec::<f32>().expect("f32"), b.to_vec::<f32>().expect("f32"));
        let worst = a.iter().zip(&b).map(|(p, q)| (p - q).abs() / q.abs().max(1.0)).fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "the kernel and the closed form differ by {worst}");
    }
    for (name, f) in [("kernel", &kernel), ("closed form", &closed)] {
        let st = f.concrete_functions()[0].schedule_stats().expect("the JIT runs it");
        println!("{name:>12}: {st}");
    }
    let (mut tk, mut tc) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tk.push(time(&kernel, &args));
        tc.push(time(&closed, &args));
    }
    let ((mk, nk), (mc, nc)) = (stats(&mut tk), stats(&mut tc));
    println!("{:>12}: median {mk:.0} µs, min {nk:.0} µs", "kernel");
    println!("{:>12}: median {mc:.0} µs, min {nc:.0} µs", "closed form");
    println!(
        "closed form / kernel: {:.2}x (medians), {:.2}x (minimums), {rounds} alternating rounds",
        mc / mk,
        nc / nk
    );
}
