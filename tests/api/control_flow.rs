//! `cond`, `while_loop` and `fori_loop`: eager == traced (interpreter and
//! JIT) for nested conditionals and loops, zero-iteration loops, loops
//! carrying tuples and Options, variables assigned in branches and bodies,
//! captures, constant predicates, gradients against finite differences,
//! and the errors.

use proptest::prelude::*;
use tracejit::prelude::*;

pub(crate) fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * y.abs().max(1.0))
}

pub(crate) fn t(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()])
}

/// A program with a nested conditional: runs eagerly or traced.
fn nested(x: &Tensor, y: &Tensor) -> Tensor {
    let outer = x.sum_all().gt(0.0);
    cond(
        &outer,
        || {
            let inner = y.max_all().gt(1.0);
            cond(&inner, || (x * y).exp(), || x + y)
        },
        || (x - y).tanh() * 3.0,
    )
}

#[test]
fn nested_conds_match_eager_with_one_trace_in_both_executors() {
    for jit in [false, true] {
        let f = function(|(x, y): (Tensor, Tensor)| nested(&x, &y)).jit(jit);
        for (x, y) in
            [(t(&[1.0, 2.0]), t(&[0.5, 2.0])), (t(&[1.0, 2.0]), t(&[0.5, 0.25])), (t(&[-1.0, -2.0]), t(&[0.5, 3.0]))]
        {
            let got = f.call((x.clone(), y.clone())).unwrap();
            // The JIT's exp is within a few ULP of the reference's.
            assert!(close(&vals(&got), &vals(&nested(&x, &y)), 1e-6), "jit={jit}");
        }
        assert_eq!(f.tracing_count(), 1);
        let g = f.concrete_functions()[0].optimized_graph().to_string();
        assert!(g.contains("cond"), "{g}");
    }
}

#[test]
fn a_known_predicate_runs_only_the_taken_branch() {
    let f = function(|x: Tensor| cond(&Tensor::scalar(true), || x.exp(), || x.log()));
    let x = t(&[0.0, 1.0]);
    assert_eq!(vals(&f.call(x.clone()).unwrap()), vals(&x.exp()));
    let g = f.concrete_functions()[0].optimized_graph().to_string();
    assert!(!g.contains("cond") && !g.contains("log"), "{g}");
}

#[test]
fn a_predicate_that_becomes_constant_folds_to_its_branch() {
    // `pred` is a graph value until constant folding sees it is 2 > 1.
    let f = function(|x: Tensor| {
        let two = Tensor::scalar(2.0f32) + &x.sum_all() * 0.0;
        let pred = two.gt(1.0).logical_or(two.is_nan());
        cond(&pred, || x.exp(), || x.log())
    });
    let x = t(&[0.0, 1.0]);
    assert_eq!(vals(&f.call(x.clone()).unwrap()), vals(&x.exp()));
}

#[test]
fn branch_types_join_and_mismatches_name_both_branches() {
    let f = function(|x: Tensor| cond(&x.sum_all().gt(0.0), || x.clone(), || x.slice(&[SliceSpec::range(0, 2)])));
    let err = f.call(t(&[1.0, 2.0, 3.0])).unwrap_err().to_string();
    assert!(err.contains("f32[3]") && err.contains("f32[2]") && err.contains("then"), "{err}");

    let g = function(|x: Tensor| cond(&x.sum_all().gt(0.0), || x.clone(), || x.cast(DType::F64)));
    let err = g.call(t(&[1.0])).unwrap_err().to_string();
    assert!(err.contains("f32[1]") && err.contains("f64[1]"), "{err}");

    let h = function(|x: Tensor| cond(&x, || x.clone(), || x.clone()));
    let err = h.call(t(&[1.0])).unwrap_err().to_string();
    assert!(err.contains("bool scalar") && err.contains("f32[1]"), "{err}");

    // An unknown dim on one side is fine: the result's dim is unknown.
    let j = function(|x: Tensor| {
        let y = x.slice(&[SliceSpec::range(0, 2)]);
        cond(&x.sum_all().gt(0.0), || y.clone() * 2.0, || y.clone())
    })
    .input_signature(vec![TensorSpec::new(DType::F32, &[-1])]);
    assert_eq!(vals(&j.call(t(&[1.0, 2.0, 3.0])).unwrap()), vec![2.0, 4.0]);
    assert_eq!(vals(&j.call(t(&[-1.0, 2.0, -3.0, 0.0])).unwrap()), vec![-1.0, 2.0]);
    // The failed traces left the cache usable.
    assert_eq!(vals(&f.call(t(&[-1.0, -2.0])).unwrap()), vec![-1.0, -2.0]);
}

