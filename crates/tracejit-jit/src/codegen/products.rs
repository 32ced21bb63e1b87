//! The products' passes: `hoist_views` (a view a later product reads
//! moves before an earlier, independent product, so the two can pair),
//! `side_by_side` (two independent large products close together run one
//! per thread; see `executor/pairs.rs` for why) and `epilogues` (a
//! mid-sized product and the region right after it that consumes it run
//! together in row halves; see `executor/epilogue.rs`).

use std::collections::HashMap;

use tracejit_ir::passes::PassResult;
use tracejit_ir::{Graph, Op};

use super::{CodegenContext, SchedulePass};
use crate::schedule::{Pair, Schedule, Step, StepKind};

/// Moves views before an earlier product a later one can pair with.
pub(crate) struct HoistViews;

impl SchedulePass for HoistViews {
    fn name(&self) -> &'static str {
        "hoist_views"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(hoist_views(&mut s.steps, cx.graph, cx.gemm_threshold), "views moved before a product")
    }
}

/// Marks pairs of products that run side by side.
pub(crate) struct SideBySide;

impl SchedulePass for SideBySide {
    fn name(&self) -> &'static str {
        "side_by_side"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(pair_products(&mut s.steps, cx.graph, cx.gemm_threshold), "pairs of products side by side")
    }
}

/// Marks products run in row halves with the region consuming them.
pub(crate) struct Epilogues;

impl SchedulePass for Epilogues {
    fn name(&self) -> &'static str {
        "epilogues"
    }

    fn run(&self, s: &mut Schedule, cx: &CodegenContext<'_>) -> PassResult {
        PassResult::count(plan(&mut s.steps, cx.graph), "products run with their consumer in row halves")
    }
}

/// How many steps ahead a partner is looked for.
const WINDOW: usize = 8;

/// Sizes `(m, k, n)` of a static 2-D float product at step `s`, if its
/// types are fully known (so it cannot fail on a worker thread).
fn product_sizes(g: &Graph, s: &Step) -> Option<(usize, usize, usize)> {
    let node = g.node(s.node);
    if !matches!(node.op, Op::MatMul) || node.inputs.len() != 2 {
        return None;
    }
    let a = g.value_type(node.inputs[0]).shape()?;
    let b = g.value_type(node.inputs[1]).shape()?;
    let (&[m, k], &[k2, n]) = (&a[..], &b[..]) else { return None };
    (k == k2 && node.outputs.first().is_some_and(|t| t.dtype.is_float())).then_some((m, k, n))
}

/// Multiply-adds of a static float product at step `s` whose rhs is a
/// matrix and whose lhs is a matrix or a stack of rows (`[.., m, k]`, run
/// as one `[rows, k]` product by both GEMMs: a transformer's `dy · wᵀ`).
fn static_work(g: &Graph, s: &Step) -> Option<usize> {
    let node = g.node(s.node);
    if !matches!(node.op, Op::MatMul) || node.inputs.len() != 2 {
        return None;
    }
    let a = g.value_type(node.inputs[0]).shape()?;
    let b = g.value_type(node.inputs[1]).shape()?;
    let (&[k2, n], Some((&k, rows))) = (&b[..], a.split_last()) else { return None };
    let float = node.outputs.first().is_some_and(|t| t.dtype.is_float());
    (k == k2 && !rows.is_empty() && float).then(|| rows.iter().product::<usize>() * k * n)
}

/// Whether step `s` is a static float product ([`static_work`], on the
/// f32 or the bf16 GEMM) of at least `min_work` multiply-adds: worth a
/// thread of its own.
fn big_product(g: &Graph, s: &Step, min_work: usize) -> bool {
    matches!(s.kind, StepKind::MatMul | StepKind::MatMulBf16(_)) && static_work(g, s).is_some_and(|w| w >= min_work)
}

/// The step making each slot (slots are assigned once).
fn producers(steps: &[Step]) -> HashMap<usize, usize> {
    steps.iter().enumerate().flat_map(|(i, s)| s.outputs.iter().map(move |&o| (o, i))).collect()
}

