//! Element types. `DType` is the runtime tag; `Element` ties each tag to its
//! Rust type so generic kernels can be written once and dispatched by tag.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 32-bit signed integer (wrapping arithmetic).
    I32,
    /// 64-bit signed integer (wrapping arithmetic).
    I64,
    /// Boolean.
    Bool,
    /// bfloat16 (8 exponent bits, 8 significant bits): a storage dtype.
    /// Arithmetic on it computes in f32 and rounds each result to nearest
    /// even, as JAX on CPU does.
    BF16,
    /// IEEE half precision (5 exponent bits, 11 significant bits): a
    /// storage dtype like [`DType::BF16`]; casts overflow to ±Inf past 65504.
    F16,
    /// 8-bit signed integer: a storage dtype whose arithmetic computes in
    /// I32 and wraps each result back to 8 bits (ONNX's and numpy's
    /// per-op wrapping).
    I8,
    /// 8-bit unsigned integer; computes in I32 like [`DType::I8`].
    U8,
    /// 16-bit signed integer; computes in I32 like [`DType::I8`].
    I16,
    /// 16-bit unsigned integer; computes in I32 like [`DType::I8`].
    U16,
    /// 32-bit unsigned integer; computes in I64 and wraps back to 32 bits.
    U32,
    /// 64-bit unsigned integer (wrapping arithmetic): no wider type holds
    /// it, so it is its own compute dtype, with unsigned compare, divide,
    /// min and max.
    U64,
}

impl DType {
    /// All dtypes, in a fixed order (handy for tests).
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::BF16,
        DType::F16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// True for the float dtypes: F32, F64, BF16 and F16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for the 16-bit storage dtypes BF16 and F16, whose arithmetic
    /// runs in f32 (see [`DType::compute`]).
    pub fn is_low_precision(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// The dtype arithmetic on this one computes in: F32 for BF16 and F16,
    /// I32 for I8, U8, I16 and U16, I64 for U32, else the dtype itself.
    /// Computing there and wrapping each result back to the storage width
    /// is exact for every integer op tracejit has (add, sub, mul, div, rem,
    /// pow, min, max, compare, neg, abs), since the storage values widen
    /// exactly (sign- or zero-extended) and wrapping commutes with them.
    pub fn compute(self) -> DType {
        match self {
            DType::BF16 | DType::F16 => DType::F32,
            DType::I8 | DType::U8 | DType::I16 | DType::U16 => DType::I32,
            DType::U32 => DType::I64,
            d => d,
        }
    }

    /// True for the integer storage dtypes I8, U8, I16, U16 and U32, whose
    /// arithmetic runs in a wider integer (see [`DType::compute`]).
    pub fn is_narrow_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32)
    }

    /// True for every integer dtype: I8, U8, I16, U16, I32, U32, I64, U64.
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 | DType::U32 | DType::I64 | DType::U64
        )
    }

    /// True for the unsigned integers U8, U16, U32 and U64.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// True for I32 and I64, the dtypes of indices (gather, one-hot,
    /// dynamic slices) and of shapes.
    pub fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// For an integer dtype, its smallest and largest values as i128
    /// (which holds every one exactly); `None` for floats and bool.
    pub fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            DType::I8 => (i8::MIN as i128, i8::MAX as i128),
            DType::U8 => (0, u8::MAX as i128),
            DType::I16 => (i16::MIN as i128, i16::MAX as i128),
            DType::U16 => (0, u16::MAX as i128),
            DType::I32 => (i32::MIN as i128, i32::MAX as i128),
            DType::U32 => (0, u32::MAX as i128),
            DType::I64 => (i64::MIN as i128, i64::MAX as i128),
            DType::U64 => (0, u64::MAX as i128),
            _ => return None,
        })
    }

    /// True for every dtype but Bool.
    pub fn is_numeric(self) -> bool {
        !matches!(self, DType::Bool)
    }

    /// Size of one element in bytes (bool is stored as one byte).
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::BF16 | DType::F16 | DType::I16 | DType::U16 => 2,
        }
    }

    /// The short lowercase name used in listings and error messages (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be the element of a tensor.
///
/// Sealed in spirit: only the thirteen types matching [`DType`] implement it
/// (`half::bf16` and `half::f16` for the 16-bit floats).
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug + PartialEq + PartialOrd + Default {
    /// The tag of this element type.
    const DTYPE: DType;
    /// Converts from f64 the way `as` does (saturating, NaN to 0 for ints,
    /// non-zero to `true` for bool).
    fn from_f64(v: f64) -> Self;
    /// Converts to f64 (`true` is 1).
    fn to_f64(self) -> f64;
}

macro_rules! impl_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
impl_element!(f32, F32);
impl_element!(f64, F64);
impl_element!(i32, I32);
impl_element!(i64, I64);
impl_element!(i8, I8);
impl_element!(u8, U8);
impl_element!(i16, I16);
impl_element!(u16, U16);
impl_element!(u32, U32);
impl_element!(u64, U64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline]
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
}

macro_rules! impl_half_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            /// Rounds to nearest even as if straight from f64 (no double rounding).
            #[inline]
            fn from_f64(v: f64) -> Self {
                <$t>::from_f32(f64_to_f32_odd(v))
            }
            #[inline]
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
        }
    };
}
impl_half_element!(half::bf16, BF16);
impl_half_element!(half::f16, F16);

/// `v` rounded to f32 "to odd" (truncated, the last bit set when inexact):
/// rounding that to a format with at least two fewer significant bits
/// (bf16's 8, f16's 11, against f32's 24) to nearest even gives the
/// correctly rounded result from `v`, where rounding to f32 to nearest first
/// could make a false tie (`half`'s own `from_f64` goes through f32 so).
pub(crate) fn f64_to_f32_odd(v: f64) -> f32 {
    let t = v as f32;
    if !t.is_finite() || t as f64 == v {
        return t;
    }
    let bits = t.to_bits();
    if bits & 1 == 1 {
        return t;
    }
    // Even and inexact: the odd neighbour on `v`'s side of `t`.
    let away_from_zero = (t as f64).abs() < v.abs();
    f32::from_bits(if away_from_zero { bits + 1 } else { bits - 1 })
}
