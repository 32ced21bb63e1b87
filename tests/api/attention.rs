//! `nn::scaled_dot_product_attention`: the flash-attention kernel (eager
//! and compiled) against a float64 evaluation of the formula written here,
//! on random problems of odd sizes with masks, the causal rule and
//! broadcast leading axes; gradients against finite differences (f64, the
//! body) and against the f64 formula's (f32, the backward kernel); a
//! compiled training step runs both kernels; unknown dims; the errors.

use proptest::prelude::*;
use tracejit::prelude::*;

/// The formula in f64, from flat data: `out [.., tq, dv]`, leading axes
/// `lead` shared by q, k, v (no broadcasting here), `mask [tq, tk]`.
#[allow(clippy::too_many_arguments, reason = "the operands of one problem")]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[bool]>,
    causal: bool,
    [batch, tq, tk, d, dv]: [usize; 5],
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * tq * dv];
    for b in 0..batch {
        for i in 0..tq {
            let seen = |j: usize| (!causal || j + tq <= i + tk) && mask.is_none_or(|m| m[i * tk + j]);
            let s: Vec<f64> = (0..tk)
                .map(|j| (0..d).map(|c| q[(b * tq + i) * d + c] * k[(b * tk + j) * d + c]).sum::<f64>() * scale)
                .collect();
            let m = (0..tk).filter(|&j| seen(j)).map(|j| s[j]).fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let e: Vec<f64> = (0..tk).map(|j| if seen(j) { (s[j] - m).exp() } else { 0.0 }).collect();
            let z: f64 = e.iter().sum();
            for c in 0..dv {
                out[(b * tq + i) * dv + c] = (0..tk).map(|j| e[j] / z * v[(b * tk + j) * dv + c]).sum();
            }
        }
    }
    out
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}", what);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{}: element {}: {} vs {}", what, i, g, w);
    }
    Ok(())
}

/// A random problem: q, k, v f32 `[batch, t, d]` and a mask.
fn problem([batch, tq, tk, d, dv]: [usize; 5], seed: u64, masked: bool) -> (Tensor, Tensor, Tensor, Option<Tensor>) {
    let q = Tensor::randn(&[batch, tq, d], seed);
    let k = Tensor::randn(&[batch, tk, d], seed + 1);
    let v = Tensor::randn(&[batch, tk, dv], seed + 2);
    let mask = masked.then(|| {
        let flags: Vec<bool> = (0..tq * tk).map(|j| !(j * 7 + seed as usize).is_multiple_of(4)).collect();
        Tensor::from_vec(flags, &[tq, tk])
    });
    (q, k, v, mask)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Eager (the kernel) and compiled (the kernel inside the JIT) agree
    /// with the f64 formula.
    #[test]
    fn the_kernel_matches_the_formula(
        batch in 0usize..3, tq in prop::sample::select(vec![0usize, 1, 3, 5, 17, 70]),
        tk in prop::sample::select(vec![0usize, 1, 3, 5, 66]), d in 1usize..9, dv in 1usize..9,
        causal: bool, masked: bool, seed in 0u64..1000,
    ) {
        let dims = [batch, tq, tk, d, dv];
        let (q, k, v, mask) = problem(dims, seed, masked);
        let scale = 1.0 / (d as f64).sqrt();
        let flags = mask.as_ref().map(|m| m.to_vec::<bool>().unwrap());
        let want = reference(&f64s(&q), &f64s(&k), &f64s(&v), flags.as_deref(), causal, dims, scale);
        let eager = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), causal, None);
        prop_assert_eq!(eager.shape(), &[batch, tq, dv]);
        close("eager", &f64s(&eager), &want, 1e-5)?;
        let m = mask.clone();
        let f = function(move |(q, k, v): (Tensor, Tensor, Tensor)| {
            tracejit::nn::scaled_dot_product_attention(&q, &k, &v, m.as_ref(), causal, None)
        });
        let compiled = f.call((q, k, v)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(f.concrete_functions()[0].executor_kind(), "jit");
        close("compiled", &f64s(&compiled), &want, 1e-5)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// f64 (its own row-at-a-time kernel) and bf16 (the f32 kernel on the
    /// widened values, rounded) against the f64 formula on the same
    /// values, eagerly and compiled: f64 to rounding (1e-12), bf16 within
    /// its rounding of the result (2⁻⁹ relative, twice) plus the f32
    /// kernel's 1e-5 of the magnitudes.
    #[test]
    fn f64_and_bf16_match_the_formula(
        batch in 0usize..3, tq in prop::sample::select(vec![0usize, 1, 3, 17]),
        tk in prop::sample::select(vec![0usize, 1, 5, 66]), d in 1usize..6, dv in 1usize..6,
        causal: bool, masked: bool, seed in 0u64..1000,
    ) {
        let dims = [batch, tq, tk, d, dv];
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::BF16, 2f64.powi(-8))] {
            let (q, k, v, mask) = problem(dims, seed, masked);
            let (q, k, v) = (q.cast(dtype), k.cast(dtype), v.cast(dtype));
            let scale = 1.0 / (d as f64).sqrt();
            let flags = mask.as_ref().map(|m| m.to_vec::<bool>().unwrap());
            let want = reference(&f64s(&q), &f64s(&k), &f64s(&v), flags.as_deref(), causal, dims, scale);
            let eager = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), causal, None);
            prop_assert_eq!(eager.dtype(), dtype);
            close(&format!("eager {dtype}"), &f64s(&eager), &want, tol)?;
            let m = mask.clone();
            let f = function(move |(q, k, v): (Tensor, Tensor, Tensor)| {
                tracejit::nn::scaled_dot_product_attention(&q, &k, &v, m.as_ref(), causal, None)
            });
            let compiled = f.call((q, k, v)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            close(&format!("compiled {dtype}"), &f64s(&compiled), &want, tol)?;
            prop_assert!(kernels_in(&f.concrete_functions()[0]).iter().any(|n| n.contains("attention")));
        }
    }
}

