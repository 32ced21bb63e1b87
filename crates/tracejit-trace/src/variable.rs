//! `Variable`: a shared, mutable, thread-safe tensor with a fixed dtype and
//! shape, and `remember`, which creates state once per call site.
//!
//! Eagerly a variable acts at once. While tracing, `read` and the `assign`
//! family record stateful nodes on a captured handle, so a compiled function
//! sees later assignments made outside it and its own writes are visible
//! after the call. Automatic control dependencies keep program order per
//! variable: a read depends on the last write; a write on the last write and
//! every read since.
//!
//! Variables created while tracing follow tf.function's rule: only on the
//! first trace of a Function, from a value computed outside the graph (the
//! init scope); on a later trace it is an error, unless the creation happens
//! inside `remember`, which runs its closure once per call site and Function.

use std::any::TypeId;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use tracejit_ir::{AssignKind, NodeId, Op, VariableResource};
use tracejit_tensor::{DType, Storage};

use crate::context::{self, with_current, MemoTable};
use crate::remat::effects;
use crate::Tensor;

static NEXT_VARIABLE: AtomicU64 = AtomicU64::new(1);

struct VarState {
    id: u64,
    name: RwLock<String>,
    dtype: DType,
    shape: Vec<usize>,
    trainable: std::sync::atomic::AtomicBool,
    /// A random generator's state ([`Variable::with_random_state`]).
    random_state: std::sync::atomic::AtomicBool,
    value: RwLock<Storage>,
    /// Serializes locked updates ([`locked_update`]).
    update_lock: tracejit_ir::locks::UpdateLock,
}

impl Drop for VarState {
    /// Forgets the variable's entry in the id table: the table's weak
    /// handle would otherwise keep the state's allocation (and the entry)
    /// alive for the life of the process, ~250 bytes per variable ever made.
    fn drop(&mut self) {
        // `by_id` never drops a state while it holds the lock, so this
        // cannot deadlock.
        live_variables().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl fmt::Debug for VarState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Variable({:?}, {}{:?})", self.name.read().expect("name lock"), self.dtype, self.shape)
    }
}

impl VariableResource for VarState {
    fn name(&self) -> String {
        self.name.read().expect("name lock").clone()
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    fn read(&self) -> Storage {
        self.value.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn write(&self, value: Storage) {
        *self.value.write().unwrap_or_else(|e| e.into_inner()) = value;
    }
    fn replace(&self, value: Storage) -> Storage {
        std::mem::replace(&mut *self.value.write().unwrap_or_else(|e| e.into_inner()), value)
    }
    fn update(&self, f: &mut dyn FnMut(&Storage) -> Storage) {
        let mut guard = self.value.write().unwrap_or_else(|e| e.into_inner());
        let new = f(&guard);
        *guard = new;
    }
    fn is_random_state(&self) -> bool {
        self.random_state.load(Ordering::Relaxed)
    }
    fn update_in_place(&self, f: &mut dyn FnMut(&mut Storage)) {
        // The lock's own handle: a write copies the buffer only if a
        // snapshot (a read still alive) shares it.
        f(&mut self.value.write().unwrap_or_else(|e| e.into_inner()));
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn update_lock(&self) -> Option<&tracejit_ir::locks::UpdateLock> {
        Some(&self.update_lock)
    }
}

/// A shared, mutable tensor of fixed dtype and shape. Cloning gives another
/// handle to the same variable. A traced function captures it by
/// reference, so it sees later assignments, and its own assignments happen
/// on every call; trainable variables read under a tape are watched.
///
/// ```
/// use tracejit_trace::{function, DType, Tensor, Variable};
///
/// let count = Variable::new(Tensor::zeros(&[], DType::F32)).with_name("count");
/// let c = count.clone();                         // the same variable
/// let step = function(move |x: Tensor| {
///     c.assign_add(&x.sum_all());
///     c.read()
/// });
/// step.call(Tensor::ones(&[3], DType::F32))?;
/// step.call(Tensor::ones(&[3], DType::F32))?;
/// assert_eq!(count.value().to_vec::<f32>()?, [6.0]);   // the graph assigned it twice
/// assert_eq!(count.name(), "count");
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone)]
pub struct Variable {
    state: Arc<VarState>,
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.state.fmt(f)
    }
}

