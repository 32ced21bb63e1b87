//! Logging: every trace is logged at `info` with its reason; the "traced N
//! times" warning comes at the 5th trace and then at powers of two (6
//! times in a 200-shape loop, not 196); without a `log` backend that
//! warning goes to stderr, as TensorFlow prints its own.
//!
//! A logger is process-wide, hence a binary of its own. The case without a
//! backend runs this binary again as a child (`TRACEJIT_LOGGING_CHILD`) and
//! reads its stderr.

use std::process::Command;
use std::sync::Mutex;

use tracejit::prelude::*;

static RECORDS: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        RECORDS.lock().unwrap().push((r.level(), r.target().to_string(), r.args().to_string()));
    }
    fn flush(&self) {}
}

fn in_child() -> bool {
    std::env::var_os("TRACEJIT_LOGGING_CHILD").is_some()
}

/// Calls `f` with `n` lengths of a 1-D f32 tensor: one trace each.
fn call_with_lengths(f: &Function<Tensor, Tensor>, n: usize) {
    for len in 1..=n {
        f.call(Tensor::ones(&[len], DType::F32)).unwrap();
    }
}

#[test]
fn every_trace_at_info_and_the_warning_rate_limited() {
    if in_child() {
        return;
    }
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let f = function(|x: Tensor| x.exp()).name("many_shapes");
    call_with_lengths(&f, 200);
    let records = RECORDS.lock().unwrap().clone();
    let ours = |level| -> Vec<String> {
        records.iter().filter(|(l, _, m)| *l == level && m.contains("`many_shapes`")).map(|r| r.2.clone()).collect()
    };
    let infos = ours(log::Level::Info);
    assert_eq!(infos.iter().filter(|m| m.contains("tracing `many_shapes`")).count(), 200);
    assert!(infos[1].contains("(trace #2): argument 0: shape [1] -> [2]"), "{}", infos[1]);
    let (warnings, evictions): (Vec<String>, Vec<String>) =
        ours(log::Level::Warn).into_iter().partition(|m| m.contains("has been traced"));
    // Past DEFAULT_MAX_TRACES (64) the cache evicts, warning once.
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    let counts: Vec<&str> = warnings.iter().map(|m| m.split("traced ").nth(1).unwrap_or("")).collect();
    assert_eq!(warnings.len(), 6, "{counts:?}");
    for (w, n) in warnings.iter().zip([5, 8, 16, 32, 64, 128]) {
        assert!(w.contains(&format!("has been traced {n} times")), "{w}");
        assert!(w.contains("input_signature") && w.contains("reduce_retracing"), "{w}");
    }
    // tracejit's messages carry its crates' targets, which RUST_LOG=tracejit=info selects.
    assert!(records.iter().filter(|r| r.2.contains("many_shapes")).all(|r| r.1.starts_with("tracejit")));

    // A function traced per shape on purpose opts out of the warning, not
    // of the info lines.
    let quiet = function(|x: Tensor| x.exp()).name("bucketed").warn_on_retrace(false);
    call_with_lengths(&quiet, 20);
    let records = RECORDS.lock().unwrap().clone();
    let about = |level| records.iter().filter(|(l, _, m)| *l == level && m.contains("`bucketed`")).count();
    assert_eq!((about(log::Level::Info), about(log::Level::Warn)), (20, 0));
}

/// The child of `without_a_backend_the_warning_goes_to_stderr`.
#[test]
fn child_without_a_backend() {
    if !in_child() {
        return;
    }
    let f = function(|x: Tensor| x.exp()).name("no_backend");
    call_with_lengths(&f, 9);
}

#[test]
fn without_a_backend_the_warning_goes_to_stderr() {
    if in_child() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_without_a_backend", "--nocapture", "--test-threads=1"])
        .env("TRACEJIT_LOGGING_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("`no_backend` has been traced").count(), 2, "{stderr}");
    assert!(stderr.contains("traced 5 times") && stderr.contains("traced 8 times"), "{stderr}");
    assert!(stderr.contains("RUST_LOG=tracejit=info"), "{stderr}");
}
