//! The world: this process's rank among how many, found once by [`init`]
//! (MPI's `MPI_COMM_WORLD` under a launcher, a world of one otherwise),
//! the checks that the launch is what the build expects, and the state a
//! failed collective leaves behind ([`broken`]).
//!
//! Log lines of this crate go through `rank_log!`,
//! which prefixes `[rank r/n]`, so lines from several processes merged
//! into one stream still say where they came from.

use std::sync::{Mutex, OnceLock};

use crate::{Error, Result};

/// Logs through `log` with this rank as a prefix:
/// `rank_log!(warn, "bucket {i} waited {ms} ms")`.
macro_rules! rank_log {
    ($level:ident, $($arg:tt)*) => {
        log::$level!("{} {}", $crate::world::prefix(), format_args!($($arg)*))
    };
}
#[cfg(feature = "mpi")]
pub(crate) use rank_log;

/// This process's place in the job: `rank` in `0..size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct World {
    rank: usize,
    size: usize,
}

impl World {
    /// This process's rank, `0..size()`; rank 0 is the one that usually
    /// logs and writes checkpoints.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many processes take part (1 outside a launcher).
    pub fn size(&self) -> usize {
        self.size
    }

    /// True on rank 0.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }
}

static WORLD: OnceLock<std::result::Result<World, String>> = OnceLock::new();
static BROKEN: Mutex<Option<String>> = Mutex::new(None);

/// Joins the job: under `mpiexec` (or `srun`) with the `mpi` feature,
/// initializes MPI and returns this rank's place; otherwise a world of one.
/// Calling it again returns the same world (collectives call it
/// themselves when a program did not).
///
/// Errors name what is wrong: a build without the `mpi` feature (or an MPI
/// other than the launcher's) started as one of several processes, or ranks
/// that run different programs.
///
/// ```
/// let world = tracejit_distributed::init()?;
/// assert!(world.rank() < world.size());
/// # Ok::<(), tracejit_distributed::Error>(())
/// ```
pub fn init() -> Result<World> {
    let joined = WORLD.get_or_init(|| {
        join().map_err(|e| match e {
            Error::Launch(m) => m,
            other => format!("distributed::init: {other}"),
        })
    });
    joined.clone().map_err(Error::Launch)
}

/// The world, joining it if no one did: what the collectives use.
pub(crate) fn current() -> Result<World> {
    init()
}

/// How many processes the launcher said it started, and which launcher,
/// from the variables MPICH's Hydra, Open MPI, PMIx and Slurm set.
fn launcher_size() -> Option<(usize, &'static str)> {
    [
        ("PMI_SIZE", "an MPICH-style launcher (PMI)"),
        ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
        ("PMIX_SIZE", "a PMIx launcher"),
        ("SLURM_NTASKS", "Slurm"),
    ]
    .into_iter()
    .find_map(|(var, who)| std::env::var(var).ok()?.trim().parse().ok().map(|n| (n, who)))
}

fn join() -> Result<World> {
    let launched = launcher_size();
    let world = join_transport()?;
    if let Some((n, who)) = launched {
        if n != world.size {
            return Err(Error::Launch(format!(
                "distributed::init: {who} started {n} processes, but this one sees a world of {}: {}",
                world.size,
                if cfg!(feature = "mpi") {
                    "the MPI this program was built with is not the launcher's (build against the MPI whose \
                     mpiexec runs it: MPICH's mpiexec.hydra or Open MPI's mpirun)"
                } else {
                    "this build has no MPI (build with the cargo feature `mpi`)"
                }
            )));
        }
    }
    if world.size > 1 {
        check_same_program(world)?;
        rank_log!(info, "joined a world of {} processes", world.size);
    }
    Ok(world)
}

#[cfg(feature = "mpi")]
fn join_transport() -> Result<World> {
    let m = crate::transport::mpi::init().map_err(|e| Error::Launch(format!("distributed::init: MPI: {e}")))?;
    Ok(World { rank: m.rank, size: m.size })
}

#[cfg(not(feature = "mpi"))]
fn join_transport() -> Result<World> {
    Ok(World { rank: 0, size: 1 })
}

/// What this process runs: its executable's name and tracejit's version.
#[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "only compared between MPI ranks"))]
fn program() -> String {
    let exe = std::env::current_exe().ok();
    let name = exe.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    format!("{} (tracejit {})", name.unwrap_or_else(|| "?".into()), env!("CARGO_PKG_VERSION"))
}

/// Gathers every rank's [`program`] and refuses a mix.
#[cfg(feature = "mpi")]
fn check_same_program(world: World) -> Result<()> {
    use crate::elems::Elems;
    use crate::transport::{self, Collective};

    let ours = program();
    let mut bytes = ours.clone().into_bytes();
    bytes.resize(256, 0);
    let m = crate::transport::mpi::init().map_err(|e| Error::Launch(format!("distributed::init: MPI: {e}")))?;
    let request = m.start(Collective::AllGather, Elems::U8(bytes)).map_err(|message| Error::Mpi {
        rank: world.rank,
        what: "init's program check".into(),
        message,
    })?;
    let all = transport::wait_request(world, "init's program check (an all-gather)".into(), request)?;
    let Elems::U8(all) = all else { unreachable!("an all-gather of bytes returns bytes") };
    let others: Vec<String> = all
        .chunks(256)
        .enumerate()
        .map(|(r, c)| (r, String::from_utf8_lossy(c.split(|&b| b == 0).next().unwrap_or(&[])).into_owned()))
        .filter(|(_, p)| *p != ours)
        .map(|(r, p)| format!("rank {r} runs `{p}`"))
        .collect();
    if others.is_empty() {
        Ok(())
    } else {
        Err(Error::Launch(format!(
            "distributed::init: rank {} of {} runs `{ours}`, but {}: every rank must run the same program",
            world.rank,
            world.size,
            others.join(", ")
        )))
    }
}

#[cfg(not(feature = "mpi"))]
fn check_same_program(_world: World) -> Result<()> {
    Ok(())
}

/// Why collectives are refused, once one failed.
pub(crate) fn broken() -> Option<String> {
    BROKEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Refuses every later collective (the first cause is kept).
#[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "only a remote collective times out"))]
pub(crate) fn mark_broken(cause: &str) {
    BROKEN.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| cause.to_string());
}

/// `[rank r/n]`, or `[rank ?]` before the world is known.
pub(crate) fn prefix() -> String {
    match WORLD.get() {
        Some(Ok(w)) => format!("[rank {}/{}]", w.rank, w.size),
        _ => "[rank ?]".into(),
    }
}
