//! `cse`: common subexpression elimination. Two nodes with the same op and
//! attributes, the same inputs and the same control inputs compute the same
//! values, so the later one is replaced by the earlier.
//!
//! The structural key of a node is its [`OpKey`] (the op with its
//! attributes, constants by value: dtype, shape and every element's bits, so
//! `0.0` and `-0.0` differ and NaNs with the same bits are equal; fused
//! regions and kernels by identity), plus its inputs *after* earlier
//! merges, so chains collapse in one pass. Nodes with side effects (variable reads and writes, calls of
//! functions that have them) and parameters are never merged: two reads of a
//! variable may see different values.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::passes::{has_side_effects, run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, OpKey, ValueId};

/// The common subexpression elimination pass (`cse`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

#[derive(PartialEq, Eq, Hash)]
struct Key {
    op: OpKey,
    inputs: SmallVec<[ValueId; 2]>,
    control: SmallVec<[NodeId; 1]>,
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Nested code first, so this level sees simplified subgraphs.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g, cx))
    }
}

impl Cse {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let mut rw = Rewriter::new(g);
        let mut seen: HashMap<Key, NodeId> = HashMap::new();
        let mut merged = 0usize;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            if has_side_effects(g, &node.op) {
                rw.copy(id);
                continue;
            }
            let key = Key { op: OpKey::new(&node.op), inputs: rw.inputs(id), control: rw.control(id) };
            match seen.get(&key) {
                Some(&earlier) => {
                    let outs: Vec<ValueId> = (0..node.outputs.len()).map(|i| ValueId::new(earlier, i as u32)).collect();
                    rw.alias(id, &outs);
                    merged += 1;
                }
                None => {
                    let new = rw.copy(id);
                    seen.insert(key, new);
                }
            }
        }
        if merged == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(merged, if merged == 1 { "node merged" } else { "nodes merged" })
    }
}
