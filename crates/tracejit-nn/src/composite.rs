//! The registry of composite kernels (`tracejit::composite`): native Rust
//! code over eager tensors that the implementation selector puts in place of
//! a call to a function marked `implements("org.semantic.opname")`, as in
//! TensorFlow's RFC "Standardizing Composite Operations".
//!
//! ```
//! use tracejit_nn::composite;
//! use tracejit_trace::{function, Tensor};
//!
//! // A kernel that gives itself away: it adds 100.
//! composite::register_kernel("example.doc.double", |inputs: &[Tensor]| vec![&inputs[0] * 2.0 + 100.0]);
//! let double = function(|x: Tensor| &x + &x).implements("example.doc.double");
//! let d = double.clone();
//! let with = function(move |x: Tensor| d.call(x).unwrap() + 1.0);
//! let without = function(move |x: Tensor| double.call(x).unwrap() + 1.0).selector(false);
//! let x = Tensor::from_vec(vec![1.0f32], &[1]);
//! assert_eq!(with.call(x.clone())?.to_vec::<f32>()?, vec![103.0]);
//! assert_eq!(without.call(x)?.to_vec::<f32>()?, vec![3.0]);
//! # Ok::<(), tracejit_trace::Error>(())
//! ```
//!
//! Rules:
//! - A kernel is `Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync + 'static`: it
//!   receives the call's tensor arguments (eager) in order and returns the
//!   function's results in order, with the dtypes and shapes the function
//!   would have produced. It must be a pure function of its inputs.
//! - A kernel registered with a predicate ([`register_kernel_with`]) is used
//!   only for calls whose argument specs (dtype and shape, `-1` where the
//!   trace's shape is unknown) the predicate accepts; otherwise the body is
//!   inlined.
//! - Registering a second kernel for a name replaces the first (the latest
//!   wins) and logs it. The kernel is resolved when a function is traced:
//!   a registration must happen before a function is traced for that trace
//!   to choose it, and functions traced before a registration keep what
//!   they chose.
//! - Names are validated ([`is_valid_name`]); a malformed one panics.
//! - The kernels of `tracejit::nn` are registered lazily, on the first call
//!   of any function of this module or of `tracejit::nn`; they never
//!   replace a kernel registered before them, and can be replaced or
//!   unregistered like any other. (A function marked
//!   `implements("tracejit.nn.gelu")` by hand, traced before anything has
//!   touched `nn` or `composite`, finds no built-in kernel and inlines its
//!   body.)
//!
//! The table itself is `tracejit_ir::registry`, below the tracer, which
//! consults it when it optimizes a trace; this module adapts closures over
//! eager [`Tensor`]s to the IR's [`ExternalKernel`] and predicates over
//! [`TensorSpec`]s to predicates over IR types. Keeping the table low and
//! this API above the tracer is what lets `tracejit-trace` know nothing of
//! `nn` (no `composite` <-> `function` <-> `nn` cycle).

use std::fmt;
use std::sync::{Arc, Once};

use tracejit_ir::registry::{self, Registration, TypePredicate};
use tracejit_ir::{ExternalKernel, TensorType};
use tracejit_kernels::Isa;
use tracejit_tensor::Storage;
use tracejit_trace::{Tensor, TensorSpec};

/// Backward kernels of composites (gradient tapes use them instead of the
/// primitive body's VJP).
pub use tracejit_trace::{register_gradient, unregister_gradient, GradientFn};

/// A composite kernel: native code over eager tensors.
pub type KernelFn = dyn Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync;

/// Says which argument specs a kernel accepts.
pub type KernelPredicate = dyn Fn(&[TensorSpec]) -> bool + Send + Sync;

/// Registers the kernels of `tracejit::nn`, once per process. Every entry
/// point of this module and of the composites calls it first, so the
/// built-ins are in the table before anything can look at it through this
/// crate, and before any trace that calls an `nn` composite is optimized.
pub(crate) fn ensure_builtins() {
    static BUILTINS: Once = Once::new();
    BUILTINS.call_once(|| {
        for c in crate::declared() {
            c.register_once();
        }
    });
}

/// True for names of the form `org.semantic.opname`: three or more
/// dot-separated, non-empty parts of ASCII letters, digits and `_`.
pub fn is_valid_name(name: &str) -> bool {
    registry::is_valid_name(name)
}

/// The IR's view of a kernel and its predicate.
fn registration(name: &str, predicate: Option<Arc<KernelPredicate>>, kernel: Arc<KernelFn>) -> Registration {
    let accepts = predicate.map(|p| Arc::new(move |types: &[TensorType]| p(&specs(types))) as Arc<TypePredicate>);
    Registration { kernel: Arc::new(RegisteredKernel { name: name.to_string(), kernel }), accepts }
}

