//! Data-parallel figures (cargo feature `mpi`): W10's training step split
//! over ranks against one process, and the all-reduce's latency and
//! bandwidth by message size.
//!
//! ```sh
//! cargo build -p tracejit-bench --features mpi --bin ddp
//! TRACEJIT_NUM_THREADS=2 target/debug/ddp step              # one process, two threads
//! TRACEJIT_NUM_THREADS=1 mpiexec -n 2 target/debug/ddp step # two ranks, one thread each
//! TRACEJIT_NUM_THREADS=1 mpiexec -n 2 target/debug/ddp collectives
//! UCX_TLS=tcp,self TRACEJIT_NUM_THREADS=1 mpiexec -n 2 target/debug/ddp collectives   # TCP on loopback (MPICH over UCX)
//! ```
//!
//! `step` prints each step's loss (the mean over ranks) and the
//! parameters' sum of squares, so runs on different numbers of ranks can
//! be compared, then steps per second over the timed steps (the slowest
//! rank's time). `--bucket-kib N` sets `average_gradients`' bucket size
//! (25 MiB by default: W10's 6.65 MB of gradients are one bucket);
//! `--profile` then prints where each bucket starts and waits in one
//! step's schedule and what its wait cost (the overlap with the backward).

use std::time::Instant;

use tracejit::distributed::{self, ReduceOp};
use tracejit::{function, Tensor};
use tracejit_bench::transformer::{gpt_args, gpt_train_step_data_parallel, B};

fn main() -> anyhow::Result<()> {
    env_logger::init();
    let world = distributed::init()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    match args.first().map(String::as_str) {
        Some("step") => {
            if let Some(kib) = args.iter().position(|a| a == "--bucket-kib").map(|_| value("--bucket-kib", 25 << 10)) {
                distributed::set_bucket_bytes(kib << 10);
            }
            let profile = args.iter().any(|a| a == "--profile");
            step(world, value("--warmup", 2), value("--steps", 10), profile)
        }
        Some("collectives") => collectives(world, value("--max-mib", 64)),
        _ => anyhow::bail!(
            "usage: ddp step [--warmup N] [--steps N] [--bucket-kib N] [--profile] | ddp collectives [--max-mib N]"
        ),
    }
}

/// The slowest rank's value of `x`.
fn slowest(x: f64) -> f64 {
    distributed::all_reduce(&Tensor::from_vec(vec![x], &[1]), ReduceOp::Max).to_vec::<f64>().unwrap()[0]
}

fn step(world: distributed::World, warmup: usize, steps: usize, profile: bool) -> anyhow::Result<()> {
    anyhow::ensure!(B.is_multiple_of(world.size()), "W10's batch of {B} does not split over {} ranks", world.size());
    let (tok, params, m, v, count) = gpt_args();
    let share = (B / world.size()) as i64;
    let r = world.rank() as i64;
    let tok = tok.slice_axis(0, r * share, (r + 1) * share);
    let f = function(gpt_train_step_data_parallel);
    let n = params.len();
    let mut state = (params, m, v, count);
    let mut losses = Vec::new();
    let mut timed = 0.0;
    for s in 0..warmup + steps {
        if s == warmup {
            slowest(0.0); // every rank starts the timed steps together
        }
        let started = Instant::now();
        let mut out = f.call((tok.clone(), state.0, state.1, state.2, state.3))?;
        let loss = out.pop().expect("the loss");
        let count = out.pop().expect("the step count");
        let v = out.split_off(2 * n);
        let m = out.split_off(n);
        if s >= warmup {
            timed += started.elapsed().as_secs_f64();
        }
        losses.push(loss);
        state = (out, m, v, count);
    }
    let timed = slowest(timed);
    if profile {
        let mut flat = vec![tok.clone()];
        flat.extend(state.0.iter().chain(&state.1).chain(&state.2).cloned());
        flat.push(state.3.clone());
        print_buckets(&world, &f.concrete_functions()[0], &flat)?;
    }
    let sum_sq: f64 =
        state.0.iter().map(|p| p.cast(tracejit::DType::F64).pow(2.0).sum_all().to_vec::<f64>().unwrap()[0]).sum();
    for (s, l) in losses.iter().enumerate() {
        let global = distributed::all_reduce(l, ReduceOp::Mean).to_vec::<f32>()?[0];
        if world.is_root() {
            println!("step {:>3}: loss {global:.9}", s + 1);
        }
    }
    if world.is_root() {
        println!("parameters' sum of squares after {} steps: {sum_sq:.12}", warmup + steps);
        println!(
            "{} rank(s), {} thread(s) each: {:.3} steps/s over {steps} steps ({:.1} ms a step)",
            world.size(),
            std::env::var("TRACEJIT_NUM_THREADS").unwrap_or_else(|_| "default".into()),
            steps as f64 / timed,
            1e3 * timed / steps as f64
        );
    }
    Ok(())
}