/// The kernel ran: the compiled graph holds it, forward and backward.
pub(crate) fn kernels_in(cf: &ConcreteFunction) -> Vec<String> {
    cf.optimized_graph()
        .nodes()
        .filter_map(|(_, n)| match &n.op {
            tracejit::ir::Op::Kernel { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn gradients_match_finite_differences_in_f64() {
    // f64 runs its own kernels (forward and backward, under the tape); the
    // mask hides every key of query 0 of batch 1.
    let (q, k, v) = (Tensor::randn(&[2, 4, 3], 1), Tensor::randn(&[2, 5, 3], 2), Tensor::randn(&[2, 5, 2], 3));
    let (q, k, v) = (q.cast(DType::F64), k.cast(DType::F64), v.cast(DType::F64));
    let flags: Vec<bool> = (0..2 * 4 * 5).map(|j| j % 3 != 1 && !(20..25).contains(&j)).collect();
    let mask = Tensor::from_vec(flags, &[2, 1, 4, 5]).reshape(&[2, 4, 5]);
    let w = Tensor::randn(&[2, 4, 2], 4).cast(DType::F64);
    let loss = |q: &Tensor, k: &Tensor, v: &Tensor| {
        (tracejit::nn::scaled_dot_product_attention(q, k, v, Some(&mask), true, Some(0.7)) * &w).sum_all()
    };
    let tape = GradientTape::new();
    for x in [&q, &k, &v] {
        tape.watch(x);
    }
    let l = loss(&q, &k, &v);
    let grads = tape.gradient(&l, &[&q, &k, &v]).unwrap();
    for (which, g) in grads.iter().enumerate() {
        let g = f64s(g.as_ref().unwrap());
        let base = [&q, &k, &v][which];
        let mut x = f64s(base);
        for i in 0..x.len() {
            let h = 1e-6;
            let at = |x: &[f64]| {
                let t = Tensor::from_vec(x.to_vec(), base.shape());
                let mut args = [q.clone(), k.clone(), v.clone()];
                args[which] = t;
                loss(&args[0], &args[1], &args[2]).to_scalar::<f64>().unwrap()
            };
            x[i] += h;
            let up = at(&x);
            x[i] -= 2.0 * h;
            let down = at(&x);
            x[i] += h;
            let fd = (up - down) / (2.0 * h);
            assert!((g[i] - fd).abs() < 1e-6 * (1.0 + fd.abs()), "input {which} element {i}: {} vs {fd}", g[i]);
        }
    }
    // The fully masked query gets zero gradient and zero output.
    let dq = f64s(grads[0].as_ref().unwrap());
    assert!(dq[12..15].iter().all(|&g| g == 0.0), "{dq:?}");
}

#[test]
fn a_compiled_training_step_runs_both_kernels_and_matches_the_f64_gradients() {
    // Heads as a leading axis, k and v broadcast over the batch.
    let q = Tensor::randn(&[2, 3, 70, 16], 5);
    let k = Tensor::randn(&[1, 3, 70, 16], 6);
    let v = Tensor::randn(&[1, 3, 70, 8], 7);
    let w = Tensor::randn(&[2, 3, 70, 8], 8);
    let grads_of = |q: &Tensor, k: &Tensor, v: &Tensor, w: &Tensor| {
        let tape = GradientTape::new();
        for x in [q, k, v] {
            tape.watch(x);
        }
        let y = tracejit::nn::scaled_dot_product_attention(q, k, v, None, true, None);
        let l = (y * w).sum_all();
        let g = tape.gradient(&l, &[q, k, v]).unwrap();
        g.into_iter().map(Option::unwrap).collect::<Vec<_>>()
    };
    let step = function(move |(q, k, v, w): (Tensor, Tensor, Tensor, Tensor)| grads_of(&q, &k, &v, &w));
    let compiled = step.call((q.clone(), k.clone(), v.clone(), w.clone())).unwrap();
    let cf = &step.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let names = kernels_in(cf);
    assert!(names.contains(&"tracejit.nn.scaled_dot_product_attention".to_string()), "{names:?}");
    assert!(names.contains(&"tracejit.nn.scaled_dot_product_attention_grad".to_string()), "{names:?}");
    // The f64 body's gradients (the plain formula, differentiated).
    let f64 = |t: &Tensor| t.cast(DType::F64);
    let want = grads_of(&f64(&q), &f64(&k), &f64(&v), &f64(&w));
    for (i, (g, w)) in compiled.iter().zip(&want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "gradient {i}");
        let (g, w) = (f64s(g), f64s(w));
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 2e-5 * scale.max(1.0), "gradient {i}: max error {err} at magnitude {scale}");
    }
}

#[test]
fn unknown_dims_select_the_kernel_and_the_body_agrees() {
    // Batch and sequence unknown in the trace; the body (selector off)
    // builds the causal pattern from cumulative sums.
    let (q, k, v, _) = problem([2, 5, 5, 4, 4], 9, false);
    let spec = TensorSpec::new(DType::F32, &[-1, -1, 4]);
    let eager = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, true, None);
    for selector in [true, false] {
        let f = function(|(q, k, v): (Tensor, Tensor, Tensor)| {
            tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, true, None)
        })
        .input_signature(vec![spec.clone(), spec.clone(), spec.clone()])
        .selector(selector);
        let got = f.call((q.clone(), k.clone(), v.clone())).unwrap();
        let cf = &f.concrete_functions()[0];
        assert_eq!(kernels_in(cf).len(), usize::from(selector), "{}", cf.optimized_graph());
        let (a, b) = (f64s(&eager), f64s(&got));
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5), "selector {selector}: {a:?} vs {b:?}");
        // A different length, same trace.
        let (q2, k2, v2, _) = problem([1, 3, 3, 4, 4], 10, false);
        f.call((q2, k2, v2)).unwrap();
        assert_eq!(f.tracing_count(), 1);
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let q = Tensor::zeros(&[2, 4, 8], DType::F32);
    let k = Tensor::zeros(&[2, 5, 6], DType::F32);
    let f = function(move |(q, k): (Tensor, Tensor)| {
        tracejit::nn::scaled_dot_product_attention(&q, &k, &k, None, false, None)
    });
    let e = f.call((q.clone(), k)).unwrap_err().to_string();
    assert!(e.contains("differ in width") && e.contains("attention.rs"), "{e}");
    // A float mask must have q's dtype (it is added to the scores).
    let bad_mask = Tensor::zeros(&[4, 4], DType::F64);
    let g =
        function(move |q: Tensor| tracejit::nn::scaled_dot_product_attention(&q, &q, &q, Some(&bad_mask), false, None));
    let e = g.call(q).unwrap_err().to_string();
    assert!(e.contains("mask is f64, expected bool (true = attend) or q's f32"), "{e}");
}

