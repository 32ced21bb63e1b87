//! Export of the spatial ops: `conv2d` as ONNX `Conv` (its bias as the
//! third input, a fused relu as a `Relu` after it; the channels-last form
//! between two `Transpose`s), `max_pool2d` as
//! `MaxPool`, `avg_pool2d` as `AveragePool` with `count_include_pad = 0`,
//! all with explicit `pads` in ONNX's order (begins, then ends:
//! top, left, bottom, right) and floor-mode output sizes (`ceil_mode = 0`).
//! The gradient ops have no ONNX counterpart in inference graphs (export
//! the function that computes the prediction, not the training step).
//! Batch norm in inference (the `tracejit.nn.batch_norm` composite, with a
//! constant epsilon) is one `BatchNormalization` node.

use tracejit_ir::tensor::{SpatialOp, Storage};

use tracejit_ir::{Graph, Node, Op};

use crate::body::{attr_float, attr_int, attr_ints, Body};

/// The epsilon of a call of the `tracejit.nn.batch_norm` composite that
/// exports as one `BatchNormalization` node: its sixth input is a
/// constant of the calling graph (as `nn::batch_norm` passes it). `None`
/// for another call, which exports as a local function.
pub(crate) fn batch_norm_eps(g: &Graph, node: &Node, implements: &str) -> Option<f32> {
    // The declaration's own name, not a copy of the string: a renamed
    // composite cannot silently stop exporting as one node.
    if implements != tracejit_nn::BATCH_NORM.name() || node.inputs.len() != 6 {
        return None;
    }
    let Op::Constant { value } = &g.node(node.inputs[5].node).op else { return None };
    match value {
        Storage::F32(a) if a.len() == 1 => a.iter().next().copied(),
        Storage::F64(a) if a.len() == 1 => a.iter().next().map(|&v| v as f32),
        _ => None,
    }
}

/// `BatchNormalization(x, scale, bias, mean, var)` in inference mode.
pub(crate) fn batch_norm(b: &mut Body, ins: &[String], eps: f32, out: &str) {
    let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
    b.to(out, "BatchNormalization", &refs, vec![attr_float("epsilon", eps)]);
}

fn ints(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// Emits `op` on inputs `ins` writing `out`.
pub(crate) fn emit(b: &mut Body, op: &SpatialOp, ins: &[String], out: &str) -> Result<(), String> {
    let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
    match *op {
        SpatialOp::Conv2d { conv, relu, .. } => {
            let attrs = vec![
                attr_ints("strides", &ints(&conv.stride)),
                attr_ints("dilations", &ints(&conv.dilation)),
                attr_ints("pads", &ints(&conv.pad)),
                attr_int("group", conv.groups as i64),
            ];
            if relu {
                let y = b.op("Conv", &refs, attrs);
                b.to(out, "Relu", &[&y], vec![]);
            } else {
                b.to(out, "Conv", &refs, attrs);
            }
        }
        SpatialOp::MaxPool2d { pool } | SpatialOp::AvgPool2d { pool } => {
            let mut attrs = vec![
                attr_ints("kernel_shape", &ints(&pool.kernel)),
                attr_ints("strides", &ints(&pool.stride)),
                attr_ints("pads", &ints(&pool.pad)),
            ];
            let kind = if matches!(op, SpatialOp::MaxPool2d { .. }) {
                "MaxPool"
            } else {
                attrs.push(attr_int("count_include_pad", 0));
                "AveragePool"
            };
            b.to(out, kind, &refs[..1], attrs);
        }
        SpatialOp::Conv2dNhwc { .. } | SpatialOp::MaxPool2dNhwc { .. } => {
            // ONNX's Conv and MaxPool are NCHW: the image transposed in,
            // the result transposed out.
            let x = b.op("Transpose", &refs[..1], vec![attr_ints("perm", &[0, 3, 1, 2])]);
            let mut first = ins.to_vec();
            first[0] = x;
            let y = b.fresh("nchw");
            emit(b, &op.channels_first(), &first, &y)?;
            b.to(out, "Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 3, 1])]);
        }
        SpatialOp::Conv2dBackwardData { .. }
        | SpatialOp::Conv2dBackwardFilter { .. }
        | SpatialOp::MaxPool2dBackward { .. }
        | SpatialOp::AvgPool2dBackward { .. } => {
            return Err(format!(
                "`{}` is a gradient op, which ONNX inference graphs do not hold; export the function that \
                 computes the prediction, not the training step",
                op.name()
            ));
        }
    }
    Ok(())
}
