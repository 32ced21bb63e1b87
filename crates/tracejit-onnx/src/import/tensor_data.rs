//! ONNX values into tracejit: `TensorProto` (raw little-endian `raw_data` or
//! the typed repeated fields) decoded into a `Storage`, ONNX element types
//! mapped onto tracejit's dtypes, and the public [`load_tensor`] /
//! [`load_tensor_bytes`] that read ONNX's serialized test data.
//!
//! Every element type tracejit has decodes (f32, f64, i32, i64, bool, f16,
//! bf16, and the integers i8, u8, i16, u16, u32, u64); any other is an [`Error::UnsupportedDType`] naming ONNX's type, so
//! the caller learns which dtype a model needs. Lengths are checked against
//! the dims before anything is allocated from them, so a corrupt file is an
//! error, never a huge allocation or a panic.

use std::path::Path;

use prost::Message;
use tracejit_tensor::{bf16, f16, DType, Storage, StorageElement};
use tracejit_trace::Tensor;

use crate::pb::tensor_proto::{DataLocation, DataType};
use crate::pb::TensorProto;
use crate::{Error, Result};

/// The most elements one tensor of a file may declare (2^31, 8 GiB of
/// f32): dims whose product exceeds it are a malformed file, not an
/// allocation attempt.
const MAX_ELEMENTS: u64 = 1 << 31;

/// Reads a serialized `TensorProto` (ONNX's `test_data_set_N/input_K.pb`)
/// as an eager tensor.
///
/// ```no_run
/// let x = tracejit_onnx::load_tensor("test_data_set_0/input_0.pb")?;
/// println!("{:?} {:?}", x.dtype(), x.shape());
/// # Ok::<(), tracejit_onnx::Error>(())
/// ```
pub fn load_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    load_tensor_bytes(&bytes)
}

/// [`load_tensor`] from the bytes of a serialized `TensorProto`.
pub fn load_tensor_bytes(bytes: &[u8]) -> Result<Tensor> {
    let proto =
        TensorProto::decode(bytes).map_err(|e| Error::Malformed { what: "tensor".into(), message: e.to_string() })?;
    let what = match proto.name() {
        "" => "tensor".to_string(),
        n => format!("tensor '{n}'"),
    };
    Ok(Tensor::from_raw_storage(storage_from_proto(&proto, &what)?))
}

/// ONNX's lowercase name of an element type code (`uint8`), for messages.
pub(crate) fn onnx_type_name(code: i32) -> String {
    match DataType::try_from(code) {
        Ok(DataType::Undefined) => "undefined".into(),
        Ok(DataType::Float) => "float32".into(),
        Ok(DataType::Double) => "float64".into(),
        Ok(DataType::Float16) => "float16".into(),
        Ok(DataType::Bfloat16) => "bfloat16".into(),
        Ok(t) => t.as_str_name().to_lowercase(),
        Err(_) => format!("unknown type code {code}"),
    }
}

/// The tracejit dtype of an ONNX element type code, or an
/// [`Error::UnsupportedDType`] naming the type and `what` carries it.
pub(crate) fn dtype_of(code: i32, what: &str) -> Result<DType> {
    match DataType::try_from(code) {
        Ok(DataType::Float) => Ok(DType::F32),
        Ok(DataType::Double) => Ok(DType::F64),
        Ok(DataType::Int32) => Ok(DType::I32),
        Ok(DataType::Int64) => Ok(DType::I64),
        Ok(DataType::Bool) => Ok(DType::Bool),
        Ok(DataType::Float16) => Ok(DType::F16),
        Ok(DataType::Bfloat16) => Ok(DType::BF16),
        Ok(DataType::Int8) => Ok(DType::I8),
        Ok(DataType::Uint8) => Ok(DType::U8),
        Ok(DataType::Int16) => Ok(DType::I16),
        Ok(DataType::Uint16) => Ok(DType::U16),
        Ok(DataType::Uint32) => Ok(DType::U32),
        Ok(DataType::Uint64) => Ok(DType::U64),
        _ => Err(Error::UnsupportedDType { what: what.to_string(), dtype: onnx_type_name(code) }),
    }
}

