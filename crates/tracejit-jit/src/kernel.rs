//! Code generation of a whole region kernel: the loop structure around the
//! element ops of [`crate::lower`].
//!
//! # Kernel ABI
//!
//! A kernel is `extern "C" fn(args: *const i64)`. `args` holds, in order,
//! `rows`, `n` (the inner extent), `flags`, a scratch pointer, `count` (the
//! reduced element count of a column region), then for every slot (inputs
//! first, then outputs) its base pointer and its byte stride per row. The
//! kernel runs `rows` rows of `n` inner elements; the launcher
//! (`crate::region`) collapses the domain into this shape and loops over any
//! further outer dimensions itself.
//!
//! # Loop shapes
//!
//! Every inner loop is emitted three times: a vector loop unrolled `U` times
//! (`U·W` elements per iteration, `W` lanes), a one-vector loop, and a scalar
//! tail. Each is a rotated single-block loop (`brif i < limit` at the bottom),
//! the shape Cranelift hoists invariants out of; constants are hoisted into
//! the entry block explicitly and row invariants are computed once per row,
//! before the loops. Mixed lane widths (e.g. a cast between f32 and f64) run
//! the scalar loop only.
//!
//! - **Elementwise**: for each row, one inner loop storing every output.
//!   With staged nodes (f32 `exp`/`tanh`/`sigmoid` computed by the 256-bit
//!   functions of `crate::chunkmath`), the row is processed in chunks: per
//!   chunk and staged node, a loop stores the node's argument into a
//!   scratch chunk and a call replaces it by the result; then the output
//!   loop reads the staged values from scratch. Row regions stage a node
//!   at the start of the first pass that needs it, over the whole row, in
//!   the scratch row it is materialized in when a later pass reads it.
//! - **Row** reductions: for each row, one inner loop per reduction stage
//!   (pass), each accumulating its reductions in `U` vector accumulators plus a
//!   scalar one, combined in a fixed order into a per-row scalar; then a final
//!   loop storing the full-size outputs, and the kept-size outputs stored once
//!   per row. A value computed in one pass and needed by a later one is
//!   stored in a scratch row buffer (softmax's `exp(x - max)`) rather than
//!   recomputed.
//! - **Column** reductions: accumulators live in scratch buffers of `n`
//!   elements; flag bit 0 initializes them, every row adds into them in order
//!   (exactly the reference's summation order), flag bit 1 runs the epilogue
//!   that writes the kept-size outputs.

use std::collections::{HashMap, HashSet};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, BlockArg, FuncRef, InstBuilder, Signature, Type, Value};
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};
use tracejit_ir::tensor::{DType, ReduceOp, UnaryOp};

use crate::analysis::{Analysis, KernelKind, LOp};
use crate::helpers::Helper;
use crate::lower::{mem, sty, Emit, Mode};
use crate::JitOptions;

/// Byte offsets in the argument block.
pub(crate) const ARG_ROWS: i32 = 0;
const ARG_N: i32 = 8;
const ARG_FLAGS: i32 = 16;
const ARG_SCRATCH: i32 = 24;
const ARG_COUNT: i32 = 32;
/// First slot: (pointer, row stride) pairs follow.
pub(crate) const ARG_SLOTS: usize = 5;
/// Column kernels: initialize the accumulators.
pub(crate) const FLAG_INIT: i64 = 1;
/// Column kernels: write the kept-size outputs.
pub(crate) const FLAG_FINAL: i64 = 2;

/// Which values are kept in scratch buffers, decided before emission.
#[derive(Clone, Debug, Default)]
pub(crate) struct Schedule {
    /// Number of scratch buffers of `n` 8-byte elements the launcher allocates.
    pub scratch_slots: usize,
    /// Row regions: node -> scratch slot, for values computed in one pass and
    /// read in a later one.
    materialized: HashMap<usize, usize>,
    /// Row regions: the pass (1-based) each materialized node is stored in.
    stored_in: HashMap<usize, u32>,
    /// Column regions: reduce node -> accumulator slot.
    acc: HashMap<usize, usize>,
    /// f32 `exp`/`tanh`/`sigmoid` nodes computed by a 256-bit chunk
    /// function ([`crate::chunkmath`]) instead of in-line, in node order.
    pub staged: Vec<Staged>,
    /// Elements per chunk of a staged kernel (scratch buffers hold one
    /// chunk, not a row); 0 when nothing is staged.
    pub chunk: usize,
}

/// A node computed by a chunk function: its argument is stored into
/// scratch buffer `slot`, which the function turns into the node's values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged {
    pub node: usize,
    pub op: UnaryOp,
    /// Row regions: the pass that first needs the node (1-based; `passes + 1`
    /// is the final pass). Elementwise regions: 1.
    pub pass: u32,
    pub slot: usize,
}

