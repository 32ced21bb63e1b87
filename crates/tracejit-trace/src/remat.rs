//! `checkpoint` (rematerialization, `jax.checkpoint`): the backward of a
//! wrapped block recomputes the block from its input instead of keeping
//! its intermediates from the forward, trading compute for memory.
//!
//! Under a gradient tape the block runs with no tape recording, so the
//! tape holds only its input and output; one tape entry stands for the
//! block, and its backward recomputes the block under a tape of its own
//! and differentiates that. Inside a traced function the recomputation
//! must not be merged back into the forward by common-subexpression
//! elimination (that would keep the intermediates alive after all), so
//! the block's input passes through an opaque identity kernel that also
//! reads the incoming cotangent (JAX's `optimization_barrier`): the
//! recomputed ops differ from the forward's and run only once the
//! backward reaches the block.
//!
//! Tensors the block captures (weights) get their gradients too: the
//! block is traced once on a placeholder to find them. State is the
//! forward's (see [`effects`]): the recomputation sees the values the
//! forward read from variables — so it draws the forward's random
//! numbers, and trainable variables read inside the block get their
//! gradients through those values — and writes no variable (a batch
//! norm's moving averages move, a generator advances, once). With
//! [`CheckpointPolicy::DotsSaveable`] the products' outputs are kept from
//! the forward and the recomputation reuses them, as JAX's
//! `dots_saveable`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::{ExternalKernel, Op, TensorType};
use tracejit_tensor::Storage;

pub(crate) mod effects;

use crate::context::{self, push_context, subgraph_context};
use crate::tape::{self, GradientTape};
use crate::{Error, Result, Tensor};

/// What a checkpointed block keeps from its forward for the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CheckpointPolicy {
    /// Nothing: the backward recomputes the whole block
    /// (`jax.checkpoint_policies.nothing_saveable`, the default).
    #[default]
    NothingSaveable,
    /// The outputs of matrix products: the backward recomputes the cheap
    /// ops between them (`jax.checkpoint_policies.dots_saveable`).
    DotsSaveable,
}

/// The block `f` with its intermediates recomputed in the backward
/// instead of kept: same values and gradients as `f`, less memory held
/// between the forward and the backward. The result is `Send` and `Sync`
/// when `f` is (so it can go into `grad` or a `function`).
///
/// ```
/// use tracejit_trace::{checkpoint, grad, Tensor};
///
/// let block = checkpoint(|x: &Tensor| (x * x).tanh().exp());
/// let x = Tensor::from_vec(vec![0.5f64, -1.0], &[2]);
/// let plain = grad(|x: &Tensor| (x * x).tanh().exp().sum_all())(&x);
/// let remat = grad(move |x: &Tensor| block(x).sum_all())(&x);
/// assert_eq!(plain.to_vec::<f64>()?, remat.to_vec::<f64>()?);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn checkpoint<F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + 'static,
{
    checkpoint_with(f, CheckpointPolicy::NothingSaveable)
}

/// [`checkpoint`] with a policy saying what the backward may keep from
/// the forward.
///
/// ```
/// use tracejit_trace::{checkpoint_with, grad, CheckpointPolicy, Tensor};
///
/// let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2]);
/// let layer = checkpoint_with(move |x: &Tensor| x.matmul(&w).tanh(), CheckpointPolicy::DotsSaveable);
/// let g = grad(move |x: &Tensor| layer(x).sum_all())(&Tensor::from_vec(vec![0.1f64, 0.2], &[1, 2]));
/// assert_eq!(g.shape(), &[1, 2]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn checkpoint_with<F>(f: F, policy: CheckpointPolicy) -> impl Fn(&Tensor) -> Tensor + Clone + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + 'static,
{
    move |x: &Tensor| {
        if !tape::recording() {
            return f(x);
        }
        let captures = captured_floats(&f, x);
        let ((y, dots), reads) = effects::recording(|| Saved::run(policy, || tape::without_recording(|| f(x))));
        let out = y.with_new_id();
        // The trainable reads are watched now, as the plain block's reads
        // would have been: the tapes differentiate with respect to them.
        let watched: Vec<Tensor> = reads
            .iter()
            .filter(|(v, t)| v.trainable() && t.dtype().is_float())
            .map(|(v, t)| {
                tape::record_variable_read(v, t);
                t.clone()
            })
            .collect();
        let f = f.clone();
        let n = captures.len() + watched.len();
        let x_in = x.clone();
        let sources: Vec<Tensor> = captures.iter().chain(&watched).cloned().collect();
        let vjp = move |_: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let Some(dy) = cts[0].clone() else { return Ok(vec![None; n + 1]) };
            let forward = Forward { x: &x_in, sources: &sources, reads: &reads, y: &outs[0] };
            backward(&f, &forward, &dy, dots.clone())
        };
        let inputs: Vec<&Tensor> = std::iter::once(x).chain(captures.iter()).chain(&watched).collect();
        tape::record_closure(
            std::rc::Rc::new(vjp),
            &inputs,
            std::slice::from_ref(&out),
            std::panic::Location::caller(),
        );
        out
    }
}

