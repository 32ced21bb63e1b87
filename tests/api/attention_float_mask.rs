//! `nn::scaled_dot_product_attention` with a float mask, added to the
//! scaled scores (PyTorch's float `attn_mask`, and the padding bias of
//! models exported to ONNX): the kernel (eager and compiled) against a
//! float64 evaluation written here, with padding values of 0, -10000 and
//! -inf, per-key and per-pair masks, the causal rule and broadcast heads;
//! the same pattern as a bool mask; gradients, the mask's included,
//! against finite differences (f64) and against the f64 formula's (a
//! compiled f32 step).

use proptest::prelude::*;
use tracejit::prelude::*;

use super::attention::kernels_in;

/// `softmax(q·kᵀ·scale + bias, causal)·v` in f64 for `[batch, t, w]`
/// operands and a bias indexed by `bias(b, i, j)`.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: &dyn Fn(usize, usize, usize) -> f64,
    causal: bool,
    [batch, tq, tk, d, dv]: [usize; 5],
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * tq * dv];
    for b in 0..batch {
        for i in 0..tq {
            let seen: Vec<usize> = (0..tk).filter(|&j| !causal || j + tq <= i + tk).collect();
            if seen.is_empty() {
                continue;
            }
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    let dot: f64 = (0..d).map(|c| q[(b * tq + i) * d + c] * k[(b * tk + j) * d + c]).sum();
                    dot * scale + bias(b, i, j)
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|&x| (x - m).exp()).sum();
            for c in 0..dv {
                out[(b * tq + i) * dv + c] =
                    seen.iter().zip(&s).map(|(&j, &x)| (x - m).exp() / z * v[(b * tk + j) * dv + c]).sum();
            }
        }
    }
    out
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

/// A mask value: mostly in [-3, 3], some padding values (-10000, -inf),
/// key 0 always 0 so that every query that sees a key has a finite score.
fn mask_value(n: usize, j: usize, seed: u64) -> f32 {
    let h = (n as u64).wrapping_mul(2_654_435_761).wrapping_add(seed * 97) % 23;
    match (j, h) {
        (0, _) => 0.0,
        (_, 0) => f32::NEG_INFINITY,
        (_, 1) => -10_000.0,
        _ => (h as f32 - 12.0) / 4.0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A per-key mask `[batch, 1, tk]` or a per-pair one `[tq, tk]`, eager
    /// and compiled (the kernel in the JIT) against the f64 formula.
    #[test]
    fn the_kernel_adds_the_mask_as_the_formula_does(
        batch in 1usize..3, tq in prop::sample::select(vec![1usize, 3, 17, 70]),
        tk in prop::sample::select(vec![1usize, 5, 66, 130]), d in 1usize..9, dv in 1usize..9,
        causal: bool, per_key: bool, seed in 0u64..1000,
    ) {
        let dims = [batch, tq, tk, d, dv];
        let (q, k, v) = (Tensor::randn(&[batch, tq, d], seed), Tensor::randn(&[batch, tk, d], seed + 1),
            Tensor::randn(&[batch, tk, dv], seed + 2));
        let shape: Vec<usize> = if per_key { vec![batch, 1, tk] } else { vec![tq, tk] };
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|x| mask_value(x, x % tk, seed)).collect();
        let mask = Tensor::from_vec(values.clone(), &shape);
        let bias = |b: usize, i: usize, j: usize| f64::from(if per_key { values[b * tk + j] } else { values[i * tk + j] });
        let scale = 1.0 / (d as f64).sqrt();
        let want = reference(&f64s(&q), &f64s(&k), &f64s(&v), &bias, causal, dims, scale);
        let eager = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, Some(&mask), causal, None);
        let f = function(move |(q, k, v, m): (Tensor, Tensor, Tensor, Tensor)| {
            tracejit::nn::scaled_dot_product_attention(&q, &k, &v, Some(&m), causal, None)
        });
        let compiled = f.call((q, k, v, mask)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cf = &f.concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit");
        prop_assert!(kernels_in(cf).contains(&"tracejit.nn.scaled_dot_product_attention".to_string()));
        for (what, got) in [("eager", f64s(&eager)), ("compiled", f64s(&compiled))] {
            prop_assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                prop_assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{}: element {}: {} vs {}", what, i, g, w);
            }
        }
    }
}

