//! `Conv` on rank-5 inputs (the importer unrolls depth into channels of
//! one 2-D convolution) against a plain f64 loop, on random shapes,
//! groups, strides, dilations, pads and `auto_pad`, with and without a
//! bias; for any batch from one trace; and its gradient with respect to
//! the imported weights against the loop's. Each run asserts that the JIT
//! executed the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, GradientTape, Tensor, TensorSpec};

use super::builder::*;

fn assert_jit(model: &tracejit_onnx::Model) {
    let cfs = model.function().concrete_functions();
    assert!(!cfs.is_empty(), "the model was never traced");
    for cf in cfs {
        assert_eq!(cf.executor_kind(), "jit", "the JIT did not run the model: {:?}", cf.jit_error());
    }
}

/// One 3-D convolution problem.
#[derive(Clone, Debug)]
struct Conv {
    /// `[N, C, D, H, W]`.
    x: Vec<usize>,
    /// `[M, C/group, KD, KH, KW]`.
    w: Vec<usize>,
    group: usize,
    strides: [usize; 3],
    dilations: [usize; 3],
    /// Begin pads then end pads.
    pads: [usize; 6],
    auto_pad: &'static str,
    bias: bool,
}

impl Conv {
    /// Begin pad and output length of spatial axis `a`, by ONNX's spec.
    fn axis(&self, a: usize) -> (usize, usize) {
        let (input, k, s, d) = (self.x[2 + a], self.w[2 + a], self.strides[a], self.dilations[a]);
        let extent = (k - 1) * d + 1;
        let (pb, pe) = match self.auto_pad {
            "SAME_UPPER" | "SAME_LOWER" => {
                let total = ((input.div_ceil(s) - 1) * s + extent).saturating_sub(input);
                let (small, big) = (total / 2, total - total / 2);
                if self.auto_pad == "SAME_UPPER" {
                    (small, big)
                } else {
                    (big, small)
                }
            }
            "VALID" => (0, 0),
            _ => (self.pads[a], self.pads[3 + a]),
        };
        (pb, (input + pb + pe - extent) / s + 1)
    }
}

/// The convolution by loops in f64, and each output's sum of magnitudes.
fn reference(p: &Conv, x: &[f32], w: &[f32], b: &[f32]) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let axes: Vec<(usize, usize)> = (0..3).map(|a| p.axis(a)).collect();
    let (n, c, m, cg) = (p.x[0], p.x[1], p.w[0], p.w[1]);
    let mg = m / p.group;
    let out: Vec<usize> = axes.iter().map(|a| a.1).collect();
    let (mut y, mut mag) = (Vec::new(), Vec::new());
    for ni in 0..n {
        for (mi, &bias) in b[..m].iter().enumerate() {
            let g = mi / mg;
            for o in 0..out.iter().product::<usize>() {
                let oi = [o / (out[1] * out[2]), o / out[2] % out[1], o % out[2]];
                let (mut sum, mut abs) = if p.bias { (bias as f64, (bias as f64).abs()) } else { (0.0, 0.0) };
                for ci in 0..cg {
                    for t in 0..p.w[2] * p.w[3] * p.w[4] {
                        let ti = [t / (p.w[3] * p.w[4]), t / p.w[4] % p.w[3], t % p.w[4]];
                        let pos: Vec<isize> = (0..3)
                            .map(|a| (oi[a] * p.strides[a] + ti[a] * p.dilations[a]) as isize - axes[a].0 as isize)
                            .collect();
                        if (0..3).any(|a| pos[a] < 0 || pos[a] >= p.x[2 + a] as isize) {
                            continue;
                        }
                        let xi = (((ni * c + g * cg + ci) * p.x[2] + pos[0] as usize) * p.x[3] + pos[1] as usize)
                            * p.x[4]
                            + pos[2] as usize;
                        let wi = (mi * cg + ci) * p.w[2] * p.w[3] * p.w[4] + t;
                        let v = x[xi] as f64 * w[wi] as f64;
                        sum += v;
                        abs += v.abs();
                    }
                }
                y.push(sum);
                mag.push(abs);
            }
        }
    }
    (vec![n, m, out[0], out[1], out[2]], y, mag)
}

