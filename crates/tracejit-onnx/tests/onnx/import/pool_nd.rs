//! `MaxPool`, `AveragePool` and `LpPool` with dilations and on 1 to 3
//! spatial axes (the importer's strided-slice path where the 2-D ops do not
//! reach, and the 2-D ops where they do) against a plain f64 loop over each
//! window, on random shapes, strides, dilations, pads, `auto_pad`,
//! `ceil_mode`, `count_include_pad` and `p`, with NaN and infinities
//! planted. The window rules are written here from ONNX's operator spec
//! (output sizes, `SAME_*` pads, a `ceil_mode` window never starting in the
//! end padding, its overhang past the padding never counted). Each run
//! asserts that the JIT executed the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor, TensorSpec};

use super::builder::*;

fn assert_jit(model: &tracejit_onnx::Model) {
    let cfs = model.function().concrete_functions();
    assert!(!cfs.is_empty(), "the model was never traced");
    for cf in cfs {
        assert_eq!(cf.executor_kind(), "jit", "the JIT did not run the model: {:?}", cf.jit_error());
    }
}

/// What the pool computes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Max,
    Average { count_include_pad: bool },
    Lp { p: i64 },
}

/// One pooling problem.
#[derive(Clone, Debug)]
pub struct Pool {
    pub kind: Kind,
    /// `[N, C, spatial..]`.
    pub shape: Vec<usize>,
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// Begin pads then end pads (ONNX's order).
    pub pads: Vec<usize>,
    pub auto_pad: &'static str,
    pub ceil_mode: bool,
}

/// One axis resolved by the spec: begin pad, end pad, output length.
fn axis_window(p: &Pool, a: usize) -> (usize, usize, usize) {
    let sr = p.kernel.len();
    let (input, k, s, d) = (p.shape[2 + a], p.kernel[a], p.strides[a], p.dilations[a]);
    let extent = (k - 1) * d + 1;
    let (pb, pe) = match p.auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => {
            let out = input.div_ceil(s);
            let total = ((out - 1) * s + extent).saturating_sub(input);
            if p.auto_pad == "SAME_UPPER" {
                (total / 2, total - total / 2)
            } else {
                (total - total / 2, total / 2)
            }
        }
        "VALID" => (0, 0),
        _ => (p.pads[a], p.pads[sr + a]),
    };
    let room = (input + pb + pe - extent) as f64 / s as f64;
    let mut out = if p.ceil_mode { room.ceil() as usize + 1 } else { room.floor() as usize + 1 };
    if p.ceil_mode && (out - 1) * s >= input + pb {
        out -= 1;
    }
    (pb, pe, out)
}

/// The pool by loops in f64: each output's window taps, in row-major order.
pub fn reference(p: &Pool, x: &[f32]) -> (Vec<usize>, Vec<f64>) {
    let sr = p.kernel.len();
    let win: Vec<(usize, usize, usize)> = (0..sr).map(|a| axis_window(p, a)).collect();
    let mut out_shape = p.shape[..2].to_vec();
    out_shape.extend(win.iter().map(|w| w.2));
    let spatial = &p.shape[2..];
    let plane: usize = spatial.iter().product();
    let outs: usize = win.iter().map(|w| w.2).product();
    let taps: usize = p.kernel.iter().product();
    let mut y = Vec::new();
    for nc in 0..p.shape[0] * p.shape[1] {
        for o in 0..outs {
            let oi = unflatten(o, &win.iter().map(|w| w.2).collect::<Vec<_>>());
            let (mut vals, mut padded_taps) = (Vec::new(), 0usize);
            for t in 0..taps {
                let ti = unflatten(t, &p.kernel);
                // Position of the tap on the padded axis, then on the input.
                let pos: Vec<usize> = (0..sr).map(|a| oi[a] * p.strides[a] + ti[a] * p.dilations[a]).collect();
                let in_padding = (0..sr).all(|a| pos[a] < win[a].0 + spatial[a] + win[a].1);
                let inside = (0..sr).all(|a| pos[a] >= win[a].0 && pos[a] < win[a].0 + spatial[a]);
                if inside {
                    let idx: Vec<usize> = (0..sr).map(|a| pos[a] - win[a].0).collect();
                    vals.push(x[nc * plane + flatten(&idx, spatial)] as f64);
                }
                padded_taps += in_padding as usize;
            }
            y.push(match p.kind {
                // NaN wins; an empty window (all padding) is -inf.
                Kind::Max if vals.iter().any(|v| v.is_nan()) => f64::NAN,
                Kind::Max => vals.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v)),
                Kind::Average { count_include_pad } => {
                    let count = if count_include_pad { padded_taps } else { vals.len() };
                    vals.iter().sum::<f64>() / count as f64
                }
                Kind::Lp { p } => vals.iter().map(|v| v.abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64),
            });
        }
    }
    (out_shape, y)
}