impl PartialEq for Variable {
    /// Two handles are equal when they refer to the same variable.
    fn eq(&self, other: &Variable) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for Variable {}

impl std::hash::Hash for Variable {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.state.id.hash(state);
    }
}

impl Variable {
    /// A trainable variable holding `initial`. While tracing, `initial` must
    /// not depend on the function's inputs, and creation is allowed only on a
    /// Function's first trace (or inside `remember`).
    #[track_caller]
    pub fn new(initial: Tensor) -> Variable {
        let storage = match initial.storage() {
            Ok(s) => s.clone(),
            Err(_) => panic!(
                "Variable::new at {}:{}: the initial value depends on the inputs of function `{}`; a \
                 variable's initial value is computed once, outside the graph (compute it from eager tensors, \
                 or create the variable outside the function)",
                Location::caller().file(),
                Location::caller().line(),
                context::current_function().as_deref().unwrap_or("?")
            ),
        };
        // A Function running eagerly creates its variables on the first call
        // only, as its first trace would (see `crate::eager`).
        let site = Location::caller();
        // Inside `remember`, or inside a Function traced from an eager one
        // (the Eager retrace policy), the usual rules apply.
        let eager_frame = !context::in_remember_now() && context::current_function().is_none();
        if eager_frame {
            if let Some(v) = crate::eager::existing_variable(site, &storage) {
                return v;
            }
        }
        context::check_variable_creation();
        let id = NEXT_VARIABLE.fetch_add(1, Ordering::Relaxed);
        let var = Variable {
            state: Arc::new(VarState {
                id,
                name: RwLock::new(format!("variable_{id}")),
                dtype: storage.dtype(),
                shape: storage.shape().to_vec(),
                trainable: std::sync::atomic::AtomicBool::new(true),
                random_state: std::sync::atomic::AtomicBool::new(false),
                value: RwLock::new(storage),
                update_lock: tracejit_ir::locks::UpdateLock::new(),
            }),
        };
        context::note_variable_created(&var);
        if eager_frame {
            crate::eager::note_created(site, &var);
        }
        live_variables().lock().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::downgrade(&var.state));
        var
    }

    /// The live variable with this id, if any (a graph names variables by
    /// their resource; gradient tapes need the handle back).
    pub(crate) fn by_id(id: u64) -> Option<Variable> {
        let mut live = live_variables().lock().unwrap_or_else(|e| e.into_inner());
        match live.get(&id).and_then(std::sync::Weak::upgrade) {
            Some(state) => Some(Variable { state }),
            None => {
                live.remove(&id);
                None
            }
        }
    }

    /// Names the variable (builder style).
    pub fn with_name(self, name: impl Into<String>) -> Variable {
        *self.state.name.write().expect("name lock") = name.into();
        self
    }

    /// Marks the variable trainable or not (builder style).
    pub fn with_trainable(self, trainable: bool) -> Variable {
        self.state.trainable.store(trainable, Ordering::Relaxed);
        self
    }

    /// Marks the variable as a random generator's state (builder style;
    /// `tracejit::random::Generator` marks its own): inside `vmap` its
    /// advance, the same for every example, happens once per call, where
    /// a write of any other variable is an error.
    pub fn with_random_state(self) -> Variable {
        self.state.random_state.store(true, Ordering::Relaxed);
        self
    }

    /// Renames the variable (modules prefix their name scope).
    pub fn set_name(&self, name: impl Into<String>) {
        *self.state.name.write().expect("name lock") = name.into();
    }

    /// The name.
    pub fn name(&self) -> String {
        self.state.name()
    }

    /// The variable as the IR's shared resource: what a graph's variable
    /// table holds for it (`Graph::variables`), to bind a graph that was
    /// read back from text to live variables (`tracejit::artifact`).
    pub fn resource(&self) -> Arc<dyn tracejit_ir::VariableResource> {
        self.state.clone()
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The dtype, fixed at creation.
    pub fn dtype(&self) -> DType {
        self.state.dtype
    }

    /// The shape, fixed at creation.
    pub fn shape(&self) -> &[usize] {
        &self.state.shape
    }

    /// Whether optimizers update it.
    pub fn trainable(&self) -> bool {
        self.state.trainable.load(Ordering::Relaxed)
    }

    /// The current value as an eager tensor, even while tracing (a snapshot
    /// taken now, not a graph read).
    pub fn value(&self) -> Tensor {
        Tensor::from_storage(self.state.read())
    }

    /// Replaces the value at once with the eager tensor `value`, outside any
    /// graph even while tracing (what checkpoint restore uses). Panics, as
    /// `assign` does, if `value` has another dtype or shape, or is symbolic.
    #[track_caller]
    pub fn set_value(&self, value: &Tensor) {
        let storage = value.eager_storage();
        if storage.dtype() != self.state.dtype || storage.shape() != self.state.shape.as_slice() {
            panic!(
                "set_value: variable `{}` holds {}{:?}, the value is {}{:?}; variables keep the dtype and \
                 shape they were created with",
                self.name(),
                self.state.dtype,
                self.state.shape,
                storage.dtype(),
                storage.shape()
            );
        }
        self.state.write(storage.clone());
    }

    /// Reads the variable: eagerly its current value; while tracing, a read
    /// node ordered after the previous write.
    #[track_caller]
    pub fn read(&self) -> Tensor {
        if effects::idle() {
            return self.read_live();
        }
        // Inside a checkpoint: the recomputation sees the forward's value
        // (the enclosing tapes track it already); the forward keeps it.
        if let effects::Read::Replayed(value) = effects::read(self) {
            return value;
        }
        let value = self.read_live();
        effects::note_read(self, &value);
        value
    }

    /// [`Variable::read`] of the current value, whatever checkpoint is
    /// recording or replaying (tapes reading around a call use it: the
    /// call reads the variable again when it runs again).
    #[track_caller]
    pub(crate) fn read_live(&self) -> Tensor {
        let value = if context::current_function().is_none() {
            self.value()
        } else {
            let (var, control) = self.graph_handle(false);
            let (node, outs) =
                context::record_in_current(Op::ReadVariable { var, locked: self.in_locked_update() }, &[], &control)
                    .expect("a trace is active");
            self.note_access(node, false);
            outs.into_iter().next().expect("a read has one output")
        };
        // Gradient tapes watch what trainable variables read.
        crate::tape::record_variable_read(self, &value);
        value
    }

    /// `v = value`.
    #[track_caller]
    pub fn assign(&self, value: &Tensor) {
        self.write(AssignKind::Assign, value);
    }

    /// `v = v + value`.
    #[track_caller]
    pub fn assign_add(&self, value: &Tensor) {
        self.write(AssignKind::Add, value);
    }

    /// `v = v - value`.
    #[track_caller]
    pub fn assign_sub(&self, value: &Tensor) {
        self.write(AssignKind::Sub, value);
    }

    /// `v = v + delta`, returning the value before the add, as one atomic
    /// update: two threads never see the same old value, eagerly or in
    /// concurrent calls of a compiled function (while tracing, a read and
    /// an `assign_add` under the variable's update lock, as
    /// [`locked_update`]).
    #[track_caller]
    pub fn fetch_add(&self, delta: &Tensor) -> Tensor {
        if context::current_function().is_some() {
            return locked_update(&[self], || {
                let old = self.read();
                self.assign_add(delta);
                old
            });
        }
        let d = delta.eager_storage().clone();
        if d.dtype() != self.state.dtype {
            panic!("fetch_add: variable `{}` holds {}, the delta is {}", self.name(), self.state.dtype, d.dtype());
        }
        if !effects::idle() {
            // A checkpoint's recomputation: the forward's old value, no add.
            if let effects::Read::Replayed(old) = effects::read(self) {
                return old;
            }
            if effects::writes_dropped() {
                return self.value();
            }
        }
        let mut old = None;
        self.state.update(&mut |cur| {
            old = Some(cur.clone());
            tracejit_tensor::kernels::binary(tracejit_tensor::BinaryOp::Add, cur, &d)
        });
        let old = Tensor::from_storage(old.expect("update ran the closure"));
        if !effects::idle() {
            effects::note_read(self, &old);
        }
        old
    }

    #[track_caller]
    fn write(&self, kind: AssignKind, value: &Tensor) {
        let ty = value.tensor_type();
        let fits = ty.dtype == self.state.dtype
            && ty.rank() == self.state.shape.len()
            && ty.dims.iter().zip(&self.state.shape).all(|(d, s)| d.is_none_or(|d| d == *s));
        if !fits {
            panic!(
                "{}: variable `{}` holds {}{:?}, the value is {ty}; variables keep the dtype and shape \
                 they were created with",
                kind.name(),
                self.name(),
                self.state.dtype,
                self.state.shape
            );
        }
        if !effects::idle() && effects::writes_dropped() {
            // A checkpoint's recomputation: the forward wrote already.
            return;
        }
        if context::current_function().is_none() {
            let v = value.eager_storage().clone();
            match kind {
                AssignKind::Assign => self.state.write(v),
                AssignKind::Add => self
                    .state
                    .update(&mut |cur| tracejit_tensor::kernels::binary(tracejit_tensor::BinaryOp::Add, cur, &v)),
                AssignKind::Sub => self
                    .state
                    .update(&mut |cur| tracejit_tensor::kernels::binary(tracejit_tensor::BinaryOp::Sub, cur, &v)),
            }
            return;
        }
        let (var, control) = self.graph_handle(true);
        let op = Op::AssignVariable { var, kind, locked: self.in_locked_update() };
        let (node, _) = context::record_in_current(op, &[value], &control).expect("a trace is active");
        self.note_access(node, true);
    }

    /// True while tracing the body of a [`locked_update`] of this variable.
    fn in_locked_update(&self) -> bool {
        LOCKED.with(|l| l.borrow().contains(&self.state.id))
    }

    /// Registers the variable in the innermost graph and returns its id with
    /// the control inputs program order requires.
    fn graph_handle(&self, is_write: bool) -> (tracejit_ir::VarId, Vec<NodeId>) {
        with_current(|ctx| {
            let var = ctx.graph.add_variable(self.state.clone());
            let order = ctx.var_order.entry(self.state.id).or_default();
            let mut control: Vec<NodeId> = order.last_write.into_iter().collect();
            if is_write {
                control.extend(order.reads_since_write.iter().copied());
            }
            (var, control)
        })
        .expect("a trace is active")
    }

    fn note_access(&self, node: NodeId, is_write: bool) {
        with_current(|ctx| {
            let order = ctx.var_order.entry(self.state.id).or_default();
            if is_write {
                order.last_write = Some(node);
                order.reads_since_write.clear();
            } else {
                order.reads_since_write.push(node);
            }
        });
    }
}