fn conv_model(p: &Conv, w: &Tensor, b: &Tensor, batch: Option<usize>) -> Vec<u8> {
    let ints = |v: &[usize]| v.iter().map(|&u| u as i64).collect::<Vec<_>>();
    let mut attrs = vec![
        attr_i("group", p.group as i64),
        attr_ints("strides", &ints(&p.strides)),
        attr_ints("dilations", &ints(&p.dilations)),
        attr_ints("kernel_shape", &ints(&p.w[2..])),
    ];
    if p.auto_pad == "NOTSET" {
        attrs.push(attr_ints("pads", &ints(&p.pads)));
    } else {
        attrs.push(attr_s("auto_pad", p.auto_pad));
    }
    let (inputs, inits) = if p.bias {
        (vec!["x", "w", "b"], vec![init("w", w), init("b", b)])
    } else {
        (vec!["x", "w"], vec![init("w", w)])
    };
    let mut dims: Vec<Option<i64>> = p.x.iter().map(|&d| Some(d as i64)).collect();
    dims[0] = batch.map(|b| b as i64);
    model(
        vec![node("Conv", "conv", &inputs, &["y"], attrs)],
        vec![value("x", elem(DType::F32), &dims)],
        vec![value("y", elem(DType::F32), &[None; 5])],
        inits,
        11,
    )
}

