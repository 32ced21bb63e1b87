//! Shadow-eager validation (`Function::validate(true)`,
//! `TRACEJIT_VALIDATE=1`): every call also runs the graph as traced in the
//! interpreter and compares each output (and each variable it writes)
//! within the tolerance of `tracejit_ir::tolerance`. A difference is an
//! `Err` naming the first differing node — a fused region, a composite
//! kernel against its body, or whatever a pass rewrote — the pass that
//! produced it, the user's source line and the largest difference, instead
//! of a silently wrong number.
//!
//! The reference run must not act twice on the program's state, so it runs
//! on *shadow* variables: private copies of every variable the graph
//! touches, taken before the real call. After the call, the shadows' final
//! values are compared with the real ones too. (Another thread writing the
//! same variables during a validated call makes the comparison
//! meaningless; validation is a debugging mode.)
//!
//! Bisection, once a difference is found, re-runs the pipeline keeping the
//! graph after every pass, interprets each, and stops at the first whose
//! results differ: within it, the first node whose value the previous graph
//! never computed (a composite kernel is run against its body instead). If
//! every pass keeps the results, the executor is at fault: each fused region
//! is compiled and run on the interpreter's inputs, and each matrix product
//! goes through the JIT's GEMM, until one differs.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tracejit_ir::passes::{PassContext, Pipeline};
use tracejit_ir::tolerance::{self, Budget, Difference};
use tracejit_ir::{interpret, FunctionLibrary, Graph, LibraryFunction, NodeId, Op, ValueId, VariableResource};
use tracejit_tensor::{DType, Storage};

use crate::{Error, Result};

/// The values of a graph's variables before a call, by variable id.
pub(crate) type Snapshot = HashMap<u64, Storage>;

/// Reads every variable `g` (and its callees and subgraphs) can touch.
pub(crate) fn snapshot(g: &Graph) -> Snapshot {
    let mut s = Snapshot::new();
    visit_graphs(g, &mut |g| {
        for (_, v) in g.variables.iter() {
            s.entry(v.id()).or_insert_with(|| v.read());
        }
    });
    s
}

fn visit_graphs(g: &Graph, f: &mut dyn FnMut(&Graph)) {
    f(g);
    for (_, func) in g.library.iter() {
        visit_graphs(&func.graph, f);
    }
    for (_, node) in g.nodes() {
        for sub in node.op.subgraphs() {
            visit_graphs(sub, f);
        }
    }
}

/// A private copy of a variable for the reference run.
#[derive(Debug)]
struct ShadowVariable {
    id: u64,
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    value: RwLock<Storage>,
}

