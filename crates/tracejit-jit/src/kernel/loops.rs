//! The inner loops of a kernel (rotated, unrolled vector loops with a
//! one-vector loop and a scalar tail) and the evaluation of each element:
//! invariants hoisted per row, loads, stores and the element ops of
//! [`crate::clif_ops`].

use std::collections::HashSet;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, BlockArg, InstBuilder, Type, Value};
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp};

use crate::analysis::{LNodeId, LOp};
use crate::clif_ops::{mem, sty, Emit, Mode};
use cranelift_codegen::ir::condcodes::FloatCC;

use super::abi::SlotId;
use super::{Dest, Gen, Src};

impl Gen<'_, '_, '_> {
    /// A rotated loop `for i in (start..limit).step_by(step)` carrying
    /// `carried`; the body may create blocks. Returns the final `i` and the
    /// carried values.
    pub(super) fn rotated_loop(
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
    pub(super) fn inner(&mut self, stores: &[(LNodeId, Dest)], reds: &[LNodeId]) -> Vec<Value> {
        let an = self.an;
        // Invariants used by the loops, computed before them.
        let mut roots: Vec<LNodeId> = Vec::new();
        for &(v, d) in stores {
            match d {
                Dest::AccStep(_) => roots.push(an.nodes[v].inputs[0]),
                Dest::AccInit(_) => {}
                Dest::Out(_) | Dest::Scratch(_) => roots.push(v),
            }
        }
        roots.extend(reds.iter().map(|&r| an.nodes[r].inputs[0]));
        self.prepare_invariants(&roots);

        let ops: Vec<(ReduceOp, DType)> = reds
            .iter()
            .map(|&r| {
                let LOp::Reduce(op) = an.nodes[r].op else { unreachable!("reds lists reductions") };
                (op, an.nodes[r].dtype)
            })
            .collect();
        // Float max/min take the NaN-blind one-instruction step in the
        // vector loops and note NaNs aside (see `nan_guarded`).
        let guarded: Vec<bool> = ops.iter().map(|&(op, t)| self.vector && nan_guarded(op, t)).collect();
        let zero = self.e.b.ins().iconst(types::I64, 0);
        let (i, scalars, any_nan) = if self.vector {
            self.vector_loops(stores, reds, &ops, &guarded, zero)
        } else {
            let scalars = ops.iter().map(|&(op, t)| self.e.identity(op, t, Mode::Scalar)).collect();
            (zero, scalars, vec![None; ops.len()])
        };
        let n = self.n;
        // The scalar tail accumulates separately and is folded in last.
        let tail_init: Vec<Value> = ops.iter().map(|&(op, t)| self.e.identity(op, t, Mode::Scalar)).collect();
        let (_, tails) = self.rotated_loop(i, n, 1, tail_init, |g, i, accs| {
            let mut a = accs.to_vec();
            let mut nan = vec![None; a.len()];
            g.body(Mode::Scalar, i, 0, stores, reds, &mut a, &mut nan);
            a
        });
        let results: Vec<Value> = ops
            .iter()
            .zip(scalars.into_iter().zip(tails))
            .map(|(&(op, t), (s, tl))| self.e.reduce_step(op, t, Mode::Scalar, s, tl))
            .collect();
        results
            .into_iter()
            .enumerate()
            .map(|(j, r)| match any_nan[j] {
                Some(flag) => self.rescan_if(flag, reds[j], r),
                None => r,
            })
            .collect()
    }

    /// The vector loops of [`Self::inner`]: the unrolled main loop from
    /// `zero`, its accumulators combined, the one-vector loop, and the
    /// lanes folded to scalars. Returns where the scalar tail starts, one
    /// scalar per reduction, and per NaN-guarded one its "a NaN was seen"
    /// flag.
    fn vector_loops(
        &mut self,
        stores: &[(LNodeId, Dest)],
        reds: &[LNodeId],
        ops: &[(ReduceOp, DType)],
        guarded: &[bool],
        zero: Value,
    ) -> (Value, Vec<Value>, Vec<Option<Value>>) {
        let u = self.unroll as usize;
        let w = self.w;
        let mut init: Vec<Value> = Vec::new();
        for &(op, t) in ops {
            let id = self.e.identity(op, t, Mode::Vector);
            init.extend(std::iter::repeat_n(id, u));
        }
        let mut masks = 0;
        for (j, &(op, t)) in ops.iter().enumerate() {
            if guarded[j] {
                // An all-false lane mask of the comparison's type.
                let id = self.e.identity(op, t, Mode::Vector);
                let none = self.e.fcmp(FloatCC::Unordered, id, id);
                init.extend(std::iter::repeat_n(none, u));
                masks += 1;
            }
        }
        let nops = ops.len();
        // Carried: `nops × u` accumulators, then `masks × u` NaN masks.
        let split = |accs: &[Value], k: usize| -> (Vec<Value>, Vec<Option<Value>>) {
            let mut m = 0;
            let a = (0..nops).map(|j| accs[j * u + k]).collect();
            let nan = (0..nops)
                .map(|j| {
                    guarded[j].then(|| {
                        m += 1;
                        accs[(nops + m - 1) * u + k]
                    })
                })
                .collect();
            (a, nan)
        };
        let n_main = self.n_main;
        let (i1, accs) = self.rotated_loop(zero, n_main, w * u as i64, init, |g, i, accs| {
            let mut accs = accs.to_vec();
            for k in 0..u {
                let (mut a, mut nan) = split(&accs, k);
                g.body(Mode::Vector, i, k as i64 * w, stores, reds, &mut a, &mut nan);
                let mut m = 0;
                for j in 0..nops {
                    accs[j * u + k] = a[j];
                    if let Some(v) = nan[j] {
                        accs[(nops + m) * u + k] = v;
                        m += 1;
                    }
                }
            }
            accs
        });
        let comb = self.combine_unrolled(&accs, ops, masks);
        let n_vec = self.n_vec;
        let (i2, vaccs) = self.rotated_loop(i1, n_vec, w, comb, |g, i, accs| {
            let mut a = accs[..nops].to_vec();
            let mut m = 0;
            let mut nan: Vec<Option<Value>> = (0..nops)
                .map(|j| {
                    guarded[j].then(|| {
                        m += 1;
                        accs[nops + m - 1]
                    })
                })
                .collect();
            g.body(Mode::Vector, i, 0, stores, reds, &mut a, &mut nan);
            a.extend(nan.into_iter().flatten());
            a
        });
        let (scalars, any_nan) = self.lanes_to_scalars(&vaccs, ops, guarded);
        (i2, scalars, any_nan)
    }

    /// The main loop's `u` unrolled accumulators per reduction (NaN-free
    /// where guarded) combined in a fixed order, then its NaN masks or-ed.
    fn combine_unrolled(&mut self, accs: &[Value], ops: &[(ReduceOp, DType)], masks: usize) -> Vec<Value> {
        let (u, nops) = (self.unroll as usize, ops.len());
        // The unrolled accumulators (NaN-free where guarded) combined in
        // a fixed order; the masks or-ed.
        let mut comb = Vec::new();
        for (j, &(op, t)) in ops.iter().enumerate() {
            let mut acc = accs[j * u];
            for k in 1..u {
                acc = self.e.reduce_step(op, t, Mode::Vector, acc, accs[j * u + k]);
            }
            comb.push(acc);
        }
        for m in 0..masks {
            let mut acc = accs[(nops + m) * u];
            for k in 1..u {
                acc = self.e.or(acc, accs[(nops + m) * u + k]);
            }
            comb.push(acc);
        }
        comb
    }

    /// The one-vector loop's accumulators folded lane by lane into one
    /// scalar per reduction, and each guarded reduction's NaN mask reduced
    /// to a flag.
    fn lanes_to_scalars(
        &mut self,
        vaccs: &[Value],
        ops: &[(ReduceOp, DType)],
        guarded: &[bool],
    ) -> (Vec<Value>, Vec<Option<Value>>) {
        let (w, nops) = (self.w, ops.len());
        let mut scalars = Vec::new();
        for (j, &(op, t)) in ops.iter().enumerate() {
            let mut s = self.e.b.ins().extractlane(vaccs[j], 0);
            for lane in 1..w {
                let l = self.e.b.ins().extractlane(vaccs[j], lane as u8);
                s = self.e.reduce_step(op, t, Mode::Scalar, s, l);
            }
            scalars.push(s);
        }
        let mut m = 0;
        let any_nan: Vec<Option<Value>> = (0..nops)
            .map(|j| {
                guarded[j].then(|| {
                    m += 1;
                    self.e.b.ins().vany_true(vaccs[nops + m - 1])
                })
            })
            .collect();
        (scalars, any_nan)
    }

    /// `fast` unless `flag` (a NaN was seen): then the reduction `red`
    /// computed again over the row by the exact scalar step in element
    /// order — the reference's result, NaN and all.
    fn rescan_if(&mut self, flag: Value, red: LNodeId, fast: Value) -> Value {
        let LOp::Reduce(op) = self.an.nodes[red].op else { unreachable!("a guarded reduction") };
        let t = self.an.nodes[red].dtype;
        let ty = self.e.b.func.dfg.value_type(fast);
        let slow_blk = self.e.b.create_block();
        let join_blk = self.e.b.create_block();
        self.e.b.append_block_param(join_blk, ty);
        self.e.b.ins().brif(flag, slow_blk, &[], join_blk, &[BlockArg::Value(fast)]);
        self.e.b.switch_to_block(slow_blk);
        let zero = self.e.b.ins().iconst(types::I64, 0);
        let id = self.e.identity(op, t, Mode::Scalar);
        let n = self.n;
        let (_, exact) = self.rotated_loop(zero, n, 1, vec![id], |g, i, accs| {
            let mut a = accs.to_vec();
            g.body(Mode::Scalar, i, 0, &[], &[red], &mut a, &mut [None]);
            a
        });
        self.e.b.ins().jump(join_blk, &[BlockArg::Value(exact[0])]);
        self.e.b.switch_to_block(join_blk);
        self.e.b.block_params(join_blk)[0]
    }

    /// One element (scalar) or one vector at `i + off`. `nan` holds, for a
    /// NaN-guarded reduction in a vector loop, its NaN lane mask (see
    /// `nan_guarded`), else `None`.
    #[allow(clippy::too_many_arguments)] // the loop state, passed apart from `self` for the borrow checker
    pub(super) fn body(
        &mut self,
        mode: Mode,
        i: Value,
        off: i64,
        stores: &[(LNodeId, Dest)],
        reds: &[LNodeId],
        accs: &mut [Value],
        nan: &mut [Option<Value>],
    ) {
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
            match nan[j] {
                Some(seen) => {
                    let is_nan = self.e.fcmp(FloatCC::Unordered, x, x);
                    nan[j] = Some(self.e.or(seen, is_nan));
                    accs[j] = self.nan_blind_step(op, accs[j], x);
                }
                None => accs[j] = self.e.reduce_step(op, an.nodes[r].dtype, mode, accs[j], x),
            }
        }
    }

    /// `x` if it is greater (max) or less (min) than `acc`, else `acc`: one
    /// `maxps`/`minps`, keeping `acc` on ties like the exact step. A NaN
    /// `x` is dropped (the caller notes it aside).
    fn nan_blind_step(&mut self, op: ReduceOp, acc: Value, x: Value) -> Value {
        // Operands in the order Cranelift matches to `maxps x, acc` /
        // `minps x, acc` (a `<` compare selecting between the same values).
        let m = match op {
            ReduceOp::Max => self.e.fcmp(FloatCC::LessThan, acc, x),
            ReduceOp::Min => self.e.fcmp(FloatCC::LessThan, x, acc),
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod => unreachable!("only max and min are NaN-guarded"),
        };
        self.e.sel(m, x, acc)
    }

    /// Computes every invariant the loop roots depend on (and its splat).
    pub(super) fn prepare_invariants(&mut self, roots: &[LNodeId]) {
        let an = self.an;
        let mut seen = HashSet::new();
        let mut need = Vec::new();
        let mut stack: Vec<LNodeId> = roots.to_vec();
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
    pub(super) fn inv_scalar(&mut self, v: LNodeId) -> Value {
        if let Some(&s) = self.inv.get(&v) {
            return s;
        }
        let an = self.an;
        let node = &an.nodes[v];
        let ins: Vec<LNodeId> = node.inputs.to_vec();
        let s = match &node.op {
            LOp::Load(l) => {
                let zero = self.e.b.ins().iconst(types::I64, 0);
                self.load(node.dtype, Mode::Scalar, self.rowptr[SlotId::of_load(*l)], zero, 0)
            }
            LOp::Const(c) => self.e.kscalar(*c, Mode::Scalar),
            LOp::Reduce(_) => panic!("tracejit-jit bug: reduction {v} used before its pass"),
            LOp::Unary(_) | LOp::Binary(_) | LOp::Select | LOp::Cast | LOp::Clamp(..) => {
                let xs: Vec<Value> = ins.iter().map(|&i| self.inv_scalar(i)).collect();
                self.apply(v, Mode::Scalar, &xs)
            }
        };
        self.inv.insert(v, s);
        s
    }

    /// The value of node `v` at `i + off` in the current loop body.
    pub(super) fn val(&mut self, v: LNodeId, mode: Mode, i: Value, off: i64) -> Value {
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
            if let LOp::Load(l) = &node.op {
                self.load(node.dtype, mode, self.rowptr[SlotId::of_load(*l)], i, off)
            } else {
                let ins: Vec<LNodeId> = node.inputs.to_vec();
                let by_recip = if node.op == LOp::Binary(BinaryOp::Div) && self.recip.contains_key(&ins[1]) {
                    let x = self.val(ins[0], mode, i, off);
                    self.divide_by_reciprocal(ins[1], mode, x)
                } else {
                    None
                };
                match by_recip {
                    Some(q) => q,
                    None => {
                        let xs: Vec<Value> = ins.iter().map(|&j| self.val(j, mode, i, off)).collect();
                        self.apply(v, mode, &xs)
                    }
                }
            }
        };
        self.memo.insert(v, x);
        x
    }

    /// Applies node `v`'s op to already computed operands.
    pub(super) fn apply(&mut self, v: LNodeId, mode: Mode, xs: &[Value]) -> Value {
        let an = self.an;
        let node = &an.nodes[v];
        let in_t = node.inputs.first().map_or(node.dtype, |&i| an.nodes[i].dtype);
        // A narrow integer computes in its compute dtype (it is held as that
        // dtype's value) and an arithmetic result wraps back to its width; a
        // cast wraps or saturates itself, and a select or a clamp of values
        // in range stays in range.
        let y = match &node.op {
            LOp::Unary(u) => self.e.unary(*u, in_t.compute(), mode, xs[0]),
            LOp::Binary(b) => self.e.binary(*b, in_t.compute(), mode, xs[0], xs[1]),
            LOp::Select => return self.e.select(xs[0], xs[1], xs[2]),
            LOp::Cast => return self.e.cast(in_t, node.dtype, mode, xs[0]),
            LOp::Clamp(lo, hi) => return self.e.clamp(node.dtype.compute(), mode, xs[0], *lo, *hi),
            LOp::Load(_) | LOp::Const(_) | LOp::Reduce(_) => unreachable!("not an elementwise op"),
        };
        self.e.wrap(node.dtype, mode, y)
    }

    /// Address of element `i + off` of a buffer of `dtype` at `ptr`.
    pub(super) fn addr(&mut self, dtype: DType, ptr: Value, i: Value) -> Value {
        let shift = dtype.size_of().trailing_zeros();
        let byte = if shift == 0 { i } else { self.e.b.ins().ishl_imm_s(i, i64::from(shift)) };
        self.e.b.ins().iadd(ptr, byte)
    }

    pub(super) fn load(&mut self, dtype: DType, mode: Mode, ptr: Value, i: Value, off: i64) -> Value {
        let a = self.addr(dtype, ptr, i);
        let size = dtype.size_of() as i64;
        if dtype.is_narrow_int() {
            return self.load_narrow(dtype, mode, a, off * size);
        }
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

    pub(super) fn store(&mut self, dtype: DType, mode: Mode, ptr: Value, i: Value, off: i64, x: Value) {
        let a = self.addr(dtype, ptr, i);
        let size = dtype.size_of() as i64;
        if dtype.is_narrow_int() {
            return self.store_narrow(dtype, mode, a, off * size, x);
        }
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

impl Gen<'_, '_, '_> {
    /// A narrow integer at byte `at` past `a`, sign- or zero-extended to
    /// its compute dtype (lane by lane in a vector: x86 has no 4-lane
    /// widening load from bytes).
    fn load_narrow(&mut self, dtype: DType, mode: Mode, a: Value, at: i64) -> Value {
        let ty = sty(dtype);
        let one = |e: &mut Emit<'_, '_>, at: i64| -> Value {
            let b = e.b.ins();
            match dtype {
                DType::I8 => b.sload8(ty, mem(), a, at as i32),
                DType::U8 => b.uload8(ty, mem(), a, at as i32),
                DType::I16 => b.sload16(ty, mem(), a, at as i32),
                DType::U16 => b.uload16(ty, mem(), a, at as i32),
                DType::U32 => b.uload32(mem(), a, at as i32),
                _ => unreachable!("{dtype} is not a narrow integer"),
            }
        };
        match mode {
            Mode::Scalar => one(&mut self.e, at),
            Mode::Vector => {
                let vty = self.e.ty(dtype, mode);
                let size = dtype.size_of() as i64;
                let mut acc = self.e.kraw(vty, 0);
                for lane in 0..self.w {
                    let x = one(&mut self.e, at + lane * size);
                    acc = self.e.b.ins().insertlane(acc, x, lane as u8);
                }
                acc
            }
        }
    }

    /// Stores the low bits of `x` (a narrow integer held as its compute
    /// dtype's value) at byte `at` past `a`.
    fn store_narrow(&mut self, dtype: DType, mode: Mode, a: Value, at: i64, x: Value) {
        let one = |e: &mut Emit<'_, '_>, v: Value, at: i64| {
            let b = e.b.ins();
            match dtype.size_of() {
                1 => b.istore8(mem(), v, a, at as i32),
                2 => b.istore16(mem(), v, a, at as i32),
                _ => b.istore32(mem(), v, a, at as i32),
            };
        };
        match mode {
            Mode::Scalar => one(&mut self.e, x, at),
            Mode::Vector => {
                let size = dtype.size_of() as i64;
                for lane in 0..self.w {
                    let v = self.e.b.ins().extractlane(x, lane as u8);
                    one(&mut self.e, v, at + lane * size);
                }
            }
        }
    }
}

/// Whether a vector reduction by `op` over `t` takes the NaN-blind step
/// (one `maxps`/`minps` instead of the exact step's compare, compare, or
/// and select) with NaNs noted in a lane mask: float max and min, whose
/// exact step made a row max about three times slower than a row sum
/// (W3's first pass). A row that holds a NaN is reduced again by the
/// exact step, in order.
fn nan_guarded(op: ReduceOp, t: DType) -> bool {
    t.is_float()
        && match op {
            ReduceOp::Max | ReduceOp::Min => true,
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod => false,
        }
}
