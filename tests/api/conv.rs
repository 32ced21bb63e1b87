//! Convolutional layers (`nn::conv2d`, `max_pool2d`, `avg_pool2d`):
//! ONNX's documented examples, the compiled direct kernels against the
//! reference loops (eager) on random geometries with odd sizes, strides,
//! dilations, groups, depthwise and "same" padding, functions traced
//! with an unknown batch, the profile naming the native kernels, and the
//! errors a bad shape gives.

use proptest::prelude::*;
use tracejit::nn::{avg_pool2d, conv2d, max_pool2d, Conv2dOptions};
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Deterministic values in [-1, 1) with no two equal in a small window
/// (pool ties are tested on purpose elsewhere).
fn data(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, seed)
}

/// `got` within `tol · (1 + |want|)` of `want` everywhere, same length.
fn assert_near(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w}");
    }
}

#[test]
fn onnx_examples() {
    // ONNX Conv: a 5x5 ramp, 3x3 ones, padding 1 / none / stride 2.
    let x = Tensor::from_vec((0..25).map(|i| i as f32).collect(), &[1, 1, 5, 5]);
    let w = Tensor::ones(&[1, 1, 3, 3], DType::F32);
    let y = conv2d(&x, &w, None, Conv2dOptions::default());
    assert_eq!(vals(&y), [54., 63., 72., 99., 108., 117., 144., 153., 162.]);
    // conv_with_strides_padding: pads 1, strides 2.
    let x7 = Tensor::from_vec((0..35).map(|i| i as f32).collect(), &[1, 1, 7, 5]);
    let y = conv2d(&x7, &w, None, Conv2dOptions::default().stride(2).padding(1));
    assert_eq!(vals(&y), [12., 27., 24., 63., 108., 81., 123., 198., 141., 112., 177., 124.]);
    // conv_with_strides_and_asymmetric_padding: pads [1, 0, 1, 0].
    let y = conv2d(&x7, &w, None, Conv2dOptions::default().stride(2).pads([1, 0, 1, 0]));
    assert_eq!(vals(&y), [21., 33., 99., 117., 189., 207., 171., 183.]);
    // MaxPool 2d_pads: 5x5 ramp, 5x5 window, pads 2: the corner sees 0..=12.
    let y = max_pool2d(&x, [5, 5], [1, 1], [2, 2]);
    assert_eq!(vals(&y)[..3], [12., 13., 14.]);
    // AveragePool 2d_pads (count_include_pad = 0): 5x5 window, pads 2.
    let y = avg_pool2d(&x, [5, 5], [1, 1], [2, 2]);
    assert_eq!(vals(&y)[..3], [6., 6.5, 7.]);
}

#[test]
fn same_padding_keeps_the_size_at_stride_1_and_ceils_at_stride_2() {
    let x = data(&[2, 3, 7, 6], 1);
    let w = data(&[4, 3, 3, 2], 2);
    let y = conv2d(&x, &w, None, Conv2dOptions::default().padding_same());
    assert_eq!(y.shape(), [2, 4, 7, 6]);
    let y = conv2d(&x, &w, None, Conv2dOptions::default().padding_same().stride(2));
    assert_eq!(y.shape(), [2, 4, 4, 3]);
    // SAME_LOWER differs from SAME_UPPER only by where the odd pad goes:
    // a 2-wide kernel at stride 1 pads one column, left or right.
    let upper = conv2d(&x, &w, None, Conv2dOptions::default().padding_same());
    let lower = conv2d(&x, &w, None, Conv2dOptions::default().padding_same_lower());
    let explicit_upper = conv2d(&x, &w, None, Conv2dOptions::default().pads([1, 0, 1, 1]));
    let explicit_lower = conv2d(&x, &w, None, Conv2dOptions::default().pads([1, 1, 1, 0]));
    assert_eq!(vals(&upper), vals(&explicit_upper));
    assert_eq!(vals(&lower), vals(&explicit_lower));
}

/// One random convolution problem.
#[derive(Debug, Clone)]
struct ConvCase {
    batch: usize,
    groups: usize,
    icg: usize,
    ocg: usize,
    hw: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pads: [usize; 4],
    bias: bool,
    seed: u64,
}

