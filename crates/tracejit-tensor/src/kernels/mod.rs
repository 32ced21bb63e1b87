//! The reference kernel of every primitive op, over [`Storage`].
//!
//! These kernels are the oracle of tracejit: eager mode runs them, the graph
//! interpreter runs them node by node, and every JIT kernel is tested against
//! them. They favour obviously-right code over speed, but use ndarray's
//! vectorized paths where that costs no clarity.
//!
//! Preconditions (dtype and shape compatibility) are checked by the caller
//! through the IR's type rules, which produce the user-facing panic message;
//! a kernel given operands that violate them panics with a plain message
//! (never undefined behaviour). Kernels may return arrays that are not in
//! standard (row-major contiguous) layout (a transpose or a slice is a view of
//! its input's buffer); use [`Storage::to_standard`] when a contiguous buffer
//! is needed.
//!
//! Every kernel handles empty tensors (a 0-sized dimension), rank-0 scalars
//! and size-1 broadcasting.
//!
//! # Elementwise semantics
//!
//! Output dtypes follow [`UnaryOp::result_dtype`] and
//! [`BinaryOp::result_dtype`]; a kernel given a dtype those reject panics.
//!
//! The narrow integers (i8, u8, i16, u16, u32) compute natively in their
//! width with the same wrapping rules, which equals computing in their
//! [`DType::compute`] dtype and wrapping the result back (what the JIT
//! does); unsigned ones compare, divide, and take max and min unsigned.
//!
//! **Unary.**
//! - Integers wrap: `neg(i32::MIN) == i32::MIN`, `abs(i32::MIN) == i32::MIN`,
//!   `square` is a wrapping multiply. `floor`, `ceil` and `round` are the
//!   identity on integers; `is_nan` is false and `is_finite` true for them.
//! - `sign` is -1, 0 or 1 (`sign(-0.0) == 0.0`, the sign of zero is not kept)
//!   and `sign(NaN)` is NaN.
//! - `relu(x)` is `x` if `x > 0`, else `0` (so `relu(-0.0) == 0.0`), and
//!   `relu(NaN)` is NaN.
//! - `sigmoid(x) = 1 / (1 + e^-x)`, computed as `e^x / (1 + e^x)` for `x < 0`
//!   so that it never overflows.
//! - `rsqrt(x) = 1 / sqrt(x)`, `reciprocal(x) = 1 / x` (IEEE: `1/0 = inf`).
//! - `erf` is libm's `erff`/`erf`; the other transcendentals are Rust's `std`.
//! - `round` rounds half to even (numpy): `round(2.5) == 2`, `round(-0.5) == -0`.
//!
//! **Binary** operands have one dtype and broadcast with numpy rules
//! ([`broadcast_shapes`]).
//! - `add`, `sub`, `mul` wrap on integers; on floats they are IEEE.
//! - `div` on floats is IEEE division. On integers it **truncates toward
//!   zero** (Rust's and C's `/`, TF's `truncatediv`): `-7 / 2 == -3`;
//!   division by zero yields `0` (as numpy's integer division does) and
//!   `i32::MIN / -1` wraps to `i32::MIN`.
//! - `rem` is **Python/numpy modulo** (TF's `floormod`): the result has the
//!   sign of the divisor, `-7 % 3 == 2`, `7 % -3 == -2`. Floats compute it as
//!   numpy does: `r = fmod(a, b)`, then `r += b` if `r != 0` and `r` and `b`
//!   have different signs; a zero result takes the sign of `b`; `rem(x, 0)` is
//!   NaN. Integers use the same rule with `rem(x, 0) == 0`. Note that, for
//!   operands of different signs, `div` and `rem` do not satisfy
//!   `a == div(a, b) * b + rem(a, b)`: `div` truncates while `rem` floors.
//! - `pow` on floats is `powf` (IEEE `pow`: `pow(x, 0) == 1` even for NaN).
//!   On integers a non-negative exponent is exact repeated squaring with
//!   wrapping multiplication (`pow(0, 0) == 1`); a negative exponent gives the
//!   real result truncated toward zero: `1` for base 1, `±1` for base -1 (by
//!   the exponent's parity) and `0` for every other base, including 0.
//! - `maximum` and `minimum` propagate NaN: if either operand is NaN the
//!   result is NaN. Otherwise they follow numpy (`maximum(-0.0, 0.0)` returns
//!   the first operand).
//! - Comparisons return bool with IEEE semantics: every comparison with NaN is
//!   false except `ne`, which is true. `eq`/`ne` also accept bool.
//! - `logical_and` and `logical_or` take bool.
//!
//! [`select`] broadcasts the condition and both branches to one shape.
//! [`cast`] converts as Rust's `as` does: float to integer truncates toward
//! zero and saturates, NaN becomes 0 (`300.7 -> u8` is 255, `-inf -> i8` is
//! -128); integer to float and f64 to f32 round to nearest; integer to
//! integer keeps the low bits (wraps: i64 to i32, `300i32 -> u8` is 44,
//! `-1i8 -> u32` is 4294967295); bool becomes 0/1; a
//! number becomes `x != 0` as bool, so NaN is `true`. [`clamp`] converts its
//! bounds to the operand's dtype (as `as` does) and computes
//! `minimum(maximum(x, lo), hi)`, so a NaN operand stays NaN and `lo > hi`
//! yields `hi`.
//!
//! # Reductions
//!
//! [`reduce`] takes sorted, unique, in-range axes; an empty list is the
//! identity, and `keepdims` keeps each reduced axis with size 1. `sum` of no
//! elements is 0, `prod` is 1 and `mean` is NaN (0/0). `max` and `min`
//! propagate NaN and panic when a reduced axis has size 0 (even if the result
//! would itself be empty: whether an op is valid depends only on shapes), as
//! there is no identity. Integers wrap. Floats accumulate in the element type,
//! sequentially, in row-major order of the reduced elements (`mean` is that
//! sum divided by the count): this order *is* the reference. `mean` takes
//! floats only.
//!
//! [`arg_reduce`] returns i64 indices along one axis: the first occurrence
//! wins ties, and if the lane holds a NaN the result is the index of the first
//! NaN (numpy). An empty axis panics. It accepts every dtype (`false < true`).
//!
//! # Linear algebra
//!
//! [`matmul`] multiplies `[..., m, k]` by `[..., k, n]`, broadcasting the batch
//! dims with numpy rules (both operands need rank >= 2). Floats use ndarray's
//! `general_mat_mul` (the matrixmultiply GEMM, whose summation order is
//! blocked, not sequential) per batch entry; integers use a plain triple loop
//! with wrapping arithmetic. `k == 0` gives zeros. bool panics.
//!
//! # Shape and index ops
//!
//! - [`reshape`] shares the buffer when the input is in standard layout and
//!   copies otherwise; [`transpose`] is a view; [`broadcast_to`] returns a
//!   materialized standard-layout array.
//! - [`concat()`] and [`stack`] need at least one operand, one dtype, and equal
//!   shapes apart from the concatenation axis.
//! - [`slice()`] takes at most one [`SliceSpec`] per axis (missing trailing
//!   specs mean the whole axis) with Python's `slice.indices` semantics,
//!   negative steps included; the result is a strided view.
//! - [`gather`] takes i32 or i64 indices; the output shape is
//!   `params.shape[..axis] ++ indices.shape ++ params.shape[axis + 1..]`. A
//!   negative index counts from the end; an index outside `-len..len` panics
//!   (`gather: index 7 is out of range for axis 0 of size 5`).
//! - [`one_hot`] adds a last axis of size `depth`: 1 at the index, else 0; an
//!   index that is negative or `>= depth` gives an all-zero row (TF).
//! - [`arange`] has `max(0, ceil((stop - start) / step))` elements, element
//!   `i` being `start + i * step` computed in f64 and then converted as `as`
//!   does. `step == 0`, a non-finite count and the bool dtype panic.
//!
//! # Random numbers
//!
//! [`randn`] and [`rand_uniform`] are counter-based: element `i` (row-major)
//! of the result depends only on `(seed, i)`, not on the shape, the thread or
//! the platform, so a prefix of a larger draw equals a smaller draw. The bits
//! of counter `c` are the splitmix64 finalizer applied to
//! `splitmix64(seed) + (c + 1) * 0x9E3779B97F4A7C15`; a uniform in `[0, 1)` is
//! the top 53 bits times 2^-53. `rand_uniform` maps counter `i` to
//! `low + u * (high - low)` in f64, then rounds to the dtype; a value that
//! rounds up to `high` is replaced by the largest value of the dtype below
//! `high`, so results stay in `[low, high)` when `low < high`. `randn` takes
//! uniforms `u1`, `u2` from counters `2i` and `2i + 1` and returns the cosine
//! branch of Box-Muller, `sqrt(-2 ln(1 - u1)) * cos(2 pi u2)`, computed in f64
//! with the `libm` crate's `log` and `cos` (not the platform's) and then
//! rounded to the dtype. Both take float dtypes only.

