//! The run-time semantics of the control-flow ops, [`Op::Cond`] and
//! [`Op::While`], written once over "run subgraph `k` on these values" so
//! that the interpreter (which interprets the subgraphs) and the JIT
//! executor (which runs them as prepared executables, compiled once) share
//! them.
//!
//! [`Op::Cond`]: crate::Op::Cond
//! [`Op::While`]: crate::Op::While

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracejit_tensor::Storage;

use crate::IrError;

/// A way out of a loop that would run too long: a `while` node holding a
/// token checks it before every trip, in every executor (the interpreter,
/// the JIT, row blocks on other threads), and stops with an error once it
/// is cancelled or past its deadline. A cheap shared handle: clones share
/// the state, so one thread may cancel a call running on another.
///
/// ```
/// use std::time::Duration;
/// use tracejit_ir::control::CancelToken;
///
/// let token = CancelToken::new();
/// assert!(!token.is_cancelled());
/// token.cancel_after(Duration::ZERO);
/// assert!(token.is_cancelled());
/// token.reset();
/// assert!(!token.is_cancelled());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    state: Arc<TokenState>,
}

#[derive(Debug, Default)]
struct TokenState {
    cancelled: AtomicBool,
    /// Nanoseconds after [`epoch`] (plus one, so that 0 means none).
    deadline: AtomicU64,
}

/// The instant deadlines count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl PartialEq for CancelToken {
    /// Two handles of one token.
    fn eq(&self, other: &CancelToken) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for CancelToken {}

impl CancelToken {
    /// A token that is not cancelled and has no deadline.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// The token's identity, shared by all its handles (what an op key
    /// holds: loops stopped by different tokens are different loops).
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.state) as usize
    }

    /// Cancels: loops holding the token stop before their next trip.
    pub fn cancel(&self) {
        self.state.cancelled.store(true, Ordering::Relaxed);
    }

    /// Cancels once `after` has passed from now (a deadline; replaces an
    /// earlier one).
    pub fn cancel_after(&self, after: Duration) {
        self.set_deadline(Instant::now() + after);
    }

    /// Cancels at `at`.
    pub fn set_deadline(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos();
        self.state.deadline.store(u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1, Ordering::Relaxed);
    }

    /// Clears the cancellation and the deadline, for the next call.
    pub fn reset(&self) {
        self.state.cancelled.store(false, Ordering::Relaxed);
        self.state.deadline.store(0, Ordering::Relaxed);
    }

    /// True once cancelled or past the deadline.
    pub fn is_cancelled(&self) -> bool {
        self.why().is_some()
    }

    fn why(&self) -> Option<&'static str> {
        if self.state.cancelled.load(Ordering::Relaxed) {
            return Some("its CancelToken was cancelled");
        }
        match self.state.deadline.load(Ordering::Relaxed) {
            0 => None,
            d => (epoch().elapsed().as_nanos() >= u128::from(d - 1)).then_some("its CancelToken's deadline passed"),
        }
    }

    /// `Err` naming why, once cancelled; `trips` is how many trips ran.
    pub fn check(&self, trips: u64) -> Result<(), IrError> {
        match self.why() {
            None => Ok(()),
            Some(why) => Err(IrError::Op(crate::OpError::new(
                "while",
                format!("the loop was stopped after {trips} trips: {why}"),
            ))),
        }
    }
}

/// How an executor runs the subgraphs of a control-flow node.
pub trait SubgraphRunner {
    /// The executor's error type.
    type Error: From<IrError>;

    /// Runs subgraph `k` of the node on `inputs`.
    fn run(&mut self, k: usize, inputs: &[Storage]) -> Result<Vec<Storage>, Self::Error>;

    /// A value the loop no longer holds (the previous iteration's state),
    /// so an executor can reuse its buffer; dropped by default.
    fn recycle(&mut self, value: Storage) {
        drop(value);
    }
}

/// A [`SubgraphRunner`] from a closure (values are simply dropped).
pub struct RunWith<F>(pub F);

impl<E: From<IrError>, F: FnMut(usize, &[Storage]) -> Result<Vec<Storage>, E>> SubgraphRunner for RunWith<F> {
    type Error = E;

    fn run(&mut self, k: usize, inputs: &[Storage]) -> Result<Vec<Storage>, E> {
        (self.0)(k, inputs)
    }
}

/// The value of a bool scalar (a predicate or a loop condition); `what`
/// names it in the error.
pub fn predicate(x: &Storage, what: &str) -> Result<bool, IrError> {
    match x {
        Storage::Bool(a) if a.ndim() == 0 => Ok(a.iter().next().copied().unwrap_or(false)),
        _ => Err(IrError::Op(crate::OpError::new(
            "cond",
            format!("{what} must be a bool scalar, got {}{:?}", x.dtype(), x.shape()),
        ))),
    }
}

/// Runs a conditional on `args = (pred, operands...)`: the then branch
/// (subgraph 0) or the else branch (subgraph 1) on the operands.
pub fn run_cond<R: SubgraphRunner>(args: &[Storage], runner: &mut R) -> Result<Vec<Storage>, R::Error> {
    let Some((pred, operands)) = args.split_first() else {
        return Err(IrError::Op(crate::OpError::new("cond", "expected a predicate".to_string())).into());
    };
    let branch = if predicate(pred, "the predicate").map_err(R::Error::from)? { 0 } else { 1 };
    runner.run(branch, operands)
}

/// Runs a loop on `args = (carried..., captured...)`: while the condition
/// (subgraph 0) holds, the body (subgraph 1) computes the next carried
/// values. Returns the final carried values. A `cancel` token is checked
/// before every trip.
pub fn run_while<R: SubgraphRunner>(
    carried: usize,
    args: &[Storage],
    runner: &mut R,
    cancel: Option<&CancelToken>,
) -> Result<Vec<Storage>, R::Error> {
    let mut state: Vec<Storage> = args.to_vec();
    let mut trips: u64 = 0;
    loop {
        if let Some(token) = cancel {
            token.check(trips).map_err(R::Error::from)?;
        }
        trips += 1;
        let c = runner.run(0, &state)?;
        let go = match c.first() {
            Some(c) => predicate(c, "the loop condition").map_err(R::Error::from)?,
            None => {
                let e = IrError::Op(crate::OpError::new("while", "the condition returned nothing".to_string()));
                return Err(e.into());
            }
        };
        // The condition's buffer too: the next trip's comparison reuses it.
        c.into_iter().for_each(|v| runner.recycle(v));
        if !go {
            break;
        }
        let next = runner.run(1, &state)?;
        if next.len() != carried {
            let message = format!("the body returned {} values for {carried} carried values", next.len());
            return Err(IrError::Op(crate::OpError::new("while", message)).into());
        }
        // The old carried values go back to the executor, whose pool
        // reuses their buffers in the next iteration.
        for (slot, v) in state.iter_mut().zip(next) {
            let old = std::mem::replace(slot, v);
            runner.recycle(old);
        }
    }
    state.truncate(carried);
    Ok(state)
}