fn doubling(x: &Tensor) -> (Tensor, Tensor) {
    while_loop(
        |(_, y): &(Tensor, Tensor)| y.sum_all().le(100.0),
        |(i, y): (Tensor, Tensor)| (&i + 1i64, &y * 2.0),
        (Tensor::scalar(0i64), x.clone()),
    )
}

#[test]
fn while_loops_run_any_trip_count_with_one_trace() {
    for jit in [false, true] {
        let f = function(|x: Tensor| doubling(&x)).jit(jit);
        for x in [t(&[1.0, 2.0]), t(&[60.0, 50.0]), t(&[0.001, 0.0]), t(&[f32::NAN, 1.0])] {
            let (n, y) = f.call(x.clone()).unwrap();
            let (en, ey) = doubling(&x);
            assert_eq!(n.to_vec::<i64>().unwrap(), en.to_vec::<i64>().unwrap(), "jit={jit}");
            assert!(close(&vals(&y), &vals(&ey), 0.0));
        }
        assert_eq!(f.tracing_count(), 1);
    }
    // Zero iterations return the initial state.
    let f = function(|x: Tensor| doubling(&x));
    let (n, y) = f.call(t(&[200.0])).unwrap();
    assert_eq!(n.to_vec::<i64>().unwrap(), vec![0]);
    assert_eq!(vals(&y), vec![200.0]);
}

#[derive(Nest)]
struct State {
    acc: Tensor,
    extra: Option<Tensor>,
    steps: Vec<Tensor>,
}

#[test]
fn loops_carry_structs_options_and_vecs_and_capture_outer_values() {
    let program = |x: Tensor, scale: Tensor| {
        let init = State { acc: x.clone(), extra: Some(x.clone() * 0.0), steps: vec![Tensor::scalar(0i32)] };
        let s = while_loop(
            |s: &State| s.steps[0].lt(4),
            |s: State| State {
                acc: s.acc.tanh() * &scale,
                extra: s.extra.map(|e| e + 1.0),
                steps: vec![&s.steps[0] + 1],
            },
            init,
        );
        (s.acc, s.extra.unwrap(), s.steps[0].clone())
    };
    let f = function(move |(x, scale): (Tensor, Tensor)| program(x, scale));
    let (x, scale) = (t(&[0.5, -1.0, 2.0]), Tensor::scalar(1.5f32));
    let (a, e, n) = f.call((x.clone(), scale.clone())).unwrap();
    let (ea, ee, en) = program(x, scale);
    assert!(close(&vals(&a), &vals(&ea), 1e-6));
    assert_eq!(vals(&e), vals(&ee));
    assert_eq!(n.to_vec::<i32>().unwrap(), en.to_vec::<i32>().unwrap());
}

#[test]
fn a_carried_value_that_changes_shape_is_an_error_naming_it() {
    let f = function(|x: Tensor| {
        while_loop(
            |(_, y): &(Tensor, Tensor)| y.sum_all().lt(10.0),
            |(i, y): (Tensor, Tensor)| (i, Tensor::concat(&[&y, &y], 0)),
            (Tensor::scalar(0i64), x),
        )
    });
    let err = f.call(t(&[1.0])).unwrap_err().to_string();
    assert!(err.contains("carried value 1") && err.contains("f32[1]") && err.contains("f32[2]"), "{err}");
}

#[test]
fn fori_loop_matches_a_rust_loop() {
    let body = |i: Tensor, y: Tensor| &y * 0.5 + i.cast(DType::F32);
    let f = function(move |x: Tensor| fori_loop(2, 9, body, x));
    let x = t(&[1.0, -3.0]);
    let mut want = x.clone();
    for i in 2..9 {
        want = body(Tensor::scalar(i as i64), want);
    }
    assert!(close(&vals(&f.call(x.clone()).unwrap()), &vals(&want), 1e-6));
    // An empty range runs no iteration.
    let g = function(move |x: Tensor| fori_loop(5, 5, body, x));
    assert_eq!(vals(&g.call(x.clone()).unwrap()), vals(&x));
}

