//! Region analysis: decides whether a region body is compilable (`supports`)
//! and, if so, lowers it to the small program the code generator emits.
//!
//! # The domain and its axis classes
//!
//! Every axis of every value in the body is either a *unit* (statically of
//! size 1: a broadcast axis) or belongs to an *axis class*. Classes are found
//! by unification over numpy's right-aligned broadcasting: the two operands of
//! a binary op put their aligned non-unit axes into one class, `expand_dims`
//! inserts a unit, `broadcast_to` adds a fresh class of a static size where it
//! widens a unit, and a reduction turns its reduced axes into units (keepdims)
//! or drops them. After unification the classes, ordered as they appear in the
//! values, form the iteration *domain* `F`; a value indexes the domain through
//! its classes (stride 0 on the others), so the whole region runs as one loop
//! nest over `F` with per-input strides.
//!
//! # What `supports` accepts (exactly)
//!
//! - Live nodes (those reaching an output) are only `Parameter`, `Constant`,
//!   `Unary`, `Binary`, `Select`, `Cast`, `Clamp`, `BroadcastTo`,
//!   `ExpandDims`, `OneHot` and `Reduce`; a constant is either a scalar (one
//!   element, baked into the code) or a tensor of at most
//!   [`MAX_CONST_ELEMENTS`] elements (read like an input). A `one_hot` of
//!   depth at most [`MAX_CONST_ELEMENTS`] adds a class of that size after
//!   its labels' and lowers to `cast(labels == iota)`, the iota a constant
//!   `[0, depth)` read along the new class.
//! - No value holds one class on two axes (no "diagonals", such as
//!   `x + expand_dims(x, 1)`), and every value's classes are in domain order.
//! - **Elementwise regions** (no `Reduce`): all outputs have the same classes,
//!   which are the domain.
//! - **Reduction regions**: every `Reduce` has an input whose classes are the
//!   domain and reduces the same set of classes `RA`, none of them a unit.
//!   - `RA` a suffix of the domain (including all of it): a *row* region
//!     (softmax, layernorm, full sums). Reductions may consume values that
//!     depend on earlier reductions, in any number of passes. Each value and
//!     each input holds either all of `RA` or none of it. Outputs hold the
//!     whole domain or exactly the kept classes.
//!   - `RA` a strict prefix: a *column* region (bias gradients). One pass
//!     only: no reduction depends on another, values that depend on a
//!     reduction hold no class of `RA`, and outputs are either the whole
//!     domain (not depending on a reduction) or exactly the kept classes.
//!     Each value and each input holds either all kept classes or none.
//!
//! Anything else returns an explanation, and the planner leaves the nodes to
//! the reference kernels.

use std::collections::HashMap;

use cranelift_entity::{entity_impl, EntityRef, PrimaryMap};
use smallvec::SmallVec;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, ValueId};

use crate::options::KernelKey;
pub(crate) use crate::scalar::Scalar;
use crate::unify::{aligned, Ax, UnionFind};

/// Constants larger than this are not folded into a region.
pub const MAX_CONST_ELEMENTS: usize = 1 << 16;

/// The three loop structures a region compiles to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KernelKind {
    /// No reduction: one loop nest over the domain.
    Elementwise,
    /// Reductions over trailing classes, row by row, in passes.
    Row,
    /// Reductions over leading classes, accumulated into per-column buffers.
    Column,
}

/// A node of the lowered program (`n3`): an index into [`Analysis::nodes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LNodeId(u32);
entity_impl!(LNodeId, "n");

/// An input slot of a kernel (`load2`): an index into [`Analysis::loads`].
/// A kernel's argument slots are its loads, then its outputs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LoadId(u32);
entity_impl!(LoadId, "load");

/// An operation of the lowered program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LOp {
    /// Reads an input slot (a parameter or a tensor constant).
    Load(LoadId),
    /// A scalar immediate.
    Const(Scalar),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast,
    /// Bounds already converted to the operand's dtype.
    Clamp(Scalar, Scalar),
    Reduce(ReduceOp),
}

