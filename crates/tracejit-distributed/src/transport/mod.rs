//! Moving buffers between ranks: [`start`] begins a collective on packed
//! elements and [`Pending::wait`] finishes it against a deadline. A world
//! of one (no `mpi` feature, or one process) completes every collective at
//! once: the sum, mean, maximum or minimum of one value, a broadcast from
//! itself and a gather of one piece are that value.

#[cfg(feature = "mpi")]
pub(crate) mod mpi;

use std::time::{Duration, Instant};

use crate::elems::Elems;
use crate::world::{self, World};
use crate::{Error, ReduceOp, Result};

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    /// Every rank gets the reduction of every rank's buffer.
    AllReduce(ReduceOp),
    /// Every rank gets `root`'s buffer.
    Broadcast { root: usize },
    /// Every rank gets every rank's buffer, in rank order.
    AllGather,
}

/// A collective under way.
#[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "a world of one never waits nor fails"))]
pub(crate) struct Pending {
    world: World,
    what: String,
    state: State,
}

enum State {
    Done(Elems),
    #[cfg(feature = "mpi")]
    Mpi(mpi::Request),
}

/// Starts `c` on `send`; `what` names it in errors and logs.
pub(crate) fn start(c: Collective, send: Elems, what: String) -> Result<Pending> {
    let w = world::current()?;
    if let Some(cause) = world::broken() {
        return Err(Error::Broken { rank: w.rank(), what, cause });
    }
    if w.size() == 1 {
        return Ok(Pending { world: w, what, state: State::Done(send) });
    }
    start_remote(w, c, send, what)
}

#[cfg(feature = "mpi")]
fn start_remote(w: World, c: Collective, send: Elems, what: String) -> Result<Pending> {
    let m = mpi::init().map_err(|message| Error::Mpi { rank: w.rank(), what: what.clone(), message })?;
    match m.start(c, send) {
        Ok(r) => Ok(Pending { world: w, what, state: State::Mpi(r) }),
        Err(message) => Err(Error::Mpi { rank: w.rank(), what, message }),
    }
}

#[cfg(not(feature = "mpi"))]
fn start_remote(w: World, _c: Collective, _send: Elems, what: String) -> Result<Pending> {
    unreachable!("rank {}: {what}: a world of {} without MPI", w.rank(), w.size())
}

/// Waits for a request started outside [`start`] (by `init`, before the
/// world is known to the rest of the crate).
#[cfg(feature = "mpi")]
pub(crate) fn wait_request(world: World, what: String, request: mpi::Request) -> Result<Elems> {
    Pending { world, what, state: State::Mpi(request) }.wait()
}

impl Pending {
    /// Lets the collective advance without waiting (one `MPI_Test`): MPI
    /// moves a message only inside its calls. An error is kept for
    /// [`Pending::wait`] to report.
    pub(crate) fn progress(&mut self) {
        match &mut self.state {
            State::Done(_) => {}
            #[cfg(feature = "mpi")]
            State::Mpi(r) => {
                let _ = r.test();
            }
        }
    }

    /// Waits for the collective until the configured timeout has passed
    /// since this call; a timeout abandons it (its buffers are leaked, as
    /// MPI may still write them) and marks the world broken.
    pub(crate) fn wait(self) -> Result<Elems> {
        match self.state {
            State::Done(e) => Ok(e),
            #[cfg(feature = "mpi")]
            State::Mpi(r) => wait_mpi(self.world, self.what, r),
        }
    }
}

/// Polls `r` until it completes or the timeout passes.
#[cfg(feature = "mpi")]
fn wait_mpi(w: World, what: String, mut r: mpi::Request) -> Result<Elems> {
    let timeout = crate::timeout();
    let started = Instant::now();
    let deadline = started + timeout;
    let mut polls = 0u32;
    loop {
        match r.test() {
            Ok(true) => return Ok(r.into_result()),
            Ok(false) => {}
            Err(message) => return Err(Error::Mpi { rank: w.rank(), what, message }),
        }
        if Instant::now() >= deadline {
            // MPI may still write the buffers: they are leaked, not freed.
            std::mem::forget(r);
            let e = Error::Timeout { rank: w.rank(), size: w.size(), what, timeout };
            world::mark_broken(&e.to_string());
            crate::world::rank_log!(error, "{e}");
            return Err(e);
        }
        backoff(&mut polls, started);
    }
}

/// Between two polls: spin briefly (a short collective completes in
/// microseconds), then yield for a while (MPI moves a large message only
/// while a rank polls, so sleeping early would throttle it; yielding still
/// lets a peer that shares the core run), then sleep, so a rank waiting for
/// a slow or silent peer does not take a core from the others.
#[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "only remote collectives are polled"))]
fn backoff(polls: &mut u32, started: Instant) {
    *polls += 1;
    if *polls <= 64 {
        std::hint::spin_loop();
    } else if started.elapsed() < Duration::from_millis(50) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}
