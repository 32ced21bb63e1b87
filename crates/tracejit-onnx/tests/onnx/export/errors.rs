//! Malformed use is an `Err` that names what is wrong, never a file that
//! fails later: side effects, kernels without a body, bad name lists.

use tracejit_onnx::{Error, Exporter};
use tracejit_tensor::DType;
use tracejit_trace::{function, Tensor, TensorSpec, Variable};

#[test]
fn a_variable_assignment_is_an_error_naming_the_node_and_line() {
    let v = Variable::new(Tensor::zeros(&[3], DType::F32)).with_name("counter");
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        v2.assign_add(&x);
        x * 2.0
    })
    .name("stateful");
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[3])).unwrap();
    let err = tracejit_onnx::to_bytes(&cf).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported { .. }), "{msg}");
    assert!(msg.contains("`stateful`"), "{msg}");
    assert!(msg.contains("assign_variable"), "{msg}");
    assert!(msg.contains("counter"), "{msg}");
    assert!(msg.contains("errors.rs:"), "the user's line: {msg}");
    let dir = std::env::temp_dir().join(format!("tracejit-onnx-err-{}", std::process::id()));
    let path = dir.join("never.onnx");
    assert!(tracejit_onnx::save(&cf, &path).is_err());
    assert!(!path.exists(), "no file is written");
    // `?` into tracejit's own error keeps the message.
    let e: tracejit_trace::Error = err.into();
    assert!(e.to_string().contains("assign_variable"));
}

#[test]
fn a_native_kernel_without_its_body_is_an_error_naming_the_composite() {
    // `inner` is optimized on its own, so its softmax call became the
    // registered f32 kernel; calling it from `outer` inlines that kernel.
    let inner = function(|x: Tensor| tracejit_nn::softmax(&x, -1) + 1.0).name("inner");
    let outer = function(move |x: Tensor| inner.call(x).unwrap() * 2.0).name("outer");
    let cf = outer.get_concrete_function(TensorSpec::new(DType::F32, &[4])).unwrap();
    match tracejit_onnx::to_bytes(&cf) {
        // Without a registered kernel the body was inlined: that exports.
        Ok(_) => assert!(tracejit_ir::registry::get("tracejit.nn.softmax").is_none()),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("tracejit.nn.softmax") && msg.contains("native kernel"), "{msg}");
        }
    }
}

#[test]
fn name_lists_must_fit_the_signature() {
    let cf = function(|(a, b): (Tensor, Tensor)| &a + &b)
        .name("add")
        .get_concrete_function((TensorSpec::new(DType::F32, &[2]), TensorSpec::new(DType::F32, &[2])))
        .unwrap();
    let err = Exporter::new(&cf).input_names(["only_one"]).to_bytes().unwrap_err();
    assert_eq!(err.to_string(), "ONNX export of `add`: input names: expected 2 name(s), got 1");
    let err = Exporter::new(&cf).input_names(["a", "a"]).to_bytes().unwrap_err();
    assert!(err.to_string().contains("`a` is empty or given twice"), "{err}");
    let err = Exporter::new(&cf).output_names(["y", "z"]).to_bytes().unwrap_err();
    assert!(err.to_string().contains("output names: expected 1 name(s), got 2"), "{err}");
}

#[test]
fn every_dtype_is_an_input_and_output_type() {
    for (dtype, code) in [(DType::F32, 1), (DType::F64, 11), (DType::I32, 6), (DType::I64, 7), (DType::Bool, 9)] {
        let cf = function(|x: Tensor| x.expand_dims(0)).get_concrete_function(TensorSpec::new(dtype, &[2])).unwrap();
        let model = tracejit_onnx::decode(&tracejit_onnx::to_bytes(&cf).unwrap()).unwrap();
        let graph = model.graph.as_ref().unwrap();
        for info in [&graph.input[0], &graph.output[0]] {
            let Some(tracejit_onnx::pb::type_proto::Value::TensorType(t)) = &info.r#type.as_ref().unwrap().value else {
                panic!("a tensor type")
            };
            assert_eq!(t.elem_type(), code, "{dtype}");
        }
        assert_eq!(model.ir_version(), 10);
        assert_eq!(model.opset_import[0].version(), 17);
    }
}