/// Decodes a `TensorProto` into a row-major storage of its dims.
pub(crate) fn storage_from_proto(t: &TensorProto, what: &str) -> Result<Storage> {
    let malformed = |message: String| Error::Malformed { what: what.to_string(), message };
    if t.data_location == Some(DataLocation::External as i32) || !t.external_data.is_empty() {
        return Err(malformed("its data is stored in an external file, which the importer does not read yet".into()));
    }
    if t.segment.is_some() {
        return Err(malformed("segmented tensors are not supported".into()));
    }
    let dtype = dtype_of(t.data_type.unwrap_or(0), what)?;
    let shape = dims_of(&t.dims).map_err(malformed)?;
    let n: usize = shape.iter().product();
    match &t.raw_data {
        Some(raw) if !raw.is_empty() || n == 0 => from_raw(raw, dtype, &shape).map_err(malformed),
        _ => from_typed_fields(t, dtype, &shape, n).map_err(malformed),
    }
}

/// Dims as sizes, rejecting negative dims and element counts past
/// [`MAX_ELEMENTS`].
fn dims_of(dims: &[i64]) -> std::result::Result<Vec<usize>, String> {
    let mut count: u64 = 1;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims {
        let d = u64::try_from(d).map_err(|_| format!("negative dim {d} in dims {dims:?}"))?;
        count = count.saturating_mul(d);
        shape.push(d as usize);
    }
    if count > MAX_ELEMENTS {
        return Err(format!("dims {dims:?} declare {count} elements, more than the {MAX_ELEMENTS} allowed"));
    }
    Ok(shape)
}

/// Decodes little-endian `raw_data` (also the form of tracejit's static
/// inputs in a trace key).
pub(crate) fn from_raw(raw: &[u8], dtype: DType, shape: &[usize]) -> std::result::Result<Storage, String> {
    let n: usize = shape.iter().product();
    let size = dtype.size_of();
    if raw.len() != n * size {
        return Err(format!(
            "raw_data holds {} bytes, but {n} {dtype} elements of shape {shape:?} need {}",
            raw.len(),
            n * size
        ));
    }
    fn build<T: StorageElement, const W: usize>(
        raw: &[u8],
        shape: &[usize],
        f: impl Fn([u8; W]) -> T,
    ) -> std::result::Result<Storage, String> {
        let data: Vec<T> = raw.chunks_exact(W).map(|c| f(c.try_into().expect("chunks_exact gives W bytes"))).collect();
        Storage::from_vec(data, shape).map_err(|e| e.to_string())
    }
    match dtype {
        DType::F32 => build(raw, shape, f32::from_le_bytes),
        DType::F64 => build(raw, shape, f64::from_le_bytes),
        DType::I32 => build(raw, shape, i32::from_le_bytes),
        DType::I64 => build(raw, shape, i64::from_le_bytes),
        DType::Bool => build(raw, shape, |b: [u8; 1]| b[0] != 0),
        DType::F16 => build(raw, shape, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b))),
        DType::BF16 => build(raw, shape, |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b))),
        DType::I8 => build(raw, shape, i8::from_le_bytes),
        DType::U8 => build(raw, shape, u8::from_le_bytes),
        DType::I16 => build(raw, shape, i16::from_le_bytes),
        DType::U16 => build(raw, shape, u16::from_le_bytes),
        DType::U32 => build(raw, shape, u32::from_le_bytes),
        DType::U64 => build(raw, shape, u64::from_le_bytes),
    }
}

/// The little-endian bytes of a storage, row-major (the inverse of [`from_raw`]).
pub(crate) fn to_raw(s: &Storage) -> Vec<u8> {
    crate::tensor_proto::tensor_proto("", s).raw_data.unwrap_or_default()
}

