//! Reductions in fused regions against the interpreter: row reductions
//! (trailing axes, keepdims or not, chained passes: softmax, layernorm) and
//! column reductions (leading axes, exact order), with elementwise prologues
//! and epilogues, every numeric dtype, empty extents.

use crate::common;
use common::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};

fn reduce(g: &mut Graph, op: ReduceOp, x: ValueId, axes: &[usize], keepdims: bool) -> ValueId {
    node(g, Op::Reduce { op, axes: axes.to_vec(), keepdims }, &[x])
}

/// Float tolerance: `n·ε·Σ|x|`-style bound for sums, exact for the rest.
fn check(g: &Graph, inputs: &[Storage], op: ReduceOp, exact: bool) {
    let region = tracejit_jit::compile_region(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    let refs: Vec<&Storage> = inputs.iter().collect();
    let got = region.run(&refs);
    let want = tracejit_ir::interpret(g, inputs).unwrap();
    for (k, (x, y)) in got.iter().zip(&want).enumerate() {
        let r = if exact || !x.dtype().is_float() {
            // max/min: the sign of a zero may differ; compare as values.
            if matches!(op, ReduceOp::Max | ReduceOp::Min) && x.dtype().is_float() {
                close(x, y, 0.0, 0.0)
            } else {
                exact_eq(x, y)
            }
        } else {
            close(x, y, 3e-4, 1e-11)
        };
        if let Err(e) = r {
            panic!("{} output {k}: {e}\n{g}", op.name());
        }
    }
}

#[test]
fn row_reductions_all_ops_and_dtypes() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 17], &[1]),
        (&[4, 1023], &[1]),
        (&[2, 3, 5], &[1, 2]),
        (&[5], &[0]),
        (&[2, 3, 5], &[2]),
        (&[4, 4], &[0, 1]),
    ];
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for op in ReduceOp::ALL {
            if op.result_dtype(dt).is_none() {
                continue;
            }
            for (shape, axes) in cases {
                for keepdims in [false, true] {
                    let mut g = Graph::new("row");
                    let x = param(&mut g, dt, shape);
                    // Prologue x * x (ints wrap, floats exact).
                    let sq = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, x]);
                    let xs = if op == ReduceOp::Prod { x } else { sq };
                    let r = reduce(&mut g, op, xs, axes, keepdims);
                    g.outputs.push(r);
                    let special = matches!(op, ReduceOp::Max | ReduceOp::Min);
                    check(&g, &[data(dt, shape, 11, special)], op, false);
                }
            }
        }
    }
}

#[test]
fn row_reduction_with_epilogue_and_two_outputs() {
    for dt in [DType::F32, DType::F64] {
        let mut g = Graph::new("norm");
        let x = param(&mut g, dt, &[7, 33]);
        let s = reduce(&mut g, ReduceOp::Sum, x, &[1], true);
        let d = node(&mut g, Op::Binary(BinaryOp::Div), &[x, s]);
        let two = scalar(&mut g, dt, 2.0);
        let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[d, two]);
        g.outputs.push(y);
        g.outputs.push(s);
        check(&g, &[data(dt, &[7, 33], 3, false)], ReduceOp::Sum, false);
    }
}

#[test]
fn empty_extents() {
    for shape in [&[4usize, 0][..], &[0, 4]] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Prod] {
            let mut g = Graph::new("empty");
            let x = param(&mut g, DType::F32, shape);
            let r = reduce(&mut g, op, x, &[1], false);
            g.outputs.push(r);
            check(&g, &[data(DType::F32, shape, 1, false)], op, true);
        }
    }
}

#[test]
#[should_panic(expected = "cannot reduce an empty axis")]
fn max_of_empty_axis_panics_like_the_reference() {
    let mut g = Graph::new("empty");
    let x = g.add_param(tracejit_ir::TensorType::from_spec(DType::F32, &[4, -1]));
    let r = reduce(&mut g, ReduceOp::Max, x, &[1], false);
    g.outputs.push(r);
    let region = tracejit_jit::compile_region(&g).unwrap();
    region.run(&[&Storage::full(&[4, 0], DType::F32, 0.0)]);
}

