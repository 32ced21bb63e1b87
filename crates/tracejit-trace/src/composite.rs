//! The registry of composite kernels (`tracejit::composite`): native Rust
//! code over eager tensors that the implementation selector puts in place of
//! a call to a function marked `implements("org.semantic.opname")`, as in
//! TensorFlow's RFC "Standardizing Composite Operations".
//!
//! ```
//! use tracejit_trace::{composite, function, Tensor};
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
//!   functions traced before a registration keep what they chose.
//! - Names are validated ([`is_valid_name`]); a malformed one panics.
//! - The kernels of `tracejit::nn` are registered lazily, on the first use
//!   of the registry; they can be replaced or unregistered like any other.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Once, RwLock};

use tracejit_ir::passes::KernelRegistry;
use tracejit_ir::{ExternalKernel, TensorType};
use tracejit_tensor::Storage;

use crate::{Tensor, TensorSpec};

/// A composite kernel: native code over eager tensors.
pub type KernelFn = dyn Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync;

/// Says which argument specs a kernel accepts.
pub type KernelPredicate = dyn Fn(&[TensorSpec]) -> bool + Send + Sync;

#[derive(Clone)]
struct Entry {
    kernel: Arc<KernelFn>,
    predicate: Option<Arc<KernelPredicate>>,
}

static TABLE: LazyLock<RwLock<HashMap<String, Entry>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
static BUILTINS: Once = Once::new();

/// The table, with the built-in kernels registered on first use.
fn table() -> &'static RwLock<HashMap<String, Entry>> {
    BUILTINS.call_once(|| {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        for (name, predicate, kernel) in crate::nn::builtin_kernels() {
            t.insert(name.to_string(), Entry { kernel, predicate: Some(predicate) });
        }
    });
    &TABLE
}

/// True for names of the form `org.semantic.opname`: three or more
/// dot-separated, non-empty parts of ASCII letters, digits and `_`.
pub fn is_valid_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() >= 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

#[track_caller]
fn check_name(name: &str) {
    assert!(
        is_valid_name(name),
        "register_kernel: `{name}` is not of the form `org.semantic.opname` \
         (three or more dot-separated names of letters, digits and `_`)"
    );
}

fn insert(name: &str, entry: Entry) {
    let replaced = table().write().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), entry).is_some();
    if replaced {
        log::info!("tracejit: composite kernel `{name}` registered again; the latest registration wins");
    } else {
        log::debug!("tracejit: composite kernel `{name}` registered");
    }
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
    check_name(name);
    insert(name, Entry { kernel: Arc::new(kernel), predicate: None });
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
    check_name(name);
    insert(name, Entry { kernel: Arc::new(kernel), predicate: Some(Arc::new(predicate)) });
}

/// Removes the kernel registered for `name`; true if there was one.
pub fn unregister(name: &str) -> bool {
    table().write().unwrap_or_else(|e| e.into_inner()).remove(name).is_some()
}

/// The names with a registered kernel, sorted.
pub fn registered_kernels() -> Vec<String> {
    let mut names: Vec<String> = table().read().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
    names.sort();
    names
}

/// The kernel registered for `name` if it accepts arguments of these specs.
pub fn lookup(name: &str, specs: &[TensorSpec]) -> Option<Arc<KernelFn>> {
    let entry = table().read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()?;
    entry.predicate.is_none_or(|p| p(specs)).then_some(entry.kernel)
}

/// A registered kernel as the IR runs it.
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
    fn run(&self, inputs: &[Storage]) -> Vec<Storage> {
        let tensors: Vec<Tensor> = inputs.iter().cloned().map(Tensor::from_storage).collect();
        (self.kernel)(&tensors)
            .into_iter()
            .map(|t| match t.storage() {
                Ok(s) => s.clone(),
                Err(_) => panic!("composite kernel `{}` returned a symbolic tensor", self.name),
            })
            .collect()
    }
}

/// The registry as the implementation selector sees it.
struct Registry;

impl KernelRegistry for Registry {
    fn lookup(&self, name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>> {
        let specs: Vec<TensorSpec> = inputs.iter().map(|ty| TensorSpec { ty: ty.clone() }).collect();
        let kernel = lookup(name, &specs)?;
        Some(Arc::new(RegisteredKernel { name: name.to_string(), kernel }))
    }
}

/// The registry handle given to the pass pipeline.
pub(crate) fn kernel_registry() -> Arc<dyn KernelRegistry> {
    Arc::new(Registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(is_valid_name("tracejit.nn.gelu"));
        assert!(is_valid_name("org.my_lab.op2.v1"));
        for bad in ["gelu", "a.b", "a..b", ".a.b", "a.b.", "a.b c.d", "a.b-c.d", ""] {
            assert!(!is_valid_name(bad), "{bad}");
        }
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
}