impl ConvCase {
    fn options(&self) -> Conv2dOptions {
        Conv2dOptions::default().stride(self.stride).dilation(self.dilation).pads(self.pads).groups(self.groups)
    }

    /// The padded input holds the dilated kernel.
    fn fits(&self) -> bool {
        (0..2).all(|a| self.hw[a] + self.pads[a] + self.pads[a + 2] > (self.kernel[a] - 1) * self.dilation[a])
    }
}

fn conv_case() -> impl Strategy<Value = ConvCase> {
    let sizes = prop_oneof![Just(0usize), Just(1), Just(3), Just(5)];
    (
        sizes.clone(),
        prop_oneof![Just(1usize), Just(2), Just(3)],
        1usize..4,
        1usize..4,
        (1usize..8, 1usize..8),
        (1usize..4, 1usize..4),
        (1usize..4, 1usize..4),
        (1usize..3, 1usize..3),
        (0usize..3, 0usize..3, 0usize..3, 0usize..3),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(batch, groups, icg, ocg, hw, k, s, d, p, bias, seed)| ConvCase {
            batch,
            groups,
            icg,
            ocg,
            hw: [hw.0, hw.1],
            kernel: [k.0, k.1],
            stride: [s.0, s.1],
            dilation: [d.0, d.1],
            pads: [p.0, p.1, p.2, p.3],
            bias,
            seed: seed % 1000,
        })
        .prop_filter("the kernel fits the padded input", ConvCase::fits)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The direct kernels (forward, both gradients), compiled and in eager
    /// mode, agree with the reference loops (the interpreter), on any
    /// geometry.
    #[test]
    fn compiled_conv_and_gradients_match_the_reference(c in conv_case()) {
        let (cin, cout) = (c.icg * c.groups, c.ocg * c.groups);
        let x = data(&[c.batch, cin, c.hw[0], c.hw[1]], c.seed);
        let w = data(&[cout, c.icg, c.kernel[0], c.kernel[1]], c.seed + 1);
        let b = data(&[cout], c.seed + 2);
        let opts = c.options();
        let bias = c.bias;
        let step = move |(x, w, b): (Tensor, Tensor, Tensor)| {
            let tape = GradientTape::new();
            tape.watch(&x);
            tape.watch(&w);
            tape.watch(&b);
            let y = conv2d(&x, &w, bias.then_some(&b), opts);
            // A cotangent that differs per element.
            let loss = (&y * &y.sin()).sum_all();
            let g = tape.gradient(&loss, &[&x, &w, &b]).unwrap();
            let gb = g[2].clone().unwrap_or_else(|| Tensor::zeros(&[b.shape()[0]], DType::F32));
            (y, g[0].clone().unwrap(), g[1].clone().unwrap(), gb)
        };
        let reference = function(step).jit(false).call((x.clone(), w.clone(), b.clone())).unwrap();
        let eager = step((x.clone(), w.clone(), b.clone()));
        let compiled = function(step).call((x, w, b)).unwrap();
        let terms = (c.icg * c.kernel[0] * c.kernel[1]).max(c.batch * 64) as f32;
        let tol = 4.0 * terms * f32::EPSILON;
        for (how, got) in [("compiled", &compiled), ("eager", &eager)] {
            assert_near(&format!("{how} y"), &vals(&got.0), &vals(&reference.0), tol);
            assert_near(&format!("{how} dx"), &vals(&got.1), &vals(&reference.1), tol);
            assert_near(&format!("{how} dw"), &vals(&got.2), &vals(&reference.2), tol);
            assert_near(&format!("{how} db"), &vals(&got.3), &vals(&reference.3), tol);
        }
    }

    /// Pools, forward and backward, compiled and eager against the
    /// reference loops (the interpreter).
    #[test]
    fn compiled_pools_match_the_reference(
        batch in prop_oneof![Just(0usize), Just(1), Just(3)],
        channels in 1usize..4,
        hw in (1usize..9, 1usize..9),
        k in (1usize..4, 1usize..4),
        s in (1usize..4, 1usize..4),
        p in (0usize..3, 0usize..3),
        seed in 0u64..1000,
    ) {
        let (kernel, stride) = ([k.0, k.1], [s.0, s.1]);
        let pad = [p.0.min(k.0 - 1), p.1.min(k.1 - 1)];
        prop_assume!(hw.0 + 2 * pad[0] >= k.0 && hw.1 + 2 * pad[1] >= k.1);
        let x = data(&[batch, channels, hw.0, hw.1], seed);
        let step = move |x: Tensor| {
            let tape = GradientTape::persistent();
            tape.watch(&x);
            let m = max_pool2d(&x, kernel, stride, pad);
            let a = avg_pool2d(&x, kernel, stride, pad);
            let dm = tape.gradient(&(&m * &m.cos()).sum_all(), &[&x]).unwrap().remove(0).unwrap();
            let da = tape.gradient(&(&a * &a.cos()).sum_all(), &[&x]).unwrap().remove(0).unwrap();
            (m, a, dm, da)
        };
        let reference = function(step).jit(false).call(x.clone()).unwrap();
        let eager = step(x.clone());
        let compiled = function(step).call(x).unwrap();
        let tol = 8.0 * f32::EPSILON * (k.0 * k.1) as f32;
        for (how, got) in [("compiled", &compiled), ("eager", &eager)] {
            assert_eq!(vals(&got.0), vals(&reference.0), "{how} max");
            assert_near(&format!("{how} avg"), &vals(&got.1), &vals(&reference.1), tol);
            assert_near(&format!("{how} max grad"), &vals(&got.2), &vals(&reference.2), tol);
            assert_near(&format!("{how} avg grad"), &vals(&got.3), &vals(&reference.3), tol);
        }
    }
}

