//! One implementation of f32 `exp`, `tanh`, `sigmoid` and `erf`: the JIT's in-line
//! Cranelift code (vector loop and scalar tail), the staged AVX2 chunk
//! functions, and `tracejit_jit::fastmath` (scalar and in-place slice
//! forms, which the `tracejit-nn` kernels call) must agree **bit for bit**
//! on every input of the ULP sweep: every binade of both signs, subnormals,
//! ±0, ±inf, huge and tiny values, the clamp edges. NaN results must be NaN
//! everywhere; their sign and payload are not compared (the JIT documents
//! that it does not preserve them).
//!
//! The in-line and staged kernels are compiled side by side with explicit
//! [`JitOptions`], whatever `TRACEJIT_JIT_STAGE` says. On a CPU without
//! AVX2 + FMA "staged" compiles the in-line code too, and the slice forms
//! run the scalar functions; the comparison still holds.

use crate::common;
use common::*;
use tracejit_ir::tensor::{DType, Storage, UnaryOp};
use tracejit_ir::{Graph, Op};
use tracejit_jit::{compile_region_with, fastmath, simd, JitOptions};

/// `op` over `xs` by a one-node region compiled under `options`.
fn region(op: UnaryOp, xs: &[f32], options: &JitOptions) -> Vec<f32> {
    let mut g = Graph::new(op.name());
    let p = param(&mut g, DType::F32, &[xs.len()]);
    let y = node(&mut g, Op::Unary(op), &[p]);
    g.outputs.push(y);
    let region = compile_region_with(&g, options).unwrap();
    let input = Storage::from_vec(xs.to_vec(), &[xs.len()]).unwrap();
    region.run(&[&input])[0].to_vec::<f32>().unwrap()
}

/// Same bits, or NaN on both sides.
fn assert_same(op: UnaryOp, what: &str, xs: &[f32], got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    let mut differ = 0usize;
    let mut first = None;
    for ((&x, &g), &w) in xs.iter().zip(got).zip(want) {
        let same = if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() };
        if !same {
            differ += 1;
            first.get_or_insert((x, g, w));
        }
    }
    if let Some((x, g, w)) = first {
        panic!("{} {what}: {differ} of {} inputs differ; first {x:e}: {g:e} vs fastmath {w:e}", op.name(), xs.len());
    }
}

fn check(op: UnaryOp, scalar: fn(f32) -> f32, in_place: fn(&mut [f32])) {
    let xs = sweep_inputs();
    let want: Vec<f32> = xs.iter().map(|&x| scalar(x)).collect();

    let mut slice = xs.clone();
    in_place(&mut slice);
    assert_same(op, "fastmath slice (the nn kernels' path)", &xs, &slice, &want);

    let base = JitOptions::from_env();
    let inline = region(op, &xs, &JitOptions { stage: false, ..base });
    assert_same(op, "in-line JIT code", &xs, &inline, &want);
    for avx512 in [true, false] {
        let isa = tracejit_kernels::Isa::native().with_avx512(avx512);
        let staged =
            region(op, &xs, &JitOptions { stage: true, ..base }.for_target(tracejit_jit::Target::for_isa(isa)));
        assert_same(
            op,
            if avx512 { "staged JIT code (16 lanes)" } else { "staged JIT code (8 lanes)" },
            &xs,
            &staged,
            &want,
        );
    }

    // The in-line code's scalar form: a region of 3 elements has no vector
    // iteration. Every 97th input and every special value go through it.
    let specials = xs.iter().copied().filter(|x| !x.is_finite() || x.abs() < 1e-30 || x.abs() > 80.0);
    let some: Vec<f32> = xs.iter().copied().step_by(97).chain(specials).collect();
    let mut tail = Vec::with_capacity(some.len());
    for chunk in some.chunks(3) {
        let mut c = chunk.to_vec();
        c.resize(3, 0.0);
        tail.extend_from_slice(&region(op, &c, &JitOptions { stage: false, ..base })[..chunk.len()]);
    }
    let want_some: Vec<f32> = some.iter().map(|&x| scalar(x)).collect();
    assert_same(op, "in-line JIT code (scalar tail)", &some, &tail, &want_some);
}

#[test]
fn exp_agrees_bitwise() {
    check(UnaryOp::Exp, fastmath::exp, simd::exp_in_place);
}

#[test]
fn tanh_agrees_bitwise() {
    check(UnaryOp::Tanh, fastmath::tanh, simd::tanh_in_place);
}

#[test]
fn sigmoid_agrees_bitwise() {
    check(UnaryOp::Sigmoid, fastmath::sigmoid, simd::sigmoid_in_place);
}

#[test]
fn erf_agrees_bitwise() {
    check(UnaryOp::Erf, fastmath::erf, simd::erf_in_place);
}
