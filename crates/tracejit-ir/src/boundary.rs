//! The boundaries where tracejit turns a panic into an `Err`, quietly.
//!
//! An op misused inside a traced closure panics (with the op, the types and
//! the user's line), and `Function::call` returns that message as an `Err`.
//! Rust's default panic hook would still print `thread 'main' panicked at
//! ...` (and a backtrace under `RUST_BACKTRACE=1`) before the unwind reaches
//! the boundary, so a user would see a crash report for an error they
//! handled. [`catch_quietly`] is the one way tracejit catches panics: it
//! marks the thread as inside a boundary while `f` runs, and the panic hook
//! (wrapped once per process, the first time a boundary is entered) says
//! nothing for a panic raised there. Outside every boundary, and on other
//! threads, the previous hook runs unchanged, so panics tracejit does not
//! catch still print as before.
//!
//! A kernel that fails on the values it is given (an out-of-range `gather`
//! index) panics without knowing which node of which graph it ran for. The
//! interpreter and the executor note the source line of each node before it
//! runs ([`note_running`]), so the boundary that catches the panic can name
//! the user's line ([`running_location`]): one store per node, instead of
//! a `catch_unwind` around each.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};
use std::sync::Once;

thread_local! {
    /// How many boundaries this thread is inside.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The source line of the node this thread runs (or ran last).
    static RUNNING: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// Notes that the node recorded at `location` runs now on this thread
/// (called by the interpreter and the executor before each node).
#[inline]
pub fn note_running(location: Option<&'static Location<'static>>) {
    RUNNING.with(|r| r.set(location));
}

/// The source line of the node this thread ran last (see [`note_running`]):
/// after a graph's run panicked, the node that failed. Taking it clears it.
pub fn running_location() -> Option<&'static Location<'static>> {
    RUNNING.with(|r| r.take())
}

static WRAP_HOOK: Once = Once::new();

/// Wraps the current panic hook (once): panics inside a boundary are
/// silent, every other panic goes to the hook that was installed before.
fn wrap_hook() {
    WRAP_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `try_with`: a panic while the thread-local is being torn down
            // is not ours to hide.
            if DEPTH.try_with(Cell::get).unwrap_or(0) == 0 {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(payload)` without printing anything.
/// Nested boundaries are fine; a panic that `f` catches itself (with its own
/// `catch_unwind`) is silent too, since it was raised inside the boundary.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> Result<T, Box<dyn Any + Send>> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    // The hook cannot be replaced while this thread unwinds (a boundary
    // entered from a destructor); it is wrapped by the next boundary then.
    if !std::thread::panicking() {
        wrap_hook();
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    catch_unwind(AssertUnwindSafe(f))
}

/// True while this thread runs inside a [`catch_quietly`] boundary.
pub fn in_boundary() -> bool {
    DEPTH.with(Cell::get) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_becomes_its_payload_and_the_depth_unwinds() {
        let r = catch_quietly(|| -> i32 { panic!("inside: {}", 7) });
        assert_eq!(crate::panic_message(&*r.unwrap_err()), "inside: 7");
        assert!(!in_boundary());
        let nested = catch_quietly(|| {
            assert!(in_boundary());
            catch_quietly(|| panic!("inner")).is_err()
        });
        assert_eq!(nested.ok(), Some(true));
        assert!(!in_boundary());
        assert_eq!(catch_quietly(|| 3).ok(), Some(3));
    }
}
