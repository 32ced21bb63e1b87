//! Peak heap memory of one call: a counting global allocator (installed by
//! the `tracejit-bench` binary) keeps the live heap bytes and their high-water
//! mark, over every thread. [`measure_peak`] resets the mark to the live
//! bytes before a call and reads how far the call rose above them:
//! intermediates, outputs and bookkeeping, not what was allocated before.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The counting allocator. A binary installs it with
/// `#[global_allocator] static A: PeakAlloc = PeakAlloc;`.
pub struct PeakAlloc;

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters only observe sizes.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's pointer, layout and size.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Runs `f` and returns how many bytes above the live heap at its start the
/// heap reached while it ran (`None` when [`PeakAlloc`] is not the global
/// allocator, e.g. in this crate's tests).
pub fn measure_peak<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    let peak = PEAK.load(Ordering::SeqCst).saturating_sub(base);
    (out, INSTALLED.load(Ordering::Relaxed).then_some(peak))
}

/// The live heap bytes now (0 when [`PeakAlloc`] is not installed).
pub fn live_heap() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// Like [`measure_peak`], but counts from `base` (an earlier
/// [`live_heap`]) instead of the heap at `f`'s start: what was allocated
/// since `base` and is still held (a compiled function's buffer pool,
/// kept between calls) counts too.
pub fn measure_peak_above<T>(base: usize, f: impl FnOnce() -> T) -> (T, Option<usize>) {
    PEAK.store(LIVE.load(Ordering::SeqCst), Ordering::SeqCst);
    let out = f();
    let peak = PEAK.load(Ordering::SeqCst).saturating_sub(base);
    (out, INSTALLED.load(Ordering::Relaxed).then_some(peak))
}