/// q, k and v as W10 makes them: slices of one fused projection
/// `[batch, t, 3, heads, d]` seen as `[batch, heads, t, d]` (strided views;
/// compiled code hands them to the kernels, which read them in place), and
/// a transposed cotangent: the outputs and gradients have the bits of the
/// same call on contiguous copies, eager and compiled.
#[test]
fn views_of_a_fused_projection_give_the_bits_of_contiguous_copies() {
    let qkv = Tensor::randn(&[2, 37, 3, 3, 16], 11);
    let heads = qkv.transpose(&[2, 0, 3, 1, 4]);
    let part = |i: i64| heads.slice_axis(0, i, i + 1);
    let (q, k, v) = (part(0), part(1), part(2));
    let w = Tensor::randn(&[1, 2, 37, 3, 16], 12).transpose(&[0, 1, 3, 2, 4]);
    for x in [&q, &k, &v, &w] {
        assert!(!x.storage().unwrap().is_standard_layout(), "a view, not a copy: {:?}", x.shape());
    }
    let copy = |x: &Tensor| Tensor::from_vec(x.to_vec::<f32>().unwrap(), x.shape());
    let run = |q: &Tensor, k: &Tensor, v: &Tensor, w: &Tensor| {
        let tape = GradientTape::new();
        for x in [q, k, v] {
            tape.watch(x);
        }
        let y = tracejit::nn::scaled_dot_product_attention(q, k, v, None, true, None);
        let l = (&y * w).sum_all();
        let mut all = vec![y];
        all.extend(tape.gradient(&l, &[q, k, v]).unwrap().into_iter().map(Option::unwrap));
        all
    };
    // The first output and element whose bits differ, with both values.
    let differ = |a: &[Tensor], b: &[Tensor]| {
        a.iter().zip(b).enumerate().find_map(|(n, (x, y))| {
            assert_eq!(x.shape(), y.shape(), "output {n}");
            let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
            x.iter().zip(&y).position(|(p, q)| p.to_bits() != q.to_bits()).map(|i| (n, i, x[i], y[i]))
        })
    };
    let views = run(&q, &k, &v, &w);
    let copies = run(&copy(&q), &copy(&k), &copy(&v), &copy(&w));
    assert_eq!(differ(&views, &copies), None, "eager");
    // Compiled, the views come from the traced transposes.
    let step = function(|(qkv, w): (Tensor, Tensor)| {
        let heads = qkv.transpose(&[2, 0, 3, 1, 4]);
        let part = |i: i64| heads.slice_axis(0, i, i + 1);
        let tape = GradientTape::new();
        let (q, k, v) = (part(0), part(1), part(2));
        for x in [&q, &k, &v] {
            tape.watch(x);
        }
        let y = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, true, None);
        let l = (&y * &w.transpose(&[0, 1, 3, 2, 4])).sum_all();
        let mut all = vec![y];
        all.extend(tape.gradient(&l, &[&q, &k, &v]).unwrap().into_iter().map(Option::unwrap));
        all
    });
    let compiled = step.call((qkv.clone(), Tensor::randn(&[1, 2, 37, 3, 16], 12))).unwrap();
    // The same step on contiguous arguments (compiled code computes the
    // default scale its own way, so it is compared with compiled code).
    let plain = function(move |(q, k, v, w): (Tensor, Tensor, Tensor, Tensor)| run(&q, &k, &v, &w));
    let copied = plain.call((copy(&q), copy(&k), copy(&v), copy(&w))).unwrap();
    for cf in [&step.concrete_functions()[0], &plain.concrete_functions()[0]] {
        assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        assert_eq!(kernels_in(cf).len(), 2, "{:?}", kernels_in(cf));
    }
    assert_eq!(differ(&compiled, &copied), None, "compiled");
}

