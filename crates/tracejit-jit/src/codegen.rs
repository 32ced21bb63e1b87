//! The JIT's own passes: every decision the JIT makes about a graph, as a
//! named pass in a list read top to bottom, each followed by a verifier
//! and visible in dumps, like the IR's pipeline (tract's `codegen()`,
//! Cranelift's `Context::optimize`). The executor only runs the schedule
//! they leave (a `Schedule`: see [`crate::Executable::schedule_listing`]).
//!
//! ```text
//! plan_regions     elementwise/reduction regions, by the IR's fusion pass   (graph; raw graphs only)
//! lower            one step per node: regions compiled, products, views,
//!                  subgraphs prepared, native kernels, reference ops        (graph -> schedule)
//! sparse_updates   `w -= lr · scatter_add(0, ids, rows)`: in place, on the named rows only
//! bf16_products    products of bf16(-rounded) operands on the bf16 GEMM, their casts dropped
//! row_loops        loops whose batch rows never meet: run in row blocks
//! hoist_views      views a later product reads move before an earlier one
//! start_early      non-blocking starts (a DDP bucket) move up to their inputs
//! last_uses        each slot freed at its last use
//! in_place         a region writes over an input that dies there
//! drop_unread      inputs and constants no step reads
//! renumber_slots   the slots the schedule uses, numbered densely
//! side_by_side     two independent large products, one per thread
//! epilogues        a mid-sized product with the region consuming it, in row halves
//! ```
//!
//! `plan_regions` runs only for a graph that has not been through the
//! IR's pipeline ([`crate::Executable::new`]); a traced function's graph
//! comes with its regions planned by the pipeline's `fusion` pass (with
//! this JIT's acceptance rule), so the planner runs once per graph either
//! way ([`crate::Executable::from_optimized`]).
//!
//! After every schedule pass the schedule verifier runs in debug builds and
//! tests (an error names the pass); with `TRACEJIT_DUMP=<dir>` each pass's
//! result is written as `<name>.jit.<seq>.<pass>.txt`
//! ([`crate::Executable::schedule_listing`]); [`crate::Executable::codegen_report`] lists what
//! each pass did.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracejit_ir::passes::PassResult;
use tracejit_ir::{Graph, IrError, NodeId};

use crate::schedule::Schedule;
use crate::{JitError, JitOptions};

mod bf16_products;
pub(crate) mod graph_to_schedule;
mod in_place;
mod kept_filters;
mod liveness;
mod products;
mod regions;
mod row_loops;
mod sparse_updates;
mod start_early;

pub use regions::plan_regions;

/// What a schedule pass sees besides the schedule.
pub(crate) struct CodegenContext<'a> {
    /// The graph the schedule runs.
    pub graph: &'a Graph,
    /// The code generation options.
    pub opts: &'a JitOptions,
    /// Products of at least this many multiply-adds may use the pool
    /// ([`crate::threads::gemm_threshold`] when the schedule was made).
    pub gemm_threshold: usize,
}

/// A decision about a schedule.
pub(crate) trait SchedulePass {
    /// The pass's name in dumps, reports and errors.
    fn name(&self) -> &'static str;
    /// Rewrites `s`; says what changed.
    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult;
}

/// The schedule passes, in order (after `lower`).
fn passes() -> Vec<Box<dyn SchedulePass>> {
    vec![
        Box::new(sparse_updates::SparseUpdates),
        Box::new(bf16_products::Bf16Products),
        Box::new(kept_filters::KeptFilters),
        Box::new(row_loops::RowLoops),
        Box::new(products::HoistViews),
        Box::new(start_early::StartEarly),
        Box::new(liveness::LastUses),
        Box::new(in_place::InPlace),
        Box::new(liveness::DropUnread),
        Box::new(liveness::RenumberSlots),
        Box::new(products::SideBySide),
        Box::new(products::Epilogues),
    ]
}

/// The names of every JIT pass, in order: `plan_regions` (raw graphs only),
/// `lower`, then the schedule passes.
pub fn pass_names() -> Vec<&'static str> {
    let mut names = vec!["plan_regions", "lower"];
    names.extend(passes().iter().map(|p| p.name()));
    names
}

/// What one JIT pass did to one graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodegenRecord {
    /// The graph (a subgraph's own name for a branch or loop body).
    pub graph: String,
    /// The pass.
    pub pass: &'static str,
    /// Whether it changed anything.
    pub changed: bool,
    /// What it changed (`2 products side by side`).
    pub summary: String,
    /// Steps after the pass.
    pub steps: usize,
    /// Wall time of the pass (verification and dumps excluded).
    pub time: Duration,
}

/// What the JIT's passes did to a graph and its subgraphs, in the order
/// they ran ([`crate::Executable::codegen_report`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodegenReport {
    /// One record per pass and graph.
    pub passes: Vec<CodegenRecord>,
}

impl fmt::Display for CodegenReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.passes {
            let what = if r.changed { r.summary.as_str() } else { "-" };
            writeln!(
                f,
                "{:<24} {:<16} {:>4} steps  {:>8.1} µs  {what}",
                r.graph,
                r.pass,
                r.steps,
                r.time.as_secs_f64() * 1e6
            )?;
        }
        Ok(())
    }
}

