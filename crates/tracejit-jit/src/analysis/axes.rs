//! The first two steps of region analysis ([`super::analyze`]): which
//! nodes are live (reach an output), and axis unification — every axis of
//! every live value becomes a unit (statically of size 1) or an axis class,
//! classes merging through a union-find as broadcasting aligns operands,
//! with the static sizes and the runtime size sources found on the way.

use cranelift_entity::EntityRef;
use tracejit_ir::tensor::Storage;
use tracejit_ir::{Graph, Node, NodeId, Op, TensorType};

use super::unify::{aligned, Ax, UnionFind};
use super::{SizeSource, MAX_CONST_ELEMENTS};

/// Which nodes of `body` reach one of its outputs.
pub(super) fn liveness(body: &Graph) -> Result<Vec<bool>, String> {
    let n = body.len();
    if body.outputs.is_empty() {
        return Err("the region has no outputs".into());
    }
    let mut live = vec![false; n];
    for v in &body.outputs {
        if v.node.index() >= n {
            return Err(format!("output {v} does not exist"));
        }
        live[v.node.index()] = true;
    }
    for (id, node) in body.nodes().collect::<Vec<_>>().into_iter().rev() {
        if live[id.index()] {
            for v in &node.inputs {
                live[v.node.index()] = true;
            }
        }
    }
    Ok(live)
}

/// The axes of every live value after unification, and the constraints
/// found on the way (checked once classes are canonical).
pub(super) struct Unified {
    pub uf: UnionFind,
    /// Per node: its output's axes (empty for dead nodes).
    pub axes: Vec<Vec<Ax>>,
    /// A static size per raw class.
    pub static_raw: Vec<(u32, usize)>,
    /// A parameter axis giving a raw class's size at run time.
    pub sources_raw: Vec<(u32, SizeSource)>,
    /// The live reductions, by node index.
    pub reduce_nodes: Vec<usize>,
}

/// Unifies the axes of the live nodes of `body`; `Err` names the first
/// node the JIT cannot compile.
pub(super) fn unify(body: &Graph, live: &[bool]) -> Result<Unified, String> {
    let mut u = Unified {
        uf: UnionFind { parent: Vec::new() },
        axes: vec![Vec::new(); body.len()],
        static_raw: Vec::new(),
        sources_raw: Vec::new(),
        reduce_nodes: Vec::new(),
    };
    for (id, node) in body.nodes() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        if node.inputs.iter().any(|v| v.index != 0) || node.outputs.len() != 1 {
            return Err(format!("node {id} ({}) has more than one output", node.op.name()));
        }
        u.axes[i] = u.node_axes(id, node)?;
    }
    Ok(u)
}

impl Unified {
    /// The axes of `node`'s output, from its inputs' (already unified),
    /// merging classes and noting constraints. Every op is listed: a new op
    /// is a compile error here until the JIT decides whether it fuses.
    fn node_axes(&mut self, id: NodeId, node: &Node) -> Result<Vec<Ax>, String> {
        let i = id.index();
        let ins: Vec<Vec<Ax>> = node.inputs.iter().map(|v| self.axes[v.node.index()].clone()).collect();
        let input_axes = |k: usize| -> &Vec<Ax> { &ins[k] };
        Ok(match &node.op {
            Op::Parameter { index } => self.parameter_axes(*index, &node.outputs[0]),
            Op::Constant { value } => self.constant_axes(id, value)?,
            Op::Unary(_) | Op::Cast { .. } | Op::Clamp { .. } => input_axes(0).clone(),
            Op::Binary(_) | Op::Select => self.broadcast_operands(&ins),
            Op::BroadcastTo { shape } => self.broadcast_to_axes(id, input_axes(0), shape)?,
            Op::OneHot { depth, .. } => {
                // `out[.., j] = labels[..] == j`: the labels' axes and a new
                // inner axis of `depth`, indexed by an iota constant.
                if *depth > MAX_CONST_ELEMENTS {
                    return Err(format!("one_hot {id} has depth {depth}"));
                }
                let mut out = input_axes(0).clone();
                out.push(if *depth == 1 {
                    Ax::Unit
                } else {
                    let c = self.uf.fresh();
                    self.static_raw.push((c, *depth));
                    Ax::Class(c)
                });
                out
            }
            Op::ExpandDims { axis } => {
                let mut out = input_axes(0).clone();
                if *axis > out.len() {
                    return Err(format!("expand_dims {id}: axis out of range"));
                }
                out.insert(*axis, Ax::Unit);
                out
            }
            Op::Reduce { axes: red, keepdims, .. } => {
                let inp = input_axes(0).clone();
                if red.is_empty() {
                    return Err(format!("reduce {id} has no axes"));
                }
                let mut out = Vec::new();
                for (a, ax) in inp.iter().enumerate() {
                    if red.contains(&a) {
                        if *ax == Ax::Unit {
                            return Err(format!("reduce {id} reduces a static size-1 axis"));
                        }
                        if *keepdims {
                            out.push(Ax::Unit);
                        }
                    } else {
                        out.push(*ax);
                    }
                }
                self.reduce_nodes.push(i);
                out
            }
            // Every other op is outside what a region kernel computes (the op's class is
            // not elementwise, broadcast or a reduction).
            other => return Err(format!("node {id}: op `{}` is not fusible", other.name())),
        })
    }

