//! Shadow-eager validation: `Function::validate(true)` (or
//! `TRACEJIT_VALIDATE=1`) runs the graph as traced in the interpreter next
//! to every call and turns a difference into an error naming the first
//! differing node, the pass, the user's line and the largest difference;
//! correct programs validate on random inputs of odd sizes; composite
//! kernels and backward kernels are checked against their bodies.

use std::process::Command;

use proptest::prelude::*;
use tracejit::prelude::*;

const THIS_FILE: &str = "validation.rs";

/// The line of this file that contains `needle` (once; the lines asking
/// for it do not count).
fn line_of(needle: &str) -> u32 {
    let hits: Vec<usize> = include_str!("validation.rs")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle) && !l.contains("line_of("))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "`{needle}` must be on exactly one line");
    hits[0] as u32 + 1
}

fn ramp(n: usize, scale: f32) -> Tensor {
    Tensor::from_vec((0..n).map(|i| (i as f32 * 0.37 - 1.1) * scale).collect(), &[n])
}

/// A program mixing approximated transcendentals, reductions, a matrix
/// product, a composite with a native kernel and a variable update.
fn mixed(counter: Variable) -> impl Fn((Tensor, Tensor)) -> (Tensor, Tensor) + Send + Sync + Clone + 'static {
    move |(x, w): (Tensor, Tensor)| {
        let h = (x.matmul(&w) * 0.5).tanh() + (x.sum(&[-1], true) * 0.1).exp();
        let p = tracejit::nn::softmax(&h, -1);
        counter.assign_add(&Tensor::ones(&[], DType::F32));
        (p.log().mean(&[0], false), (h.sigmoid() - 0.5).abs().max(&[-1], false))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// No false alarms: a correct program validates, compiled and
    /// interpreted, on random inputs of sizes 0, 1, 3 and 5, and the
    /// reference run does not update the variable a second time.
    #[test]
    fn correct_programs_validate(rows in prop::sample::select(vec![0usize, 1, 3, 5]), k in 1usize..6,
                                 n in prop::sample::select(vec![1usize, 3, 5]), scale in 0.1f32..2.0, jit: bool) {
        let counter = Variable::new(Tensor::zeros(&[], DType::F32));
        let f = function(mixed(counter.clone())).validate(true).jit(jit);
        let x = Tensor::from_vec((0..rows * k).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3 * scale).collect(), &[rows, k]);
        let w = Tensor::from_vec((0..k * n).map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.2 * scale).collect(), &[k, n]);
        for step in 1..=2 {
            let (a, b) = f.call((x.clone(), w.clone())).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let (ea, eb) = mixed(Variable::new(Tensor::zeros(&[], DType::F32)))((x.clone(), w.clone()));
            prop_assert_eq!(a.shape(), ea.shape());
            prop_assert_eq!(b.shape(), eb.shape());
            prop_assert_eq!(counter.value().to_vec::<f32>().unwrap(), vec![step as f32]);
        }
    }
}

#[test]
fn nan_and_inf_propagate_without_a_false_alarm() {
    let f = function(|x: Tensor| ((&x * 2.0).exp() - 1.0).sqrt().sum(&[0], false)).validate(true);
    let x = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, -1.0, 0.5, 100.0], &[5]);
    let out = f.call(x).unwrap();
    assert!(out.to_vec::<f32>().unwrap()[0].is_nan());
}

