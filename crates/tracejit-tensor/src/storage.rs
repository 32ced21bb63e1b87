//! `Storage`: the value of an eager tensor. One variant per dtype, each an
//! `ArcArray` so a clone is O(1) and shares the buffer; kernels that write make
//! a fresh array (copy-on-write is ndarray's when a buffer is shared).

use ndarray::{ArcArray, ArrayD, IxDyn};

use crate::{DType, Element, TensorError};

/// An n-dimensional array of one of the thirteen dtypes, cheaply cloneable.
#[derive(Clone, Debug)]
pub enum Storage {
    /// f32 elements.
    F32(ArcArray<f32, IxDyn>),
    /// f64 elements.
    F64(ArcArray<f64, IxDyn>),
    /// i32 elements.
    I32(ArcArray<i32, IxDyn>),
    /// i64 elements.
    I64(ArcArray<i64, IxDyn>),
    /// bool elements.
    Bool(ArcArray<bool, IxDyn>),
    /// bf16 elements.
    BF16(ArcArray<half::bf16, IxDyn>),
    /// f16 elements.
    F16(ArcArray<half::f16, IxDyn>),
    /// i8 elements.
    I8(ArcArray<i8, IxDyn>),
    /// u8 elements.
    U8(ArcArray<u8, IxDyn>),
    /// i16 elements.
    I16(ArcArray<i16, IxDyn>),
    /// u16 elements.
    U16(ArcArray<u16, IxDyn>),
    /// u32 elements.
    U32(ArcArray<u32, IxDyn>),
    /// u64 elements.
    U64(ArcArray<u64, IxDyn>),
}

/// Runs `$body` with `$a` bound to the array inside `$s`, whatever its dtype.
/// The body must type-check for every element type.
#[macro_export]
macro_rules! with_array {
    ($s:expr, $a:ident => $body:expr) => {
        match $s {
            $crate::Storage::F32($a) => $body,
            $crate::Storage::F64($a) => $body,
            $crate::Storage::I32($a) => $body,
            $crate::Storage::I64($a) => $body,
            $crate::Storage::Bool($a) => $body,
            $crate::Storage::BF16($a) => $body,
            $crate::Storage::F16($a) => $body,
            $crate::Storage::I8($a) => $body,
            $crate::Storage::U8($a) => $body,
            $crate::Storage::I16($a) => $body,
            $crate::Storage::U16($a) => $body,
            $crate::Storage::U32($a) => $body,
            $crate::Storage::U64($a) => $body,
        }
    };
}

/// Conversion between a typed array and `Storage`, implemented for every
/// [`Element`] type.
pub trait StorageElement: Element {
    /// Wraps a typed array.
    fn wrap(a: ArcArray<Self, IxDyn>) -> Storage;
    /// Borrows the typed array if the dtype matches.
    fn unwrap_ref(s: &Storage) -> Option<&ArcArray<Self, IxDyn>>;
}

