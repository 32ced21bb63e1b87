//! A few lines of prost to write ONNX models by hand: value infos, nodes,
//! attributes, initializers from eager tensors, and the model around them.

use tracejit_onnx::pb::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use tracejit_trace::{DType, Tensor};

/// ONNX's element type code of a dtype.
pub fn elem(d: DType) -> i32 {
    (match d {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
    }) as i32
}

/// A tensor value info; `None` dims are symbolic (`d0`, `d1`, ...).
pub fn value(name: &str, elem_type: i32, dims: &[Option<i64>]) -> ValueInfoProto {
    use tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .enumerate()
        .map(|(i, d)| Dimension {
            value: Some(match d {
                Some(v) => Value::DimValue(*v),
                None => Value::DimParam(format!("d{i}")),
            }),
            ..Dimension::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..TypeProto::default()
        }),
        ..ValueInfoProto::default()
    }
}

/// A value info of fixed dims.
pub fn fixed(name: &str, d: DType, dims: &[usize]) -> ValueInfoProto {
    value(name, elem(d), &dims.iter().map(|&v| Some(v as i64)).collect::<Vec<_>>())
}

/// A node of the default domain.
pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute,
        ..NodeProto::default()
    }
}

pub fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    }
}

pub fn attr_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        f: Some(v),
        r#type: Some(AttributeType::Float as i32),
        ..Default::default()
    }
}

pub fn attr_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        s: Some(v.as_bytes().to_vec()),
        r#type: Some(AttributeType::String as i32),
        ..Default::default()
    }
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        ints: v.to_vec(),
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    }
}

/// An initializer holding `t`'s values (raw little-endian data).
pub fn init(name: &str, t: &Tensor) -> TensorProto {
    let mut raw = Vec::new();
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        DType::I64 => t.to_vec::<i64>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        DType::I32 => t.to_vec::<i32>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        DType::I8 => t.to_vec::<i8>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        DType::U8 => raw.extend(t.to_vec::<u8>().unwrap()),
        DType::I16 => t.to_vec::<i16>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        DType::U16 => t.to_vec::<u16>().unwrap().iter().for_each(|v| raw.extend(v.to_le_bytes())),
        d => panic!("the builder writes f32 and integer initializers, not {d}"),
    }
    TensorProto {
        name: Some(name.into()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(elem(t.dtype())),
        raw_data: Some(raw),
        ..TensorProto::default()
    }
}

/// The model proto around a graph.
pub fn model_proto(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
    opset: i64,
) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(GraphProto {
            name: Some("hand_built".into()),
            node: nodes,
            input: inputs,
            output: outputs,
            initializer,
            ..GraphProto::default()
        }),
        ..ModelProto::default()
    }
}

/// The serialized model.
pub fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
    opset: i64,
) -> Vec<u8> {
    use prost::Message;
    model_proto(nodes, inputs, outputs, initializer, opset).encode_to_vec()
}

/// A float tensor of `shape` from a seed, with a NaN, +Inf and -Inf planted
/// when `specials` (and there is room).
pub fn floats(shape: &[usize], seed: u64, specials: bool) -> Tensor {
    let t = Tensor::randn(shape, seed);
    if !specials || t.len() < 4 {
        return t;
    }
    let mut v = t.to_vec::<f32>().unwrap();
    let n = v.len();
    v[seed as usize % n] = f32::NAN;
    v[(seed as usize + 1) % n] = f32::INFINITY;
    v[(seed as usize + 2) % n] = f32::NEG_INFINITY;
    Tensor::from_vec(v, shape)
}
