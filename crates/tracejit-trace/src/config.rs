//! Process-wide switches. `run_functions_eagerly(true)` (or the environment
//! variable `TRACEJIT_EAGER=1`) makes every `Function` call its closure
//! directly on eager tensors, which is how a traced program is debugged.
//! [`set_num_threads`] (or `TRACEJIT_NUM_THREADS`) sets how many threads
//! large compiled kernels and matrix products share.
//! [`set_mixed_precision`] runs every function's products in bf16.
//! [`set_compile_cache`] (or `TRACEJIT_COMPILE_CACHE=dir`) keeps compiled
//! kernels in a directory that later processes load instead of compiling;
//! [`compile_cache_stats`] counts kernels found and compiled.

use std::sync::atomic::{AtomicU8, Ordering};

/// The persistent compile cache (see `tracejit_jit::compile_cache`): a
/// directory of compiled kernels keyed by the region, the CPU's features,
/// the JIT options and the tracejit build, bounded by size with least
/// recently used eviction (512 MiB by default).
pub use tracejit_jit::compile_cache::{
    compile_cache, compile_cache_stats, set_compile_cache, set_compile_cache_limit, CompileCacheStats,
};

use tracejit_tensor::DType;

// 0: off, 1: bf16, 2: f16.
static MIXED_PRECISION: AtomicU8 = AtomicU8::new(0);

/// Runs every `Function` traced from now on with mixed precision in
/// `dtype` (`Some(DType::BF16)` or `Some(DType::F16)`), as
/// `Function::mixed_precision` does for one (which wins over this);
/// `None` turns it off. Functions already traced keep their traces.
///
/// # Panics
/// If `dtype` is `Some` of a dtype other than BF16 or F16.
pub fn set_mixed_precision(dtype: Option<DType>) {
    let code = match dtype {
        None => 0,
        Some(DType::BF16) => 1,
        Some(DType::F16) => 2,
        Some(d) => {
            panic!("set_mixed_precision: expected Some(BF16), Some(F16) or None, got {d}")
        }
    };
    MIXED_PRECISION.store(code, Ordering::Relaxed);
}

/// The process-wide mixed precision dtype ([`set_mixed_precision`]).
pub fn mixed_precision() -> Option<DType> {
    match MIXED_PRECISION.load(Ordering::Relaxed) {
        1 => Some(DType::BF16),
        2 => Some(DType::F16),
        _ => None,
    }
}

// 0: not decided yet (read the environment), 1: graphs, 2: eager.
static EAGER: AtomicU8 = AtomicU8::new(0);