    /// A parameter's axes: a fresh class per axis not known to be 1, whose
    /// size comes from the parameter at run time (and is static when known).
    fn parameter_axes(&mut self, index: usize, ty: &TensorType) -> Vec<Ax> {
        ty.dims
            .iter()
            .enumerate()
            .map(|(axis, d)| match d {
                Some(1) => Ax::Unit,
                _ => {
                    let c = self.uf.fresh();
                    self.sources_raw.push((c, SizeSource { param: index, axis }));
                    if let Some(s) = d {
                        self.static_raw.push((c, *s));
                    }
                    Ax::Class(c)
                }
            })
            .collect()
    }

    /// A constant's axes: a class of static size per axis over 1 (a scalar
    /// broadcasts); too large a constant is refused.
    fn constant_axes(&mut self, id: NodeId, value: &Storage) -> Result<Vec<Ax>, String> {
        if value.len() != 1 && value.len() > MAX_CONST_ELEMENTS {
            return Err(format!("constant {id} has {} elements", value.len()));
        }
        Ok(value
            .shape()
            .iter()
            .map(|&d| {
                if d == 1 || value.len() == 1 {
                    Ax::Unit
                } else {
                    let c = self.uf.fresh();
                    self.static_raw.push((c, d));
                    Ax::Class(c)
                }
            })
            .collect())
    }

    /// Elementwise operands broadcast numpy-style: the classes of aligned
    /// axes are unified.
    fn broadcast_operands(&mut self, ins: &[Vec<Ax>]) -> Vec<Ax> {
        let rank = ins.iter().map(Vec::len).max().unwrap_or(0);
        let mut out = Vec::with_capacity(rank);
        for j in 0..rank {
            let mut cls: Option<u32> = None;
            for input in ins {
                if let Ax::Class(c) = aligned(input, rank, j) {
                    match cls {
                        None => cls = Some(c),
                        Some(c0) => self.uf.union(c0, c),
                    }
                }
            }
            out.push(cls.map_or(Ax::Unit, Ax::Class));
        }
        out
    }

    /// `broadcast_to(shape)`: the input's classes get the target's static
    /// sizes; new or size-1 axes become classes of their own.
    fn broadcast_to_axes(&mut self, id: NodeId, inp: &[Ax], shape: &[usize]) -> Result<Vec<Ax>, String> {
        let rank = shape.len();
        if inp.len() > rank {
            return Err(format!("broadcast_to {id} lowers the rank"));
        }
        let mut out = Vec::with_capacity(rank);
        for (j, &t) in shape.iter().enumerate() {
            match aligned(inp, rank, j) {
                Ax::Class(c) => {
                    self.static_raw.push((c, t));
                    out.push(Ax::Class(c));
                }
                Ax::Unit if t == 1 => out.push(Ax::Unit),
                Ax::Unit => {
                    let c = self.uf.fresh();
                    self.static_raw.push((c, t));
                    out.push(Ax::Class(c));
                }
            }
        }
        Ok(out)
    }
}
