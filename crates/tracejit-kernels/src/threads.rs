//! The thread pool behind large kernels and matrix products, and the
//! process-wide thread count (`tracejit::config::set_num_threads`).
//!
//! What runs on the pool: fused region kernels whose estimated work is
//! large (split by rows, by element ranges, or — column reductions — by
//! columns; see `tracejit_jit::CompiledRegion`), f32/f64 matrix products past
//! a size (in output blocks fixed by the sizes, [`run_gemm_blocks`]), and
//! two independent products of that size close together in a schedule,
//! side by side, each whole on one thread (see `tracejit_jit::Executable`). Everything
//! else — reference kernels, eager ops other than products and
//! convolutions, small kernels — runs on the
//! calling thread, which is why a call of a few small kernels (W1) never
//! pays for the pool.
//!
//! # Determinism
//!
//! Results never depend on the thread count: every element's arithmetic
//! is the same whoever computes it. A region kernel is split only where its
//! outputs are independent — whole rows of a row reduction, element ranges
//! of an elementwise kernel (at multiples of 512 elements, so every element
//! keeps its place in the vector loops), whole columns of a column
//! reduction, each column still summed over its rows in the reference's
//! order. A reduction's partial results are never combined across threads.
//! A matrix product is cut into output blocks chosen from its sizes alone
//! ([`gemm_blocks`]); each block is one single-threaded `gemm` call
//! whoever runs it, so its accumulation order over `k` does not depend on
//! the thread count either.
//!
//! # Pool
//!
//! `n - 1` worker threads of our own (the caller is the `n`th), started
//! the first time a large kernel runs with `n > 1` and replaced when the
//! count changes; a kernel already
//! running keeps the pool (and count) it started with. A split kernel's or
//! product's calling thread takes parts itself alongside the workers, and
//! never waits for a worker that has not started.

mod pool;

pub use pool::Pool;

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Serializes the unit tests that change the process-wide thread count
/// (or the split thresholds): one lock for all of them, so that no test's
/// count changes under another's (the attention test saw one pass skip the
/// pool when a bf16 test, holding a lock of its own, set the count).
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

/// The environment variable giving the default thread count.
pub const ENV_VAR: &str = "TRACEJIT_NUM_THREADS";

/// The thread count; 0 until decided (read from the environment).
static NUM_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of threads large kernels and matrix products may use,
/// for every call that starts from now on (a kernel already running
/// finishes with the count it started with, so this is safe at any time,
/// from any thread). `0` restores the default: `TRACEJIT_NUM_THREADS` if
/// set, else the cores available. Returns the count now in effect.
///
/// A count above [`max_threads`] (four per core available, at least 16,
/// at most [`MAX_THREADS`]) is clamped to it, with a `log` warning: more
/// threads than that only compete for the same cores (each worker watches
/// for work for 100 µs before it sleeps), and a count such as
/// `usize::MAX` would otherwise try to start threads until the system
/// refuses and the process aborts.
///
/// It affects fused region kernels and f32/f64 matrix products of the JIT
/// executor (traced functions) and the composite kernels that use the
/// JIT's GEMM; eager ops and the reference kernels stay on the calling
/// thread. Results are bit-identical for every count.
///
/// ```
/// use tracejit_kernels::threads::{max_threads, num_threads, set_num_threads};
///
/// set_num_threads(2);
/// assert_eq!(num_threads(), 2);
/// set_num_threads(1); // everything on the calling thread
/// assert_eq!(num_threads(), 1);
/// assert_eq!(set_num_threads(usize::MAX), max_threads()); // clamped, never an abort
/// set_num_threads(0); // back to the default
/// assert!(num_threads() >= 1);
/// ```
pub fn set_num_threads(n: usize) -> usize {
    let n = if n == 0 { default_num_threads() } else { clamped(n, "set_num_threads") };
    NUM_THREADS.store(n, Ordering::Relaxed);
    n
}

/// The most threads a count may ask for on this machine: four per core
/// available, at least 16 (so tests may oversubscribe a small machine), at
/// most [`MAX_THREADS`]. [`set_num_threads`] and `TRACEJIT_NUM_THREADS`
/// clamp to it.
///
/// ```
/// let max = tracejit_kernels::threads::max_threads();
/// assert!((16..=tracejit_kernels::threads::MAX_THREADS).contains(&max));
/// ```
pub fn max_threads() -> usize {
    available_cores().saturating_mul(4).clamp(16, MAX_THREADS)
}

