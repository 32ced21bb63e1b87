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

use std::sync::{Arc, Mutex};

use ndarray::{ArcArray, IxDyn};
use tracejit_ir::tensor::{kernels, DType, SpatialOp, Storage};
use tracejit_kernels::conv::{self, Conv2dGeometry};
use tracejit_kernels::pool2d::{self, Pool2dGeometry};
use tracejit_kernels::Isa;

use crate::region::{data_ptr, same_shape, BufPool};

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
        &SpatialOp::Conv2dNhwc { scale, bias, residual, relu, .. } => {
            // Every epilogue's name, indexed by its steps as bits.
            const NAMES: [&str; 16] = [
                "conv2d_nhwc (channel lanes)",
                "conv2d_nhwc+scale (channel lanes)",
                "conv2d_nhwc+bias (channel lanes)",
                "conv2d_nhwc+scale+bias (channel lanes)",
                "conv2d_nhwc+residual (channel lanes)",
                "conv2d_nhwc+scale+residual (channel lanes)",
                "conv2d_nhwc+bias+residual (channel lanes)",
                "conv2d_nhwc+scale+bias+residual (channel lanes)",
                "conv2d_nhwc+relu (channel lanes)",
                "conv2d_nhwc+scale+relu (channel lanes)",
                "conv2d_nhwc+bias+relu (channel lanes)",
                "conv2d_nhwc+scale+bias+relu (channel lanes)",
                "conv2d_nhwc+residual+relu (channel lanes)",
                "conv2d_nhwc+scale+residual+relu (channel lanes)",
                "conv2d_nhwc+bias+residual+relu (channel lanes)",
                "conv2d_nhwc+scale+bias+residual+relu (channel lanes)",
            ];
            NAMES[usize::from(scale) | usize::from(bias) << 1 | usize::from(residual) << 2 | usize::from(relu) << 3]
        }
        SpatialOp::MaxPool2dNhwc { .. } => "max_pool2d_nhwc",
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

/// A convolution step's packed filter for the kernels' channel-lane
/// forward ([`conv::PackedFilter`]), kept with the weights it was packed
/// from: found again while the step's weights are the same buffer (values
/// are immutable, and the held clone keeps the buffer from being freed or
/// written in place), replaced when a new version comes. Given to steps
/// whose weights are a variable's value or a constant (the `kept_filters`
/// pass), as the bf16 products keep their packed weights.
///
/// A buffer is packed when it comes back, not when first seen: the first
/// call of a model runs its layers as an uncompiled convolution would
/// (packing all of ResNet-50's weights there made it 20-25 ms slower,
/// a quarter of a call), and a training loop whose step assigns new
/// weights every call packs nothing. A kept filter replaced before it was
/// used again (weights that change every call) ends the keeping for the
/// step.
#[derive(Default)]
pub(crate) struct KeptFilter(Mutex<KeptState>);

/// What a [`KeptFilter`] holds and knows.
#[derive(Default)]
struct KeptState {
    /// The kept filter.
    kept: Option<Arc<Kept>>,
    /// Whether a call found `kept` since it was packed.
    reused: bool,
    /// The weights' buffer (address, length) last seen unpacked, not held.
    seen: Option<(usize, usize)>,
    /// Keeping ended: the weights change every call.
    given_up: bool,
}

/// A packed filter and what it was packed from.
struct Kept {
    from: Storage,
    isa: Isa,
    filter: conv::PackedFilter,
}

