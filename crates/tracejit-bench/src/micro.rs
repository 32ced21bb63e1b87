//! Micro rows beside the workloads: what a registered backward kernel buys.
//!
//! `layernorm_backward` differentiates `tracejit::nn::layer_norm` (the
//! composite, whose registered backward calls `tracejit::nn::layer_norm_grad`:
//! inside a traced function the selector runs its native kernel, the whole
//! step one kernel) and
//! `layernorm_backward_body` the same layer norm written with primitives
//! (W4's closure), whose gradient is the VJP of the body. Same shapes as W4
//! (`[1024, 1024]`, gamma and beta of `[1024]`), the same upstream cotangent;
//! both return the gradients of x, gamma and beta, and run in every mode,
//! checked against eager (and an f64 eager reference) before timing.

use tracejit::{GradientTape, Tensor};

use crate::verify::Tolerance;
use crate::workloads::{layernorm, Body, Case, WorkloadSpec, STANDARD_MODES};

/// (x, gamma, beta, the upstream cotangent of the layer norm's result).
pub type LayerNormGradArgs = (Tensor, Tensor, Tensor, Tensor);

/// The gradients of `sum(layer_norm(x, gamma, beta) * up)` with respect to
/// x, gamma and beta, the layer norm computed by `forward`.
fn layer_norm_grads(
    (x, gamma, beta, up): LayerNormGradArgs,
    forward: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor,
) -> Vec<Tensor> {
    let tape = GradientTape::new();
    for t in [&x, &gamma, &beta] {
        tape.watch(t);
    }
    let y = (forward(&x, &gamma, &beta) * &up).sum_all();
    let grads = tape.gradient(&y, &[&x, &gamma, &beta]).expect("layer norm is differentiable");
    grads.into_iter().map(|g| g.expect("every input reaches the result")).collect()
}

/// Through the composite: its registered backward, the native
/// `layer_norm_grad` kernel.
pub fn layernorm_backward(args: LayerNormGradArgs) -> Vec<Tensor> {
    layer_norm_grads(args, |x, g, b| tracejit::nn::layer_norm(x, g, b, 1e-5))
}

/// Through primitives: the VJP of the body.
pub fn layernorm_backward_body(args: LayerNormGradArgs) -> Vec<Tensor> {
    layer_norm_grads(args, |x, g, b| layernorm((x.clone(), g.clone(), b.clone())))
}

fn args() -> LayerNormGradArgs {
    let x = Tensor::randn(&[1024, 1024], 4);
    let gamma = Tensor::rand_uniform(&[1024], 0.5, 1.5, 41);
    let beta = Tensor::randn(&[1024], 42) * 0.1;
    let up = Tensor::randn(&[1024, 1024], 43);
    (x, gamma, beta, up)
}

fn build_kernel() -> Body {
    Body::Runnable(Box::new(Case::new("layernorm_backward", args(), layernorm_backward)))
}

fn build_body() -> Body {
    Body::Runnable(Box::new(Case::new("layernorm_backward_body", args(), layernorm_backward_body)))
}

/// The two rows.
pub fn specs() -> Vec<WorkloadSpec> {
    let spec = |name, what, build| WorkloadSpec {
        id: "W4-bwd",
        name,
        what,
        tolerance: Tolerance::TRANSCENDENTAL,
        tolerance_note: "rsqrt approximation and reductions of 1024 terms in another order",
        floor_bytes: None,
        modes: STANDARD_MODES,
        low_precision: Tolerance::BF16,
        build,
    };
    vec![
        spec(
            "layernorm_backward",
            "gradients of sum(layer_norm(x) * up) for x [1024, 1024], gamma, beta: the native layer_norm_grad kernel",
            build_kernel as fn() -> Body,
        ),
        spec(
            "layernorm_backward_body",
            "the same gradients with layer norm written in primitives: the VJP of the body",
            build_body,
        ),
    ]
}