fn unflatten(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

fn flatten(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |f, (&i, &d)| f * d + i)
}

/// The one-node model of `p` (opset 19: AveragePool's dilations).
pub fn pool_model(p: &Pool, batch: Option<usize>) -> Vec<u8> {
    let (op, mut attrs) = match p.kind {
        Kind::Max => ("MaxPool", vec![]),
        Kind::Average { count_include_pad } => {
            ("AveragePool", vec![attr_i("count_include_pad", count_include_pad as i64)])
        }
        Kind::Lp { p } => ("LpPool", vec![attr_i("p", p)]),
    };
    let ints = |v: &[usize]| v.iter().map(|&u| u as i64).collect::<Vec<_>>();
    attrs.push(attr_ints("kernel_shape", &ints(&p.kernel)));
    attrs.push(attr_ints("strides", &ints(&p.strides)));
    attrs.push(attr_ints("dilations", &ints(&p.dilations)));
    attrs.push(attr_i("ceil_mode", p.ceil_mode as i64));
    if p.auto_pad == "NOTSET" {
        attrs.push(attr_ints("pads", &ints(&p.pads)));
    } else {
        attrs.push(attr_s("auto_pad", p.auto_pad));
    }
    let mut dims: Vec<Option<i64>> = p.shape.iter().map(|&d| Some(d as i64)).collect();
    dims[0] = batch.map(|b| b as i64);
    let out = vec![None; p.shape.len()];
    model(
        vec![node(op, "pool", &["x"], &["y"], attrs)],
        vec![value("x", elem(DType::F32), &dims)],
        vec![value("y", elem(DType::F32), &out)],
        vec![],
        19,
    )
}

/// Checks the model's output on `x` against the reference. The max picks
/// one of its inputs (exact); a sum of K taps in any order is within
/// (K - 1) ulps of the sum of magnitudes, and a division adds half an ulp;
/// LpPool's powers (each within a few ulps: 8 allowed) are positive, so
/// the sum is within (K + 8) ulps of itself, and the root divides that
/// relative error by p and adds its own few ulps.
pub fn check(p: &Pool, got: &Tensor, x: &Tensor) -> Result<(), TestCaseError> {
    let xs = x.to_vec::<f32>().unwrap();
    let (shape, want) = reference(p, &xs);
    prop_assert_eq!(got.shape(), &shape[..]);
    let taps = p.kernel.iter().product::<usize>() as f64;
    let eps = f32::EPSILON as f64;
    let plane: usize = p.shape[2..].iter().product();
    let magnitude = |o: usize| -> f64 {
        // The largest input of the (n, c) plane bounds every tap.
        let nc = o / (want.len() / (p.shape[0] * p.shape[1]));
        xs[nc * plane..(nc + 1) * plane].iter().filter(|v| v.is_finite()).fold(0.0f64, |m, &v| m.max(v.abs() as f64))
    };
    for (o, (&g, &e)) in got.to_vec::<f32>().unwrap().iter().zip(&want).enumerate() {
        let g = g as f64;
        let ok = match p.kind {
            _ if e.is_nan() => g.is_nan(),
            _ if e.is_infinite() => g == e,
            Kind::Max => g == e,
            Kind::Average { .. } => (g - e).abs() <= taps * eps * magnitude(o) + eps * e.abs() + 1e-30,
            Kind::Lp { .. } => (g - e).abs() <= (taps + 16.0) * eps * e.abs() + 1e-30,
        };
        prop_assert!(ok, "output {} of {:?}: {} vs {}", o, p, g, e);
    }
    Ok(())
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Max),
        any::<bool>().prop_map(|c| Kind::Average { count_include_pad: c }),
        (1i64..4).prop_map(|p| Kind::Lp { p }),
    ]
}