#[test]
fn variables_change_only_when_their_branch_or_iteration_runs() {
    let hits = Variable::new(Tensor::scalar(0.0f32));
    let total = Variable::new(Tensor::zeros(&[2], DType::F32));
    let (h, tot) = (hits.clone(), total.clone());
    let f = function(move |x: Tensor| {
        let y = cond(
            &x.sum_all().gt(0.0),
            || {
                h.assign_add(&Tensor::scalar(1.0f32));
                x.clone()
            },
            || x.clone() * 0.0,
        );
        fori_loop(
            0,
            3,
            |_, acc: Tensor| {
                tot.assign_add(&acc);
                acc + 1.0
            },
            y,
        )
    });
    f.call(t(&[1.0, 2.0])).unwrap();
    f.call(t(&[-1.0, -2.0])).unwrap();
    f.call(t(&[3.0, 0.0])).unwrap();
    assert_eq!(vals(&hits.value()), vec![2.0]);
    // Each call adds y, y + 1 and y + 2.
    let want: Vec<f64> = [[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]
        .iter()
        .fold(vec![0.0, 0.0], |acc, y| acc.iter().zip(y).map(|(a, v)| a + 3.0 * v + 3.0).collect());
    assert_eq!(vals(&total.value()), want);
    // Reads after the loop see its writes (program order).
    let v = Variable::new(Tensor::scalar(1.0f32));
    let v2 = v.clone();
    let g = function(move |x: Tensor| {
        fori_loop(
            0,
            4,
            |_, a: Tensor| {
                v2.assign(&(v2.read() * 2.0));
                a
            },
            x.clone(),
        );
        v2.read() + x
    });
    assert_eq!(vals(&g.call(Tensor::scalar(0.0f32)).unwrap()), vec![16.0]);
}

#[test]
fn functions_and_composites_run_inside_branches() {
    let inner = function(|x: Tensor| x.exp() - 1.0);
    let f = function(move |x: Tensor| {
        cond(&x.sum_all().gt(0.0), || inner.call(x.clone()).unwrap(), || tracejit::nn::gelu(&x))
    });
    let x = t(&[0.5, 1.0]);
    assert!(close(&vals(&f.call(x.clone()).unwrap()), &vals(&(x.exp() - 1.0)), 1e-6));
    let x = t(&[-0.5, -1.0]);
    assert!(close(&vals(&f.call(x.clone()).unwrap()), &vals(&tracejit::nn::gelu(&x)), 1e-5));
}

// ---- gradients ----------------------------------------------------------

fn f64v(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()])
}

/// Central differences of `f` at `x`.
fn finite_diff(f: &dyn Fn(&Tensor) -> f64, x: &[f64]) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let (mut a, mut b) = (x.to_vec(), x.to_vec());
            a[i] += h;
            b[i] -= h;
            (f(&f64v(&a)) - f(&f64v(&b))) / (2.0 * h)
        })
        .collect()
}

fn branchy(x: &Tensor, w: &Tensor) -> Tensor {
    let y = cond(&x.sum_all().gt(0.0), || (x * w).sin() * x, || (x - w).exp());
    y.sum_all()
}

#[test]
fn gradients_through_cond_match_finite_differences_eagerly_and_traced() {
    let w = f64v(&[0.3, -0.7, 1.1]);
    let grad = |x: &Tensor, w: &Tensor| {
        let tape = GradientTape::new();
        tape.watch(x);
        tape.watch(w);
        let y = branchy(x, w);
        let g = tape.gradient(&y, &[x, w]).unwrap();
        (g[0].clone().unwrap(), g[1].clone().unwrap())
    };
    let traced = function(move |(x, w): (Tensor, Tensor)| grad(&x, &w));
    for x in [[0.5, 1.0, -0.2], [-0.5, -1.0, 0.2]] {
        let xs = f64v(&x);
        let fd_x = finite_diff(&|x| vals(&branchy(x, &w))[0], &x);
        let fd_w = finite_diff(&|w| vals(&branchy(&xs, w))[0], &vals(&w));
        let (ex, ew) = grad(&xs, &w);
        let (tx, tw) = traced.call((xs.clone(), w.clone())).unwrap();
        for got in [&ex, &tx] {
            assert!(close(&vals(got), &fd_x, 1e-6), "{:?} vs {fd_x:?}", vals(got));
        }
        for got in [&ew, &tw] {
            assert!(close(&vals(got), &fd_w, 1e-6), "{:?} vs {fd_w:?}", vals(got));
        }
    }
    assert_eq!(traced.tracing_count(), 1);
}

