//! `FlexAttention` (domain `ai.onnx.preview`) against f64 loops: plain
//! (the flash kernel), with a `score_mod` subgraph (a softcap: Div, Tanh,
//! Mul) and a `prob_mod` subgraph (squared probabilities), grouped-query
//! heads, an explicit or default scale, NaN and infinities in the query.
//! Bounds as in `attention.rs`: a score's error is (d + 4)·ε of its
//! magnitudes, the softmax turns an absolute error δ into a relative 2δ
//! plus its own roundings, squaring doubles that. Also the import-time
//! refusals of what a subgraph or the domain's version cannot give.

use proptest::prelude::*;
use tracejit_onnx::pb::{attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, OperatorSetIdProto};
use tracejit_onnx::{import_bytes, Error};
use tracejit_trace::{DType, Tensor};

use super::builder::*;

const EPS: f64 = f32::EPSILON as f64;

fn graph_attr(
    name: &str,
    nodes: Vec<tracejit_onnx::pb::NodeProto>,
    init: Vec<tracejit_onnx::pb::TensorProto>,
) -> AttributeProto {
    let io = |n: &str| value(n, elem(DType::F32), &[None, None, None, None]);
    AttributeProto {
        name: Some(name.into()),
        g: Some(GraphProto {
            name: Some(name.into()),
            node: nodes,
            input: vec![io("x")],
            output: vec![io("y")],
            initializer: init,
            ..GraphProto::default()
        }),
        r#type: Some(AttributeType::Graph as i32),
        ..Default::default()
    }
}

/// `c · tanh(x / c)`.
fn softcap(c: f32) -> AttributeProto {
    graph_attr(
        "score_mod",
        vec![
            node("Div", "d", &["x", "c"], &["t"], vec![]),
            node("Tanh", "h", &["t"], &["u"], vec![]),
            node("Mul", "m", &["u", "c"], &["y"], vec![]),
        ],
        vec![init("c", &Tensor::scalar(c))],
    )
}

/// `x · x`.
fn square() -> AttributeProto {
    graph_attr("prob_mod", vec![node("Mul", "sq", &["x", "x"], &["y"], vec![])], vec![])
}

fn flex_model(shapes: [[usize; 4]; 3], attrs: Vec<AttributeProto>, preview_version: i64) -> ModelProto {
    let mut p = model_proto(
        vec![node("FlexAttention", "flex", &["q", "k", "v"], &["y"], attrs)],
        vec![
            fixed("q", DType::F32, &shapes[0]),
            fixed("k", DType::F32, &shapes[1]),
            fixed("v", DType::F32, &shapes[2]),
        ],
        vec![value("y", elem(DType::F32), &[None, None, None, None])],
        vec![],
        26,
    );
    p.graph.as_mut().unwrap().node[0].domain = Some("ai.onnx.preview".into());
    p.opset_import.push(OperatorSetIdProto { domain: Some("ai.onnx.preview".into()), version: Some(preview_version) });
    p
}

