//! Attention written out as nodes (`MatMul(Q, Kᵀ)`, `Div` or `Mul` by a
//! scalar, `Add` of a mask, `Softmax`, `MatMul` with `V`, as PyTorch
//! exports BERT-style models) runs as the flash-attention kernel: checked
//! against an f64 evaluation of the nodes, with every spelling of the
//! scale (divided, multiplied on either side, none; a constant node or a
//! float initializer, which is a Variable), the mask on either side of the
//! Add or absent, padding values of -10000 and -inf, opsets 11 and 17; the
//! compiled graph holds the kernel. Chains whose intermediate values are
//! read elsewhere, or whose Softmax flattens from axis 1 (opset 11's
//! default), run as written.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    Div,
    MulRight,
    MulLeft,
    None,
}

#[derive(Clone, Debug)]
struct Case {
    dims: [usize; 6],
    scale: Scale,
    /// The scale as an initializer (a Variable) instead of a Constant node.
    scale_initializer: bool,
    /// `None`: no mask; `Some(true)`: `Add(mask, scores)`.
    mask_first: Option<bool>,
    opset: i64,
    /// Also a graph output: the Softmax's result.
    probabilities_out: bool,
    seed: u64,
}

impl Case {
    /// Whether the importer should run the kernel.
    fn fused(&self) -> bool {
        !self.probabilities_out
    }
}

/// The nodes' formula in f64: `[B, H, Tq, dv]`, and the probabilities.
fn reference(c: &Case, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, factor: f64) -> (Vec<f64>, Vec<f64>) {
    let [b, h, tq, tk, d, dv] = c.dims;
    let f = |t: &Tensor| t.cast(DType::F64).to_vec::<f64>().unwrap();
    let (q, k, v, m) = (f(q), f(k), f(v), f(mask));
    let (mut out, mut mag) = (vec![0.0; b * h * tq * dv], vec![0.0; b * h * tq * dv]);
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..tq {
                let s: Vec<f64> = (0..tk)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|c| q[((bi * h + hi) * tq + i) * d + c] * k[((bi * h + hi) * tk + j) * d + c])
                            .sum();
                        dot * factor + if c.mask_first.is_some() { m[bi * tk + j] } else { 0.0 }
                    })
                    .collect();
                let top = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - top).exp()).sum();
                for w in 0..dv {
                    let at = ((bi * h + hi) * tq + i) * dv + w;
                    for (j, x) in s.iter().enumerate() {
                        let term = (x - top).exp() / z * v[((bi * h + hi) * tk + j) * dv + w];
                        out[at] += term;
                        mag[at] += term.abs();
                    }
                }
            }
        }
    }
    (out, mag)
}

