//! `conv_epilogue`: what a network does to a channels-last convolution's
//! result before the next convolution reads it — a batch norm's scale and
//! shift, a residual connection's add, relu — moves into the
//! convolution's store (`conv2d_nhwc[scale=true, bias=true,
//! residual=true, relu=true]`), so the kernel writes the activation once
//! instead of writing the sums for a second pass to read, scale, add and
//! store again (in ResNet-50 that second pass ran after every one of its
//! 53 convolutions).
//!
//! When: a `conv2d_nhwc` (f32, without a scale, residual or relu yet)
//! whose result is read by one op only, that op's by one op only, and so
//! on along a chain of, in this order and each at most once:
//! - `mul` by a per-channel operand (a `[C]` value, or `[1, 1, 1, C]`:
//!   all other dims 1; only while nothing else was absorbed and the
//!   convolution has no bias);
//! - `add` of a per-channel operand (when the convolution has no bias);
//! - `add` of a value of the result's own shape, every dim known (the
//!   residual);
//! - `relu`.
//!
//! Each step keeps the result's type (no broadcast grows it); no value
//! before the chain's last is a graph output, and no node of it has
//! control inputs or is waited for. The fused op computes each step on
//! the same operands in the same order with the same rounding, so the
//! interpreter's values are those of the ops, signed zeros included
//! (`mul` and `add` commute, up to which NaN's payload a sum of two NaN
//! keeps, which no pass promises); compiled, relu keeps a -0 the `relu`
//! op makes +0.

use std::collections::{HashMap, HashSet};

use tracejit_tensor::{BinaryOp, DType, SpatialOp, UnaryOp};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, Op, ValueId};

/// The convolution-epilogue fusion pass (`conv_epilogue`).
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseConvEpilogue;

impl Pass for FuseConvEpilogue {
    fn name(&self) -> &'static str {
        "conv_epilogue"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let nested = run_in_subgraphs(self, g, cx);
        let chains = find_chains(g);
        if chains.is_empty() {
            return nested;
        }
        match rewrite(g, &chains) {
            Some(new) => {
                *g = new;
                let n = chains.len();
                nested.and(PassResult::count(n, if n == 1 { "epilogue fused" } else { "epilogues fused" }))
            }
            // An op refused its operands (a bug here, or a shape rule
            // stricter than this pass knows): the graph stays as it was.
            None => nested,
        }
    }
}

/// A convolution and the ops it absorbs.
struct Chain {
    /// The convolution.
    conv: NodeId,
    /// The absorbed ops after it, in order; the last one's result is the
    /// fused op's.
    steps: Vec<NodeId>,
    scale: Option<ValueId>,
    /// The convolution's own bias, or an absorbed per-channel add's.
    bias: Option<ValueId>,
    residual: Option<ValueId>,
    relu: bool,
}

/// Every chain of the graph, by convolution.
fn find_chains(g: &Graph) -> Vec<Chain> {
    let mut readers: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    let mut waited_for: HashSet<NodeId> = HashSet::new();
    for (id, n) in g.nodes() {
        for &v in &n.inputs {
            readers.entry(v).or_default().push(id);
        }
        waited_for.extend(n.control_inputs.iter().copied());
    }
    // A residual add reads two chains' results (a projection shortcut's
    // batch norm and the main branch's): the first convolution in graph
    // order takes it, the other chain ends before it.
    let mut claimed: HashSet<NodeId> = HashSet::new();
    let mut chains = Vec::new();
    for (id, _) in g.nodes() {
        let free = |n: NodeId| g.node(n).control_inputs.is_empty() && !waited_for.contains(&n) && !claimed.contains(&n);
        if let Some(c) = chain_from(g, id, &readers, &free).filter(|_| free(id)) {
            claimed.extend(c.steps.iter().copied());
            chains.push(c);
        }
    }
    chains
}

