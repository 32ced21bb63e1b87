//! The executor: a graph prepared once into a flat schedule of steps, run
//! many times.
//!
//! Regions are planned once, by the IR's fusion pass with [`crate::supports`]
//! as its acceptance rule: the pipeline's when the graph comes optimized
//! (its listing shows what runs), else the same pass run here on the plain
//! graph. The executor never re-plans a region.
//!
//! Steps, in arena (topological) order:
//! - **matrix products** through [`crate::matmul`] (a fast GEMM), written
//!   into a pooled buffer;
//! - **calls** run the callee's own `Executable`, prepared up front;
//! - **`cond` and `while`** run their subgraphs as `Executable`s prepared
//!   (and compiled) once with the graph, never per iteration;
//! - **variable reads and writes** with the interpreter's semantics;
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cranelift_entity::EntityRef;
use smallvec::SmallVec;
use tracejit_ir::passes::{Fusion, Pass, PassContext};
use tracejit_ir::tensor::{kernels, BinaryOp, Storage};
use tracejit_ir::{
    eval_primitive, infer, AssignKind, FuncId, Graph, IrError, Node, NodeId, Op, TensorType, ValueId, VarId,
};

use crate::region::{BufPool, CompiledRegion};
use crate::{compile_region_with, supports, JitError, JitOptions};

mod batch;
mod epilogue;
mod pairs;
mod profile;
mod scalars;
mod stats;
mod views;
pub use profile::{Profile, StepTime};
pub use stats::ScheduleStats;
use views::View;

/// What one step does.
enum StepKind {
    /// Graph input `n`.
    Param(usize),
    /// A constant (cloned, O(1)).
    Constant(Storage),
    /// A fused region.
    Region(Arc<CompiledRegion>),
    /// A matrix product.
    MatMul,
    /// A view of its input (no copy): a transpose, or a gather of one
    /// index.
    View(View),
    /// A reference kernel (or an unsupported fused region, interpreted).
    Primitive(Op),
    /// A registered native kernel (`Op::Kernel`).
    External(Op),
    /// A call of a library function.
    Call(Arc<Executable>),
    /// A conditional: the then and else branches, prepared once.
    Cond(Box<[Executable; 2]>),
    /// A loop: the condition and the body, prepared once, and how many
    /// of the inputs are carried.
    While(Box<[Executable; 2]>, usize, Option<Box<batch::Split>>),
    /// Reads a variable.
    Read(VarId),
    /// Writes a variable.
    Assign(VarId, AssignKind),
}

struct Step {
    kind: StepKind,
    /// The node (the last member for a region), for error messages.
    node: NodeId,
    inputs: SmallVec<[usize; 3]>,
    outputs: SmallVec<[usize; 1]>,
    /// Slots whose last use is this step.
    frees: SmallVec<[usize; 2]>,
    /// A region's input (by position) whose buffer its output may take
    /// in place, the input dying here ([`CompiledRegion::may_write_in_place`]).
    in_place: Option<usize>,
    /// Whether this product runs alongside another ([`pairs::Pair`]).
    pair: pairs::Pair,
    /// Re-check types on concrete operands (some static dim is unknown).
    check: bool,
    /// Ask the allocator before running: a static output is big enough to
    /// probe (see `tracejit_tensor::check_allocation`), or unknown.
    probe: bool,
}

/// A graph prepared for fast execution: a flat schedule of steps.
pub struct Executable {
    graph: Arc<Graph>,
    steps: Vec<Step>,
    n_slots: usize,
    outputs: Vec<usize>,
    param_types: Vec<TensorType>,
    /// The vector code its products and kernels may run.
    isa: tracejit_kernels::Isa,
    /// Freed intermediates and earlier results, reused for region outputs
    /// (see [`BufPool`]).
    pool: Mutex<BufPool>,
    /// Nanoseconds per step, summed while [`Executable::profile`] runs
    /// (empty otherwise).
    clock: Mutex<Vec<u64>>,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable").field("graph", &self.graph.name).field("steps", &self.steps.len()).finish()
    }
}

