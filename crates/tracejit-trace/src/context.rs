//! Tracing contexts.
//!
//! Each thread has a stack of tracing contexts (one per `Function` being
//! traced, innermost last), so tracing on one thread never sees another's.
//! Every op goes through `crate::interpreters::apply`; one whose inputs
//! are not all eager reaches [`apply_symbolic`] at the bottom of that
//! stack, which records a node in the innermost context's graph, capturing
//! eager inputs as constants and symbolic tensors of an enclosing trace as
//! implicit parameters.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::{Graph, NodeId, Op, ValueId};
use tracejit_tensor::Storage;

use crate::tensor::Repr;
use crate::{Tensor, Variable};

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// Program order of one variable's accesses within a trace.
#[derive(Default)]
pub(crate) struct VarOrder {
    pub last_write: Option<NodeId>,
    pub reads_since_write: Vec<NodeId>,
}

/// What `remember` stores: values by call site, per Function (or per scope).
/// Keyed by call site and the built type, so a generic function calling
/// `remember` for two types keeps two values.
pub(crate) type MemoTable =
    std::sync::Mutex<HashMap<(&'static Location<'static>, std::any::TypeId), Arc<dyn std::any::Any + Send + Sync>>>;

/// The state of one trace in progress.
pub(crate) struct TraceContext {
    pub id: u64,
    pub fn_name: Arc<str>,
    pub graph: Graph,
    /// Eager tensors (rank > 0) used by the closure but not passed in.
    pub captures: Vec<Tensor>,
    capture_index: HashMap<(usize, Vec<usize>, Vec<isize>, u8), ValueId>,
    /// Symbolic tensors of enclosing traces, each given an extra parameter.
    pub outer_captures: Vec<(Tensor, ValueId)>,
    /// Program order of each variable's accesses (automatic control deps).
    pub var_order: HashMap<u64, VarOrder>,
    /// Whether this is the Function's first trace (variables may be created).
    pub first_trace: bool,
    /// The Function's `remember` table.
    pub memo: Option<Arc<MemoTable>>,
    /// Variables created during this trace.
    pub created_variables: Vec<Variable>,
}

impl TraceContext {
    pub fn new(fn_name: Arc<str>) -> TraceContext {
        TraceContext {
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            graph: Graph::new(fn_name.to_string()),
            fn_name,
            captures: Vec::new(),
            capture_index: HashMap::new(),
            outer_captures: Vec::new(),
            var_order: HashMap::new(),
            first_trace: true,
            memo: None,
            created_variables: Vec::new(),
        }
    }

    /// Sets what the Function knows: whether this is its first trace, and
    /// its `remember` table.
    pub fn for_function(mut self, first_trace: bool, memo: Arc<MemoTable>) -> TraceContext {
        self.first_trace = first_trace;
        self.memo = Some(memo);
        self
    }

    /// A symbolic tensor for output `v` of this context's graph.
    pub fn symbolic(&self, v: ValueId) -> Tensor {
        Tensor::symbolic(self.id, v, self.graph.value_type(v).clone(), self.fn_name.clone())
    }

    /// The value standing for `t` in this graph. Eager tensors become
    /// constants (deduplicated by buffer); symbolic tensors of an enclosing
    /// trace become implicit parameters.
    fn value_of(&mut self, t: &Tensor, outer: &[TraceContext]) -> ValueId {
        match t.repr() {
            Repr::Symbolic(s) if s.ctx == self.id => s.value,
            Repr::Symbolic(s) => {
                if let Some((_, v)) = self.outer_captures.iter().find(|(o, _)| o.same_symbolic(t)) {
                    return *v;
                }
                assert!(
                    outer.iter().any(|c| c.id == s.ctx),
                    "a symbolic tensor of function `{}` was used after its trace ended (while tracing `{}`); \
                     return it from the function instead of storing it",
                    s.fn_name,
                    self.fn_name
                );
                let v = self.graph.add_param(s.ty.clone());
                self.outer_captures.push((t.clone(), v));
                v
            }
            Repr::Eager(storage) => {
                let key = storage_key(storage);
                if let Some(v) = self.capture_index.get(&key) {
                    return *v;
                }
                let v = self.graph.add_constant(storage.clone());
                if storage.rank() > 0 {
                    self.captures.push(t.clone());
                }
                self.capture_index.insert(key, v);
                v
            }
        }
    }
}

// Identity of an eager buffer view: data pointer, shape, strides, dtype.
fn storage_key(s: &Storage) -> (usize, Vec<usize>, Vec<isize>, u8) {
    let (ptr, strides) = tracejit_tensor::with_array!(s, a => (a.as_ptr() as usize, a.strides().to_vec()));
    (ptr, s.shape().to_vec(), strides, s.dtype() as u8)
}

