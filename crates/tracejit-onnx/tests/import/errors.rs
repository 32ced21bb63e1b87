//! The importer's errors: what is refused at import names the op type,
//! node, domain and opset; a malformed file is an error, never a panic; at
//! `run` an input contradicting the declaration names the input, and a
//! node that cannot be mapped for the given shapes names the node, with
//! the model still usable afterwards.

use tracejit_onnx::pb::{tensor_proto::DataType, OperatorSetIdProto};
use tracejit_onnx::{import_bytes, Error};
use tracejit_trace::{DType, Tensor};

use crate::builder::*;

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
fn another_domain_an_unknown_attribute_and_a_missing_primitive_are_refused() {
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
    p.graph.as_mut().unwrap().node[0].op_type = Some("BitwiseAnd".into());
    let m = import_proto(&p).unwrap_err().to_string();
    assert!(m.contains("needs primitive bitwise_and"), "{m}");
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
