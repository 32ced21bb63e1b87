//! Hand-written kernels for region shapes where Cranelift's code falls
//! short, called through the same ABI as generated kernels (`kernel::abi`),
//! so the launcher, the thread split and the buffer pools treat them alike.
//!
//! Two shapes, both over f32 rows, whose generated kernels run every pass
//! in Cranelift's 128-bit vectors; these run them in 512-bit AVX-512 or
//! 256-bit AVX2 code (`Isa::width`):
//!
//! - the row softmax `exp(x - max(x)) / sum(exp(x - max(x)))` (W3, and the
//!   softmax inside attention-style code), with `exp` computed straight
//!   into the output row ([`tracejit_kernels::softmax`]); the passes
//!   around `exp` cost more than `exp` itself in generated code;
//! - the row layer norm `((h - mean) · rsqrt(var + ε)) · γ + β` of a sum
//!   `h` of one to three inputs (W4, and the residual add and layer norm
//!   of every transformer block: W9, W10, W15), written out or through
//!   `tracejit.nn.layer_norm`'s body ([`tracejit_kernels::layer_norm`]);
//!   the generated kernel takes about 13 cycles per 16 values.
//!
//! Each says how its results relate to the generated kernel's: within the
//! sums' rounding, the tolerance every float reduction of the JIT is
//! checked against. A kernel whose operands sit in other slots from one
//! region to another (the layer norm) gets them from a plan of slot
//! numbers built here, passed beside the argument block.
//!
//! Only on x86_64 with AVX2 and FMA or AVX-512F, and only when staging is on
//! (`JitOptions::stage`, which the `TRACEJIT_JIT_STAGE=0` test run turns off
//! to exercise the generated code).

use cranelift_entity::EntityRef;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp, LoadId};
use tracejit_kernels::Width;

use crate::options::JitOptions;

mod layer_norm;

/// A hand-written kernel for a region: its name (the listing and the
/// profile show it), its entry, and the plan of slots it reads (`None`:
/// the entry takes the argument block alone).
pub(crate) struct NativeKernel {
    pub name: &'static str,
    pub entry: *const u8,
    pub plan: Option<Box<[i64]>>,
}

/// The hand-written kernel for `an`, if one fits it and this CPU.
pub(crate) fn kernel_for(an: &Analysis, opts: &JitOptions) -> Option<NativeKernel> {
    if !opts.stage {
        return None;
    }
    let width = opts.isa().width()?;
    if is_row_softmax(an) {
        let (name, entry) = match width {
            Width::W16 => ("row softmax (16 lanes)", softmax_rows_x16 as *const u8),
            Width::W8 => ("row softmax (8 lanes)", softmax_rows_x8 as *const u8),
        };
        return Some(NativeKernel { name, entry, plan: None });
    }
    let plan = layer_norm::plan(an)?;
    let (name, entry) = match width {
        Width::W16 => ("row layer norm (16 lanes)", layer_norm::rows_x16 as *const u8),
        Width::W8 => ("row layer norm (8 lanes)", layer_norm::rows_x8 as *const u8),
    };
    Some(NativeKernel { name, entry, plan: Some(plan) })
}

macro_rules! softmax_entry {
    ($name:ident, $width:expr) => {
        /// The row softmax over the ABI's argument block (`kernel::abi`):
        /// `rows` rows of `n` f32 values, input slot 0, output slot 1
        /// (pointer and byte row stride each), inner elements contiguous.
        ///
        /// # Safety
        /// `args` is such an argument block, its pointers addressing rows
        /// of readable (input) and writable (output) values, the output not
        /// aliasing the input; the CPU has the width's features
        /// ([`kernel_for`] hands it out only then).
        unsafe extern "C" fn $name(args: *const i64) {
            // SAFETY: forwarded from the caller (the layout of `kernel::abi`).
            unsafe {
                let a = |i: usize| *args.add(i);
                let (rows, n) = (a(0).max(0) as usize, a(1).max(0) as usize);
                let slot = crate::kernel::ARG_SLOTS;
                let (x, xs, y, ys) = (a(slot), a(slot + 1), a(slot + 2), a(slot + 3));
                tracejit_kernels::softmax::rows(
                    rows,
                    n,
                    x as *const f32,
                    xs as isize,
                    y as *mut f32,
                    ys as isize,
                    $width,
                );
            }
        }
    };
}
softmax_entry!(softmax_rows_x16, Width::W16);
softmax_entry!(softmax_rows_x8, Width::W8);

/// True for a row region of one contiguous f32 input `x` and one full-size
/// f32 output `exp(x - max(x)) / sum(exp(x - max(x)))`, reduced over the
/// row, with nothing else computed.
fn is_row_softmax(an: &Analysis) -> bool {
    if an.kind != KernelKind::Row || an.loads.len() != 1 || an.outputs.len() != 1 {
        return false;
    }
    let (load, out) = (&an.loads[LoadId::new(0)], &an.outputs[0]);
    if load.dtype != DType::F32 || !load.contig || out.kept || out.dtype != DType::F32 {
        return false;
    }
    if an.nodes.values().any(|n| n.dtype != DType::F32) {
        return false;
    }
    let node = |id: LNodeId| &an.nodes[id];
    let is_x = |id: LNodeId| matches!(node(id).op, LOp::Load(l) if l.index() == 0);
    let (LOp::Binary(BinaryOp::Div), [e, s]) = (&node(out.node).op, &node(out.node).inputs[..]) else { return false };
    let (LOp::Reduce(ReduceOp::Sum), [e2]) = (&node(*s).op, &node(*s).inputs[..]) else { return false };
    let (LOp::Unary(UnaryOp::Exp), [d]) = (&node(*e).op, &node(*e).inputs[..]) else { return false };
    let (LOp::Binary(BinaryOp::Sub), [x, m]) = (&node(*d).op, &node(*d).inputs[..]) else { return false };
    let (LOp::Reduce(ReduceOp::Max), [x2]) = (&node(*m).op, &node(*m).inputs[..]) else { return false };
    e2 == e && is_x(*x) && is_x(*x2)
}