impl VariableResource for ShadowVariable {
    fn name(&self) -> String {
        self.name.clone()
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
    fn id(&self) -> u64 {
        self.id
    }
}

/// `g` with every variable (in callees and subgraphs too) replaced by a
/// shadow holding its value from `snap`; the shadows by id.
fn shadowed(g: &Graph, snap: &Snapshot, table: &mut HashMap<u64, Arc<ShadowVariable>>) -> Graph {
    let mut out = g.clone();
    for (_, v) in out.variables.iter_mut() {
        let shadow = table
            .entry(v.id())
            .or_insert_with(|| {
                Arc::new(ShadowVariable {
                    id: v.id(),
                    name: v.name(),
                    dtype: v.dtype(),
                    shape: v.shape(),
                    value: RwLock::new(snap.get(&v.id()).cloned().unwrap_or_else(|| v.read())),
                })
            })
            .clone();
        *v = shadow;
    }
    let mut library = FunctionLibrary::default();
    for (_, f) in g.library.iter() {
        library.add(LibraryFunction { graph: Arc::new(shadowed(&f.graph, snap, table)), ..f.clone() });
    }
    out.library = library;
    let ids: Vec<NodeId> = out.nodes().map(|(id, _)| id).collect();
    for id in ids {
        for sub in out.node_mut(id).op.subgraphs_mut() {
            *sub = Arc::new(shadowed(sub, snap, table));
        }
    }
    out
}

/// Every node output of `g` run by the interpreter (`[node][output]`).
type Values = Vec<Option<Vec<Storage>>>;

fn interpret_all(g: &Graph, inputs: &[Storage]) -> std::result::Result<Values, tracejit_ir::IrError> {
    let mut all = g.clone();
    all.outputs = g.nodes().flat_map(|(id, n)| (0..n.outputs.len()).map(move |k| ValueId::new(id, k as u32))).collect();
    let mut flat = interpret(&all, inputs)?.into_iter();
    Ok(g.nodes()
        .map(|(_, n)| (!n.outputs.is_empty()).then(|| (0..n.outputs.len()).filter_map(|_| flat.next()).collect()))
        .collect())
}

fn value(values: &Values, v: ValueId) -> Option<&Storage> {
    values.get(v.node.as_u32() as usize)?.as_ref()?.get(v.index as usize)
}

/// What the reference run of one graph gives.
struct Reference {
    graph: Graph,
    values: Values,
    budgets: HashMap<ValueId, Budget>,
    shadows: HashMap<u64, Arc<ShadowVariable>>,
}

fn reference(g: &Graph, snap: &Snapshot, inputs: &[Storage]) -> std::result::Result<Reference, tracejit_ir::IrError> {
    let mut shadows = HashMap::new();
    let graph = shadowed(g, snap, &mut shadows);
    let values = interpret_all(&graph, inputs)?;
    let budgets = tolerance::budgets(&graph, &values);
    Ok(Reference { graph, values, budgets, shadows })
}

/// The first output (or variable) of `got` that differs from `reference`:
/// its description and the difference.
fn first_output_difference(
    reference: &Reference,
    outputs: &[Storage],
    vars: &[(u64, Storage)],
) -> Option<(String, Difference)> {
    for (i, (&v, got)) in reference.graph.outputs.iter().zip(outputs).enumerate() {
        let expected = value(&reference.values, v)?;
        let budget = reference.budgets.get(&v).copied().unwrap_or(Budget::exact(0.0));
        if let Some(d) = tolerance::compare(expected, got, &budget) {
            return Some((format!("output {i}"), d));
        }
    }
    for (id, got) in vars {
        let Some(shadow) = reference.shadows.get(id) else { continue };
        let expected = shadow.read();
        // The budget of the last value assigned to it at the top level, or
        // a kernel's when it is written deeper down.
        let assigned = reference.graph.nodes().filter_map(|(_, n)| match n.op {
            Op::AssignVariable { var, .. } if reference.graph.variables[var].id() == *id => n.inputs.first().copied(),
            _ => None,
        });
        let budget = assigned.last().and_then(|v| reference.budgets.get(&v).copied()).unwrap_or(Budget {
            eps: tolerance::KERNEL_BUDGET,
            scale: tolerance::magnitude(&expected),
            unverifiable: false,
        });
        if let Some(d) = tolerance::compare(&expected, got, &budget) {
            return Some((format!("variable `{}`", shadow.name), d));
        }
    }
    None
}

/// How a validated call reproduces its optimization, for bisection.
pub(crate) struct Replay<'a> {
    pub pipeline: &'a Pipeline,
    pub context: &'a PassContext,
    pub jit: bool,
}

/// Checks a call's results against the graph as traced, run by the
/// interpreter on shadows of the variables as they were before the call.
pub(crate) fn check(
    function: &str,
    traced: &Graph,
    snap: &Snapshot,
    inputs: &[Storage],
    outputs: &[Storage],
    replay: &Replay<'_>,
) -> Result<()> {
    let fail = |message: String| Error::Validation { function: function.to_string(), message };
    let reference = reference(traced, snap, inputs)
        .map_err(|e| fail(format!("the graph as traced fails in the interpreter, the optimized one did not: {e}")))?;
    let vars: Vec<(u64, Storage)> =
        reference.shadows.keys().filter_map(|id| real_value(traced, *id).map(|v| (*id, v))).collect();
    let Some((what, diff)) = first_output_difference(&reference, outputs, &vars) else { return Ok(()) };
    let culprit = bisect(traced, snap, inputs, &reference, replay);
    Err(fail(format!("{what} differs from the graph as traced, run by the interpreter: {diff}. {culprit}")))
}

/// The current value of the real variable `id` used by `traced`.
fn real_value(traced: &Graph, id: u64) -> Option<Storage> {
    let mut found = None;
    visit_graphs(traced, &mut |g| {
        if found.is_none() {
            found = g.variables.iter().find(|(_, v)| v.id() == id).map(|(_, v)| v.read());
        }
    });
    found
}

/// `%4 fused region (exp, add) at src/model.rs:12`.
fn describe(g: &Graph, id: NodeId) -> String {
    let node = g.node(id);
    let what = match &node.op {
        Op::Kernel { name, .. } => format!("composite kernel `{name}`"),
        Op::Fused { body } => {
            let mut names: Vec<&str> = Vec::new();
            for (_, n) in body.nodes() {
                if !n.op.is_source() && !names.contains(&n.op.name()) {
                    names.push(n.op.name());
                }
            }
            format!("fused region ({})", names.join(", "))
        }
        op => format!("`{}`", op.name()),
    };
    match node.location {
        Some(loc) => format!("{} {what} at {}:{}", ValueId::from(id), loc.file(), loc.line()),
        None => format!("{} {what}", ValueId::from(id)),
    }
}