/// Eager convolutions run the direct kernels a compiled step runs (the
/// same bits as the compiled convolution), not the reference loops: on a
/// CPU with the vector kernels their fused multiply-adds round some of
/// the 3,168 sums of 576 products differently from the loops' (within the
/// `k·ε·Σ|products|` bound both keep).
#[test]
fn eager_convolutions_run_the_direct_kernels() {
    let (x, w) = (data(&[2, 64, 9, 11], 41), data(&[16, 64, 3, 3], 42));
    let opts = Conv2dOptions::default().padding(1);
    let conv = move |(x, w): (Tensor, Tensor)| conv2d(&x, &w, None, opts);
    let eager = vals(&conv((x.clone(), w.clone())));
    let f = function(conv);
    let compiled = vals(&f.call((x.clone(), w.clone())).unwrap());
    assert_eq!(f.concrete_functions()[0].executor_kind(), "jit", "the compiled side ran the JIT");
    let reference = vals(&function(conv).jit(false).call((x, w)).unwrap());
    assert_eq!(eager, compiled, "eager and compiled take the same kernel");
    assert_near("eager", &eager, &reference, 4.0 * 576.0 * f32::EPSILON);
    if tracejit::Target::current().isa.width().is_some() {
        assert!(eager.iter().zip(&reference).any(|(a, b)| a != b), "eager ran the reference loops");
    }
}

#[test]
fn depthwise_conv_is_one_filter_per_channel() {
    // groups == in_channels: each output channel sees only its own input
    // channel, so a per-channel delta kernel scaled by c returns c · x.
    let x = data(&[2, 3, 4, 4], 3);
    let mut wv = vec![0.0f32; 3 * 9];
    for c in 0..3 {
        wv[c * 9 + 4] = (c + 1) as f32;
    }
    let w = Tensor::from_vec(wv, &[3, 1, 3, 3]);
    let f = function(|(x, w): (Tensor, Tensor)| conv2d(&x, &w, None, Conv2dOptions::default().padding(1).groups(3)));
    let y = f.call((x.clone(), w.clone())).unwrap();
    let xv = vals(&x);
    for (i, (yv, xv)) in vals(&y).iter().zip(&xv).enumerate() {
        let c = (i / 16) % 3;
        assert_eq!(*yv, xv * (c + 1) as f32, "element {i}");
    }
}

