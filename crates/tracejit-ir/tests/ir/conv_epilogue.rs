//! The epilogue of `conv2d_nhwc` (scale, bias, residual, relu) and the
//! `conv_epilogue` pass: on random ResNet-like graphs after
//! `channels_last`, every batch norm, residual add and relu moves into a
//! convolution and every result keeps its bits through the interpreter
//! (NaN and infinities included); the chains the pass leaves alone; the
//! text form; the gradients against central differences; and the
//! batching rule against the examples one by one.

use proptest::prelude::*;
use tracejit_ir::autodiff::grad_graph;
use tracejit_ir::batching::batch_graph;
use tracejit_ir::passes::{ChannelsLast, FuseConvEpilogue, Pass, PassContext};
use tracejit_ir::tensor::{kernels, BinaryOp, Conv2dAttrs, DType, ReduceOp, SliceSpec, SpatialOp, Storage, UnaryOp};
use tracejit_ir::{infer, interpret, verify, Graph, Op, TensorType, ValueId};

use crate::channels_last::{assert_same_bits, ops_in, special, Net};
use crate::common::{assert_round_trip, f32s, f32t, node};

fn fuse(g: &Graph) -> Graph {
    let mut out = g.clone();
    FuseConvEpilogue.run(&mut out, &PassContext::new("test"));
    verify(&out).unwrap_or_else(|e| panic!("{e}\n{out:#}"));
    out
}

fn both_passes(g: &Graph) -> Graph {
    let mut out = g.clone();
    ChannelsLast.run(&mut out, &PassContext { channels_last: true, ..PassContext::new("test") });
    fuse(&out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn batch_norms_residuals_and_relus_move_into_the_convolutions_with_the_same_bits(
        batch in 1usize..3, channels in 1usize..7, hw in 3usize..10, blocks in 1usize..3,
        project: bool, mean: bool, seed in 0u64..1000,
    ) {
        let net = Net { batch, channels, hw, blocks, project, mean, seed };
        let (g, args) = net.build();
        let opt = both_passes(&g);
        // Every batch norm follows a convolution and every residual add
        // and relu a batch norm: none is left.
        for op in ["mul", "add", "relu"] {
            prop_assert_eq!(ops_in(&opt, op), 0, "{} left:\n{:#}", op, opt);
        }
        prop_assert_eq!(ops_in(&opt, "conv2d_nhwc"), ops_in(&g, "conv2d"));
        let scaled = opt.nodes().filter(|(_, n)| matches!(n.op, Op::Spatial(SpatialOp::Conv2dNhwc { scale: true, .. }))).count();
        prop_assert_eq!(scaled, 1 + 2 * blocks, "{:#}", opt);
        let residual = opt.nodes().filter(|(_, n)| matches!(n.op, Op::Spatial(SpatialOp::Conv2dNhwc { residual: true, .. }))).count();
        prop_assert_eq!(residual, blocks);
        assert_same_bits(&interpret(&g, &args).unwrap(), &interpret(&opt, &args).unwrap());
        // Idempotent, and the text form parses back.
        prop_assert!(fuse(&opt).structural_diff(&opt).is_none());
        assert_round_trip(&opt);
    }
}

/// A channels-last convolution of `x [1, 4, 5, 3]` by 4 filters (3×3, pad 1).
fn conv_of(g: &mut Graph, x: ValueId, seed: u64) -> ValueId {
    let w = g.add_constant(f32s(&[4, 3, 3, 3], seed));
    let c = Conv2dAttrs { stride: [1, 1], dilation: [1, 1], pad: [1; 4], groups: 1 };
    node(
        g,
        Op::Spatial(SpatialOp::Conv2dNhwc { conv: c, scale: false, bias: false, residual: false, relu: false }),
        &[x, w],
    )
}

#[test]
fn chains_stop_where_a_value_is_read_twice_is_an_output_or_could_broadcast() {
    let bin = |g: &mut Graph, op, a, b| node(g, Op::Binary(op), &[a, b]);
    // Read twice: the product is also an output.
    let mut g = Graph::new("twice");
    let x = g.add_param(f32t(&[1, 4, 5, 3]));
    let s = g.add_constant(f32s(&[4], 1));
    let y = conv_of(&mut g, x, 2);
    let m = bin(&mut g, BinaryOp::Mul, y, s);
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[m]);
    g.outputs = vec![r, m];
    let opt = fuse(&g);
    assert_eq!((ops_in(&opt, "mul"), ops_in(&opt, "relu")), (0, 1), "{opt:#}");

    // A residual of an unknown batch (which `add` could broadcast).
    let mut g = Graph::new("unknown");
    let x = g.add_param(f32t(&[-1, 4, 5, 3]));
    let r = g.add_param(f32t(&[-1, 4, 5, 4]));
    let y = conv_of(&mut g, x, 3);
    let z = bin(&mut g, BinaryOp::Add, y, r);
    g.outputs = vec![z];
    assert!(fuse(&g).structural_diff(&g).is_none());

    // A scale after a bias: the bias only.
    let mut g = Graph::new("scale after bias");
    let x = g.add_param(f32t(&[1, 4, 5, 3]));
    let (s, t) = (g.add_constant(f32s(&[1, 1, 1, 4], 4)), g.add_constant(f32s(&[4], 5)));
    let y = conv_of(&mut g, x, 6);
    let a = bin(&mut g, BinaryOp::Add, y, t);
    let m = bin(&mut g, BinaryOp::Mul, a, s);
    g.outputs = vec![m];
    let opt = fuse(&g);
    assert_eq!((ops_in(&opt, "add"), ops_in(&opt, "mul")), (0, 1), "{opt:#}");

    // A per-channel add after the residual: the residual only (whichever
    // operand order the add has).
    let known = |d: &[i64]| f32t(d);
    let mut g = Graph::new("order");
    let x = g.add_param(known(&[2, 4, 5, 3]));
    let r = g.add_param(known(&[2, 4, 5, 4]));
    let y = conv_of(&mut g, x, 6);
    let a = bin(&mut g, BinaryOp::Add, r, y);
    let t = g.add_constant(f32s(&[4], 7));
    let b = bin(&mut g, BinaryOp::Add, a, t);
    g.outputs = vec![b];
    let opt = fuse(&g);
    assert_eq!(ops_in(&opt, "add"), 1, "{opt:#}");
    let fused = opt.nodes().find(|(_, n)| n.op.name() == "conv2d_nhwc").unwrap().1;
    assert!(matches!(fused.op, Op::Spatial(SpatialOp::Conv2dNhwc { residual: true, bias: false, .. })), "{opt:#}");
    let args = [special(f32s(&[2, 4, 5, 3], 8)), special(f32s(&[2, 4, 5, 4], 9))];
    assert_same_bits(&interpret(&g, &args).unwrap(), &interpret(&opt, &args).unwrap());
}