/// The f32 nodes of `an` that a chunk function can compute, if staging is on
/// and the kernel runs 32-bit lanes.
fn stageable(an: &Analysis, options: &JitOptions) -> Vec<(usize, UnaryOp)> {
    if lane_bits(an) != Some(32) || !options.stage_transcendentals {
        return Vec::new();
    }
    an.nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match n.op {
            LOp::Unary(op @ (UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid))
                if n.dtype == DType::F32 && n.varying && crate::chunkmath::chunk_fn(op).is_some() =>
            {
                Some((i, op))
            }
            _ => None,
        })
        .collect()
}

/// Elements per chunk of a staged kernel: the arguments and results of the
/// chunk functions stay in L1.
const STAGE_CHUNK: usize = 512;

/// Plans scratch buffers for `an`; `options` says whether transcendentals
/// are staged (`JitOptions::stage_transcendentals`).
pub(crate) fn schedule(an: &Analysis, options: &JitOptions) -> Schedule {
    let mut s = Schedule::default();
    match an.kind {
        KernelKind::Elementwise => {
            s.staged = stageable(an, options)
                .into_iter()
                .enumerate()
                .map(|(slot, (node, op))| Staged { node, op, pass: 1, slot })
                .collect();
            if !s.staged.is_empty() {
                s.scratch_slots = s.staged.len();
                s.chunk = STAGE_CHUNK;
            }
        }
        KernelKind::Column => {
            for (i, n) in an.nodes.iter().enumerate() {
                if matches!(n.op, LOp::Reduce(_)) {
                    s.acc.insert(i, s.acc.len());
                }
            }
            s.scratch_slots = s.acc.len();
        }
        KernelKind::Row => {
            let mut computed_in: HashMap<usize, u32> = HashMap::new();
            for p in 1..=an.passes + 1 {
                let roots = pass_roots(an, p);
                let mut stack = roots;
                while let Some(v) = stack.pop() {
                    let node = &an.nodes[v];
                    if !node.varying {
                        continue;
                    }
                    match computed_in.get(&v) {
                        Some(&q) if q == p => continue,
                        Some(&q) => {
                            if !matches!(node.op, LOp::Load(_)) && !s.materialized.contains_key(&v) {
                                let k = s.materialized.len();
                                s.materialized.insert(v, k);
                                s.stored_in.insert(v, q);
                            }
                            continue;
                        }
                        None => {}
                    }
                    computed_in.insert(v, p);
                    stack.extend(node.inputs.iter().copied());
                }
            }
            s.scratch_slots = s.materialized.len();
            // A staged node shares the scratch buffer it is materialized in
            // (if a later pass reads it), else gets one of its own.
            for (node, op) in stageable(an, options) {
                let Some(&pass) = computed_in.get(&node) else { continue };
                let slot = match s.materialized.get(&node) {
                    Some(&k) => k,
                    None => {
                        s.scratch_slots += 1;
                        s.scratch_slots - 1
                    }
                };
                s.staged.push(Staged { node, op, pass, slot });
            }
        }
    }
    s
}

/// Row regions: the nodes pass `p` must evaluate per element (reduction
/// inputs of stage `p`; the varying outputs in the final pass).
fn pass_roots(an: &Analysis, p: u32) -> Vec<usize> {
    if p <= an.passes {
        an.nodes.iter().filter(|n| matches!(n.op, LOp::Reduce(_)) && n.stage == p).map(|n| n.inputs[0]).collect()
    } else {
        an.outputs.iter().filter(|o| !o.kept).map(|o| o.node).collect()
    }
}

/// The helpers a program calls.
fn helpers_needed(an: &Analysis) -> HashSet<Helper> {
    let mut set = HashSet::new();
    for n in &an.nodes {
        let in_t = n.inputs.first().map(|&i| an.nodes[i].dtype);
        match (&n.op, in_t) {
            (LOp::Unary(u), Some(t)) => {
                if let Some(h) = Helper::unary(*u, t) {
                    set.insert(h);
                }
            }
            (LOp::Binary(b), Some(t)) => {
                if let Some(h) = Helper::binary(*b, t) {
                    set.insert(h);
                }
            }
            _ => {}
        }
    }
    set
}

/// The vector lane width of a program, or `None` when it mixes widths.
fn lane_bits(an: &Analysis) -> Option<u32> {
    let mut bits: Option<u32> = None;
    for t in an.nodes.iter().map(|n| n.dtype).chain(an.loads.iter().map(|l| l.dtype)) {
        let b = match t {
            DType::Bool => continue,
            DType::F32 | DType::I32 => 32,
            DType::F64 | DType::I64 => 64,
        };
        match bits {
            None => bits = Some(b),
            Some(x) if x == b => {}
            Some(_) => return None,
        }
    }
    Some(bits.unwrap_or(32))
}

fn is_heavy(an: &Analysis) -> bool {
    an.nodes.iter().any(|n| {
        matches!(n.op, LOp::Unary(UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Erf))
    })
}

