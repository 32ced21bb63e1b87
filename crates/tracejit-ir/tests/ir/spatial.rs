//! The spatial op family in the IR: every op round-trips through the text
//! form, shape inference with unknown batch (and its errors, which say
//! what was expected and what came), the interpreter on the reference
//! loops, and a convolution's second derivatives (the backward ops' own
//! VJPs) against finite differences of its first; a max pool's are
//! refused by name.

use tracejit_ir::autodiff::grad_graph;
use tracejit_ir::tensor::{Conv2dAttrs, DType, Pool2dAttrs, SpatialOp, Storage};
use tracejit_ir::{infer, interpret, verify, Graph, Op, TensorType, ValueId};

use crate::common::{assert_round_trip, node, ty};

const CONV: Conv2dAttrs = Conv2dAttrs { stride: [2, 1], dilation: [1, 2], pad: [1, 0, 2, 1], groups: 2 };
const POOL: Pool2dAttrs = Pool2dAttrs { kernel: [3, 2], stride: [2, 1], pad: [1, 0, 1, 1] };

fn t(dtype: DType, dims: &[i64]) -> TensorType {
    ty(dtype, dims)
}

fn sp(op: SpatialOp, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
    infer(&Op::Spatial(op), inputs, None).map(|v| v.to_vec()).map_err(|e| e.to_string())
}

#[test]
fn every_spatial_op_round_trips_through_the_text_form() {
    let mut g = Graph::new("spatial");
    let x = g.add_param(t(DType::F32, &[-1, 4, 7, 6]));
    let w = g.add_param(t(DType::F32, &[6, 2, 3, 2]));
    let b = g.add_param(t(DType::F32, &[6]));
    let y = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv: CONV, bias: true, relu: true }), &[x, w, b]);
    let dx = node(&mut g, Op::Spatial(SpatialOp::Conv2dBackwardData { conv: CONV, input_hw: [7, 6] }), &[y, w]);
    let f = g
        .add_node(
            Op::Spatial(SpatialOp::Conv2dBackwardFilter { conv: CONV, kernel: [3, 2], bias: true }),
            &[x, y],
            &[],
            None,
        )
        .unwrap();
    let m = node(&mut g, Op::Spatial(SpatialOp::MaxPool2d { pool: POOL }), &[x]);
    let dm = node(&mut g, Op::Spatial(SpatialOp::MaxPool2dBackward { pool: POOL }), &[x, m]);
    let a = node(&mut g, Op::Spatial(SpatialOp::AvgPool2d { pool: POOL }), &[x]);
    let da = node(&mut g, Op::Spatial(SpatialOp::AvgPool2dBackward { pool: POOL, input_hw: [7, 6] }), &[a]);
    g.outputs = vec![y, dx, ValueId::new(f, 0), ValueId::new(f, 1), m, dm, a, da];
    verify(&g).unwrap();
    let text = format!("{g:#}");
    assert!(
        text.contains("conv2d[stride=[2, 1], dilation=[1, 2], pads=[1, 0, 2, 1], groups=2, bias=true, relu=true]"),
        "{text}"
    );
    assert_round_trip(&g);
    // The batch stays unknown through every op; the rest is inferred.
    let out = g.output_types();
    assert_eq!(out[0].to_string(), "f32[?, 6, 4, 5]");
    assert_eq!(
        (out[1].to_string(), out[2].to_string(), out[3].to_string()),
        ("f32[?, 4, 7, 6]".into(), "f32[6, 2, 3, 2]".into(), "f32[6]".into())
    );
    assert_eq!((out[4].to_string(), out[7].to_string()), ("f32[?, 4, 4, 6]".into(), "f32[?, 4, 7, 6]".into()));
}

#[test]
fn shape_errors_say_what_was_expected_and_what_came() {
    let conv = SpatialOp::Conv2d { conv: Conv2dAttrs::DEFAULT, bias: true, relu: false };
    let e = sp(conv, &[t(DType::F32, &[1, 3, 5, 5]), t(DType::F32, &[8, 2, 3, 3]), t(DType::F32, &[8])]).unwrap_err();
    assert!(e.contains("conv2d") && e.contains("expect 2 input channels") && e.contains("got 3"), "{e}");
    let e = sp(conv, &[t(DType::F32, &[1, 3, 5, 5]), t(DType::F32, &[8, 3, 3, 3]), t(DType::F32, &[4])]).unwrap_err();
    assert!(e.contains("bias must be f32[8]") && e.contains("got f32[4]"), "{e}");
    let e = sp(conv, &[t(DType::F32, &[1, 3, 2, 5]), t(DType::F32, &[8, 3, 3, 3]), t(DType::F32, &[8])]).unwrap_err();
    assert!(e.contains("does not fit the height"), "{e}");
    let e = sp(conv, &[t(DType::F32, &[3, 5, 5]), t(DType::F32, &[8, 3, 3, 3]), t(DType::F32, &[8])]).unwrap_err();
    assert!(e.contains("rank 4 (NCHW)"), "{e}");
    let e = sp(conv, &[t(DType::I32, &[1, 3, 5, 5]), t(DType::I32, &[8, 3, 3, 3]), t(DType::I32, &[8])]).unwrap_err();
    assert!(e.contains("must be a float tensor") && e.contains("i32[1, 3, 5, 5]"), "{e}");
    let grouped =
        SpatialOp::Conv2d { conv: Conv2dAttrs { groups: 3, ..Conv2dAttrs::DEFAULT }, bias: false, relu: false };
    let e = sp(grouped, &[t(DType::F32, &[1, 6, 5, 5]), t(DType::F32, &[4, 2, 3, 3])]).unwrap_err();
    assert!(e.contains("4 output channels") && e.contains("3 groups"), "{e}");
    let pool = SpatialOp::MaxPool2d { pool: Pool2dAttrs { kernel: [2, 2], stride: [2, 2], pad: [2, 0, 0, 0] } };
    let e = sp(pool, &[t(DType::F32, &[1, 1, 4, 4])]).unwrap_err();
    assert!(e.contains("padding top 2 must be smaller than the window's 2"), "{e}");
    // Unknown sizes are accepted where a known one could work.
    let ok = sp(conv, &[t(DType::F32, &[-1, -1, -1, 9]), t(DType::F32, &[8, 3, 3, 3]), t(DType::F32, &[-1])]).unwrap();
    assert_eq!(ok[0].to_string(), "f32[?, 8, ?, 7]");
}