impl KeptFilter {
    /// The filter of `w` (whose values are `values`) for `g` on `isa`: the
    /// kept one while `w` is the same buffer, else packed now and kept if
    /// this buffer was seen by the call before. `None` where the geometry
    /// does not take the channel-lane kernel (NCHW: where it is not the
    /// faster forward; channels last: where it cannot run), or the step
    /// does not keep.
    fn get(&self, g: &Conv2dGeometry, w: &Storage, values: &[f32], isa: Isa, last: bool) -> Option<Arc<Kept>> {
        if !takes_packed_filter(g, isa, last) {
            return None;
        }
        let mut st = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if st.given_up {
            return None;
        }
        if let Some(k) = st.kept.as_ref().filter(|k| k.isa == isa && k.from.same_elements(w)) {
            let k = k.clone();
            st.reused = true;
            return Some(k);
        }
        if st.kept.take().is_some() && !st.reused {
            st.given_up = true;
            return None;
        }
        // The weights' own buffer, not `values` (a contiguous copy of a
        // strided one is new in every call).
        let Storage::F32(a) = w else { return None };
        let id = (a.as_ptr() as usize, a.len());
        if st.seen != Some(id) {
            st.seen = Some(id);
            return None;
        }
        let filter = conv::PackedFilter::new(g, values, isa)?;
        let k = Arc::new(Kept { from: w.clone(), isa, filter });
        *st = KeptState { kept: Some(k.clone()), ..KeptState::default() };
        Some(k)
    }

    /// Packs `w` for `g` now, before the step's first call, and keeps it
    /// as if the buffer had come back (see [`prepack`]); false where the
    /// geometry does not take the channel-lane kernel.
    fn prepack(&self, g: &Conv2dGeometry, w: &Storage, isa: Isa, last: bool) -> bool {
        let Storage::F32(a) = w else { return false };
        let Some(values) = a.as_slice().filter(|_| takes_packed_filter(g, isa, last)) else { return false };
        let Some(filter) = conv::PackedFilter::new(g, values, isa) else { return false };
        let kept = Kept { from: w.clone(), isa, filter };
        let id = (a.as_ptr() as usize, a.len());
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) =
            KeptState { kept: Some(Arc::new(kept)), seen: Some(id), ..KeptState::default() };
        true
    }

    /// Whether a packed filter is held now: the step ran the channel-lane
    /// kernel.
    pub(crate) fn holds_filter(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).kept.is_some()
    }
}

/// Whether `g` runs on the channel-lane kernel from a packed filter:
/// channels last (`last`) where it can run, NCHW where it is the faster
/// forward.
fn takes_packed_filter(g: &Conv2dGeometry, isa: Isa, last: bool) -> bool {
    if last {
        conv::channels_last_is_native(g, isa)
    } else {
        conv::prefers_packed_filter(g, isa)
    }
}

/// Packs the filter a convolution step keeps (`kept`) from the weights
/// `w` it will be called with, its input's static shape being `x`, before
/// its first call: for an executable prepared long before it runs (a
/// loaded artifact), whose first call would otherwise run every layer on
/// unpacked weights (ResNet-50's first call at twice a steady one's time
/// on the Zen 5). The first call then finds the filter as later ones do;
/// weights that change on every call end the keeping as they would have.
/// False where `op` is not such a convolution or does not take the
/// channel-lane kernel.
pub(crate) fn prepack(op: &SpatialOp, x: &[usize], w: &Storage, isa: Isa, kept: &KeptFilter) -> bool {
    let w_shape = w.shape();
    if x.len() != 4 || w_shape.len() != 4 || x.contains(&0) || w_shape.contains(&0) {
        return false;
    }
    match *op {
        SpatialOp::Conv2d { conv, .. } => kept.prepack(&conv_geometry(&conv, x, w_shape), w, isa, false),
        SpatialOp::Conv2dNhwc { conv, .. } => {
            kept.prepack(&conv_geometry(&conv, &[x[0], x[3], x[1], x[2]], w_shape), w, isa, true)
        }
        _ => false,
    }
}

/// How listings and profiles name a spatial step: [`kernel_name`], or for
/// a convolution that ran the channel-lane kernel from its kept filter
/// `conv2d+bias+relu (channel lanes, filter kept)`.
pub(crate) fn step_name(op: &SpatialOp, kept: Option<&KeptFilter>) -> String {
    let name = kernel_name(op);
    match kept {
        Some(k) if k.holds_filter() => {
            format!(
                "{} (channel lanes, filter kept)",
                name.trim_end_matches(" (direct)").trim_end_matches(" (channel lanes)")
            )
        }
        _ => name.to_string(),
    }
}

