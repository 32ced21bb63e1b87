//! `dce`: dead code elimination. A node is live when a graph output reads
//! it, when it has side effects (variable reads and writes, calls of
//! functions that have them), or when a live node depends on it through a
//! data or a control input; parameters are always kept (they are the
//! signature). Every other node is dropped, and the graph is compacted.

use cranelift_entity::EntityRef;

use crate::passes::{has_side_effects, run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, Op};

/// The dead code elimination pass (`dce`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// Which nodes of `g` are live, by index.
pub(crate) fn live_nodes(g: &Graph) -> Vec<bool> {
    let mut live = vec![false; g.len()];
    for v in &g.outputs {
        live[v.node.index()] = true;
    }
    for (id, node) in g.nodes() {
        // A random draw nobody reads may go: drawing changes no state (a
        // generator's advance is a variable write of its own).
        let effects = node.op.effects(&g.library);
        let only_draws = effects == crate::Effects::RANDOM;
        if matches!(node.op, Op::Parameter { .. }) || (has_side_effects(g, &node.op) && !only_draws) {
            live[id.index()] = true;
        }
    }
    // Arena order is topological: one backward sweep reaches every producer.
    for (id, node) in g.nodes().collect::<Vec<_>>().into_iter().rev() {
        if live[id.index()] {
            for v in &node.inputs {
                live[v.node.index()] = true;
            }
            for c in &node.control_inputs {
                live[c.index()] = true;
            }
        }
    }
    live
}

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Nested code first, so this level sees simplified subgraphs.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g, cx))
    }
}

impl Dce {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let live = live_nodes(g);
        let dead = live.iter().filter(|l| !**l).count();
        // Library functions no call refers to are dropped by a rebuild too.
        let used_funcs = {
            let mut used: Vec<bool> = vec![false; g.library.len()];
            for (id, node) in g.nodes() {
                if let Op::Call { func } = node.op {
                    if live[id.index()] {
                        used[func.index()] = true;
                    }
                }
            }
            used.iter().filter(|u| **u).count()
        };
        if dead == 0 && used_funcs == g.library.len() {
            return PassResult::unchanged();
        }
        let mut rw = Rewriter::new(g);
        for (id, _) in g.nodes() {
            if live[id.index()] && !rw.is_mapped(id) {
                rw.copy(id);
            }
        }
        *g = rw.finish();
        if dead == 0 {
            return PassResult::changed("unused library functions dropped");
        }
        PassResult::count(dead, if dead == 1 { "node removed" } else { "nodes removed" })
    }
}
