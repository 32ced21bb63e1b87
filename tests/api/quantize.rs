//! `quantize::dynamic`: a traced function's products against variables
//! run in int8 (per-column weight scales, per-row activation scales),
//! checked against the f32 result within the two roundings' bound, in the
//! JIT and the interpreter, across weight updates, with clear errors for
//! functions it cannot help.

use proptest::prelude::*;
use tracejit::prelude::*;
use tracejit::quantize;

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Asserts `got` is `x · w` within the int8 rounding bound: each operand
/// is off by at most half its scale (row max / 127 for `x`, column max /
/// 127 for `w`), so each output by `Σ |Δx||w| + |x||Δw| + |Δx||Δw|`.
fn assert_int8_product(got: &Tensor, x: &Tensor, w: &Tensor) {
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[1]);
    let (xv, wv, g) = (f32s(x), f32s(w), f32s(got));
    for i in 0..m {
        let dx = xv[i * k..(i + 1) * k].iter().fold(0.0f32, |a, v| a.max(v.abs())) / 254.0;
        for j in 0..n {
            let dw = (0..k).map(|p| wv[p * n + j].abs()).fold(0.0f32, f32::max) / 254.0;
            let (mut want, mut bound) = (0.0f64, 0.0f64);
            for p in 0..k {
                let (a, b) = (xv[i * k + p] as f64, wv[p * n + j] as f64);
                want += a * b;
                bound += (dx as f64) * b.abs() + a.abs() * dw as f64 + (dx * dw) as f64;
            }
            let err = (g[i * n + j] as f64 - want).abs();
            assert!(
                err <= 1.05 * bound + 1e-5,
                "[{i}, {j}] of {m}x{k}x{n}: {} vs {want} (bound {bound})",
                g[i * n + j]
            );
        }
    }
}

fn model() -> (Variable, Variable, Function<Tensor, Tensor>) {
    let w1 = Variable::new(Tensor::randn(&[48, 32], 1) * 0.3);
    let w2 = Variable::new(Tensor::randn(&[32, 5], 2) * 0.3);
    let f = {
        let (w1, w2) = (w1.clone(), w2.clone());
        function(move |x: Tensor| x.matmul(&w1.read()).relu().matmul(&w2.read()))
    };
    (w1, w2, f)
}

#[test]
fn an_mlp_runs_its_products_in_int8() {
    let (w1, w2, f) = model();
    let x = Tensor::randn(&[7, 48], 3);
    let cf = f.get_concrete_function(x.clone()).unwrap();
    let q = quantize::dynamic(&cf).unwrap();
    assert_eq!(q.executor_kind(), "jit");
    let stats = q.schedule_stats().unwrap();
    assert_eq!((stats.native_kernels, stats.gemms), (2, 0), "{stats}");
    assert_eq!(q.optimized_graph().to_string().matches(quantize::KERNEL_NAME).count(), 2);
    // The first product exactly as quantized, then the whole against f32.
    let h = q.call_flat(std::slice::from_ref(&x)).unwrap().remove(0);
    let exact = cf.call_flat(std::slice::from_ref(&x)).unwrap().remove(0);
    let scale = f32s(&exact).iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let err = f32s(&h).iter().zip(f32s(&exact)).fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
    assert!(err <= 2e-2 * scale, "{err} of {scale}");
    let first = function({
        let w1 = w1.clone();
        move |x: Tensor| x.matmul(&w1.read())
    });
    let q1 = quantize::dynamic(&first.get_concrete_function(x.clone()).unwrap()).unwrap();
    assert_int8_product(&q1.call_flat(std::slice::from_ref(&x)).unwrap()[0], &x, &w1.value());
    // The original is untouched.
    assert_eq!(cf.schedule_stats().unwrap().gemms, 2);
    drop(w2);
}

#[test]
fn an_assigned_weight_is_quantized_again() {
    let (w1, _w2, _) = model();
    let f = {
        let w1 = w1.clone();
        function(move |x: Tensor| x.matmul(&w1.read()))
    };
    let x = Tensor::randn(&[4, 48], 4);
    let q = quantize::dynamic(&f.get_concrete_function(x.clone()).unwrap()).unwrap();
    for round in 0..3 {
        assert_int8_product(&q.call_flat(std::slice::from_ref(&x)).unwrap()[0], &x, &w1.value());
        w1.assign(&(Tensor::randn(&[48, 32], 10 + round) * (round as f64 + 2.0)));
    }
}

#[test]
fn the_interpreter_and_the_jit_agree_bit_for_bit() {
    let (_w1, _w2, f) = model();
    let x = Tensor::randn(&[6, 48], 5);
    let jit = quantize::dynamic(&f.get_concrete_function(x.clone()).unwrap()).unwrap();
    let interp_f = f.clone().jit(false);
    let interp = quantize::dynamic(&interp_f.get_concrete_function(x.clone()).unwrap()).unwrap();
    assert_eq!(interp.executor_kind(), "interpreter");
    let (a, b) = (jit.call_flat(std::slice::from_ref(&x)).unwrap(), interp.call_flat(&[x]).unwrap());
    assert!(f32s(&a[0]).iter().zip(f32s(&b[0])).all(|(p, q)| p.to_bits() == q.to_bits()));
}

#[test]
fn a_function_without_such_a_product_is_an_error() {
    let f = function(|x: Tensor| x.exp()).name("no_products");
    let e = quantize::dynamic(&f.get_concrete_function(Tensor::zeros(&[2, 2], DType::F32)).unwrap()).unwrap_err();
    assert!(e.to_string().contains("`no_products`: nothing to quantize: it has no matrix product"), "{e}");
    let g = function(|(a, b): (Tensor, Tensor)| a.matmul(&b)).name("two_args");
    let z = Tensor::zeros(&[2, 2], DType::F32);
    let e = quantize::dynamic(&g.get_concrete_function((z.clone(), z)).unwrap()).unwrap_err();
    assert!(e.to_string().contains("none of its 1 matrix product(s) multiplies by a variable or a constant"), "{e}");
}

#[test]
fn stacked_rows_and_a_transposed_weight() {
    let w = Variable::new(Tensor::randn(&[10, 24], 6));
    let f = {
        let w = w.clone();
        function(move |x: Tensor| x.matmul(&w.read().transpose(&[1, 0])))
    };
    let x = Tensor::randn(&[2, 3, 24], 7);
    let q = quantize::dynamic(&f.get_concrete_function(x.clone()).unwrap()).unwrap();
    let got = q.call_flat(std::slice::from_ref(&x)).unwrap().remove(0);
    assert_eq!(got.shape(), [2, 3, 10]);
    assert_int8_product(&got.reshape(&[6, 10]), &x.reshape(&[6, 24]), &w.value().transpose(&[1, 0]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn int8_products_of_odd_sizes(m in 0usize..6, k in 1usize..70, n in 1usize..40, seed in 0u64..500) {
        let w = Variable::new(Tensor::randn(&[k, n], seed));
        let f = {
            let w = w.clone();
            function(move |x: Tensor| x.matmul(&w.read()))
        };
        let x = Tensor::randn(&[m, k], seed + 1);
        let q = quantize::dynamic(&f.get_concrete_function(x.clone()).unwrap()).unwrap();
        assert_int8_product(&q.call_flat(std::slice::from_ref(&x)).unwrap()[0], &x, &w.value());
    }
}
