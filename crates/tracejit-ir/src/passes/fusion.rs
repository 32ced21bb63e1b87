//! `fusion`: the fusion planner. Groups chains of elementwise ops and the
//! reductions they feed into `Op::Fused { body }` regions, which the JIT
//! compiles into one loop nest each (the interpreter runs the body, so under
//! the interpreter fusion changes no result).
//!
//! # The rule
//!
//! *Fusible* nodes are elementwise ops (unary, binary with broadcasting,
//! select, cast, clamp), `broadcast_to` and `expand_dims` (cheap index
//! remappings), `one_hot` (elementwise over its output, iterating over it;
//! only an executor that accepts it fuses it: the default rule does not),
//! and reductions, without control inputs or side effects.
//! Everything else — matmul, other shape ops, gathers, calls, kernels,
//! variable ops, existing regions — is a region boundary. Walking the graph
//! in order, each fusible node starts a group and then tries to join the
//! group of each fusible producer of its inputs. Two groups merge only if:
//!
//! 1. **Reductions end a region.** No member may read the result of a
//!    reduction in the same region; a region is an elementwise prologue
//!    (any DAG) feeding zero or more reductions, and elementwise results the
//!    rest of the graph needs. Several reductions in one region must reduce
//!    the same axes (with the same `keepdims`) of the same iteration space.
//!    (This is [`default_accepts_region`]'s rule; an executor that runs
//!    multi-pass row regions — the JIT: a whole softmax in one kernel —
//!    accepts more, and [`Fusion::reductions_end_regions`] imposes it
//!    whatever the acceptance rule says.)
//! 2. **One iteration space.** Every member iterates over the same dims (an
//!    elementwise node its output's, a reduction its input's). A group of
//!    *cheap* nodes over a smaller space that broadcasts into the other (a
//!    bias scaled by a constant) may join: it is recomputed per element,
//!    which costs less than a trip through memory. A group with an
//!    *expensive* op ([`Op::is_expensive`], the `Cost` column of the op
//!    tables: `exp`, `log`, `tanh`, `pow`, ...) never joins a bigger space, so no expensive
//!    work is ever duplicated.
//! 3. **No cycles.** The merged region must not both feed and depend on a
//!    node outside it (a path leaving the region and coming back).
//! 4. **The executor accepts it.** [`PassContext::accept_region`] (the JIT's
//!    `supports`, or [`default_accepts_region`]) must accept the merged
//!    region's body.
//! 5. **Bounded size.** A region holds at most [`MAX_REGION_NODES`] nodes,
//!    so that each merge's checks cost a bounded amount and planning stays
//!    linear in the graph's size (a 4,000-op chain plans in milliseconds).
//!
//! Every node belongs to at most one region and a value used outside its
//! region becomes one of the region's outputs (regions have several outputs
//! when needed: softmax's `exp(x - max)` is both summed and divided), so no
//! work is duplicated by fusion itself. Scalar constants (one element) used
//! by a region are copied into its body; other values are region inputs.
//!
//! A matmul is never fused; its bias-add and activation become their own
//! region (the epilogue), as does any other chain after an unfusible op.
//!
//! Every group becomes a region, a lone elementwise op or reduction too, so
//! that the executor compiles every op it accepts instead of falling back to
//! the reference kernel — except a group whose iteration space is known to
//! hold at most one element (scalar arithmetic is cheaper interpreted than
//! dispatched to a kernel). [`Fusion::single_node_regions`] set to false
//! leaves lone elementwise nodes plain (a lone reduction is still a region).
//! Regions are placed in topological order (each where its inputs are
//! ready). Existing regions are left alone, which makes the pass idempotent.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use cranelift_entity::EntityRef;
use smallvec::SmallVec;

use crate::passes::{has_side_effects, Pass, PassContext, PassResult, Rewriter};
use crate::{broadcast_dims, Dims, Graph, Node, NodeId, Op, OpClass, TensorType, ValueId};

/// The most nodes one region may hold. Planning checks cost a region's size
/// per merge, so the bound keeps the pass linear in the graph's size; a
/// kernel this long is long past the point where fusing more saves a trip
/// through memory (TorchInductor bounds fusions at 64 nodes, XLA at about
/// 100 operands).
pub const MAX_REGION_NODES: usize = 256;