macro_rules! impl_storage_element {
    ($t:ty, $v:ident) => {
        impl StorageElement for $t {
            #[inline]
            fn wrap(a: ArcArray<Self, IxDyn>) -> Storage {
                Storage::$v(a)
            }
            #[inline]
            fn unwrap_ref(s: &Storage) -> Option<&ArcArray<Self, IxDyn>> {
                match s {
                    Storage::$v(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
impl_storage_element!(f32, F32);
impl_storage_element!(f64, F64);
impl_storage_element!(i32, I32);
impl_storage_element!(i64, I64);
impl_storage_element!(bool, Bool);
impl_storage_element!(half::bf16, BF16);
impl_storage_element!(half::f16, F16);
impl_storage_element!(i8, I8);
impl_storage_element!(u8, U8);
impl_storage_element!(i16, I16);
impl_storage_element!(u16, U16);
impl_storage_element!(u32, U32);
impl_storage_element!(u64, U64);

impl Storage {
    /// The dtype tag.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
            Storage::BF16(_) => DType::BF16,
            Storage::F16(_) => DType::F16,
            Storage::I8(_) => DType::I8,
            Storage::U8(_) => DType::U8,
            Storage::I16(_) => DType::I16,
            Storage::U16(_) => DType::U16,
            Storage::U32(_) => DType::U32,
            Storage::U64(_) => DType::U64,
        }
    }

    /// The shape (row-major dimension sizes).
    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds from a flat row-major vector.
    pub fn from_vec<T: StorageElement>(data: Vec<T>, shape: &[usize]) -> Result<Storage, TensorError> {
        let expected: usize = shape.iter().product();
        if data.len() != expected {
            return Err(TensorError::LengthMismatch { len: data.len(), shape: shape.to_vec(), expected });
        }
        let a = ArrayD::from_shape_vec(IxDyn(shape), data).expect("length checked above");
        Ok(T::wrap(a.into_shared()))
    }

    /// Wraps an owned ndarray.
    pub fn from_array<T: StorageElement>(a: ArrayD<T>) -> Storage {
        T::wrap(a.into_shared())
    }

    /// A rank-0 tensor.
    pub fn scalar<T: StorageElement>(v: T) -> Storage {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v).into_shared())
    }

    /// A tensor filled with `value` converted to `dtype` as `Element::from_f64` does.
    pub fn full(shape: &[usize], dtype: DType, value: f64) -> Storage {
        fn mk<T: StorageElement>(shape: &[usize], v: f64) -> Storage {
            T::wrap(ArrayD::from_elem(IxDyn(shape), T::from_f64(v)).into_shared())
        }
        match dtype {
            DType::F32 => mk::<f32>(shape, value),
            DType::F64 => mk::<f64>(shape, value),
            DType::I32 => mk::<i32>(shape, value),
            DType::I64 => mk::<i64>(shape, value),
            DType::Bool => mk::<bool>(shape, value),
            DType::BF16 => mk::<half::bf16>(shape, value),
            DType::F16 => mk::<half::f16>(shape, value),
            DType::I8 => mk::<i8>(shape, value),
            DType::U8 => mk::<u8>(shape, value),
            DType::I16 => mk::<i16>(shape, value),
            DType::U16 => mk::<u16>(shape, value),
            DType::U32 => mk::<u32>(shape, value),
            DType::U64 => mk::<u64>(shape, value),
        }
    }

    /// A rank-0 tensor of `dtype` holding `value` (converted as `from_f64`).
    ///
    /// Integers beyond 2^53 lose precision through f64; use [`Storage::scalar`]
    /// when that matters.
    pub fn scalar_of(dtype: DType, value: f64) -> Storage {
        Storage::full(&[], dtype, value)
    }

    /// Borrows the typed array, or `None` if `T` is not the dtype.
    pub fn array<T: StorageElement>(&self) -> Option<&ArcArray<T, IxDyn>> {
        T::unwrap_ref(self)
    }

    /// Copies the elements out in row-major order.
    pub fn to_vec<T: StorageElement>(&self) -> Result<Vec<T>, TensorError> {
        let a = self.typed::<T>()?;
        Ok(match a.as_slice() {
            Some(s) => s.to_vec(),
            None => crate::kernels::shape::row_major(a.view()),
        })
    }

    /// Copies into an owned ndarray.
    pub fn to_array<T: StorageElement>(&self) -> Result<ArrayD<T>, TensorError> {
        Ok(self.typed::<T>()?.to_owned())
    }

    fn typed<T: StorageElement>(&self) -> Result<&ArcArray<T, IxDyn>, TensorError> {
        T::unwrap_ref(self).ok_or(TensorError::DTypeMismatch { actual: self.dtype(), requested: T::DTYPE })
    }

    /// The value of element `i` (row-major) as f64; for tests and printing.
    pub fn get_f64(&self, index: &[usize]) -> f64 {
        with_array!(self, a => a[IxDyn(index)].to_f64())
    }

    /// True when the elements are laid out row-major and contiguous (the
    /// strides of a fresh array of this shape), so the buffer can be read as
    /// a flat slice. Views made by `transpose`, `slice` or `broadcast` often
    /// are not.
    pub fn is_standard_layout(&self) -> bool {
        with_array!(self, a => a.is_standard_layout())
    }

    /// This tensor in standard layout: a clone (sharing the buffer) if it
    /// already is, else a row-major contiguous copy.
    pub fn to_standard(&self) -> Storage {
        if self.is_standard_layout() {
            return self.clone();
        }
        with_array!(self, a => Storage::from_array(crate::kernels::shape::materialize(a.view())))
    }

    /// True for float elements that are all `+0.0` (a `-0.0` or an integer
    /// tensor is not): a base that adding to, or subtracting, leaves every
    /// value's bits as they are (the sparse-update passes test it).
    pub fn is_all_positive_zeros(&self) -> bool {
        match self {
            Storage::F32(a) => a.iter().all(|x| x.to_bits() == 0),
            Storage::F64(a) => a.iter().all(|x| x.to_bits() == 0),
            Storage::BF16(a) => a.iter().all(|x| x.to_bits() == 0),
            Storage::F16(a) => a.iter().all(|x| x.to_bits() == 0),
            _ => false,
        }
    }

    /// True when `self` and `other` are the same elements of the same buffer
    /// (dtype, shape, element pointer and strides): what a cache keyed by a
    /// value (a weight packed once per version) compares, holding a clone
    /// so that the buffer cannot be freed and reused meanwhile.
    pub fn same_elements(&self, other: &Storage) -> bool {
        fn at(s: &Storage) -> (usize, &[isize]) {
            with_array!(s, x => (x.as_ptr() as usize, x.strides()))
        }
        self.dtype() == other.dtype() && self.shape() == other.shape() && at(self) == at(other)
    }

    /// Bitwise equality of shape, dtype and every element (NaN equals NaN with
    /// the same bits); what tests mean by "exactly the same result".
    pub fn bit_eq(&self, other: &Storage) -> bool {
        if self.dtype() != other.dtype() || self.shape() != other.shape() {
            return false;
        }
        match (self, other) {
            (Storage::F32(a), Storage::F32(b)) => a.iter().zip(b.iter()).all(|(x, y)| x.to_bits() == y.to_bits()),
            (Storage::F64(a), Storage::F64(b)) => a.iter().zip(b.iter()).all(|(x, y)| x.to_bits() == y.to_bits()),
            (Storage::I32(a), Storage::I32(b)) => a == b,
            (Storage::I64(a), Storage::I64(b)) => a == b,
            (Storage::I8(a), Storage::I8(b)) => a == b,
            (Storage::U8(a), Storage::U8(b)) => a == b,
            (Storage::I16(a), Storage::I16(b)) => a == b,
            (Storage::U16(a), Storage::U16(b)) => a == b,
            (Storage::U32(a), Storage::U32(b)) => a == b,
            (Storage::U64(a), Storage::U64(b)) => a == b,
            (Storage::Bool(a), Storage::Bool(b)) => a == b,
            (Storage::BF16(a), Storage::BF16(b)) => a.iter().zip(b.iter()).all(|(x, y)| x.to_bits() == y.to_bits()),
            (Storage::F16(a), Storage::F16(b)) => a.iter().zip(b.iter()).all(|(x, y)| x.to_bits() == y.to_bits()),
            _ => false,
        }
    }
}
