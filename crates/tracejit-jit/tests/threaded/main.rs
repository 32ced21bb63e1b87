//! The JIT on several threads: kernels, products and copies split over the
//! pool (`pool`), products paired side by side (`pairs`), a product run with
//! its consumer in row halves (`epilogue`), regions written in place
//! (`in_place`) and the hand-written row softmax (`native`) — each the bits
//! of one thread.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! These tests change the process-wide thread count and split thresholds,
//! so they have a process of their own (apart from the `kernels` binary,
//! whose tests change nothing process-wide) and take turns under one lock
//! ([`serial`]): a count set by one test must not change under another's
//! check that a call split, or entered the pool so many times.

use std::sync::{Mutex, MutexGuard};

#[path = "../common/mod.rs"]
mod common;

mod epilogue;
mod in_place;
mod native;
mod native_layer_norm;
mod pairs;
mod pool;
mod target;

/// Serializes the tests that change the thread count or the split
/// thresholds, across every module of this binary (a test that panicked
/// holding it leaves it usable).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