/// `n` clamped to [`max_threads`], with a warning naming `what` when it
/// was more.
fn clamped(n: usize, what: &str) -> usize {
    let max = max_threads();
    if n > max {
        log::warn!(
            "tracejit: {what}({n}) asks for more than {max} threads (four per core available, at least 16); using \
             {max}"
        );
    }
    n.min(max)
}

/// The number of threads large kernels and matrix products use now (at
/// least 1): the entered [`crate::Target`]'s count if it names one, else
/// the last [`set_num_threads`], else the default (`TRACEJIT_NUM_THREADS`
/// if set, else the cores available).
///
/// ```
/// assert!(tracejit_kernels::threads::num_threads() >= 1);
/// ```
pub fn num_threads() -> usize {
    match crate::Target::entered() {
        Some(t) => t.resolved_threads(),
        None => process_num_threads(),
    }
}

/// The process's count ([`set_num_threads`] or the default), whatever
/// target is entered.
pub fn process_num_threads() -> usize {
    match NUM_THREADS.load(Ordering::Relaxed) {
        0 => {
            // A concurrent `set_num_threads` wins over the default.
            let _ = NUM_THREADS.compare_exchange(0, default_num_threads(), Ordering::Relaxed, Ordering::Relaxed);
            NUM_THREADS.load(Ordering::Relaxed)
        }
        n => n,
    }
}

/// The count used when none was set: `TRACEJIT_NUM_THREADS` when it holds
/// a valid count, else the cores available. The environment is read once
/// per process; an invalid value is reported once (a `log` warning naming
/// the variable and the value) and ignored.
pub fn default_num_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let cores = available_cores();
        match std::env::var(ENV_VAR) {
            Ok(v) => match parse_num_threads(&v) {
                Ok(n) => clamped(n, ENV_VAR),
                Err(e) => {
                    log::warn!("tracejit: {e}; using the {cores} cores available");
                    cores
                }
            },
            Err(std::env::VarError::NotPresent) => cores,
            Err(std::env::VarError::NotUnicode(v)) => {
                log::warn!("tracejit: {ENV_VAR}={v:?} is not valid Unicode; using the {cores} cores available");
                cores
            }
        }
    })
}

/// The cores this process may use (1 when unknown).
fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Most threads a count may ask for: far past any core count, it only
/// guards against a typo spawning thousands of threads.
pub const MAX_THREADS: usize = 1024;

/// Parses a thread count as `TRACEJIT_NUM_THREADS` holds it: a positive
/// integer up to [`MAX_THREADS`], surrounding spaces allowed. The error
/// names the variable, the value and what was expected.
///
/// ```
/// use tracejit_kernels::threads::parse_num_threads;
///
/// assert_eq!(parse_num_threads(" 3 "), Ok(3));
/// let e = parse_num_threads("two").unwrap_err();
/// assert!(e.contains("TRACEJIT_NUM_THREADS=\"two\""), "{e}");
/// assert!(parse_num_threads("0").is_err());
/// ```
pub fn parse_num_threads(value: &str) -> Result<usize, String> {
    let bad = |why: &str| format!("{ENV_VAR}={value:?} {why}");
    match value.trim().parse::<usize>() {
        Ok(0) => {
            Err(bad("is not a thread count: expected a positive integer (1 runs everything on the calling thread)"))
        }
        Ok(n) if n > MAX_THREADS => Err(bad(&format!("asks for more than {MAX_THREADS} threads"))),
        Ok(n) => Ok(n),
        Err(_) => Err(bad("is not a thread count: expected a positive integer such as 2")),
    }
}

thread_local! {
    /// Pool dispatches started by this thread.
    static DISPATCHES: Cell<u64> = const { Cell::new(0) };
}

/// How many times calls made on this thread have split a kernel or matrix
/// product across the pool. A diagnostic (tests use it to check that
/// small calls never touch the pool); counted per thread so that other
/// threads' calls do not disturb it.
pub fn pool_dispatches() -> u64 {
    DISPATCHES.with(Cell::get)
}

