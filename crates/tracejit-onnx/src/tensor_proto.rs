//! Values into ONNX: dtypes into `TensorProto.DataType` codes, eager values
//! into `TensorProto`s (little-endian `raw_data`, row-major whatever the
//! array's layout), and scalar constants of a dtype.

use tracejit_tensor::{DType, Storage};

use crate::pb::tensor_proto::DataType;
use crate::pb::TensorProto;

/// The ONNX element type of a tracejit dtype. All thirteen map (BFLOAT16 and
/// FLOAT16 for the 16-bit floats, INT8 to UINT64 for the other integers).
pub(crate) fn data_type(dtype: DType) -> i32 {
    let t = match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
        DType::BF16 => DataType::Bfloat16,
        DType::F16 => DataType::Float16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
    };
    t as i32
}

/// `value` as a named `TensorProto`.
pub(crate) fn tensor_proto(name: &str, value: &Storage) -> TensorProto {
    let mut raw = Vec::with_capacity(value.len() * value.dtype().size_of());
    match value {
        Storage::F32(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::F64(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::I32(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::I64(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::Bool(a) => raw.extend(a.iter().map(|&v| u8::from(v))),
        Storage::BF16(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::F16(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::I8(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::U8(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::I16(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::U16(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::U32(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        Storage::U64(a) => a.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
    }
    TensorProto {
        dims: value.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(data_type(value.dtype())),
        name: Some(name.to_string()),
        raw_data: Some(raw),
        ..TensorProto::default()
    }
}

/// A 1-D i64 tensor (axes, shapes, slice bounds).
pub(crate) fn i64s(values: &[i64]) -> Storage {
    Storage::from_vec(values.to_vec(), &[values.len()]).expect("length matches")
}

/// A rank-0 tensor of `dtype` holding `value` converted as the reference
/// kernels convert scalars (integers truncate and saturate, as `as` does).
pub(crate) fn scalar(dtype: DType, value: f64) -> Storage {
    Storage::scalar_of(dtype, value)
}
