//! The executor: a graph prepared once into a flat schedule of steps, run
//! many times.
//!
//! The executor only runs a schedule: every decision about the graph —
//! which regions form, which products pair, which loops run in row
//! blocks, which buffers are reused — is a pass of [`crate::codegen`],
//! verified and dumped. Regions are planned once, by the IR's fusion pass
//! with [`crate::supports`] as its acceptance rule: the pipeline's for a
//! traced function ([`Executable::from_optimized`]), else the
//! `plan_regions` pass for a plain graph ([`Executable::new`]).
//!
//! Steps, in arena (topological) order:
//! - **matrix products** through [`crate::matmul`] (a fast GEMM), written
//!   into a pooled buffer;
//! - **calls** run the callee's own `Executable`, prepared up front;
//! - **`cond` and `while`** run their subgraphs as `Executable`s prepared
//!   (and compiled) once with the graph, never per iteration;
//! - **variable reads and writes** with the interpreter's semantics, those
//!   of locked updates holding the variables' update locks
//!   ([`tracejit_ir::locks`]);
//! - **`Op::Fused`** regions compile into one kernel each with
//!   [`crate::compile_region`] (an unsupported body is interpreted and
//!   listed as a fallback), and
//!   **`Op::Kernel`** nodes run their registered native code;
//! - **everything else** through `tracejit_ir::eval_primitive`, listed by
//!   [`Executable::fallbacks`].
//!
//! With more than one thread, two independent large products close
//! together run side by side (`pairs`), and a loop whose batch rows never
//! meet runs as one loop per block of rows, each on its own thread
//! (`batch`).
//!
//! Values live in a slot table and are dropped right after their last use;
//! an elementwise region may write its output over an input that dies at
//! its step, when nothing else holds that input's buffer (see
//! `CompiledRegion::may_write_in_place`).
//! Inputs are checked like `tracejit_ir::interpret` checks them; nodes whose
//! static types have unknown dimensions are re-checked against their
//! concrete operands (an [`IrError::Op`] instead of a kernel panic).

use std::sync::{Arc, Mutex};

use cranelift_entity::EntityRef;
use smallvec::SmallVec;
use tracejit_ir::tensor::{kernels, BinaryOp, DType, Storage};
use tracejit_ir::{eval_primitive, infer, AssignKind, Graph, IrError, NodeId, Op, TensorType, VarId};

use crate::codegen::graph_to_schedule::Callees;
use crate::codegen::{CodegenContext, CodegenReport, DumpTo, Run};
use crate::region::BufPool;
use crate::schedule::{Fast, Pair, Schedule, Step, StepKind};
use crate::{JitError, JitOptions};

mod copies;
mod epilogue;
mod memory;
mod pairs;
mod profile;
pub(crate) mod row_blocks;
mod scalars;
pub(crate) mod sparse_update;
mod stats;
pub(crate) mod views;
mod windows;
pub use profile::{Profile, StepTime};
pub use stats::ScheduleStats;

/// A graph prepared for fast execution: a flat schedule of steps.
pub struct Executable {
    graph: Arc<Graph>,
    schedule: Schedule,
    param_types: Vec<TensorType>,
    /// What the JIT's passes did (this graph's and its subgraphs').
    report: CodegenReport,
    /// What it was built for and runs with: the vector code its products
    /// and kernels may run, its threads and thresholds (entered on every
    /// call, see [`tracejit_kernels::Target`]).
    target: tracejit_kernels::Target,
    /// Freed intermediates and earlier results, reused for region outputs
    /// (see [`BufPool`]).
    pool: Mutex<BufPool>,
    /// Which freed buffers the pool keeps, planned from a recorded call
    /// ([`crate::pool`]).
    planner: Mutex<crate::pool::Planner>,
    /// Nanoseconds per step, summed while [`Executable::profile`] runs
    /// (empty otherwise).
    clock: Mutex<Vec<u64>>,
    /// When a run takes and releases variables' update locks (`None`: no
    /// step updates a variable under its lock).
    locks: Option<tracejit_ir::locks::LockPlan>,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("graph", &self.graph.name)
            .field("steps", &self.schedule.steps.len())
            .finish()
    }
}

