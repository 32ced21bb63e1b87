//! `bf16_products`: a product whose operands are both widened from bf16 —
//! `matmul(cast(x, f32), cast(y, f32))` with `x`, `y` bf16 (what
//! `matmul_acc` traces), or with `x = cast(x32, bf16)` (what
//! `auto_mixed_precision` writes) — runs on the bf16 GEMM straight from
//! `x` and `y` (or from the f32 `x32`, rounded while packed): the widened
//! (and rounded) copies are never made, and the casts no other step reads
//! are dropped. The right operand's packing is kept across calls when it
//! is a variable's value or a constant, and while the same buffer comes
//! back when it is an argument ([`crate::gemm_bf16`]).
//!
//! Runs first after `lower`, before any pass that records step indices.

use std::collections::HashMap;
use std::sync::Arc;

use tracejit_ir::passes::PassResult;
use tracejit_ir::tensor::DType;
use tracejit_ir::{Graph, Op};

use super::{CodegenContext, SchedulePass};
use crate::gemm_bf16::{Bf16Product, RhsSource};
use crate::schedule::{Schedule, StepKind};

/// Moves products of bf16-widened operands onto the bf16 GEMM.
pub(crate) struct Bf16Products;

impl SchedulePass for Bf16Products {
    fn name(&self) -> &'static str {
        "bf16_products"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(rewrite(s, cx.graph), "products on the bf16 GEMM")
    }
}

/// Where a bf16 operand's value comes from.
struct Operand {
    /// The slot the product reads instead.
    slot: usize,
    /// True when that slot holds f32 the kernel rounds.
    round: bool,
}

fn rewrite(s: &mut Schedule, g: &Graph) -> usize {
    let producer: HashMap<usize, usize> =
        s.steps.iter().enumerate().flat_map(|(i, st)| st.outputs.iter().map(move |&o| (o, i))).collect();
    let mut changed = 0;
    for i in 0..s.steps.len() {
        if !matches!(s.steps[i].kind, StepKind::MatMul) {
            continue;
        }
        let ins = s.steps[i].inputs.clone();
        let (Some(a), Some(b)) = (operand(s, g, &producer, ins[0]), operand(s, g, &producer, ins[1])) else {
            continue;
        };
        let rhs = source(s, &producer, b.slot);
        let step = &mut s.steps[i];
        step.kind = StepKind::MatMulBf16(Arc::new(Bf16Product::new([a.round, b.round], rhs)));
        step.inputs = [a.slot, b.slot].into_iter().collect();
        changed += 1;
    }
    if changed > 0 {
        drop_unread_casts(s);
    }
    changed
}

/// The bf16 source of a product's operand in `slot`: the input of a cast
/// of bf16 to f32, or, when that bf16 value is itself a cast of f32, the
/// f32 value (rounded by the kernel).
fn operand(s: &Schedule, g: &Graph, producer: &HashMap<usize, usize>, slot: usize) -> Option<Operand> {
    let up = cast_step(s, g, producer, slot, DType::BF16, DType::F32)?;
    let low = s.steps[up].inputs[0];
    match cast_step(s, g, producer, low, DType::F32, DType::BF16) {
        Some(down) => Some(Operand { slot: s.steps[down].inputs[0], round: true }),
        None => Some(Operand { slot: low, round: false }),
    }
}

/// The step writing `slot` when it is a cast from `from` to `to`.
fn cast_step(
    s: &Schedule,
    g: &Graph,
    producer: &HashMap<usize, usize>,
    slot: usize,
    from: DType,
    to: DType,
) -> Option<usize> {
    let p = *producer.get(&slot)?;
    let step = &s.steps[p];
    let StepKind::Primitive(Op::Cast { to: t }, _) = &step.kind else { return None };
    let node = g.node(step.node);
    (*t == to && g.value_type(node.inputs[0]).dtype == from).then_some(p)
}

/// Where `slot`'s value comes from: a variable's value or a constant (a
/// buffer that stays the same across calls until assigned), an argument,
/// a transposed view of either, or a computation.
pub(super) fn source(s: &Schedule, producer: &HashMap<usize, usize>, slot: usize) -> RhsSource {
    let Some(&p) = producer.get(&slot) else { return RhsSource::Computed };
    match &s.steps[p].kind {
        StepKind::Read(_) | StepKind::Constant(_) => RhsSource::Weight,
        StepKind::Param(_) => RhsSource::Argument,
        StepKind::View(crate::executor::views::View::Transpose(_)) => source(s, producer, s.steps[p].inputs[0]),
        _ => RhsSource::Computed,
    }
}

/// Drops cast steps whose outputs no step reads and that are no output of
/// the graph (the widening casts the bf16 products replaced), repeatedly,
/// so a rounding cast feeding only a dropped widening goes too.
fn drop_unread_casts(s: &mut Schedule) {
    loop {
        let read: std::collections::HashSet<usize> =
            s.steps.iter().flat_map(|st| st.inputs.iter().copied()).chain(s.outputs.iter().copied()).collect();
        let before = s.steps.len();
        s.steps.retain(|st| {
            !(matches!(st.kind, StepKind::Primitive(Op::Cast { .. }, _))
                && st.outputs.iter().all(|o| !read.contains(o)))
        });
        if s.steps.len() == before {
            return;
        }
    }
}
