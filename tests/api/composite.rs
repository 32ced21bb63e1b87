//! Composite ops through the public surface: the kernel registry and the
//! implementation selector, tested by behaviour (which code ran), and the
//! `tracejit::nn` library (kernels against their primitive bodies, eagerly
//! and traced, with the selector on and off).
//!
//! The registry is process-wide and tests run in parallel: each test that
//! registers kernels uses names of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tracejit::ir::Op;
use tracejit::nn::{self, Activation};
use tracejit::prelude::*;

fn ramp(shape: &[usize], scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * scale).collect(), shape)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Largest |a - b| / (1 + |b|), NaN only against NaN.
fn max_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    values(a)
        .iter()
        .zip(values(b))
        .map(|(x, y)| if x.is_nan() && y.is_nan() { 0.0 } else { (x - y).abs() / (1.0 + y.abs()) })
        .fold(0.0f32, |m, e| if e.is_nan() || e > m { e } else { m })
}

fn count_ops(g: &tracejit::ir::Graph, name: &str) -> usize {
    g.nodes()
        .map(|(_, n)| match &n.op {
            Op::Fused { body } => count_ops(body, name),
            op => usize::from(op.name() == name),
        })
        .sum()
}

#[test]
fn the_registered_kernel_runs_with_the_selector_and_the_body_without() {
    let kernel_runs = Arc::new(AtomicUsize::new(0));
    let k2 = kernel_runs.clone();
    tracejit::composite::register_kernel("tests.composite.scale", move |inputs: &[Tensor]| {
        k2.fetch_add(1, Ordering::SeqCst);
        vec![&inputs[0] * 2.0 + 1000.0]
    });
    let body = function(|x: Tensor| &x * 2.0).implements("tests.composite.scale").name("scale");
    let b2 = body.clone();
    let with = function(move |x: Tensor| b2.call(x).unwrap() - 1.0).name("with");
    let b3 = body.clone();
    let without = function(move |x: Tensor| b3.call(x).unwrap() - 1.0).name("without").selector(false);
    let x = ramp(&[4], 1.0);
    let expect_body: Vec<f32> = values(&x).iter().map(|v| v * 2.0 - 1.0).collect();

    assert_eq!(values(&with.call(x.clone()).unwrap()), expect_body.iter().map(|v| v + 1000.0).collect::<Vec<_>>());
    assert_eq!(kernel_runs.load(Ordering::SeqCst), 1);
    let g = with.concrete_functions()[0].optimized_graph().clone();
    assert_eq!(count_ops(&g, "kernel"), 1, "{g}");
    assert!(g.to_string().contains(r#"kernel["tests.composite.scale"]"#), "{g}");
    assert!(with.concrete_functions()[0].stats().changed_by("selector"));

    assert_eq!(values(&without.call(x.clone()).unwrap()), expect_body);
    assert_eq!(kernel_runs.load(Ordering::SeqCst), 1, "the body ran, not the kernel");
    let g = without.concrete_functions()[0].optimized_graph().clone();
    assert_eq!(count_ops(&g, "kernel") + count_ops(&g, "call"), 0, "{g}");
    // The traced (unoptimized) graph keeps the call either way.
    assert_eq!(count_ops(without.concrete_functions()[0].graph(), "call"), 1);

    // optimize(false): the call stays a call and runs the body.
    let b4 = body.clone();
    let raw = function(move |x: Tensor| b4.call(x).unwrap() - 1.0).optimize(false);
    assert_eq!(values(&raw.call(x.clone()).unwrap()), expect_body);
    assert_eq!(count_ops(raw.concrete_functions()[0].optimized_graph(), "call"), 1);
    assert_eq!(kernel_runs.load(Ordering::SeqCst), 1);
    assert!(tracejit::composite::unregister("tests.composite.scale"));
}

#[test]
fn a_predicate_decides_which_calls_get_the_kernel() {
    tracejit::composite::register_kernel_with(
        "tests.composite.small_only",
        |specs: &[TensorSpec]| specs[0].dims().iter().all(|d| d.is_some_and(|d| d <= 4)),
        |inputs: &[Tensor]| vec![inputs[0].neg()],
    );
    let body = function(|x: Tensor| x.abs()).implements("tests.composite.small_only");
    let b = body.clone();
    let outer = function(move |x: Tensor| b.call(x).unwrap());
    let small = ramp(&[3], 1.0);
    let big = ramp(&[8], 1.0);
    assert_eq!(values(&outer.call(small.clone()).unwrap()), values(&small.neg()), "kernel for [3]");
    assert_eq!(values(&outer.call(big.clone()).unwrap()), values(&big.abs()), "body for [8]");
    // Unknown dims are passed as such: the predicate rejects them here.
    let relaxed = function({
        let b = body.clone();
        move |x: Tensor| b.call(x).unwrap()
    })
    .input_signature(vec![TensorSpec::new(DType::F32, &[-1])]);
    let wrapper = function(move |x: Tensor| relaxed.call(x).unwrap());
    assert_eq!(values(&wrapper.call(small.clone()).unwrap()), values(&small.abs()));
    tracejit::composite::unregister("tests.composite.small_only");
}

#[test]
fn registering_twice_replaces_the_kernel_for_later_traces() {
    let name = "tests.composite.twice";
    tracejit::composite::register_kernel(name, |i: &[Tensor]| vec![&i[0] + 1.0]);
    let body = function(|x: Tensor| x.clone()).implements(name);
    let b = body.clone();
    let f = function(move |x: Tensor| b.call(x).unwrap());
    let x = ramp(&[2], 1.0);
    let first = values(&f.call(x.clone()).unwrap());
    tracejit::composite::register_kernel(name, |i: &[Tensor]| vec![&i[0] + 2.0]);
    assert!(tracejit::composite::registered_kernels().iter().any(|n| n == name));
    // The trace made before keeps its kernel; a new signature sees the new one.
    assert_eq!(values(&f.call(x.clone()).unwrap()), first);
    let y = ramp(&[3], 1.0);
    assert_eq!(values(&f.call(y.clone()).unwrap()), values(&(&y + 2.0)));
    assert!(tracejit::composite::unregister(name));
    assert!(!tracejit::composite::unregister(name));
    let z = ramp(&[5], 1.0);
    assert_eq!(values(&f.call(z.clone()).unwrap()), values(&z), "unregistered: the body");
}

#[test]
fn implements_names_are_validated() {
    for bad in ["gelu", "nn.gelu", "tracejit..gelu", "tracejit.nn.ge-lu", "tracejit.nn.gelu."] {
        let f = function(|x: Tensor| x).implements(bad);
        let e = f.call(ramp(&[1], 1.0)).unwrap_err().to_string();
        assert!(e.contains("org.semantic.opname") && e.contains(bad), "{e}");
        assert!(!tracejit::composite::is_valid_name(bad));
        let p = std::panic::catch_unwind(|| tracejit::composite::register_kernel(bad, |i: &[Tensor]| i.to_vec()));
        assert!(p.is_err(), "registering `{bad}` should panic");
    }
    assert!(tracejit::composite::is_valid_name("tracejit.nn.gelu"));
}

#[test]
fn the_nn_library_registers_its_kernels() {
    let names = tracejit::composite::registered_kernels();
    for n in [
        "tracejit.nn.gelu",
        "tracejit.nn.softmax",
        "tracejit.nn.log_softmax",
        "tracejit.nn.layer_norm",
        "tracejit.nn.lstm_cell",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} is not registered: {names:?}");
    }
}

/// Runs `f` traced with the selector on and off and eagerly; returns the
/// three results and checks which graph has the kernel.
fn three_ways<A: Nest + Clone, R: Nest>(
    name: &str,
    f: impl Fn(A) -> R + Send + Sync + Clone + 'static,
    args: A,
) -> (R, R, R) {
    let on = function(f.clone());
    let off = function(f.clone()).selector(false);
    let a = on.call(args.clone()).unwrap();
    let b = off.call(args.clone()).unwrap();
    let g_on = on.concrete_functions()[0].optimized_graph().to_string();
    let g_off = off.concrete_functions()[0].optimized_graph().to_string();
    assert!(g_on.contains(&format!("kernel[\"{name}\"]")), "selector on: no kernel for {name}\n{g_on}");
    assert!(!g_off.contains("kernel[") && !g_off.contains("call @"), "selector off: {g_off}");
    (a, b, f(args))
}

#[test]
fn gelu_kernel_agrees_with_its_body() {
    // Eager calls run the native kernel; compiled code runs the body, fused
    // by the JIT (the kernel is eager-only: the fused region is faster).
    let compiled = |x: Tensor| {
        let f = function(|x: Tensor| nn::gelu(&x));
        let out = f.call(x).unwrap();
        let cf = &f.concrete_functions()[0];
        let g = cf.optimized_graph().to_string();
        assert!(!g.contains("kernel[") && g.contains("tanh"), "the body, not the kernel: {g}");
        assert_eq!(cf.executor_kind(), "jit");
        out
    };
    let x = ramp(&[3, 257], 6.0);
    let (k, body) = (nn::gelu(&x), compiled(x.clone()));
    assert!(max_err(&k, &body) < 2e-6, "{}", max_err(&k, &body));
    // W2's formula, written out.
    let manual = (&x * 0.5) * (((&x + (&x * &x * &x) * 0.044715) * 0.7978845608).tanh() + 1.0);
    assert!(max_err(&body, &manual) < 1e-6);
    // NaN and infinities.
    let special = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 30.0, -30.0], &[6]);
    let (k, body) = (nn::gelu(&special), compiled(special));
    let (kv, bv) = (values(&k), values(&body));
    assert!(kv[0].is_nan() && bv[0].is_nan());
    let same = kv[1..].iter().zip(&bv[1..]).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
    assert!(same, "{kv:?} {bv:?}");
}