/// `graph` with its fusible nodes planned into regions this JIT compiles, by
/// the fusion pass (the one planner; it leaves regions a pipeline already
/// formed alone, so an optimized graph runs exactly as its listing shows).
fn plan_regions(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    let cx = PassContext::new(graph.name.clone()).with_region_acceptor(Arc::new(supports));
    Fusion::default().run(&mut g, &cx);
    g
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

/// The two subgraphs of a `cond` or `while`, planned and prepared.
fn prepare_pair(graphs: &[Arc<Graph>; 2], opts: &JitOptions) -> Result<[Executable; 2], JitError> {
    let prepare = |g: &Arc<Graph>| Executable::build(Arc::new(plan_regions(g)), opts, &mut HashMap::new());
    Ok([prepare(&graphs[0])?, prepare(&graphs[1])?])
}

impl Executable {
    /// Prepares `graph` (already optimized by the lead's passes; may contain
    /// any op). Library functions called by the graph are prepared too.
    pub fn new(graph: &Graph) -> Result<Executable, JitError> {
        Executable::with_options(graph, &JitOptions::global())
    }

    /// [`Executable::new`] with explicit code generation options.
    pub fn with_options(graph: &Graph, opts: &JitOptions) -> Result<Executable, JitError> {
        // A malformed graph is an error here, not a panic in a pass or a
        // wrong schedule.
        tracejit_ir::verify(graph)?;
        let mut callees: HashMap<FuncId, Arc<Executable>> = HashMap::new();
        Executable::build(Arc::new(plan_regions(graph)), opts, &mut callees)
    }

    fn build(
        graph: Arc<Graph>,
        opts: &JitOptions,
        callees: &mut HashMap<FuncId, Arc<Executable>>,
    ) -> Result<Executable, JitError> {
        let g = &*graph;
        let n = g.len();
        let mut consumers: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
        for (id, node) in g.nodes() {
            for v in &node.inputs {
                consumers.entry(*v).or_default().push(id);
            }
        }
        // Slots: one per (node, output).
        let mut slot_of: HashMap<ValueId, usize> = HashMap::new();
        let mut n_slots = 0;
        for (id, node) in g.nodes() {
            for k in 0..node.outputs.len() {
                slot_of.insert(ValueId::new(id, k as u32), n_slots);
                n_slots += 1;
            }
        }
        let slot = |v: &ValueId| -> Result<usize, JitError> {
            slot_of.get(v).copied().ok_or_else(|| {
                JitError::Ir(IrError::Verifier {
                    graph: g.name.clone(),
                    node: v.node,
                    message: format!("value {v} does not exist"),
                })
            })
        };
        let has_unknown = |node: &Node| {
            node.outputs.iter().chain(node.inputs.iter().map(|v| g.value_type(*v))).any(|t| t.shape().is_none())
        };

        let mut steps: Vec<Step> = Vec::new();
        let ids: Vec<NodeId> = g.nodes().map(|(id, _)| id).collect();

        for &id in &ids {
            let node = g.node(id);
            if let Op::Constant { value } = &node.op {
                // Constants are materialized as slots only if something
                // outside a region reads them.
                steps.push(Step {
                    kind: StepKind::Constant(value.clone()),
                    node: id,
                    inputs: SmallVec::new(),
                    outputs: smallvec::smallvec![slot(&ValueId::new(id, 0))?],
                    frees: SmallVec::new(),
                    in_place: None,
                    pair: pairs::Pair::None,
                    check: false,
                    probe: false,
                });
                continue;
            }
            let inputs: SmallVec<[usize; 3]> = node.inputs.iter().map(&slot).collect::<Result<_, _>>()?;
            let outputs: SmallVec<[usize; 1]> =
                (0..node.outputs.len()).map(|k| slot(&ValueId::new(id, k as u32))).collect::<Result<_, _>>()?;
            let check = has_unknown(node);
            // Every op is listed: a new op is a compile error here until the
            // executor handles it (or sends it to the reference kernels).
            let kind = match &node.op {
                Op::Parameter { index } => StepKind::Param(*index),
                Op::MatMul => StepKind::MatMul,
                Op::Call { func } => {
                    if func.index() >= g.library.len() {
                        return Err(JitError::Ir(IrError::Verifier {
                            graph: g.name.clone(),
                            node: id,
                            message: format!("unknown function {func}"),
                        }));
                    }
                    let exe = match callees.get(func) {
                        Some(e) => e.clone(),
                        None => {
                            let callee = plan_regions(&g.library.get(*func).graph);
                            let e = Arc::new(Executable::build(Arc::new(callee), opts, &mut HashMap::new())?);
                            callees.insert(*func, e.clone());
                            e
                        }
                    };
                    StepKind::Call(exe)
                }
                Op::Cond { branches } => StepKind::Cond(Box::new(prepare_pair(branches, opts)?)),
                Op::While { parts, trip_count } => {
                    let carried = parts[1].outputs.len();
                    let split = batch::plan(parts, carried, *trip_count, opts).map(Box::new);
                    StepKind::While(Box::new(prepare_pair(parts, opts)?), carried, split)
                }
                Op::ReadVariable { var } => StepKind::Read(*var),
                Op::AssignVariable { var, kind } => StepKind::Assign(*var, *kind),
                // A region planned by the fusion pass: compiled when this JIT
                // supports it, else its body is interpreted (a fallback).
                Op::Fused { body } if supports(body) => StepKind::Region(compile_region_with(body, opts)?),
                Op::Fused { .. } => StepKind::Primitive(node.op.clone()),
                // A registered native kernel runs as itself.
                Op::Kernel { .. } => StepKind::External(node.op.clone()),
                Op::Transpose { perm } => StepKind::View(View::Transpose(perm.clone())),
                Op::Gather { axis } if g.value_type(node.inputs[1]).rank() == 0 => StepKind::View(View::Index(*axis)),
                Op::Constant { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::Select
                | Op::Cast { .. }
                | Op::Clamp { .. }
                | Op::Reduce { .. }
                | Op::BroadcastTo { .. }
                | Op::ExpandDims { .. }
                | Op::ArgReduce { .. }
                | Op::Reshape { .. }
                | Op::Squeeze { .. }
                | Op::Concat { .. }
                | Op::Stack { .. }
                | Op::Slice { .. }
                | Op::Gather { .. }
                | Op::OneHot { .. } => StepKind::Primitive(node.op.clone()),
            };
            let probe = matches!(kind, StepKind::Region(_) | StepKind::MatMul | StepKind::Primitive(_))
                && node.outputs.iter().any(|t| {
                    t.shape()
                        .and_then(|s| tracejit_ir::tensor::byte_size(t.dtype, &s))
                        .is_none_or(|b| b >= tracejit_ir::tensor::PROBE_BYTES)
                });
            steps.push(Step {
                kind,
                node: id,
                inputs,
                outputs,
                frees: SmallVec::new(),
                in_place: None,
                pair: pairs::Pair::None,
                check,
                probe,
            });
        }

        pairs::hoist_views(&mut steps, g, crate::threads::gemm_threshold());
        // Last uses; graph outputs live on.
        let outputs: Vec<usize> = g.outputs.iter().map(&slot).collect::<Result<_, _>>()?;
        let mut last: Vec<Option<usize>> = vec![None; n_slots];
        for (i, s) in steps.iter().enumerate() {
            for &x in s.inputs.iter().chain(&s.outputs) {
                last[x] = Some(i);
            }
        }
        for &o in &outputs {
            last[o] = None;
        }
        for (x, l) in last.iter().enumerate() {
            if let Some(i) = l {
                steps[*i].frees.push(x);
            }
        }
        // The caller's inputs and constants are never unique at run time:
        // only an intermediate can lend its buffer.
        let lent: Vec<usize> = steps
            .iter()
            .filter(|s| matches!(s.kind, StepKind::Param(_) | StepKind::Constant(_)))
            .flat_map(|s| s.outputs.iter().copied())
            .collect();
        for s in &mut steps {
            if let StepKind::Region(r) = &s.kind {
                s.in_place = (0..s.inputs.len()).find(|&p| {
                    let x = s.inputs[p];
                    s.frees.contains(&x) && !lent.contains(&x) && r.may_write_in_place(p)
                });
            }
        }
        // Constants read only inside regions, and inputs nothing reads (a
        // loop's condition gets the whole state and reads the counter),
        // need no slot at run time.
        steps.retain(|s| {
            !matches!(s.kind, StepKind::Constant(_) | StepKind::Param(_))
                || s.frees.len() != 1
                || s.frees[0] != s.outputs[0]
        });
        let _ = n;
        // Renumber the slots the schedule uses densely, so that a call's slot
        // table is small.
        let mut dense: Vec<Option<usize>> = vec![None; n_slots];
        let mut n_used = 0;
        let mut renum = |x: &mut usize| {
            *x = *dense[*x].get_or_insert_with(|| {
                n_used += 1;
                n_used - 1
            });
        };
        let mut outputs = outputs;
        for s in &mut steps {
            s.inputs.iter_mut().chain(s.outputs.iter_mut()).chain(s.frees.iter_mut()).for_each(&mut renum);
        }
        outputs.iter_mut().for_each(&mut renum);
        let n_slots = n_used;
        pairs::pair_products(&mut steps, g, crate::threads::gemm_threshold());
        epilogue::plan(&mut steps, g);
        let param_types = g.param_types();
        Ok(Executable {
            graph,
            steps,
            n_slots,
            outputs,
            param_types,
            isa: opts.isa(),
            pool: Mutex::new(BufPool::default()),
            clock: Mutex::default(),
        })
    }

    /// Names of the ops that fell back to the reference kernels, for stats().
    pub fn fallbacks(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for s in &self.steps {
            match &s.kind {
                StepKind::Primitive(op) => v.push(op.name().to_string()),
                StepKind::Call(e) => v.extend(e.fallbacks()),
                StepKind::Cond(subs) | StepKind::While(subs, ..) => subs.iter().for_each(|e| v.extend(e.fallbacks())),
                _ => {}
            }
        }
        v
    }

    /// Number of fused regions in the schedule (for stats and tests).
    pub fn num_regions(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s.kind, StepKind::Region(_))).count()
    }

    /// Runs on one value per graph param (checked like
    /// `tracejit_ir::interpret` does), returns the outputs.
    pub fn run(&self, inputs: &[Storage]) -> Result<Vec<Storage>, IrError> {
        self.check_inputs(inputs)?;
        let mut pool = BufPool::checkout(&self.pool);
        // The slot table is kept with the pool: a train step's is a few KiB.
        let mut values = std::mem::take(&mut pool.table);
        values.resize(self.n_slots, None);
        let result = self.run_steps(inputs, &mut values, &mut pool);
        if let Ok(outs) = &result {
            // Kept so the buffers can be reused once the caller drops them.
            for v in outs {
                pool.give(v.clone());
            }
        }
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
        values.resize(self.n_slots, None);
        self.run_steps(inputs, &mut values, pool)
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
    /// allocator for its outputs, when the step asks for it.
    fn check_step(&self, step: &Step, args: &[&Storage]) -> Result<(), IrError> {
        let g = &*self.graph;
        if step.check || step.probe {
            let op = match &step.kind {
                StepKind::Primitive(op) | StepKind::External(op) => Some(op),
                StepKind::MatMul | StepKind::Region(_) | StepKind::View(_) => Some(&g.node(step.node).op),
                _ => None,
            };
            if let Some(op) = op {
                let types: SmallVec<[TensorType; 2]> =
                    args.iter().map(|x| TensorType::known(x.dtype(), x.shape())).collect();
                // A region's body types its outputs; its concrete sizes
                // are checked where it plans a launch.
                let location = g.node(step.node).location;
                let outs = if step.check && !matches!(step.kind, StepKind::Region(_)) {
                    infer(op, &types, Some(g)).map_err(|e| e.at(location))?
                } else {
                    g.node(step.node).outputs.clone()
                };
                if step.probe {
                    tracejit_ir::check_outputs_allocatable(op, &types, &outs).map_err(|e| e.at(location))?;
                }
            }
        }
        Ok(())
    }

    fn run_steps(
        &self,
        inputs: &[Storage],
        values: &mut [Option<Storage>],
        pool: &mut BufPool,
    ) -> Result<Vec<Storage>, IrError> {
        let g = &*self.graph;
        let mut clock: Option<Vec<u64>> = profile::profiling().then(|| vec![0; self.steps.len()]);
        // Filled in place by each step and drained into the slots: moving a
        // two-value SmallVec (216 bytes) out of the match and into its
        // iterator was a `memcpy` call each, a sixth of a scalar loop trip.
        let mut outs: SmallVec<[Storage; 2]> = SmallVec::new();
        for (i, step) in self.steps.iter().enumerate() {
            let started = clock.is_some().then(std::time::Instant::now);
            let done = matches!(step.pair, pairs::Pair::Second | pairs::Pair::After);
            if done && values[step.outputs[0]].is_some() {
                // Computed with its partner: only its last uses remain.
                self.free_slots(step, values, pool);
                continue;
            }
            let broken = |message: String| IrError::Verifier { graph: g.name.clone(), node: step.node, message };
            // Taken before the operands are borrowed: the address to write
            // in place while the dying input is still unique.
            let alias = match step.in_place {
                Some(p) => values[step.inputs[p]].as_mut().and_then(crate::region::unique_mut_ptr).map(|ptr| (p, ptr)),
                None => None,
            };
            let mut args: SmallVec<[&Storage; 3]> = SmallVec::new();
            for &x in &step.inputs {
                args.push(values[x].as_ref().ok_or_else(|| broken(format!("slot {x} is not available")))?);
            }
            self.check_step(step, &args)?;
            let mut partner_out: SmallVec<[(usize, Storage); 2]> = SmallVec::new();
            outs.clear();
            match &step.kind {
                StepKind::Param(i) => outs.push(inputs[*i].clone()),
                StepKind::Constant(c) => outs.push(c.clone()),
                StepKind::Region(r) => {
                    outs.extend(r.try_run_pooled(&args, pool, alias).map_err(|e| e.at(g.node(step.node).location))?)
                }
                StepKind::MatMul => {
                    let paired = match step.pair {
                        pairs::Pair::First(j) => {
                            let other = &self.steps[j];
                            let b: SmallVec<[&Storage; 2]> = other
                                .inputs
                                .iter()
                                .map(|&x| {
                                    values[x].as_ref().ok_or_else(|| broken(format!("slot {x} is not available")))
                                })
                                .collect::<Result<_, _>>()?;
                            self.check_step(other, &b)?;
                            pairs::run_pair(self.isa, [args[0], b[0]], [args[1], b[1]], pool).map(|[x, y]| {
                                partner_out.push((other.outputs[0], y));
                                x
                            })
                        }
                        pairs::Pair::Then(j) => epilogue::run(self, step, j, &args, values, pool)?.map(|(x, made)| {
                            partner_out = made;
                            x
                        }),
                        pairs::Pair::None | pairs::Pair::Second | pairs::Pair::After => None,
                    };
                    let out = paired.unwrap_or_else(|| {
                        crate::gemm::matmul_with(self.isa, args[0], args[1], &mut |d, s| pool.take(d, s))
                    });
                    outs.push(out);
                }
                StepKind::View(view) => match view.apply(&args) {
                    Some(v) => outs.push(v),
                    // Out of range: the reference kernel reports it.
                    None => outs.extend(eval_primitive(&g.node(step.node).op, &args)),
                },
                StepKind::External(op) => outs.extend(tracejit_ir::eval_kernel(op, &args, self.isa)),
                StepKind::Primitive(op) => {
                    let scalar = if let Op::Binary(b) = op { scalars::binary(*b, &args, pool) } else { None };
                    match scalar {
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
                    match split.as_ref().and_then(|s| s.run(*carried, &owned)) {
                        Some(out) => outs.extend(out),
                        None => {
                            outs.extend(tracejit_ir::control::run_while(*carried, &owned, &mut Shared { subs, pool })?)
                        }
                    }
                }
                StepKind::Read(var) => {
                    let v = g.variables.get(*var).ok_or_else(|| broken(format!("unknown variable {var}")))?;
                    outs.push(v.read())
                }
                StepKind::Assign(var, kind) => {
                    let v = g.variables.get(*var).ok_or_else(|| broken(format!("unknown variable {var}")))?;
                    let types = [TensorType::known(args[0].dtype(), args[0].shape())];
                    infer(&Op::AssignVariable { var: *var, kind: *kind }, &types, Some(g))?;
                    // `update` holds the variable's lock across read and
                    // write, so concurrent assign_adds lose no increment.
                    match kind {
                        // The replaced value's buffer goes to the pool: an
                        // update region writes the next step's value into it.
                        AssignKind::Assign => pool.give_if_unique(v.replace(args[0].clone())),
                        AssignKind::Add => v.update(&mut |cur| kernels::binary(BinaryOp::Add, cur, args[0])),
                        AssignKind::Sub => v.update(&mut |cur| kernels::binary(BinaryOp::Sub, cur, args[0])),
                    }
                }
            }
            drop(args);
            if !partner_out.is_empty() {
                for (slot, v) in partner_out.drain(..) {
                    values[slot] = Some(v);
                }
            }
            if outs.len() != step.outputs.len() {
                return Err(broken(format!("produced {} values for {} outputs", outs.len(), step.outputs.len())));
            }
            for (&s, x) in step.outputs.iter().zip(outs.drain(..)) {
                values[s] = Some(x);
            }
            self.free_slots(step, values, pool);
            if let (Some(clock), Some(started)) = (clock.as_mut(), started) {
                clock[i] += started.elapsed().as_nanos() as u64;
            }
        }
        if let Some(clock) = clock {
            profile::record(self, &clock);
        }
        let outputs = &self.outputs;
        outputs
            .iter()
            .enumerate()
            .map(|(k, &o)| {
                // Moved out on its last listing, cloned before.
                let v = if outputs[k + 1..].contains(&o) { values[o].clone() } else { values[o].take() };
                v.ok_or_else(|| IrError::Verifier {
                    graph: g.name.clone(),
                    node: NodeId::new(0),
                    message: format!("graph output slot {o} was not produced"),
                })
            })
            .collect()
    }
}