/// One profiled call of the step (every rank runs it: it holds
/// collectives); rank 0 prints each bucket's start and wait: their places
/// among the schedule's steps, the steps computed between them and the
/// wait's time (what the overlap left).
fn print_buckets(world: &distributed::World, cf: &tracejit::ConcreteFunction, flat: &[Tensor]) -> anyhow::Result<()> {
    let p = cf.profile(flat, 1)?.ok_or_else(|| anyhow::anyhow!("the step does not run in the JIT"))?;
    if !world.is_root() {
        return Ok(());
    }
    let top: Vec<_> = p.steps.iter().filter(|s| s.depth == 0).collect();
    println!("one step: {} steps, {:.1} ms", top.len(), p.per_run().as_secs_f64() * 1e3);
    let starts: Vec<_> = top.iter().filter(|s| s.what.contains("start_bucket")).collect();
    let waits: Vec<_> = top.iter().filter(|s| s.what.contains("wait_bucket")).collect();
    for (b, (s, w)) in starts.iter().zip(&waits).enumerate() {
        let between: f64 =
            top.iter().filter(|x| x.index > s.index && x.index < w.index).map(|x| x.total.as_secs_f64()).sum();
        println!(
            "bucket {b}: starts at step {} ({:.2} ms), waits at step {} ({:.2} ms) after {:.1} ms of other steps",
            s.index,
            s.total.as_secs_f64() * 1e3,
            w.index,
            w.total.as_secs_f64() * 1e3,
            between * 1e3
        );
    }
    Ok(())
}

fn collectives(world: distributed::World, max_mib: usize) -> anyhow::Result<()> {
    let n = world.size() as f64;
    if world.is_root() {
        println!("all_reduce(Sum) of f32 over {} ranks (eager: includes packing and unpacking)", world.size());
        println!("{:>10} {:>8} {:>12} {:>14} {:>14}", "bytes", "iters", "latency us", "algbw GB/s", "busbw GB/s");
    }
    let mut bytes = 1024usize;
    while bytes <= max_mib << 20 {
        let x = Tensor::from_vec(vec![1.0f32; bytes / 4], &[bytes / 4]);
        for _ in 0..2 {
            distributed::try_all_reduce(&x, ReduceOp::Sum)?;
        }
        // About 0.2 s of collectives per size (at least 3).
        let probe = Instant::now();
        distributed::try_all_reduce(&x, ReduceOp::Sum)?;
        let one = slowest(probe.elapsed().as_secs_f64());
        let iters = ((0.2 / one) as usize).clamp(3, 2000);
        slowest(0.0);
        let started = Instant::now();
        for _ in 0..iters {
            distributed::try_all_reduce(&x, ReduceOp::Sum)?;
        }
        let t = slowest(started.elapsed().as_secs_f64()) / iters as f64;
        if world.is_root() {
            let alg = bytes as f64 / t / 1e9;
            println!("{bytes:>10} {iters:>8} {:>12.1} {alg:>14.3} {:>14.3}", t * 1e6, alg * 2.0 * (n - 1.0) / n);
        }
        bytes *= 4;
    }
    Ok(())
}
