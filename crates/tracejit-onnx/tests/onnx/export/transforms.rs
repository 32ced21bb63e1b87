//! Functions built with the transforms export like any other: the
//! gradient of a checkpointed block (whose recomputation hangs off
//! `checkpoint`'s barrier, exported as an Identity) and a `vmap`ped
//! function (ordinary batched ops), run in tract against tracejit.

use crate::common;

use tracejit_trace::{checkpoint, grad, vmap, DType, Tensor, TensorSpec};

fn spec(t: &Tensor) -> TensorSpec {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    TensorSpec::new(t.dtype(), &dims)
}

#[test]
fn the_gradient_of_a_checkpointed_block_exports_with_its_barrier() {
    let w = Tensor::randn(&[4, 4], 1);
    let block = checkpoint(move |x: &Tensor| x.matmul(&w).tanh().exp());
    let x = Tensor::randn(&[3, 4], 2);
    let cf = tracejit_trace::function(move |x: Tensor| {
        let block = block.clone();
        grad(move |x: &Tensor| block(x).sum_all())(&x)
    })
    .name("remat_grad")
    .get_concrete_function(vec![spec(&x)])
    .unwrap();
    assert!(cf.graph().to_string().contains(tracejit_trace::REMAT_BARRIER), "{}", cf.graph());
    common::check("remat_grad", &cf, &[x], 1e-5);
}

#[test]
fn a_mapped_function_exports_as_batched_ops() {
    let w = Tensor::randn(&[4, 2], 3);
    let x = Tensor::randn(&[5, 4], 4);
    let cf = tracejit_trace::function(move |x: Tensor| {
        let w = w.clone();
        vmap(move |v: &Tensor| v.reshape(&[1, 4]).matmul(&w).relu().squeeze(&[0]))(&x)
    })
    .name("vmapped")
    .get_concrete_function(vec![spec(&x)])
    .unwrap();
    common::check("vmapped", &cf, &[x.cast(DType::F32)], 1e-5);
}