/// Runs `op` on `args` (checked against its type rule), its outputs'
/// buffers from `pool`.
pub(crate) fn run(op: &SpatialOp, args: &[&Storage], isa: Isa, pool: &mut BufPool) -> Vec<Storage> {
    run_kept(op, args, isa, pool, None, None)
}

/// [`run`] for a step that may keep its packed filter (a convolution by
/// a variable's value or a constant).
///
/// `onto` is the operand (and its buffer's address, taken while it was
/// unique) a channels-last convolution may write its output over: its
/// residual, dying at this step (the `in_place` pass).
pub(crate) fn run_kept(
    op: &SpatialOp,
    args: &[&Storage],
    isa: Isa,
    pool: &mut BufPool,
    kept: Option<&KeptFilter>,
    onto: Option<(usize, i64)>,
) -> Vec<Storage> {
    // bf16 / f16: the f32 kernels on the widened operands, each result
    // rounded once (the reference kernels' rule, at the fast kernels' speed).
    if let Some(low) = args.iter().map(|a| a.dtype()).find(|d| d.is_low_precision()) {
        let wide: Vec<Storage> = args.iter().map(|a| kernels::cast(a, DType::F32)).collect();
        let refs: Vec<&Storage> = wide.iter().collect();
        return run_kept(op, &refs, isa, pool, None, None).iter().map(|r| kernels::cast(r, low)).collect();
    }
    // Empty tensors (a batch of 0) have nothing to compute, and the fast
    // kernels take positive sizes only.
    if args.iter().any(|a| a.dtype() != DType::F32 || a.is_empty()) {
        return kernels::spatial(op, args);
    }
    // A pool of an NCHW view of channels-last values (what a model whose
    // convolutions run channels last pools at its head): pooled in place.
    if let Some(y) = pool_channels_last_view(op, args[0], isa, pool) {
        return vec![y];
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
            match kept.and_then(|k| k.get(&g, args[1], s[1], isa, false)) {
                Some(k) => {
                    conv::forward_with_filter(&g, s[0], &k.filter, bias.then(|| s[2]), relu, slice_mut(&mut y), isa)
                }
                None => conv::forward(&g, s[0], s[1], bias.then(|| s[2]), relu, slice_mut(&mut y), isa),
            }
            vec![finish(y, &ys)]
        }
        SpatialOp::Conv2dNhwc { conv, relu, .. } => {
            let x = owned[0].shape();
            let g = conv_geometry(&conv, &[x[0], x[3], x[1], x[2]], owned[1].shape());
            let y_shape = [g.batch, g.out_h(), g.out_w(), g.out_channels];
            let e = op.conv_epilogue();
            let at = |i: Option<usize>| i.map(|i| s[i]);
            // Sizes the type rule could not know (an unknown dim on both
            // sides) that differ now: the ops' own rules (broadcasting).
            if let Some(e) = e {
                let o = g.out_channels;
                let fits = |i: Option<usize>, n: usize| i.is_none_or(|i| s[i].len() == n);
                if !(fits(e.scale, o) && fits(e.bias, o) && fits(e.residual, g.batch * g.out_h() * g.out_w() * o)) {
                    return kernels::spatial(op, args);
                }
            }
            let epi = match e {
                Some(e) => conv::Epilogue { scale: at(e.scale), bias: at(e.bias), residual: at(e.residual), relu },
                None => conv::Epilogue::bias_relu((args.len() > 2).then(|| s[2]), relu),
            };
            let kept = kept.and_then(|k| k.get(&g, args[1], s[1], isa, true));
            let filter = kept.as_ref().map(|k| &k.filter);
            // Over the dying residual: the buffer the executor found unique
            // (no other value, view or slot shares it, so `x`, `w` and the
            // vectors lie elsewhere), still that buffer and of `y`'s shape.
            if let Some((p, ptr)) = onto.filter(|&(p, ptr)| {
                epi.residual.is_some()
                    && e.and_then(|e| e.residual) == Some(p)
                    && args[p].is_standard_layout()
                    && data_ptr(args[p]) == ptr
                    && same_shape(args[p].shape(), &y_shape)
            }) {
                let epi = conv::Epilogue { residual: None, ..epi };
                // SAFETY: `ptr` addresses the residual's `y_len` f32 values,
                // which nothing else reads or writes during this call (the
                // residual's slice in `s` is not used again).
                let y = unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, y_shape.iter().product()) };
                conv::forward_channels_last_onto(&g, s[0], s[1], filter, epi, y, isa);
                return vec![args[p].clone()];
            }
            let (mut y, ys) = out(&y_shape);
            conv::forward_channels_last_fused(&g, s[0], s[1], filter, epi, slice_mut(&mut y), isa);
            vec![finish(y, &ys)]
        }
        SpatialOp::MaxPool2dNhwc { pool: p } => {
            let x = owned[0].shape();
            let g = pool_geometry(&p, &[x[0], x[3], x[1], x[2]]);
            let (mut y, ys) = out(&[g.batch, g.out_h(), g.out_w(), g.channels]);
            pool2d::max_forward_channels_last(&g, s[0], slice_mut(&mut y));
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
        _ => crate::pool::aligned_f32(shape),
    };
    (a, shape.to_vec())
}

