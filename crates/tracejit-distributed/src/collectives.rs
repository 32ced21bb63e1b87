//! The collectives on tensors: [`all_reduce`], [`broadcast`],
//! [`all_gather`], with their gradients.
//!
//! Each is one native kernel ([`CollectiveKernel`]) run through
//! `tracejit_trace::call_external`: eagerly it talks to the other ranks at
//! once; inside a traced function it is an `Op::Kernel` node whose effects
//! say it writes, so no pass folds, merges (CSE), duplicates or drops it,
//! and it runs in program order with variable accesses, debug nodes and
//! the other collectives (every rank must issue the same collectives in
//! the same order: MPI matches them by order). A failed collective panics
//! with the error's message (naming the rank); `Function::call` returns
//! that as an `Err`, and the `try_` forms return the [`Error`] itself.
//!
//! Gradients (the tape records each call with a closure rule that is
//! itself written with collectives, so every rank's backward issues the
//! same collectives in the same order):
//! - `all_reduce(Sum)`: the all-reduced sum of the cotangents; `Mean`:
//!   their mean; `Max`/`Min`: that sum, where this rank's value is the
//!   result (ties: every tied rank gets it), zero elsewhere.
//! - `broadcast(root)`: the sum of the cotangents on the root, zero on the
//!   other ranks.
//! - `all_gather(axis)`: this rank's slice of the summed cotangents.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use tracejit_ir::{Effects, ExternalKernel, TensorType};
use tracejit_tensor::{DType, Storage};
use tracejit_trace::{call_external, ExternalCall, Tensor};

use crate::elems::{Elems, Kind};
use crate::transport::{self, Collective};
use crate::{world, Error, ReduceOp, Result};

/// The stream every collective node is ordered on (a pseudo-variable id
/// next to `tracejit::debug`'s; variables count up from 1).
pub(crate) const COLLECTIVE_STREAM: u64 = u64::MAX - 11;

/// The prefix of every collective node's name (ONNX export refuses them by
/// it).
pub const NODE_PREFIX: &str = "tracejit.distributed.";

thread_local! {
    /// The error behind the last collective kernel that panicked on this
    /// thread, for the `try_` forms.
    static LAST_ERROR: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Panics with `e`'s message, keeping `e` for a `try_` caller.
pub(crate) fn fail(e: Error) -> ! {
    let msg = e.to_string();
    LAST_ERROR.with(|l| *l.borrow_mut() = Some(e));
    panic!("{msg}")
}

/// Runs `f`, turning a collective's panic back into its [`Error`].
pub(crate) fn catching<T>(f: impl FnOnce() -> T) -> Result<T> {
    LAST_ERROR.with(|l| l.borrow_mut().take());
    tracejit_ir::catch_quietly(f).map_err(|payload| match LAST_ERROR.with(|l| l.borrow_mut().take()) {
        Some(e) => e,
        None => std::panic::resume_unwind(payload),
    })
}

/// One collective on one tensor.
pub(crate) struct CollectiveKernel {
    pub(crate) c: Collective,
}

impl fmt::Debug for CollectiveKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.c)
    }
}

/// What a collective on `s` is called in errors.
pub(crate) fn describe(c: Collective, dtype: DType, n: usize) -> String {
    let name = match c {
        Collective::AllReduce(op) => format!("all_reduce({op:?})"),
        Collective::Broadcast { root } => format!("broadcast(root {root})"),
        Collective::AllGather => "all_gather".to_string(),
    };
    format!("{name} of {n} {dtype:?}")
}

/// The collective on one value, waiting for it.
pub(crate) fn run(c: Collective, s: &Storage) -> Result<Storage> {
    let what = describe(c, s.dtype(), s.len());
    check_dtype(c, s.dtype(), &what)?;
    let w = world::current()?;
    if let Collective::Broadcast { root } = c {
        if root >= w.size() {
            let reason = format!("root {root} is not a rank of a world of {}", w.size());
            return Err(Error::Invalid { rank: w.rank(), what, reason });
        }
    }
    let mut out = transport::start(c, Elems::pack(&[s]), what)?.wait()?;
    if c == Collective::AllReduce(ReduceOp::Mean) {
        out.divide(w.size());
    }
    let shape = match c {
        Collective::AllGather => [&[w.size()], s.shape()].concat(),
        _ => s.shape().to_vec(),
    };
    Ok(out.unpack(0, &[(s.dtype(), shape)]).remove(0))
}

/// Refuses what MPI's built-in operations cannot do to `dtype`.
pub(crate) fn check_dtype(c: Collective, dtype: DType, what: &str) -> Result<()> {
    let reason = match (c, Kind::of(dtype)) {
        (Collective::AllReduce(ReduceOp::Max | ReduceOp::Min), _) if dtype == DType::U64 => {
            "a max or min of u64 (it travels as i64 and would compare signed; cast to f64 or i64 first)"
        }
        (Collective::AllReduce(ReduceOp::Mean), Kind::I32 | Kind::I64 | Kind::U8) => {
            "a mean needs a float dtype (cast first, or reduce with Sum)"
        }
        (Collective::AllReduce(ReduceOp::Sum), Kind::U8) => "a sum of bools (use Max for `any`, Min for `all`)",
        _ => return Ok(()),
    };
    let rank = world::current().map(|w| w.rank()).unwrap_or(0);
    Err(Error::Invalid { rank, what: what.to_string(), reason: reason.to_string() })
}