/// Moves views (transposes) that a later product reads to just before an
/// earlier independent product, so that the two become a pair for
/// [`pair_products`]: `dy·wᵀ` after `xᵀ·dy` reads a `wᵀ` made between them.
/// A view is cheap and shares its input's buffer, so making it earlier
/// changes no buffer's lifetime.
fn hoist_views(steps: &mut Vec<Step>, g: &Graph, min_work: usize) -> usize {
    let mut moved_views = 0;
    let mut made_at = producers(steps);
    for i in 0..steps.len() {
        if !big_product(g, &steps[i], min_work) {
            continue;
        }
        let before = |x: &usize| made_at.get(x).is_some_and(|&p| p < i);
        let end = (i + 1 + WINDOW).min(steps.len());
        // The first product ahead whose inputs are each made before `i`
        // (`None`) or by a view in between whose inputs were (`Some(v)`).
        let views = (i + 1..end).filter(|&j| big_product(g, &steps[j], min_work)).find_map(|j| {
            let source = |x: &usize| -> Option<Option<usize>> {
                if before(x) {
                    return Some(None);
                }
                let v = made_at.get(x).copied().filter(|&v| v > i && v < j)?;
                let s = &steps[v];
                (matches!(s.kind, StepKind::View(_)) && s.inputs.iter().all(before)).then_some(Some(v))
            };
            steps[j].inputs.iter().map(source).collect::<Option<Vec<_>>>()
        });
        let mut views: Vec<usize> = views.into_iter().flatten().flatten().collect();
        if views.is_empty() {
            continue;
        }
        views.sort_unstable();
        views.dedup();
        for (moved, v) in views.into_iter().enumerate() {
            let step = steps.remove(v);
            steps.insert(i + moved, step);
            moved_views += 1;
        }
        made_at = producers(steps);
    }
    moved_views
}

/// Whether two products of `a` and `b` multiply-adds keep two threads
/// busy side by side: within 25% of each other (a layer's weight and input
/// gradients have the same count). Otherwise the larger one, run on one
/// thread, would take longer than both split over all of them (W10 in
/// bf16 at two threads: 49 -> 73 ms when its LM head's products paired
/// with a block's four times larger ones).
fn balanced(a: usize, b: usize) -> bool {
    4 * a.min(b) >= 3 * a.max(b)
}

/// Marks pairs of products that may run side by side: both static float
/// products of at least `min_work` multiply-adds and of about the same
/// work ([`balanced`]), the later one
/// within [`WINDOW`] steps and reading only values made before the first.
fn pair_products(steps: &mut [Step], g: &Graph, min_work: usize) -> usize {
    let made_at = producers(steps);
    let mut pairs = 0;
    for i in 0..steps.len() {
        if steps[i].pair != Pair::None || !big_product(g, &steps[i], min_work) {
            continue;
        }
        let end = (i + 1 + WINDOW).min(steps.len());
        let work = static_work(g, &steps[i]).unwrap_or(0);
        let partner = (i + 1..end).find(|&j| {
            let s = &steps[j];
            s.pair == Pair::None
                && big_product(g, s, min_work)
                && balanced(work, static_work(g, s).unwrap_or(0))
                && s.inputs.iter().all(|x| made_at.get(x).is_some_and(|&p| p < i))
        });
        if let Some(j) = partner {
            steps[i].pair = Pair::First(j);
            steps[j].pair = Pair::Second;
            pairs += 1;
        }
    }
    pairs
}

/// Marks each product whose next step is a region reading it for the last
/// time, where the two can run in row halves: the product
/// `Pair::Then(j)`, the region `Pair::After`.
fn plan(steps: &mut [Step], g: &Graph) -> usize {
    let mut planned = 0;
    for i in 0..steps.len().saturating_sub(1) {
        let (this, next) = (&steps[i], &steps[i + 1]);
        if this.pair != Pair::None || next.pair != Pair::None || next.check {
            continue;
        }
        // f32 products and those on the bf16 GEMM (whose node is still
        // the f32 product of widened operands).
        if !matches!(this.kind, StepKind::MatMul | StepKind::MatMulBf16(_)) {
            continue;
        }
        let Some((m, k, n)) = product_sizes(g, this) else { continue };
        let StepKind::Region(r) = &next.kind else { continue };
        let product = this.outputs[0];
        let fits = crate::threads::epilogue_rows(m, n, k).is_some_and(|half| r.product_row_map(m, n, half).is_some())
            && next.inputs.contains(&product)
            && next.frees.contains(&product);
        if fits {
            steps[i].pair = Pair::Then(i + 1);
            steps[i + 1].pair = Pair::After;
            planned += 1;
        }
    }
    planned
}
