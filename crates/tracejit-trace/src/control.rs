//! Control flow on tensor values: [`cond`], [`while_loop`] (and
//! [`while_loop_with`], which a trip limit or a [`CancelToken`] may stop)
//! and [`fori_loop`].
//!
//! Eagerly (no trace on this thread) they are plain Rust: an `if` on the
//! predicate's value, a `loop`. While tracing, each becomes one graph node
//! (`cond` / `while`) whose branches, condition and body are subgraphs
//! traced once, so one trace serves every predicate value and every trip
//! count. A subgraph captures the tensors of the enclosing trace it uses
//! (they become inputs of the node) and reads and writes Variables like any
//! traced code; the node is ordered like a variable access with respect to
//! the rest of the graph, so effects inside it happen when it runs, in
//! program order.
//!
//! Misuse (a predicate that is not a bool scalar, branches returning
//! different types, a carried value changing its shape) panics with a
//! message naming both sides; inside a traced function the panic is the
//! `Err` of the call.

use std::sync::Arc;

pub use tracejit_ir::control::CancelToken;
use tracejit_ir::{join_types, Graph, Op, TensorType};
use tracejit_tensor::DType;

use crate::context::{self, push_context, subgraph_context};
use crate::nest::{Flattener, Nest, StaticValue, Unflattener};
use crate::Tensor;

/// A traced subgraph and what it needs from the enclosing trace.
struct Subtrace {
    graph: Graph,
    /// Tensors of enclosing traces it uses, one per parameter after the
    /// explicit ones, in parameter order.
    captures: Vec<Tensor>,
    statics: Vec<Arc<dyn StaticValue>>,
    structure: Vec<u32>,
}

/// The flattened result of a subgraph closure.
struct Flat {
    tensors: Vec<Tensor>,
    statics: Vec<Arc<dyn StaticValue>>,
    structure: Vec<u32>,
}

fn flat<R: Nest>(r: &R) -> Flat {
    let mut f = Flattener::default();
    r.flatten(&mut f);
    Flat {
        tensors: f.tensors.iter().map(|t| (*t).clone()).collect(),
        statics: f.statics.iter().map(|s| s.clone_arc()).collect(),
        structure: f.structure.to_vec(),
    }
}

/// How deeply `cond`, `while_loop` and function calls may nest while
/// tracing. Each level costs stack while it is traced and run (a few KiB;
/// 500 nested `cond`s overflowed a 2 MiB thread stack and aborted the
/// process); past this a trace is an `Err` naming the limit, so 128 levels
/// fit a 2 MiB stack with room for the user's own frames. Eager control
/// flow has no such limit.
pub const MAX_NESTING: usize = 128;

/// Panics (the `Err` of the call) when a new subgraph would nest deeper
/// than [`MAX_NESTING`].
#[track_caller]
fn check_nesting(what: &str) {
    let depth = context::depth();
    if depth > MAX_NESTING {
        panic!(
            "{what}: control flow nests more than {MAX_NESTING} levels deep in function `{}` (tracejit traces at most \
             {MAX_NESTING} nested cond/while_loop/function levels: each level's trace and run use stack, and a \
             deeper one would overflow a 2 MiB thread stack); flatten the nesting, e.g. compute the branches' values \
             and pick one with Tensor::select, or run it eagerly",
            context::current_function().as_deref().unwrap_or("?")
        );
    }
}