/// Runs a control-flow node's subgraphs with the calling executable's
/// buffer pool: one pool for the whole call, so a loop's iterations reuse
/// the buffers of the state they replace instead of allocating.
struct Shared<'a> {
    subs: &'a [Executable; 2],
    pool: &'a mut BufPool,
}

impl tracejit_ir::control::SubgraphRunner for Shared<'_> {
    type Error = IrError;

    fn run(&mut self, k: usize, inputs: &[Storage]) -> Result<Vec<Storage>, IrError> {
        self.subs[k].run_in_pool(inputs, self.pool)
    }

    fn recycle(&mut self, value: Storage) {
        self.pool.give_if_unique(value);
    }
}

impl Executable {
    /// Prepares `graph`, a plain graph (may contain any op; its regions are
    /// planned here by the `plan_regions` pass), with the current
    /// options. Library functions called by the graph are prepared too.
    pub fn new(graph: &Graph) -> Result<Executable, JitError> {
        Executable::with_options(graph, &JitOptions::current())
    }

    /// [`Executable::new`] with explicit code generation options.
    pub fn with_options(graph: &Graph, opts: &JitOptions) -> Result<Executable, JitError> {
        // A malformed graph is an error here, not a panic in a pass or a
        // wrong schedule.
        tracejit_ir::verify(graph)?;
        let planned = crate::codegen::plan_regions(graph);
        let mut run = Run::new(DumpTo::from_env(&graph.name));
        let mut exe = Executable::build(Arc::new(planned), opts, &mut Callees::new(), &mut run)?;
        exe.report = run.report;
        Ok(exe)
    }

    /// Prepares a graph whose regions the IR's pipeline has planned with
    /// this JIT's acceptance rule (a traced function's optimized graph):
    /// the JIT's passes from `lower` on, dumped to `dump` when given.
    pub fn from_optimized(graph: &Graph, opts: &JitOptions, dump: Option<DumpTo>) -> Result<Executable, JitError> {
        tracejit_ir::verify(graph)?;
        let mut run = Run::new(dump);
        let mut exe = Executable::build(Arc::new(graph.clone()), opts, &mut Callees::new(), &mut run)?;
        exe.report = run.report;
        Ok(exe)
    }

    /// `lower` and the schedule passes over `graph` (its regions planned),
    /// reporting and dumping into `run`.
    pub(crate) fn build(
        graph: Arc<Graph>,
        opts: &JitOptions,
        callees: &mut Callees,
        run: &mut Run,
    ) -> Result<Executable, JitError> {
        crate::malloc::tune_once();
        let started = std::time::Instant::now();
        let mut schedule = crate::codegen::graph_to_schedule::lower(&graph, opts, callees, run)?;
        run.record_lower(&graph, schedule.steps.len(), started.elapsed());
        // The schedule's products are paired or split by the target's threshold.
        let cx = CodegenContext { graph: &graph, opts, gemm_threshold: opts.target.resolved_gemm_threshold() };
        crate::codegen::run_passes(&mut schedule, &cx, run)?;
        let param_types = graph.param_types();
        let locks = tracejit_ir::locks::LockPlan::new(schedule.steps.iter().map(|s| &graph.node(s.node).op), &graph);
        Ok(Executable {
            locks,
            graph,
            schedule,
            param_types,
            report: CodegenReport::default(),
            target: opts.target,
            pool: Mutex::new(BufPool::default()),
            planner: Mutex::default(),
            clock: Mutex::default(),
        })
    }

