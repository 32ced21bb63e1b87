//! The graph that is exported: the traced graph of a `ConcreteFunction`
//! optimized like the JIT's pipeline up to, but not including, the
//! implementation selector and fusion. What remains is primitives plus the
//! calls of composites (`implements`), which become ONNX local functions:
//!
//! ```text
//! inline                        every non-composite call (fused regions of
//!                               inlined bodies dissolve into primitives)
//! fixpoint (cap 8):             const_fold, simplify, cse, dce
//! ```
//!
//! Starting from the traced graph rather than the optimized one is what
//! makes a composite that runs as a native kernel export its primitive
//! body: the kernel choice is made by the selector, which never runs here.

use std::sync::Arc;

use tracejit_ir::passes::{ConstantFolding, Cse, Dce, Inline, Pass, PassContext, Simplify};
use tracejit_ir::{verify, FunctionAttrs, FunctionLibrary, Graph, LibraryFunction, Op};
use tracejit_trace::ConcreteFunction;

use crate::{Error, Result};

/// Rounds of the simplification group at most (the JIT pipeline's cap).
const MAX_ROUNDS: usize = 8;

/// The exported form of `cf`'s graph. With `inline_composites`, composite
/// calls are inlined too (for runtimes without ONNX local functions);
/// composites that read or write variables are always inlined, since an
/// ONNX function cannot see the model's initializers.
pub(crate) fn main_graph(cf: &ConcreteFunction, inline_composites: bool) -> Result<Graph> {
    let function = cf.name().to_string();
    let graph = cf.graph();
    if graph.params.len() != cf.signature().len() {
        return Err(Error::Function {
            function,
            message: format!(
                "it reads {} symbolic tensor(s) of an enclosing trace besides its {} argument(s); export the \
                 enclosing function instead",
                graph.params.len() - cf.signature().len(),
                cf.signature().len()
            ),
        });
    }
    let mut g = graph.clone();
    demote_everywhere(&mut g, &|f| inline_composites || !f.graph.effects().is_pure());
    optimize(&mut g, &function)?;
    Ok(g)
}

/// The body of composite `f` as a graph of primitives (its fused regions
/// dissolved), keeping calls of composites nested in it.
pub(crate) fn composite_body(f: &LibraryFunction) -> Result<Graph> {
    let mut g = Graph::new(f.name.clone());
    let params: Vec<_> = f.graph.param_types().into_iter().map(|t| g.add_param(t)).collect();
    let plain = LibraryFunction { name: f.name.clone(), attrs: FunctionAttrs::default(), graph: f.graph.clone() };
    let func = g.library.add(plain);
    let call = g.add_node(Op::Call { func }, &params, &[], None).map_err(|e| Error::Function {
        function: f.name.clone(),
        message: format!("cannot call the composite's body: {e}"),
    })?;
    g.outputs = (0..f.graph.outputs.len() as u32).map(|i| tracejit_ir::ValueId::new(call, i)).collect();
    run(&Inline, &mut g, &f.name)?;
    Ok(g)
}

/// A copy of `library` in which the composites `demote` picks are plain
/// functions (the inliner then inlines their calls). Ids stay the same:
/// functions are re-added in id order.
fn demote_composites(library: &FunctionLibrary, demote: &dyn Fn(&LibraryFunction) -> bool) -> FunctionLibrary {
    let mut out = FunctionLibrary::default();
    for (_, f) in library.iter() {
        let mut f = f.clone();
        if f.implements().is_some() && demote(&f) {
            f.attrs = FunctionAttrs::default();
            f.graph = Arc::new(demote_nested(&f.graph, demote));
        }
        out.add(f);
    }
    out
}

/// `g` with the composites of its own library demoted as well.
fn demote_nested(g: &Graph, demote: &dyn Fn(&LibraryFunction) -> bool) -> Graph {
    let mut g = g.clone();
    g.library = demote_composites(&g.library, demote);
    g
}

/// Demotes the composites `demote` picks in `g`'s library and in the
/// libraries of its subgraphs (branches and loop bodies call through their
/// own libraries).
fn demote_everywhere(g: &mut Graph, demote: &dyn Fn(&LibraryFunction) -> bool) {
    g.library = demote_composites(&g.library, demote);
    let holders: Vec<_> = g.nodes().filter(|(_, n)| !n.op.subgraphs().is_empty()).map(|(id, _)| id).collect();
    for id in holders {
        for sub in g.node_mut(id).op.subgraphs_mut() {
            let mut inner = (**sub).clone();
            demote_everywhere(&mut inner, demote);
            *sub = Arc::new(inner);
        }
    }
}

/// Inlines non-composite calls, then simplifies to a fixpoint.
fn optimize(g: &mut Graph, function: &str) -> Result<()> {
    run(&Inline, g, function)?;
    for _ in 0..MAX_ROUNDS {
        let mut changed = false;
        for pass in [&ConstantFolding as &dyn Pass, &Simplify, &Cse, &Dce] {
            changed |= run(pass, g, function)?;
        }
        if !changed {
            break;
        }
    }
    Ok(())
}

/// Runs one pass with composite calls kept, then the verifier.
fn run(pass: &dyn Pass, g: &mut Graph, function: &str) -> Result<bool> {
    let mut cx = PassContext::new(function);
    cx.keep_composites = true;
    let changed = pass.run(g, &cx).changed;
    verify(g).map_err(|e| Error::Function {
        function: function.to_string(),
        message: format!("the graph is malformed after pass `{}` (a bug in tracejit): {e}", pass.name()),
    })?;
    Ok(changed)
}
