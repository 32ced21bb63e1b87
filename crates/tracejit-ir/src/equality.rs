//! Structural equality of graphs: what "the parser gives back the graph that
//! was printed" means. `Graph` has no `PartialEq` because what it holds has
//! no obvious one (`Storage` constants with NaNs, `Arc<dyn VariableResource>`
//! variables, `Arc<dyn ExternalKernel>` code), so equality is spelled out:
//!
//! - names, parameter lists, outputs, and nodes compared id by id (op,
//!   inputs, control inputs, output types);
//! - constants bitwise: NaN equals NaN with the same bits, `0.0` and `-0.0`
//!   differ, f32 and f64 differ; the same holds for `clamp` bounds;
//! - variables by id, name, dtype and shape (not by identity or value: a
//!   parsed graph has stand-in variables);
//! - kernels by name and declared types (not by code);
//! - library functions by name, attributes and body, and fused bodies,
//!   recursively;
//! - source locations are ignored (the text form does not carry them).

use std::fmt::Write as _;

use crate::{Graph, Node};

impl Graph {
    /// True when `self` and `other` are the same graph structurally (see the
    /// `equality` module docs: constants bitwise, variables by name and type,
    /// kernels by name, locations ignored).
    pub fn structurally_eq(&self, other: &Graph) -> bool {
        self.structural_diff(other).is_none()
    }

    /// The first structural difference between `self` and `other`, as a
    /// sentence naming the graph and node (`graph `g` node %3: op differs`),
    /// or `None` when they are structurally equal.
    pub fn structural_diff(&self, other: &Graph) -> Option<String> {
        let mut out = String::new();
        graph_diff(&mut out, self, other);
        (!out.is_empty()).then_some(out)
    }
}

/// Writes the first difference into `out`; leaves it empty when equal.
pub(crate) fn graph_diff(out: &mut String, a: &Graph, b: &Graph) {
    let mut fail = |what: String| {
        let _ = write!(out, "graph `{}`: {what}", a.name);
    };
    if a.name != b.name {
        return fail(format!("names differ (`{}` vs `{}`)", a.name, b.name));
    }
    if a.params != b.params {
        return fail(format!("parameters differ ({:?} vs {:?})", a.params, b.params));
    }
    if a.outputs != b.outputs {
        return fail(format!("outputs differ ({:?} vs {:?})", a.outputs, b.outputs));
    }
    if a.variables.len() != b.variables.len() {
        return fail(format!("{} vs {} variables", a.variables.len(), b.variables.len()));
    }
    for ((id, x), (_, y)) in a.variables.iter().zip(b.variables.iter()) {
        if x.name() != y.name() || x.dtype() != y.dtype() || x.shape() != y.shape() {
            return fail(format!(
                "variable {id} differs ({:?} {}{:?} vs {:?} {}{:?})",
                x.name(),
                x.dtype(),
                x.shape(),
                y.name(),
                y.dtype(),
                y.shape()
            ));
        }
    }
    if a.len() != b.len() {
        return fail(format!("{} vs {} nodes", a.len(), b.len()));
    }
    for ((id, x), (_, y)) in a.nodes().zip(b.nodes()) {
        let mut inner = String::new();
        if !node_eq(&mut inner, x, y) {
            let detail = if inner.is_empty() { String::new() } else { format!(": {inner}") };
            return fail(format!("node %{} differs ({:?} vs {:?}){detail}", id.as_u32(), x.op.name(), y.op.name()));
        }
    }
    if a.library.len() != b.library.len() {
        return fail(format!("{} vs {} library functions", a.library.len(), b.library.len()));
    }
    for ((id, x), (_, y)) in a.library.iter().zip(b.library.iter()) {
        let crate::FunctionAttrs { implements } = &x.attrs;
        if x.name != y.name || *implements != y.attrs.implements {
            return fail(format!("function {id} differs in name or attributes"));
        }
        let mut inner = String::new();
        graph_diff(&mut inner, &x.graph, &y.graph);
        if !inner.is_empty() {
            return fail(format!("function {id}: {inner}"));
        }
    }
}

/// Node equality; a difference inside a fused body is described in `inner`.
fn node_eq(inner: &mut String, x: &Node, y: &Node) -> bool {
    x.inputs == y.inputs && x.control_inputs == y.control_inputs && x.outputs == y.outputs && x.op.same_as(&y.op, inner)
}
