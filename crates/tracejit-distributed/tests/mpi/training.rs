//! Data-parallel training: ranks on their share of the batch with
//! `average_gradients` follow the same loss curve as one process on the
//! whole batch, and end every step with bit-identical variables.
//!
//! Tolerance: the two runs differ only in how the batch mean's sums are
//! ordered (one mean of 64 rows against the mean of per-rank means), a few
//! f32 roundings per step (~1e-7 relative); SGD with momentum on a smooth
//! loss does not amplify them past ~1e-6 in 100 steps, hence 1e-5.

use std::sync::Arc;

use tracejit_distributed::{self as distributed, ReduceOp, World};
use tracejit_optim::{Optimizer, Sgd};
use tracejit_trace::{function, Function, GradientTape, Tensor, Variable};

pub fn checks() -> Vec<crate::Check> {
    vec![("data_parallel_training_matches_one_process_bit_identically", training)]
}

/// Random targets the model cannot fit exactly (212 parameters, 256
/// targets): the loss stays away from zero, where a relative comparison
/// would measure noise.
const BATCH: usize = 64;
const STEPS: usize = 100;

/// A two-layer MLP's variables, the same on every rank (seeded).
fn model() -> Vec<Variable> {
    vec![
        Variable::new(Tensor::randn(&[8, 16], 1) * 0.4),
        Variable::new(Tensor::zeros(&[16], tracejit_trace::DType::F32)),
        Variable::new(Tensor::randn(&[16, 4], 2) * 0.4),
        Variable::new(Tensor::zeros(&[4], tracejit_trace::DType::F32)),
    ]
}

fn loss(vars: &[Variable], x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&vars[0].read()) + vars[1].read()).tanh();
    let p = h.matmul(&vars[2].read()) + vars[3].read();
    let d = &p - y;
    (&d * &d).mean_all()
}

/// A compiled SGD step; `data_parallel` averages the gradients over ranks.
fn step(vars: Vec<Variable>, data_parallel: bool) -> Function<(Tensor, Tensor), Tensor> {
    let opt = Arc::new(Sgd::new(0.1).momentum(0.9));
    function(move |(x, y): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let l = loss(&vars, &x, &y);
        let grads: Vec<Tensor> = tape.gradient(&l, &vars).unwrap().into_iter().map(Option::unwrap).collect();
        let grads = if data_parallel { distributed::average_gradients(&grads) } else { grads };
        opt.apply_gradients(&grads, &vars);
        l
    })
}

fn training(w: World) {
    assert_eq!(BATCH % w.size(), 0, "the batch splits evenly");
    // Three buckets: [b2, w2] (272 bytes), [b1], [w1].
    distributed::set_bucket_bytes(300);
    let x = Tensor::randn(&[BATCH, 8], 5);
    let y = Tensor::randn(&[BATCH, 4], 6);
    let share = BATCH / w.size();
    let (lo, hi) = ((w.rank() * share) as i64, ((w.rank() + 1) * share) as i64);
    let (xr, yr) = (x.slice_axis(0, lo, hi), y.slice_axis(0, lo, hi));

    let (dp_vars, one_vars) = (model(), model());
    let (dp, one) = (step(dp_vars.clone(), true), step(one_vars.clone(), false));
    let (mut first, mut last) = (0.0f32, (0.0f32, 0.0f32));
    // The first difference between ranks; asserted after the loop, so every
    // rank runs every step's collectives whatever it finds.
    let mut differs: Option<String> = None;
    for s in 0..STEPS {
        let mine = dp.call((xr.clone(), yr.clone())).unwrap();
        let global = distributed::all_reduce(&mine, ReduceOp::Mean).to_vec::<f32>().unwrap()[0];
        let whole = one.call((x.clone(), y.clone())).unwrap().to_vec::<f32>().unwrap()[0];
        if s == 0 {
            first = whole;
        }
        last = (global, whole);
        // Bit-identical variables on every rank, after every step.
        for (i, v) in dp_vars.iter().enumerate() {
            let value = v.value();
            let all = distributed::all_gather(&value.reshape(&[1, -1]), 0).to_vec::<f32>().unwrap();
            let n = value.shape().iter().product::<usize>();
            let mine: Vec<u32> = value.to_vec::<f32>().unwrap().iter().map(|f| f.to_bits()).collect();
            for r in 0..w.size() {
                let theirs: Vec<u32> = all[r * n..(r + 1) * n].iter().map(|f| f.to_bits()).collect();
                if mine != theirs && differs.is_none() {
                    differs = Some(format!("step {s}: variable {i} differs between rank {} and rank {r}", w.rank()));
                }
            }
        }
    }
    assert_eq!(differs, None);
    let (global, whole) = last;
    assert!(whole < 0.5 * first, "the model trains: {first} -> {whole}");
    let rel = ((global - whole) / whole).abs();
    assert!(rel <= 1e-5, "after {STEPS} steps: data-parallel {global} vs one process {whole} ({rel:e} relative)");
    if w.is_root() {
        println!("note: loss {first} -> {whole} in {STEPS} steps; data-parallel {global} ({rel:e} relative)");
    }
    let listing = dp.concrete_functions()[0].optimized_graph().to_string();
    assert_eq!(listing.matches("tracejit.distributed.start_bucket").count(), 3, "{listing}");
    assert_eq!(dp.tracing_count(), 1);
    distributed::set_bucket_bytes(distributed::DEFAULT_BUCKET_BYTES);
}