fn specs(types: &[TensorType]) -> Vec<TensorSpec> {
    types.iter().map(|ty| TensorSpec { ty: ty.clone() }).collect()
}

/// Registers `kernel` for the composite op `name`, for every argument type.
///
/// # Panics
///
/// If `name` is not of the form `org.semantic.opname`.
#[track_caller]
pub fn register_kernel<F>(name: &str, kernel: F)
where
    F: Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync + 'static,
{
    ensure_builtins();
    registry::register(name, registration(name, None, Arc::new(kernel)));
}

/// Registers `kernel` for the composite op `name`, used only for calls whose
/// argument specs `predicate` accepts.
///
/// # Panics
///
/// If `name` is not of the form `org.semantic.opname`.
#[track_caller]
pub fn register_kernel_with<P, F>(name: &str, predicate: P, kernel: F)
where
    P: Fn(&[TensorSpec]) -> bool + Send + Sync + 'static,
    F: Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync + 'static,
{
    ensure_builtins();
    registry::register(name, registration(name, Some(Arc::new(predicate)), Arc::new(kernel)));
}

/// Tests `kernel` against the composite's primitive `body` (both over eager
/// tensors) on random inputs of `specs`: normal samples for floats, zeros
/// for integers, `false` for bools; every `-1` dim takes the sizes 0, 1, 3
/// and 5, over several seeds. Float results must agree within a kernel's
/// tolerance (`tracejit_ir::tolerance::KERNEL_BUDGET` epsilons of the
/// results' magnitude), others exactly, with the same dtypes and shapes.
/// `Err` names the input sizes, the output and the largest difference.
pub fn check_kernel<B, F>(specs: &[TensorSpec], body: B, kernel: F) -> Result<(), String>
where
    B: Fn(&[Tensor]) -> Vec<Tensor>,
    F: Fn(&[Tensor]) -> Vec<Tensor>,
{
    for size in [0usize, 1, 3, 5] {
        for seed in 0..3u64 {
            let inputs: Vec<Tensor> = specs
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let shape: Vec<usize> = s.ty.dims.iter().map(|d| d.unwrap_or(size)).collect();
                    match s.ty.dtype {
                        tracejit_tensor::DType::F32 | tracejit_tensor::DType::F64 => {
                            Tensor::randn(&shape, seed * 31 + i as u64).cast(s.ty.dtype)
                        }
                        _ => Tensor::zeros(&shape, s.ty.dtype),
                    }
                })
                .collect();
            let shapes: Vec<String> = inputs.iter().map(|t| t.tensor_type().to_string()).collect();
            let run = |f: &dyn Fn(&[Tensor]) -> Vec<Tensor>| {
                tracejit_ir::catch_quietly(|| f(&inputs)).map_err(|p| tracejit_ir::panic_message(&*p))
            };
            let expected = run(&body).map_err(|m| format!("the body fails on ({}): {m}", shapes.join(", ")))?;
            let got = run(&kernel).map_err(|m| format!("the kernel fails on ({}): {m}", shapes.join(", ")))?;
            compare_outputs(&inputs, &expected, &got).map_err(|d| format!("on inputs ({}), {d}", shapes.join(", ")))?;
        }
    }
    Ok(())
}

/// Compares a kernel's results `got` with the body's `expected` on
/// `inputs`: the same count, dtypes and shapes, float values within a
/// kernel's tolerance (`tracejit_ir::tolerance::KERNEL_BUDGET` epsilons of
/// the largest magnitude among inputs and results; NaN where the body has
/// NaN), others exactly. `Err` names the output and the largest difference.
pub fn compare_outputs(inputs: &[Tensor], expected: &[Tensor], got: &[Tensor]) -> Result<(), String> {
    use tracejit_ir::tolerance::{self, Budget};
    if got.len() != expected.len() {
        return Err(format!("the kernel returns {} values, the body {}", got.len(), expected.len()));
    }
    for (k, (e, g)) in expected.iter().zip(got).enumerate() {
        let (e, g) = (e.storage().map_err(|x| x.to_string())?, g.storage().map_err(|x| x.to_string())?);
        let scale = inputs
            .iter()
            .filter_map(|t| t.storage().ok().map(tolerance::magnitude))
            .fold(tolerance::magnitude(e), f64::max);
        let budget = Budget { eps: tolerance::KERNEL_BUDGET, scale: scale.max(1.0), unverifiable: false };
        if let Some(d) = tolerance::compare(e, g, &budget) {
            return Err(format!("output {k} ({}{:?}) differs from the body's: {d}", g.dtype(), g.shape()));
        }
    }
    Ok(())
}

