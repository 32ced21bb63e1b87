//! The distributed tests: run by `.ci/run` as `mpiexec -n 2 <this binary>`
//! (any number of ranks of at least two works). Every rank runs the same
//! checks in the same order (collectives match by order). Each rank judges
//! its own checks: rank 0 prints one line per check and the closing
//! `N passed, M failed` line, another rank prints only what failed there
//! (and its own closing line), and a rank with a failure exits non-zero,
//! which makes `mpiexec` exit non-zero.
//!
//! Outside a launcher this is a world of one, and the program fails: these
//! checks exist to exercise real communication, and a CI that forgot the
//! launcher must not pass silently. Arguments: names (substrings) select
//! checks; `--no-faults` leaves out the fault checks (they leave the world
//! unusable, so they always run last) and `--faults` runs only them, but
//! for the one in which the last rank crashes: `--dead-rank` runs it alone,
//! as a launch of its own under `mpiexec -disable-auto-cleanup` whose exit
//! status reports the crash (the survivors' lines say whether they passed).

mod collectives;
mod faults;
mod gradients;
mod training;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use tracejit_distributed::{self as distributed, World};

/// One check: its name and body (panics on failure).
type Check = (&'static str, fn(World));

fn checks() -> Vec<Check> {
    let mut all: Vec<Check> = Vec::new();
    all.extend(collectives::checks());
    all.extend(gradients::checks());
    all.extend(training::checks());
    all.extend(faults::checks()); // last: they break the world
    all
}

fn main() {
    let world = match distributed::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("init failed: {e}");
            std::process::exit(1);
        }
    };
    if world.size() < 2 {
        eprintln!(
            "the distributed tests need at least two ranks: run them as `mpiexec -n 2 {}` (this is a world of one)",
            std::env::args().next().unwrap_or_default()
        );
        std::process::exit(1);
    }
    distributed::set_timeout(Duration::from_secs(60));
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dies = |name: &str| name.contains("dead");
    let faults = |name: &str| name.contains("timeout") || dies(name);
    let flag = |f: &str| args.iter().any(|a| a == f);
    let wanted = |name: &str| {
        let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        let by_name = filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
        let by_kind = if dies(name) {
            flag("--dead-rank")
        } else if faults(name) {
            !flag("--no-faults") && !flag("--dead-rank")
        } else {
            !flag("--faults") && !flag("--dead-rank")
        };
        by_name && by_kind
    };
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in checks() {
        if !wanted(name) {
            continue;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| check(world)));
        // Each rank judges its own checks: a rank whose check panicked part
        // way skipped that check's remaining collectives, and an agreement
        // by collective could then be matched with one of them by MPI.
        match &outcome {
            Ok(()) => passed += 1,
            Err(p) => {
                failed += 1;
                let msg =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                eprintln!("[rank {}] {name}: FAILED: {}", world.rank(), msg.unwrap_or_default());
            }
        }
        if world.is_root() || outcome.is_err() {
            let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
            println!("test {name} ... {verdict} (rank {})", world.rank());
        }
    }
    if world.is_root() || failed > 0 {
        println!("{passed} passed, {failed} failed");
    }
    std::process::exit(if failed == 0 && passed > 0 { 0 } else { 1 });
}

/// Deterministic values that differ by rank and seed: every rank can
/// compute every other rank's inputs, so expected results are computed
/// locally. `specials` puts an infinity and a signed zero in.
pub fn values(rank: usize, seed: u64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let k = (rank as u64 + 1) * 7919 + seed * 104_729 + i as u64 * 31;
            let u = ((k.wrapping_mul(2_654_435_761) >> 7) % 20_000) as f64 / 10_000.0 - 1.0;
            u * (1.0 + i as f64 / 3.0)
        })
        .collect()
}