#[test]
fn max_pool_gradient_goes_to_the_first_maximum() {
    // Two equal maxima in each window: PyTorch and ONNX route to the first
    // in row-major order, eagerly and compiled.
    let x = Tensor::from_vec(vec![1.0f32, 4.0, 4.0, 2.0, 4.0, 0.0, 4.0, 4.0], &[1, 2, 2, 2]);
    let step = |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = max_pool2d(&x, [2, 2], [2, 2], [0, 0]);
        tape.gradient(&y.sum_all(), &[&x]).unwrap().remove(0).unwrap()
    };
    let want = [0.0f32, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
    assert_eq!(vals(&step(x.clone())), want);
    assert_eq!(vals(&function(step).call(x).unwrap()), want);
}

#[test]
fn an_unknown_batch_traces_once_and_runs_any_batch() {
    let w = data(&[8, 3, 3, 3], 4);
    let b = data(&[8], 5);
    let f = function(move |x: Tensor| {
        let y = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1).stride(2)).relu();
        avg_pool2d(&max_pool2d(&y, [2, 2], [2, 2], [0, 0]), [2, 2], [1, 1], [1, 1])
    })
    .input_signature(vec![TensorSpec::new(DType::F32, &[-1, 3, 9, 9])]);
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 3, 9, 9])).unwrap();
    let out = cf.graph().value_type(cf.graph().outputs[0]).clone();
    assert_eq!(out.dims.as_slice(), [None, Some(8), Some(3), Some(3)], "{}", cf.graph());
    for batch in [0, 1, 3] {
        let x = data(&[batch, 3, 9, 9], 6 + batch as u64);
        let got = f.call(x.clone()).unwrap();
        assert_eq!(got.shape(), [batch, 8, 3, 3]);
        let eager = {
            let w = data(&[8, 3, 3, 3], 4);
            let b = data(&[8], 5);
            let y = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1).stride(2)).relu();
            avg_pool2d(&max_pool2d(&y, [2, 2], [2, 2], [0, 0]), [2, 2], [1, 1], [1, 1])
        };
        assert_near("batch", &vals(&got), &vals(&eager), 1e-5);
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn the_profile_shows_native_conv_and_pool_steps() {
    let w = data(&[16, 8, 3, 3], 7);
    let b = data(&[16], 8);
    let f = function(move |x: Tensor| {
        let y = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(1)).relu();
        max_pool2d(&y, [2, 2], [2, 2], [0, 0])
    });
    let x = data(&[2, 8, 12, 12], 9);
    f.call(x.clone()).unwrap();
    let cf = &f.concrete_functions()[0];
    let profile = cf.profile(std::slice::from_ref(&x), 1).unwrap().expect("the JIT runs the step");
    let native: Vec<&str> = profile.steps.iter().filter(|s| s.kind == "native").map(|s| s.what.as_str()).collect();
    // The relu runs in the convolution's output pass (the `conv_relu` pass).
    assert!(native.iter().any(|w| w.contains("conv2d+bias+relu")), "{profile}");
    assert!(native.iter().any(|w| w.contains("max_pool2d")), "{profile}");
    assert!(!profile.steps.iter().any(|s| s.kind == "reference"), "{profile}");
}

#[test]
fn bad_shapes_name_the_op_what_was_expected_and_the_line() {
    let x = data(&[2, 4, 8, 8], 10);
    let w = data(&[8, 3, 3, 3], 11);
    let err = tracejit::ir::catch_quietly(|| conv2d(&x, &w, None, Conv2dOptions::default())).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("conv2d") && msg.contains("expect 3 input channels") && msg.contains("got 4"), "{msg}");
    // Traced: the error comes back from `call`, naming the user's line.
    let line = line!() + 1;
    let f = function(move |(x, w): (Tensor, Tensor)| conv2d(&x, &w, None, Conv2dOptions::default().padding(1)));
    let err = f.call((data(&[1, 3, 2, 2], 1), data(&[4, 3, 5, 5], 2))).unwrap_err().to_string();
    assert!(err.contains("conv2d") && err.contains("does not fit"), "{err}");
    assert!(err.contains(&format!("conv.rs:{line}")), "{err}");
    // A pool's padding must be below its window.
    let err = tracejit::ir::catch_quietly(|| max_pool2d(&x, [2, 2], [2, 2], [2, 0])).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("max_pool2d") && msg.contains("must be smaller than the window"), "{msg}");
}