/// Names the first differing node and what produced it.
fn bisect(traced: &Graph, snap: &Snapshot, inputs: &[Storage], base: &Reference, replay: &Replay<'_>) -> String {
    let snaps = match replay.pipeline.run_recording(traced, replay.context) {
        Ok((_, _, snaps)) => snaps,
        Err(e) => return format!("(bisection could not re-run the pipeline: {e})"),
    };
    let mut prev: &Reference = base;
    let mut runs: Vec<Reference> = Vec::new();
    for (pass, g) in &snaps {
        let r = match reference(g, snap, inputs) {
            Ok(r) => r,
            Err(e) => return format!("First difference: the graph after pass `{pass}` fails in the interpreter: {e}"),
        };
        let outs: Vec<Storage> = r.graph.outputs.iter().filter_map(|&v| value(&r.values, v).cloned()).collect();
        let vars: Vec<(u64, Storage)> = r.shadows.iter().map(|(id, s)| (*id, s.read())).collect();
        if outs.len() == base.graph.outputs.len() && first_output_difference(base, &outs, &vars).is_none() {
            runs.push(r);
            prev = runs.last().expect("just pushed");
            continue;
        }
        return match first_new_node(prev, &r, traced, snap) {
            Some(desc) => format!("First difference: {desc}, produced by pass `{pass}`"),
            None => format!("First difference: the graph after pass `{pass}` (no single node could be named)"),
        };
    }
    let last = runs.last().unwrap_or(base);
    if replay.jit {
        if let Some(desc) = first_jit_difference(last) {
            return format!("First difference: {desc}, compiled by the JIT (every pass kept the results)");
        }
    }
    "Every pass keeps the results in the interpreter and no region or matrix product differs on its own; \
     the difference comes from the executor's schedule"
        .to_string()
}

/// The first node of `next` (after a pass) whose value `prev` never
/// computed, or the first composite kernel that differs from its body.
fn first_new_node(prev: &Reference, next: &Reference, traced: &Graph, snap: &Snapshot) -> Option<String> {
    let mut pool: HashMap<(DType, Vec<usize>), Vec<&Storage>> = HashMap::new();
    for s in prev.values.iter().flatten().flatten() {
        pool.entry((s.dtype(), s.shape().to_vec())).or_default().push(s);
    }
    for (id, node) in next.graph.nodes() {
        if matches!(node.op, Op::Parameter { .. }) {
            continue;
        }
        if let Op::Kernel { name, .. } = &node.op {
            let args: Vec<Storage> = node.inputs.iter().filter_map(|&v| value(&next.values, v).cloned()).collect();
            let got = next.values.get(id.as_u32() as usize).cloned().flatten().unwrap_or_default();
            if let Some(d) = kernel_against_body(traced, snap, name, node.location, &args, &got) {
                return Some(format!("{} differs from its body: {d}", describe(&next.graph, id)));
            }
            continue;
        }
        for (k, s) in next.values.get(id.as_u32() as usize).cloned().flatten().unwrap_or_default().iter().enumerate() {
            let budget = next.budgets.get(&ValueId::new(id, k as u32)).copied().unwrap_or(Budget::exact(0.0));
            let seen = pool
                .get(&(s.dtype(), s.shape().to_vec()))
                .is_some_and(|cands| cands.iter().any(|c| tolerance::compare(c, s, &budget).is_none()));
            if !seen {
                return Some(describe(&next.graph, id));
            }
        }
    }
    None
}

/// Runs the body of the composite `name` (the function the trace called,
/// preferably at `location`) on `args` and compares it with the kernel's
/// outputs `got`.
fn kernel_against_body(
    traced: &Graph,
    snap: &Snapshot,
    name: &str,
    location: Option<&'static std::panic::Location<'static>>,
    args: &[Storage],
    got: &[Storage],
) -> Option<Difference> {
    let mut bodies: Vec<(Option<&'static std::panic::Location<'static>>, Arc<Graph>)> = Vec::new();
    visit_graphs(traced, &mut |g| {
        for (_, n) in g.nodes() {
            if let Op::Call { func } = n.op {
                let f = g.library.get(func);
                if f.implements() == Some(name) {
                    bodies.push((n.location, f.graph.clone()));
                }
            }
        }
    });
    let body = bodies.iter().find(|(l, _)| *l == location).or(bodies.first()).map(|(_, b)| b.clone())?;
    let r = reference(&body, snap, args).ok()?;
    body.outputs.iter().zip(got).find_map(|(&v, g)| {
        let budget = r.budgets.get(&v).copied().unwrap_or(Budget::exact(0.0));
        let budget = Budget { eps: budget.eps + tolerance::KERNEL_BUDGET, ..budget };
        tolerance::compare(value(&r.values, v)?, g, &budget)
    })
}

