//! Shape rules of the ops whose types come from elsewhere: native kernels (their declared types) and variable reads and writes (the variable's type).

use smallvec::{smallvec, SmallVec};

use super::*;
use crate::{AssignKind, Graph, TensorType, VarId};

/// One output of type `t`.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

pub(super) fn kernel(
    kernel: &str,
    accepted: &[TensorType],
    outputs: &[TensorType],
    inputs: &[TensorType],
) -> Result<Outputs, String> {
    for (i, (p, x)) in accepted.iter().zip(inputs).enumerate() {
        if !dims_compatible(p, x) {
            return Err(format!("argument {i} of kernel `{kernel}` has type {x}, but it takes {p}"));
        }
    }
    Ok(outputs.iter().cloned().collect())
}

pub(super) fn read_variable(var: &VarId, graph: Option<&Graph>) -> Result<Outputs, String> {
    let graph = graph.ok_or_else(|| "needs the graph that holds the variable".to_string())?;
    let v = graph.variables.get(*var).ok_or_else(|| format!("unknown variable {var}"))?;
    one(TensorType::known(v.dtype(), &v.shape()))
}

pub(super) fn assign_variable(
    var: &VarId,
    kind: &AssignKind,
    inputs: &[TensorType],
    graph: Option<&Graph>,
) -> Result<Outputs, String> {
    let graph = graph.ok_or_else(|| "needs the graph that holds the variable".to_string())?;
    let v = graph.variables.get(*var).ok_or_else(|| format!("unknown variable {var}"))?;
    let ty = TensorType::known(v.dtype(), &v.shape());
    let x = &inputs[0];
    if !dims_compatible(&ty, x) {
        return Err(format!(
            "cannot {} a value of type {x} to variable {var} \"{}\" of type {ty}",
            kind.name(),
            v.name()
        ));
    }
    if !matches!(kind, AssignKind::Assign) && !ty.dtype.is_numeric() {
        return Err(format!("cannot {} to the bool variable {var} \"{}\"", kind.name(), v.name()));
    }
    Ok(SmallVec::new())
}
