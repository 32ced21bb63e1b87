//! The forward convolution with channels last (`x [batch, in_h, in_w,
//! in_channels]`, `y [batch, out_h, out_w, out_channels]`) and what its
//! tiles apply to each sum before they store it ([`Epilogue`]): a batch
//! norm's scale and shift, a residual connection and relu, so that a
//! ResNet block's convolution writes its activation once instead of
//! writing the sums for a second pass to read, scale, add and store.

use super::{check_forward, check_len, cvec, forward_on, Conv2dGeometry, PackedFilter, Path};
use crate::Isa;

/// What the forward does to output channel `o`'s sum `acc` before it
/// stores it, in this order: `acc · scale[o]`, `+ bias[o]`, `+ r` (the
/// residual's value at the output's own place), then `max(·, 0)`; each
/// step rounded to f32 as the separate elementwise op rounds it (no fused
/// multiply-add), so the stored value is the one the ops would compute
/// one after another. A missing step is skipped. NaN stays NaN through
/// relu (and -0 stays -0, where the `relu` op gives +0).
///
/// ```
/// use tracejit_kernels::conv::Epilogue;
///
/// let (scale, bias, residual) = ([2.0], [1.0], [-10.0]);
/// let e = Epilogue { scale: Some(&scale), bias: Some(&bias), residual: Some(&residual), relu: false };
/// assert_eq!(e.apply(0, 3.0, Some(residual[0])), -3.0);
/// assert_eq!(Epilogue { relu: true, ..e }.apply(0, 3.0, Some(residual[0])), 0.0);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// One factor per output channel (a batch norm's `γ / √(σ² + ε)`).
    pub scale: Option<&'a [f32]>,
    /// One term per output channel, added after the scale.
    pub bias: Option<&'a [f32]>,
    /// A tensor of `y`'s shape and layout, added after the bias (a
    /// residual connection's shortcut).
    pub residual: Option<&'a [f32]>,
    /// Whether `max(v, 0)` ends it.
    pub relu: bool,
}