use crate::{ArgReduceOp, BinaryOp, DType, RandomDist, ReduceOp, SliceSpec, SpatialOp, Storage, UnaryOp};

/// Matches two storages of one dtype, binding their typed arrays; panics
/// naming `$name` if the dtypes differ. `$body` must type-check for every
/// element type.
macro_rules! same_dtype {
    ($name:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            ($crate::Storage::F32($x), $crate::Storage::F32($y)) => $body,
            ($crate::Storage::F64($x), $crate::Storage::F64($y)) => $body,
            ($crate::Storage::I32($x), $crate::Storage::I32($y)) => $body,
            ($crate::Storage::I64($x), $crate::Storage::I64($y)) => $body,
            ($crate::Storage::Bool($x), $crate::Storage::Bool($y)) => $body,
            ($crate::Storage::BF16($x), $crate::Storage::BF16($y)) => $body,
            ($crate::Storage::F16($x), $crate::Storage::F16($y)) => $body,
            ($crate::Storage::I8($x), $crate::Storage::I8($y)) => $body,
            ($crate::Storage::U8($x), $crate::Storage::U8($y)) => $body,
            ($crate::Storage::I16($x), $crate::Storage::I16($y)) => $body,
            ($crate::Storage::U16($x), $crate::Storage::U16($y)) => $body,
            ($crate::Storage::U32($x), $crate::Storage::U32($y)) => $body,
            ($crate::Storage::U64($x), $crate::Storage::U64($y)) => $body,
            (a, b) => panic!("{}: operands have different dtypes ({} and {})", $name, a.dtype(), b.dtype()),
        }
    };
}