/// Traces `f` on fresh parameters of `params` into a new graph named
/// `name`. `known_captures` become its first implicit parameters, in
/// order, whether used or not (so two branches can share a prefix).
#[track_caller]
fn trace_subgraph(
    name: String,
    params: &[TensorType],
    known_captures: &[Tensor],
    f: impl FnOnce(Vec<Tensor>) -> Flat,
) -> Subtrace {
    check_nesting(match name.rsplit('.').next() {
        Some("then" | "else" | "untaken") => "cond",
        _ => "while_loop",
    });
    let guard = push_context(subgraph_context(name));
    let placeholders: Vec<Tensor> = guard.with(|ctx| {
        params
            .iter()
            .map(|ty| {
                let v = ctx.graph.add_param(ty.clone());
                ctx.symbolic(v)
            })
            .collect()
    });
    let known: Vec<&Tensor> = known_captures.iter().collect();
    context::values_in_current(&known).expect("the subgraph's context is live");
    let out = f(placeholders);
    let refs: Vec<&Tensor> = out.tensors.iter().collect();
    let outputs = context::values_in_current(&refs).expect("the subgraph's context is live");
    let mut ctx = guard.finish();
    ctx.graph.outputs = outputs;
    for v in &ctx.created_variables {
        context::note_variable_created(v);
    }
    Subtrace {
        graph: ctx.graph,
        captures: ctx.outer_captures.into_iter().map(|(t, _)| t).collect(),
        statics: out.statics,
        structure: out.structure,
    }
}

/// The name of the innermost function being traced, for subgraph names.
fn traced_name() -> Option<Arc<str>> {
    context::current_function()
}

#[track_caller]
fn check_bool_scalar(x: &Tensor, what: &str) {
    if x.dtype() != DType::Bool || x.tensor_type().rank() != 0 {
        let at = std::panic::Location::caller();
        panic!("{what} must be a bool scalar, got {} (at {}:{})", x.tensor_type(), at.file(), at.line());
    }
}

/// [`check_bool_scalar`] for a check made inside a closure, naming the
/// user's loop call.
fn check_bool_scalar_at(x: &Tensor, what: &str, at: &str) {
    if x.dtype() != DType::Bool || x.tensor_type().rank() != 0 {
        panic!("{what} must be a bool scalar, got {} (the loop at {at})", x.tensor_type());
    }
}

fn eager_bool(x: &Tensor) -> bool {
    x.to_vec::<bool>().ok().and_then(|v| v.first().copied()).unwrap_or(false)
}

fn same_statics(a: &[Arc<dyn StaticValue>], b: &[Arc<dyn StaticValue>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.dyn_eq(&**y))
}

/// Adds the node for `op` on `inputs` to the innermost trace, ordered
/// like a variable access when its subgraphs have effects, and records it
/// on the gradient tapes.
#[track_caller]
fn record(op: Op, inputs: &[&Tensor]) -> Vec<Tensor> {
    let effects = op.subgraphs().iter().fold(tracejit_ir::Effects::PURE, |e, g| e.union(g.effects()));
    let control = if effects.is_pure() { Vec::new() } else { context::all_variable_accesses() };
    let vars: Vec<u64> = op.subgraphs().iter().flat_map(|g| g.variables.values().map(|v| v.id())).collect();
    let tape_op = crate::tape::recording().then(|| op.clone());
    let (node, outs) = context::record_in_current(op, inputs, &control).expect("a trace is active");
    if !effects.is_pure() {
        context::note_barrier(node, vars.into_iter());
    }
    if let Some(op) = tape_op {
        crate::tape::record_control(&op, inputs, &outs, std::panic::Location::caller());
    }
    outs
}

