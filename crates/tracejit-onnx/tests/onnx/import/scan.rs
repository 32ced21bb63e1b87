//! `Scan` against a loop: a body carrying a state (`s + x_t · w`, with `w`
//! read from the enclosing graph: a capture of a graph input) and writing
//! a scan output (`2 · s`), on rank-3 scan inputs and outputs whose scan
//! axis is any of the three, in either direction, NaN and infinities
//! included. The state is a t-term running sum of products: at most
//! 2(t + 1) roundings of the magnitudes summed so far. Each run asserts that the JIT ran one
//! `while` loop (not an unrolled body).

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_onnx::pb::{attribute_proto::AttributeType, AttributeProto, GraphProto};
use tracejit_trace::{DType, Tensor};

use super::builder::*;

/// `dims` with `len` inserted at `axis`.
fn with_axis(dims: [usize; 2], axis: usize, len: usize) -> Vec<usize> {
    let mut v = dims.to_vec();
    v.insert(axis, len);
    v
}

/// The flat index of slice element `(a, b)` at step `t` of a tensor whose
/// scan axis is `axis`.
fn flat(dims: [usize; 2], axis: usize, len: usize, t: usize, (a, b): (usize, usize)) -> usize {
    let mut idx = vec![a, b];
    idx.insert(axis, t);
    let shape = with_axis(dims, axis, len);
    idx.iter().zip(&shape).fold(0, |f, (&i, &d)| f * d + i)
}

fn body(dims: [usize; 2]) -> AttributeProto {
    let c = &dims[..];
    AttributeProto {
        name: Some("body".into()),
        g: Some(GraphProto {
            name: Some("body".into()),
            node: vec![
                node("Mul", "xw", &["x_t", "w"], &["p"], vec![]),
                node("Add", "acc", &["s", "p"], &["s_out"], vec![]),
                node("Mul", "twice", &["s_out", "two"], &["y_t"], vec![]),
            ],
            input: vec![fixed("s", DType::F32, c), fixed("x_t", DType::F32, c)],
            output: vec![fixed("s_out", DType::F32, c), fixed("y_t", DType::F32, c)],
            initializer: vec![init("two", &Tensor::scalar(2.0f32))],
            ..GraphProto::default()
        }),
        r#type: Some(AttributeType::Graph as i32),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn scan_matches_a_loop(len in 1usize..7, c in 1usize..4, e in 1usize..3, in_axis in 0usize..3, out_axis in 0usize..3,
                           rev_in: bool, rev_out: bool, specials: bool, seed in 0u64..10_000) {
        let dims = [c, e];
        let x_shape = with_axis(dims, in_axis, len);
        let y_shape = with_axis(dims, out_axis, len);
        let attrs = vec![
            body(dims),
            attr_i("num_scan_inputs", 1),
            attr_ints("scan_input_axes", &[in_axis as i64]),
            attr_ints("scan_input_directions", &[rev_in as i64]),
            attr_ints("scan_output_axes", &[out_axis as i64 - 3]),
            attr_ints("scan_output_directions", &[rev_out as i64]),
        ];
        let bytes = model(
            vec![node("Scan", "scan", &["s0", "x"], &["s_final", "ys"], attrs)],
            vec![fixed("s0", DType::F32, &dims), fixed("x", DType::F32, &x_shape), fixed("w", DType::F32, &dims)],
            vec![fixed("s_final", DType::F32, &dims), fixed("ys", DType::F32, &y_shape)],
            vec![],
            16,
        );
        let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (s0, x, w) = (floats(&dims, seed, false), floats(&x_shape, seed + 1, specials), floats(&dims, seed + 2, false));
        let outs = model.run(&[s0.clone(), x.clone(), w.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let graph = cf.optimized_graph().to_string();
        prop_assert!(graph.contains("while"), "one while loop expected:\n{}", graph);
        prop_assert_eq!(outs[1].shape(), &y_shape[..]);
        let (s0, x, w) = (s0.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        let (sf, ys) = (outs[0].to_vec::<f32>().unwrap(), outs[1].to_vec::<f32>().unwrap());
        let eps = f32::EPSILON as f64;
        for ch in 0..c * e {
            let el = (ch / e, ch % e);
            let (mut s, mut mag) = (s0[ch] as f64, (s0[ch] as f64).abs());
            for step in 0..len {
                let t = if rev_in { len - 1 - step } else { step };
                let xv = x[flat(dims, in_axis, len, t, el)] as f64;
                s += xv * w[ch] as f64;
                mag += (xv * w[ch] as f64).abs();
                let bound = 2.0 * (step + 1) as f64 * eps * mag;
                let o = if rev_out { len - 1 - step } else { step };
                let got = ys[flat(dims, out_axis, len, o, el)] as f64;
                let ok = if s.is_nan() { got.is_nan() } else if s.is_infinite() { got == 2.0 * s } else { (got - 2.0 * s).abs() <= 2.0 * bound };
                prop_assert!(ok, "ys step {step} element {el:?}: {got}, want {}", 2.0 * s);
                if step == len - 1 {
                    let got = sf[ch] as f64;
                    let ok = if s.is_nan() { got.is_nan() } else if s.is_infinite() { got == s } else { (got - s).abs() <= bound };
                    prop_assert!(ok, "final state element {el:?}: {got}, want {s}");
                }
            }
        }
    }
}

#[test]
fn a_body_the_importer_cannot_map_is_refused_at_import_and_a_mismatched_one_at_run() {
    let scan = |b: AttributeProto, opset: i64| {
        model(
            vec![node("Scan", "scan", &["s0", "x"], &["s_final", "ys"], vec![b, attr_i("num_scan_inputs", 1)])],
            vec![fixed("s0", DType::F32, &[2, 1]), fixed("x", DType::F32, &[3, 2, 1]), fixed("w", DType::F32, &[2, 1])],
            vec![fixed("s_final", DType::F32, &[2, 1]), fixed("ys", DType::F32, &[3, 2, 1])],
            vec![],
            opset,
        )
    };
    let mut random = body([2, 1]);
    random.g.as_mut().unwrap().node[0].op_type = Some("Bernoulli".into());
    let e = import_bytes(&scan(random, 16)).unwrap_err().to_string();
    assert!(
        e.contains("Scan") && e.contains("'scan'") && e.contains("'body'") && e.contains("random ops cannot match"),
        "{e}"
    );
    let e = import_bytes(&scan(body([2, 1]), 8)).unwrap_err().to_string();
    assert!(e.contains("Scan") && e.contains("opset 8") && e.contains("before opset 9"), "{e}");
    // A body whose state changes shape: a node error at run, naming it.
    let mut widen = body([2, 1]);
    widen.g.as_mut().unwrap().node[1] = node("Concat", "acc", &["s", "p"], &["s_out"], vec![attr_i("axis", 0)]);
    let model = import_bytes(&scan(widen, 16)).unwrap();
    let x = Tensor::ones(&[3, 2, 1], DType::F32);
    let e =
        model.run(&[Tensor::ones(&[2, 1], DType::F32), x, Tensor::ones(&[2, 1], DType::F32)]).unwrap_err().to_string();
    assert!(e.contains("'scan'") && e.contains("turns a state"), "{e}");
}
