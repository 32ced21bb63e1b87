//! Code generation of a whole region kernel: the loop structure around the
//! element ops of [`crate::clif_ops`]. The argument block is described in
//! [`abi`], which values live in scratch buffers is decided in [`schedule`]
//! before emission, and the inner loops and per-element evaluation are in
//! `loops`.
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
//!   With staged nodes (f32 `exp`/`tanh`/`sigmoid` computed by the vector
//!   functions of `crate::chunks`), the row is processed in chunks: per
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
//!   recomputed. The final loop multiplies by the reciprocal of a row
//!   invariant it divides by (softmax's sum), in a second version of the
//!   loop chosen per row when that reciprocal is a normal number (`recip`).
//! - **Column** reductions: accumulators live in scratch buffers of `n`
//!   elements; flag bit 0 initializes them, every row adds into them in order
//!   (exactly the reference's summation order), flag bit 1 runs the epilogue
//!   that writes the kept-size outputs.

use cranelift_entity::PrimaryMap;
use std::collections::HashMap;

use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::immediates::Imm64;
use cranelift_codegen::ir::{
    types, AbiParam, ExtFuncData, ExternalName, FuncRef, GlobalValueData, InstBuilder, Signature, UserExternalName,
    Value,
};
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::{Context, FinalizedRelocTarget};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use tracejit_ir::tensor::ReduceOp;

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp};
use crate::clif_ops::{mem, sty, Emit, Mode};
use crate::code_image::{CodeImage, CodeReloc, KERNEL_CONSTS};
use crate::helpers::Helper;
use crate::options::JitOptions;

pub(crate) mod abi;
mod loops;
mod recip;
mod scratch_plan;

use abi::{SlotId, ARG_COUNT, ARG_FLAGS, ARG_N, ARG_ROWS, ARG_SCRATCH};
pub(crate) use abi::{ARG_SLOTS, FLAG_FINAL, FLAG_INIT};
use scratch_plan::{is_heavy, lane_bits, ScratchId, Staged};
pub(crate) use scratch_plan::{schedule, Schedule};

