//! The run-time semantics of the control-flow ops, [`Op::Cond`] and
//! [`Op::While`], written once over "run subgraph `k` on these values" so
//! that the interpreter (which interprets the subgraphs) and the JIT
//! executor (which runs them as prepared executables, compiled once) share
//! them.
//!
//! [`Op::Cond`]: crate::Op::Cond
//! [`Op::While`]: crate::Op::While

use tracejit_tensor::Storage;

use crate::IrError;

/// Runs subgraph `k` of the node on the given values.
pub type RunSubgraph<'a, E> = dyn FnMut(usize, &[Storage]) -> Result<Vec<Storage>, E> + 'a;

/// The value of a bool scalar (a predicate or a loop condition); `what`
/// names it in the error.
pub fn predicate(x: &Storage, what: &str) -> Result<bool, IrError> {
    match x {
        Storage::Bool(a) if a.ndim() == 0 => Ok(a.iter().next().copied().unwrap_or(false)),
        Storage::F32(_) | Storage::F64(_) | Storage::I32(_) | Storage::I64(_) | Storage::Bool(_) => Err(IrError::Op(
            crate::OpError::new("cond", format!("{what} must be a bool scalar, got {}{:?}", x.dtype(), x.shape())),
        )),
    }
}

/// Runs a conditional on `args = (pred, operands...)`: the then branch
/// (subgraph 0) or the else branch (subgraph 1) on the operands.
pub fn run_cond<E: From<IrError>>(args: &[Storage], run: &mut RunSubgraph<'_, E>) -> Result<Vec<Storage>, E> {
    let Some((pred, operands)) = args.split_first() else {
        return Err(IrError::Op(crate::OpError::new("cond", "expected a predicate".to_string())).into());
    };
    let branch = if predicate(pred, "the predicate")? { 0 } else { 1 };
    run(branch, operands)
}

/// Runs a loop on `args = (carried..., captured...)`: while the condition
/// (subgraph 0) holds, the body (subgraph 1) computes the next carried
/// values. Returns the final carried values.
pub fn run_while<E: From<IrError>>(
    carried: usize,
    args: &[Storage],
    run: &mut RunSubgraph<'_, E>,
) -> Result<Vec<Storage>, E> {
    let mut state: Vec<Storage> = args.to_vec();
    loop {
        let c = run(0, &state)?;
        let go = match c.first() {
            Some(c) => predicate(c, "the loop condition")?,
            None => {
                return Err(E::from(IrError::Op(crate::OpError::new(
                    "while",
                    "the condition returned nothing".to_string(),
                ))))
            }
        };
        if !go {
            break;
        }
        let next = run(1, &state)?;
        if next.len() != carried {
            let message = format!("the body returned {} values for {carried} carried values", next.len());
            return Err(IrError::Op(crate::OpError::new("while", message)).into());
        }
        // Dropping the old carried values before the next iteration lets
        // their buffers return to the executor's pool.
        for (slot, v) in state.iter_mut().zip(next) {
            *slot = v;
        }
    }
    state.truncate(carried);
    Ok(state)
}
