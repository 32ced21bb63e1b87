//! [`Scalar`]: an immediate of one of the five dtypes, as the lowered
//! program holds constants and clamp bounds, with its raw bits for kernel
//! keys and constant pools.

use tracejit_ir::tensor::{DType, Storage};

/// A scalar immediate of one of the five register dtypes (a narrow integer
/// is held as its compute dtype's value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    F32(f32),
    F64(f64),
    I32(i32),
    I64(i64),
    Bool(bool),
}

impl Scalar {
    /// Converts `v` to `dtype` the way Rust's `as` does (clamp bounds).
    pub(crate) fn from_f64_as(dtype: DType, v: f64) -> Scalar {
        match dtype {
            DType::F32 => Scalar::F32(v as f32),
            DType::F64 => Scalar::F64(v),
            DType::I32 => Scalar::I32(v as i32),
            DType::I64 => Scalar::I64(v as i64),
            DType::Bool => Scalar::Bool(v != 0.0),
            // The narrow integers as their compute dtype's (canonical) value.
            DType::I8 => Scalar::I32(i32::from(v as i8)),
            DType::U8 => Scalar::I32(i32::from(v as u8)),
            DType::I16 => Scalar::I32(i32::from(v as i16)),
            DType::U16 => Scalar::I32(i32::from(v as u16)),
            DType::U32 => Scalar::I64(i64::from(v as u32)),
            DType::BF16 | DType::F16 | DType::U64 => {
                unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
            }
        }
    }

    /// The single element of a one-element storage.
    pub(crate) fn of_storage(s: &Storage) -> Scalar {
        match s {
            Storage::F32(a) => Scalar::F32(*a.iter().next().expect("one element")),
            Storage::F64(a) => Scalar::F64(*a.iter().next().expect("one element")),
            Storage::I32(a) => Scalar::I32(*a.iter().next().expect("one element")),
            Storage::I64(a) => Scalar::I64(*a.iter().next().expect("one element")),
            Storage::Bool(a) => Scalar::Bool(*a.iter().next().expect("one element")),
            // The narrow integers as their compute dtype's value.
            Storage::I8(a) => Scalar::I32(i32::from(*a.iter().next().expect("one element"))),
            Storage::U8(a) => Scalar::I32(i32::from(*a.iter().next().expect("one element"))),
            Storage::I16(a) => Scalar::I32(i32::from(*a.iter().next().expect("one element"))),
            Storage::U16(a) => Scalar::I32(i32::from(*a.iter().next().expect("one element"))),
            Storage::U32(a) => Scalar::I64(i64::from(*a.iter().next().expect("one element"))),
            Storage::BF16(_) | Storage::F16(_) | Storage::U64(_) => {
                unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
            }
        }
    }

    /// Its dtype.
    pub(crate) fn dtype(self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::F64(_) => DType::F64,
            Scalar::I32(_) => DType::I32,
            Scalar::I64(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
        }
    }

    /// A fresh 0-d storage holding it ([`Scalar::of_storage`]'s inverse).
    pub(crate) fn to_storage(self) -> Storage {
        match self {
            Scalar::F32(x) => Storage::scalar(x),
            Scalar::F64(x) => Storage::scalar(x),
            Scalar::I32(x) => Storage::scalar(x),
            Scalar::I64(x) => Storage::scalar(x),
            Scalar::Bool(x) => Storage::scalar(x),
        }
    }

    /// The raw bits, zero-extended (for keys and constant pools).
    pub(crate) fn bits(self) -> u64 {
        match self {
            Scalar::F32(v) => u64::from(v.to_bits()),
            Scalar::F64(v) => v.to_bits(),
            Scalar::I32(v) => u64::from(v as u32),
            Scalar::I64(v) => v as u64,
            Scalar::Bool(v) => u64::from(v),
        }
    }
}