/// Runs every `Function` eagerly (`true`) or traced (`false`), overriding
/// `TRACEJIT_EAGER`.
pub fn run_functions_eagerly(eager: bool) {
    EAGER.store(if eager { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether `TRACEJIT_VALIDATE=1` (or `true`) asks every `Function` that
/// does not say otherwise to validate its calls (`Function::validate`);
/// read once.
pub fn validation_from_env() -> bool {
    static FROM_ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FROM_ENV
        .get_or_init(|| std::env::var("TRACEJIT_VALIDATE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")))
}

/// Whether `Function`s currently run eagerly.
pub fn functions_run_eagerly() -> bool {
    match EAGER.load(Ordering::Relaxed) {
        0 => {
            let eager = std::env::var("TRACEJIT_EAGER").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
            // A concurrent `run_functions_eagerly` wins over the environment.
            let _ = EAGER.compare_exchange(0, if eager { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            EAGER.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}

/// Sets how many threads large compiled kernels and matrix products may
/// use, from the next kernel that starts (one already running finishes
/// with the count it started with, so this is safe at any time, from any
/// thread). `0` restores the default: `TRACEJIT_NUM_THREADS` if set, else
/// the cores available. Returns the count now in effect: a count above
/// `tracejit_jit::threads::max_threads()` (four per core available, at
/// least 16, at most 1024) is clamped to it with a `log` warning, never an
/// abort.
///
/// What it affects: in traced functions, fused region kernels whose work
/// is large (split by rows, element ranges or columns) and f32/f64 matrix
/// products past `tracejit_jit::threads::gemm_threshold()` multiply-adds
/// (2^21 by default, in output blocks fixed by the sizes), and the composite kernels that
/// use the JIT's GEMM (`lstm_cell`). Eager ops and the reference kernels
/// stay on the calling thread, and small kernels never touch the pool.
///
/// Results are bit-identical for every count: work is only split where
/// outputs are independent (whole rows of a row reduction, element ranges,
/// whole columns of a column reduction), and a product's accumulation
/// order depends only on its sizes.
///
/// ```
/// use tracejit_trace::config::{num_threads, set_num_threads};
/// use tracejit_trace::{function, Tensor};
///
/// let softmax = function(|x: Tensor| {
///     let e = (&x - &x.max(&[-1], true)).exp();
///     &e / &e.sum(&[-1], true)
/// });
/// let x = Tensor::randn(&[512, 1024], 0);
/// set_num_threads(1);
/// let one = softmax.call(x.clone())?.to_vec::<f32>()?;
/// set_num_threads(2);
/// assert_eq!(num_threads(), 2);
/// let two = softmax.call(x)?.to_vec::<f32>()?;
/// // The same bits, whatever the thread count.
/// assert!(one.iter().zip(&two).all(|(a, b)| a.to_bits() == b.to_bits()));
/// set_num_threads(0); // back to the default
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn set_num_threads(n: usize) -> usize {
    tracejit_jit::threads::set_num_threads(n)
}

/// The number of threads large kernels and matrix products use now (at
/// least 1): the last [`set_num_threads`], else `TRACEJIT_NUM_THREADS`
/// (a positive integer; another value is ignored with a `log` warning
/// naming it), else the cores available.
///
/// ```
/// assert!(tracejit_trace::config::num_threads() >= 1);
/// ```
pub fn num_threads() -> usize {
    tracejit_jit::threads::num_threads()
}

/// The most threads [`set_num_threads`] accepts on this machine (four per
/// core available, at least 16, at most 1024); a larger count is clamped
/// to it.
///
/// ```
/// assert!(tracejit_trace::config::max_threads() >= 16);
/// ```
pub fn max_threads() -> usize {
    tracejit_jit::threads::max_threads()
}

/// How many times calls made on this thread have split a kernel or a
/// matrix product across the thread pool: a diagnostic, e.g. to check that
/// a function's small kernels stay on the calling thread.
///
/// ```
/// use tracejit_trace::config::{pool_dispatches, set_num_threads};
/// use tracejit_trace::{function, Tensor};
///
/// set_num_threads(2);
/// let f = function(|x: Tensor| &x * 2.0 + 1.0);
/// let before = pool_dispatches();
/// f.call(Tensor::randn(&[16], 0))?;
/// assert_eq!(pool_dispatches(), before); // 16 elements: no pool
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn pool_dispatches() -> u64 {
    tracejit_jit::threads::pool_dispatches()
}

/// How many large buffers (32 MiB or more) calls made on this thread have
/// asked transparent huge pages for: a diagnostic of the advice described
/// in [`tracejit_kernels::pages`] (off with `TRACEJIT_HUGE_PAGES=0`; the
/// count stays put where the kernel has no transparent huge pages).
///
/// ```
/// use tracejit_trace::config::huge_page_buffers;
/// use tracejit_trace::Tensor;
///
/// let before = huge_page_buffers();
/// let _ = Tensor::randn(&[64, 64], 0).exp(); // 16 KiB: never advised
/// assert_eq!(huge_page_buffers(), before);
/// ```
pub fn huge_page_buffers() -> u64 {
    tracejit_kernels::pages::advised_buffers()
}