/// 0 where a bool mask attends and -inf where it does not gives the bool
/// mask's result (every query sees key 0), heads broadcast.
#[test]
fn zeros_and_minus_infinity_are_the_bool_mask() {
    let (q, k, v) =
        (Tensor::randn(&[2, 3, 9, 4], 1), Tensor::randn(&[2, 3, 11, 4], 2), Tensor::randn(&[2, 3, 11, 5], 3));
    let flags: Vec<bool> = (0..2 * 11).map(|j| j % 11 == 0 || j % 3 != 1).collect();
    let values: Vec<f32> = flags.iter().map(|&f| if f { 0.0 } else { f32::NEG_INFINITY }).collect();
    let (mask, bias) = (Tensor::from_vec(flags, &[2, 1, 1, 11]), Tensor::from_vec(values, &[2, 1, 1, 11]));
    for causal in [false, true] {
        let a = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, Some(&mask), causal, None);
        let b = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, Some(&bias), causal, None);
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "causal {causal}");
    }
}

/// A query whose every score the mask makes -inf gets NaN, as the formula
/// does (a bool mask gives zeros there).
#[test]
fn a_row_of_minus_infinity_is_nan() {
    let (q, k, v) = (Tensor::randn(&[2, 3], 1), Tensor::randn(&[4, 3], 2), Tensor::randn(&[4, 2], 3));
    let mut values = vec![0.0f32; 8];
    values[4..].fill(f32::NEG_INFINITY);
    let mask = Tensor::from_vec(values, &[2, 4]);
    let y = tracejit::nn::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false, None).to_vec::<f32>().unwrap();
    assert!(y[..2].iter().all(|x| x.is_finite()) && y[2..].iter().all(|x| x.is_nan()), "{y:?}");
}

#[test]
fn gradients_of_every_input_and_the_mask_match_finite_differences_in_f64() {
    let (q, k, v) = (Tensor::randn(&[2, 4, 3], 1), Tensor::randn(&[2, 5, 3], 2), Tensor::randn(&[2, 5, 2], 3));
    let mask = Tensor::randn(&[2, 1, 5], 4);
    let [q, k, v, mask] = [q, k, v, mask].map(|t| t.cast(DType::F64));
    let w = Tensor::randn(&[2, 4, 2], 5).cast(DType::F64);
    let loss = |a: &[Tensor; 4]| {
        (tracejit::nn::scaled_dot_product_attention(&a[0], &a[1], &a[2], Some(&a[3]), true, Some(0.7)) * &w).sum_all()
    };
    let inputs = [q, k, v, mask];
    let tape = GradientTape::new();
    for x in &inputs {
        tape.watch(x);
    }
    let l = loss(&inputs);
    let grads = tape.gradient(&l, &inputs.iter().collect::<Vec<_>>()).unwrap();
    for (which, g) in grads.iter().enumerate() {
        let g = f64s(g.as_ref().unwrap_or_else(|| panic!("a gradient for input {which}")));
        let mut x = f64s(&inputs[which]);
        for i in 0..x.len() {
            let h = 1e-6;
            let at = |x: &[f64]| {
                let mut args = inputs.clone();
                args[which] = Tensor::from_vec(x.to_vec(), inputs[which].shape());
                loss(&args).to_scalar::<f64>().unwrap()
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
}

/// A compiled f32 step (the forward kernel with the mask, the gradients by
/// the formula) against the f64 formula's gradients, the mask's included.
#[test]
fn a_compiled_step_with_a_float_mask_matches_the_f64_gradients() {
    let q = Tensor::randn(&[2, 3, 70, 16], 5);
    let k = Tensor::randn(&[2, 3, 70, 16], 6);
    let v = Tensor::randn(&[2, 3, 70, 8], 7);
    let mask = Tensor::randn(&[2, 1, 1, 70], 8);
    let w = Tensor::randn(&[2, 3, 70, 8], 9);
    let grads_of = |q: &Tensor, k: &Tensor, v: &Tensor, m: &Tensor, w: &Tensor| {
        let tape = GradientTape::new();
        for x in [q, k, v, m] {
            tape.watch(x);
        }
        let y = tracejit::nn::scaled_dot_product_attention(q, k, v, Some(m), false, None);
        let l = (y * w).sum_all();
        let g = tape.gradient(&l, &[q, k, v, m]).unwrap();
        g.into_iter().map(Option::unwrap).collect::<Vec<_>>()
    };
    let step = function(move |(q, k, v, m, w): (Tensor, Tensor, Tensor, Tensor, Tensor)| grads_of(&q, &k, &v, &m, &w));
    let compiled = step.call((q.clone(), k.clone(), v.clone(), mask.clone(), w.clone())).unwrap();
    let cf = &step.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    assert!(kernels_in(cf).contains(&"tracejit.nn.scaled_dot_product_attention".to_string()));
    let f64 = |t: &Tensor| t.cast(DType::F64);
    let want = grads_of(&f64(&q), &f64(&k), &f64(&v), &f64(&mask), &f64(&w));
    for (i, (g, w)) in compiled.iter().zip(&want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "gradient {i}");
        let (g, w) = (f64s(g), f64s(w));
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 2e-5 * scale.max(1.0), "gradient {i}: max error {err} at magnitude {scale}");
    }
}