/// Decodes the typed repeated fields ONNX uses when `raw_data` is absent:
/// `float_data` (f32), `double_data` (f64), `int64_data` (i64) and
/// `int32_data` (i32, bool, i8, u8, i16, u16, and the bit patterns of f16
/// and bf16), `uint64_data` (u32 and u64). A value outside the element
/// type's range is an error, not silently truncated.
fn from_typed_fields(t: &TensorProto, dtype: DType, shape: &[usize], n: usize) -> std::result::Result<Storage, String> {
    fn take<T: StorageElement + Copy, S: Copy>(
        field: &str,
        values: &[S],
        n: usize,
        shape: &[usize],
        f: impl Fn(S) -> T,
    ) -> std::result::Result<Storage, String> {
        if values.len() != n {
            return Err(format!("{field} holds {} values, but the dims {shape:?} need {n}", values.len()));
        }
        Storage::from_vec(values.iter().map(|&v| f(v)).collect(), shape).map_err(|e| e.to_string())
    }
    match dtype {
        DType::F32 => take("float_data", &t.float_data, n, shape, |v| v),
        DType::F64 => take("double_data", &t.double_data, n, shape, |v| v),
        DType::I64 => take("int64_data", &t.int64_data, n, shape, |v| v),
        DType::I32 => take("int32_data", &t.int32_data, n, shape, |v| v),
        DType::Bool => take("int32_data", &t.int32_data, n, shape, |v| v != 0),
        DType::F16 => take("int32_data", &t.int32_data, n, shape, |v| f16::from_bits(v as u16)),
        DType::BF16 => take("int32_data", &t.int32_data, n, shape, |v| bf16::from_bits(v as u16)),
        DType::I8 => take_exact::<i8, i32>("int32_data", &t.int32_data, n, shape),
        DType::U8 => take_exact::<u8, i32>("int32_data", &t.int32_data, n, shape),
        DType::I16 => take_exact::<i16, i32>("int32_data", &t.int32_data, n, shape),
        DType::U16 => take_exact::<u16, i32>("int32_data", &t.int32_data, n, shape),
        DType::U32 => take_exact::<u32, u64>("uint64_data", &t.uint64_data, n, shape),
        DType::U64 => take("uint64_data", &t.uint64_data, n, shape, |v| v),
    }
}