/// Compiles the kernel of `an` for `isa` into a relocatable [`CodeImage`]:
/// helper and chunk functions are imported by name (user external names
/// indexing the image's symbol list), vector constants go to the kernel's
/// own table ([`crate::const_table`]).
pub(crate) fn build(
    an: &Analysis,
    sch: &Schedule,
    opts: &JitOptions,
    isa: &dyn TargetIsa,
    ctx: &mut Context,
    fctx: &mut FunctionBuilderContext,
) -> Result<CodeImage, String> {
    let ptr = isa.pointer_type();
    let call_conv = isa.default_call_conv();
    let mut sig = Signature::new(call_conv);
    sig.params.push(AbiParam::new(ptr));
    ctx.func.signature = sig;

    // Every helper is imported: an unused import costs nothing, and which
    // ops call a helper is the lowering's decision alone.
    let mut imports: Vec<(&'static str, Signature)> = Vec::new();
    for h in Helper::ALL {
        let mut hs = Signature::new(call_conv);
        hs.params.push(AbiParam::new(types::I32));
        for _ in 0..h.arity() {
            hs.params.push(AbiParam::new(sty(h.dtype())));
        }
        hs.returns.push(AbiParam::new(sty(h.dtype())));
        imports.push((h.name(), hs));
    }
    for &Staged { op, .. } in &sch.staged {
        let (fname, _) = crate::chunks::chunk_fn(op, opts).ok_or("a staged op lost its chunk function")?;
        let mut cs = Signature::new(call_conv);
        cs.params.push(AbiParam::new(ptr));
        cs.params.push(AbiParam::new(types::I64));
        imports.push((fname, cs));
    }
    // Symbol `i` of the image is user external name `i`; the constant
    // table's symbol comes last.
    let mut names: Vec<&'static str> = imports.iter().map(|(n, _)| *n).collect();
    names.push(KERNEL_CONSTS);

    let vector_bits = lane_bits(an);
    let table = {
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        let mut refs: Vec<FuncRef> = Vec::new();
        for (i, (_, s)) in imports.into_iter().enumerate() {
            let signature = b.import_signature(s);
            let name = b.func.declare_imported_user_function(UserExternalName { namespace: 0, index: i as u32 });
            refs.push(b.import_function(ExtFuncData {
                name: ExternalName::user(name),
                signature,
                colocated: false,
                patchable: false,
            }));
        }
        let table_name =
            b.func.declare_imported_user_function(UserExternalName { namespace: 0, index: (names.len() - 1) as u32 });
        let consts_symbol = b.create_global_value(GlobalValueData::Symbol {
            name: ExternalName::user(table_name),
            offset: Imm64::new(0),
            colocated: false,
            tls: false,
        });
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
        let mut base: PrimaryMap<SlotId, Value> = PrimaryMap::with_capacity(nslots);
        let mut rstride: PrimaryMap<SlotId, Value> = PrimaryMap::with_capacity(nslots);
        for s in 0..nslots {
            let off = ((ARG_SLOTS + 2 * s) * 8) as i32;
            base.push(ld(&mut b, off));
            rstride.push(ld(&mut b, off + 8));
        }
        let w = i64::from(vector_bits.map_or(1, |bits| 128 / bits));
        let unroll: i64 = match opts.unroll {
            Some(u) => i64::from(u),
            None if is_heavy(an) => 2,
            None => 4,
        };
        let n_main = round_down(&mut b, n, w * unroll);
        let n_vec = round_down(&mut b, n, w);
        let mut scratch_ptrs: PrimaryMap<ScratchId, Value> = PrimaryMap::new();
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

        let mut e = Emit::new(&mut b, term, vector_bits.unwrap_or(32), consts_symbol);
        for (h, fref) in Helper::ALL.iter().zip(&refs) {
            e.helpers.insert(*h, *fref);
        }
        let chunk_fns: Vec<FuncRef> = refs[Helper::ALL.len()..].to_vec();
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
            recip: HashMap::new(),
            chunk_fns,
        };
        g.emit(rows, flags);
        g.e.b.ins().return_(&[]);
        let table = std::mem::take(&mut g.e.table);
        drop(g);
        b.seal_all_blocks();
        b.finalize(isa.frontend_config());
        table
    };
    image_of(an, opts, isa, ctx, &names, table.into_patterns())
}

/// Compiles the function built in `ctx` and takes its code, constants and
/// relocations (each named by `names[i]` for user external name `i`, or
/// by a Cranelift library call's name).
fn image_of(
    an: &Analysis,
    opts: &JitOptions,
    isa: &dyn TargetIsa,
    ctx: &mut Context,
    names: &[&str],
    consts: Vec<u128>,
) -> Result<CodeImage, String> {
    if opts.dump {
        ctx.set_disasm(true);
        eprintln!("== kernel {}\n{}", an.key, ctx.func.display());
    }
    // Import `i`'s name, by user external name reference (the function's
    // parameters are out of reach while its compiled code is borrowed).
    let user_names: HashMap<_, usize> =
        ctx.func.params.user_named_funcs().iter().map(|(r, n)| (r, n.index as usize)).collect();
    let compiled = ctx.compile(isa, &mut ControlPlane::default()).map_err(|e| format!("{:?}", e.inner))?;
    if opts.dump {
        if let Some(code) = &compiled.vcode {
            eprintln!("== machine code\n{code}");
        }
    }
    let mut relocs = Vec::new();
    for r in compiled.buffer.relocs() {
        let symbol = match &r.target {
            FinalizedRelocTarget::ExternalName(ExternalName::User(u)) => {
                let index = user_names.get(u).ok_or("a relocation names no import")?;
                names.get(*index).ok_or("a relocation names no import")?.to_string()
            }
            FinalizedRelocTarget::ExternalName(ExternalName::LibCall(lc)) => lc.to_string(),
            other => return Err(format!("unexpected relocation target {other:?}")),
        };
        if r.kind != Reloc::Abs8 || r.addend != 0 {
            return Err(format!("unexpected relocation {:?} + {} to `{symbol}`", r.kind, r.addend));
        }
        relocs.push(CodeReloc { offset: r.offset, symbol });
    }
    relocs.sort_by_key(|r| r.offset);
    let image = CodeImage { code: compiled.code_buffer().to_vec(), align: compiled.buffer.alignment, consts, relocs };
    ctx.clear();
    Ok(image)
}

