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

use crate::{Graph, Node, Op};

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
fn graph_diff(out: &mut String, a: &Graph, b: &Graph) {
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
    x.inputs == y.inputs && x.control_inputs == y.control_inputs && x.outputs == y.outputs && op_eq(inner, &x.op, &y.op)
}

/// Op equality, exhaustive over `a` so a new variant must say what equal
/// means for it.
fn op_eq(inner: &mut String, a: &Op, b: &Op) -> bool {
    match a {
        Op::Parameter { index } => matches!(b, Op::Parameter { index: j } if index == j),
        Op::Constant { value } => matches!(b, Op::Constant { value: w } if value.bit_eq(w)),
        Op::Unary(u) => matches!(b, Op::Unary(v) if u == v),
        Op::Binary(u) => matches!(b, Op::Binary(v) if u == v),
        Op::Select => matches!(b, Op::Select),
        Op::Cast { to } => matches!(b, Op::Cast { to: t } if to == t),
        Op::Clamp { min, max } => {
            matches!(b, Op::Clamp { min: m, max: n } if min.to_bits() == m.to_bits() && max.to_bits() == n.to_bits())
        }
        Op::Reduce { op, axes, keepdims } => {
            matches!(b, Op::Reduce { op: o, axes: x, keepdims: k } if op == o && axes == x && keepdims == k)
        }
        Op::ArgReduce { op, axis, keepdims } => {
            matches!(b, Op::ArgReduce { op: o, axis: x, keepdims: k } if op == o && axis == x && keepdims == k)
        }
        Op::MatMul => matches!(b, Op::MatMul),
        Op::Reshape { shape } => matches!(b, Op::Reshape { shape: s } if shape == s),
        Op::Transpose { perm } => matches!(b, Op::Transpose { perm: p } if perm == p),
        Op::BroadcastTo { shape } => matches!(b, Op::BroadcastTo { shape: s } if shape == s),
        Op::ExpandDims { axis } => matches!(b, Op::ExpandDims { axis: x } if axis == x),
        Op::Squeeze { axes } => matches!(b, Op::Squeeze { axes: x } if axes == x),
        Op::Concat { axis } => matches!(b, Op::Concat { axis: x } if axis == x),
        Op::Stack { axis } => matches!(b, Op::Stack { axis: x } if axis == x),
        Op::Slice { specs } => matches!(b, Op::Slice { specs: s } if specs == s),
        Op::Gather { axis } => matches!(b, Op::Gather { axis: x } if axis == x),
        Op::OneHot { depth, dtype } => matches!(b, Op::OneHot { depth: d, dtype: t } if depth == d && dtype == t),
        Op::Call { func } => matches!(b, Op::Call { func: f } if func == f),
        Op::Fused { body } => {
            let Op::Fused { body: other } = b else { return false };
            graph_diff(inner, body, other);
            inner.is_empty()
        }
        Op::Cond { branches } => {
            let Op::Cond { branches: other } = b else { return false };
            branches.iter().zip(other).all(|(x, y)| {
                graph_diff(inner, x, y);
                inner.is_empty()
            })
        }
        Op::While { parts, trip_count, cancel } => {
            let Op::While { parts: other, trip_count: t, cancel: c } = b else { return false };
            trip_count == t
                && cancel.is_some() == c.is_some()
                && parts.iter().zip(other).all(|(x, y)| {
                    graph_diff(inner, x, y);
                    inner.is_empty()
                })
        }
        Op::Kernel { name, inputs, outputs, .. } => matches!(
            b,
            Op::Kernel { name: n, inputs: i, outputs: o, .. } if name == n && inputs == i && outputs == o
        ),
        Op::GatherElements { axis } => matches!(b, Op::GatherElements { axis: x } if axis == x),
        Op::ScatterAdd { axis } => matches!(b, Op::ScatterAdd { axis: x } if axis == x),
        Op::DynamicSlice { sizes } => matches!(b, Op::DynamicSlice { sizes: s } if sizes == s),
        Op::DynamicUpdateSlice => matches!(b, Op::DynamicUpdateSlice),
        Op::Pad { pads, value } => {
            matches!(b, Op::Pad { pads: p, value: v } if pads == p && value.to_bits() == v.to_bits())
        }
        Op::Cumsum { axis } => matches!(b, Op::Cumsum { axis: x } if axis == x),
        Op::TopK { k } => matches!(b, Op::TopK { k: j } if k == j),
        Op::Spatial(sp) => matches!(b, Op::Spatial(o) if sp == o),
        Op::Random { dist, dtype, shape } => {
            let bits = |d: &tracejit_tensor::RandomDist| {
                let (p, q) = d.params();
                (d.name(), p.to_bits(), q.to_bits())
            };
            matches!(b, Op::Random { dist: e, dtype: t, shape: s } if bits(dist) == bits(e) && dtype == t && shape == s)
        }
        Op::ReadVariable { var, locked } => {
            matches!(b, Op::ReadVariable { var: v, locked: l } if var == v && locked == l)
        }
        Op::AssignVariable { var, kind, locked } => {
            matches!(b, Op::AssignVariable { var: v, kind: k, locked: l } if var == v && kind == k && locked == l)
        }
    }
}