    /// What the JIT's passes did to this graph and its subgraphs
    /// ([`crate::codegen`]).
    pub fn codegen_report(&self) -> &CodegenReport {
        &self.report
    }

    /// The schedule this executable runs, as text: one step a line, with
    /// its slots, what frees them, in-place writes and pairs (what the
    /// codegen dumps hold).
    pub fn schedule_listing(&self) -> String {
        self.schedule.listing(&self.graph)
    }

    /// How many region calls so far ran in the interpreter because their
    /// concrete shapes fit no loop nest of the compiled kernel
    /// ([`CompiledRegion::interpreted_runs`]), in this executable and the
    /// ones its steps run (loop parts, branches, callees).
    pub fn interpreted_region_runs(&self) -> u64 {
        self.schedule
            .steps
            .iter()
            .map(|s| {
                let own = match &s.kind {
                    StepKind::Region(r) => r.interpreted_runs(),
                    _ => 0,
                };
                own + s.kind.subgraphs().iter().map(|(_, e)| e.interpreted_region_runs()).sum::<u64>()
            })
            .sum()
    }

    /// The graph this executable runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Names of the ops that fell back to the reference kernels, for stats().
    pub fn fallbacks(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for s in &self.schedule.steps {
            match &s.kind {
                StepKind::Primitive(op, _) => v.push(op.name().to_string()),
                StepKind::Call(e) => v.extend(e.fallbacks()),
                StepKind::Cond(subs) | StepKind::While(subs, ..) => subs.iter().for_each(|e| v.extend(e.fallbacks())),
                _ => {}
            }
        }
        v
    }

    /// The compile cache entries ([`crate::compile_cache`]) of every
    /// generated kernel this executable and the executables it calls run,
    /// each once: what an artifact embeds so that loading it compiles
    /// nothing ([`crate::compile_cache::preload_entry`]).
    pub fn kernel_entries(&self) -> Vec<Arc<[u8]>> {
        let mut out: Vec<Arc<[u8]>> = Vec::new();
        self.collect_entries(&mut out);
        out
    }

    fn collect_entries(&self, out: &mut Vec<Arc<[u8]>>) {
        for s in &self.schedule.steps {
            match &s.kind {
                StepKind::Region(r) => {
                    if let Some(e) = r.kernel_entry() {
                        if !out.iter().any(|o| Arc::ptr_eq(o, e) || o[..] == e[..]) {
                            out.push(e.clone());
                        }
                    }
                }
                StepKind::Call(e) => e.collect_entries(out),
                StepKind::Cond(subs) | StepKind::While(subs, ..) => subs.iter().for_each(|e| e.collect_entries(out)),
                _ => {}
            }
        }
    }

    /// Number of fused regions in the schedule (for stats and tests).
    pub fn num_regions(&self) -> usize {
        self.schedule.steps.iter().filter(|s| matches!(s.kind, StepKind::Region(_))).count()
    }

    /// Runs on one value per graph param (checked like
    /// `tracejit_ir::interpret` does), returns the outputs.
    pub fn run(&self, inputs: &[Storage]) -> Result<Vec<Storage>, IrError> {
        // Its kernels, products and pool read the target it was built for.
        self.target.enter(|| self.run_entered(inputs))
    }

    /// What it was built for and runs with.
    pub fn target(&self) -> tracejit_kernels::Target {
        self.target
    }

    fn run_entered(&self, inputs: &[Storage]) -> Result<Vec<Storage>, IrError> {
        self.check_inputs(inputs)?;
        let mut pool = BufPool::checkout(&self.pool);
        crate::pool::Planner::start(&self.planner, &mut pool);
        // The slot table is kept with the pool: a train step's is a few KiB.
        let mut values = std::mem::take(&mut pool.table);
        values.resize(self.schedule.n_slots, None);
        let result = self.run_steps(inputs, &mut values, &mut pool, true);
        if let Ok(outs) = &result {
            // Kept so the buffers can be reused once the caller drops them.
            for v in outs {
                pool.give(v.clone());
            }
        }
        crate::pool::Planner::finish(&self.planner, &mut pool, result.is_ok());
        values.clear();
        pool.table = values;
        pool.checkin(&self.pool);
        result
    }

