//! A wrong result must fail the harness instead of producing a figure: at the
//! verification function, at the per-workload runner, and for the binary's
//! exit code.

use std::process::Command;
use std::time::Duration;

use tracejit::{DType, Tensor};
use tracejit_bench::runner::perturb;
use tracejit_bench::workloads::{Body, Case, Mode, STANDARD_MODES};
use tracejit_bench::{check_tensors, run_workload, Budget, OutputValues, RunConfig, Status, Tolerance, WorkloadSpec};

const TINY: Budget = Budget { warmup: Duration::from_millis(1), measure: Duration::from_millis(2) };

fn cfg() -> RunConfig {
    RunConfig { budget: TINY, threads: 1, inject_wrong_result: None }
}

#[test]
fn the_verification_function_rejects_a_wrong_result() {
    let x = Tensor::randn(&[256], 9);
    let want = OutputValues::from_tensors(std::slice::from_ref(&x)).unwrap();
    assert!(check_tensors(&want, std::slice::from_ref(&x), Tolerance::EXACT_CHAIN).is_ok());

    let wrong = perturb(std::slice::from_ref(&x));
    let err = check_tensors(&want, &wrong, Tolerance::EXACT_CHAIN).unwrap_err();
    assert!(err.message.contains("output 0, element 0"), "{err}");
    // Even the loose tolerance catches a 1% error.
    assert!(check_tensors(&want, &wrong, Tolerance::TRANSCENDENTAL).is_err());
    // A wrong shape or a missing output is caught too.
    assert!(check_tensors(&want, &[x.reshape(&[16, 16])], Tolerance::TRANSCENDENTAL).is_err());
    assert!(check_tensors(&want, &[], Tolerance::TRANSCENDENTAL).is_err());
    assert!(check_tensors(&want, &[x.cast(DType::F64)], Tolerance::TRANSCENDENTAL).is_err());
}

/// A closure that computes something else while traced: its traced modes
/// give a wrong result.
fn wrong_when_traced(x: Tensor) -> Tensor {
    if x.is_symbolic() {
        &x * 2.0
    } else {
        &x * 1.0
    }
}

fn wrong_spec() -> WorkloadSpec {
    WorkloadSpec {
        id: "T1",
        name: "wrong_when_traced",
        what: "x * 1 eagerly, x * 2 traced",
        tolerance: Tolerance::TRANSCENDENTAL,
        tolerance_note: "",
        floor_bytes: None,
        modes: STANDARD_MODES,
        low_precision: Tolerance::BF16,
        build: || Body::Runnable(Box::new(Case::new("wrong_when_traced", Tensor::randn(&[64], 3), wrong_when_traced))),
    }
}

#[test]
fn a_wrong_traced_result_fails_the_workload_without_a_figure() {
    let rows = run_workload(&wrong_spec(), &cfg(), &mut |_, _| {});
    assert_eq!(rows.len(), 3);
    assert!(matches!(rows[0].status, Status::Measured { .. }), "eager is fine: {:?}", rows[0].status);
    let interp = &rows[1];
    assert_eq!(interp.mode, Mode::TracedInterp);
    match &interp.status {
        Status::Failed(reason) => assert!(reason.contains("wrong result"), "{reason}"),
        other => panic!("a wrong traced result must fail, got {other:?}"),
    }
    assert!(interp.timing().is_none());
}

#[test]
fn an_injected_wrong_result_fails_a_real_workload() {
    let spec = tracejit_bench::workloads::selected(Some("small_ops")).remove(0);
    let mut c = cfg();
    let ok = run_workload(&spec, &c, &mut |_, _| {});
    assert!(ok.iter().all(|r| !r.failed()), "{ok:?}");
    c.inject_wrong_result = Some("small_ops".to_string());
    let rows = run_workload(&spec, &c, &mut |_, _| {});
    let interp = rows.iter().find(|r| r.mode == Mode::TracedInterp).unwrap();
    assert!(interp.failed(), "{:?}", interp.status);
}