/// The fusion planner (`fusion`).
#[derive(Clone, Copy, Debug)]
pub struct Fusion {
    /// Wrap a lone elementwise node in a region too (on by default).
    pub single_node_regions: bool,
    /// No member may read a reduction of its own region, whatever the
    /// acceptance rule says (off by default: the rule decides, and
    /// [`default_accepts_region`] says the same).
    pub reductions_end_regions: bool,
}

impl Default for Fusion {
    fn default() -> Fusion {
        Fusion { single_node_regions: true, reductions_end_regions: false }
    }
}

/// The default acceptance rule: a body made of parameters, one-element
/// constants, elementwise ops, `broadcast_to`, `expand_dims` and
/// reductions, in which every reduction has the same input dims, axes and
/// `keepdims` and no node reads a reduction (an elementwise prologue feeding
/// reductions: one pass over the data), and with at least one output. An
/// executor that runs multi-pass regions (the JIT: a whole softmax in one
/// kernel) plugs in its own rule.
pub fn default_accepts_region(body: &Graph) -> bool {
    let mut reduce: Option<(&Dims, &Vec<usize>, bool)> = None;
    for (_, node) in body.nodes() {
        if node.inputs.iter().any(|v| matches!(body.node(v.node).op, Op::Reduce { .. })) {
            return false;
        }
        match &node.op {
            Op::Parameter { .. } => {}
            Op::Constant { value } => {
                if value.len() != 1 {
                    return false;
                }
            }
            Op::BroadcastTo { .. }
            | Op::ExpandDims { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Clamp { .. } => {}
            Op::Reduce { axes, keepdims, .. } => {
                let this = (&body.value_type(node.inputs[0]).dims, axes, *keepdims);
                match reduce {
                    None => reduce = Some(this),
                    Some(r) if r == this => {}
                    Some(_) => return false,
                }
            }
            // Everything else makes a region the default executor cannot run in one pass.
            _ => return false,
        }
    }
    !body.outputs.is_empty()
}

fn fusible(g: &Graph, node: &Node) -> bool {
    node.op.is_fusible() && node.control_inputs.is_empty() && !has_side_effects(g, &node.op)
}

/// The dims a node iterates over: a reduction its input's, any other its
/// output's.
fn domain(g: &Graph, node: &Node) -> Dims {
    if matches!(node.op, Op::Reduce { .. }) {
        return g.value_type(node.inputs[0]).dims.clone();
    }
    node.outputs[0].dims.clone()
}

/// A group of nodes being planned as one region.
#[derive(Clone)]
struct Group {
    /// Members, in no particular order (sorted when a body is cut).
    members: Vec<NodeId>,
    /// The latest member in arena order.
    last: NodeId,
    /// The iteration space.
    domain: Dims,
    /// Axes and keepdims of its reductions, if it has any.
    reduce: Option<(Vec<usize>, bool)>,
    /// True when a member is expensive.
    expensive: bool,
}

/// A body graph cut out of `g` for `members`, with the outer values it reads
/// (one per body parameter) and the member values it must output.
struct Region {
    body: Graph,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
}

/// The planning state over one graph.
struct Planner<'g> {
    g: &'g Graph,
    /// Data and control consumers of each node.
    consumers: Vec<SmallVec<[NodeId; 2]>>,
    /// Graph outputs, by node.
    is_output: Vec<bool>,
    group_of: Vec<Option<usize>>,
    groups: Vec<Option<Group>>,
}

