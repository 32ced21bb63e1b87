//! The process-wide table of composite kernels: name -> [`ExternalKernel`]
//! plus a predicate over the call's argument types. The implementation
//! selector reads it through [`global`] (a [`KernelRegistry`]).
//!
//! Why it lives here, at the bottom of the stack: the crate that traces
//! functions (`tracejit-trace`) must consult the table, and the crate that
//! fills it with the built-in kernels and offers the user-facing API over
//! eager tensors (`tracejit-nn`, re-exported as `tracejit::composite`) sits
//! above the tracer. A table both can see, knowing only IR types, keeps the
//! dependencies pointing one way (tensor <- ir <- jit <- trace <- nn) where
//! a registry inside the tracer made `composite`, `function` and `nn` a
//! cycle.
//!
//! Rules:
//! - Names have the form `org.semantic.opname` ([`is_valid_name`]).
//! - [`register`] replaces an earlier kernel of the same name (the latest
//!   wins) and logs it; [`register_default`] only fills a free name, so
//!   built-in kernels registered lazily never replace a user's.
//! - A kernel is resolved when a function is optimized (right after it is
//!   traced): a registration must happen before that trace for the trace to
//!   choose it, and graphs built earlier keep what they chose.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use crate::passes::KernelRegistry;
use crate::{ExternalKernel, TensorType};

/// Says which argument types (dtype and shape, unknown dims `None`) a
/// kernel accepts.
pub type TypePredicate = dyn Fn(&[TensorType]) -> bool + Send + Sync;

/// A registered kernel and the argument types it accepts (`None`: every
/// type).
#[derive(Clone)]
pub struct Registration {
    /// The native code.
    pub kernel: Arc<dyn ExternalKernel>,
    /// Which calls it accepts; `None` accepts every call.
    pub accepts: Option<Arc<TypePredicate>>,
}

impl Registration {
    /// True when the kernel accepts arguments of these types.
    pub fn accepts(&self, inputs: &[TensorType]) -> bool {
        self.accepts.as_ref().is_none_or(|p| p(inputs))
    }
}

static TABLE: LazyLock<RwLock<HashMap<String, Registration>>> = LazyLock::new(|| RwLock::new(HashMap::new()));

fn read() -> std::sync::RwLockReadGuard<'static, HashMap<String, Registration>> {
    // A panic while holding the lock cannot leave the map half-updated
    // (every write is one `insert` or `remove`), so poisoning is ignored.
    TABLE.read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> std::sync::RwLockWriteGuard<'static, HashMap<String, Registration>> {
    TABLE.write().unwrap_or_else(|e| e.into_inner())
}

/// True for names of the form `org.semantic.opname`: three or more
/// dot-separated, non-empty parts of ASCII letters, digits and `_`.
///
/// ```
/// use tracejit_ir::registry::is_valid_name;
/// assert!(is_valid_name("tracejit.nn.gelu"));
/// assert!(!is_valid_name("nn.gelu"));
/// ```
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

/// Registers `registration` for `name`, replacing (and logging) an earlier
/// one; true if there was one.
///
/// # Panics
///
/// If `name` is not of the form `org.semantic.opname`.
#[track_caller]
pub fn register(name: &str, registration: Registration) -> bool {
    check_name(name);
    let replaced = write().insert(name.to_string(), registration).is_some();
    if replaced {
        log::info!("tracejit: composite kernel `{name}` registered again; the latest registration wins");
    } else {
        log::debug!("tracejit: composite kernel `{name}` registered");
    }
    replaced
}

/// Registers `registration` for `name` unless a kernel is registered for it
/// already; true if it was registered. For built-in kernels, which must not
/// replace one the user registered first.
///
/// # Panics
///
/// If `name` is not of the form `org.semantic.opname`.
#[track_caller]
pub fn register_default(name: &str, registration: Registration) -> bool {
    check_name(name);
    let mut table = write();
    if table.contains_key(name) {
        return false;
    }
    table.insert(name.to_string(), registration);
    true
}

/// Removes the kernel registered for `name`; true if there was one.
pub fn unregister(name: &str) -> bool {
    write().remove(name).is_some()
}

/// The names with a registered kernel, sorted.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = read().keys().cloned().collect();
    names.sort();
    names
}

/// The registration for `name`, whatever types it accepts.
pub fn get(name: &str) -> Option<Registration> {
    read().get(name).cloned()
}

/// The kernel registered for `name` if it accepts arguments of these types.
pub fn lookup(name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>> {
    let registration = get(name)?;
    // The predicate runs outside the lock: it is user code and may itself
    // consult the table.
    registration.accepts(inputs).then_some(registration.kernel)
}

/// The table as the implementation selector sees it.
struct Global;

impl KernelRegistry for Global {
    /// Kernels meant for eager calls only ([`ExternalKernel::eager_only`])
    /// are not chosen for graphs.
    fn lookup(&self, name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>> {
        lookup(name, inputs).filter(|k| !k.eager_only())
    }
}

/// The process-wide table as a [`KernelRegistry`], for
/// [`PassContext::with_kernels`](crate::passes::PassContext::with_kernels).
pub fn global() -> Arc<dyn KernelRegistry> {
    Arc::new(Global)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracejit_tensor::{DType, Storage};

    #[derive(Debug)]
    struct Identity;

    impl ExternalKernel for Identity {
        fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
            inputs.to_vec()
        }
    }

    fn identity(accepts: Option<Arc<TypePredicate>>) -> Registration {
        Registration { kernel: Arc::new(Identity), accepts }
    }

    #[test]
    fn names_are_validated() {
        assert!(is_valid_name("tracejit.nn.gelu"));
        assert!(is_valid_name("org.my_lab.op2.v1"));
        for bad in ["gelu", "a.b", "a..b", ".a.b", "a.b.", "a.b c.d", "a.b-c.d", ""] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        let e = std::panic::catch_unwind(|| register("gelu", identity(None))).unwrap_err();
        assert!(e.downcast_ref::<String>().unwrap().contains("org.semantic.opname"));
    }

    #[test]
    fn latest_wins_defaults_do_not_replace_and_predicates_filter() {
        let name = "tests.registry.rules";
        assert!(register_default(name, identity(None)));
        assert!(!register_default(name, identity(Some(Arc::new(|_: &[TensorType]| false)))));
        let f32_only: Arc<TypePredicate> = Arc::new(|t: &[TensorType]| t.iter().all(|t| t.dtype == DType::F32));
        assert!(register(name, identity(Some(f32_only))));
        let ty = |d| TensorType::known(d, &[2]);
        assert!(lookup(name, &[ty(DType::F32)]).is_some());
        assert!(lookup(name, &[ty(DType::F64)]).is_none());
        assert!(global().lookup(name, &[ty(DType::F32)]).is_some());
        assert!(names().iter().any(|n| n == name));
        assert!(unregister(name));
        assert!(!unregister(name));
        assert!(lookup(name, &[ty(DType::F32)]).is_none());
    }
}
