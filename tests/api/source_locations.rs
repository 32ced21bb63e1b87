//! Every node records the user's source line (never a line inside
//! tracejit): op methods, operators, constructors-in-ops, composites (and
//! their bodies once inlined), gradients and optimizer steps. Listings and
//! DOT show it; errors at trace time and at run time name it.

use std::panic::Location;

use tracejit::ir::{Graph, Op};
use tracejit::optim::{Optimizer, Sgd};
use tracejit::prelude::*;

const THIS_FILE: &str = "source_locations.rs";

/// The lines (in this file) of the nodes of `g` that are not parameters or
/// constants; fails for a node without a location or with one elsewhere.
fn node_lines(g: &Graph) -> Vec<u32> {
    let mut lines = Vec::new();
    for (id, node) in g.nodes() {
        if matches!(node.op, Op::Parameter { .. } | Op::Constant { .. }) {
            continue;
        }
        let loc = node.location.unwrap_or_else(|| panic!("{id} ({}) has no location\n{g}", node.op.name()));
        assert!(loc.file().ends_with(THIS_FILE), "{id} ({}) is located at {loc}\n{g}", node.op.name());
        lines.push(loc.line());
    }
    lines
}

/// The line of this file that contains `needle` (once; the lines asking
/// for it do not count).
fn line_of(needle: &str) -> u32 {
    let hits: Vec<usize> = include_str!("source_locations.rs")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle) && !l.contains("line_of("))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "`{needle}` must be on exactly one line");
    hits[0] as u32 + 1
}

#[track_caller]
fn here() -> u32 {
    Location::caller().line()
}

#[test]
fn every_op_method_and_operator_records_the_users_line() {
    let start = here();
    let f = function(|(x, i): (Tensor, Tensor)| {
        let a = (&x * 2.0 + 1.0 - &x) / 3.0;
        let b = -a.exp().tanh().relu().abs().sqrt().sigmoid().log1p();
        let c = b.maximum(&x).minimum(0.5).pow(2.0).rem(7.0);
        let d = Tensor::select(&c.gt(0.1), &c, &x).clamp(-1.0, 1.0).cast(DType::F64).cast(DType::F32);
        let e = d.reshape(&[2, 3]).transpose(&[1, 0]).expand_dims(0).squeeze(&[0]).broadcast_to(&[2, 3, 2]);
        let s = e.sum(&[0], false).max(&[1], true).mean_all() + e.prod_all() + e.min_all();
        let m = x.reshape(&[2, 3]).matmul(&x.reshape(&[3, 2])).argmax(1, false).cast(DType::F32).sum_all();
        let j = Tensor::concat(&[&x, &x], 0).slice_axis(0, 1, 4).gather(&i, 0);
        let k = Tensor::stack(&[&j, &j], 0).sum_all() + i.one_hot(3, DType::F32).sum_all();
        s + m + k + tracejit::nn::gelu(&x).sum_all()
    })
    .selector(false);
    let end = here();
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, -0.5, 1.5], &[6]);
    let i = Tensor::from_vec(vec![2i64, 0], &[2]);
    f.call((x, i)).unwrap();
    let cf = &f.concrete_functions()[0];
    for line in node_lines(cf.graph()) {
        assert!(start < line && line < end, "line {line} is not in the closure (lines {start}..{end})");
    }
    // Inlining the composite keeps the user's line, not tracejit-nn's.
    let gelu_line = line_of("s + m + k + tracejit::nn::gelu(&x)");
    let opt = cf.optimized_graph();
    let mut lines = node_lines(opt);
    for (_, node) in opt.nodes() {
        if let Op::Fused { body } = &node.op {
            lines.extend(node_lines(body));
        }
    }
    assert!(lines.contains(&gelu_line), "no node of the inlined gelu body at line {gelu_line}\n{opt}");
}

#[test]
fn gradient_and_optimizer_nodes_are_the_users_calls() {
    let w = Variable::new(Tensor::from_vec(vec![0.5f32, -0.25], &[2]));
    let opt = Sgd::new(0.1);
    let (w2, opt2) = (w.clone(), opt.clone());
    let step = function(move |x: Tensor| {
        let tape = GradientTape::new();
        let loss = (w2.read() * &x).square().sum_all();
        let grads = tape.gradient(&loss, std::slice::from_ref(&w2)).unwrap();
        opt2.apply_gradients(&[grads[0].clone().unwrap()], std::slice::from_ref(&w2));
        loss
    });
    step.call(Tensor::ones(&[2], DType::F32)).unwrap();
    let g = step.concrete_functions()[0].graph().to_string();
    let lines = node_lines(step.concrete_functions()[0].graph());
    let forward = line_of("let loss = (w2.read() * &x)");
    let gradient = line_of("tape.gradient(&loss, std::slice::from_ref(&w2))");
    let update = line_of("opt2.apply_gradients(&[grads");
    for l in &lines {
        assert!([forward, gradient, update].contains(l), "line {l}\n{g}");
    }
    for l in [forward, gradient, update] {
        assert!(lines.contains(&l), "no node at line {l}\n{g}");
    }
}