/// Emits the kernel of `an` into `module` as function `name`.
pub(crate) fn build(
    an: &Analysis,
    sch: &Schedule,
    module: &mut JITModule,
    ctx: &mut Context,
    fctx: &mut FunctionBuilderContext,
    name: &str,
) -> Result<FuncId, String> {
    let ptr = module.target_config().pointer_type();
    let call_conv = module.isa().default_call_conv();
    let mut sig = Signature::new(call_conv);
    sig.params.push(AbiParam::new(ptr));

    let mut helper_ids = Vec::new();
    for h in helpers_needed(an) {
        let mut hs = Signature::new(call_conv);
        for _ in 0..h.arity() {
            hs.params.push(AbiParam::new(sty(h.dtype())));
        }
        hs.returns.push(AbiParam::new(sty(h.dtype())));
        let id = module.declare_function(h.name(), Linkage::Import, &hs).map_err(|e| e.to_string())?;
        helper_ids.push((h, id));
    }

    let mut chunk_ids = Vec::new();
    for &Staged { op, .. } in &sch.staged {
        let (fname, _) = crate::chunkmath::chunk_fn(op).ok_or("a staged op lost its chunk function")?;
        let mut cs = Signature::new(call_conv);
        cs.params.push(AbiParam::new(ptr));
        cs.params.push(AbiParam::new(types::I64));
        chunk_ids.push(module.declare_function(fname, Linkage::Import, &cs).map_err(|e| e.to_string())?);
    }

    ctx.func.signature = sig.clone();
    let vector_bits = lane_bits(an);
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let args = b.block_params(entry)[0];
        let ld = |b: &mut FunctionBuilder, off: i32| b.ins().load(types::I64, mem(), args, off);
        let rows = ld(&mut b, ARG_ROWS);
        let n = ld(&mut b, ARG_N);
        let flags = ld(&mut b, ARG_FLAGS);
        let scratch = ld(&mut b, ARG_SCRATCH);
        let count = ld(&mut b, ARG_COUNT);
        let nslots = an.loads.len() + an.outputs.len();
        let mut base = Vec::with_capacity(nslots);
        let mut rstride = Vec::with_capacity(nslots);
        for s in 0..nslots {
            let off = ((ARG_SLOTS + 2 * s) * 8) as i32;
            base.push(ld(&mut b, off));
            rstride.push(ld(&mut b, off + 8));
        }
        let w = i64::from(vector_bits.map_or(1, |bits| 128 / bits));
        let unroll: i64 = match std::env::var("TRACEJIT_JIT_UNROLL").ok().and_then(|v| v.parse().ok()) {
            Some(u) if [1, 2, 4, 8].contains(&u) => u,
            _ if is_heavy(an) => 2,
            _ => 4,
        };
        let n_main = b.ins().band_imm_s(n, -(w * unroll));
        let n_vec = b.ins().band_imm_s(n, -w);
        let mut scratch_ptrs = Vec::new();
        for k in 0..sch.scratch_slots {
            let bytes = if sch.chunk > 0 {
                b.ins().iconst(types::I64, (8 * k * sch.chunk) as i64)
            } else {
                b.ins().imul_imm_s(n, 8 * k as i64)
            };
            scratch_ptrs.push(b.ins().iadd(scratch, bytes));
        }
        let start = b.create_block();
        let term = b.ins().jump(start, &[]);
        b.switch_to_block(start);

        let mut e = Emit::new(&mut b, term, vector_bits.unwrap_or(32));
        for (h, id) in &helper_ids {
            let fref = module.declare_func_in_func(*id, e.b.func);
            e.helpers.insert(*h, fref);
        }
        let chunk_fns: Vec<FuncRef> = chunk_ids.iter().map(|id| module.declare_func_in_func(*id, e.b.func)).collect();
        let mut g = Gen {
            e,
            an,
            sch,
            vector: vector_bits.is_some(),
            heavy: is_heavy(an),
            w,
            unroll,
            n,
            n_main,
            n_vec,
            count,
            scratch_ptrs,
            base: base.clone(),
            rstride,
            rowptr: base,
            inv: HashMap::new(),
            splat: HashMap::new(),
            sources: HashMap::new(),
            memo: HashMap::new(),
            chunk_fns,
        };
        g.emit(rows, flags);
        g.e.b.ins().return_(&[]);
        drop(g);
        b.seal_all_blocks();
        b.finalize(module.isa().frontend_config());
    }
    let id = module.declare_function(name, Linkage::Local, &sig).map_err(|e| e.to_string())?;
    let dump = std::env::var_os("TRACEJIT_JIT_DUMP").is_some();
    if dump {
        ctx.set_disasm(true);
        eprintln!("== kernel {}\n{}", an.key, ctx.func.display());
    }
    module.define_function(id, ctx).map_err(|e| format!("{e:?}"))?;
    if dump {
        if let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
            eprintln!("== machine code\n{code}");
        }
    }
    module.clear_context(ctx);
    Ok(id)
}

/// Where a loop reads a node from instead of computing it.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// A materialized row value.
    Scratch(usize),
    /// A column accumulator (`true`: divide by `count`, for `mean`).
    Acc(usize, bool),
}

