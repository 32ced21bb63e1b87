//! Hand-built models run through the importer and compared with
//! independent references: loops in f64 for Gemm, slices and reductions,
//! the scalar rules for elementwise ops (NaN and infinities included), and
//! `tracejit::nn`'s eager convolution, pooling and softmax (the functions
//! the ONNX ops map onto) for a small CNN. Each run asserts that the JIT
//! executed the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

fn assert_jit(model: &tracejit_onnx::Model) {
    let cfs = model.function().concrete_functions();
    assert!(!cfs.is_empty(), "the model was never traced");
    for cf in cfs {
        assert_eq!(cf.executor_kind(), "jit", "the JIT did not run the model: {:?}", cf.jit_error());
    }
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Equal, NaN matching NaN.
fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Gemm (transB, alpha, beta, a broadcast C) then Relu, against f64
    /// loops. Each output is a k-term dot product rounded in f32: its error
    /// is at most (k + 3) ulps of the sum of magnitudes (the GEMM may add
    /// in any order).
    #[test]
    fn gemm_relu_matches_a_loop(m in prop::sample::select(vec![1usize, 3, 5, 7]),
                                k in prop::sample::select(vec![1usize, 2, 5, 9]),
                                n in prop::sample::select(vec![1usize, 4, 5]), seed in 0u64..1000) {
        let bytes = model(
            vec![
                node("Gemm", "gemm", &["a", "b", "c"], &["y"], vec![attr_i("transB", 1), attr_f("alpha", 0.5), attr_f("beta", 2.0)]),
                node("Relu", "relu", &["y"], &["z"], vec![]),
            ],
            vec![fixed("a", DType::F32, &[m, k]), fixed("b", DType::F32, &[n, k]), fixed("c", DType::F32, &[n])],
            vec![fixed("z", DType::F32, &[m, n])],
            vec![],
            13,
        );
        let model = import_bytes(&bytes).unwrap();
        let (a, b, c) = (floats(&[m, k], seed, false), floats(&[n, k], seed + 1, false), floats(&[n], seed + 2, false));
        let z = model.run(&[a.clone(), b.clone(), c.clone()]).unwrap().remove(0);
        assert_jit(&model);
        prop_assert_eq!(z.shape(), &[m, n]);
        let (a, b, c, z) = (f32s(&a), f32s(&b), f32s(&c), f32s(&z));
        for i in 0..m {
            for j in 0..n {
                let (mut dot, mut mag) = (0.0f64, 0.0f64);
                for t in 0..k {
                    let p = a[i * k + t] as f64 * b[j * k + t] as f64;
                    dot += p;
                    mag += p.abs();
                }
                let want = (0.5 * dot + 2.0 * c[j] as f64).max(0.0);
                let bound = (k + 3) as f64 * f32::EPSILON as f64 * (0.5 * mag + 2.0 * (c[j] as f64).abs()) + 1e-30;
                let got = z[i * n + j] as f64;
                prop_assert!((got - want).abs() <= bound, "z[{i},{j}] = {got}, want {want} (bound {bound})");
            }
        }
    }

    /// Where(Greater(x, y), Sub(x, y), Neg(y)), Clip(-1, 2) and LeakyRelu,
    /// broadcasting [r, c] against [c], with NaN and infinities: every op
    /// is exact, so the result equals the scalar rules bit for bit.
    #[test]
    fn elementwise_ops_follow_the_scalar_rules(r in 1usize..6, c in 1usize..7, seed in 0u64..1000) {
        let bytes = model(
            vec![
                node("Greater", "gt", &["x", "y"], &["g"], vec![]),
                node("Sub", "sub", &["x", "y"], &["d"], vec![]),
                node("Neg", "neg", &["y"], &["ny"], vec![]),
                node("Where", "where", &["g", "d", "ny"], &["w"], vec![]),
                node("Clip", "clip", &["w", "lo", "hi"], &["k"], vec![]),
                node("LeakyRelu", "leaky", &["k"], &["out"], vec![attr_f("alpha", 0.25)]),
            ],
            vec![fixed("x", DType::F32, &[r, c]), fixed("y", DType::F32, &[c])],
            vec![fixed("out", DType::F32, &[r, c])],
            vec![init("lo", &Tensor::scalar(-1.0f32)), init("hi", &Tensor::scalar(2.0f32))],
            13,
        );
        let model = import_bytes(&bytes).unwrap();
        let (x, y) = (floats(&[r, c], seed, true), floats(&[c], seed + 7, true));
        let out = f32s(&model.run(&[x.clone(), y.clone()]).unwrap()[0]);
        assert_jit(&model);
        let (x, y) = (f32s(&x), f32s(&y));
        for i in 0..r * c {
            let (a, b) = (x[i], y[i % c]);
            let w = if a > b { a - b } else { -b };
            let k = w.clamp(-1.0, 2.0); // NaN stays NaN, as Clip
            let want = if k < 0.0 { k * 0.25 } else { k };
            prop_assert!(same(out[i], want), "out[{i}] = {}, want {want} (x {a}, y {b})", out[i]);
        }
    }

    /// Slice with a negative step from the end (ends = INT64_MIN) and
    /// ReduceSum with axes as an input (opset 13), against loops.
    #[test]
    fn slice_backwards_then_reduce_sum(r in 1usize..5, c in 1usize..8, step in 1i64..4, seed in 0u64..1000) {
        let bytes = model(
            vec![
                node("Slice", "slice", &["x", "starts", "ends", "axes", "steps"], &["s"], vec![]),
                node("ReduceSum", "sum", &["s", "raxes"], &["y"], vec![attr_i("keepdims", 0)]),
            ],
            vec![fixed("x", DType::F32, &[r, c])],
            vec![value("y", elem(DType::F32), &[None])],
            vec![
                init("starts", &Tensor::from_vec(vec![-1i64], &[1])),
                init("ends", &Tensor::from_vec(vec![i64::MIN], &[1])),
                init("axes", &Tensor::from_vec(vec![1i64], &[1])),
                init("steps", &Tensor::from_vec(vec![-step], &[1])),
                init("raxes", &Tensor::from_vec(vec![0i64], &[1])),
            ],
            13,
        );
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&[r, c], seed, false);
        let y = f32s(&model.run(std::slice::from_ref(&x)).unwrap()[0]);
        assert_jit(&model);
        let x = f32s(&x);
        let cols: Vec<usize> = (0..c).rev().step_by(step as usize).collect();
        prop_assert_eq!(y.len(), cols.len());
        for (o, &j) in cols.iter().enumerate() {
            let want: f64 = (0..r).map(|i| x[i * c + j] as f64).sum();
            let mag: f64 = (0..r).map(|i| (x[i * c + j] as f64).abs()).sum();
            prop_assert!((y[o] as f64 - want).abs() <= r as f64 * f32::EPSILON as f64 * mag + 1e-30);
        }
    }

    /// Conv (pads, strides, bias) -> MaxPool -> Softmax over channels
    /// against `tracejit::nn`'s eager conv2d, max_pool2d and softmax. The
    /// convolution's sums may be ordered differently (a K-term sum: K ulps
    /// of the magnitudes); pooling and softmax add a few ulps.
    #[test]
    fn small_cnn_matches_nn(hw in prop::sample::select(vec![5usize, 6, 8]), cin in 1usize..4, cout in 1usize..4,
                            stride in 1usize..3, seed in 0u64..1000) {
        let w = floats(&[cout, cin, 3, 3], seed + 1, false);
        let b = floats(&[cout], seed + 2, false);
        let bytes = model(
            vec![
                node("Conv", "conv", &["x", "w", "b"], &["c"],
                     vec![attr_ints("pads", &[1, 1, 1, 1]), attr_ints("strides", &[stride as i64, stride as i64])]),
                node("MaxPool", "pool", &["c"], &["p"], vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[1, 1])]),
                node("Softmax", "softmax", &["p"], &["y"], vec![attr_i("axis", 1)]),
            ],
            vec![fixed("x", DType::F32, &[2, cin, hw, hw])],
            vec![value("y", elem(DType::F32), &[None, None, None, None])],
            vec![init("w", &w), init("b", &b)],
            13,
        );
        let model = import_bytes(&bytes).unwrap();
        prop_assert_eq!(model.variables().len(), 2);
        let x = floats(&[2, cin, hw, hw], seed, false);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        let opts = tracejit_nn::Conv2dOptions::default().padding(1).stride(stride);
        let want = tracejit_nn::softmax(&tracejit_nn::max_pool2d(&tracejit_nn::conv2d(&x, &w, Some(&b), opts), [2, 2], [1, 1], [0, 0]), 1);
        prop_assert_eq!(y.shape(), want.shape());
        let k = (cin * 9 + 1) as f32;
        let mag = f32s(&x).iter().fold(0.0f32, |m, v| m.max(v.abs())) * f32s(&w).iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // Softmax turns an absolute logit error e into a relative error of about 2e.
        let tol = 2.0 * k * k * f32::EPSILON * mag.max(1.0) + 8.0 * f32::EPSILON;
        for (g, e) in f32s(&y).iter().zip(f32s(&want)) {
            prop_assert!((g - e).abs() <= tol * e.abs().max(1e-3), "{g} vs {e} (tol {tol})");
        }
    }
}