fn softmax(dt: DType, shape: &[usize]) -> Graph {
    let mut g = Graph::new("softmax");
    let x = param(&mut g, dt, shape);
    let last = shape.len() - 1;
    let m = reduce(&mut g, ReduceOp::Max, x, &[last], true);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[last], true);
    let y = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs.push(y);
    g
}

#[test]
fn softmax_pattern() {
    for dt in [DType::F32, DType::F64] {
        for shape in [&[5usize, 37][..], &[3, 4, 1023], &[1, 2], &[2, 4097]] {
            let g = softmax(dt, shape);
            let region = tracejit_jit::compile_region(&g).unwrap();
            let xs = data(dt, shape, 5, false);
            let got = region.run(&[&xs]);
            let want = tracejit_ir::interpret(&g, &[xs]).unwrap();
            close(&got[0], &want[0], 2e-6, 1e-13).unwrap_or_else(|e| panic!("{dt} {shape:?}: {e}"));
        }
    }
}

fn layernorm(dt: DType, m: usize, c: usize) -> Graph {
    let mut g = Graph::new("layernorm");
    let x = param(&mut g, dt, &[m, c]);
    let gamma = param(&mut g, dt, &[c]);
    let beta = param(&mut g, dt, &[c]);
    let mean = reduce(&mut g, ReduceOp::Mean, x, &[1], true);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, mean]);
    let d2 = node(&mut g, Op::Binary(BinaryOp::Mul), &[d, d]);
    let var = reduce(&mut g, ReduceOp::Mean, d2, &[1], true);
    let eps = scalar(&mut g, dt, 1e-5);
    let ve = node(&mut g, Op::Binary(BinaryOp::Add), &[var, eps]);
    let rs = node(&mut g, Op::Unary(UnaryOp::Rsqrt), &[ve]);
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[d, rs]);
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, gamma]);
    let y = node(&mut g, Op::Binary(BinaryOp::Add), &[y, beta]);
    g.outputs.push(y);
    g
}

#[test]
fn layernorm_pattern() {
    for dt in [DType::F32, DType::F64] {
        for (m, c) in [(4usize, 1024usize), (3, 17), (1, 5)] {
            let g = layernorm(dt, m, c);
            let region = tracejit_jit::compile_region(&g).unwrap();
            let ins = [data(dt, &[m, c], 1, false), data(dt, &[c], 2, false), data(dt, &[c], 3, false)];
            let refs: Vec<&Storage> = ins.iter().collect();
            let got = region.run(&refs);
            let want = tracejit_ir::interpret(&g, &ins).unwrap();
            let tol = if dt == DType::F32 { 2e-5 } else { 1e-12 };
            close_abs(&got[0], &want[0], tol).unwrap_or_else(|e| panic!("{dt} {m}x{c}: {e}"));
        }
    }
}

#[test]
fn column_reductions_are_exact() {
    let cases: &[(&[usize], &[usize])] =
        &[(&[33, 17], &[0]), (&[64, 512], &[0]), (&[2, 3, 5], &[0, 1]), (&[3, 2, 9], &[0])];
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for op in ReduceOp::ALL {
            if op.result_dtype(dt).is_none() {
                continue;
            }
            for (shape, axes) in cases {
                for keepdims in [false, true] {
                    let mut g = Graph::new("col");
                    let x = param(&mut g, dt, shape);
                    let two = scalar(&mut g, dt, 2.0);
                    let p = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, two]);
                    let r = reduce(&mut g, op, p, axes, keepdims);
                    let one = scalar(&mut g, dt, 1.0);
                    let y = node(&mut g, Op::Binary(BinaryOp::Add), &[r, one]);
                    g.outputs.push(y);
                    // A full-size output alongside (no reduction dependence).
                    g.outputs.push(p);
                    assert!(tracejit_jit::supports(&g), "{}", tracejit_jit::unsupported_reason(&g).unwrap());
                    check(&g, &[data(dt, shape, 21, false)], op, true);
                }
            }
        }
    }
}

