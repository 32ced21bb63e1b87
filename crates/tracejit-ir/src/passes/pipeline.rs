//! The pass manager: a [`Pipeline`] is an ordered list of [`Stage`]s (a pass,
//! or a group of passes iterated to a fixpoint under an iteration cap), run
//! over a copy of a graph with verification, timing, a report and dumps.
//!
//! The default pipeline, top to bottom:
//!
//! ```text
//! inline                        every non-composite call
//! selector                      composite calls -> kernel, or inlined
//! hoist                         a counted loop's input projection, before the loop
//! fixpoint "simplify" (cap 8):  const_fold, simplify, cse, conv_relu, sparse_update, dce
//! auto_mixed_precision          products in bf16 with f32 accumulation (when asked)
//! channels_last                 inference convolutions keep [N, H, W, C] (when asked)
//! conv_epilogue                 their batch norms, residual adds and relus into their stores
//! fusion                        elementwise/reduction regions
//! ```
//!
//! After every pass the verifier runs when [`OptimizationOptions::verify`]
//! says so (by default in debug builds, which includes tests); a failure is
//! an [`IrError::Verifier`] whose message starts with `after pass `name``.
//! A panic inside a pass becomes the same kind of error. With
//! `TRACEJIT_DUMP=<dir>` (or [`OptimizationOptions::dump_dir`]) the graph
//! before and after every pass is written as text and DOT, named
//! `<function>.<seq>.<pass>.before.txt` / `.after.dot` with a sequence
//! number that makes the files sort in the order they were written.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cranelift_entity::EntityRef;

use crate::passes::{
    AcceptRegion, AutoMixedPrecision, ChannelsLast, ConstantFolding, ConvRelu, Cse, Dce, FuseConvEpilogue, Fusion,
    HoistLoopProducts, Inline, Pass, PassContext, SelectImplementation, Simplify, SparseUpdate, DEFAULT_FOLD_LIMIT,
};
use crate::{verify, Graph, IrError, NodeId};

/// One step of a pipeline.
pub enum Stage {
    /// A pass run once.
    Pass(Box<dyn Pass>),
    /// Passes run in order, again and again, until a round changes nothing
    /// or `max_iterations` rounds have run.
    Fixpoint {
        /// The group's name (reports).
        name: &'static str,
        /// The passes of one round.
        passes: Vec<Box<dyn Pass>>,
        /// At most this many rounds.
        max_iterations: usize,
    },
}

impl Stage {
    /// A single pass.
    pub fn pass(p: impl Pass + 'static) -> Stage {
        Stage::Pass(Box::new(p))
    }

    /// The names of the stage's passes.
    fn pass_names(&self) -> Vec<&'static str> {
        self.passes().map(|p| p.name()).collect()
    }

    /// The stage's passes, in order.
    fn passes(&self) -> Box<dyn Iterator<Item = &dyn Pass> + '_> {
        match self {
            Stage::Pass(p) => Box::new(std::iter::once(p.as_ref())),
            Stage::Fixpoint { passes, .. } => Box::new(passes.iter().map(|p| p.as_ref())),
        }
    }
}

/// User-facing optimization switches (`Function::with_optimizations`).
#[derive(Clone)]
pub struct OptimizationOptions {
    /// Run the pipeline at all (`false`: the traced graph runs as is).
    pub enabled: bool,
    /// Run the implementation selector (`false`: composites are inlined).
    pub selector: bool,
    /// Names of passes not to run (`"cse"`, `"fusion"`).
    pub disabled: BTreeSet<String>,
    /// Verify after every pass; `None`: in debug builds only.
    pub verify: Option<bool>,
    /// Overrides the iteration cap of fixpoint stages.
    pub max_iterations: Option<usize>,
    /// Where to dump graphs; `None`: the `TRACEJIT_DUMP` environment
    /// variable, if set.
    pub dump_dir: Option<PathBuf>,
    /// Largest constant (in elements) constant folding may create.
    pub fold_limit: usize,
    /// Which fused regions may be formed; `None`: the context's rule.
    pub accept_region: Option<AcceptRegion>,
}

impl Default for OptimizationOptions {
    fn default() -> Self {
        OptimizationOptions {
            enabled: true,
            selector: true,
            disabled: BTreeSet::new(),
            verify: None,
            max_iterations: None,
            dump_dir: None,
            fold_limit: DEFAULT_FOLD_LIMIT,
            accept_region: None,
        }
    }
}

