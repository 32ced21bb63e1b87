//! Work in flight that advances only when polled: a non-blocking
//! collective started by one node and finished by a later one (MPI moves
//! a message of MPICH's shared-memory or TCP transports only inside MPI
//! calls). Executors call [`poll`] between steps; while any such work is
//! in flight ([`started`] / [`finished`]) it calls the hook the crate that
//! started it registered ([`set_hook`]), so the transfer proceeds while
//! the steps in between compute instead of all at once in the wait.
//!
//! With nothing in flight a poll is one relaxed atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static HOOK: OnceLock<fn()> = OnceLock::new();

/// Registers the function [`poll`] calls while work is in flight; the
/// first registration wins (one crate owns the work: `tracejit::
/// distributed`). Returns whether `hook` is the registered one.
pub fn set_hook(hook: fn()) -> bool {
    *HOOK.get_or_init(|| hook) as usize == hook as usize
}

/// Notes one piece of work started (polled until [`finished`]).
pub fn started() {
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
}

/// Notes one piece of work finished (or abandoned).
pub fn finished() {
    // Saturating: a stray call must not make every later poll run the hook.
    let _ = IN_FLIGHT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
}

/// How many pieces of work are in flight.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Relaxed)
}

/// Lets work in flight advance: calls the hook when there is any.
#[inline]
pub fn poll() {
    if IN_FLIGHT.load(Ordering::Relaxed) > 0 {
        if let Some(hook) = HOOK.get() {
            hook();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static POLLS: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        POLLS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn the_hook_runs_only_while_work_is_in_flight() {
        assert!(set_hook(count));
        poll();
        assert_eq!(POLLS.load(Ordering::Relaxed), 0);
        started();
        poll();
        poll();
        finished();
        poll();
        assert_eq!(POLLS.load(Ordering::Relaxed), 2);
        finished();
        assert_eq!(in_flight(), 0, "a stray finish saturates at zero");
    }
}
