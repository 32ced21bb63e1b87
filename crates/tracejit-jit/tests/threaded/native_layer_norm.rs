//! The hand-written row layer norm (`crate::native`): which regions get it
//! (the whole program a layer norm of one to three summed inputs, each
//! operation in the order the kernel rounds it), and its results against
//! the interpreter and the generated kernel of the same region — random
//! rows of every length around the vector widths, NaN, ±inf and huge
//! values, `ε` a constant or an input, the sum kept as a second output,
//! strided and broadcast inputs, several threads (the bits of one).

use crate::common::*;

use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, TensorType, ValueId};
use tracejit_jit::JitOptions;

/// How the test region is written.
#[derive(Clone, Copy, Debug)]
struct Form {
    /// Inputs summed into `h`: `(t₀ + t₁) + t₂`.
    terms: usize,
    /// `ε` a rank-0 parameter (else a constant).
    eps_param: bool,
    /// `h` is an output too.
    keep_h: bool,
}

fn mean(g: &mut Graph, x: ValueId, axis: usize) -> ValueId {
    node(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![axis], keepdims: true }, &[x])
}

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    node(g, Op::Binary(op), &[a, b])
}

/// `d = h - mean(h)` and `r = rsqrt(mean(d · d) + eps)` over `axis`.
fn statistics(g: &mut Graph, h: ValueId, axis: usize, eps: ValueId) -> (ValueId, ValueId) {
    let m = mean(g, h, axis);
    let d = bin(g, BinaryOp::Sub, h, m);
    let sq = bin(g, BinaryOp::Mul, d, d);
    let v = mean(g, sq, axis);
    let ve = bin(g, BinaryOp::Add, v, eps);
    (d, node(g, Op::Unary(UnaryOp::Rsqrt), &[ve]))
}

/// The layer norm of `form` over the last axis of inputs of dims `spec`
/// (-1: unknown until run), `γ` and `β` of the last dim, in `dt`.
fn layer_norm(dt: DType, spec: &[i64], form: Form) -> Graph {
    let mut g = Graph::new("layer_norm");
    let axis = spec.len() - 1;
    let terms: Vec<ValueId> = (0..form.terms).map(|_| g.add_param(TensorType::from_spec(dt, spec))).collect();
    let gamma = g.add_param(TensorType::from_spec(dt, &spec[axis..]));
    let beta = g.add_param(TensorType::from_spec(dt, &spec[axis..]));
    let eps = if form.eps_param { g.add_param(TensorType::from_spec(dt, &[])) } else { scalar(&mut g, dt, 1e-5) };
    let h = terms[1..].iter().fold(terms[0], |h, &t| bin(&mut g, BinaryOp::Add, h, t));
    let (d, r) = statistics(&mut g, h, axis, eps);
    let t = bin(&mut g, BinaryOp::Mul, d, r);
    let u = bin(&mut g, BinaryOp::Mul, t, gamma);
    let y = bin(&mut g, BinaryOp::Add, u, beta);
    g.outputs.push(y);
    if form.keep_h {
        g.outputs.push(h);
    }
    g
}

fn staged() -> JitOptions {
    JitOptions { stage: true, ..JitOptions::default() }
}

/// Staged, at 16 lanes where the CPU has them (`wide`) or at 8.
fn staged_at(wide: bool) -> JitOptions {
    staged().for_target(tracejit_jit::Target::for_isa(tracejit_kernels::Isa::native().with_avx512(wide)))
}

/// The hand-written kernel's name under `opts`, if this CPU runs one.
fn expected(opts: &JitOptions) -> Option<&'static str> {
    match opts.isa().width()? {
        tracejit_kernels::Width::W16 => Some("row layer norm (16 lanes)"),
        tracejit_kernels::Width::W8 => Some("row layer norm (8 lanes)"),
    }
}

fn native(g: &Graph, opts: &JitOptions) -> Option<&'static str> {
    tracejit_jit::compile_region_with(g, opts).unwrap().native_kernel()
}

const ONE: Form = Form { terms: 1, eps_param: false, keep_h: false };