thread_local! {
    /// Set while this thread runs one of several tasks in parallel (see
    /// [`serial`]).
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with everything it starts on the calling thread: [`pool`] is
/// `None` inside, so kernels and products run as on one thread (with the
/// same bits). For tasks that are themselves one of several running in
/// parallel.
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// The pool for the current count, or `None` when the count is 1, inside
/// [`serial`], or when the pool cannot be built (the work then runs on
/// the calling thread).
pub fn pool() -> Option<Arc<Pool>> {
    let n = num_threads();
    if n <= 1 || SERIAL.with(Cell::get) {
        return None;
    }
    static CURRENT: Mutex<Option<Arc<Pool>>> = Mutex::new(None);
    let mut cur = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = cur.as_ref().filter(|p| p.threads() == n) {
        return Some(p.clone());
    }
    match Pool::new(n) {
        Ok(p) => {
            // The old pool's threads exit once the kernels using it finish.
            let p = Arc::new(p);
            *cur = Some(p.clone());
            Some(p)
        }
        Err(e) => {
            log::warn!("tracejit: cannot start {n} worker threads ({e}); running on the calling thread");
            None
        }
    }
}

/// Runs `f(start, part)` over `data` cut into parts of whole `chunk`s
/// (`start`: the part's first index): one part per thread of the pool
/// when `data` has at least `min_len` elements and the count is above 1,
/// else one call `f(0, data)` on the calling thread. Parts are disjoint
/// runs of whole chunks, so an `f` that computes each chunk from its
/// index alone (counter-based random numbers, say) gives the same bits at
/// every thread count.
///
/// ```
/// use tracejit_kernels::threads::for_each_part;
///
/// let mut v = vec![0u32; 10_000];
/// for_each_part(&mut v, 256, 1024, &|start, part| {
///     for (i, x) in part.iter_mut().enumerate() {
///         *x = (start + i) as u32;
///     }
/// });
/// assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
/// ```
pub fn for_each_part<T: Send>(data: &mut [T], chunk: usize, min_len: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let chunks = data.len().div_ceil(chunk.max(1));
    let pool = if data.len() >= min_len && chunks > 1 { pool() } else { None };
    let Some(pool) = pool else { return f(0, data) };
    let parts = pool.threads().min(chunks);
    let (per, len) = (chunks.div_ceil(parts) * chunk.max(1), data.len());
    /// The slice's elements, shared by tasks that take disjoint ranges.
    struct Base<T>(*mut T);
    // SAFETY: each task makes a slice of its own range only, and the call
    // holds `data`'s unique borrow until every task is done.
    unsafe impl<T: Send> Sync for Base<T> {}
    let base = Base(data.as_mut_ptr());
    let base = &base;
    pool.run(parts, &|t| {
        let (start, end) = ((t * per).min(len), ((t + 1) * per).min(len));
        // SAFETY: `[start, end)` lies in `data`, and no other task's range
        // overlaps it.
        f(start, unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) })
    });
}

/// Runs a matrix product of `m×k` by `k×n` as output blocks: `block(rows,
/// cols)` must compute the product's `rows × cols` part of the output with
/// one `gemm::gemm` call without parallelism. The blocks are fixed by the
/// sizes ([`gemm_blocks`]), and by the thread count only where that cannot
/// change a bit ([`gemm_blocks_on`]: blocks that give the whole's bits,
/// regrouped so that every thread gets as many). They run on
/// the pool (the caller taking blocks alongside the workers, see
/// `Pool::run`) when the product has at least [`gemm_threshold`]
/// multiply-adds and the count is above 1; on one thread, as one call for
/// the whole output when [`GemmBlocks::same_as_whole`] (saving the shared
/// operand's packing per block), else block by block.
///
/// Why one call gives the blocks' bits: in the `gemm` crate an output
/// element is accumulated in order over `k` by one micro-kernel, in depth
/// blocks whose size depends on `k` alone, once the product takes the
/// general path — which the whole and every block do when no side is
/// short enough for its special cases (`same_as_whole`). The tests compare
/// 1, 2 and 3 threads bit for bit.
///
/// ```
/// use std::sync::Mutex;
/// use tracejit_kernels::threads::run_gemm_blocks;
///
/// let seen = Mutex::new(vec![0u8; 64 * 4096]);
/// run_gemm_blocks(64, 4096, 512, &|rows, cols| {
///     let mut seen = seen.lock().unwrap();
///     for r in rows {
///         for c in cols.clone() {
///             seen[r * 4096 + c] += 1;
///         }
///     }
/// });
/// assert!(seen.into_inner().unwrap().iter().all(|&v| v == 1));
/// ```
pub fn run_gemm_blocks(m: usize, n: usize, k: usize, block: &(dyn Fn(Range<usize>, Range<usize>) + Sync)) {
    let mut b = gemm_blocks(m, n, k);
    let pool = if b.count > 1 && m.saturating_mul(n).saturating_mul(k) >= gemm_threshold() { pool() } else { None };
    if let Some(p) = &pool {
        b = regrouped(b, m, n, p.threads());
    }
    let dim = if b.by_rows { m } else { n };
    let part = |t: usize| {
        let end = if t + 1 == b.count { dim } else { (t + 1) * b.size };
        let r = t * b.size..end;
        if b.by_rows {
            block(r, 0..n)
        } else {
            block(0..m, r)
        }
    };
    if let Some(p) = pool {
        p.run(b.count, &part);
        return;
    }
    if b.same_as_whole {
        block(0..m, 0..n);
    } else {
        (0..b.count).for_each(part);
    }
}