#[test]
fn softmax_and_log_softmax_kernels_agree_with_their_bodies() {
    let x = ramp(&[5, 33], 20.0);
    let (k, body, eager) = three_ways("tracejit.nn.softmax", |x: Tensor| nn::softmax(&x, -1), x.clone());
    assert!(max_err(&k, &body) < 2e-6, "{}", max_err(&k, &body));
    assert!(max_err(&eager, &k) == 0.0);
    let rows = values(&k.sum(&[1], false));
    assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5), "{rows:?}");
    let (k, body, _) = three_ways("tracejit.nn.log_softmax", |x: Tensor| nn::log_softmax(&x, -1), x.clone());
    assert!(max_err(&k, &body) < 2e-6, "{}", max_err(&k, &body));
    assert!(max_err(&k.exp(), &nn::softmax(&x, -1)) < 1e-6);
    // Another axis goes through a transpose; a row with a NaN is all NaN.
    let y = ramp(&[4, 6], 3.0);
    let s0 = nn::softmax(&y, 0);
    let cols = values(&s0.sum(&[0], false));
    assert!(cols.iter().all(|s| (s - 1.0).abs() < 1e-5), "{cols:?}");
    assert!(max_err(&s0, &nn::softmax(&y.t(), -1).t()) == 0.0);
    let nan_row = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0, 1.0, 2.0, 3.0], &[2, 3]);
    let (k, body, _) = three_ways("tracejit.nn.softmax", |x: Tensor| nn::softmax(&x, -1), nan_row);
    let (kv, bv) = (values(&k), values(&body));
    assert!(kv[..3].iter().all(|v| v.is_nan()) && bv[..3].iter().all(|v| v.is_nan()));
    assert!(max_err(&k.slice_axis(0, 1, 2), &body.slice_axis(0, 1, 2)) < 2e-6);
}