#[test]
fn a_training_step_fuses_the_relu_into_the_convolution() {
    // The relu's gradient reads `conv > 0`, which the fused output answers
    // alike, so the fusion holds in training too; the result is the
    // unfused eager step's.
    let step = |(x, w, b): (Tensor, Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&w);
        tape.watch(&b);
        let y = conv2d(&x, &w, Some(&b), Conv2dOptions::default().padding(2)).relu();
        let loss = (&y * &y.cos()).sum_all();
        let g = tape.gradient(&loss, &[&w, &b]).unwrap();
        (y, g[0].clone().unwrap(), g[1].clone().unwrap())
    };
    let (x, w, b) = (data(&[3, 2, 9, 9], 12), data(&[4, 2, 5, 5], 13), data(&[4], 14));
    let f = function(step);
    let got = f.call((x.clone(), w.clone(), b.clone())).unwrap();
    let want = step((x, w, b));
    assert_near("y", &vals(&got.0), &vals(&want.0), 1e-5);
    assert_near("dw", &vals(&got.1), &vals(&want.1), 1e-4);
    assert_near("db", &vals(&got.2), &vals(&want.2), 1e-4);
    let graph = f.concrete_functions()[0].optimized_graph().clone();
    use tracejit::ir::{tensor::SpatialOp, tensor::UnaryOp, Op};
    let fused = graph.nodes().any(|(_, n)| matches!(n.op, Op::Spatial(SpatialOp::Conv2d { relu: true, .. })));
    fn relus(g: &tracejit::ir::Graph) -> usize {
        g.nodes()
            .map(|(_, n)| {
                usize::from(matches!(n.op, Op::Unary(UnaryOp::Relu)))
                    + n.op.subgraphs().iter().map(|s| relus(s)).sum::<usize>()
            })
            .sum()
    }
    assert!(fused && relus(&graph) == 0, "{graph}");
}