thread_local! {
    /// The variables of the [`locked_update`]s being traced on this thread.
    static LOCKED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f`, an update of `vars` (read, compute, assign), as one atomic
/// step with respect to every other locked update of any of them, on any
/// thread, eagerly or inside compiled functions: TensorFlow's
/// `use_locking=True`. The optimizers update each variable and its slots
/// this way, so threads sharing a model lose no step.
///
/// Eagerly it holds the variables' update locks (taken in id order, so two
/// updates never wait for each other in a cycle; re-entrant on one thread)
/// while `f` runs. While tracing, the reads and assignments of `vars` that
/// `f` records are marked `locked`; each run of the compiled function takes
/// the locks of all its locked variables at its first locked access and
/// releases each after its last (see `tracejit_ir::locks`), so compiled
/// and eager updates exclude each other too. Reads outside a locked update
/// (a forward pass) take no lock and see the value before or after an
/// update, never a mix.
///
/// ```
/// use tracejit_trace::{locked_update, Tensor, Variable};
///
/// let total = Variable::new(Tensor::scalar(0.0f64));
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             for _ in 0..100 {
///                 // Read-modify-write: without the lock, concurrent
///                 // updates could read the same value and lose a step.
///                 locked_update(&[&total], || total.assign(&(total.read() + 1.0)));
///             }
///         });
///     }
/// });
/// assert_eq!(total.value().to_vec::<f64>()?, vec![400.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn locked_update<T>(vars: &[&Variable], f: impl FnOnce() -> T) -> T {
    if context::current_function().is_none() {
        let resources: Vec<Arc<dyn tracejit_ir::VariableResource>> =
            vars.iter().map(|v| v.state.clone() as Arc<dyn tracejit_ir::VariableResource>).collect();
        let _held = tracejit_ir::locks::lock_all(&resources);
        return f();
    }
    struct Pop(usize);
    impl Drop for Pop {
        fn drop(&mut self) {
            LOCKED.with(|l| l.borrow_mut().truncate(self.0));
        }
    }
    let _pop = Pop(LOCKED.with(|l| {
        let mut l = l.borrow_mut();
        let len = l.len();
        l.extend(vars.iter().map(|v| v.state.id));
        len
    }));
    f()
}

/// An explicit owner for `remember_in` outside of functions: values are
/// memoized per (scope, call site).
#[derive(Default)]
pub struct Scope {
    memo: MemoTable,
}

impl Scope {
    /// A new, empty scope.
    pub fn new() -> Scope {
        Scope::default()
    }
}

/// Every variable by id, weakly (see `Variable::by_id`).
fn live_variables() -> &'static std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<VarState>>> {
    static LIVE: OnceLock<std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<VarState>>>> =
        OnceLock::new();
    LIVE.get_or_init(Default::default)
}