#[test]
fn layer_norm_kernel_agrees_with_its_body() {
    let x = ramp(&[7, 64], 4.0) + 3.0;
    let gamma = ramp(&[64], 1.5);
    let beta = ramp(&[64], 0.5);
    // Eager calls run the native kernel; compiled code runs the body, fused
    // by the JIT (the kernel is eager-only: the fused regions are faster).
    let f = function(|(x, g, b): (Tensor, Tensor, Tensor)| nn::layer_norm(&x, &g, &b, 1e-5));
    let body = f.call((x.clone(), gamma.clone(), beta.clone())).unwrap();
    let cf = &f.concrete_functions()[0];
    let g = cf.optimized_graph().to_string();
    assert!(!g.contains("kernel[") && g.contains("rsqrt"), "the body, not the kernel: {g}");
    assert_eq!(cf.executor_kind(), "jit");
    let k = nn::layer_norm(&x, &gamma, &beta, 1e-5);
    assert!(max_err(&k, &body) < 1e-5, "{}", max_err(&k, &body));
    // NaN and infinities in a row make that row NaN both ways; other rows
    // are untouched.
    let mut v = values(&x);
    v[3] = f32::NAN;
    v[64 + 5] = f32::INFINITY;
    let special = Tensor::from_vec(v, &[7, 64]);
    let (k, body) =
        (nn::layer_norm(&special, &gamma, &beta, 1e-5), f.call((special, gamma.clone(), beta.clone())).unwrap());
    let (kv, bv) = (values(&k), values(&body));
    assert!(kv[..128].iter().chain(&bv[..128]).all(|v| v.is_nan()), "{kv:?}");
    assert!(max_err(&k.slice_axis(0, 2, 7), &body.slice_axis(0, 2, 7)) < 1e-5);
    // Normalized rows: mean beta-ish, by construction of the formula.
    let plain = nn::layer_norm(&x, &Tensor::ones(&[64], DType::F32), &Tensor::zeros(&[64], DType::F32), 1e-5);
    let means = values(&plain.mean(&[1], false));
    assert!(means.iter().all(|m| m.abs() < 1e-5), "{means:?}");
    // f64 has no kernel: the body runs, eagerly and traced.
    let x64 = x.cast(DType::F64);
    let f = function(|(x, g, b): (Tensor, Tensor, Tensor)| nn::layer_norm(&x, &g, &b, 1e-5));
    let out = f.call((x64.clone(), gamma.cast(DType::F64), beta.cast(DType::F64))).unwrap();
    assert_eq!(out.dtype(), DType::F64);
    assert!(!f.concrete_functions()[0].optimized_graph().to_string().contains("kernel["));
}