/// `got` (bf16 results, as f64) against `exact` (f64 on the same bf16
/// inputs): the f32 computation of a sum of `terms` products is within
/// `terms · 2⁻²⁴ · scale` (`scale`: the same sum of absolute values), and
/// the rounding to bf16 adds at most 2⁻⁹ relative; twice both.
fn assert_bf16_near(what: &str, got: &Tensor, exact: &Tensor, scale: &Tensor, terms: usize) {
    assert_eq!(got.dtype(), DType::BF16, "{what}: the result's dtype");
    let f64s = |t: &Tensor| t.cast(DType::F64).to_vec::<f64>().unwrap();
    let (g, e, s) = (f64s(got), f64s(exact), f64s(scale));
    assert_eq!(g.len(), e.len(), "{what}: lengths");
    for i in 0..g.len() {
        let tol = 2.0 * (e[i].abs() * 2f64.powi(-9) + terms as f64 * 2f64.powi(-24) * s[i]);
        assert!((g[i] - e[i]).abs() <= tol, "{what}: element {i}: {} vs {} (tolerance {tol})", g[i], e[i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// bf16 convolutions and pools (the issue: a panic) compute in f32 and
    /// round, eagerly and compiled, forward and input gradient.
    #[test]
    fn bf16_conv_and_pools_compute_in_f32_and_round(c in conv_case()) {
        let (cin, cout) = (c.icg * c.groups, c.ocg * c.groups);
        let bf = |t: Tensor| t.cast(DType::BF16);
        let x = bf(data(&[c.batch, cin, c.hw[0], c.hw[1]], c.seed));
        let w = bf(data(&[cout, c.icg, c.kernel[0], c.kernel[1]], c.seed + 1));
        let b = bf(data(&[cout], c.seed + 2));
        let (opts, bias) = (c.options(), c.bias);
        let (k, kp) = (c.kernel, [c.kernel[0].min(3), c.kernel[1].min(3)]);
        let pad = [c.pads[0].min(kp[0] - 1), c.pads[1].min(kp[1] - 1)];
        let pools_fit = c.hw[0] + 2 * pad[0] >= kp[0] && c.hw[1] + 2 * pad[1] >= kp[1];
        let step = move |(x, w, b): (Tensor, Tensor, Tensor)| {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = conv2d(&x, &w, bias.then_some(&b), opts);
            let dx = tape.gradient(&y.sum_all(), &[&x]).unwrap().remove(0).unwrap();
            let (m, a) = if pools_fit {
                (max_pool2d(&x, kp, c.stride, pad), avg_pool2d(&x, kp, c.stride, pad))
            } else {
                (x.clone(), x.clone())
            };
            (y, dx, m, a)
        };
        let f64_step = |x: &Tensor, w: &Tensor, b: &Tensor| {
            let w64 = w.cast(DType::F64);
            step((x.cast(DType::F64), w64, b.cast(DType::F64)))
        };
        let exact = f64_step(&x, &w, &b);
        let scale = f64_step(&x.abs(), &w.abs(), &b.abs());
        let terms = c.icg * k[0] * k[1] + 1;
        let back_terms = c.ocg * k[0] * k[1];
        let eager = step((x.clone(), w.clone(), b.clone()));
        let compiled = function(step).call((x, w, b)).unwrap();
        for (how, r) in [("eager", &eager), ("compiled", &compiled)] {
            assert_bf16_near(&format!("{how} conv2d"), &r.0, &exact.0, &scale.0, terms);
            assert_bf16_near(&format!("{how} conv2d dx"), &r.1, &exact.1, &scale.1, back_terms);
            // The maximum of bf16 values is one of them: exact.
            prop_assert_eq!(r.2.cast(DType::F64).to_vec::<f64>().unwrap(), exact.2.to_vec::<f64>().unwrap());
            assert_bf16_near(&format!("{how} avg_pool2d"), &r.3, &exact.3, &scale.3, kp[0] * kp[1]);
        }
    }
}

/// A compiled convolution by a variable's value packs its filter when the
/// weights come back to a second call and keeps it (the profile says so),
/// gives the reference's values within the f32 bound on every call, the
/// same bits from the kept filter, and follows the variable when it is
/// assigned: a stale packing would give the old weights' outputs.
#[test]
fn a_kept_filter_follows_its_variable() {
    // ResNet's 7×7 stage in small: the channel-lane kernel at 16 and 8 lanes.
    let opts = Conv2dOptions::default().padding(1);
    let w = Variable::new(data(&[64, 32, 3, 3], 21));
    let b = data(&[64], 22);
    let step = {
        let (w, b) = (w.clone(), b.clone());
        move |x: Tensor| conv2d(&x, &w.read(), Some(&b), opts).relu()
    };
    let f = function(step.clone());
    let reference = function(step).jit(false);
    let x = data(&[1, 32, 7, 7], 23);
    // |error| <= 2 · taps · ε · Σ|terms|, and Σ|terms| <= taps + 1 here
    // (values in [-1, 1)).
    let taps = 32.0 * 9.0;
    let tol = 2.0 * taps * f32::EPSILON * (taps + 1.0);
    let kept = |f: &Function<Tensor, Tensor>| {
        let profile = f.concrete_functions()[0].profile(std::slice::from_ref(&x), 1).unwrap().expect("the JIT ran");
        profile.steps.iter().any(|s| s.what.contains("conv2d+bias+relu (channel lanes, filter kept)"))
    };
    let want = vals(&reference.call(x.clone()).unwrap());
    // First sight of the weights: not packed yet.
    assert_near("first call", &vals(&f.call(x.clone()).unwrap()), &want, tol);
    let packed = vals(&f.call(x.clone()).unwrap());
    assert_near("second call", &packed, &want, tol);
    assert!(kept(&f), "the second call packed the filter");
    let again = vals(&f.call(x.clone()).unwrap());
    assert!(packed.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "the kept filter gives the same bits");
    w.assign(&data(&[64, 32, 3, 3], 24));
    let want = vals(&reference.call(x.clone()).unwrap());
    for call in 0..3 {
        let after = vals(&f.call(x.clone()).unwrap());
        assert_near(&format!("call {call} after the assignment"), &after, &want, tol);
        assert!(packed.iter().zip(&after).any(|(a, b)| (a - b).abs() > 0.1), "the new weights changed the outputs");
    }
    assert!(kept(&f), "the new weights are packed and kept");
}

/// A ResNet-like inference chain (convolution, batch norm as a per-channel
/// multiply-add, relu, max pool, a bottleneck with a projected shortcut,
/// a mean over the map): compiled, it runs channels last where the CPU has
/// vector code (the optimized graph holds no NCHW convolution), and agrees
/// with the reference loops; a training step of the same network stays
/// NCHW.
#[test]
fn inference_chains_run_channels_last() {
    let mut rng_seed = 40;
    let mut param = |shape: &[usize]| {
        rng_seed += 1;
        data(shape, rng_seed)
    };
    let (w1, s1, t1) = (param(&[8, 3, 3, 3]), param(&[8, 1, 1]), param(&[8, 1, 1]));
    let (w2, w3, b3, wp) = (param(&[4, 8, 1, 1]), param(&[16, 4, 3, 3]), param(&[16]), param(&[16, 8, 1, 1]));
    let net = move |x: &Tensor| {
        let y = (&(&conv2d(x, &w1, None, Conv2dOptions::default().padding(1)) * &s1) + &t1).relu();
        let y = max_pool2d(&y, [3, 3], [2, 2], [1, 1]);
        let z = conv2d(&y, &w2, None, Conv2dOptions::default()).relu();
        let z = conv2d(&z, &w3, Some(&b3), Conv2dOptions::default().padding(1));
        let z = (&z + &conv2d(&y, &wp, None, Conv2dOptions::default())).relu();
        z.mean(&[2, 3], true).reshape(&[-1, 16])
    };
    let infer = {
        let net = net.clone();
        move |x: Tensor| net(&x)
    };
    let f = function(infer.clone());
    let reference = function(infer).jit(false);
    for (batch, hw) in [(1, 9), (3, 8)] {
        let x = data(&[batch, 3, hw, hw], 50 + hw as u64);
        // Each output sums 16 · 9 products of values below 4 in size, over
        // three layers: a bound of 2 · taps · ε · Σ|terms| per layer.
        let tol = 2.0 * 144.0 * f32::EPSILON * 4096.0;
        assert_near(
            &format!("batch {batch}"),
            &vals(&f.call(x.clone()).unwrap()),
            &vals(&reference.call(x).unwrap()),
            tol,
        );
    }
    let cf = &f.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "the JIT runs the function: {:?}", cf.jit_error());
    let listing = cf.optimized_graph().to_string();
    if tracejit::Target::current().isa.width().is_some() {
        assert!(listing.contains("conv2d_nhwc") && !listing.contains("conv2d["), "{listing}");
        assert!(listing.contains("max_pool2d_nhwc"), "{listing}");
        // The batch norm and relu move into the first convolution, the
        // residual add and relu into the main branch's last.
        assert!(listing.contains("scale=true, bias=true, relu=true"), "{listing}");
        assert!(listing.contains("bias=true, residual=true, relu=true"), "{listing}");
    } else {
        assert!(!listing.contains("conv2d_nhwc"), "{listing}");
    }
    // A training step differentiates the network: its graph stays NCHW.
    let train = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let loss = net(&x).sum_all();
        tape.gradient(&loss, &[&x]).unwrap()[0].clone().unwrap()
    });
    train.call(data(&[2, 3, 8, 8], 60)).unwrap();
    let listing = train.concrete_functions()[0].optimized_graph().to_string();
    assert!(listing.contains("conv2d_backward_data") && !listing.contains("nhwc"), "{listing}");
}

