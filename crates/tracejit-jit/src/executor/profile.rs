//! Where a compiled call spends its time, step by step
//! ([`Executable::profile`]): the diagnostic for "which kernel is slow",
//! without an external profiler and with the graph's own names.

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use tracejit_ir::{IrError, NodeId, Op};
use tracejit_tensor::Storage;

use super::Executable;
use crate::schedule::{Pair, Step, StepKind};

/// The time of one step of an [`Executable`], summed over the profiled
/// runs.
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// Position in its schedule (0 = first step that runs).
    pub index: usize,
    /// Where the step is: its index at the top level (`"8"`), or inside a
    /// control-flow node's or call's subgraph, the parent's path, the
    /// subgraph (`body`, `cond`, `then`, `else`, `call`) and the index
    /// (`"7.body.3"`).
    pub path: String,
    /// How deep it is: 0 for the top level, 1 inside a `while` body, ...
    /// A nested step's time is part of its parent's.
    pub depth: usize,
    /// What kind of step: `"region"`, `"gemm"`, `"gemm_bf16"`, `"native"`,
    /// `"reference"`, `"view"`, `"call"`, `"cond"`, `"while"`, `"read"`,
    /// `"assign"`, `"sparse_update"`, `"param"` or `"constant"`.
    pub kind: &'static str,
    /// The node it runs (a region's last member) in its graph.
    pub node: NodeId,
    /// The ops it runs (a region's members in order, `matmul`, ...) and its
    /// first output's type, e.g. `sub,mul -> f32[784, 512]`, and for a
    /// region that may write its output over an input dying at this step
    /// (when that input's buffer is unique at run time), which input:
    /// `mul,sub -> f32[784, 512] (in place of input 1)`.
    pub what: String,
    /// Total time over all runs (a loop body's steps: over every trip).
    pub total: Duration,
}

/// Per-step times of a compiled graph over some runs
/// ([`Executable::profile`]). `Display` prints the steps that took time,
/// slowest first, with their share of the call (nested steps of loops,
/// branches and calls too, under their paths).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The graph's name.
    pub graph: String,
    /// How many runs the times add up.
    pub runs: usize,
    /// Every step of the schedule, in schedule order, each control-flow
    /// node's or call's steps right after it.
    pub steps: Vec<StepTime>,
}

impl Profile {
    /// The time of one run: the top-level steps' total over the runs.
    pub fn per_run(&self) -> Duration {
        self.top_level_total() / self.runs.max(1) as u32
    }

    fn top_level_total(&self) -> Duration {
        self.steps.iter().filter(|s| s.depth == 0).map(|s| s.total).sum()
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = self.runs.max(1) as f64;
        let total = self.top_level_total().as_secs_f64();
        writeln!(f, "profile of {} over {} runs: {:.1} µs per run", self.graph, self.runs, total / runs * 1e6)?;
        let mut order: Vec<&StepTime> = self.steps.iter().filter(|s| s.total > Duration::ZERO).collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.total));
        for s in order {
            let t = s.total.as_secs_f64();
            let share = if total > 0.0 { t / total * 100.0 } else { 0.0 };
            let path = format!("#{}", s.path);
            writeln!(f, "{:>9.1} µs {share:>5.1}%  {path:<10} {:<9} {}", t / runs * 1e6, s.kind, s.what)?;
        }
        Ok(())
    }
}

