//! The spatial step: convolutions, pools and their gradients run through
//! the direct kernels of `tracejit_kernels::conv` and `pool2d` (no im2col
//! buffer: panels of input rows per band of outputs, register tiles of
//! channels × pixels), with the output buffer taken from the executable's
//! pool.
//!
//! Which path a step takes:
//! - f32 operands: the fast kernels. Their sums are the reference loops'
//!   in another order, so results differ from the interpreter's by
//!   rounding (the op's tolerance budget counts the terms), and never
//!   with the thread count (each output is summed in an order fixed by the
//!   geometry).
//! - f64 operands, and empty ones (a batch of 0): the reference loops
//!   (`tracejit_tensor::kernels`), as the interpreter runs them.
//! - bf16 and f16 operands: widened to f32, the f32 path, each result
//!   rounded back once (as the reference kernels compute them).
//!
//! A geometry the kernels reject cannot reach here: the step's types were
//! inferred (and re-checked on concrete shapes where a dim was unknown),
//! which is the same rule.

use ndarray::{ArcArray, IxDyn};
use tracejit_ir::tensor::{kernels, DType, SpatialOp, Storage};
use tracejit_kernels::conv::{self, Conv2dGeometry};
use tracejit_kernels::pool2d::{self, Pool2dGeometry};
use tracejit_kernels::Isa;

use crate::region::BufPool;

/// The kernel that runs `op` on f32 operands, for listings and profiles.
pub(crate) fn kernel_name(op: &SpatialOp) -> &'static str {
    match op {
        SpatialOp::Conv2d { relu: true, bias: true, .. } => "conv2d+bias+relu (direct)",
        SpatialOp::Conv2d { relu: true, .. } => "conv2d+relu (direct)",
        SpatialOp::Conv2d { bias: true, .. } => "conv2d+bias (direct)",
        SpatialOp::Conv2d { .. } => "conv2d (direct)",
        SpatialOp::Conv2dBackwardData { conv, .. } if conv.stride == [1, 1] => "conv2d_backward_data (direct)",
        SpatialOp::Conv2dBackwardData { .. } => "conv2d_backward_data (gemm + col2im)",
        SpatialOp::Conv2dBackwardFilter { .. } => "conv2d_backward_filter (direct)",
        SpatialOp::MaxPool2d { .. } => "max_pool2d",
        SpatialOp::MaxPool2dBackward { .. } => "max_pool2d_backward",
        SpatialOp::AvgPool2d { .. } => "avg_pool2d",
        SpatialOp::AvgPool2dBackward { .. } => "avg_pool2d_backward",
    }
}

/// Runs a spatial op (convolution, pool or a gradient of one) on concrete
/// operands through the fast kernels, as a compiled step does, on the
/// [`Isa`] of the entered [`crate::Target`]: eager mode's convolutions and
/// pools. `args` must satisfy the op's type rule (eager mode checks it
/// first). f64 and empty operands take the reference loops, bf16 and f16
/// the f32 kernels on widened copies, as in [`run`].
///
/// The reference loops (`tracejit_tensor::kernels::spatial`) stay the
/// interpreter's and the tests' oracle; these results differ from theirs
/// by rounding only (sums in another order).
///
/// ```
/// use tracejit_ir::tensor::{Conv2dAttrs, SpatialOp, Storage};
///
/// let x = Storage::from_vec((0..25).map(|i| i as f32).collect::<Vec<_>>(), &[1, 1, 5, 5]).unwrap();
/// let w = Storage::from_vec(vec![1.0f32; 9], &[1, 1, 3, 3]).unwrap();
/// let conv = Conv2dAttrs { stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let y = tracejit_jit::spatial(&SpatialOp::Conv2d { conv, bias: false, relu: false }, &[&x, &w]);
/// assert_eq!(y[0].to_vec::<f32>().unwrap(), [54., 63., 72., 99., 108., 117., 144., 153., 162.]);
/// ```
pub fn spatial(op: &SpatialOp, args: &[&Storage]) -> Vec<Storage> {
    run(op, args, Isa::current(), &mut BufPool::default())
}