/// `then()` if `pred` is true, else `other()`: a conditional that works
/// eagerly and as a graph node.
///
/// `pred` is a bool scalar. Eagerly (or when `pred` is known while
/// tracing) only the taken closure runs; the other is traced into a graph
/// that is thrown away (its tensor ops on eager values compute, its
/// variable writes do not happen, no tape records it), so the rule below
/// holds in every mode. While tracing with a symbolic
/// `pred`, both closures are traced once into the branches of one `cond`
/// node and the taken branch runs at each call, so one trace serves both
/// predicate values. The branches must return the same nest with the same
/// dtypes; a dim may differ only where the result leaves it unknown
/// (`f32[?]` and `f32[3]` give `f32[?]`; `f32[3]` and `f32[4]` are an
/// error naming both).
///
/// ```
/// use tracejit_trace::{cond, function, Tensor};
///
/// let f = function(|x: Tensor| {
///     let positive = x.sum_all().gt(0.0);
///     cond(&positive, || &x * 2.0, || &x - 1.0)
/// });
/// let up = f.call(Tensor::from_vec(vec![1.0f32, 2.0], &[2]))?;
/// let down = f.call(Tensor::from_vec(vec![-1.0f32, -2.0], &[2]))?;
/// assert_eq!(up.to_vec::<f32>()?, vec![2.0, 4.0]);
/// assert_eq!(down.to_vec::<f32>()?, vec![-2.0, -3.0]);
/// assert_eq!(f.tracing_count(), 1);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn cond<R: Nest>(pred: &Tensor, then: impl FnOnce() -> R, other: impl FnOnce() -> R) -> R {
    check_bool_scalar(pred, "cond: the predicate");
    // Mismatches are the user's `cond` call: its line goes in the message.
    let at = std::panic::Location::caller();
    let at = format!("{}:{}", at.file(), at.line());
    if !pred.is_symbolic() {
        return if eager_bool(pred) {
            let out = then();
            check_untaken(&out, other, true, &at);
            out
        } else {
            let out = other();
            check_untaken(&out, then, false, &at);
            out
        };
    }
    let base = traced_name().unwrap_or_else(|| Arc::from("cond"));
    let mut paths = Vec::new();
    let t = trace_subgraph(format!("{base}.then"), &[], &[], |_| {
        let r = then();
        paths = crate::nest::nest_paths(&r, "output");
        flat(&r)
    });
    let e = trace_subgraph(format!("{base}.else"), &[], &t.captures, |_| flat(&other()));
    let then_side = Branch { structure: &t.structure, statics: &t.statics, types: t.graph.output_types() };
    let else_side = Branch { structure: &e.structure, statics: &e.statics, types: e.graph.output_types() };
    check_branches(&then_side, &else_side, &paths, &at);
    // Both branches take every capture: the then branch those the else
    // branch added after its own.
    let mut then_graph = t.graph;
    for c in &e.captures[t.captures.len()..] {
        then_graph.add_param(c.tensor_type());
    }
    let op = Op::Cond { branches: [Arc::new(then_graph), Arc::new(e.graph)] };
    let mut inputs: Vec<&Tensor> = vec![pred];
    inputs.extend(e.captures.iter());
    let outs = record(op, &inputs);
    R::unflatten(&mut Unflattener::new(outs, t.statics, t.structure))
}

/// What a branch of a `cond` returns, for [`check_branches`].
struct Branch<'a> {
    structure: &'a [u32],
    statics: &'a [Arc<dyn StaticValue>],
    types: Vec<TensorType>,
}

/// Panics, naming both sides, unless the branches return the same nest
/// with the same dtypes, and dims that differ only where one is unknown:
/// the one rule of `cond`, traced or eager.
/// `paths` names the outputs (`output.0`, ...; may be empty) and `at` is
/// the user's `cond` call, both for the message.
#[track_caller]
fn check_branches(t: &Branch<'_>, e: &Branch<'_>, paths: &[String], at: &str) {
    if t.structure != e.structure || !same_statics(t.statics, e.statics) {
        panic!(
            "cond: the branches return different structures (then: {} values, else: {}); both must return the \
             same nest (the cond at {at})",
            t.types.len(),
            e.types.len()
        );
    }
    if t.types.len() != e.types.len() {
        panic!(
            "cond: the then branch returns {} tensors, the else branch {} (the cond at {at})",
            t.types.len(),
            e.types.len()
        );
    }
    for (i, (a, b)) in t.types.iter().zip(&e.types).enumerate() {
        let known_differ = a.dims.iter().zip(&b.dims).any(|(x, y)| matches!((x, y), (Some(x), Some(y)) if x != y));
        if join_types(a, b).is_none() || known_differ {
            let path = paths.get(i).map(|p| format!(" (`{p}`)")).unwrap_or_default();
            panic!(
                "cond: output {i}{path}: the then branch returns {a}, the else branch {b}; the branches must return \
                 the same dtypes and shapes (dims may differ only where one is unknown) (the cond at {at})"
            );
        }
    }
}

