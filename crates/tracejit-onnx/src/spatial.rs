//! Export of the spatial ops: `conv2d` as ONNX `Conv` (its bias as the
//! third input, a fused relu as a `Relu` after it; the channels-last form
//! between two `Transpose`s, its epilogue as `Mul`, `Add`, `Add`, `Relu`
//! after them), `max_pool2d` as
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
            let first_op = op.channels_first();
            let mut first = ins[..first_op.num_inputs()].to_vec();
            first[0] = x;
            let y = b.fresh("nchw");
            emit(b, &first_op, &first, &y)?;
            let Some(e) = op.conv_epilogue() else {
                b.to(out, "Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 3, 1])]);
                return Ok(());
            };
            // The epilogue channels last, as its ops: a `[C]` operand
            // broadcasts over the last axis.
            let mut v = b.op("Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 3, 1])]);
            let steps =
                [(e.scale, "Mul"), (e.bias, "Add"), (e.residual, "Add"), (e.relu.then_some(usize::MAX), "Relu")];
            let steps: Vec<_> = steps.into_iter().filter_map(|(at, kind)| at.map(|i| (i, kind))).collect();
            for (k, &(i, kind)) in steps.iter().enumerate() {
                let operands: Vec<&str> = if kind == "Relu" { vec![&v] } else { vec![&v, &refs[i]] };
                if k + 1 == steps.len() {
                    b.to(out, kind, &operands, vec![]);
                } else {
                    v = b.op(kind, &operands, vec![]);
                }
            }
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

#[cfg(test)]
mod tests {
    use prost::Message;
    use tracejit_ir::tensor::Storage;
    use tracejit_ir::{interpret, Graph};
    use tracejit_trace::Tensor;

    use crate::{emit, pb};

    /// A channels-last convolution with every epilogue step (and one
    /// without), exported, read back by the importer (which ONNX's own
    /// backend tests check) and run: the same values as the interpreter.
    #[test]
    fn channels_last_epilogues_export_as_their_ops() {
        let text = "graph block(%0: f32[2, 6, 5, 3], %1: f32[4, 3, 3, 3], %2: f32[4], %3: f32[4], \
                    %4: f32[2, 6, 5, 4], %5: f32[4, 4, 3, 3]) -> (%7) {\n  \
                    %6 = conv2d_nhwc[stride=[1, 1], dilation=[1, 1], pads=[1, 1, 1, 1], groups=1, scale=true, \
                    bias=true, residual=true, relu=true] %0, %1, %2, %3, %4 : f32[2, 6, 5, 4]\n  \
                    %7 = conv2d_nhwc[stride=[1, 1], dilation=[1, 1], pads=[0, 0, 0, 0], groups=1, scale=true, \
                    bias=false, relu=false] %6, %5, %2 : f32[2, 4, 3, 4]\n}\n";
        let g = Graph::parse(text).unwrap_or_else(|e| panic!("{e}"));
        let inputs: Vec<String> = (0..6).map(|i| format!("in{i}")).collect();
        let mut state = emit::ModelState::default();
        let body = emit::emit_graph(&g, emit::Scope::Main, &inputs, &["out".into()], &mut state).unwrap().body;
        let types = g.param_types();
        let graph = pb::GraphProto {
            node: body.nodes,
            initializer: body.initializers,
            input: inputs.iter().zip(&types).map(|(n, t)| emit::value_info(n, t, |_| None)).collect(),
            output: vec![emit::value_info("out", &g.output_types()[0], |_| None)],
            ..pb::GraphProto::default()
        };
        let model = pb::ModelProto {
            ir_version: Some(crate::IR_VERSION),
            opset_import: vec![emit::opset("", crate::OPSET)],
            graph: Some(graph),
            ..pb::ModelProto::default()
        };
        let imported = crate::import::import_bytes(&model.encode_to_vec()).unwrap();
        let args: Vec<Storage> = types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let shape = t.shape().unwrap();
                let n: usize = shape.iter().product();
                let v = (0..n).map(|j| ((j * 37 + i * 11) % 23) as f32 / 11.5 - 1.0).collect::<Vec<_>>();
                Storage::from_vec(v, &shape).unwrap()
            })
            .collect();
        let want = interpret(&g, &args).unwrap().remove(0).to_vec::<f32>().unwrap();
        let tensors: Vec<Tensor> = args.into_iter().map(Tensor::from).collect();
        let got = imported.run(&tensors).unwrap().remove(0).to_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        // The importer's convolution may sum in another order (another
        // kernel, another CPU). Inputs lie in [-1, 1): the first layer's
        // 27 products and its epilogue stay below 29 in size, the second
        // layer sums 36 products below 29, so Σ|terms| < 1044 and two
        // orders differ by at most 2 · 36 · ε · 1044 < 1.2e-2 (the first
        // layer's own error, 2 · 27 · ε · 27, times 36 weights below 1,
        // adds under 1e-4).
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1.2e-2, "[{i}] {a} vs {b}");
        }
    }
}