#[test]
fn listings_and_dot_show_the_line_and_the_listing_parses_back() {
    let f = function(|x: Tensor| (x * 2.0).exp());
    f.call(Tensor::ones(&[3], DType::F32)).unwrap();
    let line = line_of("function(|x: Tensor| (x * 2.0).exp())");
    let cf = &f.concrete_functions()[0];
    let text = cf.graph().to_string();
    assert!(text.contains(&format!("; tests/api/{THIS_FILE}:{line}")), "{text}");
    let back = Graph::parse(&format!("{:#}", cf.graph())).unwrap();
    assert!(back.structurally_eq(cf.graph()), "{text}");
    let dot = cf.optimized_graph().to_dot();
    assert!(dot.contains(&format!("{THIS_FILE}:{line}")), "{dot}");
}

#[test]
fn errors_name_the_users_line() {
    // At trace time: the op, the types, the function and the line.
    let f = function(|(a, b): (Tensor, Tensor)| &a.exp() + &b).name("mismatch");
    let e = f.call((Tensor::ones(&[3, 4], DType::F32), Tensor::ones(&[5], DType::F32))).unwrap_err();
    let line = line_of("(a, b): (Tensor, Tensor)| &a.exp() + &b");
    let msg = e.to_string();
    for needle in ["add: cannot broadcast [3, 4] with [5]", "mismatch", &format!("{THIS_FILE}:{line}")] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    // At run time (sizes unknown while tracing), compiled and interpreted.
    for jit in [true, false] {
        let g = function(|(a, b): (Tensor, Tensor)| (&a + &b).exp())
            .input_signature(vec![TensorSpec::new(DType::F32, &[-1]), TensorSpec::new(DType::F32, &[-1])])
            .jit(jit);
        let line = line_of("(a, b): (Tensor, Tensor)| (&a + &b).exp()");
        let e = g.call((Tensor::ones(&[3], DType::F32), Tensor::ones(&[4], DType::F32))).unwrap_err().to_string();
        assert!(e.contains("cannot broadcast [3] with [4]"), "jit={jit}: {e}");
        assert!(e.contains(&format!("{THIS_FILE}:{line}")), "jit={jit}: {e}");
    }
}

#[test]
fn a_gradient_error_names_the_op_and_its_line() {
    // Which elements x[-2:3] reads depends on the length, unknown here: the
    // slice's rule cannot place the cotangent.
    let f = function(|x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let picked = x.slice_axis(0, -2, 3);
        match tape.gradient(&picked.sum_all(), &[&x]) {
            Ok(g) => g[0].clone().unwrap(),
            Err(e) => panic!("{e}"),
        }
    })
    .input_signature(vec![TensorSpec::new(DType::F64, &[-1])]);
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]);
    let e = f.call(x).unwrap_err().to_string();
    let line = line_of("let picked = x.slice_axis(0, -2, 3);");
    assert!(e.contains("slice") && e.contains("negative start"), "{e}");
    assert!(e.contains(&format!("{THIS_FILE}:{line}")), "{e}");
}

#[test]
fn a_control_flow_gradient_error_names_its_line() {
    // A loop whose trip count depends on data has no reverse mode.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let out = seen.clone();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = tracejit::while_loop(|y: &Tensor| y.sum_all().lt(100.0), |y: Tensor| y * 2.0, x.clone());
        if let Err(e) = tape.gradient(&y.sum_all(), &[&x]) {
            *out.lock().unwrap() = e.to_string();
        }
        y
    });
    f.call(Tensor::from_vec(vec![1.0f64, 2.0], &[2])).unwrap();
    let e = seen.lock().unwrap().clone();
    let line = line_of("let y = tracejit::while_loop(");
    assert!(e.contains("while") && e.contains("fori_loop"), "{e}");
    assert!(e.contains(&format!("{THIS_FILE}:{line}")), "{e}");
}
