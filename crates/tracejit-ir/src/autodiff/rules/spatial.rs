//! The VJPs of the spatial ops, each written with the others so that a
//! differentiated graph keeps one op per product (never a graph of
//! gathers): a convolution's input gradient is `conv2d_backward_data`,
//! its weight and bias gradients one `conv2d_backward_filter`; those two
//! are linear in each operand and their own VJPs are convolutions again
//! (second derivatives). A max pool's gradient is `max_pool2d_backward`,
//! an average pool's `avg_pool2d_backward`, whose adjoint is the average
//! pool itself.
//!
//! The backward ops need the forward input's height and width (a strided
//! convolution's output does not determine them) and the kernel's size:
//! a gradient through an input of unknown height or width is an error
//! naming the op (an unknown batch is fine).

use tracejit_tensor::{BinaryOp, SpatialOp};

use super::{unsupported, B, R};
use crate::autodiff::Emitter;
use crate::Op;

/// The cotangents of a spatial op's inputs from those of its outputs
/// (`None`: zero).
pub(super) fn spatial_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    sp: &SpatialOp,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
) -> R<Vec<Option<E::Value>>> {
    let g = cotangents.first().cloned().flatten();
    let spatial = |b: &mut B<'_, E>, s: SpatialOp, xs: &[E::Value]| b.e.emit(Op::Spatial(s), xs);
    Ok(match *sp {
        SpatialOp::Conv2d { conv, bias, relu } => {
            let Some(mut g) = g else { return Ok(vec![None; inputs.len()]) };
            if relu {
                // relu(v)'s derivative read from its output: 1 where y > 0.
                let y = &outputs[0];
                let zero = b.k(y, 0.0);
                let live = b.bin(BinaryOp::Gt, y, &zero)?;
                g = b.mask(&live, &g)?;
            }
            let (x, w) = (&inputs[0], &inputs[1]);
            let input_hw = hw(b, op, x, "the input's")?;
            let kernel = hw(b, op, w, "the kernel's")?;
            let dx = spatial(b, SpatialOp::Conv2dBackwardData { conv, input_hw }, &[g.clone(), w.clone()])?.remove(0);
            let mut dw = spatial(b, SpatialOp::Conv2dBackwardFilter { conv, kernel, bias }, &[x.clone(), g])?;
            let mut out = vec![Some(dx), Some(dw.remove(0))];
            if bias {
                out.push(Some(dw.remove(0)));
            }
            out
        }
        SpatialOp::Conv2dBackwardData { conv, .. } => {
            // dx = convᵀ(dy, w) is linear in each: <dx, g> = <dy, conv(g, w)>,
            // and the weights see g as the forward input, dy as the output's
            // gradient.
            let Some(g) = g else { return Ok(vec![None, None]) };
            let (dy, w) = (&inputs[0], &inputs[1]);
            let kernel = hw(b, op, w, "the kernel's")?;
            let forward = SpatialOp::Conv2d { conv, bias: false, relu: false };
            let gdy = spatial(b, forward, &[g.clone(), w.clone()])?.remove(0);
            let gw = spatial(b, SpatialOp::Conv2dBackwardFilter { conv, kernel, bias: false }, &[g, dy.clone()])?;
            vec![Some(gdy), Some(gw[0].clone())]
        }
        SpatialOp::Conv2dBackwardFilter { conv, bias, .. } => {
            // dw = Σ x ⋆ dy (and db = Σ dy): with gw, gb the cotangents of
            // dw, db, x's is convᵀ(dy, gw) and dy's is conv(x, gw) + gb.
            let gb = if bias { cotangents.get(1).cloned().flatten() } else { None };
            let (x, dy) = (&inputs[0], &inputs[1]);
            let gw = match (g, &gb) {
                (Some(g), _) => g,
                (None, None) => return Ok(vec![None, None]),
                (None, Some(_)) => {
                    // Only the bias gradient is used: dy's cotangent is gb
                    // broadcast over batch and space.
                    let gb = gb.expect("matched");
                    let gb = b.op(Op::Reshape { shape: vec![1, -1, 1, 1] }, &[gb])?;
                    return Ok(vec![None, Some(crate::autodiff::broadcast_like(b.e, gb, dy)?)]);
                }
            };
            let input_hw = hw(b, op, x, "the input's")?;
            let gx = spatial(b, SpatialOp::Conv2dBackwardData { conv, input_hw }, &[dy.clone(), gw.clone()])?.remove(0);
            let mut args = vec![x.clone(), gw];
            if let Some(gb) = gb {
                args.push(gb);
            }
            let forward = SpatialOp::Conv2d { conv, bias: args.len() == 3, relu: false };
            let gdy = spatial(b, forward, &args)?.remove(0);
            vec![Some(gx), Some(gdy)]
        }
        SpatialOp::MaxPool2d { pool } => {
            let Some(g) = g else { return Ok(vec![None]) };
            vec![Some(spatial(b, SpatialOp::MaxPool2dBackward { pool }, &[inputs[0].clone(), g])?.remove(0))]
        }
        SpatialOp::MaxPool2dBackward { .. } => {
            if g.is_none() {
                return Ok(vec![None, None]);
            }
            return Err(unsupported(
                op,
                "second derivatives through a max pool are not supported (differentiate the pool once)",
            ));
        }
        SpatialOp::AvgPool2d { pool } => {
            let Some(g) = g else { return Ok(vec![None]) };
            let input_hw = hw(b, op, &inputs[0], "the input's")?;
            vec![Some(spatial(b, SpatialOp::AvgPool2dBackward { pool, input_hw }, &[g])?.remove(0))]
        }
        SpatialOp::AvgPool2dBackward { pool, .. } => {
            // Spreading dy / count over each window is the adjoint of the
            // average over it.
            let Some(g) = g else { return Ok(vec![None]) };
            vec![Some(spatial(b, SpatialOp::AvgPool2d { pool }, &[g])?.remove(0))]
        }
    })
}

/// The static (height, width) of a rank-4 value, or an error naming the
/// op and `what` is unknown.
fn hw<E: Emitter>(b: &B<'_, E>, op: &Op, v: &E::Value, what: &str) -> R<[usize; 2]> {
    let t = b.ty(v);
    match (t.dims.get(2).copied().flatten(), t.dims.get(3).copied().flatten()) {
        (Some(h), Some(w)) => Ok([h, w]),
        _ => Err(unsupported(
            op,
            format!("its gradient needs {what} height and width known when tracing, got {t} (only the batch may be unknown)"),
        )),
    }
}