#[test]
fn variables_read_inside_a_branch_get_their_gradient() {
    let w = Variable::new(f64v(&[0.5, -1.5]));
    let w2 = w.clone();
    let step = function(move |x: Tensor| {
        let tape = GradientTape::new();
        let y = cond(&x.sum_all().gt(0.0), || (&x * w2.read()).tanh().sum_all(), || x.sum_all() * 0.0);
        tape.gradient(&y, std::slice::from_ref(&w2)).unwrap().remove(0).unwrap()
    });
    let x = f64v(&[0.7, 0.2]);
    let got = step.call(x.clone()).unwrap();
    let fd = finite_diff(&|wv| vals(&(&x * wv).tanh().sum_all())[0], &vals(&w.value()));
    assert!(close(&vals(&got), &fd, 1e-6), "{:?} vs {fd:?}", vals(&got));
    // The other branch does not use w: zero gradient.
    assert_eq!(vals(&step.call(f64v(&[-0.7, 0.2])).unwrap()), vec![0.0, 0.0]);
}

pub(crate) fn rnn(x: &Tensor, w: &Tensor, steps: i64) -> Tensor {
    fori_loop(0, steps, |_, h: Tensor| (h.matmul(w) + x).tanh(), x.clone()).sum_all()
}

#[test]
fn gradients_through_fori_loop_match_finite_differences() {
    let x = Tensor::from_vec(vec![0.1f64, -0.3, 0.2, 0.4, 0.0, -0.1], &[2, 3]);
    let w = Tensor::from_vec(vec![0.5f64, -0.2, 0.1, 0.3, 0.4, -0.6, 0.2, 0.1, 0.7], &[3, 3]);
    for steps in [0, 1, 5] {
        let grads = move |x: &Tensor, w: &Tensor| {
            let tape = GradientTape::new();
            tape.watch(x);
            tape.watch(w);
            let y = rnn(x, w, steps);
            let g = tape.gradient(&y, &[x, w]).unwrap();
            (g[0].clone(), g[1].clone())
        };
        let traced = function(move |(x, w): (Tensor, Tensor)| {
            let (a, b) = grads(&x, &w);
            (a.unwrap(), b.unwrap_or_else(|| w.clone() * 0.0))
        });
        let (tx, tw) = traced.call((x.clone(), w.clone())).unwrap();
        let (ex, ew) = grads(&x, &w);
        let fd_x = finite_diff(&|xv| vals(&rnn(&xv.reshape(&[2, 3]), &w, steps))[0], &vals(&x.reshape(&[6])));
        let fd_w = finite_diff(&|wv| vals(&rnn(&x, &wv.reshape(&[3, 3]), steps))[0], &vals(&w.reshape(&[9])));
        assert!(close(&vals(&tx), &fd_x, 1e-6), "steps={steps}: {:?} vs {fd_x:?}", vals(&tx));
        assert!(close(&vals(&ex.unwrap()), &fd_x, 1e-6));
        assert!(close(&vals(&tw), &fd_w, 1e-6), "steps={steps}: {:?} vs {fd_w:?}", vals(&tw));
        if steps > 0 {
            assert!(close(&vals(&ew.unwrap()), &fd_w, 1e-6));
        }
    }
}

#[test]
fn a_data_dependent_while_loop_refuses_reverse_mode() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let out = seen.clone();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let (_, y) = doubling(&x);
        if let Err(e) = tape.gradient(&y.sum_all(), &[&x]) {
            *out.lock().unwrap() = e.to_string();
        }
        y
    });
    f.call(t(&[1.0, 2.0])).unwrap();
    let err = seen.lock().unwrap().clone();
    assert!(err.contains("while") && err.contains("fori_loop"), "{err}");
}

