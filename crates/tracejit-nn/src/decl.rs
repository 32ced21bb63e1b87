//! [`Composite`]: one composite op declared once — its `implements` name,
//! its primitive body, its native kernel with the predicate saying which
//! arguments the kernel accepts, and its backward kernel — as a `static`
//! the rest of the crate refers to by Rust name.
//!
//! Why: a composite used to be spread over four places (the body and its
//! `Function`, the kernel table, the backward table, the public function),
//! each naming it by string, so a misspelled name fell back to the body
//! without a word. Now the name is written once, in the declaration;
//! [`declared`] lists every declaration, and the tests iterate it (kernel
//! against body, backward kernel against the body's VJP, an ONNX local
//! function for each), so a new composite is tested by being declared.
//!
//! The process-wide tables stay keyed by name (`tracejit_ir::registry`
//! for kernels, the tape's table for backward kernels) because users
//! register and replace kernels by name (`tracejit::composite`); the
//! declarations fill them once ([`crate::composite::ensure_builtins`]) and
//! never replace what a user registered first.
//!
//! Every composite's `Function` takes `(Vec<Tensor>, Static<u32>)`: the
//! tensor arguments in order and one static attribute (the activation of
//! [`crate::dense`]; 0 for the others), so one type serves them all.

use std::fmt;
use std::sync::{Arc, Once, OnceLock};

use tracejit_ir::registry::{Registration, TypePredicate};
use tracejit_ir::{ExternalKernel, TensorType};
use tracejit_kernels::Isa;
use tracejit_tensor::{DType, Storage};
use tracejit_trace::{function, Function, GradientTape, Static, Tensor, TensorSpec};

/// A composite's primitive body: tensor arguments and the static
/// attribute in, results out. Written with primitives only (never another
/// composite), so `selector(false)` on a caller means "no kernels".
pub type BodyFn = fn(&[Tensor], u32) -> Vec<Tensor>;

/// Native code for a composite: the call's argument values in order to
/// its results in order, with the vector code the caller allows. It takes
/// and returns [`Storage`], as the IR runs kernels
/// ([`ExternalKernel::run`]), so a call converts nothing; the public
/// closure over tensors is [`crate::composite::lookup`]'s.
pub type NativeFn = fn(&[Storage], Isa) -> Vec<Storage>;

/// Which argument specs a native kernel accepts.
pub type AcceptsFn = fn(&[TensorSpec]) -> bool;

/// A backward kernel: the call's inputs, outputs and output cotangents
/// (`None`: zero) to the inputs' cotangents (`None`: no gradient); written
/// with tensor ops, so it runs eagerly and inside traces alike.
pub type BackwardFn = fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Vec<Option<Tensor>>;

/// Inputs to test a composite on: argument sets with their attribute,
/// including odd sizes.
pub type ExamplesFn = fn() -> Vec<(Vec<Tensor>, u32)>;

/// A native kernel and the arguments it accepts.
#[derive(Clone, Copy)]
pub struct Native {
    /// True for argument specs the kernel handles (else the body runs).
    pub accepts: AcceptsFn,
    /// The kernel.
    pub run: NativeFn,
}

/// How many traces each composite's process-wide `Function` keeps (see
/// [`Composite::function`]): past it, the least recently used is evicted
/// and traced again if a later call needs it.
pub const COMPOSITE_MAX_TRACES: usize = 32;

/// The `Function` every composite is traced as.
type CompositeFunction = Function<(Vec<Tensor>, Static<u32>), Vec<Tensor>>;

/// One composite op, declared once (see the module documentation).
pub struct Composite {
    name: &'static str,
    short: &'static str,
    body: BodyFn,
    kernel: Option<Native>,
    /// The kernel's mixed-precision form (bf16 products), if any.
    mixed: Option<NativeFn>,
    backward: Option<BackwardFn>,
    examples: ExamplesFn,
    /// Compiled code runs the body, eager calls the kernel
    /// ([`Composite::traced_as_body`]).
    traced_as_body: bool,
    function: OnceLock<CompositeFunction>,
    /// Set once this declaration's kernels are in the process-wide tables
    /// (see [`Composite::call`]).
    registered: Once,
}