thread_local! {
    static STACK: RefCell<Vec<TraceContext>> = const { RefCell::new(Vec::new()) };
    /// Set while tracejit records ops on behalf of one user call (a
    /// gradient, an optimizer step): those nodes take the call's location.
    static ATTRIBUTED: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// Runs `f` with every node it records (eagerly: every op-named panic)
/// attributed to `location`, the user's call of an API that emits ops on
/// the user's behalf, such as `GradientTape::gradient` or an optimizer's
/// `apply_gradients`. An enclosing attribution wins, and a Function traced
/// inside `f` records its own lines.
pub fn attributed_to<T>(location: &'static Location<'static>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<&'static Location<'static>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ATTRIBUTED.with(|a| a.set(self.0));
        }
    }
    let outer = ATTRIBUTED.with(|a| a.replace(Some(a.get().unwrap_or(location))));
    let _restore = Restore(outer);
    f()
}

/// The location a node recorded at `caller` takes.
pub(crate) fn node_location(caller: &'static Location<'static>) -> &'static Location<'static> {
    ATTRIBUTED.with(Cell::get).unwrap_or(caller)
}

/// Pushes a context; the returned guard pops it (also on unwind) and hands
/// the finished context back through `finish`. The trace records the
/// closure's own lines, whatever attribution encloses it.
pub(crate) fn push_context(ctx: TraceContext) -> ContextGuard {
    let id = ctx.id;
    STACK.with(|s| s.borrow_mut().push(ctx));
    let attributed = ATTRIBUTED.with(|a| a.take());
    ContextGuard { id, done: false, attributed }
}

/// Pops its context when dropped, unless `finish` took it.
pub(crate) struct ContextGuard {
    id: u64,
    done: bool,
    /// The attribution to restore when the trace ends.
    attributed: Option<&'static Location<'static>>,
}

impl ContextGuard {
    /// Runs `f` on the context (which must be the innermost).
    pub fn with<R>(&self, f: impl FnOnce(&mut TraceContext) -> R) -> R {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            let ctx = s.last_mut().expect("tracing context stack is empty");
            assert_eq!(ctx.id, self.id, "tracing contexts were not popped in order");
            f(ctx)
        })
    }

    /// Pops and returns the context.
    pub fn finish(mut self) -> TraceContext {
        self.done = true;
        ATTRIBUTED.with(|a| a.set(self.attributed));
        STACK.with(|s| {
            let ctx = s.borrow_mut().pop().expect("tracing context stack is empty");
            assert_eq!(ctx.id, self.id, "tracing contexts were not popped in order");
            ctx
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if !self.done {
            ATTRIBUTED.with(|a| a.set(self.attributed));
            STACK.with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    if let Some(pos) = s.iter().rposition(|c| c.id == self.id) {
                        s.truncate(pos);
                    }
                }
            });
        }
    }
}

/// How many traces are in progress on this thread (functions and the
/// subgraphs of control flow, nested).
pub(crate) fn depth() -> usize {
    STACK.with(|s| s.borrow().len())
}

/// The name of the function being traced on this thread, if any.
pub(crate) fn current_function() -> Option<Arc<str>> {
    STACK.with(|s| s.borrow().last().map(|c| c.fn_name.clone()))
}

/// Runs `f` on the innermost context, if there is one.
pub(crate) fn with_current<R>(f: impl FnOnce(&mut TraceContext) -> R) -> Option<R> {
    STACK.with(|s| s.borrow_mut().last_mut().map(f))
}

/// Runs `f` on the innermost context and the enclosing ones (outermost first).
fn with_current_and_outer<R>(f: impl FnOnce(&mut TraceContext, &[TraceContext]) -> R) -> Option<R> {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        let (last, outer) = s.split_last_mut()?;
        Some(f(last, outer))
    })
}

/// Records `op` on `inputs` (some symbolic) as a node of the innermost
/// trace, capturing eager inputs as constants and symbolic tensors of an
/// enclosing trace as implicit parameters: the bottom of the interpreter
/// stack for traced ops (`crate::interpreters`). Misuse panics with the
/// op's type error, the function and the source line.
pub(crate) fn apply_symbolic(
    op: Op,
    inputs: &[&Tensor],
    location: &'static Location<'static>,
) -> SmallVec<[Tensor; 1]> {
    let name = op.name();
    let out = with_current_and_outer(|ctx, outer| {
        let values: SmallVec<[ValueId; 2]> = inputs.iter().map(|t| ctx.value_of(t, outer)).collect();
        let node = match ctx.graph.add_node(op, &values, &[], Some(location)) {
            Ok(n) => n,
            Err(e) => panic!("{e} (while tracing function `{}`, at {location})", ctx.fn_name),
        };
        let n = ctx.graph.node(node).outputs.len();
        (0..n).map(|i| ctx.symbolic(ValueId::new(node, i as u32))).collect()
    });
    out.unwrap_or_else(|| {
        panic!("{name}: a symbolic tensor was used outside of any trace; return it from the function instead")
    })
}

