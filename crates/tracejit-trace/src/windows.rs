//! The `Tensor` methods of the indexing, window, scan and random ops the
//! third milestone adds — what attention models, KV caches and samplers are
//! built from: `scatter_add` / `gather_elements`, `dynamic_slice` /
//! `dynamic_update_slice`, `pad`, `cumsum`, `top_k`, and the random draws
//! `random` / `random_like` that `tracejit::random` builds its generators
//! on. Each runs eagerly or records a node, and has a gradient.

use tracejit_ir::{DimsDisplay, Op};
use tracejit_tensor::{DType, RandomDist};

use crate::interpreters::apply;
use crate::Tensor;

/// `axis` (negative counts from the end) as an index below `rank`.
#[track_caller]
fn axis(op: &str, t: &Tensor, axis: i64) -> usize {
    let rank = t.rank() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        panic!("{op}: axis {axis} is out of range for a {}{} tensor", t.dtype(), DimsDisplay(&t.dims()));
    }
    a as usize
}

#[track_caller]
fn one(op: Op, inputs: &[&Tensor]) -> Tensor {
    apply(op, inputs).into_iter().next().expect("op has an output")
}

impl Tensor {
    /// A copy of `self` with `updates` added at `indices` along `axis`, as
    /// ONNX ScatterElements with `reduction="add"` and `torch.scatter_add`:
    /// for each position `p` of the updates, `out[p with p[axis] =
    /// indices[p]] += updates[p]`. `indices` (i32 or i64; negative counts
    /// from the end) broadcast against `updates`, which have `self`'s rank
    /// and are no larger on the other axes; duplicates sum. An out-of-range
    /// index panics (eagerly) or fails the call (traced).
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let table = Tensor::zeros(&[3, 2], DType::F32);
    /// let ids = Tensor::from_vec(vec![2i64, 0, 2], &[3, 1]); // a column: whole rows
    /// let rows = Tensor::ones(&[3, 2], DType::F32);
    /// let y = table.scatter_add(0, &ids, &rows);
    /// assert_eq!(y.to_vec::<f32>()?, [1.0, 1.0, 0.0, 0.0, 2.0, 2.0]);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    #[track_caller]
    pub fn scatter_add(&self, axis_: i64, indices: &Tensor, updates: &Tensor) -> Tensor {
        let a = axis("scatter_add", self, axis_);
        one(Op::ScatterAdd { axis: a }, &[self, indices, updates])
    }

    /// `self` read at `indices` along `axis` (ONNX GatherElements,
    /// `torch.gather`, numpy's `take_along_axis`): the result has the
    /// indices' shape, `out[p] = self[p with p[axis] = indices[p]]`. The
    /// adjoint of [`Tensor::scatter_add`].
    #[track_caller]
    pub fn gather_elements(&self, axis_: i64, indices: &Tensor) -> Tensor {
        let a = axis("gather_elements", self, axis_);
        one(Op::GatherElements { axis: a }, &[self, indices])
    }

    /// The window of `sizes` starting at `starts` (an i32/i64 vector, one
    /// start per axis, which may be a traced value), each start clamped into
    /// `[0, dim - size]` as XLA's DynamicSlice does, so the window always
    /// has `sizes` and stays in bounds.
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec((0..12).collect::<Vec<i64>>(), &[3, 4]);
    /// let starts = Tensor::from_vec(vec![2i64, 3], &[2]); // clamped to [1, 2]
    /// assert_eq!(x.dynamic_slice(&starts, &[2, 2]).to_vec::<i64>()?, [6, 7, 10, 11]);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &Tensor, sizes: &[usize]) -> Tensor {
        one(Op::DynamicSlice { sizes: sizes.to_vec() }, &[self, starts])
    }

    /// A copy of `self` with the window at `starts` replaced by `update`
    /// (starts clamped as in [`Tensor::dynamic_slice`]): the write of a
    /// KV cache inside a loop.
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let cache = Tensor::zeros(&[4, 2], DType::F32);
    /// let row = Tensor::ones(&[1, 2], DType::F32);
    /// let at = Tensor::from_vec(vec![1i64, 0], &[2]);
    /// let y = cache.dynamic_update_slice(&row, &at);
    /// assert_eq!(y.to_vec::<f32>()?, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &Tensor) -> Tensor {
        one(Op::DynamicUpdateSlice, &[self, update, starts])
    }

    /// `self` with `pads[i] = (before, after)` elements of `value` (converted
    /// to the dtype) added on axis `i`; one pair per axis.
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]);
    /// let y = x.pad(&[(1, 0), (0, 1)], 0.0);
    /// assert_eq!((y.shape(), y.to_vec::<f32>()?), (&[2usize, 3][..], vec![0.0, 0.0, 0.0, 1.0, 2.0, 0.0]));
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Tensor {
        one(Op::Pad { pads: pads.to_vec(), value }, &[self])
    }

    /// Inclusive prefix sums along `axis` (negative counts from the end),
    /// accumulated in index order in the element type (integers wrap).
    #[track_caller]
    pub fn cumsum(&self, axis_: i64) -> Tensor {
        let a = axis("cumsum", self, axis_);
        one(Op::Cumsum { axis: a }, &[self])
    }

    /// The `k` largest entries along the last axis, largest first, and
    /// their indices (i64): NaN counts above every number and equal values
    /// keep index order (as `torch.topk` and `jax.lax.top_k`).
    ///
    /// ```
    /// use tracejit_trace::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![0.5f32, 3.0, -1.0, 3.0], &[4]);
    /// let (values, indices) = x.top_k(2);
    /// assert_eq!((values.to_vec::<f32>()?, indices.to_vec::<i64>()?), (vec![3.0, 3.0], vec![1, 3]));
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    #[track_caller]
    pub fn top_k(&self, k: usize) -> (Tensor, Tensor) {
        let mut out = apply(Op::TopK { k }, &[self]).into_iter();
        let values = out.next().expect("top_k has two outputs");
        (values, out.next().expect("top_k has two outputs"))
    }

    /// A random draw of `shape` and `dtype` (f32 or f64) from the Philox
    /// stream of `state`: an i64 `[counter_lo, counter_hi, key]` (what a
    /// `tracejit::random::Generator` holds) or an i64 `[2]` seed (standing
    /// for `[0, seed[1], seed[0]]`). Element `i` is a function of the state
    /// and `i` only, so eager, interpreted and compiled draws, at any
    /// thread count, give the same bits. A pure function of `state`: the
    /// generators advance their state themselves.
    #[track_caller]
    pub fn random(dist: RandomDist, state: &Tensor, shape: &[usize], dtype: DType) -> Tensor {
        one(Op::Random { dist, dtype, shape: Some(shape.to_vec()) }, &[state])
    }

    /// [`Tensor::random`] of `like`'s shape (dims unknown in the trace
    /// allowed; `like`'s values are not read).
    #[track_caller]
    pub fn random_like(dist: RandomDist, state: &Tensor, like: &Tensor, dtype: DType) -> Tensor {
        one(Op::Random { dist, dtype, shape: None }, &[state, like])
    }
}