#[test]
fn the_epilogue_parses_checks_its_operands_and_refuses_bf16() {
    let c = Conv2dAttrs { stride: [1, 1], dilation: [1, 1], pad: [1; 4], groups: 1 };
    let op =
        |scale, residual| Op::Spatial(SpatialOp::Conv2dNhwc { conv: c, scale, bias: false, residual, relu: false });
    let mut g = Graph::new("e");
    let p: Vec<ValueId> =
        [&[2, 4, 5, 3][..], &[6, 3, 3, 3], &[6], &[2, 4, 5, 6]].iter().map(|d| g.add_param(f32t(d))).collect();
    let relu = Op::Spatial(SpatialOp::Conv2dNhwc { conv: c, scale: true, bias: false, residual: true, relu: true });
    let y = node(&mut g, relu, &p);
    g.outputs = vec![y];
    assert_round_trip(&g);
    let text = g.to_string();
    assert!(text.contains("scale=true, bias=false, residual=true, relu=true"), "{text}");
    let bad = text.replace("scale=true, bias=false", "bias=false, scale=true");
    assert!(Graph::parse(&bad).unwrap_err().to_string().contains("in that order"), "{bad}");
    let (x, w) = (f32t(&[2, 4, 5, 3]), f32t(&[6, 3, 3, 3]));
    let e = infer(&op(true, false), &[x.clone(), w.clone(), f32t(&[5])], None).unwrap_err();
    assert!(e.to_string().contains("the scale must be f32[6]"), "{e}");
    let e = infer(&op(false, true), &[x.clone(), w.clone(), f32t(&[2, 4, 5, 5])], None).unwrap_err();
    assert!(e.to_string().contains("the residual must be of the result's type"), "{e}");
    // A residual of an unknown batch where the result's is known could
    // broadcast it wider.
    let e = infer(&op(false, true), &[x.clone(), w.clone(), f32t(&[-1, 4, 5, 6])], None).unwrap_err();
    assert!(e.to_string().contains("the residual must be"), "{e}");
    let bf = |d: &[i64]| TensorType::known(DType::BF16, &d.iter().map(|&v| v as usize).collect::<Vec<_>>());
    let e = infer(&op(true, false), &[bf(&[2, 4, 5, 3]), bf(&[6, 3, 3, 3]), bf(&[6])], None).unwrap_err();
    assert!(e.to_string().contains("computes in f32 or f64"), "{e}");
}

/// f64 values in [-1, 1) (a fixed generator: the test is one case).
fn f64s(shape: &[usize], seed: u64) -> Storage {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    Storage::from_vec(v, shape).unwrap()
}