    /// [`Executable::run`] with the caller's pool (nested subgraphs): the
    /// outputs stay with the caller, which recycles them.
    fn run_in_pool(&self, inputs: &[Storage], pool: &mut BufPool) -> Result<Vec<Storage>, IrError> {
        self.check_inputs(inputs)?;
        // Loop bodies run once per trip: a slot table on the stack for
        // bodies of up to 16 values (W8's fits) costs no allocation.
        let mut values: SmallVec<[Option<Storage>; 16]> = SmallVec::new();
        values.resize(self.schedule.n_slots, None);
        self.run_steps(inputs, &mut values, pool, false)
    }

    fn check_inputs(&self, inputs: &[Storage]) -> Result<(), IrError> {
        let bad = |message: String| IrError::BadInput { graph: self.graph.name.clone(), message };
        if inputs.len() != self.param_types.len() {
            return Err(bad(format!("expected {} inputs, got {}", self.param_types.len(), inputs.len())));
        }
        for (i, (ty, x)) in self.param_types.iter().zip(inputs).enumerate() {
            if !ty.accepts(x.dtype(), x.shape()) {
                return Err(bad(format!("input {i}: expected {ty}, got {}", TensorType::known(x.dtype(), x.shape()))));
            }
        }
        Ok(())
    }

    /// Drops the values whose last use is `step`, their buffers to the pool.
    fn free_slots(&self, step: &Step, values: &mut [Option<Storage>], pool: &mut BufPool) {
        for &f in &step.frees {
            if let Some(v) = values[f].take() {
                pool.give_if_unique(v);
            }
        }
    }

    /// Re-checks a step's types on its concrete operands, and probes the
    /// allocator for its outputs, when the step asks for it: for those
    /// `pool` cannot serve, that is (a free buffer of that size there is
    /// one the allocator already gave; probing it again counted a second
    /// 205 MB in W13's steady peak).
    fn check_step(&self, step: &Step, args: &[&Storage], pool: &BufPool) -> Result<(), IrError> {
        let g = &*self.graph;
        if step.check || step.probe {
            let op = match &step.kind {
                StepKind::Primitive(op, _) | StepKind::External(op) => Some(op),
                StepKind::MatMul
                | StepKind::MatMulBf16(_)
                | StepKind::Region(_)
                | StepKind::View(_)
                | StepKind::Spatial(..) => Some(&g.node(step.node).op),
                _ => None,
            };
            if let Some(op) = op {
                // A bf16 product's node multiplies the operands widened to f32.
                let widened = matches!(step.kind, StepKind::MatMulBf16(_));
                let types: SmallVec<[TensorType; 2]> = args
                    .iter()
                    .map(|x| TensorType::known(if widened { DType::F32 } else { x.dtype() }, x.shape()))
                    .collect();
                // A region's body types its outputs; its concrete sizes
                // are checked where it plans a launch.
                let location = g.node(step.node).location;
                let outs = if step.check && !matches!(step.kind, StepKind::Region(_)) {
                    infer(op, &types, Some(g)).map_err(|e| e.at(location))?
                } else {
                    g.node(step.node).outputs.clone()
                };
                if step.probe {
                    let served = |t: &TensorType| t.shape().is_some_and(|s| pool.has_free(t.dtype, s.iter().product()));
                    let outs: SmallVec<[TensorType; 2]> = outs.into_iter().filter(|t| !served(t)).collect();
                    tracejit_ir::check_outputs_allocatable(op, &types, &outs).map_err(|e| e.at(location))?;
                }
            }
        }
        Ok(())
    }