fn encode(p: &ModelProto) -> Vec<u8> {
    use prost::Message;
    p.encode_to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn flex_attention_matches_f64(b in 1usize..3, kvh in 1usize..3, group in 1usize..3, l in 1usize..5, s in 1usize..6,
                                  d in prop::sample::select(vec![1usize, 4, 8]), dv in 1usize..5, cap in any::<bool>(),
                                  sq in any::<bool>(), scale in prop::option::of(Just(0.2f32)), specials: bool, seed in 0u64..10_000) {
        let qh = kvh * group;
        let shapes = [[b, qh, l, d], [b, kvh, s, d], [b, kvh, s, dv]];
        let mut attrs = vec![];
        attrs.extend(cap.then(|| softcap(2.0)));
        attrs.extend(sq.then(square));
        attrs.extend(scale.map(|v| attr_f("scale", v)));
        let model = import_bytes(&encode(&flex_model(shapes, attrs, 1))).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (q, k, v) = (floats(&shapes[0], seed, specials), floats(&shapes[1], seed + 1, false), floats(&shapes[2], seed + 2, false));
        let y = model.run(&[q.clone(), k.clone(), v.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?.remove(0);
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let kernel = cf.optimized_graph().to_string().contains("kernel[\"tracejit.nn.scaled_dot_product_attention\"]");
        prop_assert_eq!(kernel, !cap && !sq, "the flash kernel runs exactly when no modifier is given");
        prop_assert_eq!(y.shape(), &[b, qh, l, dv]);
        let (q, k, v, y) = (q.to_vec::<f32>().unwrap(), k.to_vec::<f32>().unwrap(), v.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let sc = scale.map_or(1.0 / (d as f64).sqrt(), |x| x as f64);
        for (bi, h, i) in (0..b).flat_map(|bi| (0..qh).flat_map(move |h| (0..l).map(move |i| (bi, h, i)))) {
            let kv = h / group;
            let mut x = Vec::with_capacity(s);
            let mut err = 0.0f64;
            for j in 0..s {
                let terms: Vec<f64> = (0..d).map(|t| q[((bi * qh + h) * l + i) * d + t] as f64 * k[((bi * kvh + kv) * s + j) * d + t] as f64).collect();
                let mut z = sc * terms.iter().sum::<f64>();
                let mut e = (d + 4) as f64 * EPS * sc * terms.iter().map(|t| t.abs()).sum::<f64>();
                if cap {
                    z = 2.0 * (z / 2.0).tanh();
                    e += 4.0 * EPS * z.abs();
                }
                err = err.max(if e.is_finite() { e } else { 0.0 });
                x.push(z);
            }
            let m = x.iter().fold(f64::NEG_INFINITY, |m, &z| if m.is_nan() || z.is_nan() { f64::NAN } else { m.max(z) });
            let ex: Vec<f64> = x.iter().map(|z| (z - m).exp()).collect();
            let sum: f64 = ex.iter().sum();
            let mut p: Vec<(f64, f64)> = x.iter().zip(&ex).map(|(z, e)| (e / sum, 2.0 * err + EPS * ((z - m).abs() + s as f64 + 8.0))).collect();
            if sq {
                p.iter_mut().for_each(|(pj, rel)| { *pj *= *pj; *rel = 2.0 * *rel + 2.0 * EPS; });
            }
            for w in 0..dv {
                let val = |j: usize| v[((bi * kvh + kv) * s + j) * dv + w] as f64;
                let want: f64 = (0..s).map(|j| p[j].0 * val(j)).sum();
                let bound: f64 = 2.0 * (0..s).map(|j| (p[j].1 + (s + 2) as f64 * EPS) * p[j].0 * val(j).abs()).sum::<f64>() + 1e-30;
                let got = y[((bi * qh + h) * l + i) * dv + w] as f64;
                let ok = if want.is_nan() { got.is_nan() } else { (got - want).abs() <= bound };
                prop_assert!(ok, "y[{bi},{h},{i},{w}] = {got}, want {want} (bound {bound})");
            }
        }
    }
}

#[test]
fn what_a_subgraph_or_the_domain_version_lacks_is_refused_at_import() {
    let shapes = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]];
    let mut bad = softcap(2.0);
    bad.g.as_mut().unwrap().node[1].op_type = Some("Bernoulli".into());
    for (p, parts) in [
        (flex_model(shapes, vec![bad], 1), vec!["'score_mod'", "Bernoulli", "random ops cannot match"]),
        (flex_model(shapes, vec![], 2), vec!["version 1"]),
    ] {
        let e = import_bytes(&encode(&p)).unwrap_err();
        assert!(matches!(e, Error::UnsupportedOp { .. }), "{e:?}");
        let m = e.to_string();
        for part in ["FlexAttention", "'flex'", "ai.onnx.preview"].iter().chain(&parts) {
            assert!(m.contains(part), "{m} should name {part}");
        }
    }
    // A prob_mod that changes the shape is a node error at run.
    let mut reduce = graph_attr(
        "prob_mod",
        vec![node("ReduceSum", "r", &["x", "ax"], &["y"], vec![])],
        vec![init("ax", &Tensor::from_vec(vec![-1i64], &[1]))],
    );
    reduce.name = Some("prob_mod".into());
    let model = import_bytes(&encode(&flex_model(shapes, vec![reduce], 1))).unwrap();
    let x = Tensor::ones(&[1, 2, 3, 4], DType::F32);
    let m = model.run(&[x.clone(), x.clone(), x]).unwrap_err().to_string();
    assert!(m.contains("'flex'") && m.contains("prob_mod") && m.contains("must keep both"), "{m}");
}