/// `n` rounded down to a multiple of `step` (a power of two), as
/// `n - (n & (step - 1))`: Cranelift rematerializes an `and` with a
/// constant in every block that uses it, so the plain `n & -step` was
/// recomputed (two instructions) in every iteration of the loop it bounds.
fn round_down(b: &mut FunctionBuilder<'_>, n: Value, step: i64) -> Value {
    let rem = b.ins().band_imm_s(n, step - 1);
    b.ins().isub(n, rem)
}

/// Where a loop reads a node from instead of computing it.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// A materialized row value.
    Scratch(ScratchId),
    /// A column accumulator (`true`: divide by `count`, for `mean`).
    Acc(ScratchId, bool),
}

/// What a loop does with a node's value.
#[derive(Clone, Copy, Debug)]
enum Dest {
    /// Store into slot `s` (an output).
    Out(SlotId),
    /// Store into scratch buffer `k`.
    Scratch(ScratchId),
    /// Column: `acc[k] = acc[k] (op) value(input)` for the reduce node.
    AccStep(ScratchId),
    /// Column: `acc[k] = identity` for the reduce node.
    AccInit(ScratchId),
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
    scratch_ptrs: PrimaryMap<ScratchId, Value>,
    base: PrimaryMap<SlotId, Value>,
    rstride: PrimaryMap<SlotId, Value>,
    /// Current row pointer of each slot.
    rowptr: PrimaryMap<SlotId, Value>,
    /// Invariant scalars of the current context (row).
    inv: HashMap<LNodeId, Value>,
    /// Their splats.
    splat: HashMap<LNodeId, Value>,
    sources: HashMap<LNodeId, Src>,
    memo: HashMap<LNodeId, Value>,
    /// Reciprocals (scalar, splat) of invariant divisors in the loop version
    /// being emitted (see `recip`).
    recip: HashMap<LNodeId, (Value, Option<Value>)>,
    /// The chunk functions of `sch.staged`, in order.
    chunk_fns: Vec<FuncRef>,
}

