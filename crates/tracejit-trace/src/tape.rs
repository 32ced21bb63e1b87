//! [`GradientTape`]: reverse-mode gradients of eager and traced code, with
//! the VJP rules of [`tracejit_ir::autodiff`].
//!
//! A tape records the ops of its thread (every op goes through
//! `interpreters::apply`, whose tape layer calls [`record`]) whose inputs it tracks: the
//! tensors it was asked to [`GradientTape::watch`], the values read from
//! trainable [`Variable`]s while it is active, and everything computed from
//! those. [`GradientTape::gradient`] walks the record backwards and applies
//! each op's VJP rule through ordinary tensor ops, so the same code
//! differentiates eagerly (the backward ops run at once) and while tracing
//! (the backward ops become nodes of the same graph: forward, backward and
//! an optimizer update are one graph the passes fuse).
//!
//! Tapes are thread-local: two threads differentiating at once never see
//! each other's ops. While one tape computes a gradient it stops
//! recording, but enclosing tapes record the backward ops, which is how a
//! gradient of a gradient works.
//!
//! ```
//! use tracejit_trace::{GradientTape, Tensor};
//!
//! let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]);
//! let tape = GradientTape::new();
//! tape.watch(&x);
//! let y = (&x * &x).sum(&[0], false);
//! let g = tape.gradient(&y, &[&x])?;
//! assert_eq!(g[0].as_ref().unwrap().to_vec::<f64>()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), tracejit_trace::Error>(())
//! ```

mod backward_check;
mod relevance;
mod source;
pub use source::Source;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::autodiff::{self, AutodiffError, Emitter};
use tracejit_ir::{Graph, LibraryFunction, Op, TensorType, VarId};
use tracejit_tensor::{BinaryOp, Storage};

use crate::{context, Error, Result, Tensor, Variable};

// ---- tensor identities ------------------------------------------------

/// Bits of an id that count within one thread; the bits above say which
/// thread made the tensor.
const THREAD_SHIFT: u32 = 40;

thread_local! {
    static THREAD_TAG: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
    static TAPES: RefCell<Vec<Weak<RefCell<TapeState>>>> = const { RefCell::new(Vec::new()) };
    /// How many tapes are active on this thread and recording (a cheap
    /// test on every op).
    static RECORDING: Cell<usize> = const { Cell::new(0) };
}

/// A fresh tensor id, unique in the process (thread tag, then a counter).
pub(crate) fn next_id() -> u64 {
    let local = NEXT_ID.with(|c| {
        let v = c.get();
        c.set(v + 1);
        v
    });
    THREAD_TAG.with(|t| (*t << THREAD_SHIFT) | local)
}

fn thread_of(id: u64) -> u64 {
    id >> THREAD_SHIFT
}

// ---- recording ----------------------------------------------------------

/// What an entry computed.
#[derive(Clone)]
enum Recorded {
    /// A primitive op.
    Op(Op),
    /// A call of a traced function, as its graph with calls inlined, and
    /// the values of the variables it reads (read again around the call).
    Graph(Arc<Graph>, Vec<(tracejit_ir::VarId, Tensor)>),
    /// A call of a composite with a registered backward kernel.
    /// In validation mode, also the composite's body, to check the kernel
    /// against its VJP.
    Custom(String, Arc<GradientFn>, Option<Arc<Graph>>),
    /// A `cond` or `while` node, and the values of the variables its
    /// subgraphs read (by resource id, read again around the node).
    Control(Op, Vec<(u64, Tensor)>),
    /// A call whose backward is a closure (a custom gradient).
    Closure(Rc<ClosureVjp>),
}

/// The backward of one recorded call given as a closure (a custom
/// gradient): its inputs, outputs and output cotangents to the cotangents
/// of its inputs. Tapes are per thread, so it need not be `Send`.
pub(crate) type ClosureVjp = dyn Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;

// ---- registered backward kernels ----------------------------------------

/// A backward kernel for a composite op: given the call's inputs, outputs
/// and output cotangents (`None`: zero), the cotangents of its inputs
/// (`None`: no gradient). It runs on eager tensors under an eager tape and
/// on symbolic ones (adding graph nodes) inside a traced function, so it is
/// written with tensor ops.
pub type GradientFn = dyn Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Vec<Option<Tensor>> + Send + Sync;

static GRADIENTS: std::sync::LazyLock<std::sync::RwLock<HashMap<String, Arc<GradientFn>>>> =
    std::sync::LazyLock::new(Default::default);

