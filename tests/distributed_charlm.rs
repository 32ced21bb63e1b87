//! `examples/train_charlm.rs --data-parallel` in short, between processes:
//! run by `scripts/test_distributed.sh` as `mpiexec -n 2 <this binary>`
//! (feature `mpi`; any number of ranks that divides the batch works). The
//! example's `charlm` trainer at a small size trains on 2 ranks, each on
//! its half of every batch, and
//!
//! - follows one process's loss curve on the whole batch, step for step
//!   over 100 steps (two epochs of 50), with the same validation figures;
//! - ends every epoch with bit-identical variables on every rank;
//! - its checkpoint (written by rank 0 after epoch 1) resumed in a
//!   one-process trainer continues as the uninterrupted run, and one
//!   process's checkpoint resumed on 2 ranks continues as one process.
//!
//! Tolerance: the runs differ only in how the batch mean's sums are
//! ordered (the mean of per-rank means against one mean; the gradient
//! averaged after each rank's reduction), a few f32 roundings (~1e-7
//! relative) per step. With dropout drawn identically (each rank draws its
//! rows' part of the whole batch's masks) and AdamW's normalized updates,
//! 100 steps of this small model do not amplify them past ~1e-6
//! (measured: below 1e-6), hence 1e-5 relative.
//!
//! Outside a launcher this fails (a world of one would compare one process
//! with itself). Only rank 0 runs the one-process references; the other
//! ranks wait for it in the next collective.

#[path = "../examples/charlm/mod.rs"]
mod charlm;

use std::path::{Path, PathBuf};
use std::time::Duration;

use charlm::{Config, Corpus, Trainer, DATA};
use tracejit::distributed::{self, ReduceOp, World};
use tracejit::prelude::*;

const TOL: f64 = 1e-5;

fn config() -> Config {
    Config {
        context: 16,
        width: 32,
        heads: 2,
        blocks: 2,
        batch: 8,
        epochs: 2,
        lr: 3e-3,
        warmup: 5,
        beta2: 0.999,
        weight_decay: 0.01,
        dropout: 0.1,
        seed: 7,
        max_steps_per_epoch: Some(50),
        bf16: false,
    }
}

/// The first 200 kB of War and Peace: validation stays quick.
fn corpus() -> Corpus {
    let bytes = std::fs::read(DATA).expect("examples/data/war_and_peace.txt");
    Corpus::from_bytes(&bytes[..200_000], 0.1)
}

/// Trains the remaining epochs; each epoch's step losses (nats) and
/// validation bpc. `after_epoch` runs after each epoch (a checkpoint).
fn train(t: &Trainer, mut after_epoch: impl FnMut(&Trainer, usize)) -> (Vec<f32>, Vec<f32>) {
    let (mut losses, mut valid) = (Vec::new(), Vec::new());
    while t.epochs_done().unwrap() < t.config.epochs {
        let stats = t.run_epoch(|l| losses.push(l)).unwrap();
        valid.push(stats.valid_bpc);
        after_epoch(t, t.epochs_done().unwrap());
    }
    (losses, valid)
}

/// Every rank waits here until all arrived (a file rank 0 wrote before is
/// there for the others to read).
fn barrier() {
    distributed::try_all_reduce(&Tensor::scalar(1.0f32), ReduceOp::Sum).unwrap();
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let rel = ((f64::from(g) - f64::from(w)) / f64::from(w)).abs();
        assert!(rel <= TOL, "{what}: step {i}: {g} vs {w} ({rel:e} relative)");
        worst = worst.max(rel);
    }
    println!("note: {what}: {} values within {worst:e} relative", got.len());
}