/// Binds `$T` to the Rust element type of the runtime tag `$dt`.
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
        }
    };
}

mod binary;
mod conv;
mod fold;
mod fold_rows_f32;
mod index;
mod low_precision;
mod matmul;
mod narrow_int;
mod num;
pub mod par;
mod pool;
mod random;
pub(crate) use low_precision::{in_f32, in_f32_1};
use narrow_int::{in_compute, in_compute_1, widened};
mod reduce;
pub mod scalar;
mod scan;
mod scatter;
mod scatter_update;
pub(crate) mod shape;
mod unary;
mod window;

#[cfg(test)]
mod test_util;

/// numpy broadcasting of two shapes, or `None` if they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    shape::broadcast_shapes(a, b)
}

/// Applies a unary op elementwise.
pub fn unary(op: UnaryOp, x: &Storage) -> Storage {
    unary::unary(op, x)
}

/// Applies a binary op elementwise with numpy broadcasting. Both operands
/// have the same dtype.
pub fn binary(op: BinaryOp, a: &Storage, b: &Storage) -> Storage {
    binary::binary(op, a, b)
}

/// `cond ? a : b` elementwise, with broadcasting of all three.
pub fn select(cond: &Storage, a: &Storage, b: &Storage) -> Storage {
    binary::select(cond, a, b)
}

/// Converts to another dtype.
pub fn cast(x: &Storage, to: DType) -> Storage {
    binary::cast(x, to)
}

/// Clamps into `[min, max]` (bounds converted to the dtype).
pub fn clamp(x: &Storage, min: f64, max: f64) -> Storage {
    binary::clamp(x, min, max)
}

/// Reduces over `axes` (sorted, unique, in range).
pub fn reduce(op: ReduceOp, x: &Storage, axes: &[usize], keepdims: bool) -> Storage {
    reduce::reduce(op, x, axes, keepdims)
}

/// Index of the max/min along `axis`, as i64.
pub fn arg_reduce(op: ArgReduceOp, x: &Storage, axis: usize, keepdims: bool) -> Storage {
    reduce::arg_reduce(op, x, axis, keepdims)
}

/// Matrix product of the last two axes, batch axes broadcast. bf16/f16
/// operands multiply in f32 and the result is rounded back (see
/// [`matmul_acc`] to keep the f32 sums).
pub fn matmul(a: &Storage, b: &Storage) -> Storage {
    if low_pair(a, b) {
        return in_f32(&[a, b], |w| vec![matmul::matmul(w[0], w[1])]).remove(0);
    }
    matmul::matmul(a, b)
}

/// [`matmul`] accumulated and returned in `acc` (F32 or F64): bf16/f16
/// operands are widened exactly, so each product is exact and the sums are
/// `acc`'s; operands already of dtype `acc` give plain `matmul`.
///
/// # Panics
/// If `acc` is not F32 or F64, or the operands' dtypes differ or are not
/// floats of at most `acc`'s width.
pub fn matmul_acc(a: &Storage, b: &Storage, acc: DType) -> Storage {
    if a.dtype() != b.dtype() {
        panic!("matmul_acc: operands have different dtypes ({} and {})", a.dtype(), b.dtype());
    }
    let ok = match acc {
        DType::F32 => matches!(a.dtype(), DType::F32 | DType::BF16 | DType::F16),
        DType::F64 => a.dtype().is_float(),
        _ => false,
    };
    if !ok {
        panic!(
            "matmul_acc: cannot accumulate {} operands in {acc} (the accumulator is f32 or f64, at least as wide)",
            a.dtype()
        );
    }
    matmul::matmul(&cast(a, acc), &cast(b, acc))
}