#[test]
fn bias_gradient_pattern() {
    // sum over the batch of g * (x > 0), the relu backward + bias grad.
    let mut g = Graph::new("bias_grad");
    let gr = param(&mut g, DType::F32, &[64, 512]);
    let x = param(&mut g, DType::F32, &[64, 512]);
    let zero = scalar(&mut g, DType::F32, 0.0);
    let m = node(&mut g, Op::Binary(BinaryOp::Gt), &[x, zero]);
    let z = node(&mut g, Op::Select, &[m, gr, zero]);
    let s = reduce(&mut g, ReduceOp::Sum, z, &[0], false);
    g.outputs.push(s);
    g.outputs.push(z);
    check(&g, &[data(DType::F32, &[64, 512], 1, false), data(DType::F32, &[64, 512], 2, false)], ReduceOp::Sum, true);
}

#[test]
fn unsupported_shapes_are_rejected() {
    // Middle-axis reduction.
    let mut g = Graph::new("mid");
    let x = param(&mut g, DType::F32, &[2, 3, 4]);
    let r = reduce(&mut g, ReduceOp::Sum, x, &[1], false);
    g.outputs.push(r);
    assert!(!tracejit_jit::supports(&g));
    // Chained column reductions.
    let mut g = Graph::new("colchain");
    let x = param(&mut g, DType::F32, &[5, 4]);
    let m = reduce(&mut g, ReduceOp::Mean, x, &[0], true);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let v = reduce(&mut g, ReduceOp::Sum, d, &[0], true);
    g.outputs.push(v);
    assert!(!tracejit_jit::supports(&g));
    // Reducing a static size-1 axis (left to the reference kernel).
    let mut g = Graph::new("unit");
    let x = param(&mut g, DType::F32, &[4, 1]);
    let r = reduce(&mut g, ReduceOp::Sum, x, &[1], true);
    g.outputs.push(r);
    assert!(!tracejit_jit::supports(&g));
    // A transpose is not fusible.
    let mut g = Graph::new("t");
    let x = param(&mut g, DType::F32, &[2, 3]);
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[x]);
    g.outputs.push(t);
    assert!(!tracejit_jit::supports(&g));
}

#[test]
fn unknown_dims_and_runtime_broadcast() {
    // x: [?, ?] + b: [?]; b of size 1 at run time broadcasts.
    let mut g = Graph::new("dyn");
    let x = g.add_param(tracejit_ir::TensorType::from_spec(DType::F32, &[-1, -1]));
    let b = g.add_param(tracejit_ir::TensorType::from_spec(DType::F32, &[-1]));
    let y = node(&mut g, Op::Binary(BinaryOp::Add), &[x, b]);
    let y = node(&mut g, Op::Unary(UnaryOp::Relu), &[y]);
    g.outputs.push(y);
    let region = tracejit_jit::compile_region(&g).unwrap();
    for (xs, bs) in [(&[3usize, 17][..], &[17usize][..]), (&[3, 17], &[1]), (&[1, 9], &[9]), (&[4, 1], &[6])] {
        let ins = [data(DType::F32, xs, 1, true), data(DType::F32, bs, 2, true)];
        let got = region.run(&[&ins[0], &ins[1]]);
        let want = tracejit_ir::interpret(&g, &ins).unwrap();
        exact_eq(&got[0], &want[0]).unwrap();
    }
    // A size conflict is the interpreter's error.
    let ins = [data(DType::F32, &[3, 4], 1, false), data(DType::F32, &[5], 2, false)];
    assert!(region.try_run(&[&ins[0], &ins[1]]).is_err());
}

#[test]
fn non_contiguous_inputs() {
    let mut g = Graph::new("nc");
    let x = param(&mut g, DType::F64, &[5, 3]);
    let y = node(&mut g, Op::Unary(UnaryOp::Neg), &[x]);
    g.outputs.push(y);
    let region = tracejit_jit::compile_region(&g).unwrap();
    let base = data(DType::F64, &[3, 5], 4, true);
    let t = tracejit_ir::tensor::kernels::transpose(&base, &[1, 0]);
    assert!(!t.is_standard_layout());
    let got = region.run(&[&t]);
    let want = tracejit_ir::interpret(&g, &[t]).unwrap();
    exact_eq(&got[0], &want[0]).unwrap();
}

