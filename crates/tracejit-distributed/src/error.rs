//! The crate's error type: every variant names the rank that saw it, so a
//! message read from one process's log says which process it came from.

use std::time::Duration;

/// What went wrong in a collective or at start-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A collective did not complete within the timeout: another rank died,
    /// hangs, or runs a different sequence of collectives.
    #[error(
        "rank {rank} of {size}: {what} got no answer within {timeout:?} (another rank died, stopped answering or \
         runs a different sequence of collectives); the world is unusable from now on"
    )]
    Timeout {
        /// The rank that waited.
        rank: usize,
        /// The world's size.
        size: usize,
        /// The collective and its message (`all_reduce(Sum) of 1024 f32`).
        what: String,
        /// The timeout in force.
        timeout: Duration,
    },
    /// An earlier collective failed (timed out), so its buffers may still be
    /// in use by MPI and no further collective can be matched reliably.
    #[error("rank {rank}: {what} refused: an earlier collective failed ({cause}); restart the job")]
    Broken {
        /// The rank refusing.
        rank: usize,
        /// The collective refused.
        what: String,
        /// What failed before.
        cause: String,
    },
    /// MPI returned an error code.
    #[error("rank {rank}: {what} failed in MPI: {message}")]
    Mpi {
        /// The rank that saw it.
        rank: usize,
        /// The call.
        what: String,
        /// MPI's error string.
        message: String,
    },
    /// The process was not started the way its build expects: launched by
    /// a launcher for another MPI, a build without MPI launched as one of
    /// several processes, ranks that run different programs (or versions of
    /// one), or MPI failing to start. The message says which, starting
    /// with `distributed::init:`.
    #[error("{0}")]
    Launch(String),
    /// Arguments that differ between ranks or that a collective cannot take.
    #[error("rank {rank}: {what}: {reason}")]
    Invalid {
        /// The rank that saw it.
        rank: usize,
        /// The collective.
        what: String,
        /// What is wrong.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// So that `distributed::init()?` works in a function returning
/// `tracejit::Result`; the error stays reachable as itself through
/// `tracejit::Error::downcast_source::<tracejit::distributed::Error>()`.
impl From<Error> for tracejit_trace::Error {
    fn from(e: Error) -> tracejit_trace::Error {
        tracejit_trace::Error::Distributed { source: std::sync::Arc::new(e) }
    }
}