/// What the backward needs of a block's forward.
struct Forward<'a> {
    /// The block's input.
    x: &'a Tensor,
    /// The other tensors differentiated: captured floats, then the values
    /// of trainable variables the block read.
    sources: &'a [Tensor],
    /// Every variable read of the forward, replayed by the recomputation.
    reads: &'a effects::Reads,
    /// The block's output.
    y: &'a Tensor,
}

/// The recomputation: the block again on a barrier'd input under a tape
/// of its own, with the forward's variable reads (weights, generator
/// states) replayed and no state written, then the gradients of
/// `sum(y · dy)` with respect to the input, the captured tensors and the
/// variable values read.
fn backward(
    f: &dyn Fn(&Tensor) -> Tensor,
    fwd: &Forward<'_>,
    dy: &Tensor,
    dots: Option<Vec<Tensor>>,
) -> Result<Vec<Option<Tensor>>> {
    let xb = barrier(fwd.x, dy);
    let inner = GradientTape::new();
    inner.watch(&xb);
    for c in fwd.sources {
        inner.watch(c);
    }
    let y2 = effects::replaying(fwd.reads, || match dots {
        Some(dots) => replay(dots, || f(&xb)),
        None => f(&xb),
    });
    let y = fwd.y;
    if y2.tensor_type() != y.tensor_type() {
        return Err(Error::Gradient {
            message: format!(
                "checkpoint: the block returned {} when recomputed, {} in the forward",
                y2.tensor_type(),
                y.tensor_type()
            ),
        });
    }
    let target = (&y2 * dy).sum_all();
    let sources: Vec<&Tensor> = std::iter::once(&xb).chain(fwd.sources.iter()).collect();
    inner.gradient(&target, &sources)
}

/// The float tensors `f` captures: symbolic ones of enclosing traces and
/// eager ones (a tape may watch either), found by tracing `f` once on a
/// placeholder of `x`'s type.
fn captured_floats(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor) -> Vec<Tensor> {
    let guard = push_context(subgraph_context("checkpoint.block".into()));
    let placeholder = guard.with(|ctx| {
        let v = ctx.graph.add_param(x.tensor_type());
        ctx.symbolic(v)
    });
    let y = tape::without_recording(|| f(&placeholder));
    context::values_in_current(&[&y]).expect("the block's context is live");
    let ctx = guard.finish();
    let outer = ctx.outer_captures.into_iter().map(|(t, _)| t);
    outer.chain(ctx.captures).filter(|t| t.dtype().is_float()).collect()
}

/// The name of `checkpoint`'s barrier kernel in graphs: an identity of its
/// first input that also reads the cotangent (its second), so the
/// recomputation runs only once the backward reaches the block. An
/// exporter may write it as an identity.
pub const REMAT_BARRIER: &str = "tracejit.remat.barrier";

/// The barrier kernel: an identity (a copy) of its first input that also
/// reads its second, opaque to the optimizer.
#[derive(Debug)]
struct Barrier;

impl ExternalKernel for Barrier {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        vec![inputs[0].to_standard()]
    }

    fn maps_leading_axis(&self) -> bool {
        true
    }

    // A derivative of the backward (a Hessian through the block) passes
    // through to the block's input: the barrier only orders.
    fn gradient_passes_through(&self) -> Option<usize> {
        Some(0)
    }
}