/// True when both operands are the same 16-bit float dtype.
fn low_pair(a: &Storage, b: &Storage) -> bool {
    a.dtype() == b.dtype() && a.dtype().is_low_precision()
}

/// Same elements, new shape (same element count).
pub fn reshape(x: &Storage, shape: &[usize]) -> Storage {
    shape::reshape(x, shape)
}

/// Permutes the axes.
pub fn transpose(x: &Storage, perm: &[usize]) -> Storage {
    shape::transpose(x, perm)
}

/// Broadcasts to `shape` (numpy rules).
pub fn broadcast_to(x: &Storage, shape: &[usize]) -> Storage {
    shape::broadcast_to(x, shape)
}

/// Joins along an existing axis.
pub fn concat(xs: &[&Storage], axis: usize) -> Storage {
    shape::concat(xs, axis)
}

/// Joins along a new axis.
pub fn stack(xs: &[&Storage], axis: usize) -> Storage {
    shape::stack(xs, axis)
}

/// numpy basic slicing, one spec per axis.
pub fn slice(x: &Storage, specs: &[SliceSpec]) -> Storage {
    shape::slice(x, specs)
}

/// Picks entries of `params` along `axis` by integer `indices`.
pub fn gather(params: &Storage, indices: &Storage, axis: usize) -> Storage {
    index::gather(params, indices, axis)
}

/// One-hot encoding of integer indices along a new last axis.
pub fn one_hot(indices: &Storage, depth: usize, dtype: DType) -> Storage {
    index::one_hot(indices, depth, dtype)
}

/// `[start, start+step, ...)` up to `stop`, as numpy's arange.
pub fn arange(start: f64, stop: f64, step: f64, dtype: DType) -> Storage {
    index::arange(start, stop, step, dtype)
}

/// Standard normal samples from a counter-based generator.
pub fn randn(shape: &[usize], seed: u64, dtype: DType) -> Storage {
    if dtype.is_low_precision() {
        return cast(&random::randn(shape, seed, DType::F32), dtype);
    }
    random::randn(shape, seed, dtype)
}

/// Uniform samples in `[low, high)` from a counter-based generator.
pub fn rand_uniform(shape: &[usize], low: f64, high: f64, seed: u64, dtype: DType) -> Storage {
    if dtype.is_low_precision() {
        return cast(&random::rand_uniform(shape, low, high, seed, DType::F32), dtype);
    }
    random::rand_uniform(shape, low, high, seed, dtype)
}

/// Adds `updates` into a copy of `x` along `axis` at `indices` (ONNX
/// ScatterElements with `reduction="add"`; indices broadcast against the
/// updates; duplicates sum in row-major order).
pub fn scatter_add(x: &Storage, indices: &Storage, updates: &Storage, axis: usize) -> Storage {
    if low_pair(x, updates) {
        return in_f32(&[x, updates], |w| vec![scatter::scatter_add(w[0], indices, w[1], axis)]).remove(0);
    }
    scatter::scatter_add(x, indices, updates, axis)
}

pub use scatter_update::scatter_sub_in_place;
pub use shape::write_row_major;

/// `x` read at `indices` along `axis` (ONNX GatherElements, numpy's
/// `take_along_axis`): the result has the indices' shape.
pub fn gather_elements(x: &Storage, indices: &Storage, axis: usize) -> Storage {
    scatter::gather_elements(x, indices, axis)
}

/// The window of `sizes` at `starts` (an integer vector, one per axis),
/// each start clamped into `[0, dim - size]` as XLA's DynamicSlice does.
pub fn dynamic_slice(x: &Storage, starts: &Storage, sizes: &[usize]) -> Storage {
    window::dynamic_slice(x, starts, sizes)
}

/// A copy of `x` with the window at `starts` (clamped as in
/// [`dynamic_slice`]) replaced by `update`.
pub fn dynamic_update_slice(x: &Storage, update: &Storage, starts: &Storage) -> Storage {
    window::dynamic_update_slice(x, update, starts)
}

/// `x` with `pads[i] = (before, after)` elements of `value` added on axis `i`.
pub fn pad(x: &Storage, pads: &[(usize, usize)], value: f64) -> Storage {
    window::pad(x, pads, value)
}

