//! `const_fold`: evaluates nodes whose inputs are all constants with the
//! reference kernels ([`eval_primitive`]) and replaces them by constants.
//!
//! Folded results are bitwise what the interpreter would compute at run
//! time, because it is the same kernel. What is never folded:
//! - stateful ops and anything with side effects, calls, kernels and fused
//!   regions (only primitive ops are evaluated). Random number ops are not IR
//!   ops; eager `randn` values reach graphs as constants already;
//! - results with more than [`PassContext::fold_limit`] elements (1024 by
//!   default, so a broadcast of a scalar to a big shape stays a broadcast and
//!   no big constant is materialized), or whose inputs hold more than
//!   [`MAX_FOLD_INPUT_ELEMENTS`] elements together (bounds the time spent);
//! - nodes with an unknown output shape, and nodes whose kernel fails (an
//!   out-of-range `gather` index): they are left to fail at run time, as
//!   they would without the pass.

use smallvec::SmallVec;
use tracejit_tensor::Storage;

use crate::passes::{has_side_effects, run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::OpClass;
use crate::{eval_primitive, Graph, Op};

/// Folding evaluates no node whose inputs have more elements than this.
pub const MAX_FOLD_INPUT_ELEMENTS: usize = 1 << 20;

/// The constant folding pass (`const_fold`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConstantFolding;

/// True for ops constant folding may evaluate: pure primitives. Calls,
/// kernels and ops holding code (`Op::subgraphs`) are left to run.
fn foldable(g: &Graph, op: &Op) -> bool {
    let evaluable = match op.class() {
        OpClass::Elementwise
        | OpClass::Broadcast
        | OpClass::Layout
        | OpClass::Reduction
        | OpClass::Contraction
        | OpClass::Spatial
        | OpClass::Indexing
        | OpClass::Scan => true,
        OpClass::Source
        | OpClass::Random
        | OpClass::Region
        | OpClass::Control
        | OpClass::Call
        | OpClass::Kernel
        | OpClass::State => false,
    };
    evaluable && !has_side_effects(g, op)
}

impl Pass for ConstantFolding {
    fn name(&self) -> &'static str {
        "const_fold"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Nested code first, so this level sees simplified subgraphs.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g, cx))
    }
}

impl ConstantFolding {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let mut rw = Rewriter::new(g);
        let mut folded = 0usize;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let small = node.outputs.iter().all(|t| t.num_elements().is_some_and(|n| n <= cx.fold_limit));
            if !foldable(g, &node.op) || !small {
                rw.copy(id);
                continue;
            }
            let inputs = rw.inputs(id);
            // Storage clones share their buffers.
            let values: Option<SmallVec<[Storage; 2]>> = inputs
                .iter()
                .map(|v| {
                    let Op::Constant { value } = &rw.graph().node(v.node).op else { return None };
                    Some(value.clone())
                })
                .collect();
            let Some(values) = values else {
                rw.copy(id);
                continue;
            };
            if values.iter().map(|s| s.len()).sum::<usize>() > MAX_FOLD_INPUT_ELEMENTS {
                rw.copy(id);
                continue;
            }
            let refs: SmallVec<[&Storage; 2]> = values.iter().collect();
            let result = crate::catch_quietly(|| eval_primitive(&node.op, &refs));
            let Ok(outs) = result else {
                rw.copy(id);
                continue;
            };
            let fits = outs.len() == node.outputs.len()
                && outs.iter().zip(&node.outputs).all(|(s, t)| t.accepts(s.dtype(), s.shape()));
            if !fits {
                rw.copy(id);
                continue;
            }
            let consts: Vec<_> = outs.into_iter().map(|s| rw.constant(s.to_standard())).collect();
            rw.alias(id, &consts);
            folded += 1;
        }
        if folded == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(folded, if folded == 1 { "node folded" } else { "nodes folded" })
    }
}
