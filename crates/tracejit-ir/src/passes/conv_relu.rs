//! `conv_relu`: a `relu` of a convolution moves into the convolution's
//! output pass (`conv2d[.., relu=true]`), so the direct kernel writes
//! `max(conv + bias, 0)` once instead of the convolution and then a
//! second pass over its output.
//!
//! When: the convolution's result is read only by the `relu` and by
//! comparisons `gt(conv, 0)` (what the relu's gradient reads), and is not
//! a graph output. Those comparisons then read the fused result: `v > 0`
//! exactly when `relu(v) > 0`, NaN included (both false), so nothing
//! changes bit for bit. The `relu` node is left without readers for `dce`.

use tracejit_tensor::{BinaryOp, SpatialOp, Storage, UnaryOp};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult};
use crate::{Graph, NodeId, Op, ValueId};

/// The convolution-relu fusion pass (`conv_relu`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvRelu;

impl Pass for ConvRelu {
    fn name(&self) -> &'static str {
        "conv_relu"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let nested = run_in_subgraphs(self, g, cx);
        let mut fused = 0;
        let ids: Vec<NodeId> = g.nodes().map(|(id, _)| id).collect();
        for &id in &ids {
            if let Some(relu) = fusible(g, id) {
                let Op::Spatial(SpatialOp::Conv2d { conv, bias, .. }) = g.node(id).op else { continue };
                g.node_mut(id).op = Op::Spatial(SpatialOp::Conv2d { conv, bias, relu: true });
                let (from, to) = (ValueId::new(relu, 0), ValueId::new(id, 0));
                for n in ids.iter().copied().filter(|&n| n > relu) {
                    for v in g.node_mut(n).inputs.iter_mut().filter(|v| **v == from) {
                        *v = to;
                    }
                }
                g.outputs.iter_mut().filter(|v| **v == from).for_each(|v| *v = to);
                fused += 1;
            }
        }
        nested.and(PassResult::count(fused, if fused == 1 { "relu fused" } else { "relus fused" }))
    }
}

/// The `relu` node that `id`, a convolution without one, can absorb.
fn fusible(g: &Graph, id: NodeId) -> Option<NodeId> {
    let node = g.node(id);
    if !matches!(node.op, Op::Spatial(SpatialOp::Conv2d { relu: false, .. })) {
        return None;
    }
    let out = ValueId::new(id, 0);
    if g.outputs.contains(&out) {
        return None;
    }
    let mut relu = None;
    for (reader, n) in g.nodes() {
        if !n.inputs.contains(&out) {
            continue;
        }
        match &n.op {
            Op::Unary(UnaryOp::Relu) if relu.is_none() => relu = Some(reader),
            Op::Binary(BinaryOp::Gt) if n.inputs[0] == out && is_zero(g, n.inputs[1]) => {}
            _ => return None,
        }
    }
    // A relu others wait for (a control input) stays where it is.
    let relu = relu?;
    let waited_for = g.nodes().any(|(_, n)| n.control_inputs.contains(&relu));
    (!waited_for && g.node(relu).control_inputs.is_empty()).then_some(relu)
}

/// True for a constant of zeros (a broadcast scalar 0).
fn is_zero(g: &Graph, v: ValueId) -> bool {
    match &g.node(v.node).op {
        Op::Constant { value } => match value {
            Storage::F32(a) => a.iter().all(|&x| x == 0.0),
            Storage::F64(a) => a.iter().all(|&x| x == 0.0),
            Storage::BF16(a) => a.iter().all(|&x| x.to_f32() == 0.0),
            Storage::F16(a) => a.iter().all(|&x| x.to_f32() == 0.0),
            _ => false,
        },
        _ => false,
    }
}