impl fmt::Debug for OptimizationOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OptimizationOptions")
            .field("enabled", &self.enabled)
            .field("selector", &self.selector)
            .field("disabled", &self.disabled)
            .field("verify", &self.verify)
            .field("max_iterations", &self.max_iterations)
            .field("dump_dir", &self.dump_dir)
            .field("fold_limit", &self.fold_limit)
            .field("accept_region", &self.accept_region.is_some())
            .finish()
    }
}

impl OptimizationOptions {
    /// No pass runs.
    pub fn none() -> OptimizationOptions {
        OptimizationOptions { enabled: false, ..OptimizationOptions::default() }
    }

    /// Also skips pass `name`.
    pub fn disable(mut self, name: impl Into<String>) -> OptimizationOptions {
        self.disabled.insert(name.into());
        self
    }

    /// True when pass `name` runs under these options.
    pub fn runs(&self, name: &str) -> bool {
        self.enabled && !self.disabled.contains(name) && (name != SelectImplementation.name() || self.selector)
    }

    /// True when `pass` runs under these options.
    pub fn runs_pass(&self, pass: &dyn Pass) -> bool {
        self.enabled && !self.disabled.contains(pass.name()) && (!pass.selects_implementations() || self.selector)
    }
}

/// What one pass did in one run of a pipeline.
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The pass's name.
    pub pass: &'static str,
    /// The fixpoint round (from 1), or 0 for a pass outside a fixpoint.
    pub round: usize,
    /// Nodes (top level) before the pass.
    pub nodes_before: usize,
    /// Nodes (top level) after the pass.
    pub nodes_after: usize,
    /// Whether the pass changed the graph.
    pub changed: bool,
    /// The pass's note on what changed.
    pub summary: String,
    /// Wall time of the pass (verification and dumps excluded).
    pub time: Duration,
}

/// How a fixpoint stage ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixpointOutcome {
    /// The stage's name.
    pub name: &'static str,
    /// Rounds run.
    pub rounds: usize,
    /// True when the last round changed nothing; false when the cap stopped it.
    pub converged: bool,
}

/// The report of one pipeline run (`ConcreteFunction::stats`).
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    /// The function optimized.
    pub function: String,
    /// False when optimizations were off (the graph ran as traced).
    pub enabled: bool,
    /// Every pass run, in order.
    pub passes: Vec<PassRecord>,
    /// How each fixpoint stage ended.
    pub fixpoints: Vec<FixpointOutcome>,
    /// Nodes before the first pass.
    pub nodes_before: usize,
    /// Nodes after the last pass.
    pub nodes_after: usize,
    /// Wall time of the whole run, verification and dumps included.
    pub total: Duration,
}

impl PipelineReport {
    /// The records of pass `name`, in order.
    pub fn pass(&self, name: &str) -> impl Iterator<Item = &PassRecord> {
        let name = name.to_string();
        self.passes.iter().filter(move |r| r.pass == name)
    }

    /// True when pass `name` ran and changed the graph at least once.
    pub fn changed_by(&self, name: &str) -> bool {
        self.pass(name).any(|r| r.changed)
    }
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.enabled {
            return writeln!(f, "`{}`: optimizations off ({} nodes)", self.function, self.nodes_before);
        }
        writeln!(
            f,
            "`{}`: {} -> {} nodes in {:.3} ms",
            self.function,
            self.nodes_before,
            self.nodes_after,
            self.total.as_secs_f64() * 1e3
        )?;
        writeln!(f, "  {:<12} {:>5} {:>13} {:>10}  change", "pass", "round", "nodes", "ms")?;
        for r in &self.passes {
            let round = if r.round == 0 { String::new() } else { r.round.to_string() };
            let nodes = format!("{} -> {}", r.nodes_before, r.nodes_after);
            let change = if r.changed { r.summary.as_str() } else { "-" };
            writeln!(f, "  {:<12} {:>5} {:>13} {:>10.3}  {change}", r.pass, round, nodes, r.time.as_secs_f64() * 1e3)?;
        }
        for fp in &self.fixpoints {
            let how = if fp.converged { "converged" } else { "stopped at the iteration cap" };
            writeln!(f, "  fixpoint `{}`: {how} after {} round(s)", fp.name, fp.rounds)?;
        }
        Ok(())
    }
}

/// An ordered list of stages plus the options they run under.
pub struct Pipeline {
    stages: Vec<Stage>,
    options: OptimizationOptions,
}

impl Pipeline {
    /// A pipeline of these stages with default options.
    pub fn new(stages: Vec<Stage>) -> Pipeline {
        Pipeline { stages, options: OptimizationOptions::default() }
    }