/// The first fused region or matrix product of `r.graph` whose JIT result
/// differs from the interpreter's on the same inputs.
fn first_jit_difference(r: &Reference) -> Option<String> {
    for (id, node) in r.graph.nodes() {
        let args: Vec<Storage> = node.inputs.iter().filter_map(|&v| value(&r.values, v).cloned()).collect();
        let refs: Vec<&Storage> = args.iter().collect();
        let expected = r.values.get(id.as_u32() as usize).cloned().flatten().unwrap_or_default();
        let got: Vec<Storage> = match &node.op {
            Op::Fused { body } if tracejit_jit::supports(body) => match tracejit_jit::compile_region(body) {
                Ok(region) => match region.try_run(&refs) {
                    Ok(outs) => outs.into_iter().collect(),
                    Err(e) => return Some(format!("{} fails when compiled: {e}", describe(&r.graph, id))),
                },
                Err(e) => return Some(format!("{} does not compile: {e}", describe(&r.graph, id))),
            },
            Op::MatMul if refs.len() == 2 => vec![tracejit_jit::matmul(refs[0], refs[1])],
            _ => continue,
        };
        for (k, (e, g)) in expected.iter().zip(&got).enumerate() {
            let budget = r.budgets.get(&ValueId::new(id, k as u32)).copied().unwrap_or(Budget::exact(0.0));
            if let Some(d) = tolerance::compare(e, g, &budget) {
                return Some(format!("{}: {d}", describe(&r.graph, id)));
            }
        }
    }
    None
}

thread_local! {
    /// How many validated traces are in progress on this thread.
    static ACTIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as tracing a validated Function while it lives.
pub(crate) struct Active;

impl Active {
    pub(crate) fn enter() -> Active {
        ACTIVE.with(|a| a.set(a.get() + 1));
        Active
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(a.get() - 1));
    }
}

/// True while a validated Function is traced on this thread, or when
/// `TRACEJIT_VALIDATE=1`: gradient tapes then check registered backward
/// kernels against their body's VJP.
pub(crate) fn active() -> bool {
    ACTIVE.with(|a| a.get()) > 0 || crate::config::validation_from_env()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracejit_ir::passes::{Cse, Fusion, Pass, PassResult, Stage};
    use tracejit_tensor::BinaryOp;

    /// A deliberately wrong pass: every `mul` becomes an `add`.
    struct MulToAdd;

    impl Pass for MulToAdd {
        fn name(&self) -> &'static str {
            "mul_to_add"
        }
        fn run(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
            let muls: Vec<NodeId> =
                g.nodes().filter(|(_, n)| matches!(n.op, Op::Binary(BinaryOp::Mul))).map(|(id, _)| id).collect();
            for &id in &muls {
                g.node_mut(id).op = Op::Binary(BinaryOp::Add);
            }
            PassResult::count(muls.len(), "muls turned into adds")
        }
    }

    fn graph() -> Graph {
        let text = "graph g(%0: f32[4]) -> (%3) {\n  %1 = exp %0 : f32[4]\n  %2 = mul %1, %1 : f32[4]\n  \
                    %3 = sub %2, %0 : f32[4]\n}\n";
        Graph::parse(text).unwrap()
    }

    fn inputs() -> Vec<Storage> {
        vec![Storage::from_vec(vec![0.5f32, -1.0, 2.0, 0.0], &[4]).unwrap()]
    }

    #[test]
    fn bisection_names_the_pass_and_the_node_it_broke() {
        let traced = graph();
        let pipeline = Pipeline::new(vec![Stage::pass(Cse), Stage::pass(MulToAdd)]);
        let context = PassContext::new("g");
        let (optimized, _) = pipeline.run(&traced, &context).unwrap();
        let outputs = interpret(&optimized, &inputs()).unwrap();
        let replay = Replay { pipeline: &pipeline, context: &context, jit: false };
        let e = check("g", &traced, &Snapshot::new(), &inputs(), &outputs, &replay).unwrap_err().to_string();
        assert!(e.starts_with("function `g`: validation: output 0 differs"), "{e}");
        assert!(e.contains("First difference: %2 `add`, produced by pass `mul_to_add`"), "{e}");
        // The correct results pass.
        let right = interpret(&traced, &inputs()).unwrap();
        check("g", &traced, &Snapshot::new(), &inputs(), &right, &replay).unwrap();
    }

    #[test]
    fn compiled_regions_agree_with_the_interpreter_on_a_correct_graph() {
        let mut g = graph();
        let cx = PassContext::new("g").with_region_acceptor(Arc::new(tracejit_jit::supports));
        assert!(Fusion::default().run(&mut g, &cx).changed);
        let r = reference(&g, &Snapshot::new(), &inputs()).unwrap();
        assert!(g.nodes().any(|(_, n)| matches!(n.op, Op::Fused { .. })));
        assert_eq!(first_jit_difference(&r), None);
    }
}