/// `v` with leading axes `q` and `k` lack: the output takes them, the
/// log-sum-exp (the backward's input) keeps the scores' shape, eager,
/// compiled and through the gradient.
#[test]
fn values_with_more_leading_axes_than_the_scores() {
    let (q, k, v) = (Tensor::randn(&[5, 4], 1), Tensor::randn(&[6, 4], 2), Tensor::randn(&[2, 6, 3], 3));
    let f64 = |t: &Tensor| t.cast(DType::F64);
    let want = tracejit::nn::softmax(&(f64(&q).matmul(&f64(&k).t()) * 0.5), -1).matmul(&f64(&v));
    let eager = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, false, None);
    let f = function(|(q, k, v): (Tensor, Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&q);
        let y = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, false, None);
        let g = tape.gradient(&y.sum_all(), &[&q]).unwrap().remove(0).unwrap();
        (y, g)
    });
    let (compiled, dq) = f.call((q.clone(), k.clone(), v.clone())).unwrap();
    assert_eq!(f.concrete_functions()[0].executor_kind(), "jit");
    assert_eq!(dq.shape(), &[5, 4]);
    for y in [&eager, &compiled] {
        assert_eq!(y.shape(), &[2, 5, 3]);
        let (a, b) = (f64s(y), f64s(&want));
        assert!(a.iter().zip(&b).all(|(x, w)| (x - w).abs() < 1e-5 * (1.0 + w.abs())), "{a:?} vs {b:?}");
    }
}