/// Inclusive prefix sums along `axis`, in index order.
pub fn cumsum(x: &Storage, axis: usize) -> Storage {
    scan::cumsum(x, axis)
}

/// The `k` largest entries of each row of the last axis, largest first
/// (NaN above every number, ties by index), and their i64 indices.
pub fn top_k(x: &Storage, k: usize) -> (Storage, Storage) {
    scan::top_k(x, k)
}

/// A random draw of `shape` and `dtype` (a float; bf16 and f16 drawn in
/// f32 and rounded) from the Philox
/// stream of `state` (an i64 `[counter_lo, counter_hi, key]`, or an i64
/// `[s0, s1]` seed standing for `[0, s1, s0]`): element `i` is a function of
/// the state and `i` only.
pub fn random(dist: RandomDist, state: &Storage, shape: &[usize], dtype: DType) -> Storage {
    if dtype.is_low_precision() {
        return cast(&random::random(dist, state, shape, DType::F32), dtype);
    }
    random::random(dist, state, shape, dtype)
}

/// A spatial op (convolution, pooling or one of their gradients) on its
/// inputs, in the order [`SpatialOp`] lists them; f32 or f64. Plain loops:
/// the oracle of the fast kernels.
///
/// # Panics
/// On operands the op's type rule rejects (a plain message; the IR checks
/// first and names the user's line).
pub fn spatial(op: &SpatialOp, inputs: &[&Storage]) -> Vec<Storage> {
    assert_eq!(inputs.len(), op.num_inputs(), "{}: takes {} inputs, got {}", op.name(), op.num_inputs(), inputs.len());
    if inputs.iter().any(|s| s.dtype().is_low_precision()) {
        return in_f32(inputs, |w| spatial(op, w));
    }
    match *op {
        SpatialOp::Conv2d { conv, bias, relu } => {
            vec![conv::forward(conv, inputs[0], inputs[1], bias.then(|| inputs[2]), relu)]
        }
        SpatialOp::Conv2dBackwardData { conv, input_hw } => {
            vec![conv::backward_data(conv, input_hw, inputs[0], inputs[1])]
        }
        SpatialOp::Conv2dBackwardFilter { conv, kernel, bias } => {
            conv::backward_filter(conv, kernel, bias, inputs[0], inputs[1])
        }
        SpatialOp::MaxPool2d { pool } => vec![pool::max_forward(pool, inputs[0])],
        SpatialOp::MaxPool2dBackward { pool } => vec![pool::max_backward(pool, inputs[0], inputs[1])],
        SpatialOp::AvgPool2d { pool } => vec![pool::avg_forward(pool, inputs[0])],
        SpatialOp::AvgPool2dBackward { pool, input_hw } => vec![pool::avg_backward(pool, input_hw, inputs[0])],
        // Channels last: the NCHW op on the transposed input, its result
        // transposed back (the oracle of the channels-last kernels).
        SpatialOp::Conv2dNhwc { .. } | SpatialOp::MaxPool2dNhwc { .. } => {
            let x = transpose(inputs[0], &[0, 3, 1, 2]);
            let first = op.channels_first();
            let mut args = inputs[..first.num_inputs()].to_vec();
            args[0] = &x;
            let ys: Vec<Storage> = spatial(&first, &args).iter().map(|y| transpose(y, &[0, 2, 3, 1])).collect();
            match op.conv_epilogue() {
                Some(e) => vec![conv_epilogue(e, &ys[0], inputs)],
                None => ys,
            }
        }
    }
}

/// A `conv2d_nhwc`'s epilogue on its bare convolution `y`: the elementwise
/// ops it stands for, one after another (a `[C]` operand broadcasts over
/// the channels-last axis), so the bits are theirs.
fn conv_epilogue(e: crate::ConvEpilogue, y: &Storage, inputs: &[&Storage]) -> Storage {
    let mut y = y.clone();
    for (at, op) in [(e.scale, BinaryOp::Mul), (e.bias, BinaryOp::Add), (e.residual, BinaryOp::Add)] {
        if let Some(i) = at {
            y = binary(op, &y, inputs[i]);
        }
    }
    if e.relu {
        y = unary(UnaryOp::Relu, &y);
    }
    y
}

/// The Philox stream a random op reads from `state` (see [`random`]), for
/// kernels that draw the same numbers as the op without materializing
/// them.
///
/// # Panics
/// If `state` is not an i64 `[3]` or `[2]`; `name` names the caller.
pub fn philox_stream(name: &str, state: &Storage) -> tracejit_kernels::philox::Stream {
    random::stream(name, state)
}