impl fmt::Debug for Composite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Composite({})", self.name)
    }
}

impl Composite {
    /// A declaration: `name` is the `implements` name
    /// (`tracejit.nn.gelu`), `short` the traced function's name (`gelu`).
    pub(crate) const fn new(
        name: &'static str,
        short: &'static str,
        body: BodyFn,
        kernel: Option<Native>,
        backward: Option<BackwardFn>,
        examples: ExamplesFn,
    ) -> Composite {
        Composite {
            name,
            short,
            body,
            kernel,
            mixed: None,
            backward,
            examples,
            traced_as_body: false,
            function: OnceLock::new(),
            registered: Once::new(),
        }
    }

    /// The kernel's form under mixed precision (`mixed_precision(BF16)`
    /// on a function): the same arguments and results, its products on
    /// bf16 operands with f32 accumulation
    /// ([`ExternalKernel::mixed_precision`]).
    pub(crate) const fn with_mixed_precision(mut self, run: NativeFn) -> Composite {
        self.mixed = Some(run);
        self
    }

    /// The native kernel serves eager calls only; in a traced function the
    /// selector inlines the body, which the JIT fuses with its neighbours
    /// and splits over threads ([`ExternalKernel::eager_only`]).
    pub(crate) const fn traced_as_body(mut self) -> Composite {
        self.traced_as_body = true;
        self
    }

    /// The `implements` name, `org.semantic.opname`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The declared native kernel, if any (a user may have registered
    /// another one under [`Composite::name`]).
    pub fn native(&self) -> Option<Native> {
        self.kernel
    }

    /// True when compiled code runs the body and only eager calls the
    /// native kernel ([`ExternalKernel::eager_only`]).
    pub fn runs_body_when_traced(&self) -> bool {
        self.traced_as_body
    }

    /// The declared backward kernel, if any.
    pub fn backward(&self) -> Option<BackwardFn> {
        self.backward
    }

    /// Argument sets the tests run the composite on.
    pub fn examples(&self) -> Vec<(Vec<Tensor>, u32)> {
        (self.examples)()
    }

    /// The primitive body on `inputs`, eagerly or recorded in the current
    /// trace, as plain ops (never a call of the composite).
    pub fn run_body(&self, inputs: &[Tensor], attr: u32) -> Vec<Tensor> {
        (self.body)(inputs, attr)
    }