/// Where dumps of the JIT's passes go, and under what name.
#[derive(Clone, Debug)]
pub struct DumpTo {
    /// The directory.
    pub dir: PathBuf,
    /// The file prefix (`<function>.<trace>`); `.jit.<seq>.<pass>.txt`
    /// follows.
    pub prefix: String,
}

impl DumpTo {
    /// `TRACEJIT_DUMP`'s directory, with `prefix`; `None` when unset.
    pub fn from_env(prefix: &str) -> Option<DumpTo> {
        let dir = std::env::var_os("TRACEJIT_DUMP").filter(|v| !v.is_empty())?;
        Some(DumpTo { dir: PathBuf::from(dir), prefix: prefix.to_string() })
    }

    fn write(&self, seq: usize, graph: &str, pass: &str, text: &str) {
        let clean = |s: &str| -> String {
            s.chars().map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' }).collect()
        };
        let stem = format!("{}.jit.{seq:03}.{}.{pass}", clean(&self.prefix), clean(graph));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(self.dir.join(format!("{stem}.txt")), text));
        if let Err(e) = written {
            log::warn!("tracejit: cannot write the JIT dump {}/{stem}.txt: {e}", self.dir.display());
        }
    }
}

/// The state of one codegen run: the report and the dumps, shared by a
/// graph and the subgraphs prepared with it.
#[derive(Default)]
pub(crate) struct Run {
    pub report: CodegenReport,
    pub dump: Option<DumpTo>,
    seq: usize,
}

impl Run {
    /// A run reporting into a fresh report, dumping to `dump`.
    pub fn new(dump: Option<DumpTo>) -> Run {
        Run { report: CodegenReport::default(), dump, seq: 0 }
    }

    /// Notes a pass's result on `graph`, dumps `text` and verifies.
    fn record(&mut self, graph: &Graph, pass: &'static str, result: PassResult, steps: usize, time: Duration) {
        let record = CodegenRecord {
            graph: graph.name.clone(),
            pass,
            changed: result.changed,
            summary: result.summary,
            steps,
            time,
        };
        self.report.passes.push(record);
    }

    /// Notes `lower`'s result on `graph`.
    pub fn record_lower(&mut self, graph: &Graph, steps: usize, time: Duration) {
        self.record(graph, "lower", PassResult::changed(format!("{steps} steps")), steps, time);
    }

    fn dump(&mut self, graph: &Graph, pass: &str, text: impl FnOnce() -> String) {
        if let Some(d) = &self.dump {
            self.seq += 1;
            d.write(self.seq, &graph.name, pass, &text());
        }
    }
}

/// Runs the schedule passes over `s` (made by `lower` from `cx.graph`),
/// verifying after each in debug builds.
pub(crate) fn run_passes(s: &mut Schedule, cx: &CodegenContext<'_>, run: &mut Run) -> Result<(), JitError> {
    run.dump(cx.graph, "lower", || s.listing(cx.graph));
    verify(s, cx.graph, "lower")?;
    for p in passes() {
        let started = Instant::now();
        let result = p.run(s, cx);
        let time = started.elapsed();
        run.dump(cx.graph, p.name(), || s.listing(cx.graph));
        run.record(cx.graph, p.name(), result, s.steps.len(), time);
        verify(s, cx.graph, p.name())?;
    }
    Ok(())
}

/// [`Schedule::verify`] in debug builds (which tests are), as the IR's
/// pipeline verifies between its passes.
fn verify(s: &Schedule, g: &Graph, pass: &str) -> Result<(), JitError> {
    if !cfg!(debug_assertions) {
        return Ok(());
    }
    s.verify().map_err(|message| {
        JitError::Ir(IrError::Verifier {
            graph: g.name.clone(),
            node: NodeId::from_u32(0),
            message: format!("after JIT pass `{pass}`: {message}\n{}", s.listing(g)),
        })
    })
}

#[cfg(test)]
mod tests {
    use tracejit_ir::tensor::{BinaryOp, DType, Storage, UnaryOp};
    use tracejit_ir::{Op, TensorType, ValueId};

    use crate::Executable;

    /// The report lists every pass once for the graph, in `pass_names`
    /// order after `plan_regions`, and the listing shows what they decided.
    #[test]
    fn the_report_follows_the_pass_list_and_the_listing_shows_the_schedule() {
        let mut g = tracejit_ir::Graph::new("dense");
        let x = g.add_param(TensorType::known(DType::F32, &[4, 3]));
        let w = g.add_param(TensorType::known(DType::F32, &[3, 2]));
        let one = g.add_constant(Storage::scalar(1.0f32));
        let op =
            |g: &mut tracejit_ir::Graph, op, ins: &[ValueId]| ValueId::new(g.add_node(op, ins, &[], None).unwrap(), 0);
        let y = op(&mut g, Op::MatMul, &[x, w]);
        let z = op(&mut g, Op::Binary(BinaryOp::Add), &[y, one]);
        let r = op(&mut g, Op::Unary(UnaryOp::Relu), &[z]);
        g.outputs.push(r);
        let exe = Executable::new(&g).unwrap();
        let ran: Vec<&str> = exe.codegen_report().passes.iter().map(|r| r.pass).collect();
        assert_eq!(ran, super::pass_names()[1..], "{}", exe.codegen_report());
        let listing = exe.schedule_listing();
        assert!(listing.contains("matmul s0, s1") && listing.contains("region add,relu"), "{listing}");
        assert!(listing.contains("in place of input 0"), "the bias region writes over the product: {listing}");
    }
}