/// A Reshape whose shape is a graph input: the input is static (its value
/// joins the cache key), each new value traces again, a repeated value
/// does not, and results follow the value.
#[test]
fn a_shape_fed_as_an_input_is_static_and_retraces_per_value() {
    let bytes = model(
        vec![node("Reshape", "reshape", &["x", "shape"], &["y"], vec![])],
        vec![fixed("x", DType::F32, &[2, 6]), fixed("shape", DType::I64, &[2])],
        vec![value("y", elem(DType::F32), &[None, None])],
        vec![],
        13,
    );
    let model = import_bytes(&bytes).unwrap();
    assert_eq!(model.static_inputs(), ["shape"]);
    let x = Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[2, 6]);
    let shape_a = Tensor::from_vec(vec![3i64, -1], &[2]);
    let shape_b = Tensor::from_vec(vec![0i64, 3, 2], &[3]);
    let ya = model.run(&[x.clone(), shape_a.clone()]).unwrap().remove(0);
    assert_eq!(ya.shape(), [3, 4]);
    let yb = model.run(&[x.clone(), Tensor::from_vec(vec![4i64, 3], &[2])]).unwrap().remove(0);
    assert_eq!(yb.shape(), [4, 3]);
    assert_eq!(model.function().tracing_count(), 2);
    model.run(&[x.clone(), shape_a]).unwrap();
    assert_eq!(model.function().tracing_count(), 2, "a value seen before must not retrace");
    assert_eq!(f32s(&yb), (0..12).map(|i| i as f32).collect::<Vec<_>>());
    // A shape of another length contradicts the declared [2]: an input error, nothing traced.
    let e = model.run(&[x, shape_b]).unwrap_err().to_string();
    assert!(e.contains("'shape'") && e.contains("dim 0 must be 2"), "{e}");
    assert_eq!(model.function().tracing_count(), 2);
}

