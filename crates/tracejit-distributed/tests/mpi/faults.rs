//! A rank that stops answering: the others' collectives end with a timeout
//! error naming their rank, within the timeout (plus polling slack), never
//! a hang. The world is unusable afterwards, so these checks run last.

use std::time::{Duration, Instant};

use tracejit_distributed::{self as distributed, Error, ReduceOp, World};
use tracejit_trace::{function, Tensor};

pub fn checks() -> Vec<crate::Check> {
    vec![("a_silent_rank_is_a_timeout_not_a_hang", silent_rank)]
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