#[test]
fn only_a_whole_f32_layer_norm_gets_the_hand_written_kernel() {
    for wide in [true, false] {
        let opts = staged_at(wide);
        let want = expected(&opts);
        for terms in 1..=3 {
            for eps_param in [false, true] {
                for keep_h in [false, true] {
                    let form = Form { terms, eps_param, keep_h };
                    let got = native(&layer_norm(DType::F32, &[4, 37], form), &opts);
                    // A kept `h` that is an input is not a sum the region computes.
                    let fits = !keep_h || terms > 1;
                    assert_eq!(got, want.filter(|_| fits), "{form:?}");
                }
            }
        }
        assert_eq!(native(&layer_norm(DType::F32, &[2, 3, 37], ONE), &opts), want);
    }
    // Staging off, f64: generated code.
    assert_eq!(native(&layer_norm(DType::F32, &[4, 37], ONE), &JitOptions { stage: false, ..staged() }), None);
    assert_eq!(native(&layer_norm(DType::F64, &[4, 37], ONE), &staged()), None);
    // Anything else computed: another output, `(d · (r · γ))`, a scaled
    // `h`, a kept statistic.
    let mut g = layer_norm(DType::F32, &[4, 37], ONE);
    let y = g.outputs[0];
    let y2 = bin(&mut g, BinaryOp::Mul, y, y);
    g.outputs[0] = y2;
    assert_eq!(native(&g, &staged()), None);
    let mut g = layer_norm(DType::F32, &[4, 37], ONE);
    let stat = g.nodes().find(|(_, n)| matches!(n.op, Op::Reduce { .. })).map(|(id, _)| ValueId::from(id)).unwrap();
    g.outputs.push(stat);
    assert_eq!(native(&g, &staged()), None);
    let mut g = Graph::new("scaled");
    let x = param(&mut g, DType::F32, &[4, 37]);
    let (gamma, beta) = (param(&mut g, DType::F32, &[37]), param(&mut g, DType::F32, &[37]));
    let two = scalar(&mut g, DType::F32, 2.0);
    let h = bin(&mut g, BinaryOp::Mul, x, two);
    let eps = scalar(&mut g, DType::F32, 1e-5);
    let (d, r) = statistics(&mut g, h, 1, eps);
    let rg = bin(&mut g, BinaryOp::Mul, r, gamma);
    let t = bin(&mut g, BinaryOp::Mul, d, rg);
    let y = bin(&mut g, BinaryOp::Add, t, beta);
    g.outputs.push(y);
    assert_eq!(native(&g, &staged()), None);
}

/// Each output of `got` against `want` of the same region, within the
/// sums' rounding: the mean's error (`n·ε·max|h|`) moves every `y` by at
/// most that times `r·|γ|`, the variance's (relative `n·ε`) scales `y - β`
/// by at most that; NaN where the other is NaN. `h` (the second output)
/// exactly: one rounding per add, in the same order.
fn agree(got: &[Storage], want: &[Storage], inputs: &[Storage], form: Form) -> Result<(), String> {
    let n = *want[0].shape().last().unwrap();
    let f = |s: &Storage| s.to_vec::<f32>().unwrap();
    let (y, w) = (f(&got[0]), f(&want[0]));
    let terms: Vec<Vec<f32>> = inputs[..form.terms].iter().map(f).collect();
    let (gamma, beta) = (f(&inputs[form.terms]), f(&inputs[form.terms + 1]));
    let eps = if form.eps_param { f64::from(f(&inputs[form.terms + 2])[0]) } else { 1e-5 };
    let eps32 = f64::from(f32::EPSILON);
    for (row, (ys, ws)) in y.chunks(n.max(1)).zip(w.chunks(n.max(1))).enumerate() {
        let h: Vec<f64> = (0..n).map(|j| terms.iter().map(|t| f64::from(t[row * n + j])).sum::<f64>()).collect();
        let mean = h.iter().sum::<f64>() / n as f64;
        let var = h.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let r = 1.0 / (var + eps).sqrt();
        let max_h = h.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for j in 0..n {
            let (a, b) = (ys[j], ws[j]);
            if a.is_nan() || b.is_nan() {
                if a.is_nan() != b.is_nan() {
                    return Err(format!("row {row}, {j}: {a} vs {b}"));
                }
                continue;
            }
            let scale = (2.0 * max_h * r + 1.0) * f64::from(gamma[j].abs()) + f64::from(beta[j].abs());
            let tol = 4.0 * (n as f64 + 8.0) * eps32 * scale;
            if (f64::from(a) - f64::from(b)).abs() > tol && a != b {
                return Err(format!("row {row}, element {j}: {a} vs {b} (tolerance {tol:e})"));
            }
        }
    }
    if form.keep_h {
        exact_eq(&got[1], &want[1])?;
    }
    Ok(())
}