    /// The default pipeline (see the module docs).
    pub fn default_pipeline() -> Pipeline {
        Pipeline::new(vec![
            Stage::pass(Inline),
            Stage::pass(SelectImplementation),
            Stage::pass(HoistLoopProducts),
            Stage::Fixpoint {
                name: "simplify",
                passes: vec![
                    Box::new(ConstantFolding),
                    Box::new(Simplify),
                    Box::new(Cse),
                    Box::new(ConvRelu),
                    Box::new(SparseUpdate),
                    Box::new(Dce),
                ],
                max_iterations: 8,
            },
            Stage::pass(AutoMixedPrecision),
            Stage::pass(ChannelsLast),
            Stage::pass(FuseConvEpilogue),
            Stage::pass(Fusion::default()),
        ])
    }

    /// Runs under `options`.
    pub fn with_options(mut self, options: OptimizationOptions) -> Pipeline {
        self.options = options;
        self
    }

    /// The options.
    pub fn options(&self) -> &OptimizationOptions {
        &self.options
    }

    /// The stages.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The names of every pass, in pipeline order (duplicates removed).
    pub fn pass_names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        for n in self.stages.iter().flat_map(|s| s.pass_names()) {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        names
    }

    /// Checks that every disabled pass name names a pass of the pipeline.
    pub fn validate(&self) -> Result<(), String> {
        let names = self.pass_names();
        for d in &self.options.disabled {
            if !names.contains(&d.as_str()) {
                return Err(format!("unknown pass `{d}`; the passes are {}", names.join(", ")));
            }
        }
        Ok(())
    }

    /// Optimizes a copy of `graph` and returns it with the report.
    pub fn run(&self, graph: &Graph, cx: &PassContext) -> Result<(Graph, PipelineReport), IrError> {
        self.run_with(graph, cx, None)
    }

    /// [`Pipeline::run`], also returning the graph after every pass that
    /// changed it, named `pass` or `pass (round n)`: what shadow validation
    /// bisects to find the pass that made a result differ.
    pub fn run_recording(
        &self,
        graph: &Graph,
        cx: &PassContext,
    ) -> Result<(Graph, PipelineReport, Vec<PassSnapshot>), IrError> {
        let mut snapshots = Vec::new();
        let (g, report) = self.run_with(graph, cx, Some(&mut snapshots))?;
        Ok((g, report, snapshots))
    }

    fn run_with(
        &self,
        graph: &Graph,
        cx: &PassContext,
        snapshots: Option<&mut Vec<PassSnapshot>>,
    ) -> Result<(Graph, PipelineReport), IrError> {
        let started = Instant::now();
        let mut g = graph.clone();
        let mut report = PipelineReport {
            function: cx.function.clone(),
            enabled: self.options.enabled,
            nodes_before: g.len(),
            ..PipelineReport::default()
        };
        if !self.options.enabled {
            report.nodes_after = g.len();
            report.total = started.elapsed();
            return Ok((g, report));
        }
        let mut cx = cx.clone();
        cx.fold_limit = self.options.fold_limit;
        if let Some(accept) = &self.options.accept_region {
            cx.accept_region = accept.clone();
        }
        let mut run = Run {
            verify: self.options.verify.unwrap_or(cfg!(debug_assertions)),
            dump: self.dump_dir().map(|dir| Dump::new(dir, cx.dump_prefix.as_deref().unwrap_or(&cx.function))),
            report: &mut report,
            snapshots,
        };
        let selector_stage = self
            .stages
            .iter()
            .position(|s| s.passes().any(|p| p.selects_implementations() && self.options.runs_pass(p)));
        for (i, stage) in self.stages.iter().enumerate() {
            cx.keep_composites = selector_stage.is_some_and(|s| s > i);
            match stage {
                Stage::Pass(p) => {
                    if self.options.runs_pass(p.as_ref()) {
                        run.pass(p.as_ref(), 0, &mut g, &cx)?;
                    }
                }
                Stage::Fixpoint { name, passes, max_iterations } => {
                    let cap = self.options.max_iterations.unwrap_or(*max_iterations).max(1);
                    let mut outcome = FixpointOutcome { name, rounds: 0, converged: false };
                    while outcome.rounds < cap {
                        outcome.rounds += 1;
                        let mut changed = false;
                        for p in passes.iter().filter(|p| self.options.runs_pass(p.as_ref())) {
                            changed |= run.pass(p.as_ref(), outcome.rounds, &mut g, &cx)?;
                        }
                        if !changed {
                            outcome.converged = true;
                            break;
                        }
                    }
                    run.report.fixpoints.push(outcome);
                }
            }
        }
        report.nodes_after = g.len();
        report.total = started.elapsed();
        Ok((g, report))
    }

