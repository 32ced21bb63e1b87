//! `channels_last`: an inference graph's convolutions keep their
//! activations channels last (`[N, H, W, C]`) from one convolution to the
//! next, as ONNX Runtime's NCHWc layout and PyTorch's `channels_last`
//! memory format do: the channel-lane kernel then reads each tap's inputs
//! in place and stores each pixel's channels as whole vectors, and no
//! layer writes NCHW planes only for the next one to read them across.
//!
//! What changes (with [`PassContext::channels_last`] set, which the JIT's
//! pipeline does where the CPU has vector code):
//! - f32 `conv2d` of one group becomes `conv2d_nhwc`, and `max_pool2d` of a
//!   channels-last value `max_pool2d_nhwc`;
//! - elementwise ops (unary, binary, select, cast, clamp) with a rank-4
//!   result and a channels-last operand compute channels last: a
//!   per-channel operand (`[C, 1, 1]`, a batch norm's scale) is reshaped to
//!   `[1, 1, 1, C]`, a scalar stays, an NCHW operand of the full shape is
//!   transposed;
//! - a reduction of a channels-last value over its spatial axes (a global
//!   average pool) reduces the matching axes;
//! - where an NCHW reader remains (a reshape, a product, a graph output),
//!   one `transpose` back is made for all of them; where an NCHW value
//!   feeds a channels-last op, one `transpose` to it.
//!
//! A chain must hold two convolutions at least (a lone convolution, with
//! or without its pool, would pay two transposes to gain little: W11's
//! layer stays NCHW), and a graph that holds filter or pool gradients (a
//! training step, whose backward ops read the forward's activations NCHW)
//! is left alone; a transposed convolution (`conv2d_backward_data` alone,
//! ONNX's `ConvTranspose`) does not stop it. Values are those of the NCHW
//! graph, transposed: each op computes what it computed before on the
//! same numbers, so the interpreter (whose channels-last ops are the NCHW
//! loops between transposes) gives the same bits. Compiled, a convolution
//! may take another kernel than its NCHW form took (the channel-lane one
//! always) and a mean over the map another summation order: results then
//! differ by rounding only, within the ops' error bounds.

use std::collections::{HashMap, HashSet};

use tracejit_tensor::{DType, SpatialOp};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, Op, OpClass, ValueId};

/// Where each NCHW axis sits channels last: `[N, H, W, C]` holds NCHW
/// axes `TO_LAST[i]`.
const TO_LAST: [usize; 4] = [0, 2, 3, 1];

/// The inverse: channels-last values back to NCHW.
const TO_FIRST: [usize; 4] = [0, 3, 1, 2];

/// The layout pass (`channels_last`); a no-op unless
/// [`PassContext::channels_last`] is set.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChannelsLast;

impl Pass for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels_last"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        if !cx.channels_last {
            return PassResult::unchanged();
        }
        let nested = run_in_subgraphs(self, g, cx);
        let plan = Plan::of(g);
        if plan.spatial == 0 {
            return nested;
        }
        match rewrite(g, &plan) {
            Some(new) => {
                *g = new;
                let what = if plan.spatial == 1 { "spatial op" } else { "spatial ops" };
                nested.and(PassResult::count(plan.spatial, &format!("{what} channels last")))
            }
            // An op refused its new operands (a bug here, or a shape rule
            // stricter than this pass knows): the graph stays NCHW.
            None => nested,
        }
    }
}

/// Which nodes compute channels last.
struct Plan {
    /// Nodes whose (only) output is a channels-last value.
    last: HashSet<NodeId>,
    /// Reductions of a channels-last value whose result keeps NCHW's
    /// axis order (the spatial axes reduced away).
    reads_last: HashSet<NodeId>,
    /// Spatial ops among `last`.
    spatial: usize,
}

impl Plan {
    /// Marks the nodes, then unmarks chains with fewer than two
    /// convolutions (they stay NCHW) until none is left.
    fn of(g: &Graph) -> Plan {
        let empty = Plan { last: HashSet::new(), reads_last: HashSet::new(), spatial: 0 };
        let training = g.nodes().any(|(_, n)| {
            matches!(
                n.op,
                Op::Spatial(
                    SpatialOp::Conv2dBackwardFilter { .. }
                        | SpatialOp::MaxPool2dBackward { .. }
                        | SpatialOp::AvgPool2dBackward { .. }
                )
            )
        });
        if training {
            return empty;
        }
        let waited: HashSet<NodeId> = g.nodes().flat_map(|(_, n)| n.control_inputs.iter().copied()).collect();
        let mut blocked: HashSet<NodeId> = HashSet::new();
        loop {
            let plan = mark(g, &waited, &blocked);
            let lone = lone_chains(g, &plan);
            if lone.is_empty() {
                return plan;
            }
            blocked.extend(lone);
        }
    }
}