/// Records a node in the innermost trace with explicit control inputs and
/// returns its id; used for stateful ops.
#[track_caller]
pub(crate) fn record_in_current(op: Op, inputs: &[&Tensor], control: &[NodeId]) -> Option<(NodeId, Vec<Tensor>)> {
    let location = node_location(Location::caller());
    with_current_and_outer(|ctx, outer| {
        let values: SmallVec<[ValueId; 2]> = inputs.iter().map(|t| ctx.value_of(t, outer)).collect();
        let node = match ctx.graph.add_node(op, &values, control, Some(location)) {
            Ok(n) => n,
            Err(e) => panic!("{e} (while tracing function `{}`, at {location})", ctx.fn_name),
        };
        let n = ctx.graph.node(node).outputs.len();
        let outs = (0..n).map(|i| ctx.symbolic(ValueId::new(node, i as u32))).collect();
        (node, outs)
    })
}

/// Maps tensors to values of the innermost graph (capturing as needed).
pub(crate) fn values_in_current(ts: &[&Tensor]) -> Option<Vec<ValueId>> {
    with_current_and_outer(|ctx, outer| ts.iter().map(|t| ctx.value_of(t, outer)).collect())
}

thread_local! {
    static IN_REMEMBER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f` as the body of a `remember`: variables may be created there on
/// any trace, since the closure runs once per call site.
pub(crate) fn in_remember<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_REMEMBER.with(|c| c.set(c.get() - 1));
        }
    }
    IN_REMEMBER.with(|c| c.set(c.get() + 1));
    let _reset = Reset;
    f()
}

/// The `remember` table of the innermost Function being traced.
pub(crate) fn traced_memo() -> Option<Arc<MemoTable>> {
    STACK.with(|s| s.borrow().last().and_then(|c| c.memo.clone()))
}

/// True inside the closure of a `remember`.
pub(crate) fn in_remember_now() -> bool {
    IN_REMEMBER.with(|c| c.get()) > 0
}

/// Panics unless a variable may be created here: outside of tracing, on a
/// Function's first trace, or inside `remember`.
#[track_caller]
pub(crate) fn check_variable_creation() {
    if IN_REMEMBER.with(|c| c.get()) > 0 {
        return;
    }
    let at = Location::caller();
    STACK.with(|s| {
        if let Some(ctx) = s.borrow().last() {
            if !ctx.first_trace {
                panic!(
                    "Variable::new at {}:{}: function `{}` creates a variable on a later trace; variables may be \
                     created only on a function's first trace. Create it outside the function, or wrap the \
                     creation in `remember(|| Variable::new(...))` so it happens once",
                    at.file(),
                    at.line(),
                    ctx.fn_name
                );
            }
        }
    });
}

/// Records a variable created while tracing.
pub(crate) fn note_variable_created(v: &Variable) {
    with_current(|ctx| ctx.created_variables.push(v.clone()));
}

/// True when the Function owning `memo` is being traced on this thread.
pub(crate) fn is_tracing_memo(memo: &Arc<MemoTable>) -> bool {
    STACK.with(|s| s.borrow().iter().any(|c| c.memo.as_ref().is_some_and(|m| Arc::ptr_eq(m, memo))))
}

/// Every variable access recorded so far in the innermost trace (the last
/// write and the reads since, per variable): the control inputs of a node
/// that must come after all of them.
pub(crate) fn all_variable_accesses() -> Vec<NodeId> {
    with_current(|ctx| {
        let mut v: Vec<NodeId> = ctx
            .var_order
            .values()
            .flat_map(|o| o.last_write.iter().chain(o.reads_since_write.iter()).copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    })
    .unwrap_or_default()
}

/// Records `node` (a call with side effects) as the last write of every
/// variable in the innermost trace and of `callee_vars`, so later accesses
/// are ordered after it.
pub(crate) fn note_barrier(node: NodeId, callee_vars: impl Iterator<Item = u64>) {
    with_current(|ctx| {
        let ids: Vec<u64> = ctx.var_order.keys().copied().chain(callee_vars).collect();
        for id in ids {
            let order = ctx.var_order.entry(id).or_default();
            order.last_write = Some(node);
            order.reads_since_write.clear();
        }
    });
}

/// A context for a subgraph (a branch or loop body) of the innermost
/// trace: it inherits whether variables may be created and the `remember`
/// table, so code behaves the same inside a branch as around it.
pub(crate) fn subgraph_context(name: String) -> TraceContext {
    let mut ctx = TraceContext::new(Arc::from(name.as_str()));
    STACK.with(|s| {
        if let Some(outer) = s.borrow().last() {
            ctx.first_trace = outer.first_trace;
            ctx.memo = outer.memo.clone();
        }
    });
    ctx
}
