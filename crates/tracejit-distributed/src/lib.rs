//! Data-parallel training for tracejit over MPI (`tracejit::distributed`).
//!
//! Several processes (ranks), started by `mpiexec -n N` or Slurm's `srun`,
//! each run the same program on their share of the data; collectives
//! combine their tensors:
//!
//! - [`all_reduce`] (`Sum`, `Mean`, `Max`, `Min`), [`broadcast`] and
//!   [`all_gather`] work eagerly and inside compiled functions, where each
//!   is an effectful node that no pass folds, merges, duplicates or drops,
//!   ordered with the other effects; `all_reduce` and `all_gather` have
//!   gradients (so do broadcasts).
//! - [`average_gradients`] is the DDP step: inside a compiled training
//!   step the gradients travel in buckets ([`set_bucket_bytes`], 25 MiB by
//!   default) of non-blocking all-reduces, and every rank ends each step
//!   with the same gradients bit for bit, hence the same variables.
//! - A collective that gets no answer within [`set_timeout`] (60 s by
//!   default) fails with an error naming the rank, instead of hanging as
//!   MPI's blocking calls do when a peer died.
//!
//! The transport is MPI through the `mpi` crate (rsmpi) behind this
//! crate's cargo feature `mpi` (the facade's feature of the same name).
//! Without it, or outside a launcher, [`init`] gives a world of one where
//! every collective returns its input, so a program written for N ranks
//! runs unchanged in one process.
//!
//! ```
//! use tracejit_distributed::{self as distributed, ReduceOp};
//! use tracejit_trace::{function, Tensor};
//!
//! let world = distributed::init()?;
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
//! let step = function(|x: Tensor| distributed::all_reduce(&(&x * 2.0), ReduceOp::Mean));
//! let y = step.call(x)?;   // the mean over ranks of every rank's 2x
//! if world.size() == 1 {
//!     assert_eq!(y.to_vec::<f32>()?, [2.0, 4.0, 6.0]);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod collectives;
mod ddp;
mod elems;
mod error;
mod transport;
mod world;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub use collectives::{all_gather, all_reduce, broadcast, try_all_gather, try_all_reduce, try_broadcast, NODE_PREFIX};
pub use ddp::{average_gradients, try_average_gradients, FIRST_BUCKET_BYTES};
pub use error::{Error, Result};
pub use world::{init, World};

/// How [`all_reduce`] combines the ranks' values, elementwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the world's size (float dtypes only).
    Mean,
    /// The largest value (NaN follows MPI's `MPI_MAX`: which value wins
    /// against a NaN is the library's choice).
    Max,
    /// The smallest value (as `Max` for NaN).
    Min,
}

/// The default timeout of a collective.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The default bucket size of [`average_gradients`]: 25 MiB, PyTorch
/// DDP's `bucket_cap_mb`.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

static TIMEOUT_MICROS: AtomicU64 = AtomicU64::new(DEFAULT_TIMEOUT.as_micros() as u64);
static BUCKET_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_BUCKET_BYTES);

/// How long a collective may wait for the other ranks before it fails
/// with [`Error::Timeout`] (default [`DEFAULT_TIMEOUT`]). Applies to
/// collectives waited for after the call, in this process.
pub fn set_timeout(timeout: Duration) {
    TIMEOUT_MICROS.store(timeout.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
}

/// The timeout in force (see [`set_timeout`]).
pub fn timeout() -> Duration {
    Duration::from_micros(TIMEOUT_MICROS.load(Ordering::Relaxed))
}

/// The most bytes one bucket of [`average_gradients`] holds (default
/// [`DEFAULT_BUCKET_BYTES`]; at least 1; the first bucket at most
/// [`FIRST_BUCKET_BYTES`] too). Read when a step is traced, so
/// set it before the first call of a compiled step; every rank must use
/// the same value.
pub fn set_bucket_bytes(bytes: usize) {
    BUCKET_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// The bucket size in force (see [`set_bucket_bytes`]).
pub fn bucket_bytes() -> usize {
    BUCKET_BYTES.load(Ordering::Relaxed)
}
