//! [`call_external`]: running a native kernel from a crate above this one
//! as one op, eagerly and inside traced functions, with a gradient rule
//! of its own. `tracejit::distributed`'s collectives are built on it.
//!
//! Eagerly the kernel runs at once on the inputs' values. Inside a trace it
//! becomes an `Op::Kernel` node. A kernel whose [`ExternalKernel::effects`]
//! write is treated as `tracejit::debug::print`'s node is: it comes after
//! every variable access recorded so far and before every later one (and
//! after the previous node of its `stream`), so passes never fold, merge or
//! drop it and executors run it in program order with the other effects.
//!
//! The gradient rule ([`ExternalCall::vjp`]) is recorded on the tapes as a
//! closure, as an eager `custom_gradient` is: the tape never looks inside
//! the kernel, and a rule written in tensor ops (which may call
//! `call_external` again) is traced into the same graph when the tape
//! runs inside a function. A compiled function holding such a node,
//! differentiated by a tape *around* its call, reaches the node without
//! its rule and fails with an error naming the kernel.

use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;

use tracejit_ir::{ExternalKernel, Op, TensorType};

use crate::context;
use crate::tensor::Tensor;

/// The gradient rule of an external op: `(inputs, outputs, output
/// cotangents) -> one gradient per input` (`None`: no gradient).
pub type ExternalVjp = dyn Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Vec<Option<Tensor>> + Send + Sync;

/// One call of a native kernel: what [`call_external`] records.
#[derive(Clone)]
pub struct ExternalCall {
    /// The node's name in listings and errors (`tracejit.distributed.all_reduce`).
    pub name: String,
    /// The kernel; its `effects` decide whether the node is ordered with the
    /// trace's other effects.
    pub kernel: Arc<dyn ExternalKernel>,
    /// The type of each output (unknown dims allowed inside a trace).
    pub outputs: Vec<TensorType>,
    /// Nodes of one stream (any `u64` a crate reserves for itself; it must
    /// not be a variable's id, which count up from 1) run in the order they
    /// were recorded even when their effects say nothing.
    pub stream: Option<u64>,
    /// The gradient rule, or `None` when the op has no gradient (reaching
    /// it in a gradient is then an error naming the kernel).
    pub vjp: Option<Arc<ExternalVjp>>,
}

/// Runs `call` on `args`: at once when no function is being traced,
/// otherwise as a node of the innermost trace (see the module's docs).
///
/// ```
/// use std::sync::Arc;
/// use tracejit_ir::{ExternalKernel, TensorType};
/// use tracejit_tensor::Storage;
/// use tracejit_trace::{call_external, function, ExternalCall, Tensor};
///
/// #[derive(Debug)]
/// struct Twice;
/// impl ExternalKernel for Twice {
///     fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
///         let v: Vec<f32> = inputs[0].to_vec().unwrap();
///         vec![Storage::from_vec(v.iter().map(|x| 2.0 * x).collect(), inputs[0].shape()).unwrap()]
///     }
/// }
/// let twice = |x: &Tensor| {
///     let call = ExternalCall {
///         name: "example.twice".into(),
///         kernel: Arc::new(Twice),
///         outputs: vec![x.tensor_type()],
///         stream: None,
///         vjp: Some(Arc::new(|_, _, cts| vec![cts[0].as_ref().map(|g| g * 2.0)])),
///     };
///     call_external(&call, &[x]).remove(0)
/// };
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
/// assert_eq!(twice(&x).to_vec::<f32>()?, [2.0, 4.0]);
/// let f = function(move |x: Tensor| twice(&x) + 1.0);
/// assert_eq!(f.call(x)?.to_vec::<f32>()?, [3.0, 5.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn call_external(call: &ExternalCall, args: &[&Tensor]) -> Vec<Tensor> {
    let outs = if context::current_function().is_none() { run_now(call, args) } else { record(call, args) };
    if let (Some(vjp), true) = (&call.vjp, crate::tape::recording()) {
        let vjp = vjp.clone();
        let rule = move |ins: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| Ok(vjp(ins, outs, cts));
        crate::tape::record_closure(Rc::new(rule), args, &outs, Location::caller());
    }
    outs
}

/// The eager path: the kernel on the inputs' values, its results checked
/// against the declared outputs.
fn run_now(call: &ExternalCall, args: &[&Tensor]) -> Vec<Tensor> {
    let storages: Vec<_> = args.iter().map(|t| t.eager_storage().clone()).collect();
    let outs = call.kernel.run(&storages, tracejit_kernels::Isa::current());
    assert_eq!(
        outs.len(),
        call.outputs.len(),
        "{}: the kernel returned {} values for {} declared outputs",
        call.name,
        outs.len(),
        call.outputs.len()
    );
    for (i, (s, t)) in outs.iter().zip(&call.outputs).enumerate() {
        assert!(
            t.accepts(s.dtype(), s.shape()),
            "{}: output {i} is {:?} {:?}, declared {t:?}",
            call.name,
            s.dtype(),
            s.shape()
        );
    }
    outs.into_iter().map(Tensor::from_storage).collect()
}

/// The traced path: an `Op::Kernel` node, ordered with the trace's effects
/// when the kernel has any.
#[track_caller]
fn record(call: &ExternalCall, args: &[&Tensor]) -> Vec<Tensor> {
    let op = Op::Kernel {
        name: call.name.clone(),
        kernel: call.kernel.clone(),
        inputs: args.iter().map(|t| t.tensor_type()).collect(),
        outputs: call.outputs.clone(),
    };
    let effectful = !call.kernel.effects().is_pure() || call.stream.is_some();
    let control = if effectful { context::all_variable_accesses() } else { Vec::new() };
    let (node, outs) = context::record_in_current(op, args, &control).expect("a trace is active");
    if effectful {
        context::note_barrier(node, call.stream.into_iter());
    }
    outs
}
