//! Looking at run-time values inside compiled functions, as
//! `jax.debug.print` / `jax.debug.callback` and `tf.print` do.
//!
//! A `println!` in a traced closure runs once, while tracing, and shows
//! symbolic tensors. [`print`] and [`callback`] instead record a node that
//! runs on every call of the compiled function (and on every trip of a loop
//! it sits in), with the values of that call. The node is stateful (an
//! `Op::Kernel` whose effects say it writes): the passes never fold, merge
//! or drop it, and it runs in program order with variable reads and writes
//! and the other debug nodes. Eagerly, both act at once.
//!
//! Inside `vmap` the callback sees the batched values (the batch axis in
//! front), once per call of the mapped function, as `jax.debug.print`
//! (a node whose arguments are all unmapped sees them as they are).
//! Under `function(..).validate(true)` the interpreter runs the graph as
//! well, so each node acts twice per call. ONNX export leaves the nodes
//! out (ONNX has no printing).

use std::fmt;
use std::sync::Arc;

use tracejit_ir::{Effects, ExternalKernel, Op};
use tracejit_tensor::Storage;

use crate::context;
use crate::tensor::Tensor;

/// The pseudo-variable all debug nodes "write", so that each is ordered
/// after the one before it (and after earlier variable accesses).
const DEBUG_STREAM: u64 = u64::MAX - 7;

type Callback = dyn Fn(&[Tensor]) + Send + Sync;

/// The kernel behind a debug node: hands its inputs to the closure.
struct DebugKernel {
    what: &'static str,
    f: Arc<Callback>,
}

impl fmt::Debug for DebugKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DebugKernel({})", self.what)
    }
}

impl ExternalKernel for DebugKernel {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        let tensors: Vec<Tensor> = inputs.iter().cloned().map(Tensor::from_storage).collect();
        (self.f)(&tensors);
        Vec::new()
    }

    fn effects(&self) -> Effects {
        Effects::WRITES
    }

    // Under `vmap` the node is called once with the whole batch (its
    // values with the batch axis in front), as `jax.debug.print` prints
    // batched values.
    fn maps_leading_axis(&self) -> bool {
        true
    }
}

/// Prints `format` with each `{}` replaced by the next of `args`'
/// run-time values, on every call: eagerly at once, inside a compiled
/// function each time the node runs (as `jax.debug.print`). `{{` and `}}`
/// print braces; a `{}` without an argument prints as is.
///
/// ```
/// use tracejit_trace::{debug, function, Tensor};
///
/// let f = function(|x: Tensor| {
///     let h = &x * 2.0;
///     debug::print("h = {}", &[&h]); // runs on every call, with that call's h
///     h.sum_all()
/// });
/// f.call(Tensor::from_vec(vec![1.0f32, 2.0], &[2]))?; // prints h = [2, 4]
/// f.call(Tensor::from_vec(vec![3.0f32, 4.0], &[2]))?; // prints h = [6, 8]
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn print(format: &str, args: &[&Tensor]) {
    let format = format.to_string();
    callback_named("print", args, move |vals: &[Tensor]| println!("{}", render(&format, vals)));
}

/// Calls `f` with `args`' run-time values (eager tensors) on every call:
/// eagerly at once, inside a compiled function each time the node runs (as
/// `jax.debug.callback`). Its return is ignored; it must not call back into
/// the function that holds it.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tracejit_trace::{debug, function, Tensor};
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let f = function(move |x: Tensor| {
///     let log = log.clone();
///     debug::callback(&[&x], move |v: &[Tensor]| log.lock().unwrap().push(v[0].to_vec::<f32>().unwrap()));
///     &x + 1.0
/// });
/// f.call(Tensor::from_vec(vec![1.0f32], &[1]))?;
/// f.call(Tensor::from_vec(vec![5.0f32], &[1]))?;
/// assert_eq!(*seen.lock().unwrap(), vec![vec![1.0], vec![5.0]]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn callback(args: &[&Tensor], f: impl Fn(&[Tensor]) + Send + Sync + 'static) {
    callback_named("callback", args, f)
}

#[track_caller]
fn callback_named(what: &'static str, args: &[&Tensor], f: impl Fn(&[Tensor]) + Send + Sync + 'static) {
    if context::current_function().is_none() {
        let vals: Vec<Tensor> = args.iter().map(|t| (*t).clone()).collect();
        f(&vals);
        return;
    }
    let inputs = args.iter().map(|t| t.tensor_type()).collect();
    let kernel: Arc<dyn ExternalKernel> = Arc::new(DebugKernel { what, f: Arc::new(f) });
    let op = Op::Kernel { name: format!("{PREFIX}{what}"), kernel, inputs, outputs: Vec::new() };
    record(op, args);
}

/// The name prefix of the debug nodes' kernels.
const PREFIX: &str = "tracejit.debug.";

/// True for a debug node (`vmap` records its batched form with [`record`]).
pub(crate) fn is_debug_node(op: &Op) -> bool {
    matches!(op, Op::Kernel { name, .. } if name.starts_with(PREFIX))
}

/// Runs the debug node `op` on eager `args` now, or records it in the
/// innermost trace after every variable access and debug node so far
/// (later ones come after it).
#[track_caller]
pub(crate) fn record(op: Op, args: &[&Tensor]) {
    if args.iter().all(|t| !t.is_symbolic()) && context::current_function().is_none() {
        crate::interpreters::apply(op, args);
        return;
    }
    let control = context::all_variable_accesses();
    let (node, _) = context::record_in_current(op, args, &control).expect("a trace is active");
    context::note_barrier(node, std::iter::once(DEBUG_STREAM));
}

/// `format` with each `{}` replaced by the next value.
fn render(format: &str, vals: &[Tensor]) -> String {
    let mut out = String::new();
    let mut vals = vals.iter();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('{', Some('{')) | ('}', Some('}')) => {
                chars.next();
                out.push(c);
            }
            ('{', Some('}')) => {
                chars.next();
                match vals.next() {
                    Some(v) => out.push_str(&v.to_string()),
                    None => out.push_str("{}"),
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_placeholders_in_order() {
        let a = Tensor::scalar(1.5f32);
        let b = Tensor::from_vec(vec![1i64, 2], &[2]);
        assert_eq!(render("a={} b={} {{x}} {}", &[a.clone(), b.clone()]), format!("a={a} b={b} {{x}} {{}}"));
    }
}
