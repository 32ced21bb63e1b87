//! Lowering of one elementwise operation to Cranelift instructions, in scalar
//! or vector form, with the exact semantics of the reference kernels.
//!
//! Representation: a scalar value is `f32`/`f64`/`i32`/`i64`, a bool is an
//! `i8` holding 0 or 1. A vector value is `f32x4`/`i32x4` (the 32-bit lane
//! class) or `f64x2`/`i64x2` (the 64-bit class), and a bool vector is a lane
//! mask of that class's width (all ones or all zeros per lane). A kernel
//! mixes one lane class only (mixed-width kernels run scalar loops).
//!
//! Exactness: every op here computes bit for bit what the reference does,
//! except for NaN payloads (which NaN comes out when several meet is not
//! specified) and the five approximated functions of [`crate::math`]. Ops
//! without a vector instruction (integer division, `rem`, `pow`, and the
//! functions computed by Rust helpers) are *scalarized*: each lane is
//! extracted, computed by the scalar lowering and inserted back. Constants
//! are hoisted into the entry block so loops never rematerialize them.

use std::collections::HashMap;

use cranelift_codegen::cursor::{Cursor, FuncCursor};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{types, FuncRef, GlobalValue, Inst, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::analysis::Scalar;
use crate::helpers::{self, Helper};

/// Scalar or vector emission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One element.
    Scalar,
    /// One 128-bit vector of the kernel's lane class.
    Vector,
}

/// Memory flags of every data access: in bounds by construction, no
/// alignment claimed.
pub(crate) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

