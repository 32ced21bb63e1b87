//! A loop run as one loop per block of its batch rows, each on one
//! thread of the pool ([`crate::row_blocks`] finds the loops and the rows; the
//! `row_loops` codegen pass decides, with [`plan`]).

use std::sync::{Arc, Mutex};

use tracejit_ir::tensor::{kernels, Storage};
use tracejit_ir::{Graph, IrError};

use super::{BufPool, Executable, Shared};
use crate::row_blocks::{self, LoopRows, Rows};
use crate::JitOptions;

/// A block's loop: its carried values, or its error.
type Outcome = Result<Vec<Storage>, IrError>;

/// A block's condition and body.
type Parts = Arc<[Executable; 2]>;

/// What a `while` step needs to run split: the rows, the subgraphs to
/// write for a block size, and the blocks' executables and buffers.
pub(crate) struct Split {
    rows: LoopRows,
    /// The least rows of a block ([`row_blocks::exact_rows`]).
    least: usize,
    parts: [Arc<Graph>; 2],
    opts: JitOptions,
    /// The condition and body for a block of that many rows, prepared on
    /// first use (the thread count may change between calls); `None` if
    /// they could not be, so that no call tries again.
    built: Mutex<Vec<(usize, Option<Parts>)>>,
    /// One buffer pool per block position, kept across calls.
    pools: Mutex<Vec<Arc<Mutex<BufPool>>>>,
}

/// The split of a loop with subgraphs `parts` and `carried` carried
/// values, when its rows are independent ([`row_blocks::plan_loop`]), its
/// trips do enough work on rows to pay for a fork and a join (a loop of
/// unknown trip count is taken as one trip), the blocks would repeat
/// little of it, what their products share stays in cache
/// ([`row_blocks::SHARED_MAX`]), and a block's products give the bits of the
/// whole (so results do not depend on the thread count).
pub(crate) fn plan(
    parts: &[Arc<Graph>; 2],
    carried: usize,
    trips: Option<usize>,
    opts: &JitOptions,
    gemm_threshold: usize,
) -> Option<Split> {
    let rows = row_blocks::plan_loop(parts, carried)?;
    let costs = row_blocks::trip_costs(&parts[1], &rows.parts[1]);
    let pays = costs.rows.saturating_mul(trips.unwrap_or(1)) >= gemm_threshold
        && costs.repeated.saturating_mul(8) <= costs.rows
        && costs.shared <= row_blocks::SHARED_MAX
        && costs.exact;
    if !pays {
        return None;
    }
    let least = row_blocks::exact_rows(&costs);
    if rows.b / least < 2 {
        return None;
    }
    Some(Split { rows, least, parts: parts.clone(), opts: *opts, built: Mutex::default(), pools: Mutex::default() })
}

/// Rows `0..b` cut in `n` near-equal blocks (the first ones the larger).
fn blocks(b: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let (q, r) = (b / n, b % n);
    let mut at = 0;
    (0..n)
        .map(|i| {
            let len = q + usize::from(i < r);
            at += len;
            at - len..at
        })
        .collect()
}

impl Split {
    /// The split in a schedule listing.
    pub(crate) fn describe(&self) -> String {
        let axes: Vec<String> = self
            .rows
            .inputs
            .iter()
            .map(|r| match r {
                Rows::Free => "-".to_string(),
                Rows::Axis(a) => a.to_string(),
            })
            .collect();
        format!(
            "row blocks of {} rows, at least {} each; batch axis per input [{}]",
            self.rows.b,
            self.least,
            axes.join(", ")
        )
    }

