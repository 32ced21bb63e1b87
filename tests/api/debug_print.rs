//! `tracejit::debug::{print, callback}`: run-time values inside compiled
//! functions, on every call and loop trip, in program order, never
//! dropped or merged by the passes, left out of ONNX exports.

use std::sync::{Arc, Mutex};

use tracejit::prelude::*;

type Log = Arc<Mutex<Vec<String>>>;

/// A callback appending `tag` and its first argument's values to `log`.
fn note(log: &Log, tag: &'static str, x: &Tensor) {
    let log = log.clone();
    tracejit::debug::callback(&[x], move |v: &[Tensor]| {
        log.lock().unwrap().push(format!("{tag}{:?}", v[0].to_vec::<f32>().unwrap()))
    });
}

fn t(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()])
}

#[test]
fn a_callback_sees_every_calls_values_compiled() {
    let log: Log = Arc::default();
    let l = log.clone();
    let f = function(move |x: Tensor| {
        let h = &x * 2.0;
        note(&l, "h", &h);
        // Its result is unused: the node must survive dead-code elimination.
        note(&l, "unused", &(&h + 1.0));
        h.sum_all()
    });
    f.call(t(&[1.0, 2.0])).unwrap();
    f.call(t(&[3.0])).unwrap();
    assert_eq!(*log.lock().unwrap(), ["h[2.0, 4.0]", "unused[3.0, 5.0]", "h[6.0]", "unused[7.0]"]);
    let cf = f.concrete_functions()[0].clone();
    assert!(cf.schedule_stats().is_some(), "compiled");
    assert!(cf.optimized_graph().to_string().contains("tracejit.debug.callback"));
}

#[test]
fn callbacks_run_in_program_order_with_variable_writes_and_per_loop_trip() {
    let log: Log = Arc::default();
    let v = Variable::new(t(&[0.0]));
    let (l, w) = (log.clone(), v.clone());
    let f = function(move |x: Tensor| {
        note(&l, "before", &w.read());
        w.assign(&x);
        note(&l, "after", &w.read());
        let l2 = l.clone();
        fori_loop(
            0,
            3,
            move |_i, s: Tensor| {
                let s = &s + 1.0;
                note(&l2, "trip", &s);
                s
            },
            x,
        )
    });
    let out = f.call(t(&[10.0])).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), [13.0]);
    assert_eq!(*log.lock().unwrap(), ["before[0.0]", "after[10.0]", "trip[11.0]", "trip[12.0]", "trip[13.0]"]);
}

#[test]
fn eagerly_it_acts_at_once_and_an_untaken_branch_stays_silent() {
    let log: Log = Arc::default();
    note(&log, "eager", &t(&[1.0]));
    assert_eq!(*log.lock().unwrap(), ["eager[1.0]"]);
    let l = log.clone();
    let f = function(move |x: Tensor| {
        let (a, b) = (l.clone(), l.clone());
        let xa = x.clone();
        cond(
            &x.sum_all().gt(0.0),
            move || {
                note(&a, "then", &xa);
                &xa * 1.0
            },
            move || {
                note(&b, "else", &x);
                &x * -1.0
            },
        )
    });
    f.call(t(&[2.0])).unwrap();
    f.call(t(&[-2.0])).unwrap();
    assert_eq!(*log.lock().unwrap(), ["eager[1.0]", "then[2.0]", "else[-2.0]"]);
}

#[test]
fn two_identical_prints_both_run_and_gradients_are_unchanged() {
    let log: Log = Arc::default();
    let l = log.clone();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = (&x * &x).sum_all();
        note(&l, "y", &y.reshape(&[1]));
        note(&l, "y", &y.reshape(&[1]));
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    });
    let g = f.call(t(&[1.5, -2.0])).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), [3.0, -4.0]);
    assert_eq!(*log.lock().unwrap(), ["y[6.25]", "y[6.25]"]);
    // print itself: formats and does not disturb the result.
    let p = function(|x: Tensor| {
        tracejit::debug::print("x = {} and {{braces}}", &[&x]);
        &x + 1.0
    });
    assert_eq!(p.call(t(&[1.0])).unwrap().to_vec::<f32>().unwrap(), [2.0]);
}

#[test]
fn onnx_export_leaves_debug_nodes_out() {
    let f = function(|x: Tensor| {
        tracejit::debug::print("x = {}", &[&x]);
        x.tanh()
    });
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[2])).unwrap();
    let bytes = tracejit::onnx::to_bytes(&cf).unwrap();
    let model = tracejit::onnx::decode(&bytes).unwrap();
    let ops: Vec<String> = model.graph.unwrap().node.iter().map(|n| n.op_type().to_string()).collect();
    assert_eq!(ops, ["Tanh"]);
}

/// Inside `vmap` (the issue: a panic with advice that did not apply) a
/// callback sees the batched values, once per call of the mapped
/// function, as `jax.debug.print` does: eagerly, compiled (in order with
/// the callbacks around the map), with an unmapped value seen once as it
/// is, and under `vmap(grad)`. `print` runs too.
#[test]
fn callbacks_inside_vmap_see_the_batched_values() {
    let log: Log = Arc::default();
    let l = log.clone();
    let shared = t(&[10.0]);
    let per_example = move |x: &Tensor| {
        note(&l, "x", x);
        note(&l, "shared", &shared);
        tracejit::debug::print("example = {}", &[x]);
        (x * x).sum_all()
    };
    let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let mapped = tracejit::vmap(per_example.clone());
    let y = mapped(&xs);
    assert_eq!(y.to_vec::<f32>().unwrap(), [5.0, 25.0]);
    assert_eq!(*log.lock().unwrap(), ["x[1.0, 2.0, 3.0, 4.0]", "shared[10.0]"]);
    log.lock().unwrap().clear();
    let l = log.clone();
    let f = function(move |x: Tensor| {
        note(&l, "before", &x.sum_all().reshape(&[1]));
        let y = mapped(&x);
        note(&l, "after", &y);
        y
    });
    f.call(xs.clone()).unwrap();
    f.call(&xs * 2.0).unwrap();
    assert!(f.concrete_functions()[0].schedule_stats().is_some(), "compiled");
    let want = [
        "before[10.0]",
        "x[1.0, 2.0, 3.0, 4.0]",
        "shared[10.0]",
        "after[5.0, 25.0]",
        "before[20.0]",
        "x[2.0, 4.0, 6.0, 8.0]",
        "shared[10.0]",
        "after[20.0, 100.0]",
    ];
    assert_eq!(*log.lock().unwrap(), want);
    log.lock().unwrap().clear();
    let g = tracejit::vmap(tracejit::autodiff::grad(per_example))(&xs);
    assert_eq!(g.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0]);
    assert_eq!(log.lock().unwrap()[0], "x[1.0, 2.0, 3.0, 4.0]");
}
