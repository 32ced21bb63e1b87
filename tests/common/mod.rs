//! Helpers shared by the integration tests that declare `mod common;`.

use tracejit::prelude::*;

/// W8's arguments from `seed`: `xs [steps, batch, k]`, `wx [k, hidden]`,
/// `wh [hidden, hidden]` and `b [hidden]`, with `special` (a NaN or an
/// infinity) written over one element of `xs` when given.
pub fn rnn_args(
    (steps, batch, k, hidden): (usize, usize, usize, usize),
    seed: u64,
    special: Option<f32>,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let mut x = Tensor::randn(&[steps, batch, k], seed).to_vec::<f32>().unwrap();
    if let (Some(v), false) = (special, x.is_empty()) {
        let i = seed as usize % x.len();
        x[i] = v;
    }
    let xs = Tensor::from_vec(x, &[steps, batch, k]);
    let wx = Tensor::randn(&[k, hidden], seed + 1) * 0.5;
    let wh = Tensor::randn(&[hidden, hidden], seed + 2) * 0.5;
    let b = Tensor::randn(&[hidden], seed + 3) * 0.1;
    (xs, wx, wh, b)
}

/// Runs the test `case` of this test binary again in a child process
/// (`--exact case`, with the variables `env` set, so the case knows it is
/// the child), killing it after `timeout`: for cases that may hang or
/// abort the process. Returns the child's exit status (`None`: killed at
/// the timeout) and its stderr.
#[allow(dead_code, reason = "row_loops.rs shares this file and runs no child")]
pub fn run_child(
    case: &str,
    env: &[(&str, &str)],
    timeout: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String) {
    use std::io::Read;
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", case, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the test binary runs");
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited on") {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (status, reader.join().unwrap_or_default())
}
