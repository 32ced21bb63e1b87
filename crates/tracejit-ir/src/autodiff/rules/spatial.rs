//! The VJPs of the spatial ops, each written with the others so that a
//! differentiated graph keeps one op per product (never a graph of
//! gathers): a convolution's input gradient is `conv2d_backward_data`,
//! its weight and bias gradients one `conv2d_backward_filter`; those two
//! are linear in each operand and their own VJPs are convolutions again
//! (second derivatives). A max pool's gradient is `max_pool2d_backward`,
//! whose adjoint in `dy` reads a tensor at each window's maximum (window
//! slices, so forward mode through a max pool works); an average pool's
//! is `avg_pool2d_backward`, whose adjoint is the average pool itself.
//!
//! The backward ops need the forward input's height and width (a strided
//! convolution's output does not determine them) and the kernel's size:
//! a gradient through an input of unknown height or width is an error
//! naming the op (an unknown batch is fine).

use tracejit_tensor::{BinaryOp, DType, Pool2dAttrs, ReduceOp, SliceSpec, SpatialOp, UnaryOp};

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
    wanted: &[bool],
) -> R<Vec<Option<E::Value>>> {
    let g = cotangents.first().cloned().flatten();
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
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
            // The image's gradient (a first layer's) or the filter's and
            // bias's (a frozen layer's) only when asked for.
            let dx = match want(0) {
                true => Some(
                    spatial(b, SpatialOp::Conv2dBackwardData { conv, input_hw }, &[g.clone(), w.clone()])?.remove(0),
                ),
                false => None,
            };
            let mut out = vec![dx];
            if want(1) || (bias && want(2)) {
                let dw = spatial(b, SpatialOp::Conv2dBackwardFilter { conv, kernel, bias }, &[x.clone(), g])?;
                out.extend(dw.into_iter().map(Some));
            } else {
                out.extend(std::iter::repeat_n(None, 1 + usize::from(bias)));
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
        SpatialOp::MaxPool2dBackward { pool } => {
            // dx = Aᵀ dy routes dy to each window's maximum: linear in dy
            // (its cotangent is A g, g read at the maxima: the max pool's
            // JVP, what forward mode by transposition needs) and piecewise
            // constant in x.
            let Some(g) = g else { return Ok(vec![None, None]) };
            vec![None, Some(max_pool_select(b, op, pool, &inputs[0], &g)?)]
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
        SpatialOp::Conv2dNhwc { .. } if sp.conv_epilogue().is_some() => {
            epilogue_vjp(b, op, sp, inputs, outputs, cotangents, wanted)?
        }
        SpatialOp::Conv2dNhwc { .. } | SpatialOp::MaxPool2dNhwc { .. } => {
            channels_last_vjp(b, op, sp, inputs, outputs, cotangents, wanted)?
        }
    })
}

/// A channels-last op's cotangents: the NCHW op's rule on the transposed
/// image, output and cotangent, the image's cotangent transposed back
/// (the weights' and bias's have no layout).
fn channels_last_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    sp: &SpatialOp,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wanted: &[bool],
) -> R<Vec<Option<E::Value>>> {
    const TO_FIRST: [usize; 4] = [0, 3, 1, 2];
    let first =
        |b: &mut B<'_, E>, v: &E::Value| b.op(Op::Transpose { perm: TO_FIRST.to_vec() }, std::slice::from_ref(v));
    let mut ins = inputs.to_vec();
    ins[0] = first(b, &inputs[0])?;
    let outs = outputs.iter().map(|y| first(b, y)).collect::<R<Vec<_>>>()?;
    let cots = cotangents.iter().map(|c| c.as_ref().map(|c| first(b, c)).transpose()).collect::<R<Vec<_>>>()?;
    let mut grads = spatial_vjp(b, op, &sp.channels_first(), &ins, &outs, &cots, wanted)?;
    if let Some(Some(dx)) = grads.first_mut() {
        *dx = b.op(Op::Transpose { perm: vec![0, 2, 3, 1] }, std::slice::from_ref(dx))?;
    }
    Ok(grads)
}

/// The cotangents of a `conv2d_nhwc` with a scale or residual epilogue,
/// `y = relu(c · s + b + r)` on the bare convolution `c`: through relu
/// (1 where y > 0), `r`'s is `g`, `b`'s and `s`'s are sums over the
/// batch and the map (of `g`, of `g · c` with `c` computed again), and
/// `c`'s, `g · s`, goes through the bare convolution's rule.
fn epilogue_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    sp: &SpatialOp,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wanted: &[bool],
) -> R<Vec<Option<E::Value>>> {
    let (Some(e), SpatialOp::Conv2dNhwc { conv, .. }) = (sp.conv_epilogue(), sp) else {
        unreachable!("called for epilogues only")
    };
    let mut out = vec![None; inputs.len()];
    let Some(mut g) = cotangents.first().cloned().flatten() else { return Ok(out) };
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
    if e.relu {
        let zero = b.k(&outputs[0], 0.0);
        let live = b.bin(BinaryOp::Gt, &outputs[0], &zero)?;
        g = b.mask(&live, &g)?;
    }
    let over_map = |b: &mut B<'_, E>, v: E::Value| {
        b.op(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1, 2], keepdims: false }, &[v])
    };
    if let Some(i) = e.residual {
        out[i] = Some(g.clone());
    }
    if let Some(i) = e.bias.filter(|&i| want(i)) {
        out[i] = Some(over_map(b, g.clone())?);
    }
    let bare = SpatialOp::Conv2dNhwc { conv: *conv, scale: false, bias: false, residual: false, relu: false };
    if let Some(i) = e.scale {
        if want(i) {
            let c = b.op(Op::Spatial(bare), &inputs[..2])?;
            let gc = b.mul(&g, &c)?;
            out[i] = Some(over_map(b, gc)?);
        }
        g = b.mul(&g, &inputs[i])?;
    }
    let grads = channels_last_vjp(b, op, &bare, &inputs[..2], &[], &[Some(g)], &wanted[..2.min(wanted.len())])?;
    for (o, d) in out.iter_mut().zip(grads) {
        *o = d;
    }
    Ok(out)
}

