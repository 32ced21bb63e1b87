//! `DFT` against the direct transform in f64: forward and inverse, full
//! and one-sided (rfft, irfft), real and complex input, `dft_length`
//! shorter or longer than the input (truncation, zero padding), the axis
//! as an attribute (opset 19) or an input (opset 20). Each output is a sum
//! of at most 2·L products of the input by rounded cosines and sines: its
//! error is within (2·L + 4) roundings of the magnitudes summed.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn dft_matches_the_direct_transform(batch in 1usize..3, n in 1usize..9, complex: bool, inverse: bool, onesided: bool,
                                        len_pick in 0usize..3, opset20: bool, seed in 0u64..10_000) {
        let parts = if complex { 2 } else { 1 };
        // irfft needs complex input with at least one coefficient.
        let (inverse, onesided) = if inverse && onesided && !complex { (false, true) } else { (inverse, onesided) };
        let default_len = if inverse && onesided { 2 * (n.max(2) - 1) } else { n };
        let n = if inverse && onesided { n.max(2) } else { n };
        let len = [default_len, (default_len / 2).max(1), default_len + 3][len_pick];
        let x = Tensor::randn(&[batch, n, parts], seed);
        let mut names = vec!["x", "len"];
        let mut inits = vec![init("len", &Tensor::from_vec(vec![len as i64], &[]))];
        let mut attrs = vec![attr_i("inverse", inverse as i64), attr_i("onesided", onesided as i64)];
        if opset20 {
            names.push("axis");
            inits.push(init("axis", &Tensor::from_vec(vec![1i64], &[])));
        } else {
            attrs.push(attr_i("axis", 1));
        }
        let bytes = model(
            vec![node("DFT", "dft", &names, &["y"], attrs)],
            vec![fixed("x", DType::F32, &[batch, n, parts])],
            vec![value("y", elem(DType::F32), &[None, None, None])],
            inits,
            if opset20 { 20 } else { 19 },
        );
        let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let y = model.run(std::slice::from_ref(&x)).map_err(|e| TestCaseError::fail(e.to_string()))?.remove(0);
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let xv = x.to_vec::<f32>().unwrap();
        let at = |bi: usize, j: usize| -> (f64, f64) {
            if j >= n { return (0.0, 0.0); }
            let base = (bi * n + j) * parts;
            (xv[base] as f64, if complex { xv[base + 1] as f64 } else { 0.0 })
        };
        let tau = 2.0 * std::f64::consts::PI;
        let (out_len, out_parts) = if inverse && onesided { (len, 1) } else if onesided { (len / 2 + 1, 2) } else { (len, 2) };
        prop_assert_eq!(y.shape(), &[batch, out_len, out_parts]);
        let yv = y.to_vec::<f32>().unwrap();
        for bi in 0..batch {
            for k in 0..out_len {
                // (re, im, magnitude of the terms)
                let (mut re, mut im, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                if inverse && onesided {
                    // Hermitian: X_m for m ≤ len/2 stands for itself and its mirror.
                    for m in 0..=len / 2 {
                        let (a, b) = at(bi, m);
                        let w = if m == 0 || (len % 2 == 0 && m == len / 2) { 1.0 } else { 2.0 };
                        let th = tau * (m * k) as f64 / len as f64;
                        re += w * (a * th.cos() - b * th.sin()) / len as f64;
                        mag += w * (a.abs() + b.abs()) / len as f64;
                    }
                } else {
                    let sign = if inverse { 1.0 } else { -1.0 };
                    let scale = if inverse { 1.0 / len as f64 } else { 1.0 };
                    for j in 0..len {
                        let (a, b) = at(bi, j);
                        let th = sign * tau * (j * k) as f64 / len as f64;
                        re += (a * th.cos() - b * th.sin()) * scale;
                        im += (a * th.sin() + b * th.cos()) * scale;
                        mag += (a.abs() + b.abs()) * scale;
                    }
                }
                let bound = (2 * len + 4) as f64 * f32::EPSILON as f64 * mag + 1e-30;
                let base = (bi * out_len + k) * out_parts;
                prop_assert!((yv[base] as f64 - re).abs() <= bound, "re[{bi},{k}] = {}, want {re} (bound {bound})", yv[base]);
                if out_parts == 2 {
                    prop_assert!((yv[base + 1] as f64 - im).abs() <= bound, "im[{bi},{k}] = {}, want {im}", yv[base + 1]);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// STFT: frames every `step` samples, weighted by a runtime window (or
    /// none, given frame_length), each transformed; against the direct sums
    /// in f64 (the same bound, the window's product adding one rounding).
    #[test]
    fn stft_matches_windowed_direct_transforms(batch in 1usize..3, len in 1usize..7, extra in 0usize..9, step in 1usize..4,
                                               windowed: bool, complex: bool, onesided: bool, seed in 0u64..10_000) {
        let (parts, total) = (if complex { 2 } else { 1 }, len + extra);
        let x = Tensor::randn(&[batch, total, parts], seed);
        let w = Tensor::randn(&[len], seed + 1);
        let mut names = vec!["x", "step", "", ""];
        let mut inputs = vec![fixed("x", DType::F32, &[batch, total, parts])];
        let mut inits = vec![init("step", &Tensor::from_vec(vec![step as i64], &[]))];
        let mut feeds = vec![x.clone()];
        if windowed {
            names[2] = "w";
            inputs.push(fixed("w", DType::F32, &[len]));
            feeds.push(w.clone());
        } else {
            names[3] = "len";
            inits.push(init("len", &Tensor::from_vec(vec![len as i64], &[])));
        }
        while names.last() == Some(&"") { names.pop(); }
        let bytes = model(
            vec![node("STFT", "stft", &names, &["y"], vec![attr_i("onesided", onesided as i64)])],
            inputs,
            vec![value("y", elem(DType::F32), &[None, None, None, None])],
            inits,
            17,
        );
        let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let y = model.run(&feeds).map_err(|e| TestCaseError::fail(e.to_string()))?.remove(0);
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let (frames, bins) = (1 + extra / step, if onesided { len / 2 + 1 } else { len });
        prop_assert_eq!(y.shape(), &[batch, frames, bins, 2]);
        let (xv, wv, yv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let tau = 2.0 * std::f64::consts::PI;
        let weights: Vec<f64> = (0..len).map(|j| if windowed { wv[j] as f64 } else { 1.0 }).collect();
        for bi in 0..batch {
            for f in 0..frames {
                for k in 0..bins {
                    let (mut re, mut im, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                    for (j, &wj) in weights.iter().enumerate() {
                        let base = (bi * total + f * step + j) * parts;
                        let (a, b) = (xv[base] as f64 * wj, if complex { xv[base + 1] as f64 * wj } else { 0.0 });
                        let th = -tau * (j * k) as f64 / len as f64;
                        re += a * th.cos() - b * th.sin();
                        im += a * th.sin() + b * th.cos();
                        mag += a.abs() + b.abs();
                    }
                    let bound = (2 * len + 6) as f64 * f32::EPSILON as f64 * mag + 1e-30;
                    let at = ((bi * frames + f) * bins + k) * 2;
                    prop_assert!((yv[at] as f64 - re).abs() <= bound && (yv[at + 1] as f64 - im).abs() <= bound,
                                 "y[{bi},{f},{k}] = ({}, {}), want ({re}, {im})", yv[at], yv[at + 1]);
                }
            }
        }
    }
}