/// A forward pool of `x`, an f32 `[n, c, h, w]` view whose values lie
/// channels last (`[n, h, w, c]` in memory, the transpose the layout pass
/// leaves before an NCHW op), run by the channels-last kernels on that
/// memory: no copy of `x` into NCHW order, which for ResNet-50's global
/// average at batch 8 was most of the step's 1.8 ms. `None` for any
/// other op or layout.
fn pool_channels_last_view(op: &SpatialOp, x: &Storage, isa: Isa, pool: &mut BufPool) -> Option<Storage> {
    let (SpatialOp::MaxPool2d { pool: p } | SpatialOp::AvgPool2d { pool: p }) = *op else { return None };
    let Storage::F32(a) = x else { return None };
    let &[n, c, h, w] = a.shape() else { return None };
    let channels_last = [h * w * c, 1, w * c, c].map(|s| s as isize);
    if a.is_empty() || a.is_standard_layout() || a.strides() != channels_last {
        return None;
    }
    let values = a.as_slice_memory_order()?;
    let g = pool_geometry(&p, &[n, c, h, w]);
    let (oh, ow) = (g.out_h(), g.out_w());
    let run = |y: &mut [f32]| match op {
        SpatialOp::MaxPool2d { .. } => pool2d::max_forward_channels_last(&g, values, y),
        _ => pool2d::avg_forward_channels_last(&g, values, y, isa),
    };
    let (mut y, ys) = output(pool, &[n, c, oh, ow]);
    if oh * ow == 1 {
        // One pixel per image: `[n, 1, 1, c]` is `[n, c, 1, 1]`.
        run(slice_mut(&mut y));
    } else {
        // Pooled channels last, then copied to NCHW (the output is the
        // smaller side) by the tensor crate's tiled transposition.
        let mut last = vec![0.0f32; n * oh * ow * c];
        run(&mut last);
        let view = ndarray::ArrayView4::from_shape((n, oh, ow, c), &last).expect("the pool's output shape");
        kernels::write_row_major(view.permuted_axes([0, 3, 1, 2]).into_dyn(), slice_mut(&mut y));
    }
    Some(finish(y, &ys))
}

fn slice_mut(a: &mut ArcArray<f32, IxDyn>) -> &mut [f32] {
    a.as_slice_mut().expect("a standard-layout buffer of its own")
}

fn finish(a: ArcArray<f32, IxDyn>, shape: &[usize]) -> Storage {
    debug_assert_eq!(a.shape(), shape);
    Storage::F32(a)
}