/// A block's last convolution writes its output over the shortcut when
/// the shortcut dies there (the profile names the step in place of its
/// residual), and not when the shortcut is read again afterwards; both
/// agree with the reference loops.
#[test]
fn a_dying_shortcut_is_written_over() {
    let (w1, w2, w3) = (data(&[8, 8, 3, 3], 70), data(&[8, 8, 1, 1], 71), data(&[8, 8, 1, 1], 72));
    let (s, t) = (data(&[8, 1, 1], 73), data(&[8, 1, 1], 74));
    let block = move |x: &Tensor| {
        let a = conv2d(x, &w1, None, Conv2dOptions::default().padding(1)).relu();
        let b = conv2d(&a, &w2, None, Conv2dOptions::default()).relu();
        let y = (&(&(&conv2d(&b, &w3, None, Conv2dOptions::default()) * &s) + &t) + &a).relu();
        (a, y)
    };
    let dies = {
        let block = block.clone();
        move |x: Tensor| block(&x).1.mean(&[2, 3], false)
    };
    let kept = move |x: Tensor| {
        let (a, y) = block(&x);
        &y.mean(&[2, 3], false) + &a.mean(&[2, 3], false)
    };
    // Per layer |error| <= 2 · taps · ε · Σ|terms|; the last layer's terms
    // sum to at most 8 · 8 · 72 (72 taps of values in [-1, 1) first).
    let tol = 2.0 * 72.0 * f32::EPSILON * 4608.0;
    let x = data(&[2, 8, 6, 5], 75);
    let vector = tracejit::Target::current().isa.width().is_some();
    let cases = [
        ("dies", function(dies.clone()), function(dies).jit(false), vector),
        ("read again", function(kept.clone()), function(kept).jit(false), false),
    ];
    for (name, f, reference, in_place) in cases {
        let want = vals(&reference.call(x.clone()).unwrap());
        for call in 0..2 {
            assert_near(&format!("{name}, call {call}"), &vals(&f.call(x.clone()).unwrap()), &want, tol);
        }
        let cf = &f.concrete_functions()[0];
        let profile = cf.profile(std::slice::from_ref(&x), 1).unwrap().expect("the JIT ran");
        let over =
            profile.steps.iter().any(|s| s.what.contains("residual+relu") && s.what.contains("(in place of input"));
        assert_eq!(over, in_place, "{name}: {:#?}", profile.steps.iter().map(|s| &s.what).collect::<Vec<_>>());
    }
}

