//! `Tensor`: the one tensor type users see. It is either eager (a value in
//! `Storage`, computed at once) or symbolic (a value of a graph being traced).
//! Ops have the same API in both states, which is what lets one closure run
//! eagerly and as a graph. Clones are O(1).

use std::fmt;
use std::sync::Arc;

use ndarray::{Array, ArrayD, Dimension};
use tracejit_ir::{DimsDisplay, TensorType, ValueId};
use tracejit_tensor::{kernels, DType, Storage, StorageElement};

use crate::{context, Error, Result};

/// A tensor: eager (holds its value) or symbolic (stands for a value of a
/// graph being traced). Ops are methods with numpy/TF names, and `+ - * /`
/// work on `Tensor` and `&Tensor` with scalars on either side (a scalar
/// takes the tensor's dtype). Misuse panics naming the op, dtypes and
/// shapes; clones are O(1).
///
/// ```
/// use tracejit_trace::{DType, Tensor};
///
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2]);
/// let y = (&x * 0.5).relu() + 1.0;
/// assert_eq!(y.shape(), [2, 2]);
/// assert_eq!(y.to_vec::<f32>()?, [1.5, 1.0, 2.5, 1.0]);
/// assert_eq!(x.sum(&[1], false).to_vec::<f32>()?, [-1.0, -1.0]);
/// assert_eq!(x.matmul(&Tensor::ones(&[2, 1], DType::F32)).shape(), [2, 1]);
/// assert_eq!(x.cast(DType::I64).dtype(), DType::I64);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    repr: Repr,
    /// Identity for gradient tapes: clones share it, every op result gets
    /// a new one (see `crate::tape::next_id`).
    id: u64,
}

#[derive(Clone)]
pub(crate) enum Repr {
    Eager(Storage),
    Symbolic(Arc<Symbolic>),
}

pub(crate) struct Symbolic {
    pub ctx: u64,
    pub value: ValueId,
    pub ty: TensorType,
    pub shape: Option<Vec<usize>>,
    pub fn_name: Arc<str>,
}

impl Tensor {
    pub(crate) fn from_storage(s: Storage) -> Tensor {
        Tensor { repr: Repr::Eager(s), id: crate::tape::next_id() }
    }

    pub(crate) fn symbolic(ctx: u64, value: ValueId, ty: TensorType, fn_name: Arc<str>) -> Tensor {
        let shape = ty.shape();
        Tensor {
            repr: Repr::Symbolic(Arc::new(Symbolic { ctx, value, ty, shape, fn_name })),
            id: crate::tape::next_id(),
        }
    }

    /// The same value under a new tape identity: a result the tapes tell
    /// apart from the tensor it was made from (a custom gradient's output).
    pub(crate) fn with_new_id(&self) -> Tensor {
        Tensor { repr: self.repr.clone(), id: crate::tape::next_id() }
    }

    pub(crate) fn repr(&self) -> &Repr {
        &self.repr
    }

    /// The identity gradient tapes track this value by.
    pub(crate) fn tape_id(&self) -> u64 {
        self.id
    }

    pub(crate) fn same_symbolic(&self, other: &Tensor) -> bool {
        match (&self.repr, &other.repr) {
            (Repr::Symbolic(a), Repr::Symbolic(b)) => a.ctx == b.ctx && a.value == b.value,
            _ => false,
        }
    }

    #[track_caller]
    pub(crate) fn eager_storage(&self) -> &Storage {
        match &self.repr {
            Repr::Eager(s) => s,
            Repr::Symbolic(s) => panic!("{}", Error::SymbolicValue { function: s.fn_name.to_string() }),
        }
    }

    /// The value, if the tensor is eager; `Err` (naming the function being
    /// traced) if it is symbolic.
    pub fn storage(&self) -> Result<&Storage> {
        match &self.repr {
            Repr::Eager(s) => Ok(s),
            Repr::Symbolic(s) => Err(Error::SymbolicValue { function: s.fn_name.to_string() }),
        }
    }

    /// Wraps a `Storage` (for crates building on tracejit).
    pub fn from_raw_storage(s: Storage) -> Tensor {
        Tensor::from_storage(s)
    }

    // ---- constructors ---------------------------------------------------

    /// A tensor from row-major data. Panics if `data.len()` is not the
    /// product of `shape`.
    #[track_caller]
    pub fn from_vec<T: StorageElement>(data: Vec<T>, shape: &[usize]) -> Tensor {
        match Storage::from_vec(data, shape) {
            Ok(s) => Tensor::from_storage(s),
            Err(e) => panic!("from_vec: {e}"),
        }
    }

    /// A tensor from an ndarray of any dimensionality.
    pub fn from_array<T: StorageElement, D: Dimension>(a: Array<T, D>) -> Tensor {
        Tensor::from_storage(Storage::from_array(a.into_dyn()))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: StorageElement>(v: T) -> Tensor {
        Tensor::from_storage(Storage::scalar(v))
    }

    /// All zeros. Panics, naming the shape, if it is too large to allocate.
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        check_new("zeros", dtype, shape);
        Tensor::from_storage(Storage::full(shape, dtype, 0.0))
    }

