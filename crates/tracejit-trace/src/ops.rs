//! The op methods of `Tensor`, with numpy/TF names. Each builds an IR `Op`
//! and hands it to `interpreters::apply`, so the same call runs eagerly or records
//! a node while tracing. Axes may be negative (counted from the end).

use std::borrow::Borrow;

use tracejit_ir::{DimsDisplay, Op};
use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};

use crate::interpreters::apply;
use crate::Tensor;

/// A Rust number usable as an operand next to a tensor; it takes the
/// tensor's dtype (weak typing, as in JAX).
pub trait Scalar: Copy + Send + Sync + 'static {
    /// A rank-0 storage of `dtype` holding this value. Panics if the value
    /// cannot be represented (0.5 as an integer, 1e10 as i32, any number as bool).
    fn to_storage(self, dtype: DType, op: &str) -> Storage;
}

fn float_to_storage(v: f64, dtype: DType, op: &str) -> Storage {
    match dtype {
        DType::F32 => Storage::scalar(v as f32),
        DType::F64 => Storage::scalar(v),
        // Weakly typed, as in JAX: the scalar is rounded to the tensor's dtype.
        DType::BF16 | DType::F16 => Storage::full(&[], dtype, v),
        DType::I32 if v.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&v) => Storage::scalar(v as i32),
        // 2^63 itself is out of range, hence the half-open interval.
        DType::I64 if v.fract() == 0.0 && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&v) => {
            Storage::scalar(v as i64)
        }
        // The other integers: a whole number in range (every bound is
        // exact in f64 but u64's largest, hence the half-open interval).
        d if d.is_int()
            && v.fract() == 0.0
            && d.int_range().is_some_and(|(lo, hi)| v >= lo as f64 && v < hi as f64 + 1.0) =>
        {
            Storage::full(&[], d, v)
        }
        _ => panic!("{op}: the scalar {v} cannot be represented as {dtype}; cast the tensor or the scalar"),
    }
}

fn int_to_storage(v: i64, dtype: DType, op: &str) -> Storage {
    match dtype {
        DType::F32 => Storage::scalar(v as f32),
        DType::F64 => Storage::scalar(v as f64),
        DType::BF16 | DType::F16 => Storage::full(&[], dtype, v as f64),
        DType::I32 => match i32::try_from(v) {
            Ok(v) => Storage::scalar(v),
            Err(_) => panic!("{op}: the scalar {v} does not fit in i32"),
        },
        DType::I64 => Storage::scalar(v),
        DType::Bool => panic!("{op}: a number cannot be combined with a bool tensor; use a bool tensor"),
        DType::U64 => match u64::try_from(v) {
            Ok(v) => Storage::scalar(v),
            Err(_) => panic!("{op}: the scalar {v} does not fit in u64"),
        },
        d => match d.int_range() {
            Some((lo, hi)) if (lo..=hi).contains(&i128::from(v)) => Storage::full(&[], d, v as f64),
            _ => panic!("{op}: the scalar {v} does not fit in {d}"),
        },
    }
}

impl Scalar for f32 {
    fn to_storage(self, dtype: DType, op: &str) -> Storage {
        if dtype == DType::F32 {
            return Storage::scalar(self);
        }
        float_to_storage(self as f64, dtype, op)
    }
}
impl Scalar for f64 {
    fn to_storage(self, dtype: DType, op: &str) -> Storage {
        float_to_storage(self, dtype, op)
    }
}
impl Scalar for i32 {
    fn to_storage(self, dtype: DType, op: &str) -> Storage {
        int_to_storage(self as i64, dtype, op)
    }
}
impl Scalar for i64 {
    fn to_storage(self, dtype: DType, op: &str) -> Storage {
        int_to_storage(self, dtype, op)
    }
}
impl Scalar for bool {
    fn to_storage(self, dtype: DType, op: &str) -> Storage {
        match dtype {
            DType::Bool => Storage::scalar(self),
            _ => panic!("{op}: a bool scalar cannot be combined with a {dtype} tensor; cast one of them"),
        }
    }
}

/// The right-hand side of a binary op method: a tensor (owned or borrowed)
/// or a [`Scalar`].
pub trait Operand {
    /// This operand as a tensor, scalars taking the dtype of `like`.
    fn into_tensor(self, like: &Tensor, op: &str) -> Tensor;
}

impl Operand for Tensor {
    fn into_tensor(self, _like: &Tensor, _op: &str) -> Tensor {
        self
    }
}
impl Operand for &Tensor {
    fn into_tensor(self, _like: &Tensor, _op: &str) -> Tensor {
        self.clone()
    }
}
impl<S: Scalar> Operand for S {
    fn into_tensor(self, like: &Tensor, op: &str) -> Tensor {
        Tensor::from_storage(self.to_storage(like.dtype(), op))
    }
}