    /// Runs the schedule; `top`: this is the call's own graph, not a
    /// subgraph run in its caller's pool (whose live bytes a recorded call
    /// notes after each step).
    fn run_steps(
        &self,
        inputs: &[Storage],
        values: &mut [Option<Storage>],
        pool: &mut BufPool,
        top: bool,
    ) -> Result<Vec<Storage>, IrError> {
        let note = top && pool.recording();
        let g = &*self.graph;
        let mut clock: Option<Vec<u64>> = profile::profiling().then(|| vec![0; self.schedule.steps.len()]);
        // Filled in place by each step and drained into the slots: moving a
        // two-value SmallVec (216 bytes) out of the match and into its
        // iterator was a `memcpy` call each, a sixth of a scalar loop trip.
        let mut outs: SmallVec<[Storage; 2]> = SmallVec::new();
        // Released as their last locked steps pass, the rest on return.
        let mut held = self.locks.as_ref().map(tracejit_ir::locks::LockPlan::start);
        for (i, step) in self.schedule.steps.iter().enumerate() {
            // A non-blocking collective started earlier advances between steps.
            tracejit_ir::progress::poll();
            if let Some(held) = held.as_mut() {
                held.before(i);
            }
            let started = clock.is_some().then(std::time::Instant::now);
            let done = matches!(step.pair, Pair::Second | Pair::After);
            if done && values[step.outputs[0]].is_some() {
                // Computed with its partner: only its last uses remain.
                self.free_slots(step, values, pool);
                continue;
            }
            // Taken before the operands are borrowed: the address to write
            // in place while the dying input is still unique.
            let alias = match step.in_place {
                Some(p) => values[step.inputs[p]].as_mut().and_then(crate::region::unique_mut_ptr).map(|ptr| (p, ptr)),
                None => None,
            };
            let mut args: SmallVec<[&Storage; 3]> = SmallVec::new();
            for &x in &step.inputs {
                args.push(self.slot(step, values, x)?);
            }
            self.check_step(step, &args, pool)?;
            // A kernel that panics on its values names this step's line.
            tracejit_ir::note_running(g.node(step.node).location);
            let mut partner_out: SmallVec<[(usize, Storage); 2]> = SmallVec::new();
            outs.clear();
            match &step.kind {
                StepKind::Param(i) => outs.push(inputs[*i].clone()),
                StepKind::Constant(c) => outs.push(c.clone()),
                StepKind::Region(r) => {
                    outs.extend(r.try_run_pooled(&args, pool, alias).map_err(|e| e.at(g.node(step.node).location))?)
                }
                StepKind::MatMul => outs.push(self.run_product(step, &args, values, pool, &mut partner_out)?),
                StepKind::MatMulBf16(_) => outs.push(self.run_product(step, &args, values, pool, &mut partner_out)?),
                StepKind::View(view) => match view.apply(&args) {
                    Some(v) => outs.push(v),
                    // Out of range: the reference kernel reports it.
                    None => outs.extend(eval_primitive(&g.node(step.node).op, &args)),
                },
                StepKind::External(op) => outs.extend(tracejit_ir::eval_kernel(op, &args, self.target.isa)),
                StepKind::Spatial(op, kept) => {
                    outs.extend(crate::spatial::run_kept(op, &args, self.target.isa, pool, kept.as_deref(), alias))
                }
                StepKind::Primitive(op, fast) => {
                    // The fast path lowering chose, when its run-time guard
                    // holds (sizes, layouts, the buffer still unique).
                    let quick = match (fast, op, alias) {
                        (Fast::Scalar, Op::Binary(b), _) => scalars::binary(*b, &args, pool),
                        (Fast::UpdateInPlace, Op::DynamicUpdateSlice, Some((0, ptr))) => {
                            windows::update_in_place(&args, ptr)
                        }
                        (Fast::Copy, Op::Reshape { shape }, _) => copies::reshape(args[0], shape, pool),
                        (Fast::Copy, Op::Concat { axis }, _) => copies::concat(&args, *axis, pool),
                        _ => None,
                    };
                    match quick {
                        Some(x) => outs.push(x),
                        None => outs.extend(eval_primitive(op, &args)),
                    }
                }
                StepKind::Call(e) => {
                    let owned: Vec<Storage> = args.iter().map(|x| (*x).clone()).collect();
                    outs.extend(e.run(&owned)?)
                }
                StepKind::Cond(subs) => {
                    let owned: Vec<Storage> = args.iter().map(|x| (*x).clone()).collect();
                    outs.extend(tracejit_ir::control::run_cond(&owned, &mut Shared { subs, pool })?)
                }
                StepKind::While(subs, carried, split) => {
                    let owned: Vec<Storage> = args.iter().map(|x| (*x).clone()).collect();
                    let cancel = match &g.node(step.node).op {
                        Op::While { cancel, .. } => cancel.as_ref(),
                        _ => None,
                    };
                    let mut run = || match split.as_ref().and_then(|s| s.run(*carried, &owned, cancel)) {
                        Some(out) => Ok(out),
                        None => {
                            let mut shared = Shared { subs, pool };
                            let out = tracejit_ir::control::run_while(*carried, &owned, &mut shared, cancel);
                            out.map_err(|e| e.at(g.node(step.node).location))
                        }
                    };
                    // A loop that may run in blocks of rows runs its
                    // products as its blocks do, whole or not (the blocks'
                    // few rows would take the dot-product path).
                    let out = if split.is_some() { tracejit_kernels::gemm::without_dot_products(run) } else { run() };
                    outs.extend(out?)
                }
                StepKind::Read(var) => {
                    let v =
                        g.variables.get(*var).ok_or_else(|| self.broken(step, format!("unknown variable {var}")))?;
                    outs.push(v.read())
                }
                StepKind::Assign(var, kind) => self.run_assign(step, *var, *kind, args[0], pool)?,
                StepKind::SparseUpdate(u) => {
                    u.run(g, &args).ok_or_else(|| self.broken(step, format!("unknown variable {}", u.var)))?
                }
            }
            drop(args);
            if !partner_out.is_empty() {
                for (slot, v) in partner_out.drain(..) {
                    values[slot] = Some(v);
                }
            }
            if outs.len() != step.outputs.len() {
                let message = format!("produced {} values for {} outputs", outs.len(), step.outputs.len());
                return Err(self.broken(step, message));
            }
            for (&s, x) in step.outputs.iter().zip(outs.drain(..)) {
                values[s] = Some(x);
            }
            self.free_slots(step, values, pool);
            if note {
                pool.note_live(live_bytes(values));
            }
            if let (Some(clock), Some(started)) = (clock.as_mut(), started) {
                clock[i] += started.elapsed().as_nanos() as u64;
            }
        }
        if let Some(clock) = clock {
            profile::record(self, &clock);
        }
        self.take_outputs(values)
    }

