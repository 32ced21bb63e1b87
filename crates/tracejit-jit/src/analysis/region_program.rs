//! The last steps of region analysis ([`super::analyze`]): lowering the
//! live nodes to the small program the code generator emits (and the
//! kernel's structural key on the way), the outputs, the rules of column
//! regions, and where each domain class's size comes from at run time.

use cranelift_entity::{EntityRef, PrimaryMap};
use smallvec::SmallVec;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp};
use tracejit_ir::{Graph, Op, ValueId};

use super::axes::Unified;
use super::domain::Domain;
use super::{KernelKind, LNode, LNodeId, LOp, LoadId, LoadInfo, LoadSource, OutputInfo, Scalar, SizeSource};
use crate::options::KernelKey;

/// The lowered program of a region, before its outputs.
pub(super) struct Lowered {
    pub nodes: PrimaryMap<LNodeId, LNode>,
    pub loads: PrimaryMap<LoadId, LoadInfo>,
    /// The lowered node computing each body node (broadcasts alias their input).
    pub map: Vec<Option<LNodeId>>,
    /// True if some reduction is max or min.
    pub has_max_min: bool,
    pub key: KernelKey,
}

/// Lowers the live nodes of `body` over domain `d`, in arena order. Every
/// op is listed: one that unification rejected cannot reach here.
pub(super) fn lower(body: &Graph, live: &[bool], d: &Domain) -> Result<Lowered, String> {
    let mut l = Lowered {
        nodes: PrimaryMap::new(),
        loads: PrimaryMap::new(),
        map: vec![None; body.len()],
        has_max_min: false,
        key: KernelKey::default(),
    };
    l.key.word(d.kind as u64);
    for (id, node) in body.nodes() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        let dtype = node.outputs[0].dtype;
        let mut ins: SmallVec<[LNodeId; 3]> =
            node.inputs.iter().map(|v| l.map[v.node.index()].expect("inputs are lowered first")).collect();
        l.key.word(dtype as u64);
        l.key.op(&node.op);
        let op = match &node.op {
            Op::BroadcastTo { .. } | Op::ExpandDims { .. } => {
                l.map[i] = Some(ins[0]);
                l.key.positions(&d.to_pos(i));
                continue;
            }
            Op::Parameter { index } => {
                let contig = d.holds_inner(i)?;
                l.key.word(*index as u64);
                l.key.list(node.outputs[0].dims.iter().map(|d| u64::from(*d == Some(1))));
                l.key.positions(&d.to_pos(i));
                LOp::Load(l.loads.push(LoadInfo {
                    source: LoadSource::Param(*index),
                    dtype,
                    axes: d.to_pos(i),
                    contig,
                }))
            }
            Op::Constant { value } if value.len() == 1 => {
                let s = Scalar::of_storage(value);
                l.key.word(s.bits());
                LOp::Const(s)
            }
            Op::Constant { value } => {
                let contig = d.holds_inner(i)?;
                let value = value.to_standard();
                l.key.list(value.shape().iter().map(|&d| d as u64));
                l.key.positions(&d.to_pos(i));
                l.key.elements(&value);
                LOp::Load(l.loads.push(LoadInfo { source: LoadSource::Const(value), dtype, axes: d.to_pos(i), contig }))
            }
            Op::Unary(u) => {
                l.key.word(*u as u64);
                LOp::Unary(*u)
            }
            Op::Binary(b) => {
                l.key.word(*b as u64);
                LOp::Binary(*b)
            }
            Op::Select => LOp::Select,
            // The target dtype is the node's, keyed above.
            Op::Cast { .. } => {
                let from = body.value_type(node.inputs[0]).dtype;
                l.key.word(from as u64);
                LOp::Cast
            }
            Op::Clamp { min, max } => {
                let lo = Scalar::from_f64_as(dtype, *min);
                let hi = Scalar::from_f64_as(dtype, *max);
                l.key.word(lo.bits());
                l.key.word(hi.bits());
                LOp::Clamp(lo, hi)
            }
            Op::Reduce { op, .. } => {
                l.key.word(*op as u64);
                l.has_max_min |= matches!(op, ReduceOp::Max | ReduceOp::Min);
                LOp::Reduce(*op)
            }
            Op::OneHot { depth, .. } => {
                // `cast(labels == iota)`: an out-of-range or negative label
                // equals no position, so its row is all zeros (the
                // reference's rule).
                let from = body.value_type(node.inputs[0]).dtype;
                let axes = d.to_pos(i);
                let depth_axis = *axes.last().expect("one_hot adds an axis");
                l.key.word(*depth as u64);
                l.key.word(from as u64);
                let iota = match depth_axis {
                    None => LOp::Const(Scalar::from_f64_as(from, 0.0)),
                    Some(p) => {
                        let held = d.inner.iter().filter(|&&q| q == p).count();
                        if held != 0 && held != d.inner.len() {
                            return Err(format!("one_hot {id} holds only part of the inner axes"));
                        }
                        let value = tracejit_ir::tensor::kernels::arange(0.0, *depth as f64, 1.0, from);
                        l.key.positions(&[Some(p)]);
                        let contig = held != 0;
                        LOp::Load(l.loads.push(LoadInfo {
                            source: LoadSource::Const(value),
                            dtype: from,
                            axes: vec![Some(p)],
                            contig,
                        }))
                    }
                };
                let varying = matches!(iota, LOp::Load(ld) if l.loads[ld].contig);
                let stage = l.nodes[ins[0]].stage;
                let iota = l.nodes.push(LNode { op: iota, inputs: SmallVec::new(), dtype: from, varying, stage: 0 });
                let eq = l.nodes.push(LNode {
                    op: LOp::Binary(BinaryOp::Eq),
                    inputs: smallvec::smallvec![ins[0], iota],
                    dtype: DType::Bool,
                    varying: d.holds_inner(i)?,
                    stage,
                });
                ins = smallvec::smallvec![eq];
                l.key.word(DType::Bool as u64);
                LOp::Cast
            }
            _ => unreachable!("rejected during unification"),
        };
        l.key.list(ins.iter().map(|&j| j.index() as u64));
        if !matches!(op, LOp::Load(_) | LOp::Const(_)) {
            l.key.positions(&d.to_pos(i));
        }
        // A reduction starts a new stage and varies only across columns.
        let (stage, varying) = if matches!(op, LOp::Reduce(_)) {
            (l.nodes[ins[0]].stage + 1, d.kind == KernelKind::Column)
        } else {
            (ins.iter().map(|&j| l.nodes[j].stage).max().unwrap_or(0), d.holds_inner(i)?)
        };
        l.map[i] = Some(l.nodes.push(LNode { op, inputs: ins, dtype, varying, stage }));
    }
    Ok(l)
}