thread_local! {
    /// Whether executables run on this thread record their step times.
    static PROFILING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running [`Executable::profile`].
pub(super) fn profiling() -> bool {
    PROFILING.with(Cell::get)
}

/// Adds one run's step times to `exe`'s clock.
pub(super) fn record(exe: &Executable, nanos: &[u64]) {
    let mut clock = exe.clock.lock().unwrap_or_else(|e| e.into_inner());
    clock.resize(nanos.len(), 0);
    clock.iter_mut().zip(nanos).for_each(|(c, n)| *c += n);
}

/// Turns profiling off again when dropped (also on a panic).
struct Profiling;

impl Drop for Profiling {
    fn drop(&mut self) {
        PROFILING.with(|p| p.set(false));
    }
}

/// Clears `exe`'s clocks and its subgraphs'.
fn reset(exe: &Executable) {
    exe.clock.lock().unwrap_or_else(|e| e.into_inner()).clear();
    for step in &exe.schedule.steps {
        step.kind.subgraphs().into_iter().for_each(|(_, sub)| reset(sub));
    }
}

/// Appends `exe`'s step times (and its subgraphs') to `out`.
fn collect(exe: &Executable, prefix: &str, depth: usize, out: &mut Vec<StepTime>) {
    let clock = exe.clock.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (index, step) in exe.schedule.steps.iter().enumerate() {
        let path = format!("{prefix}{index}");
        out.push(StepTime {
            index,
            path: path.clone(),
            depth,
            kind: step.kind.name(),
            node: step.node,
            what: describe(exe, step),
            total: Duration::from_nanos(clock.get(index).copied().unwrap_or(0)),
        });
        for (name, sub) in step.kind.subgraphs() {
            collect(sub, &format!("{path}.{name}."), depth + 1, out);
        }
    }
}

impl Executable {
    /// Runs the graph `runs` times on `inputs` (like [`Executable::run`],
    /// outputs dropped) and returns how long each step took in total —
    /// loop bodies', branches' and called functions' steps too: the place
    /// to look when a compiled function is slower than expected. Calls of
    /// this executable from other threads meanwhile are not counted;
    /// profiling it from two threads at once mixes their times.
    ///
    /// ```
    /// use tracejit_ir::tensor::{BinaryOp, DType, Storage, UnaryOp};
    /// use tracejit_ir::{Graph, Op, TensorType, ValueId};
    /// use tracejit_jit::Executable;
    ///
    /// let mut g = Graph::new("dense");
    /// let x = g.add_param(TensorType::known(DType::F32, &[64, 32]));
    /// let w = g.add_param(TensorType::known(DType::F32, &[32, 16]));
    /// let mut op = |g: &mut Graph, op, ins: &[ValueId]| ValueId::new(g.add_node(op, ins, &[], None).unwrap(), 0);
    /// let y = op(&mut g, Op::MatMul, &[x, w]);
    /// let r = op(&mut g, Op::Unary(UnaryOp::Relu), &[y]);
    /// g.outputs.push(r);
    /// let exe = Executable::new(&g)?;
    /// let inputs = [Storage::F32(ndarray::ArcArray::zeros(vec![64, 32])), Storage::F32(ndarray::ArcArray::zeros(vec![32, 16]))];
    /// let profile = exe.profile(&inputs, 10)?;
    /// assert_eq!(profile.runs, 10);
    /// assert!(profile.steps.iter().any(|s| s.kind == "gemm" && s.what.starts_with("matmul -> f32[64, 16]")));
    /// println!("{profile}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn profile(&self, inputs: &[Storage], runs: usize) -> Result<Profile, IrError> {
        reset(self);
        {
            PROFILING.with(|p| p.set(true));
            let _off = Profiling;
            for _ in 0..runs {
                drop(self.run(inputs)?);
            }
        }
        let mut steps = Vec::new();
        collect(self, "", 0, &mut steps);
        reset(self);
        Ok(Profile { graph: self.graph.name.clone(), runs, steps })
    }
}

/// The ops a step runs and its first output's type.
fn describe(exe: &Executable, step: &Step) -> String {
    let node = exe.graph.node(step.node);
    let ops = match &node.op {
        Op::Fused { body } => body.nodes().filter_map(|(_, n)| op_label(&n.op)).collect::<Vec<_>>().join(","),
        // Which composite: `kernel tracejit.nn.dropout`.
        Op::Kernel { name, .. } => format!("kernel {name}"),
        // Which spatial kernel: `kernel conv2d+bias+relu (direct)`.
        Op::Spatial(sp) => {
            let kept = match &step.kind {
                StepKind::Spatial(_, kept) => kept.as_deref(),
                _ => None,
            };
            format!("kernel {}", crate::spatial::step_name(sp, kept))
        }
        op => op.name().to_string(),
    };
    // A region that may write over a dying input (when it is unique at
    // run time) says which.
    let mut in_place = step.in_place.map(|p| format!(" (in place of input {p})")).unwrap_or_default();
    match step.pair {
        Pair::First(j) => in_place.push_str(&format!(" (with #{j} alongside)")),
        Pair::Second => in_place.push_str(" (alongside an earlier product)"),
        Pair::Then(j) => in_place.push_str(&format!(" (with #{j} in row halves)")),
        Pair::After => in_place.push_str(" (with the product before it)"),
        Pair::None => {}
    }
    if let StepKind::While(_, _, Some(_)) = &step.kind {
        // Its trips run in the blocks' own schedules, not listed here.
        in_place.push_str(" (row blocks, one per thread)");
    }
    match node.outputs.first() {
        Some(t) => format!("{ops} -> {t}{in_place}"),
        None => ops,
    }
}

/// An op's name, or `None` for a region body's parameters and constants.
fn op_label(op: &Op) -> Option<&'static str> {
    (!op.is_source()).then(|| op.name())
}