fn le() -> MemFlagsData {
    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

/// The emission state shared by every loop of one kernel function.
pub(crate) struct Emit<'a, 'b> {
    /// The function being built.
    pub b: &'a mut FunctionBuilder<'b>,
    /// The entry block's terminator: hoisted constants go right before it.
    pub entry_term: Inst,
    /// Lane width in bits of vector mode (32 or 64).
    pub lane_bits: u32,
    consts: HashMap<(Type, u64), Value>,
    /// Helper functions declared in this function.
    pub helpers: HashMap<Helper, FuncRef>,
    /// The index of the loop being emitted, if any (see [`Emit::kmem`]).
    pub loop_index: Option<Value>,
    /// The symbol of this kernel's vector constant table
    /// ([`crate::code_image::KERNEL_CONSTS`]).
    pub(crate) consts_symbol: GlobalValue,
    /// Its address, once a constant was read (hoisted into the entry block).
    pub(crate) consts_base: Option<Value>,
    /// The patterns [`Emit::kmem`] read.
    pub table: crate::const_table::ConstTable,
}

impl<'a, 'b> Emit<'a, 'b> {
    /// A new emitter; `entry_term` must be the entry block's last instruction.
    /// `consts_symbol` is the global value of the kernel's constant table.
    pub fn new(b: &'a mut FunctionBuilder<'b>, entry_term: Inst, lane_bits: u32, consts_symbol: GlobalValue) -> Self {
        Emit {
            b,
            entry_term,
            lane_bits,
            consts: HashMap::new(),
            helpers: HashMap::new(),
            loop_index: None,
            consts_symbol,
            consts_base: None,
            table: Default::default(),
        }
    }

    /// Number of lanes of a vector in this kernel.
    pub fn lanes(&self) -> u32 {
        128 / self.lane_bits
    }

    /// The Cranelift type of a value of `dtype` in `mode`.
    pub fn ty(&self, dtype: DType, mode: Mode) -> Type {
        match mode {
            Mode::Scalar => sty(dtype),
            Mode::Vector => match (dtype, self.lane_bits) {
                (DType::F32, _) => types::F32X4,
                (DType::F64, _) => types::F64X2,
                (DType::I32, _) => types::I32X4,
                (DType::I64, _) => types::I64X2,
                (DType::Bool, 32) => types::I32X4,
                (DType::Bool, _) => types::I64X2,
                // A narrow integer is held as its compute dtype's value.
                (DType::I8 | DType::U8 | DType::I16 | DType::U16, _) => types::I32X4,
                (DType::U32, _) => types::I64X2,
                (DType::BF16 | DType::F16 | DType::U64, _) => {
                    unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
                }
            },
        }
    }

    // ---------------------------------------------------------------
    // constants
    // ---------------------------------------------------------------

    /// A constant of type `ty` (scalar or vector, splatted) from raw lane
    /// bits, hoisted into the entry block and shared.
    pub fn kraw(&mut self, ty: Type, bits: u64) -> Value {
        if let Some(&v) = self.consts.get(&(ty, bits)) {
            return v;
        }
        let lane = ty.lane_type();
        let mut pos = FuncCursor::new(self.b.func).at_inst(self.entry_term);
        let s = match lane {
            types::F32 => pos.ins().f32const(Ieee32::with_bits(bits as u32)),
            types::F64 => pos.ins().f64const(Ieee64::with_bits(bits)),
            t => {
                let masked = if t.bits() >= 64 { bits } else { bits & ((1u64 << t.bits()) - 1) };
                pos.ins().iconst(t, masked as i64)
            }
        };
        let v = if ty.is_vector() { pos.ins().splat(ty, s) } else { s };
        self.consts.insert((ty, bits), v);
        v
    }

    /// A float constant of `dtype` in `mode`.
    pub fn kf(&mut self, dtype: DType, mode: Mode, x: f64) -> Value {
        let ty = self.ty(dtype, mode);
        let bits = if dtype == DType::F32 { u64::from((x as f32).to_bits()) } else { x.to_bits() };
        self.kraw(ty, bits)
    }

    /// An integer constant of `dtype` in `mode` (also bools: 0/1, masks in vectors).
    pub fn ki(&mut self, dtype: DType, mode: Mode, x: i64) -> Value {
        let ty = self.ty(dtype, mode);
        let bits = if dtype == DType::Bool && mode == Mode::Vector && x != 0 { u64::MAX } else { x as u64 };
        self.kraw(ty, bits)
    }

    /// A scalar immediate in `mode`.
    pub fn kscalar(&mut self, s: Scalar, mode: Mode) -> Value {
        match s {
            Scalar::F32(v) => self.kraw(self.ty(DType::F32, mode), u64::from(v.to_bits())),
            Scalar::F64(v) => self.kraw(self.ty(DType::F64, mode), v.to_bits()),
            Scalar::I32(v) => self.ki(DType::I32, mode, i64::from(v)),
            Scalar::I64(v) => self.ki(DType::I64, mode, v),
            Scalar::Bool(v) => self.ki(DType::Bool, mode, i64::from(v)),
        }
    }

    /// A vector constant from the constant table (see [`Emit::kmem`]).
    pub fn kscalar_mem(&mut self, s: Scalar) -> Value {
        let m = Mode::Vector;
        let (ty, bits) = match s {
            Scalar::F32(v) => (self.ty(DType::F32, m), u64::from(v.to_bits())),
            Scalar::F64(v) => (self.ty(DType::F64, m), v.to_bits()),
            Scalar::I32(v) => (self.ty(DType::I32, m), v as u64),
            Scalar::I64(v) => (self.ty(DType::I64, m), v as u64),
            Scalar::Bool(v) => (self.ty(DType::Bool, m), if v { u64::MAX } else { 0 }),
        };
        self.kmem(ty, bits)
    }

    /// The identity element of a reduction.
    pub fn identity(&mut self, op: ReduceOp, dtype: DType, mode: Mode) -> Value {
        let float = dtype.is_float();
        match (op, float) {
            (ReduceOp::Sum | ReduceOp::Mean, true) => self.kf(dtype, mode, 0.0),
            (ReduceOp::Prod, true) => self.kf(dtype, mode, 1.0),
            (ReduceOp::Max, true) => self.kf(dtype, mode, f64::NEG_INFINITY),
            (ReduceOp::Min, true) => self.kf(dtype, mode, f64::INFINITY),
            (ReduceOp::Sum | ReduceOp::Mean, false) => self.ki(dtype, mode, 0),
            (ReduceOp::Prod, false) => self.ki(dtype, mode, 1),
            (ReduceOp::Max, false) => self.ki(dtype, mode, int_min(dtype)),
            (ReduceOp::Min, false) => self.ki(dtype, mode, int_max(dtype)),
        }
    }

    // ---------------------------------------------------------------
    // small building blocks
    // ---------------------------------------------------------------

    /// Reinterprets `v` as `ty` (same size).
    pub fn bitcast(&mut self, ty: Type, v: Value) -> Value {
        if self.b.func.dfg.value_type(v) == ty {
            v
        } else {
            self.b.ins().bitcast(ty, le(), v)
        }
    }

    /// `mask ? a : b`. In scalar mode `mask` is an i8 0/1; in vector mode a
    /// lane mask of the same width as `a`.
    pub fn sel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        if ty.is_vector() {
            let m = self.bitcast(ty, mask);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }

    /// A float comparison: i8 0/1 in scalar mode, a lane mask in vector mode.
    pub fn fcmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    /// An integer comparison: i8 0/1 in scalar mode, a lane mask in vector mode.
    pub fn icmp(&mut self, cc: IntCC, a: Value, b: Value) -> Value {
        self.b.ins().icmp(cc, a, b)
    }

    /// `a | b` of two masks or bools.
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bor(a, b)
    }

    /// numpy `maximum`/`max`-step: `a` if `a` is NaN or `a >= b`, else `b`.
    pub fn nan_max(&mut self, dtype: DType, mode: Mode, a: Value, b: Value) -> Value {
        if dtype.is_float() {
            let nan = self.fcmp(FloatCC::Unordered, a, a);
            let ge = self.fcmp(FloatCC::GreaterThanOrEqual, a, b);
            let m = self.or(nan, ge);
            self.sel(m, a, b)
        } else {
            self.int_max(dtype, mode, a, b)
        }
    }

    /// numpy `minimum`/`min`-step: `a` if `a` is NaN or `a <= b`, else `b`.
    pub fn nan_min(&mut self, dtype: DType, mode: Mode, a: Value, b: Value) -> Value {
        if dtype.is_float() {
            let nan = self.fcmp(FloatCC::Unordered, a, a);
            let le = self.fcmp(FloatCC::LessThanOrEqual, a, b);
            let m = self.or(nan, le);
            self.sel(m, a, b)
        } else {
            self.int_min(dtype, mode, a, b)
        }
    }

    fn int_max(&mut self, dtype: DType, mode: Mode, a: Value, b: Value) -> Value {
        if mode == Mode::Vector && dtype == DType::I64 {
            let m = self.icmp(IntCC::SignedGreaterThan, a, b);
            self.sel(m, a, b)
        } else {
            self.b.ins().smax(a, b)
        }
    }

    fn int_min(&mut self, dtype: DType, mode: Mode, a: Value, b: Value) -> Value {
        if mode == Mode::Vector && dtype == DType::I64 {
            let m = self.icmp(IntCC::SignedLessThan, a, b);
            self.sel(m, a, b)
        } else {
            self.b.ins().smin(a, b)
        }
    }

    /// One accumulation step of a reduction: `acc (op) x`.
    pub fn reduce_step(&mut self, op: ReduceOp, dtype: DType, mode: Mode, acc: Value, x: Value) -> Value {
        let float = dtype.is_float();
        match op {
            ReduceOp::Sum | ReduceOp::Mean if float => self.b.ins().fadd(acc, x),
            ReduceOp::Sum | ReduceOp::Mean => self.b.ins().iadd(acc, x),
            ReduceOp::Prod if float => self.b.ins().fmul(acc, x),
            ReduceOp::Prod => self.b.ins().imul(acc, x),
            ReduceOp::Max => self.nan_max(dtype, mode, acc, x),
            ReduceOp::Min => self.nan_min(dtype, mode, acc, x),
        }
    }

    /// Calls a Rust helper on scalar arguments, passing the op's index first.
    fn call_helper(&mut self, h: Helper, op_index: i64, args: &[Value]) -> Value {
        let f = *self.helpers.get(&h).unwrap_or_else(|| panic!("helper {h:?} was not declared"));
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(self.b.ins().iconst(types::I32, op_index));
        all.extend_from_slice(args);
        let call = self.b.ins().call(f, &all);
        self.b.inst_results(call)[0]
    }

    /// `op(x)` through the unary helper of `t`, lane by lane in vector mode.
    fn unary_helper(&mut self, op: UnaryOp, t: DType, mode: Mode, x: Value) -> Value {
        let (h, i) = (Helper::unary(t), helpers::unary_index(op));
        match mode {
            Mode::Scalar => self.call_helper(h, i, &[x]),
            Mode::Vector => self.scalarize(&[(x, t)], t, |e, xs| e.call_helper(h, i, xs)),
        }
    }

    /// `op(a, b)` through the binary helper of `t`, lane by lane in vector mode.
    fn binary_helper(&mut self, op: BinaryOp, t: DType, mode: Mode, a: Value, b: Value) -> Value {
        let (h, i) = (Helper::binary(t), helpers::binary_index(op));
        match mode {
            Mode::Scalar => self.call_helper(h, i, &[a, b]),
            Mode::Vector => self.scalarize(&[(a, t), (b, t)], t, |e, xs| e.call_helper(h, i, xs)),
        }
    }

    /// Converts a vector lane value (mask lanes for bool) to its scalar form.
    fn lane_to_scalar(&mut self, dtype: DType, lane: Value) -> Value {
        if dtype == DType::Bool {
            self.b.ins().icmp_imm_s(IntCC::NotEqual, lane, 0)
        } else {
            lane
        }
    }

    /// Converts a scalar (bool: i8 0/1) to the lane value of a vector.
    fn scalar_to_lane(&mut self, dtype: DType, s: Value) -> Value {
        if dtype == DType::Bool {
            let t = if self.lane_bits == 32 { types::I32 } else { types::I64 };
            let w = self.b.ins().uextend(t, s);
            self.b.ins().ineg(w)
        } else {
            s
        }
    }

    /// Computes a vector op lane by lane with its scalar lowering.
    pub fn scalarize(
        &mut self,
        args: &[(Value, DType)],
        out: DType,
        mut f: impl FnMut(&mut Self, &[Value]) -> Value,
    ) -> Value {
        let lanes = self.lanes();
        let out_ty = self.ty(out, Mode::Vector);
        let mut acc = self.kraw(out_ty, 0);
        for lane in 0..lanes {
            let mut xs: smallvec::SmallVec<[Value; 3]> = smallvec::SmallVec::new();
            for &(v, d) in args {
                let l = self.b.ins().extractlane(v, lane as u8);
                xs.push(self.lane_to_scalar(d, l));
            }
            let r = f(self, &xs);
            let r = self.scalar_to_lane(out, r);
            acc = self.b.ins().insertlane(acc, r, lane as u8);
        }
        acc
    }

    // ---------------------------------------------------------------
    // unary
    // ---------------------------------------------------------------

    /// `op(x)` for an operand of `dtype`.
    pub fn unary(&mut self, op: UnaryOp, dtype: DType, mode: Mode, x: Value) -> Value {
        use UnaryOp::*;
        match dtype {
            DType::F32 | DType::F64 => self.unary_float(op, dtype, mode, x),
            DType::I32 | DType::I64 => self.unary_int(op, dtype, mode, x),
            DType::Bool => {
                assert!(op == LogicalNot, "{} does not take bool", op.name());
                match mode {
                    Mode::Vector => self.b.ins().bnot(x),
                    Mode::Scalar => self.b.ins().bxor_imm_s(x, 1),
                }
            }
            // Computed in the compute dtype; the caller wraps the result.
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32 => {
                self.unary_int(op, dtype.compute(), mode, x)
            }
            DType::BF16 | DType::F16 | DType::U64 => {
                unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
            }
        }
    }

    fn unary_float(&mut self, op: UnaryOp, t: DType, mode: Mode, x: Value) -> Value {
        use UnaryOp::*;
        match op {
            Neg => self.b.ins().fneg(x),
            Abs => self.b.ins().fabs(x),
            Sign => {
                let zero = self.kf(t, mode, 0.0);
                let one = self.kf(t, mode, 1.0);
                let minus = self.kf(t, mode, -1.0);
                let gt = self.fcmp(FloatCC::GreaterThan, x, zero);
                let r = self.sel(gt, one, zero);
                let lt = self.fcmp(FloatCC::LessThan, x, zero);
                let r = self.sel(lt, minus, r);
                let nan = self.fcmp(FloatCC::Unordered, x, x);
                self.sel(nan, x, r)
            }
            Sqrt => self.b.ins().sqrt(x),
            Rsqrt => {
                let s = self.b.ins().sqrt(x);
                let one = self.kf(t, mode, 1.0);
                self.b.ins().fdiv(one, s)
            }
            Square => self.b.ins().fmul(x, x),
            Reciprocal => {
                let one = self.kf(t, mode, 1.0);
                self.b.ins().fdiv(one, x)
            }
            Relu => {
                let zero = self.kf(t, mode, 0.0);
                let m = self.fcmp(FloatCC::UnorderedOrGreaterThan, x, zero);
                self.sel(m, x, zero)
            }
            Floor => self.b.ins().floor(x),
            Ceil => self.b.ins().ceil(x),
            Round => self.b.ins().nearest(x),
            IsNan => self.fcmp(FloatCC::Unordered, x, x),
            IsFinite => {
                let a = self.b.ins().fabs(x);
                let inf = self.kf(t, mode, f64::INFINITY);
                self.fcmp(FloatCC::LessThan, a, inf)
            }
            Exp if t == DType::F32 => self.exp_f32(mode, x),
            Log if t == DType::F32 => self.log_f32(mode, x),
            Tanh if t == DType::F32 => self.tanh_f32(mode, x),
            Sigmoid if t == DType::F32 => self.sigmoid_f32(mode, x),
            Erf if t == DType::F32 => self.erf_f32(mode, x),
            // f64 transcendentals and the rest of the library functions are
            // computed by the reference's own element rule.
            Exp | Expm1 | Log | Log1p | Tanh | Sigmoid | Erf | Sin | Cos | Sinh | Cosh | Atan | Softplus => {
                self.unary_helper(op, t, mode, x)
            }
            LogicalNot => unreachable!("logical_not does not take floats"),
        }
    }

    fn unary_int(&mut self, op: UnaryOp, t: DType, mode: Mode, x: Value) -> Value {
        use UnaryOp::*;
        match op {
            Neg => self.b.ins().ineg(x),
            Abs if mode == Mode::Vector && t == DType::I64 => {
                let zero = self.ki(t, mode, 0);
                let neg = self.b.ins().ineg(x);
                let m = self.icmp(IntCC::SignedLessThan, x, zero);
                self.sel(m, neg, x)
            }
            Abs => self.b.ins().iabs(x),
            Sign => {
                let zero = self.ki(t, mode, 0);
                let gt = self.icmp(IntCC::SignedGreaterThan, x, zero);
                let lt = self.icmp(IntCC::SignedLessThan, x, zero);
                match mode {
                    // Masks are -1/0: lt - gt is -1, 0 or 1.
                    Mode::Vector => self.b.ins().isub(lt, gt),
                    Mode::Scalar => {
                        let ty = sty(t);
                        let g = self.b.ins().uextend(ty, gt);
                        let l = self.b.ins().uextend(ty, lt);
                        self.b.ins().isub(g, l)
                    }
                }
            }
            Square => self.b.ins().imul(x, x),
            Relu => {
                let zero = self.ki(t, mode, 0);
                self.int_max(t, mode, x, zero)
            }
            Floor | Ceil | Round => x,
            IsNan => self.ki(DType::Bool, mode, 0),
            IsFinite => self.ki(DType::Bool, mode, 1),
            Exp | Expm1 | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Tanh | Sigmoid | Erf | Sin | Cos | Sinh | Cosh
            | Atan | Softplus | LogicalNot => unreachable!("{} does not take integers", op.name()),
        }
    }

    // ---------------------------------------------------------------
    // binary
    // ---------------------------------------------------------------

    /// `op(a, b)` for operands of `dtype`.
    pub fn binary(&mut self, op: BinaryOp, t: DType, mode: Mode, a: Value, b: Value) -> Value {
        use BinaryOp::*;
        if t == DType::Bool {
            return match op {
                Eq => self.icmp(IntCC::Equal, a, b),
                Ne => self.icmp(IntCC::NotEqual, a, b),
                LogicalAnd | BitwiseAnd => self.b.ins().band(a, b),
                LogicalOr | BitwiseOr => self.b.ins().bor(a, b),
                BitwiseXor => self.b.ins().bxor(a, b),
                Add | Sub | Mul | Div | Pow | Maximum | Minimum | Rem | Lt | Le | Gt | Ge => {
                    unreachable!("{} does not take bool", op.name())
                }
            };
        }
        if t.is_float() {
            return match op {
                Add => self.b.ins().fadd(a, b),
                Sub => self.b.ins().fsub(a, b),
                Mul => self.b.ins().fmul(a, b),
                Div => self.b.ins().fdiv(a, b),
                Maximum => self.nan_max(t, mode, a, b),
                Minimum => self.nan_min(t, mode, a, b),
                Eq => self.fcmp(FloatCC::Equal, a, b),
                Ne => self.fcmp(FloatCC::NotEqual, a, b),
                Lt => self.fcmp(FloatCC::LessThan, a, b),
                Le => self.fcmp(FloatCC::LessThanOrEqual, a, b),
                Gt => self.fcmp(FloatCC::GreaterThan, a, b),
                Ge => self.fcmp(FloatCC::GreaterThanOrEqual, a, b),
                Pow | Rem => self.binary_helper(op, t, mode, a, b),
                LogicalAnd | LogicalOr => unreachable!("logical ops take bool"),
                BitwiseAnd | BitwiseOr | BitwiseXor => unreachable!("bitwise ops take integers or bool"),
            };
        }
        match op {
            Add => self.b.ins().iadd(a, b),
            Sub => self.b.ins().isub(a, b),
            Mul => self.b.ins().imul(a, b),
            Maximum => self.int_max(t, mode, a, b),
            Minimum => self.int_min(t, mode, a, b),
            Eq => self.icmp(IntCC::Equal, a, b),
            Ne => self.icmp(IntCC::NotEqual, a, b),
            Lt => self.icmp(IntCC::SignedLessThan, a, b),
            Le => self.icmp(IntCC::SignedLessThanOrEqual, a, b),
            Gt => self.icmp(IntCC::SignedGreaterThan, a, b),
            Ge => self.icmp(IntCC::SignedGreaterThanOrEqual, a, b),
            Div | Rem | Pow => match mode {
                Mode::Scalar => self.int_div_rem_pow(op, t, a, b),
                Mode::Vector => self.scalarize(&[(a, t), (b, t)], t, |e, xs| e.int_div_rem_pow(op, t, xs[0], xs[1])),
            },
            BitwiseAnd => self.b.ins().band(a, b),
            BitwiseOr => self.b.ins().bor(a, b),
            BitwiseXor => self.b.ins().bxor(a, b),
            LogicalAnd | LogicalOr => unreachable!("logical ops take bool"),
        }
    }

    /// Scalar integer `div` (truncating, `x / 0 == 0`, `MIN / -1 == MIN`),
    /// `rem` (Python modulo, `x % 0 == 0`) and `pow` (helper).
    fn int_div_rem_pow(&mut self, op: BinaryOp, t: DType, a: Value, b: Value) -> Value {
        let ty = sty(t);
        match op {
            BinaryOp::Pow => self.call_helper(Helper::binary(t), helpers::binary_index(op), &[a, b]),
            BinaryOp::Div => {
                let zero = self.b.ins().iconst(ty, 0);
                let one = self.b.ins().iconst(ty, 1);
                let is0 = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let ism1 = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let bad = self.b.ins().bor(is0, ism1);
                let safe = self.b.ins().select(bad, one, b);
                let q = self.b.ins().sdiv(a, safe);
                let neg = self.b.ins().ineg(a);
                let q = self.b.ins().select(ism1, neg, q);
                self.b.ins().select(is0, zero, q)
            }
            BinaryOp::Rem => {
                let one = self.b.ins().iconst(ty, 1);
                let is0 = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let ism1 = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let bad = self.b.ins().bor(is0, ism1);
                let safe = self.b.ins().select(bad, one, b);
                // b == 0 or b == -1: r = a % 1 == 0, as the reference gives.
                let r = self.b.ins().srem(a, safe);
                let rnz = self.b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                let rneg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                let bneg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, b, 0);
                let differ = self.b.ins().bxor(rneg, bneg);
                let fix = self.b.ins().band(rnz, differ);
                let moved = self.b.ins().iadd(r, b);
                self.b.ins().select(fix, moved, r)
            }
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::LogicalAnd
            | BinaryOp::LogicalOr
            | BinaryOp::BitwiseAnd
            | BinaryOp::BitwiseOr
            | BinaryOp::BitwiseXor => unreachable!("{} is lowered in-line", op.name()),
        }
    }

    // ---------------------------------------------------------------
    // select, cast, clamp
    // ---------------------------------------------------------------

    /// `cond ? a : b`.
    pub fn select(&mut self, c: Value, a: Value, b: Value) -> Value {
        self.sel(c, a, b)
    }

    /// `minimum(maximum(x, lo), hi)` with NaN kept.
    pub fn clamp(&mut self, t: DType, mode: Mode, x: Value, lo: Scalar, hi: Scalar) -> Value {
        let lo = self.kscalar(lo, mode);
        let hi = self.kscalar(hi, mode);
        if t.is_float() {
            // Bounds are never NaN: nan_max(x, lo) == (x >= lo or x is NaN) ? x : lo.
            let m = self.fcmp(FloatCC::UnorderedOrGreaterThanOrEqual, x, lo);
            let y = self.sel(m, x, lo);
            let m = self.fcmp(FloatCC::UnorderedOrLessThanOrEqual, y, hi);
            self.sel(m, y, hi)
        } else {
            let y = self.int_max(t, mode, x, lo);
            self.int_min(t, mode, y, hi)
        }
    }
}

/// The scalar Cranelift type of `dtype` (bool is an i8 holding 0/1).
pub(crate) fn sty(dtype: DType) -> Type {
    match dtype {
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::Bool => types::I8,
        // A narrow integer is held as its compute dtype's value.
        DType::I8 | DType::U8 | DType::I16 | DType::U16 => types::I32,
        DType::U32 => types::I64,
        DType::BF16 | DType::F16 | DType::U64 => {
            unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
        }
    }
}

fn int_min(t: DType) -> i64 {
    if t == DType::I32 {
        i64::from(i32::MIN)
    } else {
        i64::MIN
    }
}

fn int_max(t: DType) -> i64 {
    if t == DType::I32 {
        i64::from(i32::MAX)
    } else {
        i64::MAX
    }
}