/// The outputs: each holds the whole domain, or (a reduction region's)
/// exactly the kept classes.
pub(super) fn outputs(body: &Graph, d: &Domain, l: &mut Lowered) -> Result<Vec<OutputInfo>, String> {
    let kept_pos: Vec<usize> = match d.kind {
        KernelKind::Elementwise => (0..d.rank).collect(),
        KernelKind::Row => (0..d.split).collect(),
        KernelKind::Column => (d.split..d.rank).collect(),
    };
    let mut outputs = Vec::new();
    // No node's words start with this (they start with a dtype).
    l.key.word(u64::MAX);
    for v in &body.outputs {
        let ValueId { node, .. } = *v;
        let i = node.index();
        let s = d.positions(i);
        let full = s.len() == d.rank;
        let kept = !full && s == kept_pos;
        if !full && !kept {
            return Err(format!("output {v} indexes neither the whole domain nor the kept axes"));
        }
        let node_l = l.map[i].ok_or_else(|| format!("output {v} was not lowered"))?;
        if d.kind == KernelKind::Column && full && l.nodes[node_l].stage > 0 {
            return Err("a column region cannot write a full-size output that depends on a reduction".into());
        }
        l.key.word(node_l.index() as u64);
        l.key.positions(&d.to_pos(i));
        outputs.push(OutputInfo { node: node_l, dtype: body.value_type(*v).dtype, axes: d.to_pos(i), kept });
    }
    Ok(outputs)
}

/// The number of reduction passes; a column region has at most one, and
/// nothing after its reduction holds a reduced class.
pub(super) fn passes(live: &[bool], d: &Domain, l: &Lowered) -> Result<u32, String> {
    let passes = l.nodes.values().map(|n| n.stage).max().unwrap_or(0);
    if d.kind == KernelKind::Column {
        if passes > 1 {
            return Err("a column region cannot chain reductions".into());
        }
        // Values after a reduction hold no reduced class.
        for (i, &is_live) in live.iter().enumerate() {
            if is_live && l.map[i].is_some_and(|j| l.nodes[j].stage > 0) {
                let s = d.positions(i);
                if s.iter().any(|&p| p < d.split) {
                    return Err(format!("node n{i} depends on a reduction but indexes a reduced axis"));
                }
            }
        }
    }
    Ok(passes)
}

/// Per domain position: where its size comes from at run time, and its
/// static size.
pub(super) type Sizes = (Vec<Vec<SizeSource>>, Vec<Option<usize>>);

/// Per domain position: the parameter axes giving its size at run time,
/// and its static size if any (sizes that disagree are an error).
pub(super) fn sizes(u: &mut Unified, d: &Domain) -> Result<Sizes, String> {
    let mut size_sources: Vec<Vec<SizeSource>> = vec![Vec::new(); d.rank];
    for &(c, src) in &u.sources_raw {
        let root = u.uf.find(c);
        if let Some(&p) = d.pos.get(&root) {
            size_sources[p].push(src);
        }
    }
    let mut static_sizes: Vec<Option<usize>> = vec![None; d.rank];
    for &(c, s) in &u.static_raw {
        let root = u.uf.find(c);
        if let Some(&p) = d.pos.get(&root) {
            match static_sizes[p] {
                None => static_sizes[p] = Some(s),
                Some(t) if t == s => {}
                Some(_) => return Err("axis sizes disagree statically".into()),
            }
        }
    }
    Ok((size_sources, static_sizes))
}
