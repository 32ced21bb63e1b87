//! Process-wide switches. `run_functions_eagerly(true)` (or the environment
//! variable `TRACEJIT_EAGER=1`) makes every `Function` call its closure
//! directly on eager tensors, which is how a traced program is debugged.

use std::sync::atomic::{AtomicU8, Ordering};

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