/// Assigning an imported Variable changes later results without a retrace.
#[test]
fn variables_are_live_without_retracing() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let bytes = model(
        vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
        vec![fixed("x", DType::F32, &[2])],
        vec![fixed("y", DType::F32, &[2])],
        vec![init("w", &w)],
        17,
    );
    let model = import_bytes(&bytes).unwrap();
    let vars = model.variables();
    assert_eq!(vars.len(), 1);
    assert_eq!(vars[0].0, "w");
    let x = Tensor::from_vec(vec![3.0f32, 4.0], &[2]);
    assert_eq!(f32s(&model.run(std::slice::from_ref(&x)).unwrap()[0]), [3.0, 8.0]);
    vars[0].1.assign(&Tensor::from_vec(vec![-1.0f32, 0.5], &[2]));
    assert_eq!(f32s(&model.run(&[x]).unwrap()[0]), [-3.0, 2.0]);
    assert_eq!(model.function().tracing_count(), 1);
}

/// A CNN whose batch is symbolic (Conv, MaxPool, AveragePool, a Reshape
/// with a 0 and a -1), traced once for any batch with
/// `Model::concrete_function`: that one trace serves runs at batches 1, 3
/// and 4 (no retrace), on the JIT, matching the model evaluated eagerly op
/// by op (NaN and infinities planted). A Reshape with two dims left to
/// infer is refused.
#[test]
fn a_cnn_traced_for_any_batch_matches_the_eager_model() {
    use tracejit_trace::TensorSpec;
    let w = floats(&[4, 2, 3, 3], 5, false);
    let b = floats(&[4], 6, false);
    let shape = Tensor::from_vec(vec![0i64, -1], &[2]);
    let nodes = |target: &str| {
        vec![
            node("Conv", "conv", &["x", "w", "b"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("MaxPool", "max", &["c"], &["m"], vec![attr_ints("kernel_shape", &[2, 2])]),
            node(
                "AveragePool",
                "avg",
                &["m"],
                &["a"],
                vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[1, 1])],
            ),
            node("Reshape", "flat", &["a", target], &["y"], vec![]),
        ]
    };
    let cnn = import_bytes(&model_bytes_with_target(nodes("shape"), &w, &b, &shape)).unwrap();
    let cf = cnn.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 2, 7, 7])]).unwrap();
    assert_eq!(cf.executor_kind(), "jit");
    // A conv output sums K = 2·9 products and the bias, in any order: K ulps
    // of the magnitudes; the pools add a few ulps of the value.
    let k = 19.0f32;
    let mag = f32s(&w).iter().fold(0.0f32, |m, v| m.max(v.abs())) * 6.0 + 1.0;
    let tol = |e: f32| k * k * f32::EPSILON * mag + 8.0 * f32::EPSILON * e.abs();
    for batch in [1usize, 3, 4] {
        let x = floats(&[batch, 2, 7, 7], batch as u64, true);
        let got = cnn.run(std::slice::from_ref(&x)).unwrap().remove(0);
        let want = cnn.evaluate(&[x]).unwrap().remove(0);
        assert_eq!(got.shape(), [batch, 4 * 5 * 5]);
        for (g, e) in f32s(&got).into_iter().zip(f32s(&want)) {
            let same_special = (g.is_nan() && e.is_nan()) || (g.is_infinite() && g == e);
            assert!(same_special || (g - e).abs() <= tol(e), "batch {batch}: {g} vs {e}");
        }
    }
    assert_jit(&cnn);
    assert_eq!(cnn.function().concrete_functions().len(), 1, "the any-batch trace served every batch");

    // [0, -1] of [?, ?, 6]: the batch is copied, but the -1 is unknown too.
    let bytes = model(
        vec![node("Reshape", "flat", &["x", "shape"], &["y"], vec![])],
        vec![value("x", elem(DType::F32), &[None, None, Some(6)])],
        vec![value("y", elem(DType::F32), &[None, None])],
        vec![init("shape", &shape)],
        13,
    );
    let reshape = import_bytes(&bytes).unwrap();
    let err = reshape.concrete_function(&[TensorSpec::new(DType::F32, &[-1, -1, 6])]).unwrap_err().to_string();
    assert!(err.contains("Reshape") && err.contains("more than one dim"), "{err}");
}

