//! Two independent matrix products run side by side, one per thread,
//! instead of one after the other, each cut into blocks across all
//! threads.
//!
//! Why: a backward pass computes a layer's weight gradient `xᵀ·dy` and its
//! input gradient `dy·wᵀ` from the same `dy`, and neither needs the other.
//! Cut into output blocks, a product of W6's sizes gains 1.3-1.5x from a
//! second thread (each block packs the shared operand again and the
//! blocks are few); two whole products on two threads gain nearly 2x. The
//! products run exactly as on one thread (`threads::serial`), so results
//! keep their bits whatever the thread count.

use std::collections::HashMap;
use std::sync::Mutex;

use tracejit_ir::tensor::Storage;
use tracejit_ir::{Graph, Op};

use super::{Step, StepKind};
use crate::region::BufPool;

/// A step's part in a pair of products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pair {
    /// Not paired.
    None,
    /// Runs the later step `j`'s product alongside its own, when the pool
    /// has more than one thread.
    First(usize),
    /// Already computed by its partner when its output slot is filled.
    Second,
    /// A product run with its consumer, the region at step `j`, in row
    /// halves ([`super::epilogue`]).
    Then(usize),
    /// A region already run by the product before it when its output slot
    /// is filled.
    After,
}

/// How many steps ahead a partner is looked for.
const WINDOW: usize = 8;

/// Sizes `(m, k, n)` of a static 2-D float product at step `s`, if its
/// types are fully known (so it cannot fail on a worker thread).
pub(super) fn product_sizes(g: &Graph, s: &Step) -> Option<(usize, usize, usize)> {
    let node = g.node(s.node);
    if !matches!(node.op, Op::MatMul) || node.inputs.len() != 2 {
        return None;
    }
    let a = g.value_type(node.inputs[0]).shape()?;
    let b = g.value_type(node.inputs[1]).shape()?;
    let (&[m, k], &[k2, n]) = (&a[..], &b[..]) else { return None };
    (k == k2 && node.outputs.first().is_some_and(|t| t.dtype.is_float())).then_some((m, k, n))
}

/// Multiply-adds of a static 2-D product at step `s` ([`product_sizes`]).
fn static_work(g: &Graph, s: &Step) -> Option<usize> {
    product_sizes(g, s).map(|(m, k, n)| m * k * n)
}

/// Whether step `s` is a static 2-D float product of at least `min_work`
/// multiply-adds: worth a thread of its own.
fn big_product(g: &Graph, s: &Step, min_work: usize) -> bool {
    matches!(s.kind, StepKind::MatMul) && static_work(g, s).is_some_and(|w| w >= min_work)
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
pub(super) fn hoist_views(steps: &mut Vec<Step>, g: &Graph, min_work: usize) {
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
        }
        made_at = producers(steps);
    }
}

/// Marks pairs of products that may run side by side: both static 2-D
/// float products of at least `min_work` multiply-adds, the later one
/// within [`WINDOW`] steps and reading only values made before the first.
pub(super) fn pair_products(steps: &mut [Step], g: &Graph, min_work: usize) {
    let made_at = producers(steps);
    for i in 0..steps.len() {
        if steps[i].pair != Pair::None || !big_product(g, &steps[i], min_work) {
            continue;
        }
        let end = (i + 1 + WINDOW).min(steps.len());
        let partner = (i + 1..end).find(|&j| {
            let s = &steps[j];
            s.pair == Pair::None
                && big_product(g, s, min_work)
                && s.inputs.iter().all(|x| made_at.get(x).is_some_and(|&p| p < i))
        });
        if let Some(j) = partner {
            steps[i].pair = Pair::First(j);
            steps[j].pair = Pair::Second;
        }
    }
}

/// `a[0]·b[0]` and `a[1]·b[1]` on two threads of the pool, each product
/// on one (as on one thread), outputs from `pool`; `None` when the pool
/// has one thread.
pub(super) fn run_pair(
    isa: tracejit_kernels::Isa,
    a: [&Storage; 2],
    b: [&Storage; 2],
    pool: &mut BufPool,
) -> Option<[Storage; 2]> {
    let threads = crate::threads::pool()?;
    let mut out_buf = |t: usize| {
        let (sa, sb) = (a[t].shape(), b[t].shape());
        pool.take(a[t].dtype(), &[sa[0], sb[1]])
    };
    let bufs = [Mutex::new(out_buf(0)), Mutex::new(out_buf(1))];
    let outs: [Mutex<Option<Storage>>; 2] = Default::default();
    threads.run(2, &|t| {
        let mut buf = bufs[t].lock().unwrap_or_else(|e| e.into_inner()).take();
        let r = crate::threads::serial(|| crate::gemm::matmul_with(isa, a[t], b[t], &mut |_, _| buf.take()));
        *outs[t].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let [x, y] = outs.map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()).expect("both products ran"));
    Some([x, y])
}
