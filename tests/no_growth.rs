//! Memory does not grow with use: 20,000 steady calls of one compiled
//! function and 2,000 functions traced, compiled, called and dropped leave
//! the heap where it was (regression tests for what held in issue #17's
//! adversarial run — keep it held).
//!
//! A global allocator counts live heap bytes (allocations minus frees, from
//! every thread). The whole file is one `#[test]` so that no other test of
//! this binary allocates while it measures. JIT code lives in pages the
//! kernels' modules map themselves, outside the heap; on Linux the resident
//! set is checked too, with a bound far below what 2,000 leaked modules
//! would take.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use tracejit::prelude::*;

struct Live;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Live {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Live = Live;

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// Resident set size in bytes (Linux), or `None` elsewhere.
fn rss() -> Option<isize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: isize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// A fresh function with a fused region, a GEMM and a variable, so a dropped
/// function has kernels, buffers and a variable to free.
fn make(i: usize) -> Function<Tensor, Tensor> {
    let w = Variable::new(Tensor::randn(&[8, 8], i as u64));
    function(move |x: Tensor| (x.matmul(&w.read()) + 1.0).tanh().sum(&[-1], false))
}

fn use_once(i: usize, x: &Tensor) {
    let f = make(i);
    let y = f.call(x.clone()).expect("runs");
    assert_eq!(y.shape(), &[4]);
    let cf = &f.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    assert!(cf.fallbacks().is_empty());
}

#[test]
fn steady_calls_and_dropped_functions_leave_the_heap_where_it_was() {
    let x = Tensor::randn(&[4, 8], 7);

    // Steady calls: once warm, 20,000 more calls keep nothing.
    let f = function(|x: Tensor| {
        let m = x.max(&[-1], true);
        let e = (&x - &m).exp();
        (&e / &e.sum(&[-1], true)).matmul(&x.transpose(&[1, 0]))
    });
    for _ in 0..10 {
        drop(f.call(x.clone()).expect("runs"));
    }
    assert_eq!(f.concrete_functions()[0].executor_kind(), "jit");
    let before = live();
    for _ in 0..20_000 {
        drop(f.call(x.clone()).expect("runs"));
    }
    let grown = live() - before;
    assert!(grown <= 4096, "20,000 steady calls left {grown} more live heap bytes");
    drop(f);

    // Dropped functions: warm up the one-time state (registries, thread
    // locals), then 2,000 functions come and go.
    for i in 0..50 {
        use_once(i, &x);
    }
    let (before, rss_before) = (live(), rss());
    for i in 0..2_000 {
        use_once(1_000 + i, &x);
    }
    let grown = live() - before;
    // A leaked function would keep kilobytes (graph, plan, buffers); 2,000
    // of them megabytes. A few hundred bytes of amortized growth (a map that
    // doubled) is not a leak.
    assert!(grown <= 64 * 1024, "2,000 dropped functions left {grown} more live heap bytes");
    if let (Some(a), Some(b)) = (rss_before, rss()) {
        let grown = b - a;
        assert!(grown <= 32 << 20, "2,000 dropped functions grew the resident set by {grown} bytes");
    }
}
