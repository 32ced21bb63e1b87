//! The channels-last layout: `conv2d_nhwc` and `max_pool2d_nhwc` in the
//! text form and shape inference; the `channels_last` pass on random
//! ResNet-like graphs (every result bit for bit the NCHW graph's through
//! the interpreter, NaN and infinities included, with the convolutions
//! converted and one transpose at each end of a chain); the graphs it
//! leaves alone; and the gradient of a channels-last convolution.

use proptest::prelude::*;
use tracejit_ir::autodiff::grad_graph;
use tracejit_ir::passes::{ChannelsLast, Pass, PassContext};
use tracejit_ir::tensor::{BinaryOp, Conv2dAttrs, Pool2dAttrs, ReduceOp, SpatialOp, Storage, UnaryOp};
use tracejit_ir::{infer, interpret, verify, Graph, Op, ValueId};

use crate::common::{assert_round_trip, f32s, f32t, node};

fn conv(stride: usize, pad: usize) -> Conv2dAttrs {
    Conv2dAttrs { stride: [stride; 2], dilation: [1, 1], pad: [pad; 4], groups: 1 }
}

pub(crate) fn ops_in(g: &Graph, name: &str) -> usize {
    g.nodes().filter(|(_, n)| n.op.name() == name).count()
}

pub(crate) fn run_pass(g: &Graph) -> Graph {
    let mut out = g.clone();
    let cx = PassContext { channels_last: true, ..PassContext::new("test") };
    ChannelsLast.run(&mut out, &cx);
    verify(&out).unwrap_or_else(|e| panic!("{e}\n{out:#}"));
    out
}

/// Asserts the two result lists are equal bit for bit (any NaN equal to
/// any NaN).
pub(crate) fn assert_same_bits(want: &[Storage], got: &[Storage]) {
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.shape(), g.shape(), "output {i}");
        let (w, g) = (w.to_vec::<f32>().unwrap(), g.to_vec::<f32>().unwrap());
        for (j, (a, b)) in w.iter().zip(&g).enumerate() {
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "output {i}[{j}]: {a} vs {b}");
        }
    }
}

#[test]
fn channels_last_ops_round_trip_and_infer() {
    let mut g = Graph::new("nhwc");
    let x = g.add_param(f32t(&[-1, 9, 8, 4]));
    let w = g.add_param(f32t(&[6, 4, 3, 3]));
    let b = g.add_param(f32t(&[6]));
    let c = Conv2dAttrs { stride: [2, 1], dilation: [1, 1], pad: [1, 1, 1, 1], groups: 1 };
    let y = node(
        &mut g,
        Op::Spatial(SpatialOp::Conv2dNhwc { conv: c, scale: false, bias: true, residual: false, relu: true }),
        &[x, w, b],
    );
    let pool = Pool2dAttrs { kernel: [3, 3], stride: [2, 2], pad: [1, 1, 1, 1] };
    let m = node(&mut g, Op::Spatial(SpatialOp::MaxPool2dNhwc { pool }), &[y]);
    g.outputs = vec![y, m];
    verify(&g).unwrap();
    assert_round_trip(&g);
    let out = g.output_types();
    assert_eq!((out[0].to_string(), out[1].to_string()), ("f32[?, 5, 8, 6]".into(), "f32[?, 3, 4, 6]".into()));
    // The channels are the last axis: weights for 9 input channels do not fit.
    let bad = infer(
        &Op::Spatial(SpatialOp::Conv2dNhwc { conv: c, scale: false, bias: false, residual: false, relu: false }),
        &[f32t(&[1, 4, 8, 9]), f32t(&[6, 4, 3, 3])],
        None,
    );
    assert!(bad.is_err());
    let rank = infer(&Op::Spatial(SpatialOp::MaxPool2dNhwc { pool }), &[f32t(&[4, 8, 9])], None).unwrap_err();
    assert!(rank.to_string().contains("NHWC"), "{rank}");
}

/// A ResNet-like graph: a stem convolution, batch norm (per-channel
/// multiply-add) and relu, a max pool, `blocks` residual blocks (1×1,
/// 3×3, 1×1, the shortcut a projection when `project`), an average or a
/// mean over the map, flattened into a product.
pub(crate) struct Net {
    pub(crate) batch: usize,
    pub(crate) channels: usize,
    pub(crate) hw: usize,
    pub(crate) blocks: usize,
    pub(crate) project: bool,
    pub(crate) mean: bool,
    pub(crate) seed: u64,
}

/// Constants of a graph under construction, each from its own seed.
struct Consts(u64);

impl Consts {
    fn add(&mut self, g: &mut Graph, shape: &[usize]) -> ValueId {
        self.0 += 1;
        g.add_constant(f32s(shape, self.0))
    }