thread_local! {
    /// Set while `cond` traces a branch it does not take: conds inside it
    /// take their branch without checking theirs (the check then costs at
    /// most one trace of each branch, however deep the nesting).
    static CHECKING_UNTAKEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// With a known predicate (eagerly, or a constant while tracing) only the
/// taken branch runs; the other is traced into a graph that is thrown away,
/// so that the branches must agree as they must when traced, the one rule
/// of every mode: a cond that is an error in a traced function is an error
/// eagerly and under `run_functions_eagerly(true)` too, at the first call
/// rather than the first one that takes the other branch. Tracing runs the
/// branch's Rust code (its tensor ops on eager values compute; variable
/// writes are only recorded, and no tape sees any of it). A branch that
/// cannot be traced here (it reads a value with `to_vec`) is not checked.
#[track_caller]
fn check_untaken<R: Nest>(taken: &R, untaken: impl FnOnce() -> R, taken_is_then: bool, at: &str) {
    let taken_value = taken;
    if CHECKING_UNTAKEN.with(std::cell::Cell::get) {
        return;
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CHECKING_UNTAKEN.with(|c| c.set(false));
        }
    }
    CHECKING_UNTAKEN.with(|c| c.set(true));
    let reset = Reset;
    let base = traced_name().unwrap_or_else(|| Arc::from("cond"));
    let traced = tracejit_ir::catch_quietly(|| {
        crate::tape::without_recording(|| {
            let sub = trace_subgraph(format!("{base}.untaken"), &[], &[], |_| flat(&untaken()));
            (sub.graph.output_types(), sub.statics, sub.structure)
        })
    });
    drop(reset);
    let Ok((types, statics, structure)) = traced else { return };
    let out = flat(taken);
    let taken = Branch {
        structure: &out.structure,
        statics: &out.statics,
        types: out.tensors.iter().map(Tensor::tensor_type).collect(),
    };
    let untaken = Branch { structure: &structure, statics: &statics, types };
    let paths = crate::nest::nest_paths(taken_value, "output");
    if taken_is_then {
        check_branches(&taken, &untaken, &paths, at);
    } else {
        check_branches(&untaken, &taken, &paths, at);
    }
}

/// Runs `body` while `cond` holds, starting from `init`; returns the final
/// state. Works eagerly (a Rust loop) and as one graph node.
///
/// While tracing, `cond` and `body` are traced once into the condition and
/// body of a `while` node, so any trip count runs with one trace (the loop
/// is not unrolled). The state is any nest of tensors (tuples, `Vec`s,
/// `Option`s, `#[derive(Nest)]` structs); every carried tensor keeps its
/// dtype and shape across iterations (a dim the body changes becomes
/// unknown if it was unknown-compatible, otherwise it is an error naming
/// the carried value). Reverse-mode gradients need a static trip count:
/// use [`fori_loop`].
///
/// ```
/// use tracejit_trace::{function, while_loop, Tensor};
///
/// // Doubles x until its sum exceeds 100; counts the steps.
/// let f = function(|x: Tensor| {
///     while_loop(
///         |(_, y): &(Tensor, Tensor)| y.sum_all().le(100.0),
///         |(i, y): (Tensor, Tensor)| (&i + 1, &y * 2.0),
///         (Tensor::scalar(0i64), x),
///     )
/// });
/// let (n, y) = f.call(Tensor::from_vec(vec![1.0f32, 2.0], &[2]))?;
/// assert_eq!(n.to_vec::<i64>()?, vec![6]);
/// assert_eq!(y.to_vec::<f32>()?, vec![64.0, 128.0]);
/// let (n, _) = f.call(Tensor::from_vec(vec![60.0f32, 60.0], &[2]))?;
/// assert_eq!(n.to_vec::<i64>()?, vec![0]);
/// assert_eq!(f.tracing_count(), 1);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn while_loop<S: Nest>(cond: impl Fn(&S) -> Tensor, body: impl Fn(S) -> S, init: S) -> S {
    while_loop_with(cond, body, init, WhileOptions::default())
}

/// How a [`while_loop_with`] may be stopped: TF's `maximum_iterations`, and
/// a [`CancelToken`] checked before every trip.
#[derive(Clone, Debug, Default)]
pub struct WhileOptions {
    maximum_iterations: Option<u64>,
    cancel: Option<CancelToken>,
}