// ---- random programs ----------------------------------------------------

/// A random elementwise step, by number.
fn step(k: u8, x: &Tensor) -> Tensor {
    match k % 6 {
        0 => x.tanh(),
        1 => x * 1.5 - 0.25,
        2 => x.sin() + x,
        3 => x.relu() - x * 0.1,
        4 => x.exp().clamp(-5.0, 5.0),
        _ => x.abs().sqrt(),
    }
}

fn program(ops: &[u8], threshold: f32, x: &Tensor) -> Tensor {
    let (a, b) = ops.split_at(ops.len() / 2);
    let y = cond(
        &x.mean_all().gt(threshold),
        || a.iter().fold(x.clone(), |acc, &k| step(k, &acc)),
        || b.iter().fold(x.clone(), |acc, &k| step(k, &acc)),
    );
    let trips = i64::from(ops.first().copied().unwrap_or(0) % 4);
    fori_loop(0, trips, |_, acc: Tensor| step(ops.len() as u8, &acc) * 0.5, y)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_programs_with_control_flow_match_eager(
        ops in proptest::collection::vec(0u8..6, 0..8),
        threshold in -1.0f32..1.0,
        data in proptest::collection::vec(-2.0f32..2.0, 0..6),
    ) {
        let x = t(&data);
        let ops2 = ops.clone();
        let f = function(move |x: Tensor| program(&ops2, threshold, &x));
        let got = f.call(x.clone()).unwrap();
        let want = program(&ops, threshold, &x);
        prop_assert!(close(&vals(&got), &vals(&want), 1e-5), "{:?} vs {:?}", vals(&got), vals(&want));
    }
}

#[test]
fn a_branch_kept_only_for_its_effect_survives_the_passes() {
    let v = Variable::new(Tensor::scalar(0i64));
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        let _unused: Tensor = cond(
            &x.sum_all().gt(0.0),
            || {
                v2.assign_add(&Tensor::scalar(1i64));
                Tensor::scalar(0.0f32)
            },
            || Tensor::scalar(1.0f32),
        );
        x * 2.0
    });
    for x in [1.0f32, -1.0, 2.0, 3.0] {
        f.call(Tensor::scalar(x)).unwrap();
    }
    assert_eq!(v.value().to_vec::<i64>().unwrap(), vec![3]);
}