/// Registers the backward kernel of the composite op `name` (functions
/// marked `implements(name)`): tapes use it instead of differentiating the
/// composite's primitive body, so a fused forward keeps a fused backward.
/// The latest registration wins; it applies to calls recorded after it.
///
/// ```
/// use tracejit_trace::{function, register_gradient, GradientTape, Tensor};
///
/// // A composite `square` whose registered gradient is deliberately 10x.
/// register_gradient("example.doc.square", |inputs: &[Tensor], _outputs: &[Tensor], cts: &[Option<Tensor>]| {
///     vec![cts[0].as_ref().map(|g| g * &inputs[0] * 20.0)]
/// });
/// let square = function(|x: Tensor| &x * &x).implements("example.doc.square");
/// let x = Tensor::from_vec(vec![3.0f64], &[1]);
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = square.call(x.clone())?;
/// let g = tape.gradient(&y, &[&x])?;
/// assert_eq!(g[0].as_ref().unwrap().to_vec::<f64>()?, vec![60.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn register_gradient<F>(name: &str, backward: F)
where
    F: Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Vec<Option<Tensor>> + Send + Sync + 'static,
{
    let mut t = GRADIENTS.write().unwrap_or_else(|e| e.into_inner());
    if t.insert(name.to_string(), Arc::new(backward)).is_some() {
        log::info!("tracejit: the backward kernel of `{name}` was replaced");
    }
}

/// Removes the backward kernel of `name`; true if there was one.
pub fn unregister_gradient(name: &str) -> bool {
    GRADIENTS.write().unwrap_or_else(|e| e.into_inner()).remove(name).is_some()
}

fn registered_gradient(name: &str) -> Option<Arc<GradientFn>> {
    GRADIENTS.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
}

/// One recorded op or call.
struct Entry {
    what: Recorded,
    inputs: SmallVec<[Tensor; 2]>,
    outputs: SmallVec<[Tensor; 1]>,
    /// The user's line that ran the op, for gradient errors.
    location: Option<&'static std::panic::Location<'static>>,
}

struct TapeState {
    persistent: bool,
    /// A non-persistent tape's gradient was taken.
    spent: bool,
    /// Suspended while it computes a gradient.
    paused: bool,
    /// Ids whose ops are recorded: watched tensors and their descendants.
    tracked: HashSet<u64>,
    entries: Vec<Entry>,
    /// Variable id -> the tensors read from it while recording.
    reads: HashMap<u64, Vec<Tensor>>,
}

/// True when some tape of this thread records (checked before every op).
pub(crate) fn recording() -> bool {
    RECORDING.with(|r| r.get() > 0)
}

/// Runs `f` with no tape of this thread recording (what it computes is
/// thrown away: `cond` checking the branch it does not take).
pub(crate) fn without_recording<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            RECORDING.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(RECORDING.with(|r| r.replace(0)));
    f()
}

fn for_each_tape(mut f: impl FnMut(&mut TapeState)) {
    TAPES.with(|tapes| {
        for t in tapes.borrow().iter().filter_map(Weak::upgrade) {
            let mut t = t.borrow_mut();
            if !t.paused {
                f(&mut t);
            }
        }
    });
}

/// Records `op` on every recording tape that tracks one of its inputs.
/// The tape layer of the interpreter stack (`crate::interpreters`): active
/// while a tape of this thread records.
pub(crate) struct TapeLayer;

impl crate::interpreters::Interpreter for TapeLayer {
    fn name(&self) -> &'static str {
        "tape"
    }

    fn active(&self) -> bool {
        recording()
    }

    fn process(
        &self,
        call: crate::interpreters::OpCall<'_>,
        next: &crate::interpreters::Next<'_>,
    ) -> crate::interpreters::Outs {
        let (op, inputs, location) = (call.op.clone(), call.inputs, call.location);
        let out = next.run(call);
        record(&op, inputs, &out, location);
        out
    }
}

pub(crate) fn record(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &[Tensor],
    location: &'static std::panic::Location<'static>,
) {
    for_each_tape(|t| {
        if inputs.iter().any(|x| t.tracked.contains(&x.tape_id())) {
            t.tracked.extend(outputs.iter().map(Tensor::tape_id));
            t.entries.push(Entry {
                what: Recorded::Op(op.clone()),
                inputs: inputs.iter().map(|x| (*x).clone()).collect(),
                outputs: outputs.iter().cloned().collect(),
                location: Some(location),
            });
        }
    });
}