/// Random rows with specials in some: NaN, ±inf, 1e30 (whose square
/// overflows the variance) among values of a few units.
fn inputs(rows: usize, n: usize, form: Form, seed: u64, special: bool) -> Vec<Storage> {
    let mut v: Vec<Storage> = (0..form.terms)
        .map(|k| data(DType::F32, &[rows, n], seed + k as u64, special && k == 0 && rows % 2 == 1))
        .collect();
    v.push(data(DType::F32, &[n], seed + 7, false));
    v.push(data(DType::F32, &[n], seed + 8, false));
    if form.eps_param {
        v.push(Storage::scalar_of(DType::F32, 1e-3));
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_interpreter_and_the_generated_kernel(
        r in prop::sample::select(vec![1usize, 2, 3, 7]),
        n in prop::sample::select(vec![1usize, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 64, 65, 255, 384, 1023]),
        terms in 1usize..=3, eps_param in any::<bool>(), keep_h in any::<bool>(),
        special in any::<bool>(), seed in 0u64..1000, wide in any::<bool>(),
    ) {
        let form = Form { terms, eps_param, keep_h: keep_h && terms > 1 };
        // Dims unknown when compiled (rows of 1 are then allowed too).
        let g = layer_norm(DType::F32, &[-1, -1], form);
        let xs = inputs(r, n, form, seed, special);
        let refs: Vec<&Storage> = xs.iter().collect();
        let native = tracejit_jit::compile_region_with(&g, &staged_at(wide)).unwrap();
        let generated = tracejit_jit::compile_region_with(&g, &JitOptions { stage: false, ..staged() }).unwrap();
        prop_assert!(generated.native_kernel().is_none());
        prop_assert_eq!(native.native_kernel(), expected(&staged_at(wide)));
        let got = native.run(&refs);
        let gen = generated.run(&refs);
        let want = tracejit_ir::interpret(&g, &xs).unwrap();
        agree(&got, &want, &xs, form).map_err(|e| TestCaseError::fail(format!("vs interpreter: {e}")))?;
        agree(&got, &gen, &xs, form).map_err(|e| TestCaseError::fail(format!("vs generated kernel: {e}")))?;
    }
}

/// A batch axis, the rows split across 1, 2 and 3 threads (the bits of
/// one), a term that is a strided view, another broadcast along the rows
/// (a bias), at both vector widths.
#[test]
fn strided_broadcast_and_threaded_rows() {
    for wide in [true, false] {
        let opts = staged_at(wide);
        let form = Form { terms: 3, eps_param: false, keep_h: true };
        let g = layer_norm(DType::F32, &[3, 64, 1023], form);
        let xs = inputs(3 * 64, 1023, form, 9, true);
        let xs: Vec<Storage> = xs
            .into_iter()
            .enumerate()
            .map(|(k, s)| if k < 3 { tracejit_ir::tensor::kernels::reshape(&s, &[3, 64, 1023]) } else { s })
            .collect();
        let region = tracejit_jit::compile_region_with(&g, &opts).unwrap();
        assert_eq!(region.native_kernel(), expected(&opts));
        let want = tracejit_ir::interpret(&g, &xs).unwrap();
        let refs: Vec<&Storage> = xs.iter().collect();
        let _s = crate::serial();
        tracejit_jit::threads::set_split_threshold(1);
        let mut outs = Vec::new();
        for t in [1, 2, 3] {
            tracejit_jit::threads::set_num_threads(t);
            outs.push(region.run(&refs));
        }
        tracejit_jit::threads::set_split_threshold(tracejit_jit::threads::DEFAULT_SPLIT_THRESHOLD);
        tracejit_jit::threads::set_num_threads(1);
        for o in &outs {
            assert!(o[0].bit_eq(&outs[0][0]) && o[1].bit_eq(&outs[0][1]), "thread counts disagree");
        }
        agree(&outs[0], &want, &xs, form).unwrap();
        // Every other row of a [6, 1023] as the first term, a bias
        // broadcast along the rows as the second.
        let form = Form { terms: 2, eps_param: true, keep_h: false };
        let g = layer_norm(DType::F32, &[3, 1023], form);
        let big = data(DType::F32, &[6, 1023], 4, false);
        let every = |step| SliceSpec { start: None, stop: None, step };
        let view = tracejit_ir::tensor::kernels::slice(&big, &[every(2), every(1)]);
        assert!(!view.is_standard_layout());
        let bias = tracejit_ir::tensor::kernels::broadcast_to(&data(DType::F32, &[1023], 5, false), &[3, 1023]);
        let mut xs = inputs(3, 1023, form, 3, false);
        xs[0] = view;
        xs[1] = bias;
        let region = tracejit_jit::compile_region_with(&g, &opts).unwrap();
        let refs: Vec<&Storage> = xs.iter().collect();
        let got = region.run(&refs);
        let want = tracejit_ir::interpret(&g, &xs).unwrap();
        agree(&got, &want, &xs, form).unwrap();
    }
}