    /// The condition and body for blocks of `p` rows: the loop's subgraphs
    /// retyped (and verified, [`row_blocks::retype`]), prepared through the
    /// JIT's passes like any graph (their regions are the loop's own).
    fn executables(&self, p: usize) -> Option<Parts> {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, e)) = built.iter().find(|(q, _)| *q == p) {
            return e.clone();
        }
        // Dumped like any graph (`TRACEJIT_DUMP`, as `<part>.rows<p>`); a
        // part that cannot be prepared is logged, and the loop runs whole.
        let prepare = |k: usize| -> Result<Executable, String> {
            let part = &self.parts[k];
            let g = row_blocks::retype(part, &self.rows.parts[k], p)
                .ok_or_else(|| format!("`{}` does not retype to blocks of {p} rows", part.name))?;
            let mut run = crate::codegen::Run::new(crate::codegen::DumpTo::from_env(&format!("{}.rows{p}", part.name)));
            Executable::build(Arc::new(g), &self.opts, &mut Default::default(), &mut run).map_err(|e| e.to_string())
        };
        let e = match prepare(0).and_then(|c| Ok(Arc::new([c, prepare(1)?]))) {
            Ok(parts) => Some(parts),
            Err(why) => {
                log::warn!("tracejit: a loop's row blocks of {p} rows cannot be prepared ({why}); it runs whole");
                None
            }
        };
        built.push((p, e.clone()));
        e
    }

    /// Runs the loop on `args` in blocks of rows across the pool: `None`
    /// (nothing returned) with one thread, inside another split kernel,
    /// when the batch is too small for two blocks, when a block's
    /// subgraphs cannot be prepared, or when a block fails (its blocks
    /// stop at different trips: the whole loop reports the error one
    /// thread reports); the caller then runs the loop whole.
    pub(crate) fn run(
        &self,
        carried: usize,
        args: &[Storage],
        cancel: Option<&tracejit_ir::control::CancelToken>,
    ) -> Option<Vec<Storage>> {
        let pool = crate::threads::pool()?;
        let LoopRows { b, inputs: rows, .. } = &self.rows;
        let n = pool.threads().min(b / self.least);
        let fits = args.len() == rows.len()
            && args.iter().zip(rows).all(|(x, r)| match r {
                Rows::Free => true,
                Rows::Axis(a) => x.shape().get(*a) == Some(b),
            });
        if n < 2 || !fits {
            return None;
        }
        let blocks = blocks(*b, n);
        let mut exes = Vec::with_capacity(n);
        for r in &blocks {
            exes.push(self.executables(r.len())?);
        }
        let pools: Vec<Arc<Mutex<BufPool>>> = {
            let mut p = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            while p.len() < n {
                p.push(Arc::default());
            }
            p[..n].to_vec()
        };
        let results: Vec<Mutex<Option<Outcome>>> = (0..n).map(|_| Mutex::new(None)).collect();
        let task = |t: usize| {
            let inputs: Vec<Storage> = args
                .iter()
                .zip(rows)
                .map(|(x, r)| match r {
                    Rows::Free => x.clone(),
                    Rows::Axis(a) => super::views::rows(x, *a, blocks[t].clone()),
                })
                .collect();
            let mut bufs = BufPool::checkout(&pools[t]);
            // A block's kernels stay on its thread, its products round as
            // the whole loop's (no dot products for its few rows).
            let out = crate::threads::serial(|| {
                tracejit_kernels::gemm::without_dot_products(|| {
                    tracejit_ir::control::run_while(
                        carried,
                        &inputs,
                        &mut Shared { subs: &exes[t], pool: &mut bufs },
                        cancel,
                    )
                })
            });
            bufs.checkin(&pools[t]);
            *results[t].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
        };
        pool.run(n, &task);
        let mut outs: Vec<Vec<Storage>> = Vec::with_capacity(n);
        for r in results {
            match r.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(Ok(v)) if v.len() == carried => outs.push(v),
                Some(Ok(_) | Err(_)) | None => return None,
            }
        }
        let joined = (0..carried)
            .map(|k| match rows[k] {
                // The same in every block.
                Rows::Free => outs[0][k].clone(),
                Rows::Axis(a) => {
                    let parts: Vec<&Storage> = outs.iter().map(|o| &o[k]).collect();
                    kernels::concat(&parts, a)
                }
            })
            .collect();
        // The blocks' results go back to their pools for the next call.
        for (o, p) in outs.into_iter().zip(&pools) {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            o.into_iter().for_each(|v| p.give_if_unique(v));
        }
        Some(joined)
    }
}