    /// The composite's shared `Function` (one per process: every caller
    /// shares its traces), marked `implements(name)`. It keeps at most
    /// [`COMPOSITE_MAX_TRACES`] traces, evicting the least recently used,
    /// so a program calling `softmax` on ever new shapes holds a bounded
    /// amount of memory whatever its own functions' bounds are (10,000
    /// shapes used to keep 148 MB here after the caller was dropped).
    /// Evicting a trace costs a caller that recorded a call of it nothing:
    /// the caller's graph holds the body itself (shared, not looked up).
    pub fn function(&'static self) -> &'static CompositeFunction {
        self.function.get_or_init(|| {
            function(move |(xs, attr): (Vec<Tensor>, Static<u32>)| (self.body)(&xs, *attr))
                .name(self.short)
                .implements(self.name)
                .max_traces(COMPOSITE_MAX_TRACES)
        })
    }

    /// Runs the composite: eagerly when every input is eager and no tape
    /// records (through the kernel registered for its name when one
    /// accepts the arguments, else the body), otherwise as a call of its
    /// `Function`, which traces record and tapes differentiate (with the
    /// backward kernel registered for its name, if any).
    ///
    /// # Panics
    /// As an op panics: on arguments the body rejects, naming the
    /// composite and the user's line.
    #[track_caller]
    pub fn call(&'static self, inputs: &[&Tensor], attr: u32) -> Vec<Tensor> {
        crate::composite::ensure_builtins();
        // A declaration registers itself too: one left out of
        // `composites::ALL` still runs its kernels, never silently its body
        // (debug builds also fail loudly on the omission, in `register`).
        self.register_once();
        // Under a gradient tape the composite runs as a call of its
        // function, which the tapes record (with its backward kernel); a
        // bare native kernel would hide it from them.
        if inputs.iter().all(|t| !t.is_symbolic()) && !GradientTape::any_recording() {
            let specs: Vec<TensorSpec> = inputs.iter().map(|t| TensorSpec { ty: t.tensor_type() }).collect();
            let args: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
            return match crate::composite::lookup(self.name, &specs) {
                Some(kernel) => kernel(&args),
                None => (self.body)(&args, attr),
            };
        }
        let args: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        let call = || self.function().call((args, Static(attr)));
        // The call node takes the user's line, not this one.
        tracejit_trace::attributed_to(std::panic::Location::caller(), call)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    /// [`Composite::register`], the first time only: a user's later
    /// `unregister` or replacement is never undone.
    pub(crate) fn register_once(&'static self) {
        self.registered.call_once(|| self.register());
    }

    /// The declared kernel and backward kernel as the process-wide tables
    /// hold them, unless a user registered their own first.
    fn register(&'static self) {
        debug_assert!(
            declared().iter().any(|c| std::ptr::eq(*c, self)),
            "composite `{}` is declared but missing from `composites::ALL`: its kernels would be registered only on its \
             first call, and the tests that iterate `declared()` would skip it",
            self.name
        );
        if let Some(native) = self.kernel {
            let accepts: Arc<TypePredicate> = Arc::new(move |types: &[TensorType]| {
                let specs: Vec<TensorSpec> = types.iter().map(|ty| TensorSpec { ty: ty.clone() }).collect();
                (native.accepts)(&specs)
            });
            let kernel = Arc::new(DeclaredKernel { composite: self, run: native.run, mixed: self.mixed });
            tracejit_ir::registry::register_default(self.name, Registration { kernel, accepts: Some(accepts) });
        }
        if let Some(backward) = self.backward {
            tracejit_trace::register_gradient(self.name, backward);
        }
    }
}

/// A declared native kernel as the IR runs it: with the executor's
/// [`Isa`].
struct DeclaredKernel {
    composite: &'static Composite,
    run: NativeFn,
    /// The mixed-precision form; `None` for that form itself.
    mixed: Option<NativeFn>,
}

impl fmt::Debug for DeclaredKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lowp = self.composite.mixed.is_some() && self.mixed.is_none();
        write!(f, "DeclaredKernel({}{})", self.composite.name, if lowp { ", bf16 products" } else { "" })
    }
}

impl ExternalKernel for DeclaredKernel {
    fn run(&self, inputs: &[Storage], isa: Isa) -> Vec<Storage> {
        (self.run)(inputs, isa)
    }

    fn eager_only(&self) -> bool {
        self.composite.traced_as_body
    }

    fn mixed_precision(&self, low: DType) -> Option<Arc<dyn ExternalKernel>> {
        let run = self.mixed.filter(|_| low == DType::BF16)?;
        Some(Arc::new(DeclaredKernel { composite: self.composite, run, mixed: None }))
    }
}

/// Every composite of `tracejit::nn`, in a fixed order: what
/// [`crate::composite::ensure_builtins`] registers and the tests iterate.
pub fn declared() -> &'static [&'static Composite] {
    crate::composites::ALL
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A declaration nobody listed in `composites::ALL`.
    static STRAY: Composite =
        Composite::new("tracejit.test.stray", "stray", |x, _| vec![x[0].clone()], None, None, crate::samples::unary);

    /// Forgetting to list a composite fails its first call loudly in
    /// debug builds (the tests' builds), instead of leaving it out of the
    /// tests that iterate `declared()`.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "missing from `composites::ALL`")]
    fn a_declaration_missing_from_the_list_fails_its_first_call() {
        STRAY.call(&[&Tensor::scalar(1.0f32)], 0);
    }

    /// Every listed declaration is registered by the crate's entry points
    /// and once only.
    #[test]
    fn listed_declarations_register_once() {
        crate::composite::ensure_builtins();
        for c in declared() {
            assert!(c.registered.is_completed(), "{} not registered", c.name());
        }
    }
}