    /// Where dumps go: [`OptimizationOptions::dump_dir`], else the
    /// `TRACEJIT_DUMP` environment variable; `None` when neither is set.
    pub fn dump_dir(&self) -> Option<PathBuf> {
        self.options
            .dump_dir
            .clone()
            .or_else(|| std::env::var_os("TRACEJIT_DUMP").filter(|v| !v.is_empty()).map(PathBuf::from))
    }
}

/// The graph after one pass of [`Pipeline::run_recording`], labelled
/// `pass` or `pass (round n)`.
pub type PassSnapshot = (String, Graph);

/// The state of one pipeline run.
struct Run<'r> {
    verify: bool,
    dump: Option<Dump>,
    report: &'r mut PipelineReport,
    snapshots: Option<&'r mut Vec<PassSnapshot>>,
}

impl Run<'_> {
    /// Runs one pass (dumps, timing, verification); returns whether it
    /// changed the graph.
    fn pass(&mut self, p: &dyn Pass, round: usize, g: &mut Graph, cx: &PassContext) -> Result<bool, IrError> {
        let name = p.name();
        if let Some(d) = &mut self.dump {
            d.write(g, name, "before");
        }
        let nodes_before = g.len();
        let started = Instant::now();
        let result = crate::catch_quietly(|| p.run(g, cx)).map_err(|panic| IrError::Verifier {
            graph: g.name.clone(),
            node: NodeId::new(0),
            message: format!("pass `{name}` panicked: {}", crate::panic_message(&*panic)),
        })?;
        let time = started.elapsed();
        if let Some(d) = &mut self.dump {
            d.write(g, name, "after");
        }
        if self.verify {
            verify(g).map_err(|e| match e {
                IrError::Verifier { graph, node, message } => {
                    IrError::Verifier { graph, node, message: format!("after pass `{name}`: {message}") }
                }
                other => other,
            })?;
        }
        if let (Some(snaps), true) = (&mut self.snapshots, result.changed) {
            let label = if round == 0 { name.to_string() } else { format!("{name} (round {round})") };
            snaps.push((label, g.clone()));
        }
        self.report.passes.push(PassRecord {
            pass: name,
            round,
            nodes_before,
            nodes_after: g.len(),
            changed: result.changed,
            summary: result.summary,
            time,
        });
        Ok(result.changed)
    }
}

/// Writes graph dumps into a directory.
struct Dump {
    dir: PathBuf,
    prefix: String,
    seq: usize,
}

impl Dump {
    fn new(dir: PathBuf, name: &str) -> Dump {
        let prefix: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' { c } else { '_' })
            .collect();
        Dump { dir, prefix, seq: 0 }
    }

    fn write(&mut self, g: &Graph, pass: &str, when: &str) {
        self.seq += 1;
        let stem = format!("{}.{:03}.{pass}.{when}", self.prefix, self.seq);
        if let Err(e) = write_pair(&self.dir, &stem, g) {
            log::warn!("tracejit: cannot write the graph dump {}/{stem}.*: {e}", self.dir.display());
        }
    }
}

fn write_pair(dir: &Path, stem: &str, g: &Graph) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(format!("{stem}.txt")), g.to_string())?;
    std::fs::write(dir.join(format!("{stem}.dot")), g.to_dot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pipeline_reads_top_to_bottom() {
        let p = Pipeline::default_pipeline();
        assert_eq!(
            p.pass_names(),
            [
                "inline",
                "selector",
                "hoist",
                "const_fold",
                "simplify",
                "cse",
                "conv_relu",
                "sparse_update",
                "dce",
                "auto_mixed_precision",
                "channels_last",
                "conv_epilogue",
                "fusion"
            ]
        );
        assert!(p.validate().is_ok());
        let bad = Pipeline::default_pipeline().with_options(OptimizationOptions::default().disable("csee"));
        assert!(bad.validate().unwrap_err().contains("unknown pass `csee`"));
    }

    #[test]
    fn options_say_which_passes_run() {
        let o = OptimizationOptions { selector: false, ..OptimizationOptions::default() }.disable("cse");
        assert!(o.runs("inline") && !o.runs("cse") && !o.runs("selector"));
        assert!(!OptimizationOptions::none().runs("inline"));
    }
}
