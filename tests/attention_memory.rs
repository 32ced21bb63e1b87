//! Attention never materializes its `[Tq, Tk]` scores: the peak memory of
//! every path — the f32 forward and its backward under a tape, bf16 and
//! f64, eagerly and compiled — stays a small multiple of its inputs and
//! outputs, far below one score matrix (issue 44, failure 5: the eager
//! backward, the bf16 forward and the f64 forward each held 1.1-2.1 GiB at
//! T = 8192, where the f32 forward needs a few MiB).
//!
//! A file of its own: it installs a counting global allocator, counting
//! the bytes live in the whole process (the kernels run on the thread
//! pool), and the tests run one after another under a lock.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tracejit::nn::scaled_dot_product_attention;
use tracejit::prelude::*;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn add(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call goes to the system allocator unchanged; the counters
// are atomics that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as allocated above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as allocated above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test measures at a time (the counters are process-wide).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `f` and returns the most bytes live at once above those live
/// before it.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst).saturating_sub(base)
}

/// Queries and keys: one head of `T` positions, width `D`.
const T: usize = 4096;
const D: usize = 16;

/// `q, k, v` of `[1, T, D]` in `dtype`.
fn qkv(dtype: DType) -> [Tensor; 3] {
    [0, 1, 2].map(|s| Tensor::randn(&[1, T, D], s).cast(dtype))
}

/// What a tiled path may hold: its inputs, outputs and gradients (a
/// dozen `[T, D]` tensors of 8 bytes at most), f32 copies of them, per
/// thread a few tiles of 64 × 64 scores, and 4 MiB for the runtime (the
/// pool's threads, a compiled function). One score matrix is
/// `T² · 4 = 64 MiB` in f32.
fn allowance() -> usize {
    let tensors = 24 * T * D * 8;
    let tiles = tracejit::config::num_threads().max(1) * 16 * 64 * 64 * 8;
    tensors + tiles + (4 << 20)
}

/// Holds the other tests off while one measures (their setup allocates too).
fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn check(what: &str, f: impl FnOnce()) {
    let peak = peak_of(f);
    let scores = T * T * 4;
    assert!(
        peak <= allowance(),
        "{what}: {peak} bytes at peak, above {} (one f32 score matrix is {scores})",
        allowance()
    );
}

#[test]
fn the_f32_forward_holds_a_tile() {
    let _one = alone();
    let [q, k, v] = qkv(DType::F32);
    check("eager f32 forward", || drop(scaled_dot_product_attention(&q, &k, &v, None, true, None)));
}

#[test]
fn the_eager_backward_holds_a_tile() {
    let _one = alone();
    let [q, k, v] = qkv(DType::F32);
    let step = || {
        let tape = GradientTape::new();
        [&q, &k, &v].iter().for_each(|t| tape.watch(t));
        let y = scaled_dot_product_attention(&q, &k, &v, None, true, None);
        let g = tape.gradient(&y.sum_all(), &[&q, &k, &v]).unwrap();
        assert!(g.iter().all(Option::is_some));
    };
    // Under a tape a composite runs as a call of its function: the first
    // step traces and compiles both (the composites' own cost, once).
    step();
    check("eager f32 forward and backward under a tape", step);
}

#[test]
fn bf16_holds_a_tile_eagerly_and_compiled() {
    let _one = alone();
    let [q, k, v] = qkv(DType::BF16);
    check("eager bf16 forward", || {
        let y = scaled_dot_product_attention(&q, &k, &v, None, true, None);
        assert_eq!(y.dtype(), DType::BF16);
    });
    let f = function(|(q, k, v): (Tensor, Tensor, Tensor)| scaled_dot_product_attention(&q, &k, &v, None, true, None));
    f.call((q.clone(), k.clone(), v.clone())).unwrap();
    check("compiled bf16 forward", || drop(f.call((q.clone(), k.clone(), v.clone())).unwrap()));
}

#[test]
fn f64_holds_a_tile_eagerly_and_compiled() {
    let _one = alone();
    let [q, k, v] = qkv(DType::F64);
    check("eager f64 forward", || drop(scaled_dot_product_attention(&q, &k, &v, None, true, None)));
    let f = function(|(q, k, v): (Tensor, Tensor, Tensor)| scaled_dot_product_attention(&q, &k, &v, None, true, None));
    f.call((q.clone(), k.clone(), v.clone())).unwrap();
    check("compiled f64 forward", || drop(f.call((q.clone(), k.clone(), v.clone())).unwrap()));
}
