//! Where a compiled call spends its time, step by step
//! ([`Executable::profile`]): the diagnostic for "which kernel is slow",
//! without an external profiler and with the graph's own names.

use std::fmt;
use std::time::Duration;

use tracejit_ir::{IrError, NodeId, Op};
use tracejit_tensor::Storage;

use super::{Executable, Step, StepKind};

/// The time of one step of an [`Executable`], summed over the profiled
/// runs.
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// Position in the schedule (0 = first step that runs).
    pub index: usize,
    /// What kind of step: `"region"`, `"gemm"`, `"native"`, `"reference"`,
    /// `"view"`, `"call"`, `"cond"`, `"while"`, `"read"`, `"assign"`,
    /// `"param"` or `"constant"`.
    pub kind: &'static str,
    /// The node it runs (a region's last member), for the graph listing.
    pub node: NodeId,
    /// The ops it runs (a region's members in order, `matmul`, ...) and its
    /// first output's type, e.g. `sub,mul -> f32[784, 512]`.
    pub what: String,
    /// Total time over all runs.
    pub total: Duration,
}

/// Per-step times of a compiled graph over some runs
/// ([`Executable::profile`]). `Display` prints the steps that took time,
/// slowest first, with their share of the total.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The graph's name.
    pub graph: String,
    /// How many runs the times add up.
    pub runs: usize,
    /// Every step of the schedule, in schedule order (a `while`'s or a
    /// call's subgraph is timed as its one step).
    pub steps: Vec<StepTime>,
}

impl Profile {
    /// The steps' total time per run.
    pub fn per_run(&self) -> Duration {
        self.steps.iter().map(|s| s.total).sum::<Duration>() / self.runs.max(1) as u32
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = self.runs.max(1) as f64;
        let total: f64 = self.steps.iter().map(|s| s.total.as_secs_f64()).sum();
        writeln!(f, "profile of {} over {} runs: {:.1} µs per run", self.graph, self.runs, total / runs * 1e6)?;
        let mut order: Vec<&StepTime> = self.steps.iter().filter(|s| s.total > Duration::ZERO).collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.total));
        for s in order {
            let t = s.total.as_secs_f64();
            let share = if total > 0.0 { t / total * 100.0 } else { 0.0 };
            writeln!(f, "{:>9.1} µs {share:>5.1}%  #{:<3} {:<9} {}", t / runs * 1e6, s.index, s.kind, s.what)?;
        }
        Ok(())
    }
}

/// The kind name of a step, for [`StepTime::kind`].
fn kind_name(kind: &StepKind) -> &'static str {
    match kind {
        StepKind::Param(_) => "param",
        StepKind::Constant(_) => "constant",
        StepKind::Region(_) => "region",
        StepKind::MatMul => "gemm",
        StepKind::View(_) => "view",
        StepKind::Primitive(_) => "reference",
        StepKind::External(_) => "native",
        StepKind::Call(_) => "call",
        StepKind::Cond(_) => "cond",
        StepKind::While(..) => "while",
        StepKind::Read(_) => "read",
        StepKind::Assign(..) => "assign",
    }
}

impl Executable {
    /// Runs the graph `runs` times on `inputs` (like [`Executable::run`],
    /// outputs dropped) and returns how long each step took in total: the
    /// place to look when a compiled function is slower than expected.
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
        let mut clock = vec![0u64; self.steps.len()];
        for _ in 0..runs {
            drop(self.run_timed(inputs, Some(&mut clock))?);
        }
        let g = &*self.graph;
        let steps = self
            .steps
            .iter()
            .zip(&clock)
            .enumerate()
            .map(|(index, (step, &nanos))| StepTime {
                index,
                kind: kind_name(&step.kind),
                node: step.node,
                what: describe(self, step),
                total: Duration::from_nanos(nanos),
            })
            .collect();
        Ok(Profile { graph: g.name.clone(), runs, steps })
    }
}

/// The ops a step runs and its first output's type.
fn describe(exe: &Executable, step: &Step) -> String {
    let node = exe.graph.node(step.node);
    let ops = match &node.op {
        Op::Fused { body } => body.nodes().filter_map(|(_, n)| op_label(&n.op)).collect::<Vec<_>>().join(","),
        op => op.name().to_string(),
    };
    match node.outputs.first() {
        Some(t) => format!("{ops} -> {t}"),
        None => ops,
    }
}

/// An op's name, or `None` for a region body's parameters and constants.
fn op_label(op: &Op) -> Option<&'static str> {
    (!matches!(op, Op::Parameter { .. } | Op::Constant { .. })).then(|| op.name())
}
