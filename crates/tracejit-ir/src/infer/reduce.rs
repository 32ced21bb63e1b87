//! Shape rules of the ops that reduce axes: reductions, arg-reductions and the matrix product.

use smallvec::smallvec;
use tracejit_tensor::{DType, ReduceOp};

use super::*;
use crate::TensorType;

/// One output of type `t`.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

pub(super) fn reduce(
    name: &str,
    r: &ReduceOp,
    axes: &[usize],
    keepdims: &bool,
    inputs: &[TensorType],
) -> Result<Outputs, String> {
    let x = &inputs[0];
    let Some(dtype) = r.result_dtype(x.dtype) else {
        return Err(format!(
            "expected {} tensor, got {x} (cast it first)",
            with_article(accepted_kind(|d| r.result_dtype(d).is_some()))
        ));
    };
    check_axes(axes, x)?;
    if matches!(r, ReduceOp::Max | ReduceOp::Min) {
        if let Some(&a) = axes.iter().find(|&&a| x.dims[a] == Some(0)) {
            return Err(format!("cannot reduce an empty axis: axis {a} of {x} has size 0 and {name} has no identity"));
        }
    }
    let dims = x
        .dims
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match axes.contains(&i) {
            false => Some(d),
            true if *keepdims => Some(Some(1)),
            true => None,
        })
        .collect();
    one(TensorType { dtype, dims })
}

pub(super) fn arg_reduce(axis: &usize, keepdims: &bool, inputs: &[TensorType]) -> Result<Outputs, String> {
    let x = &inputs[0];
    if !x.dtype.is_numeric() {
        return Err(format!("expected a numeric tensor, got {x} (cast it first)"));
    }
    check_axis(*axis, x)?;
    if x.dims[*axis] == Some(0) {
        return Err(format!("cannot reduce an empty axis: axis {axis} of {x} has size 0"));
    }
    let mut dims = x.dims.clone();
    if *keepdims {
        dims[*axis] = Some(1);
    } else {
        dims.remove(*axis);
    }
    one(TensorType { dtype: DType::I64, dims })
}

pub(super) fn matmul(inputs: &[TensorType]) -> Result<Outputs, String> {
    let (a, b) = (&inputs[0], &inputs[1]);
    if a.rank() < 2 || b.rank() < 2 {
        return Err(format!("expected operands of rank >= 2, got {a} @ {b}"));
    }
    if a.dtype != b.dtype {
        return Err(format!(
            "operands have different dtypes {a} and {b}; tracejit never promotes implicitly — cast one of them"
        ));
    }
    if !a.dtype.is_numeric() {
        return Err(format!("expected numeric operands, got {a} @ {b} (cast them first)"));
    }
    let (ra, rb) = (a.rank(), b.rank());
    if let (Some(k1), Some(k2)) = (a.dims[ra - 1], b.dims[rb - 2]) {
        if k1 != k2 {
            return Err(format!("inner dimensions differ: {a} @ {b}"));
        }
    }
    let mut dims = broadcast_dims(&a.dims[..ra - 2], &b.dims[..rb - 2])
        .ok_or_else(|| format!("cannot broadcast the batch dimensions of {a} @ {b}"))?;
    dims.push(a.dims[ra - 2]);
    dims.push(b.dims[rb - 1]);
    one(TensorType { dtype: a.dtype, dims })
}