#[test]
fn threads_run_one_compiled_loop_at_once() {
    let f = std::sync::Arc::new(function(|x: Tensor| doubling(&x)));
    let handles: Vec<_> = (0..8)
        .map(|k| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let x = t(&[1.0 + (k * 20 + i) as f32, 0.5]);
                    let (n, y) = f.call(x.clone()).unwrap();
                    let (en, ey) = doubling(&x);
                    assert_eq!(n.to_vec::<i64>().unwrap(), en.to_vec::<i64>().unwrap());
                    assert_eq!(vals(&y), vals(&ey));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(f.tracing_count(), 1);
}

/// Branches of different dtypes: an `Err` when traced, but eagerly (and
/// under `run_functions_eagerly(true)`) the taken branch ran and nothing
/// was said (failure 12 of issue #28).
fn mixed_dtypes(x: &Tensor) -> Tensor {
    cond(&x.sum_all().gt(0.0), || x * 2.0, || x.cast(DType::F64))
}

const MIXED: &str = "the then branch returns f32[2], the else branch f64[2]";

pub(crate) fn panic_text(f: impl FnOnce()) -> String {
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("must panic");
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

#[test]
fn cond_branches_of_different_dtypes_fail_in_every_mode() {
    for x in [t(&[1.0, 2.0]), t(&[-1.0, -2.0])] {
        let got = panic_text(|| drop(mixed_dtypes(&x)));
        assert!(got.contains(MIXED), "eager: {got}");
        let f = function(|x: Tensor| mixed_dtypes(&x));
        let e = f.call(x.clone()).unwrap_err().to_string();
        assert!(e.contains(MIXED), "traced: {e}");
        // A constant predicate while tracing: the same rule.
        let g = function(|x: Tensor| cond(&Tensor::scalar(true), || &x * 2.0, || x.cast(DType::F64)));
        assert!(g.call(x.clone()).unwrap_err().to_string().contains(MIXED));
    }
    // What agrees still runs, taking only its branch's effects.
    let v = Variable::new(Tensor::scalar(0i64));
    let out = cond(
        &Tensor::scalar(true),
        || t(&[1.0, 2.0]) * 2.0,
        || {
            v.assign_add(&Tensor::scalar(1i64));
            t(&[0.0, 0.0])
        },
    );
    assert_eq!(vals(&out), vec![2.0, 4.0]);
    assert_eq!(v.value().to_vec::<i64>().unwrap(), vec![0], "the untaken branch's write did not happen");
}

/// The child of `cond_branches_of_different_dtypes_fail_when_run_eagerly`.
#[test]
fn child_cond_dtypes_eagerly() {
    if std::env::var_os("TRACEJIT_COND_EAGER_CHILD").is_none() {
        return;
    }
    assert!(tracejit::config::functions_run_eagerly());
    let f = function(|x: Tensor| mixed_dtypes(&x));
    let e = f.call(t(&[1.0, 2.0])).unwrap_err().to_string();
    assert!(e.contains(MIXED) && e.contains("while running eagerly"), "{e}");
    eprintln!("child done");
}

#[test]
fn cond_branches_of_different_dtypes_fail_when_run_eagerly() {
    if std::env::var_os("TRACEJIT_COND_EAGER_CHILD").is_some() {
        return;
    }
    let (status, stderr) = crate::common::run_child(
        "control_flow::child_cond_dtypes_eagerly",
        &[("TRACEJIT_COND_EAGER_CHILD", "1"), ("TRACEJIT_EAGER", "1")],
        std::time::Duration::from_secs(120),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}

/// A loop carrying an i64 counter, a bool flag and a state, reading one
/// variable and writing another, capturing `x` and `w`.
fn looped(x: &Tensor, w: &Tensor, scale: &Variable, counter: &Variable) -> Tensor {
    let init = (Tensor::scalar(0i64), Tensor::scalar(true), x.clone());
    let (_, _, h) = fori_loop(
        0,
        7,
        |_i, (n, flag, h): (Tensor, Tensor, Tensor)| {
            counter.assign_add(&Tensor::scalar(1i64));
            let next = (h.matmul(w) * scale.read() + x).tanh();
            (&n + 1i64, flag.logical_not(), Tensor::select(&flag, &next, &(&next * 0.5)))
        },
        init,
    );
    h.sum_all()
}

/// Gradients of `looped` with respect to `x`, `w` and `scale`.
fn looped_grads(x: &Tensor, w: &Tensor, scale: &Variable, counter: &Variable) -> (Tensor, Tensor, Tensor) {
    let tape = GradientTape::persistent();
    tape.watch(x);
    tape.watch(w);
    let y = looped(x, w, scale, counter);
    let g = tape.gradient(&y, &[x, w]).unwrap();
    let gs = tape.gradient(&y, std::slice::from_ref(scale)).unwrap().remove(0).unwrap();
    (g[0].clone().unwrap(), g[1].clone().unwrap(), gs)
}

#[test]
fn loop_gradients_match_eager_in_both_executors() {
    let x = Tensor::from_vec(vec![0.1f64, -0.3, 0.2, 0.4, 0.0, -0.1], &[2, 3]);
    let w = Tensor::from_vec(vec![0.5f64, -0.2, 0.1, 0.3, 0.4, -0.6, 0.2, 0.1, 0.7], &[3, 3]);
    let scale = Variable::new(Tensor::from_vec(vec![0.9f64, 1.1, 1.0], &[3]));
    let counter = Variable::new(Tensor::scalar(0i64));
    let (ex, ew, es) = looped_grads(&x, &w, &scale, &counter);
    for jit in [true, false] {
        let (s2, c2) = (scale.clone(), counter.clone());
        let f = function(move |(x, w): (Tensor, Tensor)| looped_grads(&x, &w, &s2, &c2)).jit(jit);
        let (tx, tw, ts) = f.call((x.clone(), w.clone())).unwrap();
        for (got, want) in [(&tx, &ex), (&tw, &ew), (&ts, &es)] {
            assert!(close(&vals(got), &vals(want), 1e-10), "jit {jit}: {:?} vs {:?}", vals(got), vals(want));
        }
    }
}