/// Records a call of a traced function on every recording tape that
/// tracks one of its inputs: through the backward kernel registered for its
/// `implements` name if there is one, else as `graph` (its primitive form,
/// built only when needed).
pub(crate) fn record_call(
    implements: Option<&str>,
    graph: &dyn Fn() -> Arc<Graph>,
    before: Option<CallVariables>,
    inputs: &[&Tensor],
    outputs: &[Tensor],
) {
    if let Some((rule, arity)) = implements.and_then(crate::custom::lookup) {
        let vjp = move |ins: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| {
            rule.recomputed_cotangents(arity, ins, outs, cts)
        };
        push_entry(Recorded::Closure(Rc::new(vjp)), inputs, outputs, None);
        return;
    }
    let what = match implements.and_then(|n| registered_gradient(n).map(|f| (n, f))) {
        Some((n, f)) => Recorded::Custom(n.to_string(), f, crate::validate::active().then(graph)),
        None => {
            let g = graph();
            let vars = before.unwrap_or_else(|| call_variable_values(&g));
            Recorded::Graph(g, vars)
        }
    };
    push_entry(what, inputs, outputs, None);
}

/// The variables a called graph reads, each with a value read under the
/// tape (so the tapes watch it and the backward has it).
pub(crate) type CallVariables = Vec<(VarId, Tensor)>;

/// The variables `g` reads, read now: after a call that only reads them,
/// or before one that also assigns them (its first reads see those values;
/// the replay gives later reads the assigned values).
pub(crate) fn call_variable_values(g: &Graph) -> CallVariables {
    let mut vars = Vec::new();
    for (vid, res) in g.variables.iter() {
        let read = g.nodes().any(|(_, n)| matches!(n.op, Op::ReadVariable { var, .. } if var == vid));
        if let (true, Some(v)) = (read, Variable::by_id(res.id())) {
            vars.push((vid, v.read_live()));
        }
    }
    vars
}

/// True when a backward kernel (or a custom gradient's rule) is
/// registered for this `implements` name.
pub(crate) fn has_registered_gradient(implements: Option<&str>) -> bool {
    implements.is_some_and(|n| registered_gradient(n).is_some() || crate::custom::lookup(n).is_some())
}

/// Records a call whose backward is `vjp` (an eager custom gradient) on
/// every recording tape that tracks one of its inputs.
pub(crate) fn record_closure(
    vjp: Rc<ClosureVjp>,
    inputs: &[&Tensor],
    outputs: &[Tensor],
    location: &'static std::panic::Location<'static>,
) {
    push_entry(Recorded::Closure(vjp), inputs, outputs, Some(location));
}

/// Records a `cond` or `while` node on every recording tape that tracks
/// one of its inputs or a variable its subgraphs read. Those variables are
/// read again here, so that the tapes watch them and the rule has their
/// values.
pub(crate) fn record_control(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &[Tensor],
    location: &'static std::panic::Location<'static>,
) {
    let vars: Vec<(u64, Tensor)> = autodiff::control_variables(op)
        .iter()
        .filter_map(|res| Variable::by_id(res.id()).map(|v| (res.id(), v.read_live())))
        .collect();
    push_entry(Recorded::Control(op.clone(), vars), inputs, outputs, Some(location));
}

/// Appends an entry to every recording tape that tracks one of its inputs
/// (or, for calls and control flow, a variable value it reads).
fn push_entry(
    what: Recorded,
    inputs: &[&Tensor],
    outputs: &[Tensor],
    location: Option<&'static std::panic::Location<'static>>,
) {
    let reads: Vec<&Tensor> = match &what {
        Recorded::Graph(_, vars) => vars.iter().map(|(_, t)| t).collect(),
        Recorded::Control(_, vars) => vars.iter().map(|(_, t)| t).collect(),
        Recorded::Op(_) | Recorded::Custom(..) | Recorded::Closure(_) => Vec::new(),
    };
    for_each_tape(|t| {
        if inputs.iter().chain(&reads).any(|x| t.tracked.contains(&x.tape_id())) {
            t.tracked.extend(outputs.iter().map(Tensor::tape_id));
            t.entries.push(Entry {
                what: what.clone(),
                inputs: inputs.iter().map(|x| (*x).clone()).collect(),
                outputs: outputs.iter().cloned().collect(),
                location,
            });
        }
    });
}