    /// Batch norm in inference (a per-channel multiply-add), then relu.
    fn bn(&mut self, g: &mut Graph, v: ValueId, ch: usize, relu: bool) -> ValueId {
        let (s, t) = (self.add(g, &[ch, 1, 1]), self.add(g, &[ch, 1, 1]));
        let v = node(g, Op::Binary(BinaryOp::Mul), &[v, s]);
        let v = node(g, Op::Binary(BinaryOp::Add), &[v, t]);
        if relu {
            node(g, Op::Unary(UnaryOp::Relu), &[v])
        } else {
            v
        }
    }

    /// A convolution of `v` (`i` channels) to `o` channels, `k`×`k`.
    fn conv(&mut self, g: &mut Graph, v: ValueId, [o, i, k]: [usize; 3], bias: bool, relu: bool) -> ValueId {
        let w = self.add(g, &[o, i, k, k]);
        let op = Op::Spatial(SpatialOp::Conv2d { conv: conv(1, k / 2), bias, relu });
        if bias {
            let b = self.add(g, &[o]);
            node(g, op, &[v, w, b])
        } else {
            node(g, op, &[v, w])
        }
    }
}

impl Net {
    pub(crate) fn build(&self) -> (Graph, Vec<Storage>) {
        let (n, c, hw) = (self.batch, self.channels, self.hw);
        let mut g = Graph::new("net");
        let x = g.add_param(f32t(&[n as i64, 3, hw as i64, hw as i64]));
        let args = vec![special(f32s(&[n, 3, hw, hw], self.seed))];
        let mut k = Consts(self.seed);
        let mut v = k.conv(&mut g, x, [c, 3, 3], false, false);
        v = k.bn(&mut g, v, c, true);
        let pool = Pool2dAttrs { kernel: [3, 3], stride: [2, 2], pad: [1, 1, 1, 1] };
        v = node(&mut g, Op::Spatial(SpatialOp::MaxPool2d { pool }), &[v]);
        let mut ch = c;
        for i in 0..self.blocks {
            let (mid, out) = (ch.max(2) / 2, ch * 2);
            let mut y = k.conv(&mut g, v, [mid, ch, 1], false, false);
            y = k.bn(&mut g, y, mid, true);
            y = k.conv(&mut g, y, [mid, mid, 3], true, i % 2 == 0);
            y = k.conv(&mut g, y, [out, mid, 1], false, false);
            y = k.bn(&mut g, y, out, false);
            let short = if self.project || ch != out { k.conv(&mut g, v, [out, ch, 1], false, false) } else { v };
            y = node(&mut g, Op::Binary(BinaryOp::Add), &[y, short]);
            v = node(&mut g, Op::Unary(UnaryOp::Relu), &[y]);
            ch = out;
        }
        let side = (hw - 1) / 2 + 1;
        let pooled = if self.mean {
            node(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![2, 3], keepdims: true }, &[v])
        } else {
            let all = Pool2dAttrs { kernel: [side, side], stride: [1, 1], pad: [0; 4] };
            node(&mut g, Op::Spatial(SpatialOp::AvgPool2d { pool: all }), &[v])
        };
        let flat = node(&mut g, Op::Reshape { shape: vec![n as i64, -1] }, &[pooled]);
        let fc = k.add(&mut g, &[ch, 5]);
        let logits = node(&mut g, Op::MatMul, &[flat, fc]);
        g.outputs = vec![logits, v];
        (g, args)
    }
}

/// Some NaN and infinities among the values.
pub(crate) fn special(s: Storage) -> Storage {
    let mut v = s.to_vec::<f32>().unwrap();
    let len = v.len();
    for (k, x) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY].into_iter().enumerate() {
        v[(k * 7919 + 13) % len] = x;
    }
    Storage::from_vec(v, s.shape()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_pass_keeps_chains_channels_last_with_the_same_bits(
        batch in 1usize..3, channels in 1usize..7, hw in 3usize..10, blocks in 0usize..3,
        project: bool, mean: bool, seed in 0u64..1000,
    ) {
        let net = Net { batch, channels, hw, blocks, project, mean, seed };
        let (g, args) = net.build();
        let opt = run_pass(&g);
        let convs = ops_in(&g, "conv2d");
        // A stem and its pool alone stay NCHW: one convolution.
        let last = convs >= 2;
        prop_assert_eq!(ops_in(&opt, "conv2d_nhwc"), if last { convs } else { 0 }, "{:#}", opt);
        prop_assert_eq!(ops_in(&opt, "conv2d"), if last { 0 } else { convs });
        prop_assert_eq!(ops_in(&opt, "max_pool2d_nhwc"), usize::from(last));
        // One transpose in (the image), one out (before the pool or the
        // flatten, and the graph's second output), and the per-channel
        // constants moved as reshapes.
        prop_assert!(ops_in(&opt, "transpose") <= 3, "{:#}", opt);
        let want = interpret(&g, &args).unwrap();
        let got = interpret(&opt, &args).unwrap();
        assert_same_bits(&want, &got);
        // Idempotent.
        let again = run_pass(&opt);
        prop_assert!(again.structural_diff(&opt).is_none());
        assert_round_trip(&opt);
    }
}