/// Normalizes a possibly negative axis against `rank` (or `rank + 1` for ops
/// that insert an axis), panicking with the op and shape when out of range.
#[track_caller]
fn axis(op: &str, t: &Tensor, axis: i64, extra: usize) -> usize {
    let rank = t.rank() + extra;
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        panic!(
            "{op}: axis {axis} is out of range for a {}{} tensor (rank {})",
            t.dtype(),
            DimsDisplay(&t.dims()),
            t.rank()
        );
    }
    a as usize
}

#[track_caller]
fn axes(op: &str, t: &Tensor, list: &[i64]) -> Vec<usize> {
    let mut v: Vec<usize> = list.iter().map(|&a| axis(op, t, a, 0)).collect();
    v.sort_unstable();
    let n = v.len();
    v.dedup();
    if v.len() != n {
        panic!("{op}: axes {list:?} name the same axis twice");
    }
    v
}

#[track_caller]
fn one(op: Op, inputs: &[&Tensor]) -> Tensor {
    apply(op, inputs).into_iter().next().expect("op has an output")
}

// The op methods are generated from the op tables of tracejit-tensor
// (`for_each_*_op!`), so a new row there is a new method here, with its docs.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $op:ident $name:ident: $kind:ident, $cost:ident, $exact:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    one(Op::Unary(UnaryOp::$op), &[self])
                }
            )*
        }
    };
}

tracejit_tensor::for_each_unary_op!(unary_methods);

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $op:ident $name:ident: $kind:ident, $cost:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: impl Operand) -> Tensor {
                    let other = other.into_tensor(self, BinaryOp::$op.name());
                    one(Op::Binary(BinaryOp::$op), &[self, &other])
                }
            )*
        }
    };
}

tracejit_tensor::for_each_binary_op!(binary_methods);

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $op:ident $name:ident, $all:ident: $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// `axes` may be negative; an empty list reduces nothing (as numpy's `axis=()`).
                #[track_caller]
                pub fn $name(&self, axes_list: &[i64], keepdims: bool) -> Tensor {
                    let axes = axes(ReduceOp::$op.name(), self, axes_list);
                    one(Op::Reduce { op: ReduceOp::$op, axes, keepdims }, &[self])
                }

                #[doc = concat!("`", stringify!($name), "` over every axis, to a scalar.")]
                #[track_caller]
                pub fn $all(&self) -> Tensor {
                    let axes = (0..self.rank()).collect();
                    one(Op::Reduce { op: ReduceOp::$op, axes, keepdims: false }, &[self])
                }
            )*
        }
    };
}

tracejit_tensor::for_each_reduce_op!(reduce_methods);

impl Tensor {
    /// Index (i64) of the largest element along `axis`; the first wins ties,
    /// the first NaN wins over numbers.
    #[track_caller]
    pub fn argmax(&self, axis_: i64, keepdims: bool) -> Tensor {
        let a = axis("argmax", self, axis_, 0);
        one(Op::ArgReduce { op: ArgReduceOp::ArgMax, axis: a, keepdims }, &[self])
    }

    /// Index (i64) of the smallest element along `axis`.
    #[track_caller]
    pub fn argmin(&self, axis_: i64, keepdims: bool) -> Tensor {
        let a = axis("argmin", self, axis_, 0);
        one(Op::ArgReduce { op: ArgReduceOp::ArgMin, axis: a, keepdims }, &[self])
    }