#[test]
fn the_binary_exits_non_zero_on_a_wrong_result() {
    let bin = env!("CARGO_BIN_EXE_tracejit-bench");
    let run = |extra: &[&str]| {
        Command::new(bin)
            .args(["--quick", "--json", "--no-report", "--filter", "small_ops"])
            .args(extra)
            .output()
            .expect("run tracejit-bench")
    };
    let good = run(&[]);
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(stdout.lines().any(|l| l.contains("\"workload\":\"floor_bandwidth\"")), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains("\"mode\":\"traced-interp\"") && l.contains("\"median_us\":")));

    let bad = run(&["--inject-wrong-result", "small_ops"]);
    assert!(!bad.status.success(), "a wrong result must fail the run");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("FAILED"), "{stderr}");
    let stdout = String::from_utf8_lossy(&bad.stdout);
    let line = stdout.lines().find(|l| l.contains("\"mode\":\"traced-interp\"")).expect("a traced-interp line");
    assert!(line.contains("\"status\":\"failed\"") && line.contains("\"median_us\":null"), "{line}");
}

/// Each workload's tolerance must leave room for legitimate f32 rounding: the
/// eager f32 result must pass against a float64 evaluation of the same
/// closure with half the tolerance (a JIT result, off by about as much on the
/// other side, then still passes against eager). The imported model files
/// (`MODEL_WORKLOADS`) declare f32 inputs, so they have no f64 evaluation:
/// tracejit-onnx's and tracejit-models' real-model tests check them against
/// ONNX Runtime instead.
#[test]
fn tolerances_leave_room_for_f32_rounding() {
    let models = tracejit_bench::workloads::MODEL_WORKLOADS;
    for spec in tracejit_bench::workloads::all().into_iter().filter(|s| !models.contains(&s.name)) {
        let Body::Runnable(case) = (spec.build)() else { continue };
        let f32_result = OutputValues::from_tensors(&case.eager_call().unwrap()).unwrap();
        let f64_result = OutputValues::from_tensors(&case.eager_call_f64().unwrap()).unwrap();
        let half = Tolerance {
            rtol: spec.tolerance.rtol / 2.0,
            atol: spec.tolerance.atol / 2.0,
            abs: spec.tolerance.abs / 2.0,
            row_cosine: 0.0,
        };
        match tracejit_bench::check_outputs(&f64_result, &f32_result, half) {
            Ok(a) => {
                eprintln!("{}: f32 vs f64 max abs {:.2e}, max rel {:.2e}", spec.name, a.max_abs_err, a.max_rel_err)
            }
            Err(m) => panic!("{}: the f32 result is not within half the tolerance of f64: {m}", spec.name),
        }
    }
}

/// W7's selector-off configuration traces and agrees with eager (run by the
/// interpreter here, so the check does not depend on the JIT being wired).
#[test]
fn lstm_with_the_selector_off_agrees_with_eager() {
    use tracejit_bench::workloads::lstm_step;
    let args = (
        Tensor::randn(&[8, 16], 1),
        Tensor::randn(&[8, 16], 2),
        Tensor::randn(&[8, 16], 3),
        Tensor::randn(&[16, 64], 4) * 0.25,
        Tensor::randn(&[16, 64], 5) * 0.25,
        Tensor::randn(&[64], 6) * 0.1,
    );
    let want = lstm_step(args.clone());
    let want = OutputValues::from_tensors(&[want.0, want.1]).unwrap();
    for selector in [true, false] {
        let f = tracejit::function(lstm_step).jit(false).selector(selector);
        let (h, c) = f.call(args.clone()).unwrap();
        check_tensors(&want, &[h, c], Tolerance::TRANSCENDENTAL).unwrap_or_else(|m| panic!("selector {selector}: {m}"));
    }
}
