//! The third step of region analysis ([`super::analyze`]): canonical axis
//! classes, the kind of kernel (elementwise, row or column reductions),
//! the iteration domain and its order, and the inner (vectorized) classes.

use std::collections::HashMap;

use cranelift_entity::EntityRef;
use tracejit_ir::{Graph, Op};

use super::axes::Unified;
use super::unify::Ax;
use super::KernelKind;

/// The iteration domain of a region and how each value indexes it.
pub(super) struct Domain {
    pub kind: KernelKind,
    /// Domain rank.
    pub rank: usize,
    /// Class -> its position in the domain.
    pub pos: HashMap<u32, usize>,
    /// Row: the reduced classes are `split..rank`; Column: `0..split`;
    /// Elementwise: `rank - 1` (or 0 when rank is 0).
    pub split: usize,
    /// The inner domain positions: Row: the reduced suffix; Column: the
    /// kept suffix; Elementwise: the last.
    pub inner: Vec<usize>,
    /// Per node: its axes as canonical classes (`None` for a unit).
    pub caxes: Vec<Vec<Option<u32>>>,
}

impl Domain {
    /// The classes node `i` indexes, in its axis order.
    pub fn seq(&self, i: usize) -> Vec<u32> {
        self.caxes[i].iter().flatten().copied().collect()
    }

    /// The domain positions node `i` indexes, in its axis order.
    pub fn positions(&self, i: usize) -> Vec<usize> {
        self.seq(i).iter().map(|c| self.pos[c]).collect()
    }

    /// Node `i`'s axes as domain positions (`None` for a unit).
    pub fn to_pos(&self, i: usize) -> Vec<Option<usize>> {
        self.caxes[i].iter().map(|c| c.map(|c| self.pos[&c])).collect()
    }

    /// Whether node `i` holds the inner classes (all of them: holding part
    /// is an error).
    pub fn holds_inner(&self, i: usize) -> Result<bool, String> {
        let s = self.positions(i);
        let cnt = self.inner.iter().filter(|p| s.contains(p)).count();
        if cnt == 0 {
            Ok(false)
        } else if cnt == self.inner.len() {
            Ok(true)
        } else {
            Err(format!("node n{i} holds only part of the inner axes"))
        }
    }
}

/// Every live value's axes as canonical classes; a value holding one class
/// on two axes (a diagonal) is an error.
fn canonical(live: &[bool], u: &mut Unified) -> Result<Vec<Vec<Option<u32>>>, String> {
    let mut caxes: Vec<Vec<Option<u32>>> = vec![Vec::new(); live.len()];
    for (i, &is_live) in live.iter().enumerate() {
        if !is_live {
            continue;
        }
        caxes[i] = u.axes[i]
            .iter()
            .map(|x| match x {
                Ax::Unit => None,
                Ax::Class(c) => Some(u.uf.find(*c)),
            })
            .collect();
        let cls: Vec<u32> = caxes[i].iter().flatten().copied().collect();
        for (p, c) in cls.iter().enumerate() {
            if cls[p + 1..].contains(c) {
                return Err(format!("node n{i} indexes one axis class on two axes"));
            }
        }
    }
    Ok(caxes)
}

/// The kind, the domain (classes in order) and the reduced classes: the
/// first output's classes for an elementwise region; for reductions, the
/// classes they all read and reduce, which must be a suffix (row) or a
/// prefix (column) of the domain.
fn kind_and_domain(
    body: &Graph,
    reduce_nodes: &[usize],
    caxes: &[Vec<Option<u32>>],
) -> Result<(KernelKind, Vec<u32>, Vec<u32>), String> {
    let seq = |i: usize| -> Vec<u32> { caxes[i].iter().flatten().copied().collect() };
    if reduce_nodes.is_empty() {
        let d = seq(body.outputs[0].node.index());
        if body.outputs.iter().any(|v| seq(v.node.index()) != d) {
            return Err("outputs index different axes".into());
        }
        return Ok((KernelKind::Elementwise, d, Vec::new()));
    }
    let mut d: Option<Vec<u32>> = None;
    let mut ra: Option<Vec<u32>> = None;
    for &r in reduce_nodes {
        let node = body.node(tracejit_ir::NodeId::new(r));
        let x = node.inputs[0].node.index();
        let Op::Reduce { axes: red, .. } = &node.op else { return Err(format!("node n{r} is not a reduction")) };
        let mut rc: Vec<u32> = red.iter().filter_map(|&a| caxes[x][a]).collect();
        rc.sort_unstable();
        match &d {
            Some(d0) if *d0 != seq(x) => return Err("reductions read values of different axes".into()),
            Some(_) => {}
            None => d = Some(seq(x)),
        }
        match &ra {
            Some(r0) if *r0 != rc => return Err("reductions reduce different axes".into()),
            Some(_) => {}
            None => ra = Some(rc),
        }
    }
    let (Some(d), Some(ra)) = (d, ra) else { return Err("a reduction region without reductions".into()) };
    let k = d.len() - ra.len();
    let mut suffix: Vec<u32> = d[k..].to_vec();
    suffix.sort_unstable();
    let mut prefix: Vec<u32> = d[..ra.len()].to_vec();
    prefix.sort_unstable();
    if suffix == ra {
        let reduced = d[k..].to_vec();
        Ok((KernelKind::Row, d, reduced))
    } else if prefix == ra {
        let reduced = d[..ra.len()].to_vec();
        Ok((KernelKind::Column, d, reduced))
    } else {
        Err("reduced axes are neither leading nor trailing".into())
    }
}

/// The domain of a region whose live nodes `u` unified: canonical
/// classes, kind, domain order (every value's classes must be in it) and
/// the inner positions.
pub(super) fn domain(body: &Graph, live: &[bool], u: &mut Unified) -> Result<Domain, String> {
    let caxes = canonical(live, u)?;
    let (kind, domain, reduced) = kind_and_domain(body, &u.reduce_nodes, &caxes)?;
    let rank = domain.len();
    let pos: HashMap<u32, usize> = domain.iter().enumerate().map(|(p, &c)| (c, p)).collect();
    // Every value's classes are in domain order.
    for (i, &is_live) in live.iter().enumerate() {
        if !is_live {
            continue;
        }
        let mut last: Option<usize> = None;
        for c in caxes[i].iter().flatten() {
            let Some(&p) = pos.get(c) else {
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
    let inner: Vec<usize> = match kind {
        KernelKind::Elementwise if rank == 0 => vec![],
        KernelKind::Elementwise => vec![rank - 1],
        KernelKind::Row | KernelKind::Column => (split..rank).collect(),
    };
    Ok(Domain { kind, rank, pos, split, inner, caxes })
}