/// A pool of `sr` spatial axes whose window fits its padded input: pads
/// smaller than the window's extent (as PyTorch and ONNX Runtime require),
/// the input at least what the window needs.
fn problem(sr: usize) -> impl Strategy<Value = Pool> {
    let axis = (1usize..8, 1usize..4, 1usize..4, 1usize..4, 0usize..3, 0usize..3);
    (
        kind(),
        1usize..3,
        1usize..3,
        prop::collection::vec(axis, sr),
        prop::sample::select(vec!["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
        any::<bool>(),
    )
        .prop_map(move |(kind, n, c, axes, auto_pad, ceil)| {
            let mut p = Pool {
                kind,
                shape: vec![n, c],
                kernel: axes.iter().map(|a| a.1).collect(),
                strides: axes.iter().map(|a| a.2).collect(),
                dilations: axes.iter().map(|a| a.3).collect(),
                pads: vec![0; 2 * sr],
                auto_pad,
                ceil_mode: ceil && auto_pad == "NOTSET",
            };
            for (a, &(input, k, _, d, pb, pe)) in axes.iter().enumerate() {
                let extent = (k - 1) * d + 1;
                let (pb, pe) = if auto_pad == "NOTSET" { (pb.min(extent - 1), pe.min(extent - 1)) } else { (0, 0) };
                p.pads[a] = pb;
                p.pads[sr + a] = pe;
                p.shape.push(input.max(extent.saturating_sub(pb + pe)));
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// 3-D pools of every kind and option against the f64 loop.
    #[test]
    fn pools_3d_match_the_loop(p in problem(3), seed in 0u64..1000, specials in any::<bool>()) {
        let bytes = pool_model(&p, Some(p.shape[0]));
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&p.shape, seed, specials);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        check(&p, &y, &x)?;
    }

    /// 1-D and 2-D pools, dilated or not (the strided-slice path and the
    /// 2-D ops), against the same loop.
    #[test]
    fn pools_1d_2d_match_the_loop(p in (1usize..3).prop_flat_map(problem), seed in 0u64..1000,
                                  specials in any::<bool>()) {
        let bytes = pool_model(&p, Some(p.shape[0]));
        let model = import_bytes(&bytes).unwrap();
        let x = floats(&p.shape, seed, specials);
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_jit(&model);
        check(&p, &y, &x)?;
    }
}

/// A dilated 3-D max pool and a 3-D average traced once for any batch:
/// runs at batches 1 and 3 use that one trace, on the JIT, and match the
/// loop.
#[test]
fn a_3d_pool_traced_for_any_batch_serves_every_batch() {
    for kind in [Kind::Max, Kind::Average { count_include_pad: false }] {
        let p = Pool {
            kind,
            shape: vec![1, 2, 5, 4, 6],
            kernel: vec![2, 3, 2],
            strides: vec![1, 2, 2],
            dilations: vec![2, 1, 2],
            pads: vec![1, 0, 1, 0, 1, 1],
            auto_pad: "NOTSET",
            ceil_mode: true,
        };
        let model = import_bytes(&pool_model(&p, None)).unwrap();
        let cf = model.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 2, 5, 4, 6])]).unwrap();
        assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        for batch in [1usize, 3] {
            let mut q = p.clone();
            q.shape[0] = batch;
            let x = floats(&q.shape, batch as u64, true);
            let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
            check(&q, &y, &x).unwrap();
        }
        assert_jit(&model);
        assert_eq!(model.function().concrete_functions().len(), 1, "the any-batch trace served every batch");
    }
}

/// A window that does not fit its input is refused with the reason.
#[test]
fn a_3d_window_larger_than_the_input_is_an_error() {
    let p = Pool {
        kind: Kind::Max,
        shape: vec![1, 1, 3, 3, 3],
        kernel: vec![2, 2, 2],
        strides: vec![1, 1, 1],
        dilations: vec![3, 1, 1],
        pads: vec![0; 6],
        auto_pad: "NOTSET",
        ceil_mode: false,
    };
    let model = import_bytes(&pool_model(&p, Some(1))).unwrap();
    let e = model.run(&[Tensor::zeros(&p.shape, DType::F32)]).unwrap_err().to_string();
    assert!(e.contains("MaxPool") && e.contains("does not fit"), "{e}");
}

/// Pads as large as the window (a window wholly in padding) and a kernel
/// of more taps than the slices take are refused with the reason.
#[test]
fn oversized_pads_and_kernels_are_errors() {
    let mut p = Pool {
        kind: Kind::Average { count_include_pad: false },
        shape: vec![1, 1, 3, 3, 3],
        kernel: vec![2, 2, 2],
        strides: vec![1, 1, 1],
        dilations: vec![1, 2, 1],
        pads: vec![0, 3, 0, 0, 0, 0],
        auto_pad: "NOTSET",
        ceil_mode: false,
    };
    let run = |p: &Pool| {
        let model = import_bytes(&pool_model(p, Some(1))).unwrap();
        model.run(&[Tensor::zeros(&p.shape, DType::F32)]).unwrap_err().to_string()
    };
    let e = run(&p);
    assert!(e.contains("AveragePool") && e.contains("pads (3, 0) must be smaller than the window's extent 3"), "{e}");
    p.pads = vec![0; 6];
    p.shape = vec![1, 1, 5000, 1, 1];
    p.kernel = vec![4999, 1, 1];
    let e = run(&p);
    assert!(e.contains("more than 4096 taps"), "{e}");
}