/// A node of the lowered program; `inputs` index earlier nodes.
#[derive(Clone, Debug)]
pub(crate) struct LNode {
    pub op: LOp,
    pub inputs: SmallVec<[LNodeId; 3]>,
    /// Result dtype.
    pub dtype: DType,
    /// True when the value changes along the inner (vectorized) loop.
    pub varying: bool,
    /// Number of reductions on the longest dependency chain (row regions).
    pub stage: u32,
}

/// Where an input slot's data comes from.
#[derive(Clone, Debug)]
pub(crate) enum LoadSource {
    /// Region parameter `n`.
    Param(usize),
    /// A tensor constant of the body (standard layout).
    Const(Storage),
}

/// An input slot.
#[derive(Clone, Debug)]
pub(crate) struct LoadInfo {
    pub source: LoadSource,
    pub dtype: DType,
    /// For each axis of the input: its domain position, or `None` for a unit.
    pub axes: Vec<Option<usize>>,
    /// True when the input varies along the inner loop (read as vectors).
    pub contig: bool,
}

/// An output slot.
#[derive(Clone, Debug)]
pub(crate) struct OutputInfo {
    /// The lowered node stored there.
    pub node: LNodeId,
    pub dtype: DType,
    /// For each axis of the output: its domain position, or `None` for a unit.
    pub axes: Vec<Option<usize>>,
    /// True for a kept-level output of a reduction region.
    pub kept: bool,
}

/// A runtime size source of a domain class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeSource {
    pub param: usize,
    pub axis: usize,
}

/// Everything the code generator and the launcher need about a region.
#[derive(Clone, Debug)]
pub(crate) struct Analysis {
    pub kind: KernelKind,
    pub nodes: PrimaryMap<LNodeId, LNode>,
    pub loads: PrimaryMap<LoadId, LoadInfo>,
    pub outputs: Vec<OutputInfo>,
    /// Domain rank.
    pub rank: usize,
    /// Row: the reduced classes are `split..rank`; Column: `0..split`;
    /// Elementwise: `rank - 1` (the statically inner class) or 0 when rank is 0.
    pub split: usize,
    /// Per domain class: the parameter axes giving its runtime size.
    pub size_sources: Vec<Vec<SizeSource>>,
    /// Per domain class: a statically known size, if any.
    pub static_sizes: Vec<Option<usize>>,
    /// Highest reduction stage (row regions); 0 otherwise.
    pub passes: u32,
    /// True if some reduction is max or min (an empty reduced extent is an error).
    pub has_max_min: bool,
    /// The structural key of the kernel (with the options, the cache key).
    pub key: KernelKey,
}