impl<'a> Epilogue<'a> {
    /// The epilogue of the other forwards: the bias, then relu.
    pub fn bias_relu(bias: Option<&'a [f32]>, relu: bool) -> Epilogue<'a> {
        Epilogue { bias, relu, ..Epilogue::default() }
    }

    /// Output channel `o`'s stored value from its sum `acc` and the
    /// residual's value `r` there (`None` without a residual).
    ///
    /// # Panics
    /// If `o` is past the scale's or the bias's end.
    #[inline(always)]
    pub fn apply(&self, o: usize, acc: f32, r: Option<f32>) -> f32 {
        let mut v = match self.scale {
            Some(s) => acc * s[o],
            None => acc,
        };
        if let Some(b) = self.bias {
            v += b[o];
        }
        if let Some(r) = r {
            v += r;
        }
        if self.relu && v < 0.0 {
            0.0
        } else {
            v
        }
    }

    /// The lengths of the per-channel vectors and of the residual.
    fn check(&self, g: &Conv2dGeometry) {
        for (name, p) in [("scale", self.scale), ("bias", self.bias)] {
            if let Some(p) = p {
                check_len("forward", name, p.len(), g.out_channels);
            }
        }
        if let Some(r) = self.residual {
            check_len("forward", "residual", r.len(), g.y_len());
        }
    }
}

/// [`super::forward`] with channels last: `x [batch, in_h, in_w,
/// in_channels]` and `y [batch, out_h, out_w, out_channels]`
/// (overwritten), the weights and bias as in [`super::forward`]. With
/// vector code and one group it is the channel-lane kernel, whose tiles
/// then store a pixel's channels as whole vectors and read each tap's
/// inputs in place; the weights are packed in this call
/// ([`forward_channels_last_with_filter`] takes them packed once).
/// Otherwise `x` is transposed to NCHW, convolved by [`super::forward`]
/// and the result transposed back. A chain of convolutions kept channels
/// last between them transposes nothing and writes no NCHW plane.
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// // Two channels of one 1x2 image, [h, w, c] order; a 1x1 kernel summing them.
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 2, in_h: 1, in_w: 2, out_channels: 1,
///     kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let mut y = [0.0; 2];
/// conv::forward_channels_last(&g, &[1.0, 10.0, 2.0, 20.0], &[1.0, 1.0], None, false, &mut y, Isa::native());
/// assert_eq!(y, [11.0, 22.0]);
/// ```
///
/// # Panics
/// As [`super::forward`].
pub fn forward_channels_last(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    isa: Isa,
) {
    forward_channels_last_fused(g, x, w, None, Epilogue::bias_relu(bias, relu), y, isa)
}

/// [`forward_channels_last`] from weights packed beforehand
/// ([`PackedFilter::new`] with the same geometry and `isa`): the packing
/// of a layer is shared by both layouts.
///
/// # Panics
/// As [`super::forward_with_filter`], and for an image whose padded copy
/// holds more than `u32::MAX` values ([`forward_channels_last`] goes
/// through NCHW there).
pub fn forward_channels_last_with_filter(
    g: &Conv2dGeometry,
    x: &[f32],
    filter: &PackedFilter,
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    isa: Isa,
) {
    check_forward(g, x, y, bias);
    cvec::run(Path::of(isa), g, x, filter, Epilogue::bias_relu(bias, relu), y, true);
}

/// [`forward_channels_last`] with any [`Epilogue`]: `y = epi(conv(x,
/// w))`, from `filter` when the caller packed `w` beforehand
/// ([`PackedFilter::new`] with the same geometry and `isa`), else packing
/// in this call. The residual may be any slice of `y`'s length (not `y`
/// itself, which Rust's borrows rule out).
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// // A 1x1 convolution of one channel: y = relu(x · 1 · 2 + 1 + r).
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 1, in_h: 1, in_w: 3, out_channels: 1,
///     kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let epi = conv::Epilogue { scale: Some(&[2.0]), bias: Some(&[1.0]), residual: Some(&[0.0, -5.0, 10.0]), relu: true };
/// let mut y = [0.0; 3];
/// conv::forward_channels_last_fused(&g, &[1.0, 1.0, 1.0], &[1.0], None, epi, &mut y, Isa::native());
/// assert_eq!(y, [3.0, 0.0, 13.0]);
/// ```
///
/// # Panics
/// As [`forward_channels_last`], and for a scale of other than
/// `out_channels` values or a residual of other than `y`'s length.
pub fn forward_channels_last_fused(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    filter: Option<&PackedFilter>,
    epi: Epilogue<'_>,
    y: &mut [f32],
    isa: Isa,
) {
    check_forward(g, x, y, epi.bias);
    check_len("forward_channels_last", "w", w.len(), g.w_len());
    epi.check(g);
    let path = Path::of(isa);
    if cvec::offsets_fit(g) {
        if let Some(filter) = filter {
            return cvec::run(path, g, x, filter, epi, y, true);
        }
        if let Some(filter) = cvec::pack(path, g, w) {
            return cvec::run(path, g, x, &filter, epi, y, true);
        }
    }
    through_nchw(path, g, x, w, epi, y)
}

/// [`forward_channels_last_fused`] with the residual in `y` itself: `y`
/// holds the shortcut on entry and `epi(conv(x, w)) + y` replaces it, the
/// residual step taking its place in the epilogue's order (after the
/// bias, before relu). A compiled model writes a block's last convolution
/// over its dying shortcut this way: each output line is read and
/// written once, where a separate residual costs a third stream (the
/// output's lines fetched before they are written).
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 1, in_h: 1, in_w: 3, out_channels: 1,
///     kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let epi = conv::Epilogue { scale: Some(&[2.0]), bias: Some(&[1.0]), residual: None, relu: true };
/// let mut y = [0.0, -5.0, 10.0]; // the shortcut
/// conv::forward_channels_last_onto(&g, &[1.0, 1.0, 1.0], &[1.0], None, epi, &mut y, Isa::native());
/// assert_eq!(y, [3.0, 0.0, 13.0]);
/// ```
///
/// # Panics
/// As [`forward_channels_last_fused`], and when `epi` has a residual of
/// its own.
pub fn forward_channels_last_onto(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    filter: Option<&PackedFilter>,
    epi: Epilogue<'_>,
    y: &mut [f32],
    isa: Isa,
) {
    assert!(epi.residual.is_none(), "conv2d: forward_channels_last_onto takes its residual from y, not the epilogue");
    check_forward(g, x, y, epi.bias);
    check_len("forward_channels_last_onto", "w", w.len(), g.w_len());
    epi.check(g);
    onto_on(Path::of(isa), g, x, w, filter, epi, y)
}

/// [`forward_channels_last_onto`] on `path`, its operands checked.
pub(super) fn onto_on(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    filter: Option<&PackedFilter>,
    epi: Epilogue<'_>,
    y: &mut [f32],
) {
    if cvec::offsets_fit(g) {
        if let Some(filter) = filter {
            return cvec::run_onto(path, g, x, filter, epi, y);
        }
        if let Some(filter) = cvec::pack(path, g, w) {
            return cvec::run_onto(path, g, x, &filter, epi, y);
        }
    }
    let shortcut = y.to_vec();
    through_nchw(path, g, x, w, Epilogue { residual: Some(&shortcut), ..epi }, y)
}

/// The channels-last forward where the channel-lane kernel does not run
/// (no vector code, several groups): `x` to NCHW, [`forward_on`] (with
/// the bias and relu when that is the whole epilogue), `y` back, and the
/// rest of the epilogue in place.
pub(super) fn through_nchw(path: Path, g: &Conv2dGeometry, x: &[f32], w: &[f32], epi: Epilogue<'_>, y: &mut [f32]) {
    let x_nchw = swap_inner(x, g.batch, g.in_h * g.in_w, g.in_channels);
    let mut y_nchw = vec![0.0; y.len()];
    let plain = epi.scale.is_none() && epi.residual.is_none();
    let (bias, relu) = if plain { (epi.bias, epi.relu) } else { (None, false) };
    forward_on(path, g, &x_nchw, w, bias, relu, &mut y_nchw);
    y.copy_from_slice(&swap_inner(&y_nchw, g.batch, g.out_channels, g.out_h() * g.out_w()));
    if !plain {
        for (i, v) in y.iter_mut().enumerate() {
            *v = epi.apply(i % g.out_channels, *v, epi.residual.map(|r| r[i]));
        }
    }
}

/// `[batch, a, b]` values as `[batch, b, a]`: channels last to first
/// (`a` pixels, `b` channels) or back.
pub(super) fn swap_inner(x: &[f32], batch: usize, a: usize, b: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for n in 0..batch {
        for i in 0..a {
            for j in 0..b {
                out[(n * b + j) * a + i] = x[(n * a + i) * b + j];
            }
        }
    }
    out
}
