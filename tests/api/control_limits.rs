//! Control flow at its limits: loops stopped by `maximum_iterations` or a
//! `CancelToken`, loop gradients whose tracing does not grow with the trip
//! count (and a trip count too large to differentiate, an error), and
//! nesting past `MAX_NESTING` (an error, not a stack overflow). The cases
//! that would hang or abort the process run in a child process.

use tracejit::prelude::*;

use crate::control_flow::{panic_text, rnn, t, vals};

/// A loop whose condition never turns false: `x` only grows.
fn endless(opts: tracejit::WhileOptions) -> impl Fn(Tensor) -> Tensor {
    move |x: Tensor| tracejit::while_loop_with(|x: &Tensor| x.sum_all().gt(0.0), |x: Tensor| &x + 1.0, x, opts.clone())
}

#[test]
fn maximum_iterations_stops_a_loop_as_tf_does() {
    let opts = tracejit::WhileOptions::new().maximum_iterations(25);
    let traced = function(endless(opts.clone()));
    assert_eq!(vals(&traced.call(t(&[1.0, 2.0])).unwrap()), vec![26.0, 27.0]);
    assert_eq!(vals(&endless(opts.clone())(t(&[1.0, 2.0]))), vec![26.0, 27.0], "eager");
    // A loop that ends first is not affected; 0 trips return the input.
    let short = function(|x: Tensor| {
        let opts = tracejit::WhileOptions::new().maximum_iterations(1000);
        tracejit::while_loop_with(|x: &Tensor| x.sum_all().lt(10.0), |x: Tensor| &x + 1.0, x, opts)
    });
    assert_eq!(vals(&short.call(t(&[1.0])).unwrap()), vec![10.0]);
    let none = function(endless(tracejit::WhileOptions::new().maximum_iterations(0)));
    assert_eq!(vals(&none.call(t(&[3.0])).unwrap()), vec![3.0]);
}

/// The child of `a_cancel_token_stops_a_loop_that_never_ends`.
#[test]
fn child_cancelled_loops() {
    if std::env::var_os("TRACEJIT_CANCEL_CHILD").is_none() {
        return;
    }
    let token = tracejit::CancelToken::new();
    let f = function(endless(tracejit::WhileOptions::new().cancel(&token)));
    // Cancelled from another thread while the call runs.
    let canceller = {
        let token = token.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            token.cancel();
        })
    };
    let e = f.call(t(&[1.0])).unwrap_err().to_string();
    canceller.join().unwrap();
    assert!(e.contains("CancelToken was cancelled") && e.contains("control_limits.rs"), "{e}");
    // The token stays cancelled until reset; a deadline stops it again.
    assert!(f.call(t(&[1.0])).is_err());
    token.reset();
    token.cancel_after(std::time::Duration::from_millis(50));
    let e = f.call(t(&[1.0])).unwrap_err().to_string();
    assert!(e.contains("deadline passed"), "{e}");
    // Eagerly: a panic naming the token.
    token.reset();
    token.cancel();
    let got = panic_text(|| drop(endless(tracejit::WhileOptions::new().cancel(&token))(t(&[1.0]))));
    assert!(got.contains("CancelToken"), "{got}");
    eprintln!("child done");
}

/// A traced `while_loop` that never ended hung its call with no way out
/// (failure 8 of issue #28): run in a child process with a timeout.
#[test]
fn a_cancel_token_stops_a_loop_that_never_ends() {
    if std::env::var_os("TRACEJIT_CANCEL_CHILD").is_some() {
        return;
    }
    let (status, stderr) = crate::common::run_child(
        "control_limits::child_cancelled_loops",
        &[("TRACEJIT_CANCEL_CHILD", "1")],
        std::time::Duration::from_secs(120),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}

/// `rnn`'s gradients with respect to `x` and `w`, in a function.
fn rnn_grads(steps: i64) -> Function<(Tensor, Tensor), (Tensor, Tensor)> {
    function(move |(x, w): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&x);
        tape.watch(&w);
        let y = rnn(&x, &w, steps);
        let g = tape.gradient(&y, &[&x, &w]).unwrap();
        (g[0].clone().unwrap(), g[1].clone().unwrap())
    })
}