/// The model and its inputs `(Q, K, V, mask)`.
fn build(c: &Case) -> (Vec<u8>, Vec<Tensor>, f64) {
    let [b, h, tq, tk, d, dv] = c.dims;
    let q = Tensor::randn(&[b, h, tq, d], c.seed);
    let k = Tensor::randn(&[b, h, tk, d], c.seed + 1);
    let v = Tensor::randn(&[b, h, tk, dv], c.seed + 2);
    // Key 0 always 0, so every query has a finite score; -10000 and -inf
    // as exporters write padding.
    let m: Vec<f32> = (0..b * tk)
        .map(|n| match (n % tk, (n * 7 + c.seed as usize) % 5) {
            (0, _) => 0.0,
            (_, 0) => -10_000.0,
            (_, 1) => f32::NEG_INFINITY,
            (_, r) => r as f32 * 0.5 - 1.0,
        })
        .collect();
    let mask = Tensor::from_vec(m, &[b, 1, 1, tk]);
    let c_value = (d as f32).sqrt();
    let mut nodes = vec![node("Transpose", "kt", &["K"], &["kt"], vec![attr_ints("perm", &[0, 1, 3, 2])])];
    nodes.push(node("MatMul", "qk", &["Q", "kt"], &["s"], vec![]));
    let mut inits = Vec::new();
    let constant = Tensor::from_vec(vec![if c.scale == Scale::Div { c_value } else { 1.0 / c_value }], &[]);
    if c.scale_initializer {
        inits.push(init("c", &constant));
    } else {
        let value = tracejit_onnx::pb::AttributeProto {
            name: Some("value".into()),
            r#type: Some(tracejit_onnx::pb::attribute_proto::AttributeType::Tensor as i32),
            t: Some(init("c", &constant)),
            ..Default::default()
        };
        nodes.push(node("Constant", "c", &[], &["c"], vec![value]));
    }
    let (scaled, factor) = match c.scale {
        Scale::Div => (Some(["s", "c"]), 1.0 / f64::from(c_value)),
        Scale::MulRight => (Some(["s", "c"]), f64::from(1.0 / c_value)),
        Scale::MulLeft => (Some(["c", "s"]), f64::from(1.0 / c_value)),
        Scale::None => (None, 1.0),
    };
    let op = if c.scale == Scale::Div { "Div" } else { "Mul" };
    // Without a scale, the Softmax reads the product itself.
    let scores = match scaled {
        Some(ins) => {
            nodes.push(node(op, "scale", &ins, &["ss"], vec![]));
            "ss"
        }
        None => "s",
    };
    let logits = match c.mask_first {
        Some(first) => {
            let ins = if first { ["M", scores] } else { [scores, "M"] };
            nodes.push(node("Add", "mask", &ins, &["a"], vec![]));
            "a"
        }
        None => scores,
    };
    let axis = if c.opset < 13 { 3 } else { -1 };
    nodes.push(node("Softmax", "softmax", &[logits], &["p"], vec![attr_i("axis", axis)]));
    nodes.push(node("MatMul", "pv", &["p", "V"], &["Y"], vec![]));
    let mut inputs = vec![
        fixed("Q", DType::F32, &[b, h, tq, d]),
        fixed("K", DType::F32, &[b, h, tk, d]),
        fixed("V", DType::F32, &[b, h, tk, dv]),
    ];
    let mut feeds = vec![q, k, v];
    if c.mask_first.is_some() {
        inputs.push(fixed("M", DType::F32, &[b, 1, 1, tk]));
        feeds.push(mask);
    }
    let mut outputs = vec![fixed("Y", DType::F32, &[b, h, tq, dv])];
    if c.probabilities_out {
        outputs.push(fixed("p", DType::F32, &[b, h, tq, tk]));
    }
    (model(nodes, inputs, outputs, inits, c.opset), feeds, factor)
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let (bytes, feeds, factor) = build(c);
    let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let outs = model.run(&feeds).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let graph = cf.optimized_graph().to_string();
    let kernel = graph.contains("kernel[\"tracejit.nn.scaled_dot_product_attention\"]");
    prop_assert_eq!(kernel, c.fused(), "{:?}\n{}", c, graph);
    if kernel {
        prop_assert!(!graph.contains("tracejit.nn.softmax"), "the scores are still computed:\n{}", graph);
    }
    let zero = Tensor::zeros(&[c.dims[0], 1, 1, c.dims[3]], DType::F32);
    let mask = feeds.get(3).unwrap_or(&zero);
    let (want, mag) = reference(c, &feeds[0], &feeds[1], &feeds[2], mask, factor);
    let got = outs[0].to_vec::<f32>().unwrap();
    prop_assert_eq!(got.len(), want.len());
    for (n, ((&g, &w), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
        // f32 scores (products of d terms, the scale, the mask) and sums
        // over the keys: within 1e-5 of the terms' magnitudes.
        prop_assert!((f64::from(g) - w).abs() <= 1e-5 * (m + 1.0), "Y[{}] of {:?}: {} vs {}", n, c, g, w);
    }
    Ok(())
}

fn case() -> impl Strategy<Value = Case> {
    let dims = (1usize..3, 1usize..3, 1usize..20, prop::sample::select(vec![1usize, 7, 70]), 1usize..9, 1usize..9);
    let scale = prop::sample::select(vec![Scale::Div, Scale::MulRight, Scale::MulLeft, Scale::None]);
    let options = (any::<bool>(), prop::option::of(any::<bool>()), prop::sample::select(vec![11i64, 17]));
    (dims, scale, options, prop::bool::weighted(0.2), 0u64..10_000).prop_map(
        |((b, h, tq, tk, d, dv), scale, (scale_initializer, mask_first, opset), probabilities_out, seed)| Case {
            dims: [b, h, tq, tk, d, dv],
            scale,
            scale_initializer,
            mask_first,
            opset,
            probabilities_out,
            seed,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn written_out_attention_runs_the_kernel_and_matches_the_nodes(c in case()) {
        run_case(&c)?;
    }
}

/// Opset 11's Softmax without an axis flattens from axis 1, which is not
/// attention's: the nodes run as written, and their result is that softmax.
#[test]
fn a_softmax_over_flattened_axes_is_left_alone() {
    let c = Case {
        dims: [1, 2, 3, 4, 2, 2],
        scale: Scale::Div,
        scale_initializer: false,
        mask_first: None,
        opset: 11,
        probabilities_out: false,
        seed: 3,
    };
    let (bytes, feeds, _) = build(&c);
    let mut proto = <tracejit_onnx::pb::ModelProto as prost::Message>::decode(&bytes[..]).unwrap();
    let graph = proto.graph.as_mut().unwrap();
    let softmax = graph.node.iter_mut().find(|n| n.op_type() == "Softmax").unwrap();
    softmax.attribute.clear();
    let model = import_bytes(&prost::Message::encode_to_vec(&proto)).unwrap();
    let y = model.run(&feeds).unwrap().remove(0).to_vec::<f32>().unwrap();
    let cf = &model.function().concrete_functions()[0];
    assert!(!cf.optimized_graph().to_string().contains("scaled_dot_product_attention"));
    // Softmax over each batch row's 2 · 3 · 4 scores together.
    let c = Tensor::from_vec(vec![2f32.sqrt()], &[]);
    let s = (&feeds[0].matmul(&feeds[1].transpose(&[0, 1, 3, 2])) / &c).reshape(&[1, 24]);
    let p = tracejit_nn::softmax(&s, -1).reshape(&[1, 2, 3, 4]);
    let want = p.matmul(&feeds[2]).to_vec::<f32>().unwrap();
    assert!(y.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{y:?} vs {want:?}");
}

/// `MatMul(Q, Kᵀ)`, `Mul` by `c`, `Add` of `M` (when given), `Softmax`
/// over `axis`, `MatMul` with `V`, at opset `opset`, on the given inputs.
fn chain(feeds: &[Tensor], c: &Tensor, opset: i64, axis: i64) -> Vec<u8> {
    let names = ["Q", "KT", "V", "M"];
    let mut nodes =
        vec![node("MatMul", "qk", &["Q", "KT"], &["s"], vec![]), node("Mul", "scale", &["s", "c"], &["ss"], vec![])];
    let logits = if feeds.len() == 4 {
        nodes.push(node("Add", "mask", &["ss", "M"], &["a"], vec![]));
        "a"
    } else {
        "ss"
    };
    nodes.push(node("Softmax", "softmax", &[logits], &["p"], vec![attr_i("axis", axis)]));
    nodes.push(node("MatMul", "pv", &["p", "V"], &["Y"], vec![]));
    let inputs = feeds.iter().zip(names).map(|(t, n)| fixed(n, DType::F32, t.shape())).collect();
    model(nodes, inputs, vec![value("Y", elem(DType::F32), &[])], vec![init("c", c)], opset)
}

/// The nodes' formula evaluated eagerly in f64 (softmax over the last axis).
fn eager_chain(feeds: &[Tensor], c: &Tensor) -> Tensor {
    let f = |t: &Tensor| t.cast(DType::F64);
    let mut s = f(&feeds[0]).matmul(&f(&feeds[1])) * f(c);
    if feeds.len() == 4 {
        s = s + f(&feeds[3]);
    }
    tracejit_nn::softmax(&s, -1).matmul(&f(&feeds[2]))
}

/// Imports and runs `bytes`: the output, and whether the kernel ran.
fn run(bytes: &[u8], feeds: &[Tensor]) -> (Tensor, bool) {
    let model = import_bytes(bytes).unwrap();
    let y = model.run(feeds).unwrap().remove(0);
    let cf = &model.function().concrete_functions()[0];
    assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    (y, cf.optimized_graph().to_string().contains("scaled_dot_product_attention"))
}

fn assert_close(got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.cast(DType::F64).to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
    for (n, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "element {n}: {a} vs {b}");
    }
}

/// Rank-3 operands with a per-pair mask, K and V broadcast over the batch
/// with a `[1]` scale, and rank-2 Q and Kᵀ against a batched V: the kernel
/// runs, with the nodes' values.
#[test]
fn other_ranks_masks_and_broadcasts_run_the_kernel() {
    let third = Tensor::from_vec(vec![1.0f32 / 3.0], &[1]);
    let cases: [(Vec<Tensor>, Tensor); 3] = [
        (
            vec![
                Tensor::randn(&[2, 5, 4], 1),
                Tensor::randn(&[2, 4, 6], 2),
                Tensor::randn(&[2, 6, 3], 3),
                Tensor::randn(&[5, 6], 4),
            ],
            Tensor::from_vec(vec![0.5f32], &[]),
        ),
        (
            vec![
                Tensor::randn(&[2, 3, 5, 4], 5),
                Tensor::randn(&[1, 3, 4, 70], 6),
                Tensor::randn(&[1, 3, 70, 3], 7),
                Tensor::randn(&[2, 1, 1, 70], 8),
            ],
            third,
        ),
        (
            vec![Tensor::randn(&[5, 4], 9), Tensor::randn(&[4, 6], 10), Tensor::randn(&[2, 6, 3], 11)],
            Tensor::from_vec(vec![0.7f32], &[]),
        ),
    ];
    for (feeds, c) in &cases {
        let (y, fused) = run(&chain(feeds, c, 17, -1), feeds);
        assert!(fused, "{:?}", feeds.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>());
        assert_close(&y, &eager_chain(feeds, c));
    }
}

/// Chains the kernel would change run as written: a scale with more axes
/// than the scores (it widens the result), and opset 11's Softmax along an
/// axis past the scores' last (Q and Kᵀ of rank 2, V batched: a softmax
/// over single elements, so every weight is 1).
#[test]
fn chains_the_kernel_would_change_run_as_written() {
    let feeds = vec![Tensor::randn(&[2, 5, 4], 1), Tensor::randn(&[2, 4, 6], 2), Tensor::randn(&[2, 6, 3], 3)];
    let wide = Tensor::from_vec(vec![0.5f32], &[1, 1, 1, 1]);
    let (y, fused) = run(&chain(&feeds, &wide, 17, -1), &feeds);
    assert!(!fused);
    assert_eq!(y.shape(), &[1, 2, 5, 3]);
    assert_close(&y.reshape(&[2, 5, 3]), &eager_chain(&feeds, &Tensor::from_vec(vec![0.5f32], &[])));

    let feeds = vec![Tensor::randn(&[3, 2], 4), Tensor::randn(&[2, 4], 5), Tensor::randn(&[2, 4, 3], 6)];
    let (y, fused) = run(&chain(&feeds, &Tensor::from_vec(vec![1.0f32], &[]), 11, 2), &feeds);
    assert!(!fused);
    let sums = feeds[2].cast(DType::F64).sum(&[1], true).broadcast_to(&[2, 3, 3]);
    assert_close(&y, &sums);
}