/// Every trainable and optimizer variable is the same bits on every rank.
fn assert_same_on_every_rank(t: &Trainer, w: World) {
    for v in tracejit::Module::variables(&t.state) {
        let value = v.value();
        if value.dtype() != DType::F32 {
            continue;
        }
        let n: usize = value.shape().iter().product();
        let all = distributed::try_all_gather(&value.reshape(&[1, -1]), 0).unwrap().to_vec::<f32>().unwrap();
        let mine: Vec<u32> = value.to_vec::<f32>().unwrap().iter().map(|f| f.to_bits()).collect();
        for r in 0..w.size() {
            let theirs: Vec<u32> = all[r * n..(r + 1) * n].iter().map(|f| f.to_bits()).collect();
            assert!(mine == theirs, "`{}` differs between rank {} and rank {r}", v.name(), w.rank());
        }
    }
}

fn checkpoint_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("distributed_charlm");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn main() {
    // A failed assertion on one rank must end the launch at once, not
    // leave the others waiting in a collective until the timeout: report
    // it, then abort (no MPI_Finalize: the launcher stops every rank and
    // exits non-zero).
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let world = distributed::init().unwrap_or_else(|e| panic!("init failed: {e}"));
    assert!(
        world.size() >= 2,
        "run this as `mpiexec -n 2 {}`: a world of one compares one process with itself",
        std::env::args().next().unwrap_or_default()
    );
    // Rank 0's one-process references take a while in a debug build.
    distributed::set_timeout(Duration::from_secs(300));
    let root = world.is_root();
    let dir = checkpoint_dir();
    let (dp_ckpt, one_ckpt) = (dir.join("two_ranks_epoch1.safetensors"), dir.join("one_process_epoch1.safetensors"));

    // A batch the ranks cannot share evenly is refused before anything runs.
    let err = Trainer::data_parallel(Config { batch: 2 * world.size() + 1, ..config() }, corpus(), world)
        .err()
        .expect("an uneven split is refused")
        .to_string();
    assert!(err.contains("does not split evenly"), "{err}");

    // Data-parallel, two epochs, rank 0 checkpointing after the first.
    let dp = Trainer::data_parallel(config(), corpus(), world).unwrap();
    let (dp_losses, dp_valid) = train(&dp, |t, epoch| {
        if epoch == 1 && root {
            t.save(&dp_ckpt).unwrap();
        }
        assert_same_on_every_rank(t, world);
    });
    let cf = &dp.step.concrete_functions()[0];
    assert!(cf.schedule_stats().is_some(), "the data-parallel step ran compiled");
    assert_eq!(dp.step.tracing_count(), 1);
    let graph = cf.optimized_graph().to_string();
    assert!(graph.contains("tracejit.distributed.start_bucket"), "average_gradients in the step:\n{graph}");

    // One process on the whole batch; its epoch-1 checkpoint for the ranks.
    let mut one_losses = Vec::new();
    if root {
        let one = Trainer::new(config(), corpus()).unwrap();
        let (losses, valid) = train(&one, |t, epoch| {
            if epoch == 1 {
                t.save(&one_ckpt).unwrap();
            }
        });
        assert_close("2 ranks against one process: losses", &dp_losses, &losses);
        assert_close("2 ranks against one process: validation bpc", &dp_valid, &valid);
        assert!(losses[99] < 0.8 * losses[0], "the model trains: {} -> {}", losses[0], losses[99]);

        // The ranks' checkpoint resumed in one process.
        let resumed = Trainer::new(config(), corpus()).unwrap();
        resumed.restore(&dp_ckpt).unwrap();
        assert_eq!(resumed.epochs_done().unwrap(), 1);
        let (rest, _) = train(&resumed, |_, _| {});
        assert_close("2-rank checkpoint resumed in one process", &rest, &dp_losses[50..]);
        one_losses = losses;
    }
    barrier();

    // One process's checkpoint resumed on every rank.
    let resumed = Trainer::data_parallel(config(), corpus(), world).unwrap();
    resumed.restore(&one_ckpt).unwrap();
    let (rest, _) = train(&resumed, |t, _| assert_same_on_every_rank(t, world));
    if root {
        assert_close("one-process checkpoint resumed on 2 ranks", &rest, &one_losses[50..]);
    }
    barrier();
    if root {
        println!("distributed_charlm: 1 passed, 0 failed ({} ranks)", world.size());
    }
}