/// What a loop does with a node's value.
#[derive(Clone, Copy, Debug)]
enum Dest {
    /// Store into slot `s` (an output).
    Out(usize),
    /// Store into scratch buffer `k`.
    Scratch(usize),
    /// Column: `acc[k] = acc[k] (op) value(input)` for the reduce node.
    AccStep(usize),
    /// Column: `acc[k] = identity` for the reduce node.
    AccInit(usize),
}

struct Gen<'g, 'a, 'b> {
    e: Emit<'a, 'b>,
    an: &'g Analysis,
    sch: &'g Schedule,
    vector: bool,
    /// The kernel computes transcendentals: its constants are read from
    /// memory at their uses rather than held in registers (see `Emit::kmem`).
    heavy: bool,
    w: i64,
    unroll: i64,
    n: Value,
    n_main: Value,
    n_vec: Value,
    count: Value,
    scratch_ptrs: Vec<Value>,
    base: Vec<Value>,
    rstride: Vec<Value>,
    /// Current row pointer of each slot.
    rowptr: Vec<Value>,
    /// Invariant scalars of the current context (row).
    inv: HashMap<usize, Value>,
    /// Their splats.
    splat: HashMap<usize, Value>,
    sources: HashMap<usize, Src>,
    memo: HashMap<usize, Value>,
    /// The chunk functions of `sch.staged`, in order.
    chunk_fns: Vec<FuncRef>,
}