/// One marking pass in graph order, the convolutions of `blocked` kept
/// NCHW.
fn mark(g: &Graph, waited: &HashSet<NodeId>, blocked: &HashSet<NodeId>) -> Plan {
    let mut plan = Plan { last: HashSet::new(), reads_last: HashSet::new(), spatial: 0 };
    let is_last = |plan: &Plan, v: ValueId| plan.last.contains(&v.node);
    for (id, n) in g.nodes() {
        if !n.control_inputs.is_empty() || waited.contains(&id) || n.outputs.len() != 1 {
            continue;
        }
        let out = &n.outputs[0];
        match &n.op {
            Op::Spatial(SpatialOp::Conv2d { conv, .. })
                if conv.groups == 1 && out.dtype == DType::F32 && out.rank() == 4 && !blocked.contains(&id) =>
            {
                plan.last.insert(id);
                plan.spatial += 1;
            }
            Op::Spatial(SpatialOp::MaxPool2d { .. }) if is_last(&plan, n.inputs[0]) && !blocked.contains(&id) => {
                plan.last.insert(id);
                plan.spatial += 1;
            }
            op if op.class() == OpClass::Elementwise && out.rank() == 4 => {
                let any_last = n.inputs.iter().any(|&v| is_last(&plan, v));
                let all_fit = n.inputs.iter().all(|&v| is_last(&plan, v) || adaptable(g, v));
                if any_last && all_fit {
                    plan.last.insert(id);
                }
            }
            Op::Reduce { axes, keepdims, .. } if is_last(&plan, n.inputs[0]) => {
                if *keepdims {
                    plan.last.insert(id);
                } else if same_order_without(axes) {
                    plan.reads_last.insert(id);
                }
            }
            _ => {}
        }
    }
    plan
}

/// The convolutions and pools of chains (values linked through marked
/// nodes) that hold fewer than two convolutions.
fn lone_chains(g: &Graph, plan: &Plan) -> Vec<NodeId> {
    // Union-find over the marked nodes.
    let mut parent: HashMap<NodeId, NodeId> = plan.last.iter().map(|&id| (id, id)).collect();
    fn root(parent: &mut HashMap<NodeId, NodeId>, mut id: NodeId) -> NodeId {
        while parent[&id] != id {
            let up = parent[&parent[&id]];
            parent.insert(id, up);
            id = up;
        }
        id
    }
    for &id in &plan.last {
        for v in &g.node(id).inputs {
            if plan.last.contains(&v.node) {
                let (a, b) = (root(&mut parent, id), root(&mut parent, v.node));
                parent.insert(a, b);
            }
        }
    }
    let spatial = |id: NodeId| matches!(g.node(id).op, Op::Spatial(_));
    let conv = |id: NodeId| matches!(g.node(id).op, Op::Spatial(SpatialOp::Conv2d { .. }));
    let mut count: HashMap<NodeId, usize> = HashMap::new();
    let ids: Vec<NodeId> = plan.last.iter().copied().collect();
    for &id in &ids {
        let r = root(&mut parent, id);
        *count.entry(r).or_default() += usize::from(conv(id));
    }
    ids.into_iter().filter(|&id| spatial(id) && count[&root(&mut parent, id)] < 2).collect()
}

/// Whether an NCHW operand of a channels-last elementwise op can be put
/// channels last: a scalar, a full rank-4 value (transposed), or a lower
/// rank one with known sizes (reshaped, and transposed if its channel axis
/// is not alone).
fn adaptable(g: &Graph, v: ValueId) -> bool {
    let t = g.value_type(v);
    t.rank() == 0 || t.rank() == 4 || (t.rank() < 4 && t.dims.iter().all(Option::is_some))
}

/// Whether reducing `axes` of an NCHW value and the matching axes of its
/// channels-last form leave the remaining axes in the same order.
fn same_order_without(axes: &[usize]) -> bool {
    let kept = |order: &[usize]| order.iter().copied().filter(|a| !axes.contains(a)).collect::<Vec<_>>();
    kept(&[0, 1, 2, 3]) == kept(&TO_LAST)
}

/// The channels-last position of NCHW axis `a`.
fn last_axis(a: usize) -> usize {
    TO_LAST.iter().position(|&x| x == a).expect("an axis below 4")
}

