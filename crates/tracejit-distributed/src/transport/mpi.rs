//! The MPI transport (feature `mpi`): rsmpi initializes MPI, and the
//! collectives are MPI's immediate ones (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Iallgather`) through rsmpi's raw bindings, because their buffers
//! must outlive the call that starts them (a DDP bucket starts in one graph
//! node and is waited for in a later one) and because a wait must give up
//! at a deadline: MPI's blocking calls wait forever for a dead peer.
//!
//! Every call goes through one process-wide lock: MPI is initialized with
//! `MPI_THREAD_MULTIPLE` when the library offers it, but the lock also
//! keeps a library that offers less correct. A wait releases the lock
//! between its `MPI_Test`s, so other threads' collectives progress.
//!
//! The library's errors return codes (`MPI_ERRORS_RETURN` on our own
//! duplicate of `MPI_COMM_WORLD`) instead of aborting the process.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mpi::ffi;
use mpi::traits::AsRaw;

use crate::elems::{Elems, Kind};
use crate::transport::Collective;
use crate::ReduceOp;

/// MPI's state: our communicator, rank and size.
pub(crate) struct Mpi {
    comm: ffi::MPI_Comm,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

// SAFETY: an `MPI_Comm` is a handle (an int in MPICH, a pointer to a
// library object in Open MPI) that any thread may pass to MPI; every use
// goes through `LOCK`.
unsafe impl Send for Mpi {}
// SAFETY: as for `Send`: shared use is serialized by `LOCK`.
unsafe impl Sync for Mpi {}

/// Serializes every MPI call of this crate.
static LOCK: Mutex<()> = Mutex::new(());

/// rsmpi's universe, finalized at exit (see [`finalize_at_exit`]).
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

static MPI: OnceLock<Mpi> = OnceLock::new();

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Initializes MPI (once) and returns its state.
pub(crate) fn init() -> Result<&'static Mpi, String> {
    if let Some(m) = MPI.get() {
        return Ok(m);
    }
    let _g = lock();
    if let Some(m) = MPI.get() {
        return Ok(m);
    }
    if mpi::environment::is_finalized() {
        return Err("MPI was already finalized in this process".into());
    }
    // `None`: the program initialized MPI itself (and finalizes it).
    if let Some((universe, threading)) = mpi::initialize_with_threading(mpi::Threading::Multiple) {
        log::debug!("tracejit-distributed: MPI initialized with {threading:?} threading");
        *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(universe);
        // SAFETY: registers a plain `extern "C" fn()` with the C runtime.
        unsafe { libc_atexit(finalize_at_exit) };
    }
    let mut comm = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: MPI is initialized; `comm` is written by MPI_Comm_dup before
    // it is read; the world communicator is a valid handle.
    let comm = unsafe {
        let world = mpi::topology::SimpleCommunicator::world();
        check(ffi::MPI_Comm_dup(world.as_raw(), comm.as_mut_ptr()), "MPI_Comm_dup")?;
        let comm = comm.assume_init();
        check(ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
        comm
    };
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is valid; the outputs are plain ints.
    unsafe {
        check(ffi::MPI_Comm_rank(comm, &mut rank), "MPI_Comm_rank")?;
        check(ffi::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
    }
    let m = Mpi { comm, rank: rank as usize, size: size as usize };
    Ok(MPI.get_or_init(|| m))
}

extern "C" {
    #[link_name = "atexit"]
    fn libc_atexit(f: extern "C" fn()) -> c_int;
}

/// Finalizes MPI when the process exits normally, unless a collective was
/// abandoned (its peer is gone: `MPI_Finalize` could wait for it forever).
extern "C" fn finalize_at_exit() {
    let universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if crate::world::broken().is_some() {
        std::mem::forget(universe);
    } else {
        drop(universe);
    }
}

/// MPI's message for an error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (<= 1024 in MPICH and
    // Open MPI) bytes; MPI writes `len` of them.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

fn check(code: c_int, what: &str) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{what}: {}", error_string(code)))
    }
}