#[test]
fn a_wrong_composite_kernel_is_named_with_the_pass_and_the_line() {
    tracejit::composite::register_kernel("example.validate.off_by_one_percent", |x: &[Tensor]| {
        vec![(&x[0] * 2.0 + 1.0) * 1.01]
    });
    let composite = function(|x: Tensor| &x * 2.0 + 1.0).implements("example.validate.off_by_one_percent");
    let f = function(move |x: Tensor| composite.call(x.exp()).unwrap().sum(&[0], false)).name("uses_kernel");
    let x = ramp(5, 1.0);
    // Unvalidated, the wrong number comes back silently.
    assert!(f.call(x.clone()).is_ok());
    let e = f.clone().validate(true).call(x).unwrap_err();
    let msg = e.to_string();
    let line = line_of("move |x: Tensor| composite.call(x.exp())");
    for needle in [
        "function `uses_kernel`: validation: output 0 differs",
        "largest difference",
        "composite kernel `example.validate.off_by_one_percent`",
        "differs from its body",
        "produced by pass `selector`",
        &format!("{THIS_FILE}:{line}"),
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(matches!(e, Error::Validation { .. }));
}

#[test]
fn a_correct_kernel_passes_and_register_kernel_checked_refuses_a_wrong_one() {
    let specs = [TensorSpec::new(DType::F32, &[-1, 4])];
    let body = |x: &[Tensor]| vec![(&x[0] * 0.5).tanh().sum(&[-1], true)];
    let wrong = tracejit::composite::register_kernel_checked("example.validate.halftanh", &specs, body, |x| {
        vec![(&x[0] * 0.5).sum(&[-1], true)]
    });
    let msg = wrong.unwrap_err();
    assert!(msg.contains("example.validate.halftanh") && msg.contains("not registered"), "{msg}");
    assert!(msg.contains("differs from the body") && msg.contains("largest difference"), "{msg}");
    assert!(!tracejit::composite::registered_kernels().contains(&"example.validate.halftanh".to_string()));
    tracejit::composite::register_kernel_checked("example.validate.halftanh", &specs, body, move |x| body(x)).unwrap();
    let composite = function(move |x: Tensor| body(&[x]).remove(0)).implements("example.validate.halftanh");
    let f = function(move |x: Tensor| composite.call(x).unwrap() * 3.0).validate(true);
    f.call(Tensor::ones(&[3, 4], DType::F32)).unwrap();
    let cf = &f.concrete_functions()[0];
    assert!(cf.optimized_graph().to_string().contains("kernel[\"example.validate.halftanh\"]"));
}

#[test]
fn a_wrong_backward_kernel_is_checked_against_the_bodys_vjp() {
    // The registered backward is 10x the true gradient of x^2.
    tracejit::composite::register_gradient("example.validate.square", |inputs: &[Tensor], _outs: &[Tensor], cts| {
        vec![cts[0].as_ref().map(|g| g * &inputs[0] * 20.0)]
    });
    let square = function(|x: Tensor| &x * &x).implements("example.validate.square");
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = square.call(x.clone()).unwrap().sum(&[0], false);
        match tape.gradient(&y, &[&x]) {
            Ok(g) => g[0].clone().unwrap(),
            Err(e) => panic!("{e}"),
        }
    });
    let x = ramp(3, 1.0);
    // Without validation the registered kernel is trusted.
    assert!(f.call(x.clone()).is_ok());
    let msg = f.clone().validate(true).call(x).unwrap_err().to_string();
    assert!(msg.contains("backward kernel registered for `example.validate.square` differs from the VJP"), "{msg}");
    assert!(msg.contains("largest difference"), "{msg}");
}

/// Runs the test `case` of this binary in a child with `TRACEJIT_VALIDATE=1`.
fn run_child(case: &str) -> (bool, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", case, "--nocapture", "--test-threads=1"])
        .env("TRACEJIT_VALIDATE_CHILD", "1")
        .env("TRACEJIT_VALIDATE", "1")
        .output()
        .expect("the test binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn child_env_validation() {
    if std::env::var_os("TRACEJIT_VALIDATE_CHILD").is_none() {
        return;
    }
    tracejit::composite::register_kernel("example.validate.env_wrong", |x: &[Tensor]| vec![&x[0] + 0.5]);
    let composite = function(|x: Tensor| x.abs()).implements("example.validate.env_wrong");
    let c2 = composite.clone();
    let f = function(move |x: Tensor| composite.call(x).unwrap() * 2.0);
    let e = f.call(ramp(4, 1.0)).unwrap_err();
    assert!(e.to_string().contains("composite kernel `example.validate.env_wrong`"), "{e}");
    // An explicit `validate(false)` wins over the environment.
    let quiet = function(move |x: Tensor| c2.call(x).unwrap() * 2.0).validate(false);
    quiet.call(ramp(4, 1.0)).unwrap();
    // Eager tapes check registered backward kernels too.
    tracejit::composite::register_gradient("example.validate.env_cube", |inputs: &[Tensor], _outs: &[Tensor], cts| {
        vec![cts[0].as_ref().map(|g| g * &inputs[0] * &inputs[0])]
    });
    let cube = function(|x: Tensor| &x * &x * &x).implements("example.validate.env_cube");
    let x = ramp(3, 1.0);
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = cube.call(x.clone()).unwrap().sum(&[0], false);
    let e = tape.gradient(&y, &[&x]).unwrap_err().to_string();
    assert!(e.contains("backward kernel registered for `example.validate.env_cube`"), "{e}");
    eprintln!("child done");
}

#[test]
fn tracejit_validate_1_validates_every_function() {
    if std::env::var_os("TRACEJIT_VALIDATE_CHILD").is_some() {
        return;
    }
    let (ok, stderr) = run_child("validation::child_env_validation");
    assert!(ok && stderr.contains("child done"), "the child failed:\n{stderr}");
}
