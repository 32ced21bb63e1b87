//! `inline`: replaces every `Call` node by a copy of its callee's body, so
//! later passes see (and fuse across) whole programs.
//!
//! The exception is a composite — a callee whose function carries an
//! `implements` attribute — while the implementation selector is still to
//! run ([`PassContext::keep_composites`]): the selector decides whether it
//! becomes a registered kernel or is inlined. A call of a custom-gradient
//! function is inlined like a plain call (it has no kernel), except in a
//! graph a gradient tape differentiates ([`PassContext::keep_custom_gradients`]). Inlining is recursive (calls
//! inside an inlined body are handled by the same rule), fused regions of an
//! inlined body are dissolved into plain nodes (fusion is planned again over
//! the caller), and variables of the body join the caller's table.
//!
//! A conditional whose predicate is a constant is replaced by its taken
//! branch the same way (the branch is inlined in its place), so a `cond` on
//! a value known at trace time costs nothing.
//!
//! Control edges survive: side-effecting nodes of the body wait for the
//! call's control inputs, and nodes that waited for the call wait for the
//! body's side effects and results.

use crate::passes::rewrite::CallAction;
use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, Op};

/// The inlining pass (`inline`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Inline;

impl Pass for Inline {
    fn name(&self) -> &'static str {
        "inline"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Nested code first, so this level sees simplified subgraphs.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g, cx))
    }
}

impl Inline {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let keep = |f: &crate::LibraryFunction| {
            let custom = crate::autodiff::is_custom_gradient(f);
            if custom {
                cx.keep_custom_gradients
            } else {
                cx.keep_composites && f.implements().is_some()
            }
        };
        let constant_pred = |n: &crate::Node| {
            if !matches!(n.op, Op::Cond { .. }) {
                return None;
            }
            let Op::Constant { value } = &g.node(n.inputs.first()?.node).op else { return None };
            value.to_vec::<bool>().ok().and_then(|v| v.first().copied())
        };
        let wanted = g.nodes().any(|(_, n)| {
            matches!(n.op, Op::Call { func } if !keep(g.library.get(func))) || constant_pred(n).is_some()
        });
        if !wanted {
            return PassResult::unchanged();
        }
        let mut rw = Rewriter::new(g);
        let (mut inlined, mut folded) = (0usize, 0usize);
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let mut policy = |f: &crate::LibraryFunction, _: &[crate::TensorType]| {
                if keep(f) {
                    CallAction::Keep
                } else {
                    CallAction::Inline
                }
            };
            if let (Some(taken), Op::Cond { branches }) = (constant_pred(node), &node.op) {
                let branch = branches[if taken { 0 } else { 1 }].clone();
                let (args, control) = (rw.inputs(id), rw.control(id));
                match rw.inline_body(&branch, &args[1..], &control, &mut policy) {
                    Ok((outs, stands)) => {
                        rw.map(id, &outs, &stands);
                        folded += 1;
                    }
                    Err(_) => {
                        rw.copy(id);
                    }
                }
                continue;
            }
            let Op::Call { func } = node.op else {
                rw.copy(id);
                continue;
            };
            let callee = g.library.get(func);
            if keep(callee) {
                rw.copy(id);
                continue;
            }
            if rw.inline_call(id, &callee.graph, &mut policy) {
                inlined += 1;
            }
        }
        if inlined + folded == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(inlined, if inlined == 1 { "call inlined" } else { "calls inlined" }).and(PassResult::count(
            folded,
            if folded == 1 { "cond folded to its branch" } else { "conds folded to their branch" },
        ))
    }
}
