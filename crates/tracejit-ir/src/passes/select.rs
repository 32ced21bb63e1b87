//! `selector`: the implementation selector of composite ops (TensorFlow's RFC
//! "Standardizing Composite Operations").
//!
//! A `Call` whose callee is marked `implements = "org.semantic.opname"`
//! becomes an [`Op::Kernel`] node when the context's [`KernelRegistry`]
//! has a kernel registered for that name that accepts the call's argument
//! types; the kernel is resolved now, when the function is optimized, so a
//! later registration does not change graphs already built. Otherwise the
//! callee's body is inlined (and fused with its surroundings later). Calls
//! inside an inlined body get the same treatment; plain (non-composite)
//! calls met there are inlined, while plain calls of the graph itself are
//! left to the `inline` pass.
//!
//! The kernel node keeps the call's argument types as its accepted input
//! types and the call's result types as its outputs.
//!
//! [`KernelRegistry`]: crate::passes::KernelRegistry

use crate::passes::rewrite::CallAction;
use crate::passes::{Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, LibraryFunction, Op, TensorType};

/// The implementation selector (`selector`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectImplementation;

impl Pass for SelectImplementation {
    fn name(&self) -> &'static str {
        "selector"
    }

    fn selects_implementations(&self) -> bool {
        true
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let composite = |f: &LibraryFunction| f.implements().is_some();
        if !g.nodes().any(|(_, n)| matches!(n.op, Op::Call { func } if composite(g.library.get(func)))) {
            return PassResult::unchanged();
        }
        let choose = |f: &LibraryFunction, types: &[TensorType]| -> CallAction {
            let name = f.implements().unwrap_or_default();
            match cx.kernels.as_ref().and_then(|k| k.lookup(name, types)) {
                Some(kernel) => CallAction::Kernel(kernel),
                None => CallAction::Inline,
            }
        };
        let mut rw = Rewriter::new(g);
        let (mut kernels, mut inlined) = (0usize, 0usize);
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let composite_callee =
                if let Op::Call { func } = node.op { Some(g.library.get(func)).filter(|f| composite(f)) } else { None };
            let Some(callee) = composite_callee else {
                rw.copy(id);
                continue;
            };
            let args = rw.inputs(id);
            let types: Vec<TensorType> = args.iter().map(|&v| rw.value_type(v).clone()).collect();
            let control = rw.control(id);
            match choose(callee, &types) {
                CallAction::Kernel(kernel) => {
                    let op = Op::Kernel {
                        name: callee.implements().unwrap_or_default().to_string(),
                        kernel,
                        inputs: types,
                        outputs: node.outputs.to_vec(),
                    };
                    let new =
                        rw.emit(op, &args, &control, node.location).expect("a kernel node takes the call's types");
                    let outs: Vec<_> = (0..node.outputs.len()).map(|i| crate::ValueId::new(new, i as u32)).collect();
                    rw.map(id, &outs, &[new]);
                    kernels += 1;
                }
                CallAction::Inline | CallAction::Keep => {
                    let mut policy = |f: &LibraryFunction, t: &[TensorType]| {
                        if composite(f) {
                            choose(f, t)
                        } else {
                            CallAction::Inline
                        }
                    };
                    if rw.inline_call(id, &callee.graph, &mut policy) {
                        inlined += 1;
                    }
                }
            }
        }
        if kernels + inlined == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        let mut parts = Vec::new();
        if kernels > 0 {
            parts.push(format!("{kernels} composite(s) -> kernel"));
        }
        if inlined > 0 {
            parts.push(format!("{inlined} composite(s) inlined"));
        }
        PassResult::changed(parts.join(", "))
    }
}
