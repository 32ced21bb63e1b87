//! The per-Function trace locks, with deadlock detection.
//!
//! Tracing a Function holds its lock (one trace per Function at a time, so a
//! signature is traced once however many threads miss the cache together).
//! A trace that calls another Function takes that one's lock too, so two
//! threads tracing `f` (which calls `g`) and `g` (which calls `f`) at the
//! same time would each wait for the other forever. Every lock wait is
//! therefore registered in a small wait-for graph: a thread that would close
//! a cycle gets an error instead of waiting, its trace fails (and releases
//! its locks), and the other thread goes on.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::thread::ThreadId;
use std::time::Duration;

/// Who holds which trace lock, and which lock each blocked thread wants.
#[derive(Default)]
struct WaitGraph {
    holder: HashMap<usize, ThreadId>,
    waiting: HashMap<ThreadId, usize>,
}

static GRAPH: Mutex<Option<WaitGraph>> = Mutex::new(None);

fn with_graph<T>(f: impl FnOnce(&mut WaitGraph) -> T) -> T {
    let mut g = GRAPH.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(WaitGraph::default))
}

/// A held trace lock; unregisters itself when dropped.
pub(crate) struct TraceLockGuard<'a> {
    id: usize,
    _guard: MutexGuard<'a, ()>,
}

impl Drop for TraceLockGuard<'_> {
    fn drop(&mut self) {
        with_graph(|g| g.holder.remove(&self.id));
    }
}

/// Waiting for this lock would never end: its holder waits, directly or
/// through other threads, for a lock this thread holds.
pub(crate) struct WouldDeadlock;

/// Takes `lock`, waiting while another thread holds it, unless the wait
/// would close a cycle of threads waiting for each other's trace locks.
pub(crate) fn acquire(lock: &Mutex<()>) -> Result<TraceLockGuard<'_>, WouldDeadlock> {
    let id = lock as *const Mutex<()> as usize;
    let me = std::thread::current().id();
    let mut pause = Duration::from_micros(20);
    loop {
        let guard = match lock.try_lock() {
            Ok(g) => Some(g),
            // A panic while tracing is caught and reported; the lock only
            // guards "one trace at a time", so a poisoned one is still usable.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(g) = guard {
            with_graph(|w| {
                w.waiting.remove(&me);
                w.holder.insert(id, me);
            });
            return Ok(TraceLockGuard { id, _guard: g });
        }
        let cycle = with_graph(|w| {
            w.waiting.insert(me, id);
            // Follow holder -> the lock it waits for -> its holder ...
            let mut lock_id = id;
            for _ in 0..=w.holder.len() {
                let Some(&t) = w.holder.get(&lock_id) else { return false };
                if t == me {
                    return true;
                }
                let Some(&next) = w.waiting.get(&t) else { return false };
                lock_id = next;
            }
            false
        });
        if cycle {
            with_graph(|w| w.waiting.remove(&me));
            return Err(WouldDeadlock);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