#[test]
fn lone_convolutions_training_graphs_and_the_default_stay_nchw() {
    // One convolution and its pool (W11's layer): two transposes would buy
    // little.
    let mut g = Graph::new("lone");
    let x = g.add_param(f32t(&[2, 3, 6, 6]));
    let w = g.add_constant(f32s(&[4, 3, 3, 3], 1));
    let y = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv: conv(1, 1), bias: false, relu: true }), &[x, w]);
    let pool = Pool2dAttrs { kernel: [2, 2], stride: [2, 2], pad: [0; 4] };
    let p = node(&mut g, Op::Spatial(SpatialOp::MaxPool2d { pool }), &[y]);
    g.outputs = vec![p];
    assert!(run_pass(&g).structural_diff(&g).is_none());

    // A training step: the network's gradient reads its activations NCHW.
    let (net, _) = Net { batch: 1, channels: 2, hw: 5, blocks: 1, project: false, mean: true, seed: 3 }.build();
    let mut loss = net.clone();
    let s = node(&mut loss, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdims: false }, &[net.outputs[0]]);
    loss.outputs = vec![s];
    let grads = grad_graph(&loss, &[0]).unwrap();
    assert!(ops_in(&grads, "conv2d_backward_data") > 0);
    assert!(run_pass(&grads).structural_diff(&grads).is_none());

    // Without the context's flag the pass does nothing.
    let mut same = net.clone();
    ChannelsLast.run(&mut same, &PassContext::new("off"));
    assert!(same.structural_diff(&net).is_none());
}

/// A channels-last convolution's and pool's gradients are the NCHW ones,
/// transposed.
#[test]
fn channels_last_gradients_match_the_nchw_ones() {
    let (net, args) = Net { batch: 2, channels: 3, hw: 6, blocks: 1, project: true, mean: false, seed: 9 }.build();
    let sum = |g: &Graph| {
        let mut g = g.clone();
        let out = g.outputs[0];
        let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdims: false }, &[out]);
        g.outputs = vec![s];
        g
    };
    let ordinary: Vec<f32> =
        args[0].to_vec::<f32>().unwrap().iter().map(|v| if v.is_finite() { *v } else { 0.5 }).collect();
    let args = vec![Storage::from_vec(ordinary, args[0].shape()).unwrap()];
    let want = grad_graph(&sum(&net), &[0]).unwrap();
    let got = grad_graph(&sum(&run_pass(&net)), &[0]).unwrap();
    assert!(ops_in(&got, "conv2d_backward_data") > 0);
    let (want, got) = (interpret(&want, &args).unwrap(), interpret(&got, &args).unwrap());
    assert_same_bits(&want, &got);
}

/// A convolution whose weights are computed from a channels-last value
/// (dynamic weights) reads them NCHW, and a graph with a transposed
/// convolution (`conv2d_backward_data` alone, no filter gradient) is
/// still converted.
#[test]
fn dynamic_weights_stay_nchw_and_transposed_convolutions_do_not_block() {
    let mut g = Graph::new("dynamic");
    let x = g.add_param(f32t(&[1, 4, 3, 3]));
    let x2 = g.add_param(f32t(&[2, 4, 5, 5]));
    let w0 = g.add_constant(f32s(&[4, 4, 1, 1], 1));
    let w1 = g.add_constant(f32s(&[4, 4, 3, 3], 2));
    let y = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv: conv(1, 0), bias: false, relu: false }), &[x, w0]);
    let z = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv: conv(1, 1), bias: false, relu: false }), &[y, w1]);
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[z]);
    // r [1, 4, 3, 3] as the weights of one output channel over 4 inputs.
    let q = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv: conv(1, 1), bias: false, relu: false }), &[x2, r]);
    let up = node(&mut g, Op::Spatial(SpatialOp::Conv2dBackwardData { conv: conv(1, 1), input_hw: [3, 3] }), &[z, w1]);
    g.outputs = vec![q, up];
    let opt = run_pass(&g);
    assert_eq!(ops_in(&opt, "conv2d_nhwc"), 3, "{opt:#}");
    let args = vec![special(f32s(&[1, 4, 3, 3], 3)), f32s(&[2, 4, 5, 5], 4)];
    assert_same_bits(&interpret(&g, &args).unwrap(), &interpret(&opt, &args).unwrap());
}
