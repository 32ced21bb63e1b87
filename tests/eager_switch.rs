//! The debugging switch changes nothing but speed: with
//! `run_functions_eagerly(true)` a Function keeps its traced semantics.
//! (Regression tests for failure 3 of issue #17.)
//!
//! The switch is process-wide, so every test of this binary runs with it
//! on and states what the traced program does in its own words.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tracejit::prelude::*;

fn eager() {
    tracejit::config::run_functions_eagerly(true);
}

fn v(x: &Tensor) -> Vec<f32> {
    x.to_vec::<f32>().unwrap()
}

/// Builds a Function whose `remember`ed variable counts its calls.
fn counter() -> Function<Tensor, Tensor> {
    function(|x: Tensor| {
        let total = remember(|| Variable::new(Tensor::zeros(&[1], DType::F32)));
        total.assign_add(&x.sum(&[0], true));
        total.read()
    })
}

#[test]
fn remember_is_per_function_as_when_traced() {
    eager();
    // Traced: one variable per Function (each has its own remember table).
    let (a, b) = (counter(), counter());
    let one = Tensor::ones(&[1], DType::F32);
    assert_eq!(v(&a.call(one.clone()).unwrap()), [1.0]);
    assert_eq!(v(&a.call(one.clone()).unwrap()), [2.0]);
    assert_eq!(v(&b.call(one.clone()).unwrap()), [1.0], "b has its own variable");
    assert_eq!(v(&a.call(one).unwrap()), [3.0]);
    assert_eq!(a.tracing_count(), 0, "nothing was traced");
}

#[test]
fn a_variable_created_in_the_body_is_created_once() {
    eager();
    let created = Arc::new(AtomicUsize::new(0));
    let c = created.clone();
    // Traced: the first trace creates `acc` (initial value lifted out of the
    // graph); every call then adds to that one variable.
    let f = function(move |x: Tensor| {
        c.fetch_add(1, Ordering::SeqCst);
        let acc = Variable::new(Tensor::zeros(&[2], DType::F32));
        acc.assign_add(&x);
        acc.read()
    });
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    assert_eq!(v(&f.call(x.clone()).unwrap()), [1.0, 2.0]);
    assert_eq!(v(&f.call(x.clone()).unwrap()), [2.0, 4.0]);
    assert_eq!(v(&f.call(x).unwrap()), [3.0, 6.0]);
    assert_eq!(created.load(Ordering::SeqCst), 3, "the closure runs on every call");
}

#[test]
fn several_variables_at_one_site_keep_their_order() {
    eager();
    let f = function(|x: Tensor| {
        let vars: Vec<Variable> = (0..3).map(|i| Variable::new(Tensor::full(&[1], i as f64, DType::F32))).collect();
        for var in &vars {
            var.assign_add(&x);
        }
        Tensor::concat(&vars.iter().map(Variable::read).collect::<Vec<_>>(), 0)
    });
    let one = Tensor::ones(&[1], DType::F32);
    assert_eq!(v(&f.call(one.clone()).unwrap()), [1.0, 2.0, 3.0]);
    assert_eq!(v(&f.call(one).unwrap()), [2.0, 3.0, 4.0]);
}

#[test]
fn a_later_call_creating_a_new_variable_is_an_error() {
    eager();
    // Traced, the second shape retraces, and creating a variable on a later
    // trace is an error.
    let f = function(|x: Tensor| {
        let n = x.shape()[0];
        let vars: Vec<Variable> = (0..n).map(|_| Variable::new(Tensor::zeros(&[1], DType::F32))).collect();
        x * vars.len() as f32
    })
    .name("grows");
    f.call(Tensor::ones(&[1], DType::F32)).unwrap();
    let e = f.call(Tensor::ones(&[2], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("grows") && e.contains("later call") && e.contains("remember"), "{e}");
}

#[test]
fn the_input_signature_is_enforced() {
    eager();
    let f = function(|x: Tensor| x.relu()).input_signature(vec![TensorSpec::new(DType::F32, &[-1, 3])]);
    assert_eq!(f.call(Tensor::ones(&[2, 3], DType::F32)).unwrap().shape(), &[2, 3]);
    let e = f.call(Tensor::ones(&[2, 4], DType::F32)).unwrap_err();
    assert!(matches!(&e, Error::ArgumentMismatch { argument: 0, .. }), "{e}");
    assert!(e.to_string().contains("expected f32[?, 3], got f32[2, 4]"), "{e}");
    let e = f.call(Tensor::ones(&[3], DType::F64)).unwrap_err();
    assert!(matches!(&e, Error::ArgumentMismatch { .. }), "{e}");
}

#[test]
fn errors_say_while_running_eagerly_with_the_op_and_the_line() {
    eager();
    let f = function(|(a, b): (Tensor, Tensor)| &a + &b).name("bad_add");
    let e = f.call((Tensor::ones(&[3, 4], DType::F32), Tensor::ones(&[5], DType::F32))).unwrap_err();
    assert!(matches!(&e, Error::EagerPanic { function, .. } if function == "bad_add"), "{e}");
    let msg = e.to_string();
    for needle in ["add: cannot broadcast [3, 4] with [5]", "bad_add", "while running", "eagerly", "eager_switch.rs:"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(!msg.contains("tracing"), "{msg}");
}
