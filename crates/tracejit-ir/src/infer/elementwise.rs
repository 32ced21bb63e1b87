//! Shape rules of the elementwise ops: unary and binary ops (numpy broadcasting, no implicit promotion), select and clamp.

use smallvec::smallvec;
use tracejit_tensor::{BinaryOp, DType, UnaryOp};

use super::*;
use crate::TensorType;

/// One output of type `t`.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

pub(super) fn unary(u: UnaryOp, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    match u.result_dtype(x.dtype) {
        Some(dtype) => one(TensorType { dtype, dims: x.dims.clone() }),
        None => Err(format!(
            "expected {} tensor, got {x} (cast it first)",
            with_article(accepted_kind(|d| u.result_dtype(d).is_some()))
        )),
    }
}

pub(super) fn binary(b: BinaryOp, inputs: &[TensorType]) -> Result<Outputs, String> {
    let (x, y) = (&inputs[0], &inputs[1]);
    if x.dtype != y.dtype {
        return Err(format!(
            "operands have different dtypes {x} and {y}; tracejit never promotes implicitly — cast one of them"
        ));
    }
    let Some(dtype) = b.result_dtype(x.dtype) else {
        return Err(format!(
            "expected {} operands, got {x} and {y} (cast them first)",
            accepted_kind(|d| b.result_dtype(d).is_some())
        ));
    };
    let dims = broadcast_dims(&x.dims, &y.dims).ok_or_else(|| {
        format!("cannot broadcast {} with {} ({} and {})", DimsDisplay(&x.dims), DimsDisplay(&y.dims), x.dtype, y.dtype)
    })?;
    one(TensorType { dtype, dims })
}

pub(super) fn select(inputs: &[TensorType]) -> Result<Outputs, String> {
    let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
    if c.dtype != DType::Bool {
        return Err(format!("the condition must be bool, got {c}"));
    }
    if a.dtype != b.dtype {
        return Err(format!(
            "branches have different dtypes {a} and {b}; tracejit never promotes implicitly — cast one of them"
        ));
    }
    let dims = broadcast_dims(&c.dims, &a.dims)
        .and_then(|d| broadcast_dims(&d, &b.dims))
        .ok_or_else(|| format!("cannot broadcast condition {c} with branches {a} and {b}"))?;
    one(TensorType { dtype: a.dtype, dims })
}

pub(super) fn clamp(min: &f64, max: &f64, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if !x.dtype.is_numeric() {
        return Err(format!("expected a numeric tensor, got {x} (cast it first)"));
    }
    // NaN bounds are rejected too.
    if min.is_nan() || max.is_nan() || min > max {
        return Err(format!("min {min:?} must not be greater than max {max:?} (clamping {x})"));
    }
    one(x.clone())
}