/// `g` (of `x`'s shape) read at each window's maximum of `x`, the
/// position `max_pool2d_backward` routes that window's `dy` to: the first
/// maximum of the in-bounds values in row-major order, or the last NaN of
/// a window holding NaN; an empty window reads nothing (0). Built from
/// window slices of the padded `x` and `g` stacked on a fifth axis, so
/// every op in it has its own derivatives.
fn max_pool_select<E: Emitter>(
    b: &mut B<'_, E>,
    op: &Op,
    pool: Pool2dAttrs,
    x: &E::Value,
    g: &E::Value,
) -> R<E::Value> {
    let [h, w] = hw(b, op, x, "the input's")?;
    let (Some(oh), Some(ow)) = (pool.out_size(0, h), pool.out_size(1, w)) else {
        return Err(unsupported(op, format!("the window {:?} does not fit the input {h}x{w}", pool.kernel)));
    };
    let dtype = b.ty(x).dtype;
    let y = b.op(Op::Spatial(SpatialOp::MaxPool2d { pool }), std::slice::from_ref(x))?;
    let y = b.op(Op::ExpandDims { axis: 4 }, &[y])?;
    // Window (i, j) of output (oy, ox) reads padded row i + stride·oy: pad
    // the bottom and right so that every window's slice is in range.
    let extent = |axis: usize, out: usize| pool.kernel[axis] + pool.stride[axis] * (out - 1);
    let after = |axis: usize, n: usize, out: usize| extent(axis, out).saturating_sub(pool.pad[axis] + n);
    let pads = vec![(0, 0), (0, 0), (pool.pad[0], after(0, h, oh)), (pool.pad[1], after(1, w, ow))];
    let pad = |b: &mut B<'_, E>, v: E::Value| b.op(Op::Pad { pads: pads.clone(), value: 0.0 }, &[v]);
    let ones = super::true_like(b.e, x)?;
    let ones = b.op(Op::Cast { to: dtype }, &[ones])?;
    let (xp, gp, inside) = (pad(b, x.clone())?, pad(b, g.clone())?, pad(b, ones)?);
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..pool.kernel[0] {
        for j in 0..pool.kernel[1] {
            let rows = SliceSpec {
                start: Some(i as i64),
                stop: Some((i + pool.stride[0] * (oh - 1) + 1) as i64),
                step: pool.stride[0] as i64,
            };
            let cols = SliceSpec {
                start: Some(j as i64),
                stop: Some((j + pool.stride[1] * (ow - 1) + 1) as i64),
                step: pool.stride[1] as i64,
            };
            let specs = vec![SliceSpec::FULL, SliceSpec::FULL, rows, cols];
            for (part, v) in parts.iter_mut().zip([&xp, &gp, &inside]) {
                part.push(b.op(Op::Slice { specs: specs.clone() }, std::slice::from_ref(v))?);
            }
        }
    }
    let [xs, gs, ins] = parts.map(|p| b.op(Op::Stack { axis: 4 }, &p));
    let (xs, gs, ins) = (xs?, gs?, ins?);
    let half = b.k(&ins, 0.5);
    let inside = b.bin(BinaryOp::Gt, &ins, &half)?;
    // The first in-bounds value equal to the window's maximum.
    let equal = b.bin(BinaryOp::Eq, &xs, &y)?;
    let equal = b.bin(BinaryOp::LogicalAnd, &equal, &inside)?;
    let first = only_one(b, &equal, false)?;
    // The last NaN, where the maximum is NaN.
    let nan = b.un(UnaryOp::IsNan, &xs)?;
    let nan = b.bin(BinaryOp::LogicalAnd, &nan, &inside)?;
    let last = only_one(b, &nan, true)?;
    let y_nan = b.un(UnaryOp::IsNan, &y)?;
    let chosen = b.op(Op::Select, &[y_nan, last, first])?;
    let picked = b.mask(&chosen, &gs)?;
    b.op(Op::Reduce { op: ReduceOp::Sum, axes: vec![4], keepdims: false }, &[picked])
}

/// Where `hits` (bool, windows on axis 4) holds its first true value
/// (`from_end`: its last).
fn only_one<E: Emitter>(b: &mut B<'_, E>, hits: &E::Value, from_end: bool) -> R<E::Value> {
    let count = b.op(Op::Cast { to: DType::F32 }, std::slice::from_ref(hits))?;
    let rev = |b: &mut B<'_, E>, v: E::Value| {
        if !from_end {
            return Ok(v);
        }
        let mut specs = vec![SliceSpec::FULL; 5];
        specs[4] = SliceSpec { start: None, stop: None, step: -1 };
        b.op(Op::Slice { specs }, &[v])
    };
    let count = rev(b, count)?;
    let running = b.op(Op::Cumsum { axis: 4 }, &[count])?;
    let running = rev(b, running)?;
    let one = b.k(&running, 1.0);
    let at_one = b.bin(BinaryOp::Eq, &running, &one)?;
    b.bin(BinaryOp::LogicalAnd, &at_one, hits)
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
