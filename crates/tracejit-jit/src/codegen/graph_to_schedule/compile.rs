//! A graph's regions compiled before `lower` walks it, over the JIT's
//! threads: each body analyzed, each distinct kernel missing from the
//! cache compiled once (Cranelift, the first call's largest cost after the
//! run itself: W10's 44 regions, 33 distinct kernels), then each region
//! built around its cached kernel. With one thread this is the loop
//! `lower` ran before, in node order.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tracejit_ir::{Graph, NodeId, Op};

use crate::analysis::{analyze, Analysis};
use crate::region::{cached_kernel, is_cached, region_from};
use crate::{CompiledRegion, JitError, JitOptions};

/// The compiled region of every fused node of `g` whose body this JIT
/// compiles (the others run their body as a primitive); the first
/// compilation error in node order otherwise.
pub(super) fn compile_regions(g: &Graph, opts: &JitOptions) -> Result<HashMap<NodeId, Arc<CompiledRegion>>, JitError> {
    let bodies: Vec<(NodeId, &Graph)> = g
        .nodes()
        .filter_map(|(id, n)| match &n.op {
            Op::Fused { body } => Some((id, &**body)),
            _ => None,
        })
        .collect();
    let threads = opts.target.resolved_threads();
    let analyses: Vec<Option<Analysis>> = parallel_map(threads, &bodies, |(_, body)| analyze(body).ok());
    let mut seen = HashSet::new();
    let missing: Vec<&Analysis> =
        analyses.iter().flatten().filter(|an| !is_cached(an, opts) && seen.insert(an.key.clone())).collect();
    for compiled in parallel_map(threads, &missing, |an| cached_kernel(an, opts).map(drop)) {
        compiled?;
    }
    let mut regions = HashMap::new();
    for ((id, body), an) in bodies.into_iter().zip(analyses) {
        if let Some(an) = an {
            regions.insert(id, region_from(cached_kernel(&an, opts)?, an, body));
        }
    }
    Ok(regions)
}

/// Fewer items than this run on the calling thread: a thread costs tens
/// of microseconds to start, a small graph's regions less to compile.
const MIN_PARALLEL: usize = 4;

/// `f` over `items` on up to `threads` threads (this one included), in
/// `items`' order; plainly on this thread for one thread or fewer than
/// [`MIN_PARALLEL`] items.
fn parallel_map<T: Sync, R: Send>(threads: usize, items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads.min(items.len());
    if threads <= 1 || items.len() < MIN_PARALLEL {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let r = f(item);
        *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).expect("every item is mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parallel_map_keeps_the_order_at_any_thread_count() {
        let items: Vec<u64> = (0..37).collect();
        for threads in [0, 1, 2, 5, 64] {
            let got = super::parallel_map(threads, &items, |x| x * x);
            assert_eq!(got, items.iter().map(|x| x * x).collect::<Vec<_>>(), "{threads} threads");
        }
        assert!(super::parallel_map(3, &[] as &[u8], |x| *x).is_empty());
    }
}