/// The VJP of a fori_loop unrolled every trip into the graph: 10k trips
/// took 17 s and +165 MB to trace. It is two loops now: the traced graph
/// is the same size for any trip count.
#[test]
fn tracing_a_loop_gradient_costs_the_same_for_any_trip_count() {
    let x = Tensor::from_vec(vec![0.1f64, -0.3, 0.2, 0.4, 0.0, -0.1], &[2, 3]);
    let w = Tensor::from_vec(vec![0.5f64, -0.2, 0.1, 0.3, 0.4, -0.6, 0.2, 0.1, 0.7], &[3, 3]) * 0.3;
    let sizes: Vec<usize> = [10, 10_000]
        .into_iter()
        .map(|steps| {
            let f = rnn_grads(steps);
            let (gx, gw) = f.call((x.clone(), w.clone())).unwrap();
            assert!(vals(&gx).iter().chain(&vals(&gw)).all(|v| v.is_finite()));
            f.concrete_functions()[0].graph().len()
        })
        .collect();
    assert_eq!(sizes[0], sizes[1], "graph nodes for 10 and 10,000 trips");
}

/// The child of `a_huge_loop_gradient_is_an_error_not_an_abort`.
#[test]
fn child_huge_loop_gradient() {
    if std::env::var_os("TRACEJIT_HUGE_LOOP_CHILD").is_none() {
        return;
    }
    let f = function(|x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = fori_loop(0, 1 << 40, |_, h: Tensor| (&h * 0.5).tanh(), x.clone()).sum_all();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    });
    let e = f.call(t(&[1.0; 8])).unwrap_err().to_string();
    assert!(e.contains("cannot be allocated") && e.contains("1099511627776 trips"), "{e}");
    eprintln!("child done");
}

/// The gradient of `fori_loop(0, 1 << 40, ..)` under a tape inside a
/// function aborted the process ("memory allocation of 52776558133248
/// bytes failed"): run in a child process with a timeout.
#[test]
fn a_huge_loop_gradient_is_an_error_not_an_abort() {
    if std::env::var_os("TRACEJIT_HUGE_LOOP_CHILD").is_some() {
        return;
    }
    let (status, stderr) = crate::common::run_child(
        "control_limits::child_huge_loop_gradient",
        &[("TRACEJIT_HUGE_LOOP_CHILD", "1")],
        std::time::Duration::from_secs(120),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}

/// `depth` conds nested in each other's then branch.
fn nested_conds(x: &Tensor, depth: usize) -> Tensor {
    if depth == 0 {
        return x * 2.0;
    }
    cond(&x.sum_all().gt(depth as f64), || nested_conds(x, depth - 1), || x - 1.0)
}

/// The child of `deep_nesting_is_an_error_not_a_stack_overflow`: on a
/// thread with a 2 MiB stack (what `std::thread::spawn` gives).
#[test]
fn child_deep_nesting() {
    if std::env::var_os("TRACEJIT_DEEP_CHILD").is_none() {
        return;
    }
    let run = std::thread::Builder::new().stack_size(2 << 20).spawn(|| {
        // As deep as allowed: traced, compiled, run and differentiated.
        let depth = tracejit::MAX_NESTING;
        let f = function(move |x: Tensor| nested_conds(&x, depth));
        assert_eq!(vals(&f.call(Tensor::scalar(1e9f32)).unwrap()), vec![2e9]);
        let g = function(move |x: Tensor| {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = nested_conds(&x, depth);
            tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
        });
        assert_eq!(vals(&g.call(Tensor::scalar(1e9f32)).unwrap()), vec![2.0]);
        // 500 levels overflowed the stack and aborted the process.
        let deep = function(|x: Tensor| nested_conds(&x, 500));
        let e = deep.call(Tensor::scalar(1e9f32)).unwrap_err().to_string();
        assert!(e.contains("cond: control flow nests more than 128 levels"), "{}", &e[..e.len().min(300)]);
        // Eagerly there is no limit.
        assert_eq!(vals(&nested_conds(&Tensor::scalar(1e9f32), 1000)), vec![2e9]);
    });
    run.unwrap().join().unwrap();
    eprintln!("child done");
}

/// Tracing 500 nested `cond`s overflowed a 2 MiB thread stack (failure 9
/// of issue #28): run in a child process, which an overflow would abort.
#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    if std::env::var_os("TRACEJIT_DEEP_CHILD").is_some() {
        return;
    }
    let (status, stderr) = crate::common::run_child(
        "control_limits::child_deep_nesting",
        &[("TRACEJIT_DEEP_CHILD", "1")],
        std::time::Duration::from_secs(300),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}