impl Gen<'_, '_, '_> {
    fn out_slot(&self, o: usize) -> usize {
        self.an.loads.len() + o
    }

    fn emit(&mut self, rows: Value, flags: Value) {
        match self.an.kind {
            KernelKind::Elementwise => {
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.rotated_loop(zero, rows, 1, vec![], |g, r, _| {
                    g.enter_row(r);
                    let stores: Vec<(usize, Dest)> =
                        (0..g.an.outputs.len()).map(|o| (g.an.outputs[o].node, Dest::Out(g.out_slot(o)))).collect();
                    if g.sch.staged.is_empty() {
                        g.inner(&stores, &[]);
                    } else {
                        g.staged_row(&stores);
                    }
                    vec![]
                });
            }
            KernelKind::Row => {
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.rotated_loop(zero, rows, 1, vec![], |g, r, _| {
                    g.enter_row(r);
                    g.row_passes();
                    vec![]
                });
            }
            KernelKind::Column => {
                self.if_flag(flags, FLAG_INIT, |g| {
                    let stores: Vec<(usize, Dest)> =
                        g.sch_acc().into_iter().map(|(r, k)| (r, Dest::AccInit(k))).collect();
                    g.inner(&stores, &[]);
                });
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.rotated_loop(zero, rows, 1, vec![], |g, r, _| {
                    g.enter_row(r);
                    let mut stores: Vec<(usize, Dest)> =
                        g.sch_acc().into_iter().map(|(r, k)| (r, Dest::AccStep(k))).collect();
                    for (o, out) in g.an.outputs.iter().enumerate() {
                        if !out.kept {
                            stores.push((out.node, Dest::Out(g.an.loads.len() + o)));
                        }
                    }
                    g.inner(&stores, &[]);
                    vec![]
                });
                self.if_flag(flags, FLAG_FINAL, |g| {
                    g.rowptr = g.base.clone();
                    g.inv.clear();
                    g.splat.clear();
                    for (r, k) in g.sch_acc() {
                        let mean = matches!(g.an.nodes[r].op, LOp::Reduce(ReduceOp::Mean));
                        g.sources.insert(r, Src::Acc(k, mean));
                    }
                    let stores: Vec<(usize, Dest)> =
                        g.an.outputs
                            .iter()
                            .enumerate()
                            .filter(|(_, o)| o.kept)
                            .map(|(o, out)| (out.node, Dest::Out(g.an.loads.len() + o)))
                            .collect();
                    g.inner(&stores, &[]);
                    g.sources.clear();
                });
            }
        }
    }

    fn sch_acc(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = self.sch.acc.iter().map(|(&r, &k)| (r, k)).collect();
        v.sort_unstable();
        v
    }

    /// One row of an elementwise kernel with staged nodes, in chunks of
    /// `sch.chunk` elements: for each staged node, a loop stores its
    /// argument into its scratch chunk and the chunk function replaces it by
    /// the result; then the outputs' loop reads staged values from scratch.
    fn staged_row(&mut self, stores: &[(usize, Dest)]) {
        let an = self.an;
        let chunk = self.sch.chunk as i64;
        let (n_row, n_main_row, n_vec_row) = (self.n, self.n_main, self.n_vec);
        let row = self.rowptr.clone();
        // Slots read or written along the inner loop move with the chunk;
        // the others (read once per row) stay.
        let step: Vec<Option<i64>> = (0..row.len())
            .map(|s| match s.checked_sub(an.loads.len()) {
                None => an.loads[s].contig.then(|| an.loads[s].dtype.size_of() as i64),
                Some(o) => Some(an.outputs[o].dtype.size_of() as i64),
            })
            .collect();
        let zero = self.e.b.ins().iconst(types::I64, 0);
        let vec_step = self.w * self.unroll;
        let w = self.w;
        self.rotated_loop(zero, n_row, chunk, vec![], |g, c, _| {
            let rem = g.e.b.ins().isub(n_row, c);
            let len = g.e.b.ins().iconst(types::I64, chunk);
            let len = g.e.b.ins().smin(rem, len);
            g.n = len;
            g.n_main = g.e.b.ins().band_imm_s(len, -vec_step);
            g.n_vec = g.e.b.ins().band_imm_s(len, -w);
            g.rowptr = row
                .iter()
                .zip(&step)
                .map(|(&p, st)| match st {
                    Some(size) => {
                        let off = g.e.b.ins().imul_imm_s(c, *size);
                        g.e.b.ins().iadd(p, off)
                    }
                    None => p,
                })
                .collect();
            g.stage(1, len);
            g.inner(stores, &[]);
            g.sources.clear();
            vec![]
        });
        self.n = n_row;
        self.n_main = n_main_row;
        self.n_vec = n_vec_row;
        self.rowptr = row;
    }

    /// Computes the nodes staged in pass `pass` over the current `len`
    /// elements: a loop stores each one's argument into its scratch buffer,
    /// its chunk function turns that into its values, and later loops read
    /// them from there.
    fn stage(&mut self, pass: u32, len: Value) {
        let an = self.an;
        for (k, st) in self.sch.staged.iter().enumerate().filter(|(_, st)| st.pass == pass) {
            let arg = an.nodes[st.node].inputs[0];
            self.inner(&[(arg, Dest::Scratch(st.slot))], &[]);
            let (f, ptr) = (self.chunk_fns[k], self.scratch_ptrs[st.slot]);
            self.e.b.ins().call(f, &[ptr, len]);
            self.sources.insert(st.node, Src::Scratch(st.slot));
        }
    }

    /// True when `v` is computed by a chunk function in pass `pass` (its
    /// scratch buffer is already filled).
    fn staged_in(&self, v: usize, pass: u32) -> bool {
        self.sch.staged.iter().any(|st| st.node == v && st.pass == pass)
    }

    /// Sets the row pointers for row `r` and forgets per-row invariants.
    fn enter_row(&mut self, r: Value) {
        self.inv.clear();
        self.splat.clear();
        self.rowptr = (0..self.base.len())
            .map(|s| {
                let off = self.e.b.ins().imul(r, self.rstride[s]);
                self.e.b.ins().iadd(self.base[s], off)
            })
            .collect();
    }

    /// The passes of one row of a row-reduction region.
    fn row_passes(&mut self) {
        let an = self.an;
        for p in 1..=an.passes {
            let reds: Vec<usize> = (0..an.nodes.len())
                .filter(|&i| matches!(an.nodes[i].op, LOp::Reduce(_)) && an.nodes[i].stage == p)
                .collect();
            let stores: Vec<(usize, Dest)> = self
                .sch
                .stored_in
                .iter()
                .filter(|(&v, &q)| q == p && !self.staged_in(v, p))
                .map(|(&v, _)| (v, Dest::Scratch(self.sch.materialized[&v])))
                .collect();
            self.set_sources(p);
            self.stage(p, self.n);
            let results = self.inner(&stores, &reds);
            for (&r, res) in reds.iter().zip(results) {
                let v = if matches!(an.nodes[r].op, LOp::Reduce(ReduceOp::Mean)) {
                    let ty = sty(an.nodes[r].dtype);
                    let c = self.e.b.ins().fcvt_from_sint(ty, self.n);
                    self.e.b.ins().fdiv(res, c)
                } else {
                    res
                };
                self.inv.insert(r, v);
            }
        }
        // Final pass: full-size outputs.
        self.set_sources(an.passes + 1);
        self.stage(an.passes + 1, self.n);
        let stores: Vec<(usize, Dest)> = an
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.kept)
            .map(|(o, out)| (out.node, Dest::Out(an.loads.len() + o)))
            .collect();
        if !stores.is_empty() {
            self.inner(&stores, &[]);
        }
        self.sources.clear();
        // Kept-size outputs: once per row.
        let kept: Vec<(usize, usize)> = an
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.kept)
            .map(|(o, out)| (out.node, an.loads.len() + o))
            .collect();
        for (node, slot) in kept {
            let v = self.inv_scalar(node);
            let zero = self.e.b.ins().iconst(types::I64, 0);
            self.store(an.nodes[node].dtype, Mode::Scalar, self.rowptr[slot], zero, 0, v);
        }
    }

    /// In pass `p`, values materialized in earlier passes are read from scratch.
    fn set_sources(&mut self, p: u32) {
        self.sources.clear();
        for (&v, &q) in &self.sch.stored_in {
            if q < p {
                self.sources.insert(v, Src::Scratch(self.sch.materialized[&v]));
            }
        }
    }

    /// `if flags & bit { body }`.
    fn if_flag(&mut self, flags: Value, bit: i64, body: impl FnOnce(&mut Self)) {
        let then_blk = self.e.b.create_block();
        let cont = self.e.b.create_block();
        let f = self.e.b.ins().band_imm_s(flags, bit);
        self.e.b.ins().brif(f, then_blk, &[], cont, &[]);
        self.e.b.switch_to_block(then_blk);
        body(self);
        self.e.b.ins().jump(cont, &[]);
        self.e.b.switch_to_block(cont);
    }

    /// A rotated loop `for i in (start..limit).step_by(step)` carrying
    /// `carried`; the body may create blocks. Returns the final `i` and the
    /// carried values.
    fn rotated_loop(
        &mut self,
        start: Value,
        limit: Value,
        step: i64,
        carried: Vec<Value>,
        mut body: impl FnMut(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> (Value, Vec<Value>) {
        let types_: Vec<Type> = carried.iter().map(|&v| self.e.b.func.dfg.value_type(v)).collect();
        let body_blk = self.e.b.create_block();
        let exit_blk = self.e.b.create_block();
        for blk in [body_blk, exit_blk] {
            self.e.b.append_block_param(blk, types::I64);
            for &t in &types_ {
                self.e.b.append_block_param(blk, t);
            }
        }
        let args = |i: Value, c: &[Value]| -> Vec<BlockArg> {
            std::iter::once(i).chain(c.iter().copied()).map(BlockArg::Value).collect()
        };
        let cond = self.e.b.ins().icmp(IntCC::SignedLessThan, start, limit);
        let a = args(start, &carried);
        self.e.b.ins().brif(cond, body_blk, &a, exit_blk, &a);
        self.e.b.switch_to_block(body_blk);
        let params = self.e.b.block_params(body_blk).to_vec();
        let outer_index = self.e.loop_index.replace(params[0]);
        let new = body(self, params[0], &params[1..]);
        self.e.loop_index = outer_index;
        let i2 = self.e.b.ins().iadd_imm_s(params[0], step);
        let cond = self.e.b.ins().icmp(IntCC::SignedLessThan, i2, limit);
        let a = args(i2, &new);
        self.e.b.ins().brif(cond, body_blk, &a, exit_blk, &a);
        self.e.b.switch_to_block(exit_blk);
        let params = self.e.b.block_params(exit_blk).to_vec();
        (params[0], params[1..].to_vec())
    }

    /// The three inner loops over `0..n`: stores `stores`, reduces `reds`
    /// (row regions); returns one scalar per reduction.
    fn inner(&mut self, stores: &[(usize, Dest)], reds: &[usize]) -> Vec<Value> {
        let an = self.an;
        // Invariants used by the loops, computed before them.
        let mut roots: Vec<usize> = Vec::new();
        for &(v, d) in stores {
            match d {
                Dest::AccStep(_) => roots.push(an.nodes[v].inputs[0]),
                Dest::AccInit(_) => {}
                _ => roots.push(v),
            }
        }
        roots.extend(reds.iter().map(|&r| an.nodes[r].inputs[0]));
        self.prepare_invariants(&roots);

        let ops: Vec<(ReduceOp, DType)> = reds
            .iter()
            .map(|&r| match an.nodes[r].op {
                LOp::Reduce(op) => (op, an.nodes[r].dtype),
                _ => unreachable!(),
            })
            .collect();
        let zero = self.e.b.ins().iconst(types::I64, 0);
        let (i, scalars) = if self.vector {
            let u = self.unroll;
            let w = self.w;
            let init: Vec<Value> = ops
                .iter()
                .flat_map(|&(op, t)| {
                    let id = self.e.identity(op, t, Mode::Vector);
                    std::iter::repeat_n(id, u as usize)
                })
                .collect();
            let n_main = self.n_main;
            let (i1, accs) = self.rotated_loop(zero, n_main, w * u, init, |g, i, accs| {
                let mut accs = accs.to_vec();
                for k in 0..u {
                    let mut a: Vec<Value> = (0..ops.len()).map(|j| accs[j * u as usize + k as usize]).collect();
                    g.body(Mode::Vector, i, k * w, stores, reds, &mut a);
                    for j in 0..ops.len() {
                        accs[j * u as usize + k as usize] = a[j];
                    }
                }
                accs
            });
            let mut comb = Vec::new();
            for (j, &(op, t)) in ops.iter().enumerate() {
                let mut acc = accs[j * u as usize];
                for k in 1..u as usize {
                    acc = self.e.reduce_step(op, t, Mode::Vector, acc, accs[j * u as usize + k]);
                }
                comb.push(acc);
            }
            let n_vec = self.n_vec;
            let (i2, vaccs) = self.rotated_loop(i1, n_vec, w, comb, |g, i, accs| {
                let mut a = accs.to_vec();
                g.body(Mode::Vector, i, 0, stores, reds, &mut a);
                a
            });
            let mut scalars = Vec::new();
            for (j, &(op, t)) in ops.iter().enumerate() {
                let mut s = self.e.b.ins().extractlane(vaccs[j], 0);
                for lane in 1..w {
                    let l = self.e.b.ins().extractlane(vaccs[j], lane as u8);
                    s = self.e.reduce_step(op, t, Mode::Scalar, s, l);
                }
                scalars.push(s);
            }
            (i2, scalars)
        } else {
            let scalars = ops.iter().map(|&(op, t)| self.e.identity(op, t, Mode::Scalar)).collect();
            (zero, scalars)
        };
        let n = self.n;
        // The scalar tail accumulates separately and is folded in last.
        let tail_init: Vec<Value> = ops.iter().map(|&(op, t)| self.e.identity(op, t, Mode::Scalar)).collect();
        let (_, tails) = self.rotated_loop(i, n, 1, tail_init, |g, i, accs| {
            let mut a = accs.to_vec();
            g.body(Mode::Scalar, i, 0, stores, reds, &mut a);
            a
        });
        ops.iter()
            .zip(scalars.into_iter().zip(tails))
            .map(|(&(op, t), (s, tl))| self.e.reduce_step(op, t, Mode::Scalar, s, tl))
            .collect()
    }

    /// One element (scalar) or one vector at `i + off`.
    fn body(&mut self, mode: Mode, i: Value, off: i64, stores: &[(usize, Dest)], reds: &[usize], accs: &mut [Value]) {
        self.memo.clear();
        let an = self.an;
        for &(v, d) in stores {
            let t = an.nodes[v].dtype;
            match d {
                Dest::Out(s) => {
                    let x = self.val(v, mode, i, off);
                    self.store(t, mode, self.rowptr[s], i, off, x);
                }
                Dest::Scratch(k) => {
                    let x = self.val(v, mode, i, off);
                    self.store(t, mode, self.scratch_ptrs[k], i, off, x);
                }
                Dest::AccStep(k) => {
                    let LOp::Reduce(op) = an.nodes[v].op else { unreachable!() };
                    let x = self.val(an.nodes[v].inputs[0], mode, i, off);
                    let old = self.load(t, mode, self.scratch_ptrs[k], i, off);
                    let new = self.e.reduce_step(op, t, mode, old, x);
                    self.store(t, mode, self.scratch_ptrs[k], i, off, new);
                }
                Dest::AccInit(k) => {
                    let LOp::Reduce(op) = an.nodes[v].op else { unreachable!() };
                    let id = self.e.identity(op, t, mode);
                    self.store(t, mode, self.scratch_ptrs[k], i, off, id);
                }
            }
        }
        for (j, &r) in reds.iter().enumerate() {
            let LOp::Reduce(op) = an.nodes[r].op else { unreachable!() };
            let x = self.val(an.nodes[r].inputs[0], mode, i, off);
            accs[j] = self.e.reduce_step(op, an.nodes[r].dtype, mode, accs[j], x);
        }
    }

    /// Computes every invariant the loop roots depend on (and its splat).
    fn prepare_invariants(&mut self, roots: &[usize]) {
        let an = self.an;
        let mut seen = HashSet::new();
        let mut need = Vec::new();
        let mut stack: Vec<usize> = roots.to_vec();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) || self.sources.contains_key(&v) {
                continue;
            }
            if !an.nodes[v].varying {
                need.push(v);
                continue;
            }
            stack.extend(an.nodes[v].inputs.iter().copied());
        }
        need.sort_unstable();
        for v in need {
            let s = self.inv_scalar(v);
            if self.vector && !self.splat.contains_key(&v) {
                let t = an.nodes[v].dtype;
                let vty = self.e.ty(t, Mode::Vector);
                let sv = if t == DType::Bool {
                    let lane = vty.lane_type();
                    let wide = self.e.b.ins().uextend(lane, s);
                    let m = self.e.b.ins().ineg(wide);
                    self.e.b.ins().splat(vty, m)
                } else {
                    self.e.b.ins().splat(vty, s)
                };
                self.splat.insert(v, sv);
            }
        }
    }

    /// The scalar value of an invariant node in the current row.
    fn inv_scalar(&mut self, v: usize) -> Value {
        if let Some(&s) = self.inv.get(&v) {
            return s;
        }
        let an = self.an;
        let node = &an.nodes[v];
        let ins: Vec<usize> = node.inputs.to_vec();
        let s = match &node.op {
            LOp::Load(l) => {
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.load(node.dtype, Mode::Scalar, self.rowptr[*l], zero, 0)
            }
            LOp::Const(c) => self.e.kscalar(*c, Mode::Scalar),
            LOp::Reduce(_) => panic!("tracejit-jit bug: reduction n{v} used before its pass"),
            _ => {
                let xs: Vec<Value> = ins.iter().map(|&i| self.inv_scalar(i)).collect();
                self.apply(v, Mode::Scalar, &xs)
            }
        };
        self.inv.insert(v, s);
        s
    }

    /// The value of node `v` at `i + off` in the current loop body.
    fn val(&mut self, v: usize, mode: Mode, i: Value, off: i64) -> Value {
        if let Some(&x) = self.memo.get(&v) {
            return x;
        }
        let an = self.an;
        let node = &an.nodes[v];
        let x = if let Some(src) = self.sources.get(&v).copied() {
            match src {
                Src::Scratch(k) => self.load(node.dtype, mode, self.scratch_ptrs[k], i, off),
                Src::Acc(k, mean) => {
                    let a = self.load(node.dtype, mode, self.scratch_ptrs[k], i, off);
                    if mean {
                        let ty = sty(node.dtype);
                        let c = self.e.b.ins().fcvt_from_sint(ty, self.count);
                        let c = if mode == Mode::Vector {
                            let vty = self.e.ty(node.dtype, mode);
                            self.e.b.ins().splat(vty, c)
                        } else {
                            c
                        };
                        self.e.b.ins().fdiv(a, c)
                    } else {
                        a
                    }
                }
            }
        } else if !node.varying {
            match (mode, &node.op) {
                (Mode::Vector, LOp::Const(c)) if self.heavy => self.e.kscalar_mem(*c),
                (Mode::Scalar, _) => self.inv_scalar(v),
                (Mode::Vector, _) => *self.splat.get(&v).expect("invariants are prepared before the loop"),
            }
        } else {
            match &node.op {
                LOp::Load(l) => self.load(node.dtype, mode, self.rowptr[*l], i, off),
                _ => {
                    let ins: Vec<usize> = node.inputs.to_vec();
                    let xs: Vec<Value> = ins.iter().map(|&j| self.val(j, mode, i, off)).collect();
                    self.apply(v, mode, &xs)
                }
            }
        };
        self.memo.insert(v, x);
        x
    }

    /// Applies node `v`'s op to already computed operands.
    fn apply(&mut self, v: usize, mode: Mode, xs: &[Value]) -> Value {
        let an = self.an;
        let node = &an.nodes[v];
        let in_t = node.inputs.first().map_or(node.dtype, |&i| an.nodes[i].dtype);
        match &node.op {
            LOp::Unary(u) => self.e.unary(*u, in_t, mode, xs[0]),
            LOp::Binary(b) => self.e.binary(*b, in_t, mode, xs[0], xs[1]),
            LOp::Select => self.e.select(xs[0], xs[1], xs[2]),
            LOp::Cast => self.e.cast(in_t, node.dtype, mode, xs[0]),
            LOp::Clamp(lo, hi) => self.e.clamp(node.dtype, mode, xs[0], *lo, *hi),
            LOp::Load(_) | LOp::Const(_) | LOp::Reduce(_) => unreachable!("not an elementwise op"),
        }
    }

    /// Address of element `i + off` of a buffer of `dtype` at `ptr`.
    fn addr(&mut self, dtype: DType, ptr: Value, i: Value) -> Value {
        let shift = dtype.size_of().trailing_zeros();
        let byte = if shift == 0 { i } else { self.e.b.ins().ishl_imm_s(i, i64::from(shift)) };
        self.e.b.ins().iadd(ptr, byte)
    }

    fn load(&mut self, dtype: DType, mode: Mode, ptr: Value, i: Value, off: i64) -> Value {
        let a = self.addr(dtype, ptr, i);
        let size = dtype.size_of() as i64;
        match (mode, dtype) {
            (Mode::Scalar, _) => self.e.b.ins().load(sty(dtype), mem(), a, (off * size) as i32),
            (Mode::Vector, DType::Bool) => {
                let vty = self.e.ty(DType::Bool, mode);
                let mut acc = self.e.kraw(vty, 0);
                for lane in 0..self.w {
                    let byte = self.e.b.ins().load(types::I8, mem(), a, (off + lane) as i32);
                    let wide = self.e.b.ins().uextend(vty.lane_type(), byte);
                    let m = self.e.b.ins().ineg(wide);
                    acc = self.e.b.ins().insertlane(acc, m, lane as u8);
                }
                acc
            }
            (Mode::Vector, _) => {
                let vty = self.e.ty(dtype, mode);
                self.e.b.ins().load(vty, mem(), a, (off * size) as i32)
            }
        }
    }

    fn store(&mut self, dtype: DType, mode: Mode, ptr: Value, i: Value, off: i64, x: Value) {
        let a = self.addr(dtype, ptr, i);
        let size = dtype.size_of() as i64;
        match (mode, dtype) {
            (Mode::Vector, DType::Bool) => {
                for lane in 0..self.w {
                    let l = self.e.b.ins().extractlane(x, lane as u8);
                    let l = self.e.b.ins().band_imm_s(l, 1);
                    let byte = self.e.b.ins().ireduce(types::I8, l);
                    self.e.b.ins().store(mem(), byte, a, (off + lane) as i32);
                }
            }
            _ => {
                self.e.b.ins().store(mem(), x, a, (off * size) as i32);
            }
        }
    }
}
