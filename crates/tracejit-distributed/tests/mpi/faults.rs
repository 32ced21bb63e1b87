//! A rank that stops answering, or dies: the others' collectives end with
//! an error naming their rank, within the timeout (plus polling slack),
//! never a hang. The world is unusable afterwards, so these checks run
//! last; the dead rank's check runs in a launch of its own (`--dead-rank`,
//! under `mpiexec -disable-auto-cleanup`, so that the launcher leaves the
//! survivors running when a rank dies, as it does by default on a cluster
//! with Slurm's `--no-kill`).

use std::time::{Duration, Instant};

use tracejit_distributed::{self as distributed, Error, ReduceOp, World};
use tracejit_trace::{function, Tensor};

pub fn checks() -> Vec<crate::Check> {
    vec![("a_silent_rank_is_a_timeout_not_a_hang", silent_rank), ("a_dead_rank_is_an_error_not_a_hang", dead_rank)]
}

const TIMEOUT: Duration = Duration::from_millis(1500);

fn silent_rank(w: World) {
    distributed::set_timeout(TIMEOUT);
    if w.rank() == w.size() - 1 {
        // The last rank stops answering for longer than the others wait,
        // then leaves without joining their collectives.
        std::thread::sleep(TIMEOUT * 3);
        return;
    }
    // Compiled: `call` returns the error.
    let f = function(|x: Tensor| distributed::all_reduce(&x, ReduceOp::Sum) + 1.0);
    let started = Instant::now();
    let e = f.call(Tensor::from_vec(vec![1.0f32; 4], &[4])).unwrap_err().to_string();
    let waited = started.elapsed();
    assert!(e.contains(&format!("rank {}", w.rank())) && e.contains("no answer"), "{e}");
    assert!(waited >= TIMEOUT && waited < TIMEOUT * 2, "waited {waited:?} for a timeout of {TIMEOUT:?}");
    // Every later collective is refused at once, naming the earlier failure.
    let started = Instant::now();
    match distributed::try_all_reduce(&Tensor::scalar(1.0f32), ReduceOp::Sum) {
        Err(Error::Broken { rank, cause, .. }) => assert!(rank == w.rank() && cause.contains("no answer"), "{cause}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(started.elapsed() < TIMEOUT, "a refusal does not wait");
}

fn dead_rank(w: World) {
    distributed::set_timeout(TIMEOUT);
    let f = function(|x: Tensor| distributed::all_reduce(&x, ReduceOp::Sum) + 1.0);
    let x = Tensor::from_vec(vec![1.0f32; 4], &[4]);
    // A first step succeeds: the rank dies mid-run, not at the start.
    assert_eq!(f.call(x.clone()).unwrap().to_vec::<f32>().unwrap(), vec![w.size() as f32 + 1.0; 4]);
    if w.rank() == w.size() - 1 {
        // While the others wait in the next collective, the last rank
        // crashes: no MPI_Finalize, no message, its process gone.
        std::thread::sleep(TIMEOUT / 4);
        // SAFETY: ends the process at once, as a crash would.
        unsafe { _exit(3) };
    }
    let started = Instant::now();
    let e = f.call(x).unwrap_err().to_string();
    let waited = started.elapsed();
    assert!(e.contains(&format!("rank {}", w.rank())), "{e}");
    assert!(waited < TIMEOUT * 2, "waited {waited:?} for a timeout of {TIMEOUT:?}: {e}");
    if w.is_root() {
        println!("note: after the last rank died, rank 0 got within {waited:?}: {e}");
    }
    // Later collectives are refused at once.
    assert!(distributed::try_all_reduce(&Tensor::scalar(1.0f32), ReduceOp::Sum).is_err());
}

extern "C" {
    /// The C library's `_exit`: no atexit handlers (so no MPI_Finalize),
    /// no unwinding.
    fn _exit(code: std::ffi::c_int) -> !;
}