/// How [`run_gemm_blocks`] cuts a product's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmBlocks {
    /// Whether the blocks are ranges of rows (else of columns).
    pub by_rows: bool,
    /// Rows or columns per block (a multiple of [`GEMM_ROUND`], at least
    /// [`GEMM_GRANULE`] when split, or [`SMALL_GRANULE`] for the two halves
    /// of a mid-sized product); the last block takes the rest (over 64
    /// and at most `size + GEMM_ROUND / 2` of them, or any rest of halves).
    pub size: usize,
    /// Number of blocks (at least 1).
    pub count: usize,
    /// Whether one `gemm` call for the whole output computes the same bits
    /// as the blocks: there is more than one block, the product's depth and
    /// short side are at least 4 (no special path for tiny products,
    /// vectors or thin depths), and every block is over 64 wide (the
    /// general path, as for the whole) or the depth at most 512 (where the
    /// small-product path sums over `k` in the same one block).
    pub same_as_whole: bool,
}

/// Least multiply-adds a block of a split product gets: about 12 µs of a
/// core's GEMM, far above a dispatch's cost (0.1-0.3 µs) and the repacking
/// of the shared operand per block.
pub const GEMM_BLOCK_WORK: usize = 1 << 20;
/// Least multiply-adds of a product cut in two halves narrower than
/// [`GEMM_GRANULE`] (about 5 µs of a core's GEMM, the least that two threads
/// finish sooner than one, measured on W8's recurrent step).
pub const SMALL_SPLIT_WORK: usize = 1 << 19;
/// Least rows or columns of each half of such a product.
pub const SMALL_GRANULE: usize = 64;
/// The depth up to which the `gemm` crate's small-product path and its
/// general path both accumulate over `k` in one block.
const SMALL_PATH_DEPTH: usize = 512;
/// Most blocks a product is cut into: enough for a late worker to be
/// balanced by the others taking its share, few enough that the shared
/// operand is not packed again and again.
pub const GEMM_MAX_BLOCKS: usize = 4;
/// Least rows or columns of a block, and of a product cut into blocks per
/// block (far over the 64 below which the `gemm` crate takes its
/// small-product path).
pub const GEMM_GRANULE: usize = 128;
/// Block sizes are multiples of this many rows or columns (the `gemm`
/// crate's f32 register tile is 16 rows), so that a product's blocks are
/// near equal: W6's 784-row weight gradient splits 208 + 208 + 208 + 160,
/// not 256 + 256 + 272 (on two threads, 1.3x faster).
pub const GEMM_ROUND: usize = 16;