    /// `cond ? a : b` elementwise, broadcasting all three.
    #[track_caller]
    pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        one(Op::Select, &[cond, a, b])
    }

    /// numpy's name for [`Tensor::select`].
    #[track_caller]
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        Tensor::select(cond, a, b)
    }

    /// Converts to `dtype` (floats to ints truncate and saturate, NaN to 0;
    /// numbers to bool are `x != 0`).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        one(Op::Cast { to: dtype }, &[self])
    }

    /// Clamps into `[min, max]` (NaN stays NaN).
    #[track_caller]
    pub fn clamp(&self, min: f64, max: f64) -> Tensor {
        one(Op::Clamp { min, max }, &[self])
    }

    /// Matrix product over the last two axes, batch axes broadcast.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        one(Op::MatMul, &[self, other])
    }

    /// [`Tensor::matmul`] accumulated and returned in `acc` (F32 or F64):
    /// `bf16 x bf16 -> f32` keeps the f32 sums where `matmul` would round
    /// them back to bf16. Widening is exact, so this is `matmul` of the
    /// operands cast to `acc`; inside a compiled function the JIT runs it
    /// on the bf16 GEMM (`vdpbf16ps` where the CPU has it) without the
    /// widened copies. Gradients flow back in the operands' dtype.
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let a = Tensor::from_vec(vec![1.0f32, 1.0 / 512.0], &[1, 2]).cast(DType::BF16);
    /// let b = Tensor::from_vec(vec![1.0f32, 1.0], &[2, 1]).cast(DType::BF16);
    /// let c = a.matmul_acc(&b, DType::F32);
    /// assert_eq!(c.dtype(), DType::F32);
    /// assert_eq!(c.to_vec::<f32>()?, [1.0 + 1.0 / 512.0]); // bf16 would round to 1
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    ///
    /// # Panics
    /// If the operands' dtypes differ, or `acc` is not a float at least as
    /// wide as them (F32 for BF16, F16 and F32; F64 for any float).
    #[track_caller]
    pub fn matmul_acc(&self, other: &Tensor, acc: DType) -> Tensor {
        let d = self.dtype();
        if d != other.dtype() {
            panic!("matmul_acc: operands have different dtypes ({d} and {})", other.dtype());
        }
        let ok = match acc {
            DType::F32 => matches!(d, DType::F32 | DType::BF16 | DType::F16),
            DType::F64 => d.is_float(),
            _ => false,
        };
        if !ok {
            panic!(
                "matmul_acc: cannot accumulate {d} operands in {acc} (the accumulator is f32 or f64, at least as wide)"
            );
        }
        self.cast(acc).matmul(&other.cast(acc))
    }

    /// Same elements in a new shape; one entry may be `-1`.
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        one(Op::Reshape { shape: shape.to_vec() }, &[self])
    }

    /// Permutes the axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[i64]) -> Tensor {
        let perm: Vec<usize> = perm.iter().map(|&a| axis("transpose", self, a, 0)).collect();
        one(Op::Transpose { perm }, &[self])
    }

    /// Swaps the last two axes.
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let r = self.rank();
        assert!(r >= 2, "t: needs a tensor of rank 2 or more, got rank {r}");
        let mut perm: Vec<i64> = (0..r as i64).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(&perm)
    }

    /// Broadcasts to `shape` (numpy rules).
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Tensor {
        one(Op::BroadcastTo { shape: shape.to_vec() }, &[self])
    }

    /// Inserts a size-1 axis at `axis` (of the result; may be negative).
    #[track_caller]
    pub fn expand_dims(&self, axis_: i64) -> Tensor {
        let a = axis("expand_dims", self, axis_, 1);
        one(Op::ExpandDims { axis: a }, &[self])
    }

    /// Removes the listed size-1 axes; an empty list removes every size-1 axis.
    #[track_caller]
    pub fn squeeze(&self, axes_list: &[i64]) -> Tensor {
        let axes = if axes_list.is_empty() {
            self.dims().iter().enumerate().filter(|(_, d)| **d == Some(1)).map(|(i, _)| i).collect()
        } else {
            axes("squeeze", self, axes_list)
        };
        one(Op::Squeeze { axes }, &[self])
    }

    /// Joins tensors along an existing axis.
    #[track_caller]
    pub fn concat<T: Borrow<Tensor>>(tensors: &[T], axis_: i64) -> Tensor {
        assert!(!tensors.is_empty(), "concat: needs at least one tensor");
        let refs: Vec<&Tensor> = tensors.iter().map(|t| t.borrow()).collect();
        let a = axis("concat", refs[0], axis_, 0);
        one(Op::Concat { axis: a }, &refs)
    }

    /// Joins tensors of one shape along a new axis.
    #[track_caller]
    pub fn stack<T: Borrow<Tensor>>(tensors: &[T], axis_: i64) -> Tensor {
        assert!(!tensors.is_empty(), "stack: needs at least one tensor");
        let refs: Vec<&Tensor> = tensors.iter().map(|t| t.borrow()).collect();
        let a = axis("stack", refs[0], axis_, 1);
        one(Op::Stack { axis: a }, &refs)
    }

    /// numpy basic slicing: one [`SliceSpec`] per leading axis (missing
    /// trailing axes are taken whole).
    #[track_caller]
    pub fn slice(&self, specs: &[SliceSpec]) -> Tensor {
        assert!(specs.len() <= self.rank(), "slice: {} specs for a tensor of rank {}", specs.len(), self.rank());
        let mut all = specs.to_vec();
        all.resize(self.rank(), SliceSpec::FULL);
        one(Op::Slice { specs: all }, &[self])
    }

    /// `start..stop` (step 1) along one axis, the other axes whole.
    #[track_caller]
    pub fn slice_axis(&self, axis_: i64, start: i64, stop: i64) -> Tensor {
        let a = axis("slice", self, axis_, 0);
        let mut specs = vec![SliceSpec::FULL; self.rank()];
        specs[a] = SliceSpec::range(start, stop);
        one(Op::Slice { specs }, &[self])
    }

    /// Entries of `self` along `axis` picked by the integer tensor `indices`.
    #[track_caller]
    pub fn gather(&self, indices: &Tensor, axis_: i64) -> Tensor {
        let a = axis("gather", self, axis_, 0);
        one(Op::Gather { axis: a }, &[self, indices])
    }

    /// One-hot encoding of integer indices along a new last axis.
    #[track_caller]
    pub fn one_hot(&self, depth: usize, dtype: DType) -> Tensor {
        one(Op::OneHot { depth, dtype }, &[self])
    }
}
