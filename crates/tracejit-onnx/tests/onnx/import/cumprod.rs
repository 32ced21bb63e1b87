//! `CumProd` against sequential products: floats in f64 (a tree of the
//! same factors is within n − 1 roundings of the exact product; NaN, ±Inf
//! and zeros planted), i64 and i32 exactly with wrapping (ring products
//! wrap the same in any order), on every axis with `exclusive` and
//! `reverse`; and `ReverseSequence` (another scan-axis op) exactly. Each
//! run asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

/// The sequential (inclusive or exclusive, forward or reverse) products
/// of `x` (`shape`) along `axis`, by `mul` from `one`.
fn scan<T: Copy>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    exclusive: bool,
    reverse: bool,
    one: T,
    mul: impl Fn(T, T) -> T,
) -> Vec<T> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut y = vec![one; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let mut acc = one;
            for step in 0..n {
                let k = if reverse { n - 1 - step } else { step };
                if exclusive {
                    y[at(k)] = acc;
                    acc = mul(acc, x[at(k)]);
                } else {
                    acc = mul(acc, x[at(k)]);
                    y[at(k)] = acc;
                }
            }
        }
    }
    y
}

fn run(x: &Tensor, axis: i64, exclusive: bool, reverse: bool) -> Tensor {
    let bytes = model(
        vec![node(
            "CumProd",
            "cumprod",
            &["x", "axis"],
            &["y"],
            vec![attr_i("exclusive", exclusive as i64), attr_i("reverse", reverse as i64)],
        )],
        vec![fixed("x", x.dtype(), x.shape())],
        vec![fixed("y", x.dtype(), x.shape())],
        vec![init("axis", &Tensor::from_vec(vec![axis], &[]))],
        26,
    );
    let model = import_bytes(&bytes).unwrap();
    let y = model.run(std::slice::from_ref(x)).unwrap().remove(0);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    y
}

fn shape_and_axis() -> impl Strategy<Value = (Vec<usize>, usize)> {
    prop::collection::vec(1usize..10, 1..4).prop_flat_map(|s| {
        let r = s.len();
        (Just(s), 0..r)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn float_cumprod_is_within_n_roundings(sa in shape_and_axis(), exclusive: bool, reverse: bool, negative: bool,
                                           specials: bool, seed in 0u64..10_000) {
        let (shape, axis) = sa;
        let x = floats(&shape, seed, specials);
        let mut v = x.to_vec::<f32>().unwrap();
        if specials {
            let n = v.len();
            v[(seed as usize + 3) % n] = 0.0;
        }
        let x = Tensor::from_vec(v.clone(), &shape);
        let ax = if negative { axis as i64 - shape.len() as i64 } else { axis as i64 };
        let y = run(&x, ax, exclusive, reverse).to_vec::<f32>().unwrap();
        let wide: Vec<f64> = v.iter().map(|&a| a as f64).collect();
        let want = scan(&wide, &shape, axis, exclusive, reverse, 1.0, |a, b| a * b);
        let bound = 2.0 * shape[axis] as f64 * f32::EPSILON as f64;
        for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
            let g = g as f64;
            let ok = if w.is_nan() { g.is_nan() } else if w.is_infinite() { g == w } else { (g - w).abs() <= bound * w.abs() };
            prop_assert!(ok, "y[{i}] = {g}, want {w}");
        }
    }

    #[test]
    fn integer_cumprod_is_exact_and_wraps(sa in shape_and_axis(), exclusive: bool, reverse: bool, wide: bool,
                                          seed in 0u64..10_000) {
        let (shape, axis) = sa;
        let n: usize = shape.iter().product();
        let raw = Tensor::rand_uniform(&[n], -2.0e6, 2.0e6, seed).to_vec::<f32>().unwrap();
        if wide {
            let v: Vec<i64> = raw.iter().map(|&r| r as i64).collect();
            let y = run(&Tensor::from_vec(v.clone(), &shape), axis as i64, exclusive, reverse).to_vec::<i64>().unwrap();
            prop_assert_eq!(y, scan(&v, &shape, axis, exclusive, reverse, 1i64, i64::wrapping_mul));
        } else {
            let v: Vec<i32> = raw.iter().map(|&r| r as i32 % 5000).collect();
            let y = run(&Tensor::from_vec(v.clone(), &shape), axis as i64, exclusive, reverse).to_vec::<i32>().unwrap();
            prop_assert_eq!(y, scan(&v, &shape, axis, exclusive, reverse, 1i32, i32::wrapping_mul));
        }
    }
}

#[test]
fn cumprod_of_bool_is_a_node_error() {
    let x = Tensor::from_vec(vec![true, false], &[2]);
    let bytes = model(
        vec![node("CumProd", "cumprod", &["x", "axis"], &["y"], vec![])],
        vec![fixed("x", DType::Bool, &[2])],
        vec![fixed("y", DType::Bool, &[2])],
        vec![init("axis", &Tensor::from_vec(vec![0i64], &[]))],
        26,
    );
    let e = import_bytes(&bytes).unwrap().run(&[x]).unwrap_err().to_string();
    assert!(e.contains("'cumprod'") && e.contains("not bool"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// ReverseSequence with runtime lengths against index loops: element
    /// `t < len[b]` of sequence `b` comes from `len[b] − 1 − t`, the rest
    /// stay. Exact (a copy), NaN/Inf included.
    #[test]
    fn reverse_sequence_reverses_each_prefix(b in 1usize..5, t in 1usize..6, inner in 1usize..3, batch_first: bool, seed in 0u64..10_000) {
        let (ba, ta) = if batch_first { (0usize, 1usize) } else { (1, 0) };
        let mut shape = vec![0, 0, inner];
        shape[ba] = b;
        shape[ta] = t;
        let lens: Vec<i64> = (0..b).map(|i| 1 + ((seed as usize + 3 * i) % t) as i64).collect();
        let bytes = model(
            vec![node("ReverseSequence", "rev", &["x", "lens"], &["y"], vec![attr_i("batch_axis", ba as i64), attr_i("time_axis", ta as i64)])],
            vec![fixed("x", DType::F32, &shape), fixed("lens", DType::I64, &[b])],
            vec![fixed("y", DType::F32, &shape)],
            vec![],
            10,
        );
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&shape, seed, true);
        let y = run_model(&model, &[x.clone(), Tensor::from_vec(lens.clone(), &[b])]);
        let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let flat = |i0: usize, i1: usize, k: usize| (i0 * shape[1] + i1) * inner + k;
        for (bi, &len) in lens.iter().enumerate() {
            for ti in 0..t {
                let src = if (ti as i64) < len { len as usize - 1 - ti } else { ti };
                for k in 0..inner {
                    let (o, s) = if batch_first { (flat(bi, ti, k), flat(bi, src, k)) } else { (flat(ti, bi, k), flat(src, bi, k)) };
                    prop_assert!(yv[o].to_bits() == xv[s].to_bits(), "y[b {bi}, t {ti}, {k}] = {}, want {}", yv[o], xv[s]);
                }
            }
        }
    }
}

/// Runs `model`, asserting the JIT ran it.
fn run_model(model: &tracejit_onnx::Model, inputs: &[Tensor]) -> Tensor {
    let y = model.run(inputs).unwrap().remove(0);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    y
}