/// The blocks of an `m×k` by `k×n` product: along the longer of `m` and
/// `n` (so the operand every block shares is the smaller one), at least
/// [`GEMM_BLOCK_WORK`] multiply-adds each, at most [`GEMM_MAX_BLOCKS`],
/// at least [`GEMM_GRANULE`] wide, near equal (sizes rounded up to a
/// multiple of [`GEMM_ROUND`]), a short remainder joined to the last
/// block; a product of at least [`SMALL_SPLIT_WORK`] that gets one block
/// by these rules is cut in two halves instead, if each half is at least
/// [`SMALL_GRANULE`] wide. A function of the sizes only.
///
/// ```
/// use tracejit_kernels::threads::gemm_blocks;
///
/// let b = gemm_blocks(64, 512, 784); // W5's first layer
/// assert!(!b.by_rows && b.count == 4 && b.size == 128 && b.same_as_whole);
/// let dw1 = gemm_blocks(784, 512, 64); // W6's first weight gradient
/// assert_eq!((dw1.count, dw1.size), (4, 208)); // 3 x 208 + 160 rows
/// assert_eq!(gemm_blocks(32, 128, 64).count, 1); // small: one block
/// let step = gemm_blocks(32, 128, 128); // W8's recurrent step: two halves
/// assert!(!step.by_rows && step.count == 2 && step.size == 64 && step.same_as_whole);
/// let odd = gemm_blocks(1409, 187, 2); // odd halves: 720 + 689 rows
/// assert!(odd.by_rows && odd.count == 2 && odd.size == 720);
/// ```
pub fn gemm_blocks(m: usize, n: usize, k: usize) -> GemmBlocks {
    let by_rows = m > n;
    let (dim, short) = if by_rows { (m, n) } else { (n, m) };
    let work = m.saturating_mul(n).saturating_mul(k);
    let want = (work / GEMM_BLOCK_WORK).min(GEMM_MAX_BLOCKS).min(dim / GEMM_GRANULE).max(1);
    // Near-equal blocks: three of 256 rows and one of 272 would leave one
    // of two threads with twice the other's work.
    let size = dim.div_ceil(want).next_multiple_of(GEMM_ROUND).max(GEMM_GRANULE.min(dim)).max(1);
    let (full, rest) = (dim / size, dim % size);
    // A remainder of at most half a rounding step joins the last full block.
    let count = if full == 0 || rest > GEMM_ROUND / 2 { full + 1 } else { full };
    let same_as_whole = count > 1 && short >= 4 && k >= 4;
    if count == 1 && work >= SMALL_SPLIT_WORK && dim >= 2 * SMALL_GRANULE {
        // Two halves of a mid-sized product (a recurrent step's `h · w`):
        // each half runs at the whole's rate (32×128×128: 5.2 µs per half,
        // 10.3 for the whole), and inside a loop nothing else can use the
        // second thread. Halves of at most 64 take the crate's
        // small-product path, whose depth blocks are 512 deep where the
        // general path's are `k` itself up to 512: one call gives the
        // halves' bits only up to that depth (else one thread runs them
        // as halves too; 2% slower than one call on W8's step).
        // Rounded up: the first half is never the smaller (1409 rows: 720 + 689).
        let size = dim.div_ceil(2).next_multiple_of(GEMM_ROUND);
        let same_as_whole = short >= 4 && (4..=SMALL_PATH_DEPTH).contains(&k);
        return GemmBlocks { by_rows, size, count: 2, same_as_whole };
    }
    GemmBlocks { by_rows, size, count, same_as_whole }
}

/// [`gemm_blocks`] of a product run on `threads` threads: the same blocks,
/// except that blocks which give the whole product's bits
/// ([`GemmBlocks::same_as_whole`]) and do not share out evenly are
/// regrouped into the largest multiple of `threads` below their count.
/// Three blocks on two threads leave one thread a block behind the other:
/// two 1.4x faster than one (a 504-row product of MiniLM's, W15), where
/// two halves give 1.9x. The bits stay those of the whole product, so the
/// result still does not depend on the thread count.
///
/// ```
/// use tracejit_kernels::threads::{gemm_blocks, gemm_blocks_on};
///
/// assert_eq!(gemm_blocks(504, 384, 384).count, 3);
/// let two = gemm_blocks_on(504, 384, 384, 2);
/// assert!(two.by_rows && two.count == 2 && two.size == 256 && two.same_as_whole);
/// assert_eq!(gemm_blocks_on(504, 384, 384, 3), gemm_blocks(504, 384, 384));
/// assert_eq!(gemm_blocks_on(64, 512, 784, 2), gemm_blocks(64, 512, 784)); // 4 blocks share out
/// ```
pub fn gemm_blocks_on(m: usize, n: usize, k: usize, threads: usize) -> GemmBlocks {
    regrouped(gemm_blocks(m, n, k), m, n, threads)
}

/// [`gemm_blocks_on`] from the product's [`gemm_blocks`] `b`.
fn regrouped(b: GemmBlocks, m: usize, n: usize, threads: usize) -> GemmBlocks {
    if !b.same_as_whole || threads < 2 || b.count <= threads || b.count.is_multiple_of(threads) {
        return b;
    }
    let dim = if b.by_rows { m } else { n };
    let want = b.count / threads * threads;
    let size = dim.div_ceil(want).next_multiple_of(GEMM_ROUND);
    let (full, rest) = (dim / size, dim % size);
    let count = if rest > GEMM_ROUND / 2 { full + 1 } else { full };
    // Fewer, wider blocks than the size rule's: each still over 64 wide
    // (the general path, as the whole takes); else keep the size rule's.
    let last = dim - (count - 1) * size;
    if count.is_multiple_of(threads) && last > 64 {
        GemmBlocks { size, count, ..b }
    } else {
        b
    }
}