/// x -> sum(op(x) * weights) in f64, differentiated twice along the path
/// of the first gradient (`sum(grad · v)`), checked against central
/// differences of the first gradient.
fn second_derivative_matches(op: SpatialOp, x_shape: &[usize], extra: Option<Storage>) {
    let f64s = |shape: &[usize], seed: u64| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| (((i as u64 * 7919 + seed * 104729) % 1000) as f64) / 250.0 - 2.0).collect();
        Storage::from_vec(v, shape).unwrap()
    };
    let mut g = Graph::new("f");
    let x = g.add_param(TensorType::known(DType::F64, x_shape));
    let mut ins = vec![x];
    if let Some(w) = &extra {
        ins.push(g.add_param(TensorType::known(DType::F64, w.shape())));
    }
    let y = node(&mut g, Op::Spatial(op), &ins);
    let y_shape = g.value_type(y).shape().unwrap();
    let c = g.add_constant(f64s(&y_shape, 3));
    let prod = node(&mut g, Op::Binary(tracejit_ir::tensor::BinaryOp::Mul), &[y, c]);
    let axes = (0..4).collect();
    let s = node(&mut g, Op::Reduce { op: tracejit_ir::tensor::ReduceOp::Sum, axes, keepdims: false }, &[prod]);
    g.outputs = vec![s];
    let dg = grad_graph(&g, &[0]).unwrap();
    verify(&dg).unwrap();
    // The gradient with respect to x, then its own gradient along v.
    let mut h = dg.clone();
    let gx = *h.outputs.last().unwrap();
    let v = h.add_constant(f64s(x_shape, 5));
    let gv = node(&mut h, Op::Binary(tracejit_ir::tensor::BinaryOp::Mul), &[gx, v]);
    let axes = (0..4).collect();
    let gs = node(&mut h, Op::Reduce { op: tracejit_ir::tensor::ReduceOp::Sum, axes, keepdims: false }, &[gv]);
    h.outputs = vec![gs];
    let result = grad_graph(&h, &[ins.len() - 1]);
    let Some(w) = extra else {
        // A max pool's gradient depends on x only through its routing,
        // which is piecewise constant; for a loss linear in y the second
        // derivative is 0 (the rule's adjoint in dy, what forward mode
        // needs, is checked against finite differences in the API tests).
        let hh = result.unwrap();
        let got = interpret(&hh, &[f64s(x_shape, 1)]).unwrap();
        assert!(got.last().unwrap().to_vec::<f64>().unwrap().iter().all(|&g| g == 0.0), "{got:?}");
        return;
    };
    // d/dw of sum(dL/dx · v), against central differences in w.
    let hh = result.unwrap();
    let xv = f64s(x_shape, 1);
    let got = interpret(&hh, &[xv.clone(), w.clone()]).unwrap();
    let got = got.last().unwrap().to_vec::<f64>().unwrap();
    let wv = w.to_vec::<f64>().unwrap();
    for i in 0..wv.len() {
        let at = |d: f64| {
            let mut wd = wv.clone();
            wd[i] += d;
            let out = interpret(&h, &[xv.clone(), Storage::from_vec(wd, w.shape()).unwrap()]).unwrap();
            out[0].to_vec::<f64>().unwrap()[0]
        };
        let fd = (at(1e-4) - at(-1e-4)) / 2e-4;
        assert!((got[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0), "w[{i}]: {} vs {fd}", got[i]);
    }
}

#[test]
fn gradients_of_gradients_match_finite_differences() {
    let w = Storage::from_vec((0..24).map(|i| ((i * 5 % 7) as f64) / 4.0 - 0.8).collect::<Vec<f64>>(), &[6, 2, 2, 1])
        .unwrap();
    second_derivative_matches(SpatialOp::Conv2d { conv: CONV, bias: false, relu: false }, &[2, 4, 5, 4], Some(w));
    second_derivative_matches(SpatialOp::MaxPool2d { pool: POOL }, &[1, 2, 5, 4], None);
}