/// Transcendentals in every position of a row region — feeding a reduction,
/// read again in a later pass, first needed in the final pass, nested, and
/// shared by two reductions — which is where the staged (chunk function)
/// code differs from the in-line code. CI also runs this file with
/// `TRACEJIT_JIT_STAGE=0`.
/// `d = x - max(x)`, `e = exp(d)` and `s = sum(e)` over axis 1 (kept).
fn shifted_exp(g: &mut Graph, x: ValueId) -> (ValueId, ValueId, ValueId) {
    let m = reduce(g, ReduceOp::Max, x, &[1], true);
    let d = node(g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = reduce(g, ReduceOp::Sum, e, &[1], true);
    (d, e, s)
}

#[test]
fn transcendentals_in_every_pass_of_a_row_region() {
    type Build = fn(&mut Graph, ValueId) -> Vec<ValueId>;
    let patterns: [(&str, Build); 4] = [
        ("log_softmax", |g, x| {
            let (d, _, s) = shifted_exp(g, x);
            let l = node(g, Op::Unary(UnaryOp::Log), &[s]);
            vec![node(g, Op::Binary(BinaryOp::Sub), &[d, l])]
        }),
        ("sigmoid in the final pass", |g, x| {
            let m = reduce(g, ReduceOp::Mean, x, &[1], true);
            let d = node(g, Op::Binary(BinaryOp::Sub), &[x, m]);
            vec![node(g, Op::Unary(UnaryOp::Sigmoid), &[d])]
        }),
        ("nested, read again later", |g, x| {
            let (_, e, s) = shifted_exp(g, x);
            let t = node(g, Op::Unary(UnaryOp::Tanh), &[e]);
            vec![node(g, Op::Binary(BinaryOp::Div), &[t, s]), e]
        }),
        ("one value, two reductions", |g, x| {
            let t = node(g, Op::Unary(UnaryOp::Tanh), &[x]);
            let s = reduce(g, ReduceOp::Sum, t, &[1], false);
            let m = reduce(g, ReduceOp::Max, t, &[1], false);
            vec![s, m]
        }),
    ];
    for (name, build) in patterns {
        for shape in [[3usize, 17], [2, 5], [4, 1023], [1, 4097], [0, 17]] {
            let mut g = Graph::new(name);
            let x = param(&mut g, DType::F32, &shape);
            g.outputs = build(&mut g, x);
            let region = tracejit_jit::compile_region(&g).unwrap_or_else(|e| panic!("{name}: {e}\n{g}"));
            let xs = data(DType::F32, &shape, 11, true);
            let got = region.run(&[&xs]);
            let want = tracejit_ir::interpret(&g, &[xs]).unwrap();
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                close_abs(a, b, 1e-5).unwrap_or_else(|e| panic!("{name} {shape:?} output {k}: {e}"));
            }
        }
    }
}