#[test]
fn lstm_cell_kernel_agrees_with_its_body_on_w7_shapes() {
    let (batch, input, hidden) = (64, 256, 256);
    let x = Tensor::randn(&[batch, input], 1);
    let h = Tensor::randn(&[batch, hidden], 2);
    let c = Tensor::randn(&[batch, hidden], 3);
    let w_ih = Tensor::randn(&[input, 4 * hidden], 4) * 0.05;
    let w_hh = Tensor::randn(&[hidden, 4 * hidden], 5) * 0.05;
    let b = Tensor::randn(&[4 * hidden], 6) * 0.1;
    let cell = |(x, h, c, w_ih, w_hh, b): (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)| {
        nn::lstm_cell(&x, &h, &c, &w_ih, &w_hh, &b)
    };
    let ((h1, c1), (h2, c2), (h3, c3)) = three_ways("tracejit.nn.lstm_cell", cell, (x, h, c, w_ih, w_hh, b));
    assert!(max_err(&h1, &h2) < 1e-5 && max_err(&c1, &c2) < 1e-5, "{} {}", max_err(&h1, &h2), max_err(&c1, &c2));
    assert!(max_err(&h3, &h1) == 0.0 && max_err(&c3, &c1) == 0.0);
    assert_eq!(h1.shape(), &[batch, hidden]);
}

