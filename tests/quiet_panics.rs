//! Panics that tracejit catches and returns as an `Err` print nothing;
//! panics it does not catch still print as before.
//!
//! What a panic prints goes to the process's stderr, which a test cannot
//! read from inside, so each case runs this test binary again as a child
//! (`--exact <case> --nocapture`, with `TRACEJIT_QUIET_CHILD` set so the
//! case acts) and checks the child's stderr.

use std::process::Command;

use tracejit::prelude::*;

/// Runs the test `case` of this binary in a child process (with
/// `RUST_BACKTRACE=1`) and returns (success, stderr).
fn run_child(case: &str) -> (bool, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", case, "--nocapture", "--test-threads=1"])
        .env("TRACEJIT_QUIET_CHILD", "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the test binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn in_child() -> bool {
    std::env::var_os("TRACEJIT_QUIET_CHILD").is_some()
}

/// The child of `caught_errors_print_nothing`: misused ops while tracing,
/// while running eagerly, inside a kernel at run time, and a user panic.
#[test]
fn child_caught_errors() {
    if !in_child() {
        return;
    }
    let bad_add = function(|(a, b): (Tensor, Tensor)| &a + &b).name("bad_add");
    let e = bad_add.call((Tensor::zeros(&[3, 4], DType::F32), Tensor::zeros(&[5], DType::F32))).unwrap_err();
    assert!(e.to_string().contains("cannot broadcast [3, 4] with [5]"), "{e}");
    let user = function(|x: Tensor| -> Tensor { panic!("user bug with {}", x.rank()) });
    assert!(user.call(Tensor::zeros(&[2], DType::F32)).is_err());
    tracejit::config::run_functions_eagerly(true);
    let e = bad_add.call((Tensor::zeros(&[3, 4], DType::F32), Tensor::zeros(&[5], DType::F32))).unwrap_err();
    tracejit::config::run_functions_eagerly(false);
    assert!(e.to_string().contains("while running eagerly"), "{e}");
    assert!(!e.to_string().contains("while tracing"), "{e}");
    // Unknown dims: the broadcast fails when the graph runs.
    let late = function(|(a, b): (Tensor, Tensor)| &a + &b)
        .input_signature(vec![TensorSpec::new(DType::F32, &[-1]), TensorSpec::new(DType::F32, &[-1])]);
    assert!(late.call((Tensor::zeros(&[3], DType::F32), Tensor::zeros(&[4], DType::F32))).is_err());
    eprintln!("child done");
}

#[test]
fn caught_errors_print_nothing() {
    if in_child() {
        return;
    }
    let (ok, stderr) = run_child("child_caught_errors");
    assert!(ok, "the child failed:\n{stderr}");
    assert!(stderr.contains("child done"), "the child did not run:\n{stderr}");
    assert!(!stderr.contains("panicked"), "a caught panic printed:\n{stderr}");
    assert!(!stderr.contains("stack backtrace"), "a caught panic printed a backtrace:\n{stderr}");
}

/// The child of `uncaught_panics_still_print`: an op misused outside any
/// function is the user's panic, and must print as usual.
#[test]
fn child_uncaught_panic() {
    if !in_child() {
        return;
    }
    // Enter a boundary first, so the hook is wrapped.
    let f = function(|x: Tensor| x * 2.0);
    f.call(Tensor::zeros(&[2], DType::F32)).unwrap();
    let _ = Tensor::zeros(&[3, 4], DType::F32) + Tensor::zeros(&[5], DType::F32);
}

#[test]
fn uncaught_panics_still_print() {
    if in_child() {
        return;
    }
    let (ok, stderr) = run_child("child_uncaught_panic");
    assert!(!ok, "the child should have failed:\n{stderr}");
    assert!(stderr.contains("panicked at"), "an uncaught panic was hidden:\n{stderr}");
    assert!(stderr.contains("quiet_panics.rs"), "the panic should point at the user's line:\n{stderr}");
    assert!(stderr.contains("cannot broadcast [3, 4] with [5]"), "{stderr}");
}