impl Gen<'_, '_, '_> {
    fn out_slot(&self, o: usize) -> SlotId {
        SlotId::of_output(self.an.loads.len(), o)
    }

    fn emit(&mut self, rows: Value, flags: Value) {
        match self.an.kind {
            KernelKind::Elementwise => {
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.rotated_loop(zero, rows, 1, vec![], |g, r, _| {
                    g.enter_row(r);
                    let stores: Vec<(LNodeId, Dest)> =
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
                    let stores: Vec<(LNodeId, Dest)> =
                        g.sch_acc().into_iter().map(|(r, k)| (r, Dest::AccInit(k))).collect();
                    g.inner(&stores, &[]);
                });
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.rotated_loop(zero, rows, 1, vec![], |g, r, _| {
                    g.enter_row(r);
                    let mut stores: Vec<(LNodeId, Dest)> =
                        g.sch_acc().into_iter().map(|(r, k)| (r, Dest::AccStep(k))).collect();
                    for (o, out) in g.an.outputs.iter().enumerate() {
                        if !out.kept {
                            stores.push((out.node, Dest::Out(g.out_slot(o))));
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
                    let stores: Vec<(LNodeId, Dest)> =
                        g.an.outputs
                            .iter()
                            .enumerate()
                            .filter(|(_, o)| o.kept)
                            .map(|(o, out)| (out.node, Dest::Out(g.out_slot(o))))
                            .collect();
                    g.inner(&stores, &[]);
                    g.sources.clear();
                });
            }
        }
    }

    fn sch_acc(&self) -> Vec<(LNodeId, ScratchId)> {
        let mut v: Vec<(LNodeId, ScratchId)> = self.sch.acc.iter().map(|(&r, &k)| (r, k)).collect();
        v.sort_unstable();
        v
    }

    /// One row of an elementwise kernel with staged nodes, in chunks of
    /// `sch.chunk` elements: for each staged node, a loop stores its
    /// argument into its scratch chunk and the chunk function replaces it by
    /// the result; then the outputs' loop reads staged values from scratch.
    fn staged_row(&mut self, stores: &[(LNodeId, Dest)]) {
        let an = self.an;
        let chunk = self.sch.chunk as i64;
        let (n_row, n_main_row, n_vec_row) = (self.n, self.n_main, self.n_vec);
        let row = self.rowptr.clone();
        // Slots read or written along the inner loop move with the chunk;
        // the others (read once per row) stay.
        let step: Vec<Option<i64>> = an
            .loads
            .values()
            .map(|load| load.contig.then(|| load.dtype.size_of() as i64))
            .chain(an.outputs.iter().map(|o| Some(o.dtype.size_of() as i64)))
            .collect();
        let zero = self.e.b.ins().iconst(types::I64, 0);
        let vec_step = self.w * self.unroll;
        let w = self.w;
        self.rotated_loop(zero, n_row, chunk, vec![], |g, c, _| {
            let rem = g.e.b.ins().isub(n_row, c);
            let len = g.e.b.ins().iconst(types::I64, chunk);
            let len = g.e.b.ins().smin(rem, len);
            g.n = len;
            g.n_main = round_down(g.e.b, len, vec_step);
            g.n_vec = round_down(g.e.b, len, w);
            let mut moved = PrimaryMap::with_capacity(row.len());
            for ((_, &p), st) in row.iter().zip(&step) {
                moved.push(match st {
                    Some(size) => {
                        let off = g.e.b.ins().imul_imm_s(c, *size);
                        g.e.b.ins().iadd(p, off)
                    }
                    None => p,
                });
            }
            g.rowptr = moved;
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
            self.inner(&[(arg, Dest::Scratch(st.scratch))], &[]);
            let (f, ptr) = (self.chunk_fns[k], self.scratch_ptrs[st.scratch]);
            self.e.b.ins().call(f, &[ptr, len]);
            self.sources.insert(st.node, Src::Scratch(st.scratch));
        }
    }

    /// True when `v` is computed by a chunk function in pass `pass` (its
    /// scratch buffer is already filled).
    fn staged_in(&self, v: LNodeId, pass: u32) -> bool {
        self.sch.staged.iter().any(|st| st.node == v && st.pass == pass)
    }

    /// Sets the row pointers for row `r` and forgets per-row invariants.
    fn enter_row(&mut self, r: Value) {
        self.inv.clear();
        self.splat.clear();
        let mut rowptr = PrimaryMap::with_capacity(self.base.len());
        for (s, &base) in self.base.iter() {
            let off = self.e.b.ins().imul(r, self.rstride[s]);
            rowptr.push(self.e.b.ins().iadd(base, off));
        }
        self.rowptr = rowptr;
    }

    /// The passes of one row of a row-reduction region.
    fn row_passes(&mut self) {
        let an = self.an;
        for p in 1..=an.passes {
            let reds: Vec<LNodeId> = an
                .nodes
                .iter()
                .filter(|(_, n)| matches!(n.op, LOp::Reduce(_)) && n.stage == p)
                .map(|(i, _)| i)
                .collect();
            let stores: Vec<(LNodeId, Dest)> = self
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
        let stores: Vec<(LNodeId, Dest)> = an
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.kept)
            .map(|(o, out)| (out.node, Dest::Out(self.out_slot(o))))
            .collect();
        if !stores.is_empty() {
            self.inner_dividing(&stores);
        }
        self.sources.clear();
        // Kept-size outputs: once per row.
        let kept: Vec<(LNodeId, SlotId)> = an
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.kept)
            .map(|(o, out)| (out.node, self.out_slot(o)))
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
}
