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
}

impl DType {
    /// All dtypes, in a fixed order (handy for tests).
    pub const ALL: [DType; 5] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];

    /// True for F32 and F64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
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
/// Sealed in spirit: only the five types matching [`DType`] implement it.
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
