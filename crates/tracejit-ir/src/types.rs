//! Static types of graph values: a dtype plus a shape whose dimensions may be
//! unknown (a function traced for `[-1, 784]` has `[?, 784]`).

use std::fmt;

use smallvec::SmallVec;
use tracejit_tensor::DType;

/// One dimension: `Some(n)` when known, `None` when any size is accepted.
pub type Dim = Option<usize>;

/// The dims of a shape; inline up to rank 4.
pub type Dims = SmallVec<[Dim; 4]>;

/// The dtype and (partially known) shape of a value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions; `None` is unknown.
    pub dims: Dims,
}

impl TensorType {
    /// A type with every dimension known.
    pub fn known(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType { dtype, dims: shape.iter().map(|&d| Some(d)).collect() }
    }

    /// A type from TF-style dims where `-1` means unknown.
    pub fn from_spec(dtype: DType, dims: &[i64]) -> TensorType {
        TensorType { dtype, dims: dims.iter().map(|&d| if d < 0 { None } else { Some(d as usize) }).collect() }
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The concrete shape if every dimension is known.
    pub fn shape(&self) -> Option<Vec<usize>> {
        self.dims.iter().copied().collect()
    }

    /// Number of elements if known; `None` also when the count overflows
    /// `usize` (inference rejects such types, see [`crate::infer`]).
    pub fn num_elements(&self) -> Option<usize> {
        if self.dims.iter().any(|d| d.is_none()) {
            return None;
        }
        if self.dims.contains(&Some(0)) {
            return Some(0);
        }
        self.dims.iter().try_fold(1usize, |acc, d| d.and_then(|d| acc.checked_mul(d)))
    }

    /// True when a concrete value of `dtype` and `shape` fits this type.
    pub fn accepts(&self, dtype: DType, shape: &[usize]) -> bool {
        self.dtype == dtype
            && self.dims.len() == shape.len()
            && self.dims.iter().zip(shape).all(|(d, &s)| d.is_none_or(|d| d == s))
    }

    /// True when every value of `other` fits this type.
    pub fn is_compatible_with(&self, other: &TensorType) -> bool {
        self.dtype == other.dtype
            && self.dims.len() == other.dims.len()
            && self.dims.iter().zip(&other.dims).all(|(a, b)| a.is_none() || a == b)
    }
}

/// Writes dims as `[2, ?, 784]`.
pub struct DimsDisplay<'a>(pub &'a [Dim]);

impl fmt::Display for DimsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Some(n) => write!(f, "{n}")?,
                None => f.write_str("?")?,
            }
        }
        f.write_str("]")
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, DimsDisplay(&self.dims))
    }
}