#[test]
fn lstm_cell_gate_order_is_i_f_g_o() {
    // One unit, no input weights: the gates are exactly the bias.
    let (i, f, g, o) = (0.3f32, -0.7f32, 1.1f32, 0.4f32);
    let b = Tensor::from_vec(vec![i, f, g, o], &[4]);
    let x = Tensor::zeros(&[1, 1], DType::F32);
    let h = Tensor::zeros(&[1, 1], DType::F32);
    let c = Tensor::from_vec(vec![2.0f32], &[1, 1]);
    let w = Tensor::zeros(&[1, 4], DType::F32);
    let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
    let c_new = sig(f) * 2.0 + sig(i) * g.tanh();
    let h_new = sig(o) * c_new.tanh();
    let (h2, c2) = nn::lstm_cell(&x, &h, &c, &w, &w, &b);
    assert!((values(&c2)[0] - c_new).abs() < 1e-6 && (values(&h2)[0] - h_new).abs() < 1e-6);
}

#[test]
fn cross_entropy_and_dense_are_composites_without_kernels() {
    let logits = ramp(&[4, 10], 3.0);
    let labels = Tensor::from_vec(vec![3i64, 0, 9, 5], &[4]);
    let f = function(|(l, y): (Tensor, Tensor)| nn::softmax_cross_entropy_with_logits(&l, &y.one_hot(10, DType::F32)));
    let loss = f.call((logits.clone(), labels.clone())).unwrap();
    assert_eq!(loss.shape(), &[4]);
    let lsm = values(&nn::log_softmax(&logits, -1));
    let expect: Vec<f32> = [3usize, 0, 9, 5].iter().enumerate().map(|(r, &k)| -lsm[r * 10 + k]).collect();
    assert!(values(&loss).iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-5), "{loss:?} {expect:?}");
    let traced = f.concrete_functions()[0].graph().to_string();
    assert!(traced.contains("implements=\"tracejit.nn.softmax_cross_entropy_with_logits\""), "{traced}");

    let x = ramp(&[3, 4], 1.0);
    let w = ramp(&[4, 5], 1.0);
    let b = ramp(&[5], 1.0);
    for act in [Activation::Linear, Activation::Relu, Activation::Gelu, Activation::Tanh, Activation::Sigmoid] {
        let f = function(move |(x, w, b): (Tensor, Tensor, Tensor)| nn::dense(&x, &w, &b, act));
        let out = f.call((x.clone(), w.clone(), b.clone())).unwrap();
        let expect = act.apply(&(x.matmul(&w) + &b));
        assert!(max_err(&out, &expect) < 1e-6, "{act:?}");
        let g = f.concrete_functions()[0].optimized_graph().clone();
        assert_eq!(count_ops(&g, "matmul"), 1);
        assert!(g.nodes().any(|(_, n)| matches!(n.op, Op::MatMul)), "the matmul is not fused\n{g}");
        if act != Activation::Linear {
            assert!(g.nodes().any(|(_, n)| matches!(n.op, Op::Fused { .. })), "the epilogue is a region\n{g}");
        }
    }
}

#[test]
fn a_traced_composite_call_carries_its_implements_attribute() {
    let f = function(|x: Tensor| nn::softmax(&x, -1) + 1.0);
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 8])).unwrap();
    let g = cf.graph().to_string();
    assert!(g.contains("call @f0 \"softmax\"") && g.contains("implements=\"tracejit.nn.softmax\""), "{g}");
    // Unknown dims are fine for the softmax kernel.
    assert!(cf.optimized_graph().to_string().contains("kernel[\"tracejit.nn.softmax\"]"));
    let out = f.call(ramp(&[2, 8], 2.0)).unwrap();
    assert_eq!(out.shape(), &[2, 8]);
}
