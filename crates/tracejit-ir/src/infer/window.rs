//! Shape rules of the ops of the third milestone's indexing, window, scan
//! and random families: gather_elements, scatter_add, dynamic_slice,
//! dynamic_update_slice, pad, cumsum, top_k and the random draws.

use smallvec::{smallvec, SmallVec};
use tracejit_tensor::DType;

use super::*;
use crate::TensorType;

/// One output of type `t`.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

/// `inner` has `outer`'s rank and is no larger on any axis but `axis`
/// (where both are known).
fn fits(what: &str, inner: &TensorType, outer: &TensorType, axis: Option<usize>) -> Result<(), String> {
    if inner.rank() != outer.rank() {
        return Err(format!("{what} {inner} does not have the rank of {outer}"));
    }
    for (d, (&i, &o)) in inner.dims.iter().zip(&outer.dims).enumerate() {
        if Some(d) != axis && matches!((i, o), (Some(i), Some(o)) if i > o) {
            return Err(format!("{what} {inner} is larger than {outer} on axis {d}"));
        }
    }
    Ok(())
}

fn integer(what: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype.is_index() {
        Ok(())
    } else {
        Err(format!("{what} must be i32 or i64, got {t}"))
    }
}

/// A start vector: integer, rank 1, one entry per axis of a rank-`rank`
/// tensor.
fn starts(t: &TensorType, rank: usize) -> Result<(), String> {
    integer("starts", t)?;
    if t.rank() != 1 || t.dims[0].is_some_and(|n| n != rank) {
        return Err(format!("starts must be a vector of {rank} indices (one per axis), got {t}"));
    }
    Ok(())
}

pub(super) fn gather_elements(axis: usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let (x, idx) = (&inputs[0], &inputs[1]);
    check_axis(axis, x)?;
    integer("indices", idx)?;
    fits("indices", idx, x, Some(axis))?;
    one(TensorType { dtype: x.dtype, dims: idx.dims.clone() })
}

pub(super) fn scatter_add(axis: usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let (x, idx, upd) = (&inputs[0], &inputs[1], &inputs[2]);
    if !x.dtype.is_numeric() || upd.dtype != x.dtype {
        return Err(format!("expected numeric x and updates of one dtype, got {x} and {upd}"));
    }
    check_axis(axis, x)?;
    integer("indices", idx)?;
    fits("updates", upd, x, Some(axis))?;
    let broadcasts = idx.rank() <= upd.rank()
        && idx.dims.iter().rev().zip(upd.dims.iter().rev()).all(|(&i, &u)| match (i, u) {
            (Some(i), Some(u)) => i == u || i == 1,
            _ => true,
        });
    if !broadcasts {
        return Err(format!("indices {idx} do not broadcast to the updates {upd}"));
    }
    one(x.clone())
}

pub(super) fn dynamic_slice(sizes: &[usize], inputs: &[TensorType]) -> Result<Outputs, String> {
    let (x, s) = (&inputs[0], &inputs[1]);
    if sizes.len() != x.rank() {
        return Err(format!("expected one size per axis of {x}, got {sizes:?}"));
    }
    starts(s, x.rank())?;
    fits("the window", &TensorType::known(x.dtype, sizes), x, None)?;
    one(TensorType::known(x.dtype, sizes))
}

pub(super) fn dynamic_update_slice(inputs: &[TensorType]) -> Result<Outputs, String> {
    let (x, upd, s) = (&inputs[0], &inputs[1], &inputs[2]);
    if upd.dtype != x.dtype {
        return Err(format!("the update {upd} does not have the dtype of {x}"));
    }
    fits("the update", upd, x, None)?;
    starts(s, x.rank())?;
    one(x.clone())
}

pub(super) fn pad(pads: &[(usize, usize)], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if pads.len() != x.rank() {
        return Err(format!("expected one (before, after) pair per axis of {x}, got {}", pads.len()));
    }
    let mut dims = SmallVec::with_capacity(x.rank());
    for (axis, (d, &(lo, hi))) in x.dims.iter().zip(pads).enumerate() {
        // An unknown dim stays unknown (checked again at run time, when
        // it is known); a known one must not overflow.
        let padded = match d {
            Some(d) => Some(
                d.checked_add(lo)
                    .and_then(|n| n.checked_add(hi))
                    .ok_or_else(|| format!("the size of axis {axis} overflows: {d} + {lo} + {hi} (padding {x})"))?,
            ),
            None => None,
        };
        dims.push(padded);
    }
    one(TensorType { dtype: x.dtype, dims })
}

pub(super) fn cumsum(axis: usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if !x.dtype.is_numeric() {
        return Err(format!("expected a numeric tensor, got {x} (cast it first)"));
    }
    check_axis(axis, x)?;
    one(x.clone())
}

pub(super) fn top_k(k: usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if !x.dtype.is_numeric() {
        return Err(format!("expected a numeric tensor, got {x} (cast it first)"));
    }
    let Some(&last) = x.dims.last() else { return Err(format!("expected a tensor of rank >= 1, got {x}")) };
    if last.is_some_and(|n| n < k) {
        return Err(format!("k = {k} is larger than the last axis of {x}"));
    }
    let mut dims = x.dims.clone();
    *dims.last_mut().expect("rank >= 1") = Some(k);
    Ok(smallvec![TensorType { dtype: x.dtype, dims: dims.clone() }, TensorType { dtype: DType::I64, dims }])
}

pub(super) fn random(dtype: DType, shape: Option<&[usize]>, inputs: &[TensorType]) -> Result<Outputs, String> {
    let state = &inputs[0];
    let ok_state = state.dtype == DType::I64 && state.rank() == 1 && state.dims[0].is_none_or(|n| n == 2 || n == 3);
    if !ok_state {
        return Err(format!("the state must be an i64 [3] (a generator's) or an i64 [2] seed, got {state}"));
    }
    if !dtype.is_float() {
        return Err(format!("random values need f32 or f64, not {dtype}"));
    }
    match shape {
        Some(shape) => one(TensorType::known(dtype, shape)),
        None => one(TensorType { dtype, dims: inputs[1].dims.clone() }),
    }
}