/// Analyzes a region body. `Err` carries why it is not supported.
pub(crate) fn analyze(body: &Graph) -> Result<Analysis, String> {
    let n = body.len();
    if body.outputs.is_empty() {
        return Err("the region has no outputs".into());
    }
    // ---- liveness ----
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

    // ---- unification ----
    let mut uf = UnionFind { parent: Vec::new() };
    let mut axes: Vec<Vec<Ax>> = vec![Vec::new(); n];
    // Static size constraints per raw class (checked after canonicalization).
    let mut static_raw: Vec<(u32, usize)> = Vec::new();
    let mut sources_raw: Vec<(u32, SizeSource)> = Vec::new();
    let mut reduce_nodes: Vec<usize> = Vec::new();

    for (id, node) in body.nodes() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        let input_axes = |k: usize| -> &Vec<Ax> { &axes[node.inputs[k].node.index()] };
        if node.inputs.iter().any(|v| v.index != 0) || node.outputs.len() != 1 {
            return Err(format!("node {id} ({}) has more than one output", node.op.name()));
        }
        let out: Vec<Ax> = match &node.op {
            Op::Parameter { index } => {
                let ty = &node.outputs[0];
                ty.dims
                    .iter()
                    .enumerate()
                    .map(|(axis, d)| match d {
                        Some(1) => Ax::Unit,
                        _ => {
                            let c = uf.fresh();
                            sources_raw.push((c, SizeSource { param: *index, axis }));
                            if let Some(s) = d {
                                static_raw.push((c, *s));
                            }
                            Ax::Class(c)
                        }
                    })
                    .collect()
            }
            Op::Constant { value } => {
                if value.len() != 1 && value.len() > MAX_CONST_ELEMENTS {
                    return Err(format!("constant {id} has {} elements", value.len()));
                }
                value
                    .shape()
                    .iter()
                    .map(|&d| {
                        if d == 1 || value.len() == 1 {
                            Ax::Unit
                        } else {
                            let c = uf.fresh();
                            static_raw.push((c, d));
                            Ax::Class(c)
                        }
                    })
                    .collect()
            }
            Op::Unary(_) | Op::Cast { .. } | Op::Clamp { .. } => input_axes(0).clone(),
            Op::Binary(_) | Op::Select => {
                let k = node.inputs.len();
                let rank = (0..k).map(|j| input_axes(j).len()).max().unwrap_or(0);
                let mut out = Vec::with_capacity(rank);
                for j in 0..rank {
                    let mut cls: Option<u32> = None;
                    for q in 0..k {
                        if let Ax::Class(c) = aligned(input_axes(q), rank, j) {
                            match cls {
                                None => cls = Some(c),
                                Some(c0) => uf.union(c0, c),
                            }
                        }
                    }
                    out.push(cls.map_or(Ax::Unit, Ax::Class));
                }
                out
            }
            Op::BroadcastTo { shape } => {
                let inp = input_axes(0).clone();
                let rank = shape.len();
                if inp.len() > rank {
                    return Err(format!("broadcast_to {id} lowers the rank"));
                }
                let mut out = Vec::with_capacity(rank);
                for (j, &t) in shape.iter().enumerate() {
                    match aligned(&inp, rank, j) {
                        Ax::Class(c) => {
                            static_raw.push((c, t));
                            out.push(Ax::Class(c));
                        }
                        Ax::Unit if t == 1 => out.push(Ax::Unit),
                        Ax::Unit => {
                            let c = uf.fresh();
                            static_raw.push((c, t));
                            out.push(Ax::Class(c));
                        }
                    }
                }
                out
            }
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
                    let c = uf.fresh();
                    static_raw.push((c, *depth));
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
                reduce_nodes.push(i);
                out
            }
            other @ (Op::ArgReduce { .. }
            | Op::MatMul
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::Gather { .. }
            | Op::Call { .. }
            | Op::Fused { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. }) => return Err(format!("node {id}: op `{}` is not fusible", other.name())),
        };
        axes[i] = out;
    }

    // ---- canonical classes ----
    let canon = |uf: &mut UnionFind, a: &[Ax]| -> Vec<Option<u32>> {
        a.iter()
            .map(|x| match x {
                Ax::Unit => None,
                Ax::Class(c) => Some(uf.find(*c)),
            })
            .collect()
    };
    let mut caxes: Vec<Vec<Option<u32>>> = vec![Vec::new(); n];
    for i in 0..n {
        if live[i] {
            caxes[i] = canon(&mut uf, &axes[i]);
            let cls: Vec<u32> = caxes[i].iter().flatten().copied().collect();
            for (p, c) in cls.iter().enumerate() {
                if cls[p + 1..].contains(c) {
                    return Err(format!("node n{i} indexes one axis class on two axes"));
                }
            }
        }
    }
    let seq = |i: usize| -> Vec<u32> { caxes[i].iter().flatten().copied().collect() };

    // ---- the domain ----
    let (kind, domain, reduced): (KernelKind, Vec<u32>, Vec<u32>) = if reduce_nodes.is_empty() {
        let d = seq(body.outputs[0].node.index());
        for v in &body.outputs {
            if seq(v.node.index()) != d {
                return Err("outputs index different axes".into());
            }
        }
        (KernelKind::Elementwise, d, Vec::new())
    } else {
        let mut d: Option<Vec<u32>> = None;
        let mut ra: Option<Vec<u32>> = None;
        for &r in &reduce_nodes {
            let node = body.node(tracejit_ir::NodeId::new(r));
            let x = node.inputs[0].node.index();
            let s = seq(x);
            let Op::Reduce { axes: red, .. } = &node.op else { unreachable!() };
            let mut rc: Vec<u32> = red.iter().map(|&a| caxes[x][a].expect("checked non-unit")).collect();
            rc.sort_unstable();
            if let Some(d0) = &d {
                if *d0 != s {
                    return Err("reductions read values of different axes".into());
                }
            } else {
                d = Some(s);
            }
            if let Some(r0) = &ra {
                if *r0 != rc {
                    return Err("reductions reduce different axes".into());
                }
            } else {
                ra = Some(rc);
            }
        }
        let d = d.expect("at least one reduction");
        let ra = ra.expect("at least one reduction");
        let k = d.len() - ra.len();
        let mut suffix: Vec<u32> = d[k..].to_vec();
        suffix.sort_unstable();
        let mut prefix: Vec<u32> = d[..ra.len()].to_vec();
        prefix.sort_unstable();
        let ordered: Vec<u32> = if suffix == ra {
            d[k..].to_vec()
        } else if prefix == ra {
            d[..ra.len()].to_vec()
        } else {
            return Err("reduced axes are neither leading nor trailing".into());
        };
        let kind = if suffix == ra { KernelKind::Row } else { KernelKind::Column };
        (kind, d, ordered)
    };
    let rank = domain.len();
    let pos: HashMap<u32, usize> = domain.iter().enumerate().map(|(p, &c)| (c, p)).collect();
    // Every value's classes are in domain order.
    for (i, &is_live) in live.iter().enumerate() {
        if !is_live {
            continue;
        }
        let mut last: Option<usize> = None;
        for c in seq(i) {
            let Some(&p) = pos.get(&c) else {
                return Err(format!("node n{i} indexes an axis outside the region's domain"));
            };
            if last.is_some_and(|l| l >= p) {
                return Err(format!("node n{i} indexes the domain out of order"));
            }
            last = Some(p);
        }
    }
    let split = match kind {
        KernelKind::Elementwise => rank.saturating_sub(1),
        KernelKind::Row => rank - reduced.len(),
        KernelKind::Column => reduced.len(),
    };
    // The inner classes: Row: reduced suffix; Column: kept suffix; Elementwise: last.
    let inner: Vec<usize> = match kind {
        KernelKind::Elementwise => {
            if rank == 0 {
                vec![]
            } else {
                vec![rank - 1]
            }
        }
        _ => (split..rank).collect(),
    };
    let holds_inner = |i: usize| -> Result<bool, String> {
        let s: Vec<usize> = seq(i).iter().map(|c| pos[c]).collect();
        let cnt = inner.iter().filter(|p| s.contains(p)).count();
        if cnt == 0 {
            Ok(false)
        } else if cnt == inner.len() {
            Ok(true)
        } else {
            Err(format!("node n{i} holds only part of the inner axes"))
        }
    };

    // ---- lowering ----
    let mut lnodes: PrimaryMap<LNodeId, LNode> = PrimaryMap::new();
    let mut loads: PrimaryMap<LoadId, LoadInfo> = PrimaryMap::new();
    // The lowered node computing each body node (broadcasts alias their input).
    let mut map: Vec<Option<LNodeId>> = vec![None; n];
    let mut has_max_min = false;
    let mut key = KernelKey::default();
    key.word(kind as u64);
    let to_pos = |i: usize| -> Vec<Option<usize>> { caxes[i].iter().map(|c| c.map(|c| pos[&c])).collect() };
    for (id, node) in body.nodes() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        let dtype = node.outputs[0].dtype;
        let mut ins: SmallVec<[LNodeId; 3]> =
            node.inputs.iter().map(|v| map[v.node.index()].expect("inputs are lowered first")).collect();
        key.word(dtype as u64);
        key.op(&node.op);
        let op = match &node.op {
            Op::BroadcastTo { .. } | Op::ExpandDims { .. } => {
                map[i] = Some(ins[0]);
                key.positions(&to_pos(i));
                continue;
            }
            Op::Parameter { index } => {
                let contig = holds_inner(i)?;
                key.word(*index as u64);
                key.list(node.outputs[0].dims.iter().map(|d| u64::from(*d == Some(1))));
                key.positions(&to_pos(i));
                LOp::Load(loads.push(LoadInfo { source: LoadSource::Param(*index), dtype, axes: to_pos(i), contig }))
            }
            Op::Constant { value } if value.len() == 1 => {
                let s = Scalar::of_storage(value);
                key.word(s.bits());
                LOp::Const(s)
            }
            Op::Constant { value } => {
                let contig = holds_inner(i)?;
                let value = value.to_standard();
                key.list(value.shape().iter().map(|&d| d as u64));
                key.positions(&to_pos(i));
                key.elements(&value);
                LOp::Load(loads.push(LoadInfo { source: LoadSource::Const(value), dtype, axes: to_pos(i), contig }))
            }
            Op::Unary(u) => LOp::Unary(*u),
            Op::Binary(b) => LOp::Binary(*b),
            Op::Select => LOp::Select,
            Op::Cast { .. } => {
                let from = body.value_type(node.inputs[0]).dtype;
                key.word(from as u64);
                LOp::Cast
            }
            Op::Clamp { min, max } => {
                let lo = Scalar::from_f64_as(dtype, *min);
                let hi = Scalar::from_f64_as(dtype, *max);
                key.word(lo.bits());
                key.word(hi.bits());
                LOp::Clamp(lo, hi)
            }
            Op::Reduce { op, .. } => {
                has_max_min |= matches!(op, ReduceOp::Max | ReduceOp::Min);
                LOp::Reduce(*op)
            }
            Op::OneHot { depth, .. } => {
                // `cast(labels == iota)`: an out-of-range or negative label
                // equals no position, so its row is all zeros (the
                // reference's rule).
                let from = body.value_type(node.inputs[0]).dtype;
                let axes = to_pos(i);
                let depth_axis = *axes.last().expect("one_hot adds an axis");
                key.word(*depth as u64);
                key.word(from as u64);
                let iota = match depth_axis {
                    None => LOp::Const(Scalar::from_f64_as(from, 0.0)),
                    Some(p) => {
                        let held = inner.iter().filter(|&&q| q == p).count();
                        if held != 0 && held != inner.len() {
                            return Err(format!("one_hot {id} holds only part of the inner axes"));
                        }
                        let value = tracejit_ir::tensor::kernels::arange(0.0, *depth as f64, 1.0, from);
                        key.positions(&[Some(p)]);
                        let contig = held != 0;
                        LOp::Load(loads.push(LoadInfo {
                            source: LoadSource::Const(value),
                            dtype: from,
                            axes: vec![Some(p)],
                            contig,
                        }))
                    }
                };
                let varying = matches!(iota, LOp::Load(l) if loads[l].contig);
                let stage = lnodes[ins[0]].stage;
                let iota = lnodes.push(LNode { op: iota, inputs: SmallVec::new(), dtype: from, varying, stage: 0 });
                let eq = lnodes.push(LNode {
                    op: LOp::Binary(BinaryOp::Eq),
                    inputs: smallvec::smallvec![ins[0], iota],
                    dtype: DType::Bool,
                    varying: holds_inner(i)?,
                    stage,
                });
                ins = smallvec::smallvec![eq];
                key.word(DType::Bool as u64);
                LOp::Cast
            }
            Op::ArgReduce { .. }
            | Op::MatMul
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::Gather { .. }
            | Op::Call { .. }
            | Op::Fused { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. } => unreachable!("rejected during unification"),
        };
        key.list(ins.iter().map(|&j| j.index() as u64));
        if !matches!(op, LOp::Load(_) | LOp::Const(_)) {
            key.positions(&to_pos(i));
        }
        // A reduction starts a new stage and varies only across columns.
        let (stage, varying) = if matches!(op, LOp::Reduce(_)) {
            (lnodes[ins[0]].stage + 1, kind == KernelKind::Column)
        } else {
            (ins.iter().map(|&j| lnodes[j].stage).max().unwrap_or(0), holds_inner(i)?)
        };
        map[i] = Some(lnodes.push(LNode { op, inputs: ins, dtype, varying, stage }));
    }

    // ---- outputs ----
    let kept_pos: Vec<usize> = match kind {
        KernelKind::Elementwise => (0..rank).collect(),
        KernelKind::Row => (0..split).collect(),
        KernelKind::Column => (split..rank).collect(),
    };
    let mut outputs = Vec::new();
    // No node's words start with this (they start with a dtype).
    key.word(u64::MAX);
    for v in &body.outputs {
        let ValueId { node, .. } = *v;
        let i = node.index();
        let s: Vec<usize> = seq(i).iter().map(|c| pos[c]).collect();
        let full = s.len() == rank;
        let kept = !full && s == kept_pos;
        if !full && !kept {
            return Err(format!("output {v} indexes neither the whole domain nor the kept axes"));
        }
        let l = map[i].expect("outputs are lowered");
        if kind == KernelKind::Column && full && lnodes[l].stage > 0 {
            return Err("a column region cannot write a full-size output that depends on a reduction".into());
        }
        key.word(l.index() as u64);
        key.positions(&to_pos(i));
        outputs.push(OutputInfo { node: l, dtype: body.value_type(*v).dtype, axes: to_pos(i), kept });
    }

    // ---- kind-specific rules ----
    let passes = lnodes.values().map(|n| n.stage).max().unwrap_or(0);
    if kind == KernelKind::Column {
        if passes > 1 {
            return Err("a column region cannot chain reductions".into());
        }
        // Values after a reduction hold no reduced class.
        for (i, &is_live) in live.iter().enumerate() {
            if is_live && map[i].is_some_and(|l| lnodes[l].stage > 0) {
                let s: Vec<usize> = seq(i).iter().map(|c| pos[c]).collect();
                if s.iter().any(|&p| p < split) {
                    return Err(format!("node n{i} depends on a reduction but indexes a reduced axis"));
                }
            }
        }
    }

    // ---- runtime size sources ----
    let mut size_sources: Vec<Vec<SizeSource>> = vec![Vec::new(); rank];
    for (c, src) in sources_raw {
        let root = uf.find(c);
        if let Some(&p) = pos.get(&root) {
            size_sources[p].push(src);
        }
    }
    let mut static_sizes: Vec<Option<usize>> = vec![None; rank];
    for (c, s) in static_raw {
        let root = uf.find(c);
        if let Some(&p) = pos.get(&root) {
            match static_sizes[p] {
                None => static_sizes[p] = Some(s),
                Some(t) if t == s => {}
                Some(_) => return Err("axis sizes disagree statically".into()),
            }
        }
    }

    Ok(Analysis {
        kind,
        nodes: lnodes,
        loads,
        outputs,
        rank,
        split,
        size_sources,
        static_sizes,
        passes,
        has_max_min,
        key,
    })
}
