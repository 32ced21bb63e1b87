//! `Resize` against independent rules rather than a second port of the
//! reference: nearest `asymmetric` / `floor` picks `x[⌊y / scale⌋]`
//! exactly; linear `align_corners` is `(1 − r)·x[i] + r·x[i + 1]` at
//! `y·(in − 1)/(out − 1)` (two products and a sum: 3 roundings of the
//! magnitudes); and every mode and coordinate rule keeps a constant input
//! constant (its weights sum to one: a few roundings of the constant).
//! `GridSample` likewise: pixel positions read the pixels, and far
//! outside, zeros and border padding read 0 and the edge. Each run
//! asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

fn resize(x: &Tensor, sizes: &[usize], attrs: Vec<tracejit_onnx::pb::AttributeProto>) -> Vec<f32> {
    let r = x.rank();
    let bytes = model(
        vec![node("Resize", "resize", &["x", "", "", "sizes"], &["y"], attrs)],
        vec![fixed("x", DType::F32, x.shape())],
        vec![fixed("y", DType::F32, sizes)],
        vec![init("sizes", &Tensor::from_vec(sizes.iter().map(|&s| s as i64).collect::<Vec<_>>(), &[r]))],
        19,
    );
    let model = import_bytes(&bytes).unwrap();
    let y = model.run(std::slice::from_ref(x)).unwrap().remove(0);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    assert_eq!(y.shape(), sizes);
    y.to_vec::<f32>().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn nearest_asymmetric_floor_picks_the_floor(n in 1usize..6, m in 1usize..12, seed in 0u64..10_000) {
        let x = floats(&[1, n], seed, true);
        let y = resize(&x, &[1, m], vec![attr_s("mode", "nearest"), attr_s("coordinate_transformation_mode", "asymmetric"), attr_s("nearest_mode", "floor")]);
        let xv = x.to_vec::<f32>().unwrap();
        let scale = m as f64 / n as f64;
        for (i, &g) in y.iter().enumerate() {
            let src = ((i as f64 / scale).floor() as usize).min(n - 1);
            prop_assert!(g.to_bits() == xv[src].to_bits(), "y[{i}] = {g}, want x[{src}] = {}", xv[src]);
        }
    }

    #[test]
    fn linear_align_corners_interpolates_between_neighbours(n in 2usize..6, m in 2usize..12, seed in 0u64..10_000) {
        let x = floats(&[n, 1], seed, false);
        let y = resize(&x, &[m, 1], vec![attr_s("mode", "linear"), attr_s("coordinate_transformation_mode", "align_corners")]);
        let xv: Vec<f64> = x.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        for (i, &g) in y.iter().enumerate() {
            let pos = i as f64 * (n - 1) as f64 / (m - 1) as f64;
            let lo = (pos.floor() as usize).min(n - 2);
            let r = pos - lo as f64;
            let want = (1.0 - r) * xv[lo] + r * xv[lo + 1];
            let bound = 3.0 * f32::EPSILON as f64 * ((1.0 - r).abs() * xv[lo].abs() + r.abs() * xv[lo + 1].abs()) + 1e-30;
            prop_assert!((g as f64 - want).abs() <= bound, "y[{i}] = {g}, want {want}");
        }
    }

    #[test]
    fn every_mode_keeps_a_constant_constant(h in 1usize..6, w in 1usize..6, oh in 1usize..9, ow in 1usize..9,
                                             mode in prop::sample::select(vec!["nearest", "linear", "cubic"]),
                                             coord in prop::sample::select(vec!["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]),
                                             antialias: bool, exclude_outside: bool, c in -4.0f32..4.0) {
        let x = Tensor::full(&[1, 1, h, w], c as f64, DType::F32);
        let mut attrs = vec![attr_s("mode", mode), attr_s("coordinate_transformation_mode", coord)];
        // Nearest under exclude_outside gives 0 where its tap is outside (as
        // the reference does): no partition of unity there.
        if mode != "nearest" {
            attrs.push(attr_i("antialias", antialias as i64));
            attrs.push(attr_i("exclude_outside", exclude_outside as i64));
        }
        let y = resize(&x, &[1, 1, oh, ow], attrs);
        // Each axis: a weighted sum of up to ~16 taps whose weights sum to one
        // (rounded in f32): a few dozen roundings of |c| at most.
        let bound = 64.0 * f32::EPSILON as f64 * (c as f64).abs() + 1e-30;
        for (i, &g) in y.iter().enumerate() {
            prop_assert!((g as f64 - c as f64).abs() <= bound, "{mode}/{coord}: y[{i}] = {g}, want {c}");
        }
    }
}

fn grid_sample(x: &Tensor, grid: &Tensor, attrs: Vec<tracejit_onnx::pb::AttributeProto>) -> Vec<f32> {
    let bytes = model(
        vec![node("GridSample", "gs", &["x", "grid"], &["y"], attrs)],
        vec![fixed("x", DType::F32, x.shape()), fixed("grid", DType::F32, grid.shape())],
        vec![value("y", elem(DType::F32), &[None, None, None, None])],
        vec![],
        22,
    );
    let model = import_bytes(&bytes).unwrap();
    let y = model.run(&[x.clone(), grid.clone()]).unwrap().remove(0);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    y.to_vec::<f32>().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// GridSample at pixel positions (align_corners: -1 + 2i/(len − 1)) reads
    /// the pixels exactly in every mode (the other taps weigh 0 or the
    /// cubic's 0 at integers), with NaN/Inf elsewhere in X irrelevant to
    /// nearest; and far outside, zeros padding reads 0 and border padding
    /// the edge pixel.
    #[test]
    fn grid_sample_reads_pixels_and_pads(h in 2usize..5, w in 2usize..5, mode in prop::sample::select(vec!["nearest", "linear", "cubic"]),
                                        seed in 0u64..10_000) {
        let x = Tensor::randn(&[1, 1, h, w], seed);
        let xv = x.to_vec::<f32>().unwrap();
        // Every pixel, then a point far outside (x = 5, y = -7).
        let mut g = Vec::new();
        for i in 0..h {
            for j in 0..w {
                g.push(-1.0 + 2.0 * j as f32 / (w - 1) as f32);
                g.push(-1.0 + 2.0 * i as f32 / (h - 1) as f32);
            }
        }
        g.extend([5.0, -7.0]);
        let grid = Tensor::from_vec(g, &[1, 1, h * w + 1, 2]);
        for padding in ["zeros", "border"] {
            let y = grid_sample(&x, &grid, vec![attr_s("mode", mode), attr_s("padding_mode", padding), attr_i("align_corners", 1)]);
            for (k, &want) in xv.iter().enumerate() {
                let tol = if mode == "nearest" { 0.0 } else { 4.0 * f32::EPSILON * want.abs().max(1e-30) };
                prop_assert!((y[k] - want).abs() <= tol, "{mode}/{padding}: pixel {k}: {}, want {want}", y[k]);
            }
            // (5, -7) lies beyond the top-right corner: border reads x[0, w - 1].
            let far = *y.last().unwrap();
            let want = if padding == "zeros" { 0.0 } else { xv[w - 1] };
            let tol = 8.0 * f32::EPSILON * want.abs();
            prop_assert!((far - want).abs() <= tol, "{mode}/{padding}: far point {far}, want {want}");
        }
    }
}
