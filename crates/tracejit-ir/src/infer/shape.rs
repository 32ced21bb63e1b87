//! Shape rules of the ops that move or pick elements: reshape, transpose, broadcast_to, expand_dims, squeeze, concat, stack, slice, gather and one_hot.

use smallvec::smallvec;
use tracejit_tensor::{DType, SliceSpec};

use super::*;
use crate::TensorType;

/// One output of type `t`.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

pub(super) fn reshape(shape: &[i64], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    let dims = match x.num_elements() {
        Some(n) => {
            resolve_reshape(shape, n).map_err(|m| format!("{m} (reshaping {x})"))?.into_iter().map(Some).collect()
        }
        None => {
            check_reshape_target(shape)?;
            shape.iter().map(|&d| usize::try_from(d).ok()).collect()
        }
    };
    one(TensorType { dtype: x.dtype, dims })
}

pub(super) fn transpose(perm: &[usize], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if !is_permutation(perm, x.rank()) {
        return Err(format!("{perm:?} is not a permutation of the axes of {x}"));
    }
    one(TensorType { dtype: x.dtype, dims: perm.iter().map(|&p| x.dims[p]).collect() })
}

pub(super) fn broadcast_to(shape: &[usize], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    let fits = x.rank() <= shape.len()
        && x.dims.iter().rev().zip(shape.iter().rev()).all(|(&d, &t)| d.is_none_or(|d| d == 1 || d == t));
    if !fits {
        return Err(format!("cannot broadcast {x} to {shape:?}"));
    }
    one(TensorType::known(x.dtype, shape))
}

pub(super) fn expand_dims(axis: &usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if *axis > x.rank() {
        return Err(format!("axis {axis} is out of range for {x} (at most {})", x.rank()));
    }
    let mut dims = x.dims.clone();
    dims.insert(*axis, Some(1));
    one(TensorType { dtype: x.dtype, dims })
}

pub(super) fn squeeze(axes: &[usize], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    check_axes(axes, x)?;
    for &a in axes {
        if let Some(size) = x.dims[a].filter(|&d| d != 1) {
            return Err(format!("axis {a} of {x} has size {size}, not 1"));
        }
    }
    let dims = x.dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    one(TensorType { dtype: x.dtype, dims })
}

pub(super) fn concat(axis: &usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let first = inputs.first().ok_or_else(|| "needs at least one input".to_string())?;
    check_axis(*axis, first)?;
    let mut dims = first.dims.clone();
    for x in &inputs[1..] {
        check_same_dtype_rank(first, x)?;
        for (i, d) in dims.iter_mut().enumerate() {
            if i == *axis {
                *d = match (*d, x.dims[i]) {
                    (Some(p), Some(q)) => Some(
                        p.checked_add(q)
                            .ok_or_else(|| format!("the size of axis {axis} overflows (joining {first} and {x})"))?,
                    ),
                    _ => None,
                };
            } else {
                *d =
                    merge_dim(*d, x.dims[i]).ok_or_else(|| format!("dimension {i} differs between {first} and {x}"))?;
            }
        }
    }
    one(TensorType { dtype: first.dtype, dims })
}

pub(super) fn stack(axis: &usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let first = inputs.first().ok_or_else(|| "needs at least one input".to_string())?;
    if *axis > first.rank() {
        return Err(format!("axis {axis} is out of range for stacking {first} (at most {})", first.rank()));
    }
    let mut dims = first.dims.clone();
    for x in &inputs[1..] {
        check_same_dtype_rank(first, x)?;
        for (i, d) in dims.iter_mut().enumerate() {
            *d = merge_dim(*d, x.dims[i]).ok_or_else(|| format!("inputs have different shapes {first} and {x}"))?;
        }
    }
    dims.insert(*axis, Some(inputs.len()));
    one(TensorType { dtype: first.dtype, dims })
}

pub(super) fn slice(specs: &[SliceSpec], inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if specs.len() != x.rank() {
        return Err(format!("expected one spec per axis of {x}, got {}", specs.len()));
    }
    let mut dims = Dims::new();
    for (i, (spec, &d)) in specs.iter().zip(&x.dims).enumerate() {
        if spec.step == 0 {
            return Err(format!("the step of axis {i} is 0 (slicing {x})"));
        }
        dims.push(d.map(|len| spec.resolve(len).1));
    }
    one(TensorType { dtype: x.dtype, dims })
}

pub(super) fn gather(axis: &usize, inputs: &[TensorType]) -> Result<Outputs, String> {
    let (params, indices) = (&inputs[0], &inputs[1]);
    if !indices.dtype.is_index() {
        return Err(format!("indices must be i32 or i64, got {indices}"));
    }
    check_axis(*axis, params)?;
    let mut dims: Dims = params.dims[..*axis].iter().copied().collect();
    dims.extend(indices.dims.iter().copied());
    dims.extend(params.dims[*axis + 1..].iter().copied());
    one(TensorType { dtype: params.dtype, dims })
}

pub(super) fn one_hot(depth: &usize, dtype: &DType, inputs: &[TensorType]) -> Result<Outputs, String> {
    let indices = &inputs[0];
    if !indices.dtype.is_index() {
        return Err(format!("indices must be i32 or i64, got {indices}"));
    }
    let mut dims = indices.dims.clone();
    dims.push(Some(*depth));
    one(TensorType { dtype: *dtype, dims })
}
