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
}

impl DType {
    /// All dtypes, in a fixed order (handy for tests).
    pub const ALL: [DType; 7] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::BF16, DType::F16];

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
    /// else the dtype itself.
    pub fn compute(self) -> DType {
        if self.is_low_precision() {
            DType::F32
        } else {
            self
        }
    }

    /// True for I32 and I64.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// True for every dtype but Bool.
    pub fn is_numeric(self) -> bool {
        !matches!(self, DType::Bool)
    }

    /// Size of one element in bytes (bool is stored as one byte).
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
            DType::BF16 | DType::F16 => 2,
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
/// Sealed in spirit: only the seven types matching [`DType`] implement it
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