/// `x`, after `dy` is known: eagerly `x` itself; in a trace a copy through
/// [`Barrier`], so the recomputation depending on it is neither merged
/// with the forward nor scheduled before the backward reaches it.
fn barrier(x: &Tensor, dy: &Tensor) -> Tensor {
    if !x.is_symbolic() && !dy.is_symbolic() {
        return x.clone();
    }
    let types: Vec<TensorType> = vec![x.tensor_type(), dy.tensor_type()];
    let op = Op::Kernel {
        name: REMAT_BARRIER.into(),
        kernel: Arc::new(Barrier),
        inputs: types,
        outputs: vec![x.tensor_type()],
    };
    crate::interpreters::apply(op, &[x, dy]).remove(0)
}

// ---- saving the products' outputs ----------------------------------------

/// What the op hook does for the innermost checkpoint of this thread.
enum Mode {
    /// Keep every product's output, in order.
    Record(Vec<Tensor>),
    /// Hand out the kept outputs in order instead of computing products.
    Replay(VecDeque<Tensor>),
}

thread_local! {
    static MODES: RefCell<Vec<Mode>> = const { RefCell::new(Vec::new()) };
}

struct Saved;

impl Saved {
    /// Runs the forward, keeping the products' outputs when the policy
    /// saves them.
    fn run(policy: CheckpointPolicy, forward: impl FnOnce() -> Tensor) -> (Tensor, Option<Vec<Tensor>>) {
        match policy {
            CheckpointPolicy::NothingSaveable => (forward(), None),
            CheckpointPolicy::DotsSaveable => {
                let _pop = push_mode(Mode::Record(Vec::new()));
                let y = forward();
                let dots = MODES.with(|m| match m.borrow_mut().last_mut() {
                    Some(Mode::Record(v)) => std::mem::take(v),
                    _ => Vec::new(),
                });
                (y, Some(dots))
            }
        }
    }
}

fn replay(dots: Vec<Tensor>, f: impl FnOnce() -> Tensor) -> Tensor {
    let _pop = push_mode(Mode::Replay(dots.into()));
    f()
}

struct Pop;

impl Drop for Pop {
    fn drop(&mut self) {
        MODES.with(|m| m.borrow_mut().pop());
    }
}

fn push_mode(mode: Mode) -> Pop {
    MODES.with(|m| m.borrow_mut().push(mode));
    Pop
}

/// Called by every op before it runs: the kept output of a product being
/// recomputed under `DotsSaveable`, if its type matches.
/// The remat layer of the interpreter stack (`crate::interpreters`):
/// active inside a checkpoint's forward or recomputation.
pub(crate) struct RematLayer;

impl crate::interpreters::Interpreter for RematLayer {
    fn name(&self) -> &'static str {
        "remat"
    }

    fn active(&self) -> bool {
        MODES.with(|m| !m.borrow().is_empty())
    }

    fn process(
        &self,
        call: crate::interpreters::OpCall<'_>,
        next: &crate::interpreters::Next<'_>,
    ) -> crate::interpreters::Outs {
        // A product recomputed by a checkpoint that saved it is not
        // recomputed.
        if let Some(out) = replayed(&call.op, call.inputs) {
            return out;
        }
        let observed = matches!(call.op, Op::MatMul).then(|| call.op.clone());
        let out = next.run(call);
        if let Some(op) = observed {
            observe(&op, &out);
        }
        out
    }
}

fn replayed(op: &Op, inputs: &[&Tensor]) -> Option<SmallVec<[Tensor; 1]>> {
    if !matches!(op, Op::MatMul) {
        return None;
    }
    MODES.with(|m| match m.borrow_mut().last_mut() {
        Some(Mode::Replay(q)) => {
            let saved = q.pop_front()?;
            let want = tracejit_ir::infer(op, &[inputs[0].tensor_type(), inputs[1].tensor_type()], None).ok()?;
            (want[0] == saved.tensor_type()).then(|| smallvec::smallvec![saved])
        }
        _ => None,
    })
}

/// Called by every op after it ran: keeps a product's output while a
/// `DotsSaveable` forward runs.
fn observe(op: &Op, outputs: &[Tensor]) {
    if !matches!(op, Op::MatMul) {
        return;
    }
    MODES.with(|m| {
        if let Some(Mode::Record(v)) = m.borrow_mut().last_mut() {
            v.push(outputs[0].clone());
        }
    });
}