/// `sum(k · conv2d_nhwc[epilogue](x, w, s, b, r))` in f64 over its five
/// parameters.
fn epilogue_loss(relu: bool) -> Graph {
    let mut g = Graph::new("loss");
    let shapes: [&[usize]; 5] = [&[2, 4, 5, 3], &[4, 3, 3, 3], &[4], &[4], &[2, 4, 5, 4]];
    let p: Vec<ValueId> = shapes.iter().map(|s| g.add_param(TensorType::known(DType::F64, s))).collect();
    let c = Conv2dAttrs { stride: [1, 1], dilation: [1, 1], pad: [1; 4], groups: 1 };
    let op = SpatialOp::Conv2dNhwc { conv: c, scale: true, bias: true, residual: true, relu };
    let y = node(&mut g, Op::Spatial(op), &p);
    let k = g.add_constant(f64s(&[2, 4, 5, 4], 99));
    let yk = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, k]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1, 2, 3], keepdims: false }, &[yk]);
    g.outputs = vec![s];
    g
}

#[test]
fn epilogue_gradients_match_central_differences() {
    for relu in [false, true] {
        let g = epilogue_loss(relu);
        let args: Vec<Storage> = g
            .params
            .iter()
            .enumerate()
            .map(|(i, &p)| f64s(&g.node(p).outputs[0].shape().unwrap(), i as u64 + 1))
            .collect();
        let dg = grad_graph(&g, &[0, 1, 2, 3, 4]).unwrap();
        assert!(ops_in(&dg, "conv2d_backward_data") > 0, "{dg:#}");
        let got = interpret(&dg, &args).unwrap();
        let loss = |a: &[Storage]| interpret(&g, a).unwrap()[0].to_vec::<f64>().unwrap()[0];
        let h = 1e-6;
        for (i, arg) in args.iter().enumerate() {
            let grad = got[1 + i].to_vec::<f64>().unwrap();
            let base = arg.to_vec::<f64>().unwrap();
            for j in 0..base.len() {
                let at = |d: f64| {
                    let mut v = base.clone();
                    v[j] += d;
                    let mut a = args.clone();
                    a[i] = Storage::from_vec(v, arg.shape()).unwrap();
                    loss(&a)
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                // Central differences of a function whose terms are O(10)
                // err by ~h² · f''' + ε · |f| / h: 1e-6 is far above both.
                assert!(
                    (fd - grad[j]).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "relu {relu} param {i}[{j}]: {} vs {fd}",
                    grad[j]
                );
            }
        }
    }
}

#[test]
fn batched_epilogues_match_the_examples() {
    let g = {
        let mut g = epilogue_loss(true);
        // The convolution's result, not the loss.
        let conv = g.nodes().find(|(_, n)| n.op.name() == "conv2d_nhwc").unwrap().0;
        g.outputs = vec![ValueId::new(conv, 0)];
        g
    };
    let shapes: Vec<Vec<usize>> = g.params.iter().map(|&p| g.node(p).outputs[0].shape().unwrap()).collect();
    // x and the residual per example; the scale and bias too (the
    // epilogue as ops after the bare convolution); the scale or the bias
    // and residual alone (one bare convolution for all).
    for in_axes in [
        vec![Some(0), None, None, None, Some(0)],
        vec![Some(0), None, Some(0), Some(0), None],
        vec![None, None, Some(0), None, None],
        vec![None, None, None, Some(0), Some(0)],
    ] {
        let n = 3;
        let inputs: Vec<Storage> = shapes
            .iter()
            .zip(&in_axes)
            .enumerate()
            .map(|(i, (s, a))| {
                let mut s = s.clone();
                if a.is_some() {
                    s.insert(0, n);
                }
                f64s(&s, 10 + i as u64)
            })
            .collect();
        let batched = batch_graph(&g, &in_axes, n).unwrap();
        verify(&batched).unwrap();
        let got = interpret(&batched, &inputs).unwrap()[0].clone();
        let rows: Vec<Storage> = (0..n)
            .map(|e| {
                let args: Vec<Storage> = inputs
                    .iter()
                    .zip(&in_axes)
                    .map(|(x, a)| match a {
                        Some(_) => example(x, e),
                        None => x.clone(),
                    })
                    .collect();
                interpret(&g, &args).unwrap().remove(0)
            })
            .collect();
        let want = kernels::stack(&rows.iter().collect::<Vec<_>>(), 0);
        assert_eq!(got.shape(), want.shape());
        let (a, b) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs())), "{in_axes:?}");
    }
}

/// Example `i` of a batch stacked on axis 0.
fn example(x: &Storage, i: usize) -> Storage {
    let mut specs = vec![SliceSpec::FULL; x.rank()];
    specs[0] = SliceSpec { start: Some(i as i64), stop: Some(i as i64 + 1), step: 1 };
    kernels::reshape(&kernels::slice(x, &specs), &x.shape()[1..])
}