impl WhileOptions {
    /// No limit, no token: what [`while_loop`] uses.
    pub fn new() -> WhileOptions {
        WhileOptions::default()
    }

    /// Runs at most `n` trips: the condition is and-ed with a hidden trip
    /// counter (as TF's `while_loop(maximum_iterations=n)`), so the loop
    /// ends normally with the state after `n` trips. The counter is part of
    /// the graph (it exports to ONNX).
    pub fn maximum_iterations(mut self, n: u64) -> WhileOptions {
        self.maximum_iterations = Some(n);
        self
    }

    /// Checks `token` before every trip: once it is cancelled
    /// ([`CancelToken::cancel`], from any thread) or past its deadline
    /// ([`CancelToken::cancel_after`]), the loop stops with an error — the
    /// `Err` of the call naming the loop's line (eagerly, a panic). The
    /// token is held by the traced graph, so every later call checks it
    /// too; [`CancelToken::reset`] it to run again.
    pub fn cancel(mut self, token: &CancelToken) -> WhileOptions {
        self.cancel = Some(token.clone());
        self
    }
}

/// [`while_loop`] that may be stopped: after `options`'
/// `maximum_iterations` trips (normally, as TF's `while_loop`), or by its
/// [`CancelToken`] (an error). A traced loop whose condition never turns
/// false otherwise hangs its call with no way out.
///
/// ```
/// use std::time::Duration;
/// use tracejit_trace::{function, while_loop_with, CancelToken, Tensor, WhileOptions};
///
/// // Never ends on its own: x only grows.
/// let forever = |x: &Tensor| x.sum_all().gt(0.0);
/// let capped = function(move |x: Tensor| {
///     while_loop_with(forever, |x: Tensor| &x + 1.0, x, WhileOptions::new().maximum_iterations(10))
/// });
/// assert_eq!(capped.call(Tensor::scalar(1.0f32))?.to_vec::<f32>()?, vec![11.0]);
///
/// let token = CancelToken::new();
/// let t = token.clone();
/// let stoppable = function(move |x: Tensor| {
///     while_loop_with(forever, |x: Tensor| &x + 1.0, x, WhileOptions::new().cancel(&t))
/// });
/// token.cancel_after(Duration::from_millis(10));
/// let e = stoppable.call(Tensor::scalar(1.0f32)).unwrap_err();
/// assert!(e.to_string().contains("CancelToken"), "{e}");
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn while_loop_with<S: Nest>(
    cond: impl Fn(&S) -> Tensor,
    body: impl Fn(S) -> S,
    init: S,
    options: WhileOptions,
) -> S {
    if traced_name().is_none() {
        return eager_while(&cond, &body, init, &options);
    }
    let Some(max) = options.maximum_iterations else {
        return traced_while(&cond, &body, init, None, options.cancel);
    };
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let (_, state) = traced_while(
        &|(k, s): &(Tensor, S)| cond(s).logical_and(k.lt(limit)),
        &|(k, s): (Tensor, S)| (&k + 1i64, body(s)),
        (Tensor::scalar(0i64), init),
        None,
        options.cancel,
    );
    state
}

/// A while loop run eagerly: a Rust loop with the options' limit and token.
#[track_caller]
fn eager_while<S: Nest>(cond: &dyn Fn(&S) -> Tensor, body: &dyn Fn(S) -> S, init: S, options: &WhileOptions) -> S {
    let mut state = init;
    let mut trips: u64 = 0;
    loop {
        if options.maximum_iterations.is_some_and(|max| trips >= max) {
            return state;
        }
        if let Some(Err(e)) = options.cancel.as_ref().map(|t| t.check(trips)) {
            panic!("while_loop: {e}");
        }
        let c = cond(&state);
        check_bool_scalar(&c, "while_loop: the condition");
        if !eager_bool(&c) {
            return state;
        }
        state = body(state);
        trips += 1;
    }
}