fn datatype(kind: Kind) -> ffi::MPI_Datatype {
    // SAFETY: reading the shim's constant handles.
    unsafe {
        match kind {
            Kind::F32 => ffi::RSMPI_FLOAT,
            Kind::F64 => ffi::RSMPI_DOUBLE,
            Kind::I32 => ffi::RSMPI_INT32_T,
            Kind::I64 => ffi::RSMPI_INT64_T,
            Kind::U8 => ffi::RSMPI_UINT8_T,
        }
    }
}

fn operation(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading the shim's constant handles.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

/// A started collective: the request and the buffers MPI reads and writes
/// until it completes (heap buffers: moving this struct moves no element).
pub(crate) struct Request {
    request: ffi::MPI_Request,
    /// A broadcast writes over its send buffer; the others fill `recv`.
    in_place: bool,
    send: Elems,
    recv: Elems,
    /// MPI said it completed (the handle is now `MPI_REQUEST_NULL`): a
    /// progress poll may see that before the wait does.
    done: bool,
    /// The error a progress poll met, returned again by the next test.
    failed: Option<String>,
}

// SAFETY: the request handle and the buffers are only touched under `LOCK`.
unsafe impl Send for Request {}

impl Mpi {
    /// Starts `c` on `send`'s elements.
    pub(crate) fn start(&self, c: Collective, mut send: Elems) -> Result<Request, String> {
        let kind = send.kind();
        let n = send.len();
        let count = c_int::try_from(n).map_err(|_| format!("{n} elements is more than MPI's int count"))?;
        let mut recv = match c {
            Collective::AllGather => Elems::zeros(kind, n * self.size),
            Collective::Broadcast { .. } => Elems::with_capacity(kind, 0),
            Collective::AllReduce(_) => Elems::zeros(kind, n),
        };
        let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        let _g = lock();
        let (sp, rp): (*mut c_void, *mut c_void) = (send.as_mut_ptr(), recv.as_mut_ptr());
        // SAFETY: both buffers hold `count` (all-gather: `count * size`)
        // elements of `datatype(kind)` and live in the returned `Request`
        // until MPI says the operation completed (or forever, when a
        // timeout abandons it); `comm` is valid.
        let code = unsafe {
            match c {
                Collective::AllReduce(op) => {
                    ffi::MPI_Iallreduce(sp, rp, count, datatype(kind), operation(op), self.comm, request.as_mut_ptr())
                }
                Collective::Broadcast { root } => {
                    ffi::MPI_Ibcast(sp, count, datatype(kind), root as c_int, self.comm, request.as_mut_ptr())
                }
                Collective::AllGather => ffi::MPI_Iallgather(
                    sp,
                    count,
                    datatype(kind),
                    rp,
                    count,
                    datatype(kind),
                    self.comm,
                    request.as_mut_ptr(),
                ),
            }
        };
        check(code, "starting the collective")?;
        // SAFETY: MPI wrote the request on success.
        let request = unsafe { request.assume_init() };
        Ok(Request {
            request,
            in_place: matches!(c, Collective::Broadcast { .. }),
            send,
            recv,
            done: false,
            failed: None,
        })
    }
}

impl Request {
    /// True once the operation completed (MPI_Test); progresses it.
    pub(crate) fn test(&mut self) -> Result<bool, String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        let _g = lock();
        // SAFETY: `request` came from a successful start and was not
        // completed yet (`done` stops the tests of a completed one).
        let code = unsafe { ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if let Err(e) = check(code, "MPI_Test") {
            self.failed = Some(e.clone());
            return Err(e);
        }
        self.done = flag != 0;
        Ok(self.done)
    }

    /// The result of a completed operation: the receive buffer, or for a
    /// broadcast the buffer it wrote over.
    pub(crate) fn into_result(self) -> Elems {
        if self.in_place {
            self.send
        } else {
            self.recv
        }
    }
}