    /// All ones. Panics, naming the shape, if it is too large to allocate.
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType) -> Tensor {
        check_new("ones", dtype, shape);
        Tensor::from_storage(Storage::full(shape, dtype, 1.0))
    }

    /// Every element `value` (converted to `dtype`). Panics, naming the
    /// shape, if it is too large to allocate.
    #[track_caller]
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Tensor {
        check_new("full", dtype, shape);
        Tensor::from_storage(Storage::full(shape, dtype, value))
    }

    /// A zero tensor with the dtype and shape of `like`.
    #[track_caller]
    pub fn zeros_like(like: &Tensor) -> Tensor {
        Tensor::zeros(like.shape(), like.dtype())
    }

    /// `[start, start + step, ...)` below `stop`, as numpy's `arange`.
    #[track_caller]
    pub fn arange(start: f64, stop: f64, step: f64, dtype: DType) -> Tensor {
        assert!(step != 0.0, "arange: step must not be 0");
        let count = ((stop - start) / step).ceil();
        if count.is_finite() && count > 0.0 {
            // Saturating: a count beyond usize is refused like any huge shape.
            check_new("arange", dtype, &[count as usize]);
        }
        Tensor::from_storage(kernels::arange(start, stop, step, dtype))
    }

    /// f32 standard normal samples; the same `seed` gives the same values on
    /// every machine and thread count.
    #[track_caller]
    pub fn randn(shape: &[usize], seed: u64) -> Tensor {
        check_new("randn", DType::F32, shape);
        Tensor::from_storage(kernels::randn(shape, seed, DType::F32))
    }

    /// f32 samples uniform in `[low, high)`, reproducible by `seed`.
    #[track_caller]
    pub fn rand_uniform(shape: &[usize], low: f64, high: f64, seed: u64) -> Tensor {
        check_new("rand_uniform", DType::F32, shape);
        Tensor::from_storage(kernels::rand_uniform(shape, low, high, seed, DType::F32))
    }

    // ---- accessors ------------------------------------------------------

    /// The shape. Panics on a traced tensor with an unknown dimension (see
    /// [`Tensor::dims`]).
    #[track_caller]
    pub fn shape(&self) -> &[usize] {
        match &self.repr {
            Repr::Eager(s) => s.shape(),
            Repr::Symbolic(s) => match &s.shape {
                Some(shape) => shape,
                None => panic!(
                    "shape: this traced tensor of function `{}` has unknown dimensions {}; use `dims()`",
                    s.fn_name,
                    DimsDisplay(&s.ty.dims)
                ),
            },
        }
    }

    /// The dimensions, `None` where a traced tensor's size is unknown.
    pub fn dims(&self) -> Vec<Option<usize>> {
        match &self.repr {
            Repr::Eager(s) => s.shape().iter().map(|&d| Some(d)).collect(),
            Repr::Symbolic(s) => s.ty.dims.to_vec(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.repr {
            Repr::Eager(s) => s.dtype(),
            Repr::Symbolic(s) => s.ty.dtype,
        }
    }

    /// The dtype and (possibly partial) shape.
    pub fn tensor_type(&self) -> TensorType {
        match &self.repr {
            Repr::Eager(s) => TensorType::known(s.dtype(), s.shape()),
            Repr::Symbolic(s) => s.ty.clone(),
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        match &self.repr {
            Repr::Eager(s) => s.rank(),
            Repr::Symbolic(s) => s.ty.rank(),
        }
    }

    /// Number of elements (the product of the shape).
    #[track_caller]
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// True when the tensor has no elements.
    #[track_caller]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True while the tensor stands for a value of a graph being traced.
    pub fn is_symbolic(&self) -> bool {
        matches!(self.repr, Repr::Symbolic(_))
    }

    /// The elements in row-major order. `Err` if `T` is not the dtype or the
    /// tensor is symbolic.
    pub fn to_vec<T: StorageElement>(&self) -> Result<Vec<T>> {
        Ok(self.storage()?.to_vec::<T>()?)
    }

    /// The value as an ndarray. `Err` if `T` is not the dtype or the tensor
    /// is symbolic.
    pub fn to_array<T: StorageElement>(&self) -> Result<ArrayD<T>> {
        Ok(self.storage()?.to_array::<T>()?)
    }

    /// The single element of a one-element tensor.
    pub fn to_scalar<T: StorageElement>(&self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::NotAScalar { elements: v.len() }),
        }
    }
}

/// Panics, naming the constructor, unless a `dtype` tensor of `shape` can
/// be allocated (a huge shape would otherwise abort the process).
#[track_caller]
fn check_new(op: &str, dtype: DType, shape: &[usize]) {
    if let Err(e) = tracejit_tensor::check_allocation(dtype, shape) {
        match context::current_function() {
            Some(f) => panic!("{op}: {e} (while tracing function `{f}`, at {})", std::panic::Location::caller()),
            None => panic!("{op}: {e}"),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Eager(s) => {
                write!(f, "Tensor({}{:?}, ", s.dtype(), s.shape())?;
                tracejit_tensor::with_array!(s, a => write!(f, "{a}"))?;
                f.write_str(")")
            }
            Repr::Symbolic(s) => write!(f, "Tensor(symbolic {} {} in `{}`)", s.value, s.ty, s.fn_name),
        }
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Eager(s) => tracejit_tensor::with_array!(s, a => write!(f, "{a}")),
            Repr::Symbolic(_) => fmt::Debug::fmt(self, f),
        }
    }
}

impl From<Storage> for Tensor {
    fn from(s: Storage) -> Tensor {
        Tensor::from_storage(s)
    }
}