/// Runs `op` on `args` (checked against its type rule), its outputs'
/// buffers from `pool`.
pub(crate) fn run(op: &SpatialOp, args: &[&Storage], isa: Isa, pool: &mut BufPool) -> Vec<Storage> {
    // bf16 / f16: the f32 kernels on the widened operands, each result
    // rounded once (the reference kernels' rule, at the fast kernels' speed).
    if let Some(low) = args.iter().map(|a| a.dtype()).find(|d| d.is_low_precision()) {
        let wide: Vec<Storage> = args.iter().map(|a| kernels::cast(a, DType::F32)).collect();
        let refs: Vec<&Storage> = wide.iter().collect();
        return run(op, &refs, isa, pool).iter().map(|r| kernels::cast(r, low)).collect();
    }
    // Empty tensors (a batch of 0) have nothing to compute, and the fast
    // kernels take positive sizes only.
    if args.iter().any(|a| a.dtype() != DType::F32 || a.is_empty()) {
        return kernels::spatial(op, args);
    }
    // Contiguous views of the operands (a copy only for a strided one).
    let owned: Vec<Storage> =
        args.iter().map(|a| if a.is_standard_layout() { (*a).clone() } else { a.to_standard() }).collect();
    let s: Vec<&[f32]> = owned.iter().map(slice).collect();
    let mut out = |shape: &[usize]| output(pool, shape);
    match *op {
        SpatialOp::Conv2d { conv, bias, relu } => {
            let g = conv_geometry(&conv, owned[0].shape(), owned[1].shape());
            let (mut y, ys) = out(&[g.batch, g.out_channels, g.out_h(), g.out_w()]);
            conv::forward(&g, s[0], s[1], bias.then(|| s[2]), relu, slice_mut(&mut y), isa);
            vec![finish(y, &ys)]
        }
        SpatialOp::Conv2dBackwardData { conv, input_hw } => {
            let (dy, w) = (owned[0].shape(), owned[1].shape());
            let x = [dy[0], w[1] * conv.groups, input_hw[0], input_hw[1]];
            let g = conv_geometry(&conv, &x, w);
            let (mut dx, shape) = out(&x);
            conv::backward_data(&g, s[0], s[1], slice_mut(&mut dx), isa);
            vec![finish(dx, &shape)]
        }
        SpatialOp::Conv2dBackwardFilter { conv, kernel, bias } => {
            let (x, dy) = (owned[0].shape(), owned[1].shape());
            let w = [dy[1], x[1] / conv.groups, kernel[0], kernel[1]];
            let g = conv_geometry(&conv, x, &w);
            let (mut dw, ws) = out(&w);
            let (mut db, bs) = out(&[dy[1]]);
            conv::backward_filter(&g, s[0], s[1], slice_mut(&mut dw), bias.then(|| slice_mut(&mut db)), isa);
            let mut outs = vec![finish(dw, &ws)];
            if bias {
                outs.push(finish(db, &bs));
            }
            outs
        }
        SpatialOp::MaxPool2d { pool: p } | SpatialOp::AvgPool2d { pool: p } => {
            let g = pool_geometry(&p, owned[0].shape());
            let (mut y, ys) = out(&[g.batch, g.channels, g.out_h(), g.out_w()]);
            if matches!(op, SpatialOp::MaxPool2d { .. }) {
                pool2d::max_forward(&g, s[0], slice_mut(&mut y), isa);
            } else {
                pool2d::avg_forward(&g, s[0], slice_mut(&mut y), isa);
            }
            vec![finish(y, &ys)]
        }
        SpatialOp::MaxPool2dBackward { pool: p } => {
            let g = pool_geometry(&p, owned[0].shape());
            let (mut dx, shape) = out(owned[0].shape());
            pool2d::max_backward(&g, s[0], s[1], slice_mut(&mut dx), isa);
            vec![finish(dx, &shape)]
        }
        SpatialOp::AvgPool2dBackward { pool: p, input_hw } => {
            let dy = owned[0].shape();
            let x = [dy[0], dy[1], input_hw[0], input_hw[1]];
            let g = pool_geometry(&p, &x);
            let (mut dx, shape) = out(&x);
            pool2d::avg_backward(&g, s[0], slice_mut(&mut dx), isa);
            vec![finish(dx, &shape)]
        }
    }
}

/// The kernels' geometry of a convolution of `x` by weights of `w`.
pub(crate) fn conv_geometry(c: &tracejit_ir::tensor::Conv2dAttrs, x: &[usize], w: &[usize]) -> Conv2dGeometry {
    Conv2dGeometry {
        batch: x[0],
        in_channels: x[1],
        in_h: x[2],
        in_w: x[3],
        out_channels: w[0],
        kernel: [w[2], w[3]],
        stride: c.stride,
        dilation: c.dilation,
        pad: c.pad,
        groups: c.groups,
    }
}

fn pool_geometry(p: &tracejit_ir::tensor::Pool2dAttrs, x: &[usize]) -> Pool2dGeometry {
    Pool2dGeometry {
        batch: x[0],
        channels: x[1],
        in_h: x[2],
        in_w: x[3],
        kernel: p.kernel,
        stride: p.stride,
        pad: p.pad,
    }
}

/// A contiguous f32 operand's elements.
fn slice(s: &Storage) -> &[f32] {
    match s {
        Storage::F32(a) => a.as_slice().expect("made contiguous above"),
        _ => unreachable!("f32 checked above"),
    }
}

/// An output buffer of `shape` (from the pool when one fits; the kernels
/// overwrite every element), and the shape to give it back.
fn output(pool: &mut BufPool, shape: &[usize]) -> (ArcArray<f32, IxDyn>, Vec<usize>) {
    let a = match pool.take(DType::F32, shape) {
        Some(Storage::F32(a)) if a.is_standard_layout() && a.shape() == shape => a,
        _ => ArcArray::zeros(IxDyn(shape)),
    };
    (a, shape.to_vec())
}

fn slice_mut(a: &mut ArcArray<f32, IxDyn>) -> &mut [f32] {
    a.as_slice_mut().expect("a standard-layout buffer of its own")
}

fn finish(a: ArcArray<f32, IxDyn>, shape: &[usize]) -> Storage {
    debug_assert_eq!(a.shape(), shape);
    Storage::F32(a)
}