fn global_memo() -> &'static MemoTable {
    static GLOBAL: OnceLock<MemoTable> = OnceLock::new();
    GLOBAL.get_or_init(Default::default)
}

fn memoize<T: Clone + Send + Sync + 'static>(
    table: &MemoTable,
    site: &'static Location<'static>,
    make: impl FnOnce() -> T,
) -> T {
    let key = (site, TypeId::of::<T>());
    if let Some(v) = table.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        if let Some(v) = v.downcast_ref::<T>() {
            return v.clone();
        }
    }
    let value = context::in_remember(make);
    let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
    let entry = t.entry(key).or_insert_with(|| Arc::new(value));
    entry.downcast_ref::<T>().expect("remember: one call site always builds one type").clone()
}

/// Builds a value once per call site and returns clones of it afterwards.
///
/// Inside a traced function the memo belongs to the Function, so a lazily
/// built layer (`let w = remember(|| Variable::new(...))`) creates its
/// variables exactly once however often the function is retraced. Outside
/// any function the memo is process-wide and keyed by call site alone; use
/// [`remember_in`] to key by an explicit [`Scope`] as well.
///
/// ```
/// use tracejit_trace::{function, remember, DType, Tensor, Variable};
///
/// // A layer that creates its weight on first use, even on a retrace.
/// let f = function(|x: Tensor| {
///     let w = remember(|| Variable::new(Tensor::ones(&[], DType::F32)));
///     &x * w.read()
/// });
/// f.call(Tensor::ones(&[2], DType::F32))?;
/// f.call(Tensor::ones(&[3], DType::F32))?;   // a second trace, the same variable
/// assert_eq!(f.tracing_count(), 2);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn remember<T: Clone + Send + Sync + 'static>(make: impl FnOnce() -> T) -> T {
    let site = Location::caller();
    match context::traced_memo().or_else(crate::eager::current_memo) {
        Some(table) => memoize(&table, site, make),
        None => memoize(global_memo(), site, make),
    }
}

/// Like [`remember`], memoized per (`scope`, call site).
#[track_caller]
pub fn remember_in<T: Clone + Send + Sync + 'static>(scope: &Scope, make: impl FnOnce() -> T) -> T {
    memoize(&scope.memo, Location::caller(), make)
}