/// The typed field `values` as elements of type `T`, each of which must
/// fit (ONNX stores the narrow integers widened to 32 or 64 bits).
fn take_exact<T, S>(field: &str, values: &[S], n: usize, shape: &[usize]) -> std::result::Result<Storage, String>
where
    T: StorageElement + TryFrom<S>,
    S: Copy + std::fmt::Display,
{
    if values.len() != n {
        return Err(format!("{field} holds {} values, but the dims {shape:?} need {n}", values.len()));
    }
    let data = values
        .iter()
        .map(|&v| T::try_from(v).map_err(|_| format!("{field} holds {v}, which does not fit in {}", T::DTYPE)))
        .collect::<std::result::Result<Vec<T>, String>>()?;
    Storage::from_vec(data, shape).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(dtype: DataType, dims: &[i64]) -> TensorProto {
        TensorProto { dims: dims.to_vec(), data_type: Some(dtype as i32), ..TensorProto::default() }
    }

    #[test]
    fn raw_and_typed_fields_agree() {
        let mut raw = proto(DataType::Float, &[2, 2]);
        raw.raw_data = Some([1.0f32, -2.0, 3.5, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut typed = proto(DataType::Float, &[2, 2]);
        typed.float_data = vec![1.0, -2.0, 3.5, f32::NAN];
        let a = storage_from_proto(&raw, "a").unwrap();
        let b = storage_from_proto(&typed, "b").unwrap();
        assert!(a.bit_eq(&b));
        assert_eq!(a.shape(), &[2, 2]);
    }

    #[test]
    fn half_types_come_from_int32_bit_patterns() {
        let mut t = proto(DataType::Float16, &[2]);
        t.int32_data = vec![i32::from(f16::from_f32(1.5).to_bits()), i32::from(f16::from_f32(-0.25).to_bits())];
        let s = storage_from_proto(&t, "t").unwrap();
        assert_eq!(s.to_vec::<f16>().unwrap(), [f16::from_f32(1.5), f16::from_f32(-0.25)]);
        let mut t = proto(DataType::Bfloat16, &[1]);
        t.int32_data = vec![i32::from(bf16::from_f32(3.0).to_bits())];
        assert_eq!(storage_from_proto(&t, "t").unwrap().to_vec::<bf16>().unwrap(), [bf16::from_f32(3.0)]);
    }

    #[test]
    fn wrong_lengths_and_types_are_errors() {
        let mut t = proto(DataType::Int64, &[3]);
        t.int64_data = vec![1, 2];
        assert!(matches!(storage_from_proto(&t, "t"), Err(Error::Malformed { .. })));
        let mut t = proto(DataType::Int64, &[3]);
        t.raw_data = Some(vec![0; 23]);
        assert!(matches!(storage_from_proto(&t, "t"), Err(Error::Malformed { .. })));
        let t = proto(DataType::Int4, &[1]);
        let e = storage_from_proto(&t, "initializer 'q'").unwrap_err().to_string();
        assert!(e.contains("int4") && e.contains("initializer 'q'"), "{e}");
        // A typed-field value that does not fit the element type.
        let mut t = proto(DataType::Int8, &[2]);
        t.int32_data = vec![5, 200];
        let e = storage_from_proto(&t, "t").unwrap_err().to_string();
        assert!(e.contains("200") && e.contains("i8"), "{e}");
        let t = proto(DataType::Float, &[1 << 20, 1 << 20]);
        assert!(matches!(storage_from_proto(&t, "t"), Err(Error::Malformed { .. })));
        let t = proto(DataType::Float, &[-1]);
        assert!(matches!(storage_from_proto(&t, "t"), Err(Error::Malformed { .. })));
    }

    #[test]
    fn raw_round_trip() {
        for s in [
            Storage::from_vec(vec![1i64, -5, 7], &[3]).unwrap(),
            Storage::from_vec(vec![true, false], &[2, 1]).unwrap(),
            Storage::from_vec(vec![0.5f64], &[]).unwrap(),
            Storage::from_vec(vec![i8::MIN, -1, i8::MAX], &[3]).unwrap(),
            Storage::from_vec(vec![0u8, 255, 7], &[1, 3]).unwrap(),
            Storage::from_vec(vec![i16::MIN, i16::MAX], &[2]).unwrap(),
            Storage::from_vec(vec![u16::MAX, 1], &[2]).unwrap(),
            Storage::from_vec(vec![u32::MAX, 0], &[2]).unwrap(),
            Storage::from_vec(vec![u64::MAX, 1 << 63], &[2]).unwrap(),
        ] {
            let back = from_raw(&to_raw(&s), s.dtype(), s.shape()).unwrap();
            assert!(back.bit_eq(&s));
            // Through a whole TensorProto, its element type code included.
            let proto = crate::tensor_proto::tensor_proto("t", &s);
            assert!(storage_from_proto(&proto, "t").unwrap().bit_eq(&s), "{:?}", s.dtype());
        }
    }

    #[test]
    fn narrow_integers_come_from_their_typed_fields() {
        let mut t = proto(DataType::Int8, &[3]);
        t.int32_data = vec![-128, 0, 127];
        assert_eq!(storage_from_proto(&t, "t").unwrap().to_vec::<i8>().unwrap(), [-128, 0, 127]);
        let mut t = proto(DataType::Uint16, &[2]);
        t.int32_data = vec![65535, 3];
        assert_eq!(storage_from_proto(&t, "t").unwrap().to_vec::<u16>().unwrap(), [65535, 3]);
        let mut t = proto(DataType::Uint32, &[1]);
        t.uint64_data = vec![u64::from(u32::MAX)];
        assert_eq!(storage_from_proto(&t, "t").unwrap().to_vec::<u32>().unwrap(), [u32::MAX]);
        let mut t = proto(DataType::Uint64, &[1]);
        t.uint64_data = vec![u64::MAX];
        assert_eq!(storage_from_proto(&t, "t").unwrap().to_vec::<u64>().unwrap(), [u64::MAX]);
    }
}