/// Pools at the head of a channels-last chain (a global average as
/// ResNet's, a padded 2x2 average and a strided max, each taking the
/// NCHW view of the convolution's channels-last output) agree with the
/// reference loops, at odd sizes and with NaN and infinities in the input.
#[test]
fn pools_of_channels_last_outputs_agree_with_the_reference() {
    let (w, s, t) = (data(&[19, 3, 3, 3], 80), data(&[19, 1, 1], 81), data(&[19, 1, 1], 82));
    let w2 = data(&[19, 19, 1, 1], 85);
    let head = move |x: Tensor| {
        let y = (&(&conv2d(&x, &w, None, Conv2dOptions::default().padding(1)) * &s) + &t).relu();
        let y = conv2d(&y, &w2, None, Conv2dOptions::default()).relu();
        let global = avg_pool2d(&y, [5, 7], [1, 1], [0, 0]).reshape(&[-1]);
        let local = avg_pool2d(&y, [2, 2], [1, 1], [1, 1]).reshape(&[-1]);
        let max = max_pool2d(&y, [3, 2], [2, 1], [1, 0]).reshape(&[-1]);
        Tensor::concat(&[&global, &local, &max], 0)
    };
    let f = function(head.clone());
    let reference = function(head).jit(false);
    // Each pooled value is a mean or max of the second convolution's
    // outputs: per layer |error| <= 2 · taps · ε · Σ|terms|, the first's
    // terms summing to at most 27 (27 products of values below 1), the
    // second's to 19 · 28.
    let tol = 2.0 * 27.0 * f32::EPSILON * 19.0 * 28.0;
    for (batch, seed) in [(1, 83), (3, 84)] {
        let mut x = vals(&data(&[batch, 3, 5, 7], seed));
        x[4] = f32::NAN;
        x[11] = f32::INFINITY;
        let x = Tensor::from_vec(x, &[batch, 3, 5, 7]);
        let (got, want) = (vals(&f.call(x.clone()).unwrap()), vals(&reference.call(x).unwrap()));
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.is_nan(), r.is_nan(), "batch {batch}, value {i}: {g} vs {r}");
            assert!(g.is_nan() || g.is_finite() == r.is_finite() && (g.is_finite() || g == r), "value {i}: {g} vs {r}");
        }
        let finite = |v: &[f32]| v.iter().map(|x| if x.is_finite() { *x } else { 0.0 }).collect::<Vec<_>>();
        assert_near(&format!("batch {batch}"), &finite(&got), &finite(&want), tol);
    }
    let cf = &f.concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "the JIT runs the function: {:?}", cf.jit_error());
    let listing = cf.optimized_graph().to_string();
    if tracejit::Target::current().isa.width().is_some() {
        assert!(listing.contains("conv2d_nhwc") && listing.contains("avg_pool2d"), "{listing}");
    }
}
