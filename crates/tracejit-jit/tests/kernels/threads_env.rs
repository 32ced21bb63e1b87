//! `TRACEJIT_NUM_THREADS` sets the default thread count; a bad value is
//! ignored with a warning naming the variable and the value. The
//! environment is read once per process, so each case runs this binary
//! again as a child with the variable set (`child_reports_the_count`
//! alone: the parent changes nothing process-wide, so these tests share
//! the kernels' binary).

use std::process::Command;
use std::sync::Mutex;

/// Collects `log` warnings.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.level() <= log::Level::Warn {
            self.0.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

/// Run by `the_environment_sets_the_default` in a child process with
/// `CHILD_EXPECT` set (`threads;warning`); without it there is nothing to
/// check.
#[test]
fn child_reports_the_count() {
    let Ok(expect) = std::env::var("CHILD_EXPECT") else { return };
    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let (threads, warning) = expect.split_once(';').unwrap();
    assert_eq!(tracejit_jit::threads::num_threads().to_string(), threads);
    let warnings = CAPTURE.0.lock().unwrap().clone();
    if warning.is_empty() {
        assert!(warnings.is_empty(), "unexpected warnings: {warnings:?}");
    } else {
        assert!(warnings.iter().any(|w| w.contains(warning)), "no warning containing {warning:?}: {warnings:?}");
    }
}

#[test]
fn the_environment_sets_the_default() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let cases: [(&str, &str, &str); 6] = [
        ("3", "3", ""),
        (" 2 ", "2", ""),
        ("lots", &cores, "TRACEJIT_NUM_THREADS=\"lots\" is not a thread count"),
        ("0", &cores, "TRACEJIT_NUM_THREADS=\"0\" is not a thread count"),
        ("-4", &cores, "expected a positive integer"),
        ("100000", &cores, "more than 1024 threads"),
    ];
    let exe = std::env::current_exe().unwrap();
    let child = crate::common::test_name(module_path!(), "child_reports_the_count");
    for (value, threads, warning) in cases {
        let out = Command::new(&exe)
            .args([child.as_str(), "--exact", "--test-threads=1"])
            .env("TRACEJIT_NUM_THREADS", value)
            .env("CHILD_EXPECT", format!("{threads};{warning}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "TRACEJIT_NUM_THREADS={value:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child really ran the check (not filtered out).
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{value:?}: the child test did not run");
    }
    // Unset: the cores available.
    let out = Command::new(&exe)
        .args([child.as_str(), "--exact"])
        .env_remove("TRACEJIT_NUM_THREADS")
        .env("CHILD_EXPECT", format!("{cores};"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "unset: the child test did not run");
}
