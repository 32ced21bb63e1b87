//! A tensor's bytes in a safetensors file: the dtype names and the
//! little-endian, row-major encoding both ways, checked against the
//! dtype and shape when read.

use std::borrow::Cow;

use safetensors::tensor::{Dtype, View};
use tracejit_tensor::{DType, Storage};

/// One variable's value as safetensors bytes.
pub(super) struct Encoded {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub(super) fn to_safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
        // PyTorch's `torch.bfloat16` / `torch.float16` in safetensors.
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::I16 => Dtype::I16,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
    }
}

pub(super) fn from_safetensors_dtype(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F64 => Some(DType::F64),
        Dtype::I32 => Some(DType::I32),
        Dtype::I64 => Some(DType::I64),
        Dtype::BOOL => Some(DType::Bool),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        Dtype::I8 => Some(DType::I8),
        Dtype::U8 => Some(DType::U8),
        Dtype::I16 => Some(DType::I16),
        Dtype::U16 => Some(DType::U16),
        Dtype::U32 => Some(DType::U32),
        Dtype::U64 => Some(DType::U64),
        _ => None,
    }
}

/// Little-endian, row-major bytes of a storage (whatever its layout).
pub(super) fn encode(s: &Storage) -> Encoded {
    let data: Vec<u8> = match s {
        Storage::F32(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::F64(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I32(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I64(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Bool(a) => a.iter().map(|&b| u8::from(b)).collect(),
        Storage::BF16(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::F16(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I8(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::U8(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I16(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::U16(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::U32(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::U64(a) => a.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    Encoded { dtype: to_safetensors_dtype(s.dtype()), shape: s.shape().to_vec(), data }
}

/// A storage from little-endian, row-major bytes; `Err` if the byte count
/// does not match the dtype and shape.
pub(super) fn decode(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Storage, String> {
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or("the shape overflows")?;
    let expected = elements.checked_mul(dtype.size_of()).ok_or("the shape overflows")?;
    if data.len() != expected {
        return Err(format!("{} bytes for {dtype}{shape:?}, which needs {expected}", data.len()));
    }
    fn le<const N: usize, T>(data: &[u8], shape: &[usize], f: fn([u8; N]) -> T) -> Result<Storage, String>
    where
        T: tracejit_tensor::StorageElement,
    {
        let v: Vec<T> = data.chunks_exact(N).map(|c| f(c.try_into().expect("chunks_exact gives N bytes"))).collect();
        Storage::from_vec(v, shape).map_err(|e| e.to_string())
    }
    match dtype {
        DType::F32 => le(data, shape, f32::from_le_bytes),
        DType::F64 => le(data, shape, f64::from_le_bytes),
        DType::I32 => le(data, shape, i32::from_le_bytes),
        DType::I64 => le(data, shape, i64::from_le_bytes),
        DType::Bool => le(data, shape, |[b]: [u8; 1]| b != 0),
        DType::BF16 => le(data, shape, tracejit_tensor::bf16::from_le_bytes),
        DType::F16 => le(data, shape, tracejit_tensor::f16::from_le_bytes),
        DType::I8 => le(data, shape, i8::from_le_bytes),
        DType::U8 => le(data, shape, u8::from_le_bytes),
        DType::I16 => le(data, shape, i16::from_le_bytes),
        DType::U16 => le(data, shape, u16::from_le_bytes),
        DType::U32 => le(data, shape, u32::from_le_bytes),
        DType::U64 => le(data, shape, u64::from_le_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype survives encode -> decode bit for bit, under the
    /// safetensors dtype name PyTorch uses for it.
    #[test]
    fn every_dtype_round_trips() {
        let cases = [
            Storage::from_vec(vec![1.5f32, f32::NAN], &[2]).unwrap(),
            Storage::from_vec(vec![-0.0f64], &[]).unwrap(),
            Storage::from_vec(vec![i32::MIN, 3], &[1, 2]).unwrap(),
            Storage::from_vec(vec![i64::MAX], &[1]).unwrap(),
            Storage::from_vec(vec![true, false], &[2]).unwrap(),
            Storage::from_vec(vec![tracejit_tensor::bf16::from_f32(-2.5)], &[1]).unwrap(),
            Storage::from_vec(vec![tracejit_tensor::f16::from_f32(65504.0)], &[1]).unwrap(),
            Storage::from_vec(vec![i8::MIN, -1, i8::MAX], &[3]).unwrap(),
            Storage::from_vec(vec![0u8, 200, 255], &[3, 1]).unwrap(),
            Storage::from_vec(vec![i16::MIN, i16::MAX], &[2]).unwrap(),
            Storage::from_vec(vec![u16::MAX], &[1]).unwrap(),
            Storage::from_vec(vec![u32::MAX, 7], &[2]).unwrap(),
            Storage::from_vec(vec![u64::MAX, 1 << 63], &[2]).unwrap(),
        ];
        assert_eq!(cases.len(), DType::ALL.len());
        for s in &cases {
            let e = encode(s);
            assert_eq!(from_safetensors_dtype(e.dtype), Some(s.dtype()));
            let back = decode(s.dtype(), &e.shape, &e.data).unwrap();
            assert!(back.bit_eq(s), "{:?}", s.dtype());
        }
        assert!(decode(DType::U16, &[2], &[0; 3]).is_err(), "3 bytes are not two u16s");
    }
}