/// A trainable variable was read: every recording tape watches the value.
pub(crate) fn record_variable_read(var: &Variable, value: &Tensor) {
    if !recording() || !var.trainable() || !value.dtype().is_float() {
        return;
    }
    for_each_tape(|t| {
        t.tracked.insert(value.tape_id());
        t.reads.entry(var.id()).or_default().push(value.clone());
    });
}

// ---- the tape -----------------------------------------------------------

/// Records the ops of this thread that depend on watched tensors and
/// trainable variables, and computes gradients of a target with respect to
/// them. Drop it to stop recording.
///
/// The same code differentiates eagerly and inside a traced function,
/// where the backward ops join the forward's graph. A gradient of a
/// gradient needs two tapes: the outer one records the inner one's
/// backward ops.
///
/// ```
/// use tracejit_trace::{GradientTape, Tensor, Variable};
///
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]);
/// let w = Variable::new(Tensor::from_vec(vec![0.5f64], &[1]));
/// let tape = GradientTape::persistent();          // answers more than once
/// tape.watch(&x);                                 // trainable variables are watched already
/// let y = (&x * &x * w.read()).sum_all();
/// let dx = tape.gradient(&y, &[&x])?;             // 2 w x
/// let dw = tape.gradient(&y, &[w.clone()])?;      // sum(x^2)
/// assert_eq!(dx[0].as_ref().unwrap().to_vec::<f64>()?, [1.0, 2.0, 3.0]);
/// assert_eq!(dw[0].as_ref().unwrap().to_vec::<f64>()?, [14.0]);
///
/// // Second derivative of x^3: 6x.
/// let outer = GradientTape::new();
/// outer.watch(&x);
/// let inner = GradientTape::new();
/// inner.watch(&x);
/// let g = inner.gradient(&(&x * &x * &x).sum_all(), &[&x])?.remove(0).unwrap();
/// drop(inner);
/// let h = outer.gradient(&g.sum_all(), &[&x])?.remove(0).unwrap();
/// assert_eq!(h.to_vec::<f64>()?, [6.0, 12.0, 18.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub struct GradientTape {
    state: Rc<RefCell<TapeState>>,
}

impl GradientTape {
    /// A tape that answers one [`gradient`](Self::gradient) call.
    pub fn new() -> GradientTape {
        GradientTape::start(false)
    }

    /// A tape that answers any number of `gradient` calls.
    pub fn persistent() -> GradientTape {
        GradientTape::start(true)
    }

    fn start(persistent: bool) -> GradientTape {
        let state = Rc::new(RefCell::new(TapeState {
            persistent,
            spent: false,
            paused: false,
            tracked: HashSet::new(),
            entries: Vec::new(),
            reads: HashMap::new(),
        }));
        TAPES.with(|t| t.borrow_mut().push(Rc::downgrade(&state)));
        RECORDING.with(|r| r.set(r.get() + 1));
        GradientTape { state }
    }

    /// True when a tape of this thread is recording: code that would run
    /// native code the tapes cannot see (a composite's kernel) goes through
    /// a recorded call instead.
    pub fn any_recording() -> bool {
        recording()
    }

    /// Records the ops that use `x` from now on (float tensors; watching
    /// an integer or bool tensor records nothing, as it has no gradient).
    pub fn watch(&self, x: &Tensor) {
        if x.dtype().is_float() {
            self.state.borrow_mut().tracked.insert(x.tape_id());
        }
    }

    /// The gradient of `target` (of its sum, if it is not a scalar) with
    /// respect to each source: `None` where the target does not depend on
    /// it. Sources are tensors (`&[&Tensor]`, `&[Tensor]`) or variables
    /// (`&[Variable]`: the sum over every read of the variable while the
    /// tape recorded).
    ///
    /// Errors: a non-persistent tape asked a second time, an integer or
    /// bool source, a target made on another thread, an op without a
    /// gradient rule on the path.
    #[track_caller]
    pub fn gradient<S: Source + ?Sized>(&self, target: &Tensor, sources: &S) -> Result<Vec<Option<Tensor>>> {
        // The backward ops are the user's `gradient` call, in listings and errors.
        let at = std::panic::Location::caller();
        context::attributed_to(at, || self.gradient_at(target, sources))
    }