impl ExternalKernel for CollectiveKernel {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        match run(self.c, &inputs[0]) {
            Ok(s) => vec![s],
            Err(e) => fail(e),
        }
    }

    fn effects(&self) -> Effects {
        Effects::WRITES
    }
}

/// The node for `c` on `x`.
fn collective(c: Collective, x: &Tensor, out: TensorType, vjp: Arc<tracejit_trace::ExternalVjp>) -> Tensor {
    let name = match c {
        Collective::AllReduce(_) => "all_reduce",
        Collective::Broadcast { .. } => "broadcast",
        Collective::AllGather => "all_gather",
    };
    let call = ExternalCall {
        name: format!("{NODE_PREFIX}{name}"),
        kernel: Arc::new(CollectiveKernel { c }),
        outputs: vec![out],
        stream: Some(COLLECTIVE_STREAM),
        vjp: Some(vjp),
    };
    call_external(&call, &[x]).remove(0)
}

/// The cotangent of an output, zeros when the target does not depend on
/// it (every rank must still take part in the backward's collectives).
fn cotangent(ct: &Option<Tensor>, like: &Tensor) -> Tensor {
    ct.clone().unwrap_or_else(|| Tensor::zeros_like(like))
}

/// Every rank's `x` reduced elementwise by `op`; every rank gets the
/// result. Eagerly and inside functions (a collective node); `x` must have
/// the same dtype and shape on every rank. `Mean` needs floats, `Sum` and
/// `Mean` refuse bools. A failure (a timeout, an MPI error) panics naming
/// the rank; inside a function, `call` returns it as an `Err`.
///
/// ```
/// use tracejit_distributed::{all_reduce, ReduceOp};
/// use tracejit_trace::Tensor;
///
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
/// let world = tracejit_distributed::init()?;
/// let s = all_reduce(&x, ReduceOp::Sum);     // x summed over the world's ranks
/// if world.size() == 1 {
///     assert_eq!(s.to_vec::<f32>()?, [1.0, 2.0]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn all_reduce(x: &Tensor, op: ReduceOp) -> Tensor {
    let vjp = move |ins: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| {
        let ct = cotangent(&cts[0], &outs[0]);
        let g = match op {
            ReduceOp::Sum | ReduceOp::Mean => all_reduce(&ct, op),
            ReduceOp::Max | ReduceOp::Min => {
                let total = all_reduce(&ct, ReduceOp::Sum);
                Tensor::select(&ins[0].eq(&outs[0]), &total, &Tensor::zeros_like(&total))
            }
        };
        vec![Some(g)]
    };
    collective(Collective::AllReduce(op), x, x.tensor_type(), Arc::new(vjp))
}

/// [`all_reduce`] returning its failure instead of panicking (eagerly;
/// inside a function the failure surfaces from `call`).
pub fn try_all_reduce(x: &Tensor, op: ReduceOp) -> Result<Tensor> {
    catching(|| all_reduce(x, op))
}

/// `root`'s `x` on every rank (the other ranks' values are ignored, but
/// must have the same dtype and shape). Eagerly and inside functions.
#[track_caller]
pub fn broadcast(x: &Tensor, root: usize) -> Tensor {
    let vjp = move |_: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| {
        let total = all_reduce(&cotangent(&cts[0], &outs[0]), ReduceOp::Sum);
        let mine = world::current().is_ok_and(|w| w.rank() == root);
        vec![Some(if mine { total } else { Tensor::zeros_like(&total) })]
    };
    collective(Collective::Broadcast { root }, x, x.tensor_type(), Arc::new(vjp))
}

/// [`broadcast`] returning its failure instead of panicking.
pub fn try_broadcast(x: &Tensor, root: usize) -> Result<Tensor> {
    catching(|| broadcast(x, root))
}

/// Every rank's `x` joined along `axis` in rank order (`axis`'s length
/// becomes `size ×` its length). Eagerly and inside functions; `x` must
/// have the same dtype and shape on every rank.
#[track_caller]
pub fn all_gather(x: &Tensor, axis: usize) -> Tensor {
    let rank = x.rank();
    assert!(axis < rank.max(1), "all_gather: axis {axis} of a rank-{rank} tensor");
    let size = world::current().map(|w| w.size()).unwrap_or_else(|e| panic!("all_gather: {e}"));
    let mut stacked_type = x.tensor_type();
    stacked_type.dims.insert(0, Some(size));
    let vjp = move |_: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| {
        let total = all_reduce(&cotangent(&cts[0], &outs[0]), ReduceOp::Sum);
        let me = world::current().map(|w| w.rank()).unwrap_or(0) as i64;
        vec![Some(total.slice_axis(0, me, me + 1).squeeze(&[0]))]
    };
    // [size, ..x] -> x's axes with `size` just before `axis` -> merged.
    let stacked = collective(Collective::AllGather, x, stacked_type, Arc::new(vjp));
    if rank == 0 {
        return stacked;
    }
    let mut perm: Vec<i64> = (1..=rank as i64).collect();
    perm.insert(axis, 0);
    let moved = if axis == 0 { stacked } else { stacked.transpose(&perm) };
    let mut shape: Vec<i64> = x.dims().iter().map(|d| d.map_or(-1, |d| d as i64)).collect();
    shape[axis] = if shape[axis] < 0 { -1 } else { shape[axis] * size as i64 };
    moved.reshape(&shape)
}

/// [`all_gather`] returning its failure instead of panicking.
pub fn try_all_gather(x: &Tensor, axis: usize) -> Result<Tensor> {
    catching(|| all_gather(x, axis))
}
