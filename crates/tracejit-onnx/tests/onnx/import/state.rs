//! `TensorScatter` and `CausalConvWithState` against loops: the scatter
//! exactly (it copies), linear and circular, on any non-batch axis, with
//! runtime write indices; the convolution in f64 (a k-term sum: k + 2
//! roundings of the magnitudes; SiLU adds a few of the result) with and
//! without past state, bias and activation, NaN and infinities included.
//! Each run asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

fn run(bytes: &[u8], inputs: &[Tensor]) -> Result<Vec<Tensor>, TestCaseError> {
    let model = import_bytes(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let outs = model.run(inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    Ok(outs)
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn tensor_scatter_writes_where_the_reference_does(shape in prop::collection::vec(1usize..5, 3..5), axis_pick in 0usize..8,
                                                      len_pick in 0usize..8, circular: bool, seed in 0u64..10_000) {
        let rank = shape.len();
        let axis = 1 + axis_pick % (rank - 1);
        let max = shape[axis];
        let len = 1 + len_pick % max;
        let mut ushape = shape.clone();
        ushape[axis] = len;
        let cache = floats(&shape, seed, true);
        let update = floats(&ushape, seed + 1, true);
        // Linear writes stay inside the cache; circular ones may wrap.
        let write: Vec<i64> = (0..shape[0]).map(|b| ((seed as usize + 7 * b) % if circular { max } else { max - len + 1 }) as i64).collect();
        let mode = if circular { "circular" } else { "linear" };
        let bytes = model(
            vec![node("TensorScatter", "scatter", &["cache", "update", "w"], &["out"],
                      vec![attr_i("axis", axis as i64 - rank as i64), attr_s("mode", mode)])],
            vec![fixed("cache", DType::F32, &shape), fixed("update", DType::F32, &ushape), fixed("w", DType::I64, &[shape[0]])],
            vec![fixed("out", DType::F32, &shape)],
            vec![],
            24,
        );
        let out = run(&bytes, &[cache.clone(), update.clone(), Tensor::from_vec(write.clone(), &[shape[0]])])?.remove(0);
        let mut want = cache.to_vec::<f32>().unwrap();
        let u = update.to_vec::<f32>().unwrap();
        let (cst, ust) = (strides(&shape), strides(&ushape));
        for (flat, &v) in u.iter().enumerate() {
            let idx: Vec<usize> = (0..rank).map(|a| flat / ust[a] % ushape[a]).collect();
            let mut to = idx.clone();
            to[axis] = (write[idx[0]] as usize + idx[axis]) % max;
            want[(0..rank).map(|a| to[a] * cst[a]).sum::<usize>()] = v;
        }
        let got = out.to_vec::<f32>().unwrap();
        prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{got:?} != {want:?}");
    }

    #[test]
    fn causal_conv_with_state_matches_f64(b in 1usize..3, c in 1usize..4, len in 1usize..7, k in 1usize..5,
                                          past: bool, bias: bool, silu: bool, specials: bool, seed in 0u64..10_000) {
        let x = floats(&[b, c, len], seed, specials);
        let w = floats(&[c, 1, k], seed + 1, false);
        let bv = floats(&[c], seed + 2, false);
        let st = floats(&[b, c, k - 1], seed + 3, false);
        let mut names = vec!["x", "w", "", ""];
        let mut feeds = vec![x.clone(), w.clone()];
        let mut infos = vec![fixed("x", DType::F32, &[b, c, len]), fixed("w", DType::F32, &[c, 1, k])];
        if bias {
            names[2] = "bias";
            feeds.push(bv.clone());
            infos.push(fixed("bias", DType::F32, &[c]));
        }
        if past {
            names[3] = "past";
            feeds.push(st.clone());
            infos.push(fixed("past", DType::F32, &[b, c, k - 1]));
        }
        while names.last() == Some(&"") {
            names.pop();
        }
        let attrs = if silu { vec![attr_s("activation", "silu")] } else { vec![] };
        let bytes = model(
            vec![node("CausalConvWithState", "conv", &names, &["y", "state"], attrs)],
            infos,
            vec![fixed("y", DType::F32, &[b, c, len]), fixed("state", DType::F32, &[b, c, k - 1])],
            vec![],
            27,
        );
        let outs = run(&bytes, &feeds)?;
        let (xv, wv, bvv, sv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap(), bv.to_vec::<f32>().unwrap(), st.to_vec::<f32>().unwrap());
        // The padded input: state (or zeros), then x.
        let padded = |bi: usize, ci: usize, t: usize| -> f32 {
            if t < k - 1 {
                if past { sv[(bi * c + ci) * (k - 1) + t] } else { 0.0 }
            } else {
                xv[(bi * c + ci) * len + t - (k - 1)]
            }
        };
        let y = outs[0].to_vec::<f32>().unwrap();
        let eps = f32::EPSILON as f64;
        for bi in 0..b {
            for ci in 0..c {
                for t in 0..len {
                    let terms: Vec<f64> = (0..k).map(|j| padded(bi, ci, t + j) as f64 * wv[ci * k + j] as f64).collect();
                    let mut sum: f64 = terms.iter().sum::<f64>() + if bias { bvv[ci] as f64 } else { 0.0 };
                    let mag: f64 = terms.iter().map(|v| v.abs()).sum::<f64>() + if bias { (bvv[ci] as f64).abs() } else { 0.0 };
                    let mut bound = (k + 2) as f64 * eps * mag;
                    if silu {
                        // The spec rounds the convolution to the input dtype, then SiLU:
                        // |d silu/dy| <= 1.1, and sigmoid, exp and the product add a few roundings.
                        let yr = sum as f32 as f64;
                        bound = 1.1 * (bound + eps * sum.abs()) + 6.0 * eps * yr.abs();
                        sum = yr / (1.0 + (-yr).exp());
                    }
                    let g = y[(bi * c + ci) * len + t] as f64;
                    let ok = if sum.is_nan() { g.is_nan() } else if sum.is_infinite() { g == sum } else { (g - sum).abs() <= bound + 1e-30 };
                    prop_assert!(ok, "y[{bi},{ci},{t}] = {g}, want {sum} (bound {bound})");
                }
            }
        }
        // The state: the last k - 1 positions of the padded input, exactly.
        let state = outs[1].to_vec::<f32>().unwrap();
        for bi in 0..b {
            for ci in 0..c {
                for j in 0..k - 1 {
                    let want = padded(bi, ci, len + j);
                    let got = state[(bi * c + ci) * (k - 1) + j];
                    prop_assert!(got.to_bits() == want.to_bits(), "state[{bi},{ci},{j}] = {got}, want {want}");
                }
            }
        }
    }
}