fn model_bytes_with_target(
    nodes: Vec<tracejit_onnx::pb::NodeProto>,
    w: &Tensor,
    b: &Tensor,
    target: &Tensor,
) -> Vec<u8> {
    model(
        nodes,
        vec![value("x", elem(DType::F32), &[None, Some(2), Some(7), Some(7)])],
        vec![value("y", elem(DType::F32), &vec![None; target.len()])],
        vec![init("w", w), init("b", b), init("shape", target)],
        13,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// CenterCropPad on a random subset of axes (negative ones too) against
    /// index arithmetic: output element `o` along a cropped axis reads
    /// input `o + ⌊(dim − size)/2⌋`; along a padded one it reads `o −
    /// ⌊(size − dim)/2⌋` where that is inside, else it is 0. Exact (a copy).
    #[test]
    fn center_crop_pad_moves_elements_by_the_centred_offsets(shape in prop::collection::vec(1usize..6, 1..4),
                                                            targets in prop::collection::vec(1usize..8, 3),
                                                            pick in prop::collection::vec(any::<bool>(), 3), seed in 0u64..1000) {
        let rank = shape.len();
        let axes: Vec<usize> = (0..rank).filter(|&a| pick[a]).collect();
        let sizes: Vec<i64> = axes.iter().map(|&a| targets[a] as i64).collect();
        let mut out_shape = shape.clone();
        axes.iter().for_each(|&a| out_shape[a] = targets[a]);
        let bytes = model(
            vec![node("CenterCropPad", "ccp", &["x", "shape"], &["y"], vec![attr_ints("axes", &axes.iter().map(|&a| a as i64 - rank as i64).collect::<Vec<_>>())])],
            vec![fixed("x", DType::F32, &shape)],
            vec![fixed("y", DType::F32, &out_shape)],
            vec![init("shape", &Tensor::from_vec(sizes.clone(), &[sizes.len()]))],
            18,
        );
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&shape, seed, true);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        prop_assert_eq!(y.shape(), &out_shape[..]);
        let (xv, yv) = (f32s(&x), f32s(&y));
        for (flat, &got) in yv.iter().enumerate() {
            let mut rest = flat;
            let mut idx = vec![0usize; rank];
            for a in (0..rank).rev() {
                idx[a] = rest % out_shape[a];
                rest /= out_shape[a];
            }
            // The input index, or None in the zero padding.
            let src: Option<Vec<usize>> = (0..rank).map(|a| {
                let (dim, size) = (shape[a], out_shape[a]);
                let i = idx[a] as i64 + (dim as i64 - size as i64).div_euclid(2).max(0) - (size as i64 - dim as i64).div_euclid(2).max(0);
                (0..dim as i64).contains(&i).then_some(i as usize)
            }).collect();
            let want = src.map_or(0.0, |s| xv[s.iter().zip(&shape).fold(0, |f, (&i, &d)| f * d + i)]);
            prop_assert!(same(got, want), "y[{idx:?}] = {got}, want {want}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// AffineGrid in 2-D and 3-D, with and without align_corners, against
    /// f64 loops: each output is `Σ θ_k · c_k + θ_last` over normalized
    /// coordinates (rounded to f32 as constants), so within (nd + 3)
    /// roundings of the magnitudes summed.
    #[test]
    fn affine_grid_matches_f64(nb in 1usize..3, dims in prop::collection::vec(1usize..5, 2..4), align: bool, seed in 0u64..1000) {
        let nd = dims.len();
        let mut size = vec![nb as i64, 1];
        size.extend(dims.iter().map(|&d| d as i64));
        let mut out_shape = vec![nb];
        out_shape.extend(&dims);
        out_shape.push(nd);
        let bytes = model(
            vec![node("AffineGrid", "grid", &["theta", "size"], &["y"], vec![attr_i("align_corners", align as i64)])],
            vec![fixed("theta", DType::F32, &[nb, nd, nd + 1])],
            vec![fixed("y", DType::F32, &out_shape)],
            vec![init("size", &Tensor::from_vec(size, &[nd + 2]))],
            20,
        );
        let model = import_bytes(&bytes).unwrap();
        let theta = floats(&[nb, nd, nd + 1], seed, false);
        let y = f32s(&model.run(std::slice::from_ref(&theta)).unwrap()[0]);
        assert_jit(&model);
        let th = f32s(&theta);
        let coord = |i: usize, len: usize| if align { if len == 1 { -1.0 } else { -1.0 + 2.0 * i as f64 / (len - 1) as f64 } } else { -1.0 + (2 * i + 1) as f64 / len as f64 };
        let points: usize = dims.iter().product();
        for b in 0..nb {
            for p in 0..points {
                let mut rest = p;
                let mut idx = vec![0; nd];
                for a in (0..nd).rev() {
                    idx[a] = rest % dims[a];
                    rest /= dims[a];
                }
                // (x, y[, z], 1): x is the last spatial dim.
                let mut h: Vec<f64> = (0..nd).rev().map(|a| coord(idx[a], dims[a])).collect();
                h.push(1.0);
                for (row, &got) in y[(b * points + p) * nd..(b * points + p + 1) * nd].iter().enumerate() {
                    let terms: Vec<f64> = (0..=nd).map(|k| th[(b * nd + row) * (nd + 1) + k] as f64 * h[k]).collect();
                    let want: f64 = terms.iter().sum();
                    let bound = (nd + 3) as f64 * f32::EPSILON as f64 * terms.iter().map(|t| t.abs()).sum::<f64>() + 1e-30;
                    prop_assert!((got as f64 - want).abs() <= bound, "grid[{b}, point {p}, {row}] = {got}, want {want}");
                }
            }
        }
    }
}

/// Hann, Hamming and Blackman windows, periodic and symmetric, against
/// their formulas in f64: each is one f64 value rounded once to f32 (half
/// an ulp; the f64 cosines add far less). The length is a static input.
#[test]
fn windows_match_their_formulas() {
    use std::f64::consts::PI;
    for op in ["HannWindow", "HammingWindow", "BlackmanWindow"] {
        for periodic in [0i64, 1] {
            let bytes = model(
                vec![node(op, "w", &["n"], &["y"], vec![attr_i("periodic", periodic)])],
                vec![fixed("n", DType::I64, &[])],
                vec![value("y", elem(DType::F32), &[None])],
                vec![],
                17,
            );
            let model = import_bytes(&bytes).unwrap();
            assert_eq!(model.static_inputs(), ["n"]);
            for len in [1i64, 2, 7, 16] {
                let y = f32s(&model.run(&[Tensor::scalar(len)]).unwrap()[0]);
                assert_jit(&model);
                assert_eq!(y.len(), len as usize);
                let period = if periodic == 1 { len } else { len - 1 } as f64;
                for (i, &got) in y.iter().enumerate() {
                    let x = 2.0 * PI * i as f64 / period;
                    let want = match op {
                        "HannWindow" => (PI * i as f64 / period).sin().powi(2),
                        // alpha - (1 - alpha) cos, alpha = 25/46 as the spec's reference has it.
                        "HammingWindow" => 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * x.cos(),
                        _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
                    };
                    let ok = if want.is_nan() {
                        got.is_nan()
                    } else {
                        (got as f64 - want).abs() <= 0.5 * f32::EPSILON as f64 * want.abs() + 1e-15
                    };
                    assert!(ok, "{op} periodic={periodic} len={len} [{i}]: {got}, want {want}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Col2Im in 1-D and 2-D with strides, dilations and pads against the
    /// loop of its definition (each image element sums the column entries
    /// landing on it: at most ∏block terms, so that many roundings).
    #[test]
    fn col2im_sums_columns_into_the_image(nd in 1usize..3, img in prop::collection::vec(2i64..6, 2), blk in prop::collection::vec(1i64..3, 2),
                                          st in prop::collection::vec(1i64..3, 2), dil in prop::collection::vec(1i64..3, 2),
                                          pd in prop::collection::vec(0i64..2, 4), c in 1usize..3, seed in 0u64..1000) {
        let (image, block, strides, dilations) = (&img[..nd], &blk[..nd], &st[..nd], &dil[..nd]);
        let pads: Vec<i64> = pd[..nd].iter().chain(&pd[2..2 + nd]).copied().collect();
        let blocks: Vec<i64> = (0..nd).map(|d| (image[d] + pads[d] + pads[nd + d] - dilations[d] * (block[d] - 1) - 1) / strides[d] + 1).collect();
        prop_assume!(blocks.iter().all(|&b| b >= 1));
        let (k, l) = (block.iter().product::<i64>() as usize, blocks.iter().product::<i64>() as usize);
        let bytes = model(
            vec![node("Col2Im", "c2i", &["x", "image", "block"], &["y"],
                      vec![attr_ints("strides", strides), attr_ints("dilations", dilations), attr_ints("pads", &pads)])],
            vec![fixed("x", DType::F32, &[1, c * k, l])],
            vec![value("y", elem(DType::F32), &vec![None; 2 + nd])],
            vec![init("image", &Tensor::from_vec(image.to_vec(), &[nd])), init("block", &Tensor::from_vec(block.to_vec(), &[nd]))],
            18,
        );
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&[1, c * k, l], seed, false);
        let y = f32s(&model.run(std::slice::from_ref(&x)).unwrap()[0]);
        assert_jit(&model);
        let xv = f32s(&x);
        let size: usize = image.iter().product::<i64>() as usize;
        let (mut want, mut mag) = (vec![0.0f64; c * size], vec![0.0f64; c * size]);
        let unflat = |mut v: usize, dims: &[i64]| -> Vec<i64> {
            let mut idx = vec![0i64; dims.len()];
            for d in (0..dims.len()).rev() { idx[d] = (v % dims[d] as usize) as i64; v /= dims[d] as usize; }
            idx
        };
        for ch in 0..c { for ki in 0..k { for li in 0..l {
            let (kk, bl) = (unflat(ki, block), unflat(li, &blocks));
            let pos: Vec<i64> = (0..nd).map(|d| bl[d] * strides[d] - pads[d] + kk[d] * dilations[d]).collect();
            if (0..nd).all(|d| (0..image[d]).contains(&pos[d])) {
                let flat = pos.iter().zip(image).fold(0, |f, (&p, &dim)| f * dim + p) as usize;
                let v = xv[(ch * k + ki) * l + li] as f64;
                want[ch * size + flat] += v;
                mag[ch * size + flat] += v.abs();
            }
        }}}
        prop_assert_eq!(y.len(), want.len());
        for (i, (&g, (&w, &m))) in y.iter().zip(want.iter().zip(&mag)).enumerate() {
            prop_assert!((g as f64 - w).abs() <= (k + 1) as f64 * f32::EPSILON as f64 * m + 1e-30, "y[{i}] = {g}, want {w}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// `LpNormalization` (p = 1, 2) along any axis against an f64 loop,
    /// slices of zeros giving zeros (ONNX's reference: 0, not 0 / 0). The
    /// norm sums `k` terms, each rounded once, then a square root and the
    /// division: within (k + 3) ulps of the result relative to |x| / norm.
    #[test]
    fn lp_normalization_matches_f64_with_zero_slices(shape in prop::collection::vec(1usize..5, 1..4), axis_pick in 0usize..3,
                                                     p in 1i64..3, zeroed in 0usize..3, seed in 0u64..1000) {
        let axis = axis_pick % shape.len();
        let bytes = model(
            vec![node("LpNormalization", "lp", &["x"], &["y"], vec![attr_i("axis", axis as i64), attr_i("p", p)])],
            vec![fixed("x", DType::F32, &shape)],
            vec![fixed("y", DType::F32, &shape)],
            vec![],
            22,
        );
        let model = import_bytes(&bytes).unwrap();
        // The slice through element 0 along `axis`, and `zeroed` others, all zeros.
        let strides: Vec<usize> = (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect();
        let (k, stride) = (shape[axis], strides[axis]);
        let mut v = f32s(&floats(&shape, seed, false));
        let n = v.len();
        for z in 0..=zeroed {
            let start = (z * 7919 + seed as usize) % n;
            let base = start - (start / stride % k) * stride;
            for j in 0..k {
                v[base + j * stride] = 0.0;
            }
        }
        let y = f32s(&model.run(&[Tensor::from_vec(v.clone(), &shape)]).unwrap().remove(0));
        assert_jit(&model);
        let eps = f32::EPSILON as f64;
        for i in 0..n {
            let base = i - (i / stride % k) * stride;
            let norm = (0..k).map(|j| v[base + j * stride] as f64).map(|x| if p == 1 { x.abs() } else { x * x }).sum::<f64>();
            let norm = if p == 1 { norm } else { norm.sqrt() };
            let want = if norm == 0.0 { 0.0 } else { v[i] as f64 / norm };
            let tol = (k as f64 + 3.0) * eps * want.abs();
            prop_assert!((y[i] as f64 - want).abs() <= tol, "{shape:?} axis {axis} p {p} at {i}: {} vs {want}", y[i]);
        }
    }
}

/// `Atan`, `Asin` and `Acos` against f64 at their edges: ±1 (±pi/2, 0 and
/// pi), next to them (where `1 - x²` and `pi/2 - asin` would cancel), past
/// them (NaN), infinities and NaN. Each result is a few f32 roundings of a
/// well-conditioned formula: within 8 ulps of the f64 value (4 ulps of
/// slack against the few roundings, whose errors the atan's slope < 1
/// does not enlarge), absolute 1e-7 at 0.
#[test]
fn inverse_trigonometric_ops_match_f64_at_their_edges() {
    let xs: Vec<f32> = vec![
        -1.0,
        -0.9999999,
        -0.75,
        -1e-20,
        0.0,
        0.3,
        0.5,
        0.9999,
        0.9999999,
        1.0,
        1.5,
        -2.0,
        f32::INFINITY,
        f32::NAN,
    ];
    let n = xs.len();
    type Reference = fn(f64) -> f64;
    let refs: [(&str, Reference); 3] = [("Atan", f64::atan), ("Asin", f64::asin), ("Acos", f64::acos)];
    for (op, reference) in refs {
        let bytes = model(
            vec![node(op, "y", &["x"], &["y"], vec![])],
            vec![fixed("x", DType::F32, &[n])],
            vec![fixed("y", DType::F32, &[n])],
            vec![],
            22,
        );
        let model = import_bytes(&bytes).unwrap();
        let y = f32s(&model.run(&[Tensor::from_vec(xs.clone(), &[n])]).unwrap().remove(0));
        assert_jit(&model);
        for (&x, &got) in xs.iter().zip(&y) {
            let want = reference(x as f64);
            if want.is_nan() {
                assert!(got.is_nan(), "{op}({x}) = {got}, expected NaN");
                continue;
            }
            let tol = 8.0 * f32::EPSILON as f64 * want.abs() + 1e-7 * f64::from(u8::from(want == 0.0));
            assert!((got as f64 - want).abs() <= tol, "{op}({x}) = {got}, expected {want}");
        }
    }
}