impl<'g> Planner<'g> {
    fn new(g: &'g Graph) -> Planner<'g> {
        let mut consumers = vec![SmallVec::new(); g.len()];
        for (id, node) in g.nodes() {
            for n in node.inputs.iter().map(|v| v.node).chain(node.control_inputs.iter().copied()) {
                let list: &mut SmallVec<[NodeId; 2]> = &mut consumers[n.index()];
                if list.last() != Some(&id) {
                    list.push(id);
                }
            }
        }
        let mut is_output = vec![false; g.len()];
        for v in &g.outputs {
            is_output[v.node.index()] = true;
        }
        Planner { g, consumers, is_output, group_of: vec![None; g.len()], groups: Vec::new() }
    }

    /// Plans the groups.
    fn plan(&mut self, cx: &PassContext, reductions_end_regions: bool) {
        let g = self.g;
        for (id, node) in g.nodes() {
            if !fusible(g, node) {
                continue;
            }
            let reduce =
                if let Op::Reduce { axes, keepdims, .. } = &node.op { Some((axes.clone(), *keepdims)) } else { None };
            self.group_of[id.index()] = Some(self.groups.len());
            self.groups.push(Some(Group {
                members: vec![id],
                last: id,
                domain: domain(g, node),
                reduce,
                expensive: node.op.is_expensive(),
            }));
            for v in &node.inputs {
                let (Some(pg), Some(cg)) = (self.group_of[v.node.index()], self.group_of[id.index()]) else {
                    continue;
                };
                if pg != cg {
                    if let Some(merged) = self.try_merge(pg, cg, cx, reductions_end_regions) {
                        self.commit(pg, cg, merged);
                    }
                }
            }
        }
    }

    /// The group `a ∪ b` if the rule allows it.
    fn try_merge(&self, a: usize, b: usize, cx: &PassContext, reductions_end_regions: bool) -> Option<Group> {
        let (ga, gb) = (self.groups[a].as_ref()?, self.groups[b].as_ref()?);
        // 2. one iteration space.
        let domain = if ga.domain == gb.domain {
            ga.domain.clone()
        } else {
            let joint = broadcast_dims(&ga.domain, &gb.domain)?;
            let smaller_ok = |s: &Group| !s.expensive && s.reduce.is_none();
            if joint == gb.domain && smaller_ok(ga) {
                gb.domain.clone()
            } else if joint == ga.domain && smaller_ok(gb) {
                ga.domain.clone()
            } else {
                return None;
            }
        };
        // 1. compatible reductions.
        let reduce = match (&ga.reduce, &gb.reduce) {
            (Some(x), Some(y)) if x != y => return None,
            (x, y) => x.clone().or_else(|| y.clone()),
        };
        // 5. bounded size: every check below costs the region's size, so the
        // bound keeps planning linear in the graph's size.
        if ga.members.len() + gb.members.len() > MAX_REGION_NODES {
            return None;
        }
        let in_set = |n: NodeId| matches!(self.group_of[n.index()], Some(x) if x == a || x == b);
        // 1. no member reads a reduction of the region: only edges between
        // the two groups are new (each group was checked when it formed).
        if reductions_end_regions {
            let (small, other) = if ga.members.len() <= gb.members.len() { (ga, b) } else { (gb, a) };
            let in_other = |n: NodeId| self.group_of[n.index()] == Some(other);
            let is_reduce = |n: NodeId| matches!(self.g.node(n).op, Op::Reduce { .. });
            for &m in &small.members {
                let reads = self.g.node(m).inputs.iter().any(|v| in_other(v.node) && is_reduce(v.node));
                let read = is_reduce(m) && self.consumers[m.index()].iter().any(|&c| in_other(c));
                if reads || read {
                    return None;
                }
            }
        }
        // 3. no path out of the region and back in.
        let last = ga.last.max(gb.last);
        if self.has_cycle(&in_set, ga.members.iter().chain(&gb.members).copied(), last, a, b) {
            return None;
        }
        // 4. the executor accepts it.
        // (A region without outputs is dead code; it is never emitted.)
        let mut members: Vec<NodeId> = ga.members.iter().chain(&gb.members).copied().collect();
        members.sort_unstable();
        let region = self.region(&members, "candidate");
        if !region.outputs.is_empty() && !(cx.accept_region)(&region.body) {
            return None;
        }
        Some(Group { members, last, domain, reduce, expensive: ga.expensive || gb.expensive })
    }

    fn commit(&mut self, a: usize, b: usize, merged: Group) {
        let (keep, drop) = (a.min(b), a.max(b));
        for &m in &merged.members {
            self.group_of[m.index()] = Some(keep);
        }
        self.groups[keep] = Some(merged);
        self.groups[drop] = None;
    }

    /// True when some path leaves the union of groups `a` and `b` (`in_set`,
    /// with these `members`, the latest being `last`) and comes back. Other
    /// groups count as single units: a path that enters a group may leave it
    /// from any member, which catches cycles between regions (`a1 -> b2`,
    /// `b1 -> a2`).
    fn has_cycle(
        &self,
        in_set: &dyn Fn(NodeId) -> bool,
        members: impl Iterator<Item = NodeId> + Clone,
        last: NodeId,
        a: usize,
        b: usize,
    ) -> bool {
        // A set, not a vector over the graph: a check costs what it visits.
        let mut seen: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = Vec::new();
        let visit = |c: NodeId, seen: &mut HashSet<NodeId>, stack: &mut Vec<NodeId>| {
            if seen.contains(&c) {
                return;
            }
            match self.group_of[c.index()] {
                Some(g) if g != a && g != b => {
                    for &m in &self.groups[g].as_ref().expect("live group").members {
                        if seen.insert(m) {
                            stack.push(m);
                        }
                    }
                }
                // A plain node after the last member cannot lead back.
                _ if c > last => {}
                _ => {
                    seen.insert(c);
                    stack.push(c);
                }
            }
        };
        for m in members {
            for &c in &self.consumers[m.index()] {
                if !in_set(c) {
                    visit(c, &mut seen, &mut stack);
                }
            }
        }
        while let Some(n) = stack.pop() {
            for &c in &self.consumers[n.index()] {
                if in_set(c) {
                    return true;
                }
                visit(c, &mut seen, &mut stack);
            }
        }
        false
    }

    /// Cuts the body of a region with these members (sorted) out of the
    /// graph.
    fn region(&self, members: &[NodeId], name: &str) -> Region {
        let g = self.g;
        let in_set = |n: NodeId| members.binary_search(&n).is_ok();
        let mut body = Graph::new(format!("{}.{name}", g.name));
        let mut inputs: Vec<ValueId> = Vec::new();
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for &m in members {
            let node = g.node(m);
            let mut args: SmallVec<[ValueId; 2]> = SmallVec::new();
            for &v in &node.inputs {
                let mapped = match map.get(&v) {
                    Some(&b) => b,
                    None => {
                        // One-element constants are copied into the body.
                        let scalar = if let Op::Constant { value } = &g.node(v.node).op {
                            (value.len() == 1 && !in_set(v.node)).then_some(value)
                        } else {
                            None
                        };
                        let b = match scalar {
                            Some(value) => body.add_constant(value.clone()),
                            None => {
                                inputs.push(v);
                                body.add_param(g.value_type(v).clone())
                            }
                        };
                        map.insert(v, b);
                        b
                    }
                };
                args.push(mapped);
            }
            let id = body.push_node(Node {
                op: node.op.clone(),
                inputs: args,
                control_inputs: SmallVec::new(),
                outputs: node.outputs.clone(),
                location: node.location,
            });
            for i in 0..node.outputs.len() {
                map.insert(ValueId::new(m, i as u32), ValueId::new(id, i as u32));
            }
        }
        let mut outputs = Vec::new();
        for &m in members {
            let used_outside = self.is_output[m.index()] || self.consumers[m.index()].iter().any(|&c| !in_set(c));
            if used_outside {
                for i in 0..g.node(m).outputs.len() {
                    let v = ValueId::new(m, i as u32);
                    outputs.push(v);
                    body.outputs.push(map[&v]);
                }
            }
        }
        Region { body, inputs, outputs }
    }
}

impl Pass for Fusion {
    fn name(&self) -> &'static str {
        "fusion"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Branches and loop bodies first (not the bodies of regions formed
        // already): the executor runs them as graphs of their own, and
        // this is the one place regions are planned.
        let nested = self.run_in_control_flow(g, cx);
        let here = self.run_here(g, cx);
        match (nested.changed, here.changed) {
            (false, _) => here,
            (true, false) => nested,
            (true, true) => PassResult::changed(format!("{}; {}", here.summary, nested.summary)),
        }
    }
}

impl Fusion {
    /// Runs the pass inside every `cond` branch and `while` condition and
    /// body of `g`.
    fn run_in_control_flow(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let holders: Vec<NodeId> =
            g.nodes().filter(|(_, n)| n.op.class() == OpClass::Control).map(|(id, _)| id).collect();
        let mut changed = 0usize;
        for id in holders {
            for sub in g.node_mut(id).op.subgraphs_mut() {
                let mut inner = (**sub).clone();
                if self.run(&mut inner, cx).changed {
                    *sub = Arc::new(inner);
                    changed += 1;
                }
            }
        }
        PassResult::count(changed, if changed == 1 { "subgraph fused" } else { "subgraphs fused" })
    }