    /// A product step, with its partner when it has one (the later
    /// product of a side-by-side pair, or the region it runs with in row
    /// halves), whose outputs go to `partner_out`.
    #[inline]
    fn run_product(
        &self,
        step: &Step,
        args: &[&Storage],
        values: &[Option<Storage>],
        pool: &mut BufPool,
        partner_out: &mut SmallVec<[(usize, Storage); 2]>,
    ) -> Result<Storage, IrError> {
        let paired = match step.pair {
            Pair::First(j) => {
                let other = &self.schedule.steps[j];
                let b: SmallVec<[&Storage; 2]> =
                    other.inputs.iter().map(|&x| self.slot(step, values, x)).collect::<Result<_, _>>()?;
                self.check_step(other, &b, pool)?;
                let gemms = [gemm_of(step), gemm_of(other)];
                pairs::run_pair(self.target.isa, gemms, [args[0], b[0]], [args[1], b[1]], pool).map(|[x, y]| {
                    partner_out.push((other.outputs[0], y));
                    x
                })
            }
            Pair::Then(j) => epilogue::run(self, step, j, args, values, pool)?.map(|(x, made)| {
                *partner_out = made;
                x
            }),
            Pair::None | Pair::Second | Pair::After => None,
        };
        Ok(paired.unwrap_or_else(|| match gemm_of(step) {
            pairs::Gemm::Plain => {
                crate::gemm::matmul_with(self.target.isa, args[0], args[1], &mut |d, s| pool.take(d, s))
            }
            pairs::Gemm::Bf16(p) => p.run(self.target.isa, args[0], args[1], pool),
        }))
    }