/// `body(i, state)` for `i` in `lower..upper` (an i64 scalar tensor),
/// starting from `init`: a loop with a static trip count, so reverse-mode
/// gradients flow through it (JAX's `fori_loop`). Eagerly a Rust `for`;
/// traced, one `while` node whose trip count is recorded.
///
/// ```
/// use tracejit_trace::{fori_loop, function, Tensor};
///
/// // x * 2^5, one doubling per iteration.
/// let f = function(|x: Tensor| fori_loop(0, 5, |_i, y: Tensor| &y * 2.0, x));
/// let y = f.call(Tensor::from_vec(vec![1.0f32, 3.0], &[2]))?;
/// assert_eq!(y.to_vec::<f32>()?, vec![32.0, 96.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn fori_loop<S: Nest>(lower: i64, upper: i64, body: impl Fn(Tensor, S) -> S, init: S) -> S {
    if traced_name().is_none() {
        let mut state = init;
        for i in lower..upper {
            state = body(Tensor::scalar(i), state);
        }
        return state;
    }
    let trips = usize::try_from(upper.saturating_sub(lower)).unwrap_or(0);
    let (_, state) = traced_while(
        &|(i, _): &(Tensor, S)| i.lt(upper),
        &|(i, s): (Tensor, S)| (&i + 1i64, body(i, s)),
        (Tensor::scalar(lower), init),
        Some(trips),
        None,
    );
    state
}

/// The `while` node of a loop inside a trace.
#[track_caller]
fn traced_while<S: Nest>(
    cond: &dyn Fn(&S) -> Tensor,
    body: &dyn Fn(S) -> S,
    init: S,
    trip_count: Option<usize>,
    cancel: Option<CancelToken>,
) -> S {
    // Mismatches are the user's loop call: its line goes in the message.
    let at = std::panic::Location::caller();
    let at = format!("{}:{}", at.file(), at.line());
    let base = traced_name().unwrap_or_else(|| Arc::from("while"));
    let paths = crate::nest::nest_paths(&init, "state");
    let init = flat(&init);
    let rebuild =
        |ts: Vec<Tensor>| S::unflatten(&mut Unflattener::new(ts, init.statics.clone(), init.structure.clone()));
    // The carried types: the initial ones, made more general (a dim the
    // body changes becomes unknown) until the body keeps them.
    let mut types: Vec<TensorType> = init.tensors.iter().map(Tensor::tensor_type).collect();
    let traced_body = loop {
        let b = trace_subgraph(format!("{base}.body"), &types, &[], |ps| flat(&body(rebuild(ps))));
        if b.structure != init.structure || !same_statics(&b.statics, &init.statics) {
            panic!(
                "while_loop: the body returns a different structure than the loop state it was given (the loop at \
                 {at})"
            );
        }
        let outs = b.graph.output_types();
        let mut general = Vec::with_capacity(types.len());
        for (i, (p, o)) in types.iter().zip(&outs).enumerate() {
            let known_differ = p.dims.iter().zip(&o.dims).any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b));
            match join_types(p, o) {
                Some(j) if !known_differ => general.push(j),
                Some(_) | None => panic!(
                    "while_loop: carried value {i} (`{}`) enters the loop as {p} but the body returns {o}; \
                     loop-carried values must keep their dtype and shape (the loop at {at})",
                    paths.get(i).map(String::as_str).unwrap_or("?")
                ),
            }
        }
        if general == types {
            break b;
        }
        types = general;
    };
    let c = trace_subgraph(format!("{base}.cond"), &types, &traced_body.captures, |ps| {
        let s = rebuild(ps);
        let c = cond(&s);
        check_bool_scalar_at(&c, "while_loop: the condition", &at);
        Flat { tensors: vec![c], statics: Vec::new(), structure: Vec::new() }
    });
    let mut body_graph = traced_body.graph;
    for x in &c.captures[traced_body.captures.len()..] {
        body_graph.add_param(x.tensor_type());
    }
    let op = Op::While { parts: [Arc::new(c.graph), Arc::new(body_graph)], trip_count, cancel };
    let mut inputs: Vec<&Tensor> = init.tensors.iter().collect();
    inputs.extend(c.captures.iter());
    let outs = record(op, &inputs);
    rebuild(outs)
}