    fn gradient_at<S: Source + ?Sized>(&self, target: &Tensor, sources: &S) -> Result<Vec<Option<Tensor>>> {
        {
            let mut st = self.state.borrow_mut();
            if st.spent {
                return Err(grad_error(
                    "this GradientTape already computed a gradient; use GradientTape::persistent() to ask more than once",
                ));
            }
            st.spent = !st.persistent;
        }
        let here = THREAD_TAG.with(|t| *t);
        if thread_of(target.tape_id()) != here {
            return Err(grad_error(
                "the target was computed on another thread; tapes record the ops of their own thread only",
            ));
        }
        let sources = sources.source_tensors(self)?;
        if !target.dtype().is_float() {
            return Ok(vec![None; sources.len()]);
        }
        // This tape stops recording while it differentiates (enclosing
        // tapes keep recording, for higher-order gradients). No borrow is
        // held while ops run: recording borrows every tape.
        let entries = {
            let mut st = self.state.borrow_mut();
            st.paused = true;
            std::mem::take(&mut st.entries)
        };
        let result = backward(&entries, target, &sources);
        let mut st = self.state.borrow_mut();
        st.paused = false;
        st.entries = entries;
        result
    }
}

/// The value of `f()` and its gradient with respect to each of `vars`
/// (read inside `f`), dense: zeros of the variable's shape where the value
/// does not depend on it. Works eagerly and inside a traced function.
///
/// ```
/// use tracejit_trace::{value_and_grad, DType, Tensor, Variable};
///
/// let w = Variable::new(Tensor::from_vec(vec![3.0f32], &[1]));
/// let unused = Variable::new(Tensor::zeros(&[2], DType::F32));
/// let (v, g) = value_and_grad(&[w.clone(), unused], || (w.read() * w.read()).sum_all())?;
/// assert_eq!(v.to_vec::<f32>()?, vec![9.0]);
/// assert_eq!(g[0].to_vec::<f32>()?, vec![6.0]);
/// assert_eq!(g[1].to_vec::<f32>()?, vec![0.0, 0.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn value_and_grad(vars: &[Variable], f: impl FnOnce() -> Tensor) -> Result<(Tensor, Vec<Tensor>)> {
    let tape = GradientTape::new();
    let value = f();
    let grads = tape.gradient(&value, vars)?;
    drop(tape);
    let mut e = TensorEmitter;
    let dense = grads
        .into_iter()
        .zip(vars)
        .map(|(g, v)| match g {
            Some(g) => Ok(g),
            None => autodiff::zeros_like(&mut e, v.read()).map_err(|err| grad_error(err.to_string())),
        })
        .collect::<Result<Vec<Tensor>>>()?;
    Ok((value, dense))
}

