//! The stack of interpreters every op of a tensor program passes through
//! (JAX's trace stack): each layer sees the op, its inputs and where it was
//! called, may answer it itself or hand it down, and sees the results on
//! the way back; the bottom evaluates it — eagerly on storage, or as a node
//! of the innermost trace.
//!
//! The layers, outermost first ([`LAYERS`]):
//!
//! - **tape** (`crate::tape`): records the op on every recording
//!   `GradientTape` that tracks one of its inputs, with the results the
//!   layers below gave (a replayed product included).
//! - **remat** (`crate::remat`): inside a checkpoint's recomputation, a
//!   product its forward saved is answered from the saved value instead of
//!   being recomputed; inside the forward, products are kept.
//!
//! A layer that has nothing to do on this thread now says so
//! ([`Interpreter::active`], a thread-local read), so an op outside any
//! tape or checkpoint goes straight to the bottom. A new per-op transform
//! or effect is a new layer here, not new branches in `apply`.
//!
//! Whole-graph transforms are not layers: `vmap` batches a traced graph,
//! gradients inside traces differentiate one, and collectives are
//! effectful graph nodes ordered by the effect system.

use std::panic::Location;

use smallvec::SmallVec;
use tracejit_ir::Op;

use crate::Tensor;

/// An op's results.
pub(crate) type Outs = SmallVec<[Tensor; 1]>;

/// One op on its way down the stack.
pub(crate) struct OpCall<'a> {
    pub op: Op,
    pub inputs: &'a [&'a Tensor],
    pub location: &'static Location<'static>,
}

/// The layers below the one running (see [`Interpreter::process`]).
pub(crate) struct Next<'n> {
    below: &'n [&'static dyn Interpreter],
    bottom: &'n dyn Fn(OpCall<'_>) -> Outs,
}

impl Next<'_> {
    /// Hands `call` to the next active layer down, else the bottom.
    pub fn run(&self, call: OpCall<'_>) -> Outs {
        run(self.below, call, self.bottom)
    }
}

/// One layer of the stack.
pub(crate) trait Interpreter: Sync {
    /// The layer's name (docs and debugging).
    #[allow(dead_code)]
    fn name(&self) -> &'static str;

    /// Whether the layer has anything to do on this thread now; an
    /// inactive layer is skipped.
    fn active(&self) -> bool;

    /// Processes `call`: answers it, or runs `next` and returns (after
    /// looking at) its results.
    fn process(&self, call: OpCall<'_>, next: &Next<'_>) -> Outs;
}

/// Applies `op` to `inputs` through the stack: the one function every op
/// on `Tensor` goes through. At the bottom it runs eagerly when every input
/// is eager ([`crate::eager::apply_eager`]), otherwise it records a node in
/// the innermost trace ([`crate::context::apply_symbolic`]). Misuse panics
/// with the op's type error, plus the function and source line.
#[track_caller]
pub(crate) fn apply(op: Op, inputs: &[&Tensor]) -> Outs {
    let location = crate::context::node_location(Location::caller());
    run(&LAYERS, OpCall { op, inputs, location }, &evaluate)
}

/// The bottom of the stack.
fn evaluate(call: OpCall<'_>) -> Outs {
    if call.inputs.iter().all(|t| !t.is_symbolic()) {
        crate::eager::apply_eager(call.op, call.inputs, call.location)
    } else {
        crate::context::apply_symbolic(call.op, call.inputs, call.location)
    }
}

/// The layers, outermost first (see the module documentation).
pub(crate) static LAYERS: [&'static dyn Interpreter; 2] = [&crate::tape::TapeLayer, &crate::remat::RematLayer];

/// Runs `call` through `layers` (outermost first) down to `bottom`.
pub(crate) fn run(layers: &[&'static dyn Interpreter], call: OpCall<'_>, bottom: &dyn Fn(OpCall<'_>) -> Outs) -> Outs {
    match layers.iter().position(|l| l.active()) {
        Some(i) => layers[i].process(call, &Next { below: &layers[i + 1..], bottom }),
        None => bottom(call),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    /// A layer that logs the op on the way down and up, and answers
    /// `neg` itself when `answers` is set.
    struct Logging {
        name: &'static str,
        on: bool,
        answers: bool,
    }

    impl Interpreter for Logging {
        fn name(&self) -> &'static str {
            self.name
        }

        fn active(&self) -> bool {
            self.on
        }

        fn process(&self, call: OpCall<'_>, next: &Next<'_>) -> Outs {
            LOG.with(|l| l.borrow_mut().push(format!("{} down {}", self.name, call.op.name())));
            if self.answers && call.op.name() == "neg" {
                return smallvec::smallvec![Tensor::from_vec(vec![42.0f32], &[1])];
            }
            let out = next.run(call);
            LOG.with(|l| l.borrow_mut().push(format!("{} up", self.name)));
            out
        }
    }

    static OUTER: Logging = Logging { name: "outer", on: true, answers: false };
    static OFF: Logging = Logging { name: "off", on: false, answers: true };
    static INNER: Logging = Logging { name: "inner", on: true, answers: true };

    fn log() -> Vec<String> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    #[test]
    fn layers_run_outermost_first_skip_inactive_ones_and_may_answer() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
        let layers: [&'static dyn Interpreter; 3] = [&OUTER, &OFF, &INNER];
        let inputs = [&x];
        let call = |op| OpCall { op, inputs: &inputs, location: Location::caller() };
        let out = run(&layers, call(Op::Unary(tracejit_tensor::UnaryOp::Exp)), &evaluate);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), [1f32.exp(), 2f32.exp()]);
        assert_eq!(log(), ["outer down exp", "inner down exp", "inner up", "outer up"]);
        // The inner layer answers `neg`: the bottom never runs, the outer
        // layer sees its answer.
        let out = run(&layers, call(Op::Unary(tracejit_tensor::UnaryOp::Neg)), &evaluate);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), [42.0]);
        assert_eq!(log(), ["outer down neg", "inner down neg", "outer up"]);
        // No active layer: straight to the bottom.
        let out = run(&[&OFF], call(Op::Unary(tracejit_tensor::UnaryOp::Neg)), &evaluate);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), [-1.0, -2.0]);
        assert!(log().is_empty());
    }
}