/// The chain that starts at `id`, if it is a convolution that absorbs
/// at least one op.
fn chain_from(
    g: &Graph,
    id: NodeId,
    readers: &HashMap<ValueId, Vec<NodeId>>,
    free: &dyn Fn(NodeId) -> bool,
) -> Option<Chain> {
    let node = g.node(id);
    let Op::Spatial(SpatialOp::Conv2dNhwc { scale: false, residual: false, relu: false, bias, .. }) = node.op else {
        return None;
    };
    let ty = g.value_type(ValueId::new(id, 0)).clone();
    if ty.dtype != DType::F32 {
        return None;
    }
    let channels = ty.dims[3];
    let mut c = Chain {
        conv: id,
        steps: Vec::new(),
        scale: None,
        bias: bias.then(|| node.inputs[2]),
        residual: None,
        relu: false,
    };
    let mut cur = ValueId::new(id, 0);
    while !c.relu && !g.outputs.contains(&cur) {
        let [r] = readers.get(&cur).map(Vec::as_slice).unwrap_or_default() else { break };
        let n = g.node(*r);
        if !free(*r) || n.outputs.len() != 1 || n.outputs[0] != ty {
            break;
        }
        let other = || n.inputs.iter().copied().find(|&v| v != cur);
        let nothing_yet = c.bias.is_none() && c.residual.is_none();
        match n.op {
            Op::Binary(BinaryOp::Mul) if c.scale.is_none() && nothing_yet => match other() {
                Some(o) if per_channel(g, o, channels) => c.scale = Some(o),
                _ => break,
            },
            Op::Binary(BinaryOp::Add) if nothing_yet => match other() {
                Some(o) if per_channel(g, o, channels) => c.bias = Some(o),
                Some(o) if whole(g, o, &ty) => c.residual = Some(o),
                _ => break,
            },
            Op::Binary(BinaryOp::Add) if c.residual.is_none() => match other() {
                Some(o) if whole(g, o, &ty) => c.residual = Some(o),
                _ => break,
            },
            Op::Unary(UnaryOp::Relu) => c.relu = true,
            _ => break,
        }
        c.steps.push(*r);
        cur = ValueId::new(*r, 0);
    }
    (!c.steps.is_empty()).then_some(c)
}

/// An f32 value of `channels` values along its last axis and 1 along the
/// others (at most 4): one per output channel.
fn per_channel(g: &Graph, v: ValueId, channels: Option<usize>) -> bool {
    let t = g.value_type(v);
    t.dtype == DType::F32
        && (1..=4).contains(&t.rank())
        && channels.is_some()
        && t.dims[t.rank() - 1] == channels
        && t.dims[..t.rank() - 1].iter().all(|&d| d == Some(1))
}

/// A value of the convolution's own type with every dim known (two
/// unknown dims could still differ, and `add` would broadcast).
fn whole(g: &Graph, v: ValueId, ty: &crate::TensorType) -> bool {
    let t = g.value_type(v);
    t == ty && t.dims.iter().all(Option::is_some)
}

/// The rebuilt graph: each chain's last op replaced by the fused
/// convolution, the rest of the chain left out.
fn rewrite(g: &Graph, chains: &[Chain]) -> Option<Graph> {
    let mut skipped: HashSet<NodeId> = HashSet::new();
    let mut at_last: HashMap<NodeId, &Chain> = HashMap::new();
    for c in chains {
        let (last, rest) = c.steps.split_last().expect("a chain absorbs an op");
        skipped.insert(c.conv);
        skipped.extend(rest.iter().copied());
        at_last.insert(*last, c);
    }
    let mut rw = Rewriter::new(g);
    for (id, n) in g.nodes() {
        if rw.is_mapped(id) || skipped.contains(&id) {
            continue;
        }
        let Some(c) = at_last.get(&id) else {
            rw.copy(id);
            continue;
        };
        let conv = g.node(c.conv);
        let Op::Spatial(SpatialOp::Conv2dNhwc { conv: attrs, .. }) = conv.op else { unreachable!("a chain's start") };
        let mut inputs = vec![rw.value(conv.inputs[0]), rw.value(conv.inputs[1])];
        for v in [c.scale, c.bias].into_iter().flatten() {
            inputs.push(as_vector(&mut rw, g, v, n.location)?);
        }
        inputs.extend(c.residual.map(|v| rw.value(v)));
        let op = SpatialOp::Conv2dNhwc {
            conv: attrs,
            scale: c.scale.is_some(),
            bias: c.bias.is_some(),
            residual: c.residual.is_some(),
            relu: c.relu,
        };
        let node = rw.emit(Op::Spatial(op), &inputs, &[], conv.location).ok()?;
        rw.map(id, &[ValueId::new(node, 0)], &[node]);
    }
    Some(rw.finish())
}

/// A per-channel operand as the `[C]` vector the fused op takes.
fn as_vector(
    rw: &mut Rewriter<'_>,
    g: &Graph,
    v: ValueId,
    location: Option<&'static std::panic::Location<'static>>,
) -> Option<ValueId> {
    let new = rw.value(v);
    let t = g.value_type(v);
    if t.rank() == 1 {
        return Some(new);
    }
    let c = t.dims[t.rank() - 1].expect("per_channel: a known size") as i64;
    rw.emit(Op::Reshape { shape: vec![c] }, &[new], &[], location).ok().map(|n| ValueId::new(n, 0))
}