/// The final pass of a row region divides by a row invariant as a
/// multiplication by its reciprocal (see the JIT's `kernel::recip`): within
/// one epsilon of the division on rows whose divisor has a normal
/// reciprocal, and bit for bit the division on the others (zero, inf, NaN,
/// subnormal and huge divisors).
#[test]
fn division_by_a_row_invariant_matches_the_division() {
    for dt in [DType::F32, DType::F64] {
        let (tiny, huge, sub) = if dt == DType::F32 {
            (f64::from(f32::MIN_POSITIVE), f64::from(f32::MAX) / 2.0, 1e-40)
        } else {
            (f64::MIN_POSITIVE, f64::MAX / 2.0, 1e-310)
        };
        // Divisors (one per row); the first rows stay on the fast path.
        let divisors =
            [3.0, -0.7, 1e-3, tiny * 4.0, 1e30, 0.0, -0.0, f64::INFINITY, f64::NAN, sub, -sub, huge, tiny / 2.0];
        let slow_from = 5;
        for n in [2usize, 3, 5, 17, 1023] {
            let rows = divisors.len();
            let mut g = Graph::new("divide");
            let x = param(&mut g, dt, &[rows, n]);
            let w = param(&mut g, dt, &[rows, n]);
            // The divisor is a row reduction, so this is a row region.
            let s = reduce(&mut g, ReduceOp::Sum, w, &[1], true);
            // `x + w` ties x's axes to w's (the region's domain); it is x
            // but for the first column.
            let num = node(&mut g, Op::Binary(BinaryOp::Add), &[x, w]);
            let q = node(&mut g, Op::Binary(BinaryOp::Div), &[num, s]);
            g.outputs.push(q);
            let xs = data(dt, &[rows, n], 5, true);
            // Each row sums to its divisor (`d + -0.0 == d`, also for -0).
            let pairs: Vec<f64> =
                divisors.iter().flat_map(|&d| std::iter::once(d).chain(std::iter::repeat_n(-0.0, n - 1))).collect();
            let ws = if dt == DType::F32 {
                Storage::from_vec(pairs.iter().map(|&d| d as f32).collect::<Vec<_>>(), &[rows, n]).unwrap()
            } else {
                Storage::from_vec(pairs, &[rows, n]).unwrap()
            };
            let region = tracejit_jit::compile_region(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
            let got = f64s(&region.run(&[&xs, &ws])[0]);
            let want = f64s(&tracejit_ir::interpret(&g, &[xs.clone(), ws.clone()]).unwrap()[0]);
            let eps = if dt == DType::F32 { f64::from(f32::EPSILON) } else { f64::EPSILON };
            for (k, (a, b)) in got.iter().zip(want.iter()).enumerate() {
                let row = k / n;
                let ok = if row >= slow_from {
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                } else {
                    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= eps * b.abs()
                };
                assert!(ok, "{dt} n={n} row {row} (divisor {}): jit {a:e} vs interpreter {b:e}", divisors[row]);
            }
        }
    }
}

fn f64s(s: &Storage) -> Vec<f64> {
    match s.dtype() {
        DType::F32 => s.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        DType::F64 => s.to_vec::<f64>().unwrap(),
        other => panic!("not a float storage: {other}"),
    }
}

/// Max and min take a NaN-blind vector step and reduce a row that holds a
/// NaN again in order: the result is the reference's bit for bit — the
/// row's first NaN with its payload, wherever it sits (unrolled loop,
/// one-vector loop, scalar tail), and the plain extremum elsewhere.
#[test]
fn max_and_min_keep_the_first_nan_of_a_row_bit_for_bit() {
    let quiet = [f32::from_bits(0x7fc0_0001), f32::from_bits(0xffc0_1234)];
    for op in [ReduceOp::Max, ReduceOp::Min] {
        for n in [2usize, 3, 4, 5, 17, 37, 1023] {
            for at in [0, n / 3, n / 2, n.saturating_sub(2), n - 1] {
                let mut g = Graph::new("nan_row");
                let x = param(&mut g, DType::F32, &[3, n]);
                let r = reduce(&mut g, op, x, &[1], false);
                g.outputs.push(r);
                let mut v: Vec<f32> = (0..3 * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25).collect();
                // Row 0: one NaN; row 1: two NaNs with different payloads
                // (the first wins); row 2: none, with infinities.
                v[at] = quiet[0];
                v[n + at] = quiet[1];
                v[n + n - 1] = quiet[0];
                v[2 * n + at] = f32::INFINITY;
                v[2 * n] = f32::NEG_INFINITY;
                let xs = Storage::from_vec(v, &[3, n]).unwrap();
                let region = tracejit_jit::compile_region(&g).unwrap();
                let got = region.run(&[&xs]);
                let want = tracejit_ir::interpret(&g, std::slice::from_ref(&xs)).unwrap();
                let (got, want) = (got[0].to_vec::<f32>().unwrap(), want[0].to_vec::<f32>().unwrap());
                for (row, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0),
                        "{} n={n} NaN at {at}, row {row}: {a:?} ({:#x}) vs reference {b:?} ({:#x})",
                        op.name(),
                        a.to_bits(),
                        b.to_bits()
                    );
                }
            }
        }
    }
}
