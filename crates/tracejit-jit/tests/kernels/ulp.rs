//! ULP sweep of the in-kernel f32 approximations (exp, log, tanh, sigmoid,
//! erf) against f64 references: a dense sweep over every binade of both
//! signs plus edge cases (±0, ±inf, NaN, subnormals, overflow). Fails if an
//! approximation gets worse than the bound documented in the crate docs.

use crate::common;
use common::*;
use tracejit_ir::tensor::{DType, Storage, UnaryOp};
use tracejit_ir::{Graph, Op};

/// Position of a float on the ordered integer line.
fn ordered(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN - b } else { b })
}

fn sweep(op: UnaryOp, reference: impl Fn(f64) -> f64) -> i64 {
    let xs = sweep_inputs();
    let mut g = Graph::new(op.name());
    let p = param(&mut g, DType::F32, &[xs.len()]);
    let y = node(&mut g, Op::Unary(op), &[p]);
    g.outputs.push(y);
    let region = tracejit_jit::compile_region(&g).unwrap();
    let input = Storage::from_vec(xs.clone(), &[xs.len()]).unwrap();
    let out = region.run(&[&input]);
    let got = out[0].to_vec::<f32>().unwrap();
    let mut worst = 0i64;
    let mut at = 0.0f32;
    for (&x, &y) in xs.iter().zip(&got) {
        let r = reference(f64::from(x)) as f32;
        if r.is_nan() {
            assert!(y.is_nan(), "{}({x:e}) = {y:e}, expected NaN", op.name());
            continue;
        }
        assert!(!y.is_nan(), "{}({x:e}) = NaN, expected {r:e}", op.name());
        if r.is_infinite() || y.is_infinite() {
            assert_eq!(r, y, "{}({x:e})", op.name());
            continue;
        }
        let d = (ordered(y) - ordered(r)).abs();
        if d > worst {
            worst = d;
            at = x;
        }
    }
    eprintln!("{}: max {worst} ULP at x = {at:e}", op.name());
    worst
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn exp_ulp() {
    let w = sweep(UnaryOp::Exp, f64::exp);
    assert!(w <= 1, "exp: {w} ULP");
}

#[test]
fn log_ulp() {
    let w = sweep(UnaryOp::Log, f64::ln);
    assert!(w <= 4, "log: {w} ULP");
}

#[test]
fn tanh_ulp() {
    let w = sweep(UnaryOp::Tanh, f64::tanh);
    assert!(w <= 4, "tanh: {w} ULP");
}

#[test]
fn sigmoid_ulp() {
    let w = sweep(UnaryOp::Sigmoid, sigmoid);
    assert!(w <= 2, "sigmoid: {w} ULP");
}

#[test]
fn erf_ulp() {
    let w = sweep(UnaryOp::Erf, libm::erf);
    // Its worst input (3.4492028, found by checking every f32 in [0, 4])
    // is among the sweep's edge cases.
    assert!(w <= 6, "erf: {w} ULP");
}

// sinh, cosh, atan and softplus go through the reference's element rule (a
// helper call), so the JIT is bit-identical to the interpreter (smoke.rs);
// these bounds are the reference's own accuracy against f64.

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

#[test]
fn sinh_ulp() {
    let w = sweep(UnaryOp::Sinh, f64::sinh);
    assert!(w <= 2, "sinh: {w} ULP");
}

#[test]
fn cosh_ulp() {
    let w = sweep(UnaryOp::Cosh, f64::cosh);
    assert!(w <= 2, "cosh: {w} ULP");
}

#[test]
fn atan_ulp() {
    let w = sweep(UnaryOp::Atan, f64::atan);
    assert!(w <= 2, "atan: {w} ULP");
}

#[test]
fn softplus_ulp() {
    let w = sweep(UnaryOp::Softplus, softplus);
    assert!(w <= 2, "softplus: {w} ULP");
}
