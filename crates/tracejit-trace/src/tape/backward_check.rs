//! In validation mode, a registered backward kernel (`register_gradient`)
//! is checked against the VJP of the composite's primitive body: both run
//! on the same inputs and cotangents, and their cotangents must agree
//! within the tolerance of `tracejit_ir::tolerance` (a kernel's budget plus
//! the body's). Eager calls are checked on their own values, every time;
//! a traced call (symbolic values) once per composite and signature, on
//! random inputs of its types (unknown dims of size 3) and random
//! cotangents. An input the kernel gives no cotangent for (a
//! hyperparameter such as `layer_norm`'s epsilon) is not compared.
//!
//! The check runs on a helper thread: the caller may be tracing, and then a
//! kernel calling a `Function` would record a call in its graph instead of
//! computing a value (and the caller's tapes would see the check's ops).

use std::collections::HashSet;
use std::sync::Mutex;

use tracejit_ir::tolerance::{self, Budget};
use tracejit_ir::{autodiff, interpret, Graph, TensorType};
use tracejit_tensor::{DType, Storage};

use super::{GradientFn, TensorEmitter};
use crate::Tensor;

/// Composite signatures already checked on random inputs.
static CHECKED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// An eager tensor of `ty` (unknown dims: 3): normal samples for floats,
/// zeros (valid indices) for integers, `false` for bools.
fn sample(ty: &TensorType, seed: u64) -> Tensor {
    let shape: Vec<usize> = ty.dims.iter().map(|d| d.unwrap_or(3)).collect();
    match ty.dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Tensor::randn(&shape, seed).cast(ty.dtype),
        _ => Tensor::zeros(&shape, ty.dtype),
    }
}

/// Compares `f`'s cotangents with the body's VJP; `Err` names the kernel,
/// the input and the largest difference.
pub(crate) fn check(
    name: &str,
    f: &GradientFn,
    body: &Graph,
    inputs: &[Tensor],
    outputs: &[Tensor],
    out_cts: &[Option<Tensor>],
) -> Result<(), String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            tracejit_ir::catch_quietly(|| check_here(name, f, body, inputs, outputs, out_cts)).unwrap_or_else(|p| {
                Err(format!("checking the backward kernel of `{name}` panicked: {}", tracejit_ir::panic_message(&*p)))
            })
        })
        .join()
        .unwrap_or_else(|_| Err(format!("checking the backward kernel of `{name}` failed")))
    })
}

fn check_here(
    name: &str,
    f: &GradientFn,
    body: &Graph,
    inputs: &[Tensor],
    outputs: &[Tensor],
    out_cts: &[Option<Tensor>],
) -> Result<(), String> {
    let symbolic = inputs.iter().chain(outputs).chain(out_cts.iter().flatten()).any(Tensor::is_symbolic);
    let (inputs, outputs, out_cts) = if symbolic {
        let types: Vec<String> = inputs.iter().map(|t| t.tensor_type().to_string()).collect();
        let key = format!("{name}({})", types.join(", "));
        if !CHECKED.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(key) {
            return Ok(());
        }
        let ins: Vec<Tensor> =
            inputs.iter().enumerate().map(|(i, t)| sample(&t.tensor_type(), 17 + i as u64)).collect();
        let storages: Vec<Storage> = ins.iter().map(|t| t.storage().expect("sampled eagerly").clone()).collect();
        let outs: Vec<Tensor> = interpret(body, &storages)
            .map_err(|e| format!("checking the backward kernel of `{name}`: its body fails on sample inputs: {e}"))?
            .into_iter()
            .map(Tensor::from_raw_storage)
            .collect();
        let cts: Vec<Option<Tensor>> =
            outs.iter().enumerate().map(|(i, t)| Some(sample(&t.tensor_type(), 101 + i as u64))).collect();
        (ins, outs, cts)
    } else {
        (inputs.to_vec(), outputs.to_vec(), out_cts.to_vec())
    };
    let kernel = f(&inputs, &outputs, &out_cts);
    let (reference, _) = autodiff::vjp_graph(&mut TensorEmitter, body, &inputs, &[], &out_cts)
        .map_err(|e| format!("checking the backward kernel of `{name}`: its body has no VJP: {e}"))?;
    let allowed = tolerance::KERNEL_BUDGET + 2.0 * tolerance::body_budget(body);
    for (i, (k, r)) in kernel.iter().zip(&reference).enumerate() {
        let (k, r) = match (k, r) {
            (None, _) => continue,
            (Some(k), Some(r)) => (k.clone(), r.clone()),
            (Some(k), None) => (k.clone(), Tensor::zeros_like(k)),
        };
        let (k, r) = (k.storage().map_err(|e| e.to_string())?, r.storage().map_err(|e| e.to_string())?);
        let scale = inputs
            .iter()
            .chain(&outputs)
            .chain(out_cts.iter().flatten())
            .filter_map(|t| t.storage().ok().map(tolerance::magnitude))
            .fold(tolerance::magnitude(r), f64::max);
        let budget = Budget { eps: allowed, scale: scale.max(1.0), unverifiable: false };
        if let Some(d) = tolerance::compare(r, k, &budget) {
            return Err(format!(
                "the backward kernel registered for `{name}` differs from the VJP of its body for input {i}: {d}"
            ));
        }
    }
    Ok(())
}
