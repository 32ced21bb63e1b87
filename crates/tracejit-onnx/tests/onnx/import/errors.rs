//! The importer's errors: what is refused at import names the op type,
//! node, domain and opset; a malformed file is an error, never a panic; at
//! `run` an input contradicting the declaration names the input, and a
//! node that cannot be mapped for the given shapes names the node, with
//! the model still usable afterwards.

use tracejit_onnx::pb::{tensor_proto::DataType, OperatorSetIdProto};
use tracejit_onnx::{import_bytes, Error};
use tracejit_trace::{DType, Tensor};

use super::builder::*;

fn relu_model(opset: i64) -> tracejit_onnx::pb::ModelProto {
    model_proto(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value("x", elem(DType::F32), &[None, Some(3)])],
        vec![value("y", elem(DType::F32), &[None, Some(3)])],
        vec![],
        opset,
    )
}

fn import_proto(p: &tracejit_onnx::pb::ModelProto) -> Result<tracejit_onnx::Model, Error> {
    use prost::Message;
    import_bytes(&p.encode_to_vec())
}

#[test]
fn an_unknown_op_is_refused_at_import_naming_it() {
    let mut p = relu_model(17);
    let g = p.graph.as_mut().unwrap();
    g.node[0].op_type = Some("FrobnicateV2".into());
    g.node[0].name = Some("the_node".into());
    let e = import_proto(&p).unwrap_err();
    assert!(matches!(e, Error::UnsupportedOp { .. }), "{e:?}");
    let m = e.to_string();
    for part in ["FrobnicateV2", "the_node", "ai.onnx", "opset 17"] {
        assert!(m.contains(part), "{m} should name {part}");
    }
}

#[test]
fn another_domain_an_unknown_attribute_and_a_known_but_refused_op_are_refused() {
    let mut p = relu_model(17);
    p.graph.as_mut().unwrap().node[0].domain = Some("com.example".into());
    p.opset_import.push(OperatorSetIdProto { domain: Some("com.example".into()), version: Some(1) });
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("com.example") && m.contains("Relu"), "{m}");

    let mut p = relu_model(17);
    p.graph.as_mut().unwrap().node[0].attribute.push(attr_i("mystery", 1));
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("attribute 'mystery'"), "{m}");

    let mut p = relu_model(17);
    // An op the importer knows and refuses, with the reason.
    p.graph.as_mut().unwrap().node[0].op_type = Some("RandomNormalLike".into());
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("RandomNormalLike") && m.contains("random ops cannot match a reference draw"), "{m}");
}

#[test]
fn unsupported_opsets_and_dtypes_are_refused() {
    let e = import_proto(&relu_model(99)).unwrap_err();
    assert!(matches!(e, Error::Opset { version: 99, .. }), "{e:?}");
    let mut p = relu_model(17);
    p.opset_import.clear();
    assert!(matches!(import_proto(&p).unwrap_err(), Error::Opset { .. }));

    let mut p = relu_model(17);
    p.graph.as_mut().unwrap().input[0] = value("x", DataType::Int4 as i32, &[Some(3)]);
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("int4") && m.contains("'x'"), "{m}");
}

#[test]
fn malformed_files_are_errors() {
    for bytes in [&b"not a model"[..], &[0xff; 7][..], &[0x0a, 0x80][..]] {
        let e = import_bytes(bytes).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e:?}");
    }
    // A node reading a name nothing defines.
    let mut p = relu_model(17);
    p.graph.as_mut().unwrap().node[0].input[0] = "ghost".into();
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("'ghost'"), "{m}");
    // An initializer whose data does not fit its dims.
    let mut p = relu_model(17);
    let mut t = init("w", &Tensor::from_vec(vec![1.0f32, 2.0], &[2]));
    t.dims = vec![3];
    p.graph.as_mut().unwrap().initializer.push(t);
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("initializer 'w'"), "{m}");
    let e = tracejit_onnx::load_tensor("/nonexistent/input_0.pb").unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
}