/// Each output is a sum of K products (and the bias) in some order: within
/// (K + 1) ulps of the sum of its terms' magnitudes.
fn check(p: &Conv, got: &Tensor, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(), TestCaseError> {
    let f = |t: &Tensor| t.to_vec::<f32>().unwrap();
    let (shape, want, mag) = reference(p, &f(x), &f(w), &f(b));
    prop_assert_eq!(got.shape(), &shape[..]);
    let k = (p.w[1] * p.w[2] * p.w[3] * p.w[4] + 1) as f64;
    for (o, (&g, &e)) in f(got).iter().zip(&want).enumerate() {
        let tol = (k + 1.0) * f32::EPSILON as f64 * mag[o] + 1e-30;
        prop_assert!((g as f64 - e).abs() <= tol, "output {} of {:?}: {} vs {} (tol {})", o, p, g, e, tol);
    }
    Ok(())
}

fn problem() -> impl Strategy<Value = Conv> {
    let axis = (1usize..6, 1usize..4, 1usize..3, 1usize..3, 0usize..3, 0usize..3);
    (
        (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        [axis.clone(), axis.clone(), axis],
        prop::sample::select(vec!["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
        any::<bool>(),
    )
        .prop_map(|((n, group, cg, mg), axes, auto_pad, bias)| {
            let mut p = Conv {
                x: vec![n, group * cg],
                w: vec![group * mg, cg],
                group,
                strides: [0; 3],
                dilations: [0; 3],
                pads: [0; 6],
                auto_pad,
                bias,
            };
            for (a, &(input, k, s, d, pb, pe)) in axes.iter().enumerate() {
                let extent = (k - 1) * d + 1;
                let (pb, pe) = if auto_pad == "NOTSET" { (pb, pe) } else { (0, 0) };
                // The input at least what the window needs.
                p.x.push(input.max(extent.saturating_sub(pb + pe)));
                p.w.push(k);
                (p.strides[a], p.dilations[a], p.pads[a], p.pads[3 + a]) = (s, d, pb, pe);
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// 3-D convolutions against the f64 loop.
    #[test]
    fn conv_3d_matches_the_loop(p in problem(), seed in 0u64..1000) {
        let w = floats(&p.w, seed + 1, false);
        let b = floats(&[p.w[0]], seed + 2, false);
        let model = import_bytes(&conv_model(&p, &w, &b, Some(p.x[0]))).unwrap();
        let x = floats(&p.x, seed, false);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        check(&p, &y, &x, &w, &b)?;
    }
}

fn grouped() -> Conv {
    Conv {
        x: vec![1, 4, 5, 4, 3],
        w: vec![4, 2, 3, 2, 2],
        group: 2,
        strides: [2, 1, 2],
        dilations: [1, 2, 1],
        pads: [1, 0, 1, 2, 1, 0],
        auto_pad: "NOTSET",
        bias: true,
    }
}

/// One trace for any batch serves batches 1 and 3, on the JIT, matching
/// the loop.
#[test]
fn a_3d_conv_traced_for_any_batch_serves_every_batch() {
    let p = grouped();
    let (w, b) = (floats(&p.w, 11, false), floats(&[4], 12, false));
    let model = import_bytes(&conv_model(&p, &w, &b, None)).unwrap();
    let cf = model.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 4, 5, 4, 3])]).unwrap();
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    for batch in [1usize, 3] {
        let mut q = p.clone();
        q.x[0] = batch;
        let x = floats(&q.x, batch as u64, false);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        check(&q, &y, &x, &w, &b).unwrap();
    }
    assert_jit(&model);
    assert_eq!(model.function().concrete_functions().len(), 1, "the any-batch trace served every batch");
}

/// The gradient of `Σ y·r` (r fixed) with respect to the imported weights
/// and bias is `Σ r·x` over each weight's taps and `Σ r` per channel: the
/// loop's gradient (the reference is linear in the weights, so its
/// gradient is the reference with the weight one-hot). Each entry sums at
/// most N·∏out products: within that many ulps of its magnitudes.
#[test]
fn a_3d_conv_has_the_gradient_of_the_loop() {
    let p = grouped();
    let (w, b) = (floats(&p.w, 21, false), floats(&[4], 22, false));
    let model = import_bytes(&conv_model(&p, &w, &b, Some(1))).unwrap();
    let x = floats(&p.x, 23, false);
    let vars = model.variables();
    let tape = GradientTape::new();
    let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
    let r = floats(y.shape(), 24, false);
    let loss = (&y * &r).sum_all();
    let sources: Vec<_> = vars.iter().map(|(_, v)| v.clone()).collect();
    let grads = tape.gradient(&loss, &sources).unwrap();
    let rs = r.to_vec::<f32>().unwrap();
    let xs = x.to_vec::<f32>().unwrap();
    let zero_b = vec![0.0f32; 4];
    for ((name, v), g) in vars.iter().zip(grads) {
        let g = g.unwrap_or_else(|| panic!("no gradient for {name}")).to_vec::<f32>().unwrap();
        let n = v.value().len();
        assert_eq!(g.len(), n, "{name}");
        for i in 0..n {
            // The loss with only entry i of this variable set to 1 (and the
            // bias off when it is the weights): its gradient entry.
            let (mut wi, mut bi) = (vec![0.0f32; w.len()], zero_b.clone());
            let mut q = p.clone();
            if name == "w" {
                wi[i] = 1.0;
                q.bias = false;
            } else {
                bi[i] = 1.0;
            }
            let (_, y1, mag) = reference(&q, &xs, &wi, &bi);
            let want: f64 = y1.iter().zip(&rs).map(|(a, &r)| a * r as f64).sum();
            let abs: f64 = mag.iter().zip(&rs).map(|(a, &r)| a * (r as f64).abs()).sum();
            let tol = (y1.len() + 2) as f64 * f32::EPSILON as f64 * abs + 1e-30;
            assert!((g[i] as f64 - want).abs() <= tol, "{name}[{i}]: {} vs {want}", g[i]);
        }
    }
}

/// One 3-D transposed convolution problem; `pads` hold the resolved pads
/// (begin then end) whichever attribute gave them.
#[derive(Clone, Debug)]
struct ConvT {
    /// `[N, C, D, H, W]`.
    x: Vec<usize>,
    /// `[C, M/group, KD, KH, KW]`.
    w: Vec<usize>,
    group: usize,
    strides: [usize; 3],
    dilations: [usize; 3],
    output_padding: [usize; 3],
    pads: [usize; 6],
    /// "NOTSET" (`pads`), "SAME_UPPER", "SAME_LOWER", "VALID" or
    /// "output_shape".
    mode: &'static str,
}

impl ConvT {
    fn full(&self, a: usize) -> usize {
        self.strides[a] * (self.x[2 + a] - 1) + self.output_padding[a] + (self.w[2 + a] - 1) * self.dilations[a] + 1
    }

    fn out(&self, a: usize) -> usize {
        self.full(a) - self.pads[a] - self.pads[3 + a]
    }
}

/// The transposed convolution by loops in f64 (each input and tap adds to
/// the output it lands on), and each output's sum of magnitudes.
fn reference_t(p: &ConvT, x: &[f32], w: &[f32], b: &[f32]) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let (n, c, mg) = (p.x[0], p.x[1], p.w[1]);
    let (m, cg) = (mg * p.group, c / p.group);
    let out = [p.out(0), p.out(1), p.out(2)];
    let plane = out[0] * out[1] * out[2];
    let mut y = vec![0.0f64; n * m * plane];
    let mut mag = vec![0.0f64; n * m * plane];
    for (i, (yv, mv)) in y.iter_mut().zip(mag.iter_mut()).enumerate() {
        (*yv, *mv) = (b[i / plane % m] as f64, (b[i / plane % m] as f64).abs());
    }
    let (xs, ks) = (&p.x[2..], &p.w[2..]);
    for ni in 0..n {
        for ci in 0..c {
            for i in 0..xs[0] * xs[1] * xs[2] {
                let ii = [i / (xs[1] * xs[2]), i / xs[2] % xs[1], i % xs[2]];
                for t in 0..ks[0] * ks[1] * ks[2] {
                    let ti = [t / (ks[1] * ks[2]), t / ks[2] % ks[1], t % ks[2]];
                    let pos: Vec<isize> = (0..3)
                        .map(|a| (ii[a] * p.strides[a] + ti[a] * p.dilations[a]) as isize - p.pads[a] as isize)
                        .collect();
                    if (0..3).any(|a| pos[a] < 0 || pos[a] >= out[a] as isize) {
                        continue;
                    }
                    let o = (pos[0] as usize * out[1] + pos[1] as usize) * out[2] + pos[2] as usize;
                    for mi in 0..mg {
                        let mo = ci / cg * mg + mi;
                        let v = x[(ni * c + ci) * xs.iter().product::<usize>() + i] as f64
                            * w[(ci * mg + mi) * ks.iter().product::<usize>() + t] as f64;
                        y[(ni * m + mo) * plane + o] += v;
                        mag[(ni * m + mo) * plane + o] += v.abs();
                    }
                }
            }
        }
    }
    (vec![n, m, out[0], out[1], out[2]], y, mag)
}

fn conv_t_model(p: &ConvT, w: &Tensor, b: &Tensor) -> Vec<u8> {
    let ints = |v: &[usize]| v.iter().map(|&u| u as i64).collect::<Vec<_>>();
    let mut attrs = vec![
        attr_i("group", p.group as i64),
        attr_ints("strides", &ints(&p.strides)),
        attr_ints("dilations", &ints(&p.dilations)),
        attr_ints("output_padding", &ints(&p.output_padding)),
    ];
    match p.mode {
        "NOTSET" => attrs.push(attr_ints("pads", &ints(&p.pads))),
        "output_shape" => attrs.push(attr_ints("output_shape", &ints(&[p.out(0), p.out(1), p.out(2)]))),
        auto => attrs.push(attr_s("auto_pad", auto)),
    }
    model(
        vec![node("ConvTranspose", "convt", &["x", "w", "b"], &["y"], attrs)],
        vec![fixed("x", DType::F32, &p.x)],
        vec![value("y", elem(DType::F32), &[None; 5])],
        vec![init("w", w), init("b", b)],
        11,
    )
}

fn problem_t() -> impl Strategy<Value = ConvT> {
    let axis = (1usize..5, 1usize..4, 1usize..4, 1usize..3, 0usize..3, 0usize..3, 0usize..3);
    (
        (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        [axis.clone(), axis.clone(), axis],
        prop::sample::select(vec!["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "output_shape"]),
    )
        .prop_map(|((n, group, cg, mg), axes, mode)| {
            let mut p = ConvT {
                x: vec![n, group * cg],
                w: vec![group * cg, mg],
                group,
                strides: [0; 3],
                dilations: [0; 3],
                output_padding: [0; 3],
                pads: [0; 6],
                mode,
            };
            for (a, &(input, k, s, d, op, pb, pe)) in axes.iter().enumerate() {
                p.x.push(input);
                p.w.push(k);
                // Below the stride (the importer refuses more on height and width).
                (p.strides[a], p.dilations[a], p.output_padding[a]) = (s, d, op % s);
                let full = p.full(a);
                let (pb, pe) = match mode {
                    "SAME_UPPER" | "SAME_LOWER" => {
                        let total = full.saturating_sub(input * s);
                        let (small, big) = (total / 2, total - total / 2);
                        if mode == "SAME_UPPER" {
                            (small, big)
                        } else {
                            (big, small)
                        }
                    }
                    "VALID" => (0, 0),
                    // A derived total: the odd pad at the start (not SAME_UPPER).
                    "output_shape" => {
                        let total = (pb + pe).min(full - 1);
                        (total - total / 2, total / 2)
                    }
                    _ => (pb.min(full - 1), pe.min(full - 1 - pb.min(full - 1))),
                };
                (p.pads[a], p.pads[3 + a]) = (pb, pe);
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// 3-D transposed convolutions against the f64 loop. Each output sums
    /// at most C/group·∏k products and the bias: within that many ulps
    /// (plus one) of their magnitudes.
    #[test]
    fn conv_transpose_3d_matches_the_loop(p in problem_t(), seed in 0u64..1000) {
        let w = floats(&p.w, seed + 1, false);
        let b = floats(&[p.w[1] * p.group], seed + 2, false);
        let model = import_bytes(&conv_t_model(&p, &w, &b)).unwrap();
        let x = floats(&p.x, seed, false);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        let f = |t: &Tensor| t.to_vec::<f32>().unwrap();
        let (shape, want, mag) = reference_t(&p, &f(&x), &f(&w), &f(&b));
        prop_assert_eq!(y.shape(), &shape[..]);
        let k = (p.x[1] / p.group * p.w[2] * p.w[3] * p.w[4] + 2) as f64;
        for (o, (&g, &e)) in f(&y).iter().zip(&want).enumerate() {
            let tol = k * f32::EPSILON as f64 * mag[o] + 1e-30;
            prop_assert!((g as f64 - e).abs() <= tol, "output {} of {:?}: {} vs {} (tol {})", o, p, g, e, tol);
        }
    }
}