/// Walks `entries` backwards from `target` (seeded with ones) and sums the
/// cotangents of each source's tensors.
fn backward(entries: &[Entry], target: &Tensor, sources: &[Vec<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    let mut e = TensorEmitter;
    let vjp_error = |err: AutodiffError| grad_error(err.to_string());
    let mut cts: HashMap<u64, Tensor> = HashMap::new();
    cts.insert(target.tape_id(), autodiff::ones_like(&mut e, target.clone()).map_err(vjp_error)?);
    let relevant = relevance::relevant(entries, sources);
    for entry in entries.iter().rev() {
        let out_cts: Vec<Option<Tensor>> = entry.outputs.iter().map(|o| cts.get(&o.tape_id()).cloned()).collect();
        if out_cts.iter().all(Option::is_none) {
            continue;
        }
        let wanted: Vec<bool> = entry.inputs.iter().map(|t| relevant.contains(&t.tape_id())).collect();
        let mut var_cts: Vec<(u64, Option<Tensor>)> = Vec::new();
        let in_cts = match &entry.what {
            Recorded::Op(op) => autodiff::vjp_wanted(&mut e, op, &entry.inputs, &entry.outputs, &out_cts, &wanted),
            Recorded::Graph(g, vars) => autodiff::vjp_graph(&mut e, g, &entry.inputs, vars, &out_cts).map(|(i, v)| {
                var_cts = vars.iter().map(|(_, t)| t.tape_id()).zip(v).collect();
                i
            }),
            Recorded::Control(op, vars) => {
                autodiff::vjp_control(&mut e, op, &entry.inputs, &entry.outputs, &out_cts, vars).map(|(i, v)| {
                    var_cts = vars.iter().map(|(_, t)| t.tape_id()).zip(v).collect();
                    i
                })
            }
            Recorded::Custom(name, f, body) => {
                let cts = f(&entry.inputs, &entry.outputs, &out_cts);
                if cts.len() != entry.inputs.len() {
                    return Err(grad_error(format!(
                        "the backward kernel of `{name}` returned {} cotangents for {} inputs",
                        cts.len(),
                        entry.inputs.len()
                    )));
                }
                if let Some(body) = body {
                    backward_check::check(name, f.as_ref(), body, &entry.inputs, &entry.outputs, &out_cts).map_err(
                        |m| match entry.location {
                            Some(at) => grad_error(format!("{m} (the call at {}:{})", at.file(), at.line())),
                            None => grad_error(m),
                        },
                    )?;
                }
                Ok(cts)
            }
            // The rule checks what its closure returns and names itself.
            Recorded::Closure(f) => Ok(f(&entry.inputs, &entry.outputs, &out_cts)?),
        }
        .map_err(|err| match entry.location {
            Some(at) => grad_error(format!("{err} (the op at {}:{})", at.file(), at.line())),
            None => vjp_error(err),
        })?;
        let flows = entry.inputs.iter().map(Tensor::tape_id).zip(in_cts).chain(var_cts);
        for (id, ct) in flows {
            let Some(ct) = ct.filter(|_| relevant.contains(&id)) else { continue };
            let sum = match cts.remove(&id) {
                Some(prev) => add(&mut e, prev, ct)?,
                None => ct,
            };
            cts.insert(id, sum);
        }
    }
    let mut out = Vec::with_capacity(sources.len());
    for reads in sources {
        let mut total: Option<Tensor> = None;
        for t in reads {
            if let Some(ct) = cts.get(&t.tape_id()) {
                total = Some(match total {
                    Some(prev) => add(&mut e, prev, ct.clone())?,
                    None => ct.clone(),
                });
            }
        }
        out.push(total);
    }
    Ok(out)
}

fn add(e: &mut TensorEmitter, a: Tensor, b: Tensor) -> Result<Tensor> {
    let mut v = e.emit(Op::Binary(BinaryOp::Add), &[a, b]).map_err(|err| grad_error(err.to_string()))?;
    Ok(v.remove(0))
}

impl Default for GradientTape {
    fn default() -> GradientTape {
        GradientTape::new()
    }
}

impl Drop for GradientTape {
    fn drop(&mut self) {
        RECORDING.with(|r| r.set(r.get().saturating_sub(1)));
        TAPES.with(|t| t.borrow_mut().retain(|w| w.upgrade().is_some_and(|s| !Rc::ptr_eq(&s, &self.state))));
    }
}

fn grad_error(message: impl Into<String>) -> Error {
    Error::Gradient { message: message.into() }
}

// ---- the backward pass ------------------------------------------------

/// The VJP rules' [`Emitter`] over tensors: ops run eagerly on eager
/// tensors and become graph nodes on symbolic ones.
pub(crate) struct TensorEmitter;

impl Emitter for TensorEmitter {
    type Value = Tensor;

    fn emit(&mut self, op: Op, inputs: &[Tensor]) -> std::result::Result<Vec<Tensor>, AutodiffError> {
        let refs: SmallVec<[&Tensor; 3]> = inputs.iter().collect();
        Ok(crate::interpreters::apply(op, &refs).into_vec())
    }

    fn value_type(&self, v: &Tensor) -> TensorType {
        v.tensor_type()
    }

    fn constant(&mut self, value: Storage) -> Tensor {
        Tensor::from_storage(value)
    }

    // A custom-gradient call kept in a graph a tape differentiates (a
    // compiled call under a tape): the rule runs here, where its closures are.
    fn call(&mut self, func: &LibraryFunction, inputs: &[Tensor]) -> std::result::Result<Vec<Tensor>, AutodiffError> {
        let (rule, arity) = custom_rule(func)?;
        rule.forward_outputs(arity, inputs).map_err(|e| AutodiffError::Request(e.to_string()))
    }

    fn call_vjp(
        &mut self,
        func: &LibraryFunction,
        inputs: &[Tensor],
        outputs: &[Tensor],
        cotangents: &[Option<Tensor>],
    ) -> std::result::Result<Vec<Option<Tensor>>, AutodiffError> {
        let (rule, arity) = custom_rule(func)?;
        rule.recomputed_cotangents(arity, inputs, outputs, cotangents)
            .map_err(|e| AutodiffError::Request(e.to_string()))
    }
}

fn custom_rule(func: &LibraryFunction) -> std::result::Result<(Arc<crate::custom::Rule>, usize), AutodiffError> {
    let name = func.implements().unwrap_or_default();
    crate::custom::lookup(name).ok_or_else(|| AutodiffError::Unsupported {
        op: "call".into(),
        message: format!("no custom gradient is registered as `{name}` (a bug in tracejit)"),
    })
}
