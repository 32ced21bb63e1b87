//! `tracejit::distributed` through the facade, in one process (a world of
//! one): the contract's calls compile and run as written, and a training
//! step with `average_gradients` changes nothing against one without.
//! The checks between processes are `crates/tracejit-distributed/tests/mpi`.

use tracejit::distributed::{self, ReduceOp};
use tracejit::optim::{Optimizer, Sgd};
use tracejit::prelude::*;

#[test]
fn the_contract_runs_in_a_world_of_one() -> tracejit::Result<()> {
    let world = distributed::init()?;
    assert_eq!((world.rank(), world.size()), (0, 1));
    let x = Tensor::from_vec(vec![1.5f32, -2.0, f32::INFINITY], &[3]);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        assert_eq!(distributed::all_reduce(&x, op).to_vec::<f32>()?, x.to_vec::<f32>()?);
    }
    assert_eq!(distributed::broadcast(&x, 0).to_vec::<f32>()?, x.to_vec::<f32>()?);
    assert_eq!(distributed::all_gather(&x, 0).shape(), [3]);
    let g = distributed::average_gradients(std::slice::from_ref(&x));
    assert_eq!(g[0].to_vec::<f32>()?, x.to_vec::<f32>()?);
    distributed::set_timeout(std::time::Duration::from_secs(60));
    distributed::set_bucket_bytes(distributed::DEFAULT_BUCKET_BYTES);
    Ok(())
}

#[test]
fn a_step_with_average_gradients_trains_as_one_without() -> tracejit::Result<()> {
    let make = || {
        let w = Variable::new(Tensor::randn(&[4, 3], 7) * 0.5);
        let b = Variable::new(Tensor::zeros(&[3], DType::F32));
        vec![w, b]
    };
    let step = |vars: Vec<Variable>, ddp: bool| {
        let opt = Sgd::new(0.1).momentum(0.9);
        function(move |(x, y): (Tensor, Tensor)| {
            let tape = GradientTape::new();
            let p = x.matmul(&vars[0].read()) + vars[1].read();
            let loss = (&(&p - &y) * &(&p - &y)).mean_all();
            let grads: Vec<Tensor> = tape.gradient(&loss, &vars).unwrap().into_iter().map(Option::unwrap).collect();
            let grads = if ddp { distributed::average_gradients(&grads) } else { grads };
            opt.apply_gradients(&grads, &vars);
            loss
        })
    };
    let (a, b) = (make(), make());
    let (fa, fb) = (step(a.clone(), true), step(b.clone(), false));
    let (x, y) = (Tensor::randn(&[9, 4], 1), Tensor::randn(&[9, 3], 2));
    for _ in 0..5 {
        let (la, lb) = (fa.call((x.clone(), y.clone()))?, fb.call((x.clone(), y.clone()))?);
        assert_eq!(la.to_vec::<f32>()?, lb.to_vec::<f32>()?);
    }
    for (va, vb) in a.iter().zip(&b) {
        assert_eq!(va.value().to_vec::<f32>()?, vb.value().to_vec::<f32>()?);
    }
    // The compiled step holds the bucket's nodes (it is not a no-op graph).
    let listing = fa.concrete_functions()[0].optimized_graph().to_string();
    assert!(listing.contains("tracejit.distributed.start_bucket"), "{listing}");
    Ok(())
}