/// [`register_kernel`] after [`check_kernel`] passed: a kernel that does
/// not agree with the composite's primitive `body` on random inputs of
/// `specs` is not registered, and the `Err` says where it differs.
///
/// ```
/// use tracejit_nn::composite;
/// use tracejit_trace::{DType, Tensor, TensorSpec};
///
/// let specs = [TensorSpec::new(DType::F32, &[-1])];
/// let body = |x: &[Tensor]| vec![&x[0] * &x[0] + 1.0];
/// let wrong = composite::register_kernel_checked("example.doc.sq1", &specs, body, |x: &[Tensor]| vec![&x[0] * 2.0]);
/// assert!(wrong.unwrap_err().contains("differs from the body"));
/// composite::register_kernel_checked("example.doc.sq1", &specs, body, |x: &[Tensor]| vec![x[0].square() + 1.0])?;
/// assert!(composite::registered_kernels().contains(&"example.doc.sq1".to_string()));
/// # Ok::<(), String>(())
/// ```
///
/// # Panics
///
/// If `name` is not of the form `org.semantic.opname`.
#[track_caller]
pub fn register_kernel_checked<B, F>(name: &str, specs: &[TensorSpec], body: B, kernel: F) -> Result<(), String>
where
    B: Fn(&[Tensor]) -> Vec<Tensor>,
    F: Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync + 'static,
{
    assert!(is_valid_name(name), "register_kernel_checked: `{name}` is not of the form `org.semantic.opname`");
    check_kernel(specs, body, &kernel).map_err(|m| format!("kernel `{name}`: {m}; it was not registered"))?;
    register_kernel(name, kernel);
    Ok(())
}

/// Removes the kernel registered for `name`; true if there was one.
pub fn unregister(name: &str) -> bool {
    ensure_builtins();
    registry::unregister(name)
}

/// The names with a registered kernel, sorted.
pub fn registered_kernels() -> Vec<String> {
    ensure_builtins();
    registry::names()
}

/// The kernel registered for `name` if it accepts arguments of these specs.
pub fn lookup(name: &str, specs: &[TensorSpec]) -> Option<Arc<KernelFn>> {
    ensure_builtins();
    let types: Vec<TensorType> = specs.iter().map(|s| s.ty.clone()).collect();
    let kernel = registry::lookup(name, &types)?;
    let name = name.to_string();
    Some(Arc::new(move |inputs: &[Tensor]| {
        let storages: Vec<Storage> = inputs
            .iter()
            .map(|t| match t.storage() {
                Ok(s) => s.clone(),
                Err(_) => panic!("composite kernel `{name}` called with a symbolic tensor"),
            })
            .collect();
        kernel.run(&storages, Isa::current()).into_iter().map(Tensor::from_raw_storage).collect()
    }))
}

/// A kernel over eager tensors as the IR runs it.
struct RegisteredKernel {
    name: String,
    kernel: Arc<KernelFn>,
}

impl fmt::Debug for RegisteredKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegisteredKernel({:?})", self.name)
    }
}

impl ExternalKernel for RegisteredKernel {
    /// A user's kernel is a closure over tensors: it chooses its own code.
    fn run(&self, inputs: &[Storage], _isa: Isa) -> Vec<Storage> {
        let tensors: Vec<Tensor> = inputs.iter().cloned().map(Tensor::from_raw_storage).collect();
        (self.kernel)(&tensors)
            .into_iter()
            .map(|t| match t.storage() {
                Ok(s) => s.clone(),
                Err(_) => panic!("composite kernel `{}` returned a symbolic tensor", self.name),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_names_panic() {
        let e = std::panic::catch_unwind(|| register_kernel("gelu", |x: &[Tensor]| x.to_vec())).unwrap_err();
        assert!(e.downcast_ref::<String>().unwrap().contains("org.semantic.opname"));
    }

    #[test]
    fn the_builtins_are_registered_lazily() {
        let names = registered_kernels();
        for n in ["tracejit.nn.gelu", "tracejit.nn.softmax", "tracejit.nn.layer_norm", "tracejit.nn.lstm_cell"] {
            assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
        }
    }

    #[test]
    fn lookup_runs_the_registered_closure_and_checks_the_predicate() {
        let name = "tests.nn_composite.lookup";
        register_kernel_with(name, |s: &[TensorSpec]| s.len() == 1, |x: &[Tensor]| vec![&x[0] + 1.0]);
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
        let spec = TensorSpec::new(tracejit_trace::DType::F32, &[2]);
        let k = lookup(name, std::slice::from_ref(&spec)).expect("accepted");
        assert_eq!(k(&[x])[0].to_vec::<f32>().unwrap(), [2.0, 3.0]);
        assert!(lookup(name, &[spec.clone(), spec]).is_none());
        assert!(unregister(name));
    }
}