    /// The regions of `g` itself.
    fn run_here(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let mut planner = Planner::new(g);
        planner.plan(cx, self.reductions_end_regions);

        // The regions to emit, with their bodies.
        let mut regions: Vec<(Vec<NodeId>, Region)> = Vec::new();
        for group in planner.groups.iter().flatten() {
            let lone = group.members.len() < 2 && group.reduce.is_none();
            let scalar = TensorType { dtype: tracejit_tensor::DType::F32, dims: group.domain.clone() }
                .num_elements()
                .is_some_and(|n| n <= 1);
            if (lone && !self.single_node_regions) || scalar {
                continue;
            }
            let region = planner.region(&group.members, &format!("fused{}", regions.len()));
            if region.outputs.is_empty() || !(cx.accept_region)(&region.body) {
                continue;
            }
            regions.push((group.members.clone(), region));
        }
        if regions.is_empty() {
            return PassResult::unchanged();
        }

        // Units to schedule: each region, and each node outside regions
        // except one-element constants that only regions read (copied into
        // their bodies).
        let n = g.len();
        let mut unit_of: Vec<Option<usize>> = vec![None; n];
        let mut units: Vec<Vec<NodeId>> = Vec::new();
        for (members, _) in &regions {
            for &m in members {
                unit_of[m.index()] = Some(units.len());
            }
            units.push(members.clone());
        }
        let region_count = units.len();
        for (id, node) in g.nodes() {
            if unit_of[id.index()].is_some() {
                continue;
            }
            let absorbed = matches!(&node.op, Op::Constant { value } if value.len() == 1)
                && !planner.is_output[id.index()]
                && !planner.consumers[id.index()].is_empty()
                && planner.consumers[id.index()].iter().all(|c| unit_of[c.index()].is_some_and(|u| u < region_count));
            if !absorbed {
                unit_of[id.index()] = Some(units.len());
                units.push(vec![id]);
            }
        }

        // Kahn's algorithm, earliest original position first.
        let mut deps: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
        let mut pending: Vec<usize> = vec![0; units.len()];
        for (u, nodes) in units.iter().enumerate() {
            let mut from: Vec<usize> = Vec::new();
            for &m in nodes {
                let node = g.node(m);
                for p in node.inputs.iter().map(|v| v.node).chain(node.control_inputs.iter().copied()) {
                    if let Some(pu) = unit_of[p.index()] {
                        if pu != u && !from.contains(&pu) {
                            from.push(pu);
                        }
                    }
                }
            }
            pending[u] = from.len();
            for pu in from {
                deps[pu].push(u);
            }
        }
        let mut ready: BinaryHeap<Reverse<(NodeId, usize)>> = BinaryHeap::new();
        for (u, nodes) in units.iter().enumerate() {
            if pending[u] == 0 {
                ready.push(Reverse((nodes[0], u)));
            }
        }
        let mut order: Vec<usize> = Vec::with_capacity(units.len());
        while let Some(Reverse((_, u))) = ready.pop() {
            order.push(u);
            for &d in &deps[u] {
                pending[d] -= 1;
                if pending[d] == 0 {
                    ready.push(Reverse((units[d][0], d)));
                }
            }
        }
        assert_eq!(order.len(), units.len(), "fusion: the planned regions form a cycle (a bug in the planner)");

        let mut rw = Rewriter::new(g);
        let mut bodies: Vec<Option<Region>> = regions.into_iter().map(|(_, r)| Some(r)).collect();
        for u in order {
            if u >= region_count {
                rw.copy(units[u][0]);
                continue;
            }
            let region = bodies[u].take().expect("each region is emitted once");
            let args: Vec<ValueId> = region.inputs.iter().map(|&v| rw.value(v)).collect();
            let outputs = region.outputs.clone();
            // The region is listed at the line of its last member that has one.
            let location = units[u].iter().rev().find_map(|&m| g.node(m).location);
            let fused = rw
                .emit(Op::Fused { body: Arc::new(region.body) }, &args, &[], location)
                .expect("a region's body takes the types of its inputs");
            for &m in &units[u] {
                let slots: Vec<Option<ValueId>> = (0..g.node(m).outputs.len())
                    .map(|i| {
                        let v = ValueId::new(m, i as u32);
                        outputs.iter().position(|&o| o == v).map(|k| ValueId::new(fused, k as u32))
                    })
                    .collect();
                rw.map_partial(m, &slots, &[fused]);
            }
        }
        *g = rw.finish();
        PassResult::count(region_count, if region_count == 1 { "region formed" } else { "regions formed" })
    }
}