    /// A variable write. `update` holds the variable's lock across read and
    /// write, so concurrent `assign_add`s lose no increment; an `assign`
    /// hands the replaced value's buffer to the pool (an update region
    /// writes the next step's value into it).
    fn run_assign(
        &self,
        step: &Step,
        var: VarId,
        kind: AssignKind,
        value: &Storage,
        pool: &mut BufPool,
    ) -> Result<(), IrError> {
        let g = &*self.graph;
        let v = g.variables.get(var).ok_or_else(|| self.broken(step, format!("unknown variable {var}")))?;
        let types = [TensorType::known(value.dtype(), value.shape())];
        infer(&Op::AssignVariable { var, kind, locked: false }, &types, Some(g))?;
        match kind {
            AssignKind::Assign => pool.give_if_unique(v.replace(value.clone())),
            AssignKind::Add => v.update(&mut |cur| kernels::binary(BinaryOp::Add, cur, value)),
            AssignKind::Sub => v.update(&mut |cur| kernels::binary(BinaryOp::Sub, cur, value)),
        }
        Ok(())
    }

    /// The value in slot `x`, read by `step`.
    #[inline]
    fn slot<'v>(&self, step: &Step, values: &'v [Option<Storage>], x: usize) -> Result<&'v Storage, IrError> {
        values[x].as_ref().ok_or_else(|| self.broken(step, format!("slot {x} is not available")))
    }

    /// A broken schedule at `step` (a bug in tracejit).
    fn broken(&self, step: &Step, message: String) -> IrError {
        IrError::Verifier { graph: self.graph.name.clone(), node: step.node, message }
    }

    /// The graph's outputs from their slots: moved out on an output's last
    /// listing, cloned before.
    fn take_outputs(&self, values: &mut [Option<Storage>]) -> Result<Vec<Storage>, IrError> {
        let outputs = &self.schedule.outputs;
        outputs
            .iter()
            .enumerate()
            .map(|(k, &o)| {
                let v = if outputs[k + 1..].contains(&o) { values[o].clone() } else { values[o].take() };
                v.ok_or_else(|| IrError::Verifier {
                    graph: self.graph.name.clone(),
                    node: NodeId::new(0),
                    message: format!("graph output slot {o} was not produced"),
                })
            })
            .collect()
    }
}

/// Bytes the buffers in `values` hold, each buffer once.
fn live_bytes(values: &[Option<Storage>]) -> usize {
    let mut seen = std::collections::HashSet::with_capacity(values.len());
    let mut bytes = 0;
    for v in values.iter().flatten() {
        let ptr = tracejit_ir::tensor::with_array!(v, a => a.as_ptr() as usize);
        if seen.insert(ptr) {
            bytes += tracejit_ir::tensor::byte_size(v.dtype(), v.shape()).unwrap_or(0);
        }
    }
    bytes
}

/// The GEMM a product step runs on (a `matmul` step's is the plain one).
fn gemm_of(step: &Step) -> pairs::Gemm<'_> {
    if let StepKind::MatMulBf16(p) = &step.kind {
        pairs::Gemm::Bf16(p)
    } else {
        pairs::Gemm::Plain
    }
}