/// The rebuilt graph, or `None` when an op refused its new operands.
fn rewrite(g: &Graph, plan: &Plan) -> Option<Graph> {
    // Values read NCHW after the rewrite: by an unconverted reader or as
    // graph outputs.
    let converted = |id: NodeId| plan.last.contains(&id) || plan.reads_last.contains(&id);
    let mut nchw_read: HashSet<NodeId> = g.outputs.iter().map(|v| v.node).collect();
    for (id, n) in g.nodes() {
        if !converted(id) {
            nchw_read.extend(n.inputs.iter().map(|v| v.node));
        } else if matches!(n.op, Op::Spatial(_)) {
            // A convolution's weights and bias (computed from a converted
            // value, in a graph of dynamic weights) are read as they are.
            nchw_read.extend(n.inputs.iter().skip(1).map(|v| v.node));
        }
    }
    let mut rw = Rewriter::new(g);
    let mut last: HashMap<ValueId, ValueId> = HashMap::new();
    let mut adapted: HashMap<ValueId, ValueId> = HashMap::new();
    for (id, n) in g.nodes() {
        if rw.is_mapped(id) {
            continue;
        }
        if !converted(id) {
            rw.copy(id);
            continue;
        }
        let mut inputs = Vec::with_capacity(n.inputs.len());
        for (i, &v) in n.inputs.iter().enumerate() {
            let new = match last.get(&v) {
                // A convolution's weights and bias keep their layout.
                _ if matches!(n.op, Op::Spatial(_)) && i > 0 => rw.value(v),
                Some(&l) => l,
                None => to_last(&mut rw, &mut adapted, g, v, n.location)?,
            };
            inputs.push(new);
        }
        let op = match &n.op {
            Op::Spatial(SpatialOp::Conv2d { conv, bias, relu }) => Op::Spatial(SpatialOp::Conv2dNhwc {
                conv: *conv,
                scale: false,
                bias: *bias,
                residual: false,
                relu: *relu,
            }),
            Op::Spatial(SpatialOp::MaxPool2d { pool }) => Op::Spatial(SpatialOp::MaxPool2dNhwc { pool: *pool }),
            Op::Reduce { op, axes, keepdims } => {
                let mut axes: Vec<usize> = axes.iter().map(|&a| last_axis(a)).collect();
                axes.sort_unstable();
                Op::Reduce { op: *op, axes, keepdims: *keepdims }
            }
            op => op.clone(),
        };
        let node = rw.emit(op, &inputs, &[], n.location).ok()?;
        let out = ValueId::new(node, 0);
        let old = ValueId::new(id, 0);
        if plan.reads_last.contains(&id) {
            // The result is NCHW's own layout.
            rw.map(id, &[out], &[node]);
            continue;
        }
        last.insert(old, out);
        let nchw = if nchw_read.contains(&id) {
            let back = rw.emit(Op::Transpose { perm: TO_FIRST.to_vec() }, &[out], &[], n.location).ok()?;
            ValueId::new(back, 0)
        } else {
            // Read channels last only (through `last`).
            out
        };
        rw.map(id, &[nchw], &[nchw.node]);
    }
    Some(rw.finish())
}

/// `v` (an NCHW value of the old graph) as a channels-last operand, made
/// once per value.
fn to_last(
    rw: &mut Rewriter<'_>,
    adapted: &mut HashMap<ValueId, ValueId>,
    g: &Graph,
    v: ValueId,
    location: Option<&'static std::panic::Location<'static>>,
) -> Option<ValueId> {
    if let Some(&a) = adapted.get(&v) {
        return Some(a);
    }
    let new = rw.value(v);
    let t = g.value_type(v).clone();
    let out = match t.rank() {
        0 => new,
        4 => emit1(rw, Op::Transpose { perm: TO_LAST.to_vec() }, new, location)?,
        r => {
            // Right-aligned as broadcasting aligns it: [d0, d1, d2, d3].
            let mut d = [1usize; 4];
            for (i, dim) in t.dims.iter().enumerate() {
                d[4 - r + i] = dim.expect("adaptable: known sizes");
            }
            let moved = [d[0], d[2], d[3], d[1]].map(|x| x as i64).to_vec();
            if d[1] == 1 || d[2] * d[3] == 1 {
                // Only size-1 axes move: a reshape.
                emit1(rw, Op::Reshape { shape: moved }, new, location)?
            } else {
                let full = d.map(|x| x as i64).to_vec();
                let r4 = emit1(rw, Op::Reshape { shape: full }, new, location)?;
                emit1(rw, Op::Transpose { perm: TO_LAST.to_vec() }, r4, location)?
            }
        }
    };
    adapted.insert(v, out);
    Some(out)
}

/// Emits a one-input, one-output op.
fn emit1(
    rw: &mut Rewriter<'_>,
    op: Op,
    v: ValueId,
    location: Option<&'static std::panic::Location<'static>>,
) -> Option<ValueId> {
    rw.emit(op, &[v], &[], location).ok().map(|n| ValueId::new(n, 0))
}