/// Most elements of `b` in a product run with its consumer in row halves
/// ([`epilogue_rows`]): 128 KiB of f32, which each thread then reads
/// whole from its own cache (a wider `b` is better cut by columns).
pub const EPILOGUE_RHS: usize = 1 << 15;

/// Rows of the first of the two halves in which an `m×k` by `k×n`
/// product is computed together with the region that consumes it, each
/// half's rows of the region right after its product, on the same thread:
/// for a mid-sized product ([`gemm_blocks`] cuts it in at most two, of at
/// least [`SMALL_SPLIT_WORK`] multiply-adds) with a small `b` (at most
/// [`EPILOGUE_RHS`] elements), at least 16 rows, and a depth of 4 to 512,
/// where the halves have the bits of one call for the whole (so one
/// thread runs the whole product, then the whole region). A function of
/// the sizes only.
///
/// ```
/// use tracejit_kernels::threads::epilogue_rows;
///
/// assert_eq!(epilogue_rows(32, 128, 128), Some(16)); // W8's step
/// assert_eq!(epilogue_rows(64, 512, 784), None); // W5: wide b, deep
/// assert_eq!(epilogue_rows(8, 128, 128), None); // too small
/// ```
pub fn epilogue_rows(m: usize, n: usize, k: usize) -> Option<usize> {
    let work = m.saturating_mul(n).saturating_mul(k);
    let mid = work >= SMALL_SPLIT_WORK && gemm_blocks(m, n, k).count <= 2;
    if !mid || k.saturating_mul(n) > EPILOGUE_RHS || !(4..=SMALL_PATH_DEPTH).contains(&k) || m < 16 || n < 4 {
        return None;
    }
    let size = (m / 2).next_multiple_of(8);
    Some(if m - size < 8 { m / 2 } else { size })
}

/// The default of [`gemm_threshold`]: 2^19 multiply-adds, the least
/// product that [`gemm_blocks`] may cut in two.
pub const DEFAULT_GEMM_THRESHOLD: usize = SMALL_SPLIT_WORK;

static GEMM_THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_GEMM_THRESHOLD);

/// Matrix products with fewer multiply-adds (`m·k·n`) than this stay on the
/// calling thread: the entered [`crate::Target`]'s threshold if it names
/// one, else the process's ([`set_gemm_threshold`]).
pub fn gemm_threshold() -> usize {
    match crate::Target::entered() {
        Some(t) => t.resolved_gemm_threshold(),
        None => process_gemm_threshold(),
    }
}

/// The process's GEMM threshold, whatever target is entered.
pub fn process_gemm_threshold() -> usize {
    GEMM_THRESHOLD.load(Ordering::Relaxed)
}

/// Sets [`gemm_threshold`], for experiments and tests. It changes only when
/// work is split, never the results.
pub fn set_gemm_threshold(flops: usize) {
    GEMM_THRESHOLD.store(flops, Ordering::Relaxed);
}

/// The default of [`split_threshold`]. A kernel of twice this (the least
/// that splits in two) takes about 12-40 µs on one core of the machine of
/// `WORKLOADS.md` (`examples/threads.rs`: 16 µs for `x * a + b`, 25-37 µs
/// for `tanh`, 32-40 µs for softmax); a split costs about 0.1-0.3 µs when
/// no worker joins in time and a few µs when one does.
pub const DEFAULT_SPLIT_THRESHOLD: u64 = 1 << 18;

static SPLIT_THRESHOLD: AtomicU64 = AtomicU64::new(DEFAULT_SPLIT_THRESHOLD);

/// The least estimated work (in cost units: elements times a per-element
/// cost from the kernel's ops, about a vector lane's simple op each) that
/// a region kernel gives each thread: a kernel splits into at most
/// `work / split_threshold()` parts (and at most one per thread), so a
/// kernel under twice this stays on the calling thread. The entered
/// [`crate::Target`]'s threshold if it names one, else the process's
/// ([`set_split_threshold`]).
pub fn split_threshold() -> u64 {
    match crate::Target::entered() {
        Some(t) => t.resolved_split_threshold(),
        None => process_split_threshold(),
    }
}

/// The process's split threshold, whatever target is entered.
pub fn process_split_threshold() -> u64 {
    SPLIT_THRESHOLD.load(Ordering::Relaxed)
}

/// Sets [`split_threshold`] (at least 1), for experiments and for tests
/// that exercise the split paths on small tensors. It changes only when
/// work is split, never the results.
pub fn set_split_threshold(work: u64) {
    SPLIT_THRESHOLD.store(work.max(1), Ordering::Relaxed);
}