#[test]
fn inputs_contradicting_the_declaration_are_errors_naming_the_input() {
    let model = import_proto(&relu_model(17)).unwrap();
    let good = Tensor::ones(&[2, 3], DType::F32);
    let cases = [
        (vec![], "expected 1 inputs"),
        (vec![Tensor::ones(&[2, 3], DType::F64)], "expected dtype f32, got f64"),
        (vec![Tensor::ones(&[2, 4], DType::F32)], "dim 1 must be 3"),
        (vec![Tensor::ones(&[3], DType::F32)], "expected rank 2"),
    ];
    for (inputs, what) in cases {
        let e = model.run(&inputs).unwrap_err();
        assert!(matches!(e, Error::Input { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains(what), "{m} should say {what}");
        if !inputs.is_empty() {
            assert!(m.contains("'x'"), "{m} should name the input");
        }
    }
    // Nothing was traced by the bad calls, and a good one still runs.
    assert_eq!(model.function().tracing_count(), 0);
    assert_eq!(model.run(&[good]).unwrap()[0].shape(), [2, 3]);
}

#[test]
fn a_node_that_cannot_be_mapped_is_an_error_naming_it() {
    let bytes = model(
        vec![node("Reshape", "bad_reshape", &["x", "shape"], &["y"], vec![])],
        vec![fixed("x", DType::F32, &[2, 3])],
        vec![value("y", elem(DType::F32), &[None])],
        vec![init("shape", &Tensor::from_vec(vec![4i64], &[1]))],
        13,
    );
    let model = import_bytes(&bytes).unwrap();
    let e = model.run(&[Tensor::ones(&[2, 3], DType::F32)]).unwrap_err();
    assert!(matches!(e, Error::Node { .. }), "{e:?}");
    let m = e.to_string();
    assert!(m.contains("bad_reshape") && m.contains("Reshape") && m.contains("cannot reshape"), "{m}");
    // The failed trace left nothing behind: the same call fails the same way.
    let again = model.run(&[Tensor::ones(&[2, 3], DType::F32)]).unwrap_err().to_string();
    assert_eq!(again, m);
}

/// Attention's attribute values are checked at import (naming the op,
/// node, domain and opset and the value); shapes that do not fit are a
/// node error at `run`, and the model still runs good inputs afterwards.
#[test]
fn attention_values_it_cannot_honour_are_refused() {
    let attention = |attrs: Vec<tracejit_onnx::pb::AttributeProto>, opset: i64| {
        model_proto(
            vec![node("Attention", "attn", &["q", "k", "v"], &["y"], attrs)],
            vec![
                fixed("q", DType::F32, &[1, 2, 6]),
                fixed("k", DType::F32, &[1, 3, 6]),
                fixed("v", DType::F32, &[1, 3, 6]),
            ],
            vec![value("y", elem(DType::F32), &[None, None, None])],
            vec![],
            opset,
        )
    };
    let heads = || vec![attr_i("q_num_heads", 2), attr_i("kv_num_heads", 2)];
    let refused = [
        (vec![attr_i("qk_matmul_output_mode", 4)], 23, "qk_matmul_output_mode 4"),
        (vec![attr_f("softcap", -1.0)], 23, "softcap -1"),
        (vec![attr_f("scale", f32::NAN)], 23, "scale NaN"),
        (vec![attr_i("softmax_precision", DataType::Int32 as i64)], 23, "softmax_precision i32 is not a float"),
        (vec![attr_i("softmax_precision", DataType::Uint8 as i64)], 23, "softmax_precision u8 is not a float"),
        (vec![attr_i("is_causal", 2)], 23, "is_causal 2"),
        (vec![], 22, "from opset 23"),
    ];
    for (mut attrs, opset, what) in refused {
        attrs.extend(heads());
        let e = import_proto(&attention(attrs, opset)).unwrap_err();
        assert!(matches!(e, Error::UnsupportedOp { .. }), "{e:?}");
        let m = e.to_string();
        for part in ["Attention", "'attn'", "ai.onnx", &format!("opset {opset}"), what] {
            assert!(m.contains(part), "{m} should name {part}");
        }
    }
    // 3-D inputs without the head counts, hidden sizes the heads do not
    // divide, and head counts that leave Q and K different widths.
    for (attrs, what) in [
        (vec![], "need the attribute 'q_num_heads'"),
        (vec![attr_i("q_num_heads", 4), attr_i("kv_num_heads", 4)], "not a multiple of 4 heads"),
        (vec![attr_i("q_num_heads", 2), attr_i("kv_num_heads", 3)], "differ in width of Q and K"),
    ] {
        let model = import_proto(&attention(attrs, 23)).unwrap();
        let x = |t| Tensor::ones(&[1, t, 6], DType::F32);
        let e = model.run(&[x(2), x(3), x(3)]).unwrap_err();
        assert!(matches!(e, Error::Node { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("'attn'") && m.contains("Attention") && m.contains(what), "{m} should say {what}");
    }
    let model = import_proto(&attention(heads(), 23)).unwrap();
    let x = |t| Tensor::ones(&[1, t, 6], DType::F32);
    assert_eq!(model.run(&[x(2), x(3), x(3)]).unwrap()[0].shape(), [1, 2, 6]);
}

/// RotaryEmbedding's attribute values are checked at import; a 3-D input
/// without `num_heads` and a rotary width the head cannot hold are node
/// errors at `run`.
#[test]
fn rotary_embedding_values_it_cannot_honour_are_refused() {
    let rope = |attrs: Vec<tracejit_onnx::pb::AttributeProto>, opset: i64| {
        model_proto(
            vec![node("RotaryEmbedding", "rope", &["x", "cos", "sin"], &["y"], attrs)],
            vec![
                fixed("x", DType::F32, &[1, 2, 8]),
                fixed("cos", DType::F32, &[1, 2, 2]),
                fixed("sin", DType::F32, &[1, 2, 2]),
            ],
            vec![value("y", elem(DType::F32), &[None, None, None])],
            vec![],
            opset,
        )
    };
    for (attrs, opset, what) in [
        (vec![attr_i("interleaved", 3)], 23, "interleaved 3"),
        (vec![attr_i("rotary_embedding_dim", -2)], 23, "rotary_embedding_dim -2"),
        (vec![], 22, "from opset 23"),
    ] {
        let m = import_proto(&rope(attrs, opset)).unwrap_err().to_string();
        for part in ["RotaryEmbedding", "'rope'", "ai.onnx", &format!("opset {opset}"), what] {
            assert!(m.contains(part), "{m} should name {part}");
        }
    }
    let x = Tensor::ones(&[1, 2, 8], DType::F32);
    let c = Tensor::ones(&[1, 2, 2], DType::F32);
    for (attrs, what) in [
        (vec![], "needs num_heads"),
        (vec![attr_i("num_heads", 2), attr_i("rotary_embedding_dim", 6)], "at most the head size 4"),
    ] {
        let model = import_proto(&rope(attrs, 23)).unwrap();
        let m = model.run(&[x.clone(), c.clone(), c.clone()]).unwrap_err().to_string();
        assert!(m.contains("'rope'") && m.contains(what), "{m} should say {what}");
    }
    let model = import_proto(&rope(vec![attr_i("num_heads", 2)], 23)).unwrap();
    assert_eq!(model.run(&[x, c.clone(), c]).unwrap()[0].shape(), [1, 2, 8]);
}
