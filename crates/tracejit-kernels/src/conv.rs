//! 2-D convolution of f32 NCHW activations with `[out, in / groups, kh, kw]`
//! weights (ONNX `Conv` and PyTorch `conv2d` semantics: explicit padding per
//! side, stride, dilation, groups including depthwise), forward with the
//! bias and relu fused into its output pass, and both gradients.
//!
//! How each pass runs (with AVX-512F at 16 lanes, else AVX2 + FMA at 8):
//! - [`forward`] is a direct convolution (`engine`): for a band of output
//!   rows it copies the input rows the band reads into a panel (padding as
//!   zeros, columns split by stride phase so that a vector of adjacent
//!   output pixels reads adjacent values; at most 128 KiB per thread, or
//!   what one tile's rows need), then accumulates register tiles of 8
//!   output channels × 3 vectors of 16 output pixels (4 × 3 vectors of 8
//!   with AVX2), one FMA per channel and vector per tap, the weights
//!   broadcast from a packed copy. No im2col buffer. Where that leaves
//!   lanes or threads idle (1×1 convolutions, output rows shorter than
//!   1.5 vectors: ResNet's 14×14 and 7×7 stages) with at least 32 output
//!   channels and 64 taps per group, it is a matrix product per image and
//!   group instead (`forward_gemm`: im2col tiles, none for unpadded
//!   stride-1 1×1), through [`crate::gemm`]. Where the channel-lane kernel
//!   measured faster (`cvec`: narrow maps at 16 lanes, every kernel
//!   larger than 1×1 at 8; see [`prefers_packed_filter`]) it runs there:
//!   tiles of 4 vectors of output channels × 6 pixels (2 × 6 with AVX2),
//!   each pixel's input broadcast from the image in place (zero-padded
//!   copy when padded), the weights packed per block of channels — once,
//!   by a caller holding a [`PackedFilter`] ([`forward_with_filter`]: the
//!   JIT keeps one per weight of a compiled model), else in every call
//!   where the map is large enough for that to pay.
//! - [`backward_data`] with stride 1 is the same direct kernel run as the
//!   transposed convolution (kernel flipped, input and output channels
//!   swapped, pads `(k-1)·dilation - pad`), or the channel-lane kernel
//!   where that convolution takes it (one group, pads not negative). With
//!   a larger stride it is a
//!   matrix product per band of output rows (`wᵀ · dy`, through
//!   [`crate::gemm`], the band's tile at most 256 KiB) added back into `dx`
//!   where each tap's pixel came from (col2im).
//! - [`backward_filter`] is a direct kernel too (`filter`): per band, the
//!   panel of `x` and `dy` transposed to `[pixel][channel]`, tiles of taps
//!   × vectors of output channels summed over the band's pixels. Filters of
//!   at most 1024 (channel, tap) pairs per group, such as a first layer's
//!   `16 × 1 × 5 × 5`, take vectors of pixels instead (`filter_px`), with
//!   no transposition.
//!
//! Threads and determinism: the forward and backward-data are cut into
//! tasks fixed by the geometry — (image, group, chunk of bands) for the
//! direct kernel, (image, group, input-channel block) for the strided
//! col2im — each output element written by one task in an order fixed by
//! the geometry. Backward-filter is cut into (group, channel chunk, tap
//! chunk) tasks, one per thread: each `dw` value is the sum over images
//! and bands (fixed by the geometry) in order whichever task computes it.
//! Partial results are never summed across tasks, and the bits do not
//! depend on the thread count (the tests compare 1, 2 and 3 threads).
//!
//! Vector code runs only where the caller's [`Isa`] allows it and the CPU
//! has it. Without AVX2 + FMA, forward and stride-1 backward-data run as
//! plain loops, backward-filter and the strided backward-data as matrix
//! products (im2col and col2im tiles) through the `gemm` crate's own
//! kernels: the same sums with other roundings, within `terms · ε ·
//! Σ|products|` of the vector code.
//!
//! Non-finite values: NaN and infinities in `x` (forward, backward-filter)
//! and in `dy` (backward-data) reach exactly the outputs whose windows hold
//! them, as in the plain loops. Padding is zeros that some steps multiply
//! rather than skip (padding columns in the direct kernels, all padding in
//! backward-filter), as an im2col formulation does, so a non-finite weight
//! (forward, backward-data) or `dy` value (backward-filter) also makes NaN
//! of outputs whose windows meet padding there.

use crate::Isa;

mod channels_last;
mod cvec;
#[cfg(target_arch = "x86_64")]
mod cvec_tiles;
mod engine;
mod filter;
mod filter_px;
#[cfg(target_arch = "x86_64")]
mod filter_px_tiles;
#[cfg(target_arch = "x86_64")]
mod filter_tiles;
mod forward_gemm;
mod lowered;
mod panel;
#[cfg(target_arch = "x86_64")]
mod tiles;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_channels_last;
#[cfg(test)]
mod tests_cvec;
#[cfg(test)]
mod tests_grad;

/// The sizes of a 2-D convolution: `x [batch, in_channels, in_h, in_w]`,
/// `w [out_channels, in_channels / groups, kernel[0], kernel[1]]`,
/// `y [batch, out_channels, out_h, out_w]`. Pairs are (height, width);
/// `pad` is (top, left, bottom, right).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    /// Images.
    pub batch: usize,
    /// Input channels (all groups).
    pub in_channels: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Output channels (all groups).
    pub out_channels: usize,
    /// Kernel (height, width).
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Zero padding: top, left, bottom, right.
    pub pad: [usize; 4],
    /// Groups: input and output channels split into this many independent
    /// convolutions (`in_channels` for depthwise).
    pub groups: usize,
}

/// `(in + pad_begin + pad_end - extent) / stride + 1`, or 0 when the
/// kernel's extent exceeds the padded input (or stride is 0).
fn out_size(n: usize, pad: usize, kernel: usize, stride: usize, dilation: usize) -> usize {
    let extent = kernel.saturating_sub(1).saturating_mul(dilation).saturating_add(1);
    match (n + pad).checked_sub(extent) {
        Some(room) if stride > 0 && kernel > 0 => room / stride + 1,
        _ => 0,
    }
}

impl Conv2dGeometry {
    /// Output height (floor mode).
    pub fn out_h(&self) -> usize {
        out_size(self.in_h, self.pad[0] + self.pad[2], self.kernel[0], self.stride[0], self.dilation[0])
    }

    /// Output width (floor mode).
    pub fn out_w(&self) -> usize {
        out_size(self.in_w, self.pad[1] + self.pad[3], self.kernel[1], self.stride[1], self.dilation[1])
    }

    /// Checks that the geometry describes a convolution; the error names
    /// what is wrong.
    ///
    /// ```
    /// use tracejit_kernels::conv::Conv2dGeometry;
    ///
    /// let mut g = Conv2dGeometry { batch: 1, in_channels: 4, in_h: 5, in_w: 5, out_channels: 6,
    ///     kernel: [3, 3], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 4 };
    /// assert!(g.validate().unwrap_err().contains("out_channels 6"));
    /// g.groups = 2;
    /// assert_eq!(g.validate(), Ok(()));
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        let g = self;
        let pos = [
            ("in_channels", g.in_channels),
            ("out_channels", g.out_channels),
            ("in_h", g.in_h),
            ("in_w", g.in_w),
            ("groups", g.groups),
            ("kernel height", g.kernel[0]),
            ("kernel width", g.kernel[1]),
            ("stride height", g.stride[0]),
            ("stride width", g.stride[1]),
            ("dilation height", g.dilation[0]),
            ("dilation width", g.dilation[1]),
        ];
        if let Some((name, _)) = pos.iter().find(|(_, v)| *v == 0) {
            return Err(format!("conv2d: {name} is 0"));
        }
        if !g.in_channels.is_multiple_of(g.groups) || !g.out_channels.is_multiple_of(g.groups) {
            return Err(format!(
                "conv2d: in_channels {} and out_channels {} must both be multiples of groups {}",
                g.in_channels, g.out_channels, g.groups
            ));
        }
        for (axis, i) in [("height", 0), ("width", 1)] {
            let (n, pad) = ([g.in_h, g.in_w][i], g.pad[i] + g.pad[i + 2]);
            let extent = (g.kernel[i] - 1).saturating_mul(g.dilation[i]).saturating_add(1);
            if n + pad < extent {
                return Err(format!(
                    "conv2d: the kernel's {axis} extent {extent} exceeds the padded input {axis} {}",
                    n + pad
                ));
            }
        }
        let sizes = [g.batch, g.in_channels, g.in_h, g.in_w, g.out_channels, g.out_h(), g.out_w()];
        if sizes.iter().try_fold(1usize, |a, &b| a.checked_mul(b.max(1))).is_none_or(|v| v > isize::MAX as usize / 8) {
            return Err("conv2d: tensor sizes overflow".into());
        }
        Ok(())
    }

    /// Multiply-adds of [`forward`] (each gradient costs as many).
    pub fn macs(&self) -> usize {
        let per_out = (self.in_channels / self.groups.max(1)) * self.kernel[0] * self.kernel[1];
        self.batch * self.out_channels * self.out_h() * self.out_w() * per_out
    }

    /// Values of `x`.
    fn x_len(&self) -> usize {
        self.batch * self.in_channels * self.in_h * self.in_w
    }

    /// Values of `w`.
    fn w_len(&self) -> usize {
        self.out_channels * (self.in_channels / self.groups) * self.kernel[0] * self.kernel[1]
    }

    /// Values of `y` (and `dy`).
    fn y_len(&self) -> usize {
        self.batch * self.out_channels * self.out_h() * self.out_w()
    }

    /// Panics (naming `func`) unless the geometry is valid.
    fn check(&self, func: &str) {
        if let Err(e) = self.validate() {
            panic!("conv::{func}: {e}");
        }
    }
}

/// Panics (naming the function and the slice) when a slice's length is not
/// what the geometry needs.
fn check_len(func: &str, name: &str, len: usize, want: usize) {
    assert!(len == want, "conv::{func}: {name} holds {len} values, the geometry needs {want}");
}

/// "Same" padding (TF `SAME`, ONNX `SAME_UPPER`) of one axis: the
/// (begin, end) pads that make the output `ceil(in / stride)` long, the
/// odd one at the end.
///
/// ```
/// use tracejit_kernels::conv::same_padding;
///
/// assert_eq!(same_padding(32, 3, 1, 1), [1, 1]);
/// assert_eq!(same_padding(32, 4, 1, 1), [1, 2]);
/// assert_eq!(same_padding(7, 3, 2, 1), [1, 1]); // 4 outputs
/// assert_eq!(same_padding(8, 3, 2, 2), [1, 2]);
/// ```
pub fn same_padding(r#in: usize, kernel: usize, stride: usize, dilation: usize) -> [usize; 2] {
    let out = r#in.div_ceil(stride.max(1));
    let extent = kernel.saturating_sub(1) * dilation + 1;
    let total = ((out.max(1) - 1) * stride + extent).saturating_sub(r#in);
    [total / 2, total - total / 2]
}

/// Which code a pass runs: chosen from the caller's [`Isa`], or forced by
/// the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Plain loops (and the `gemm` crate's own kernel choice).
    Portable,
    /// AVX2 + FMA, 8 lanes.
    W8,
    /// AVX-512F, 16 lanes.
    W16,
}

impl Path {
    /// The widest code `isa` allows on this CPU.
    pub(crate) fn of(isa: Isa) -> Path {
        match isa.width() {
            Some(crate::Width::W16) => Path::W16,
            Some(crate::Width::W8) => Path::W8,
            None => Path::Portable,
        }
    }

    /// The [`Isa`] handed to the matrix products of this path.
    fn isa(self) -> Isa {
        Isa::native().with_avx512(self == Path::W16)
    }
}

/// `y = conv(x, w) + bias`, then `max(y, 0)` when `relu`; `y [batch,
/// out_channels, out_h, out_w]` is overwritten. Vector code as `isa`
/// allows (see the module).
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// // One 3x3 image, a 2x2 kernel of ones, padding 1 at the bottom and right.
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 1, in_h: 3, in_w: 3, out_channels: 1,
///     kernel: [2, 2], stride: [1, 1], dilation: [1, 1], pad: [0, 0, 1, 1], groups: 1 };
/// let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
/// let mut y = [0.0; 9];
/// conv::forward(&g, &x, &[1.0; 4], Some(&[-20.0]), true, &mut y, Isa::native());
/// assert_eq!(y, [0.0, 0.0, 0.0, 4.0, 8.0, 0.0, 0.0, 0.0, 0.0]);
/// ```
///
/// # Panics
/// If the geometry is invalid ([`Conv2dGeometry::validate`]) or a slice's
/// length does not match it (`bias`: `out_channels`).
pub fn forward(g: &Conv2dGeometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, relu: bool, y: &mut [f32], isa: Isa) {
    forward_on(Path::of(isa), g, x, w, bias, relu, y)
}

pub use channels_last::{
    forward_channels_last, forward_channels_last_fused, forward_channels_last_onto, forward_channels_last_with_filter,
    Epilogue,
};
pub use cvec::PackedFilter;

impl PackedFilter {
    /// `w` (`[out_channels, in_channels, kh, kw]`) packed for the
    /// channel-lane kernel of [`forward_with_filter`] at the widest vectors
    /// `isa` allows: `None` where it has no vector code, or for grouped
    /// convolutions. A caller that convolves with the same weights again
    /// (a model's layer, call after call) packs them once.
    ///
    /// # Panics
    /// If the geometry is invalid or `w`'s length does not match it.
    pub fn new(g: &Conv2dGeometry, w: &[f32], isa: Isa) -> Option<PackedFilter> {
        g.check("PackedFilter::new");
        check_len("PackedFilter::new", "w", w.len(), g.w_len());
        cvec::pack(Path::of(isa), g, w)
    }
}

/// Whether the channels-last forward runs `g` on the channel-lane kernel
/// (else through NCHW): one group, vector code, and an image whose padded
/// copy the kernel's 32-bit offsets address.
pub fn channels_last_is_native(g: &Conv2dGeometry, isa: Isa) -> bool {
    g.groups == 1 && cvec::lanes_of(Path::of(isa)).is_some() && cvec::offsets_fit(g)
}

/// Whether [`forward_with_filter`] is the faster forward for `g` on
/// `isa` (see the module): where it is, a caller holding the layer's
/// weights across calls packs them once ([`PackedFilter::new`]).
/// [`forward`] takes that kernel too, packing in every call, where each
/// weight meets enough pixels for the packing to pay.
pub fn prefers_packed_filter(g: &Conv2dGeometry, isa: Isa) -> bool {
    cvec::prefers(Path::of(isa), g)
}

/// [`forward`] through the channel-lane kernel from weights packed
/// beforehand ([`PackedFilter::new`] with the same geometry and `isa`).
///
/// # Panics
/// If the geometry is invalid, a slice's length does not match it, or
/// `filter` was packed for another geometry or vector width.
pub fn forward_with_filter(
    g: &Conv2dGeometry,
    x: &[f32],
    filter: &PackedFilter,
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    isa: Isa,
) {
    check_forward(g, x, y, bias);
    cvec::run(Path::of(isa), g, x, filter, Epilogue::bias_relu(bias, relu), y, false);
}

/// The forward's checks of the geometry and of `x`, `y` and `bias`.
fn check_forward(g: &Conv2dGeometry, x: &[f32], y: &[f32], bias: Option<&[f32]>) {
    g.check("forward");
    check_len("forward", "x", x.len(), g.x_len());
    check_len("forward", "y", y.len(), g.y_len());
    if let Some(b) = bias {
        check_len("forward", "bias", b.len(), g.out_channels);
    }
}

/// [`forward`] on a given path.
pub(crate) fn forward_on(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) {
    check_forward(g, x, y, bias);
    check_len("forward", "w", w.len(), g.w_len());
    if cvec::prefers(path, g) && cvec::packing_pays(g) {
        let filter = cvec::pack(path, g, w).expect("cvec::prefers takes packable geometries");
        return cvec::run(path, g, x, &filter, Epilogue::bias_relu(bias, relu), y, false);
    }
    if forward_gemm::prefers(path, g) {
        return forward_gemm::run(path, g, x, w, bias, relu, y);
    }
    engine::run(path, &shape_of(g), x, w, bias, relu, y);
}

/// `dx` (overwritten, `[batch, in_channels, in_h, in_w]`) from `dy`: the
/// transposed convolution of `dy` with `w`. See the module for the paths.
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 1, in_h: 2, in_w: 2, out_channels: 1,
///     kernel: [2, 2], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let mut dx = [0.0; 4];
/// conv::backward_data(&g, &[2.0], &[1.0, 2.0, 3.0, 4.0], &mut dx, Isa::native());
/// assert_eq!(dx, [2.0, 4.0, 6.0, 8.0]);
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn backward_data(g: &Conv2dGeometry, dy: &[f32], w: &[f32], dx: &mut [f32], isa: Isa) {
    backward_data_on(Path::of(isa), g, dy, w, dx)
}

/// [`backward_data`] on a given path.
pub(crate) fn backward_data_on(path: Path, g: &Conv2dGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    g.check("backward_data");
    check_len("backward_data", "dy", dy.len(), g.y_len());
    check_len("backward_data", "w", w.len(), g.w_len());
    check_len("backward_data", "dx", dx.len(), g.x_len());
    if g.stride != [1, 1] {
        return lowered::backward_data(path, g, dy, w, dx);
    }
    // Stride 1: dx[i] = Σ w[o, i, kh, kw] · dy[o, ih + pt - kh·d]: a
    // convolution of dy with the flipped kernel, channels swapped.
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let [kh, kw] = g.kernel;
    let mut flipped = vec![0.0f32; w.len()];
    for grp in 0..g.groups {
        for i in 0..icg {
            for o in 0..ocg {
                for r in 0..kh {
                    for c in 0..kw {
                        let src = (((grp * ocg + o) * icg + i) * kh + r) * kw + c;
                        let dst = (((grp * icg + i) * ocg + o) * kh + (kh - 1 - r)) * kw + (kw - 1 - c);
                        flipped[dst] = w[src];
                    }
                }
            }
        }
    }
    if let Some(t) = transposed(g).filter(|t| cvec::prefers(path, t) && cvec::packing_pays(t)) {
        let filter = cvec::pack(path, &t, &flipped).expect("cvec::prefers takes packable geometries");
        return cvec::run(path, &t, dy, &filter, Epilogue::default(), dx, false);
    }
    let shape = engine::Shape {
        batch: g.batch,
        groups: g.groups,
        in_c: ocg,
        out_c: icg,
        in_hw: [g.out_h(), g.out_w()],
        out_hw: [g.in_h, g.in_w],
        kernel: g.kernel,
        stride: [1, 1],
        dilation: g.dilation,
        pad: [
            ((kh - 1) * g.dilation[0]) as isize - g.pad[0] as isize,
            ((kw - 1) * g.dilation[1]) as isize - g.pad[1] as isize,
        ],
    };
    engine::run(path, &shape, dy, &flipped, None, false, dx);
}

/// The stride-1 convolution whose forward is `g`'s backward-data (of `dy`
/// by the flipped kernel, channels swapped), when its padding is not
/// negative (a forward padded past its kernel's extent) and `g` has one
/// group: the channel-lane kernel's geometries.
fn transposed(g: &Conv2dGeometry) -> Option<Conv2dGeometry> {
    let ext = [(g.kernel[0] - 1) * g.dilation[0], (g.kernel[1] - 1) * g.dilation[1]];
    let pad = [
        ext[0].checked_sub(g.pad[0])?,
        ext[1].checked_sub(g.pad[1])?,
        ext[0].checked_sub(g.pad[2])?,
        ext[1].checked_sub(g.pad[3])?,
    ];
    let t = Conv2dGeometry {
        in_channels: g.out_channels,
        in_h: g.out_h(),
        in_w: g.out_w(),
        out_channels: g.in_channels,
        stride: [1, 1],
        pad,
        ..*g
    };
    (g.groups == 1 && g.stride == [1, 1] && t.out_h() == g.in_h && t.out_w() == g.in_w).then_some(t)
}

/// `dw` (overwritten) from `x` and `dy`, and `db` (overwritten: the sum of
/// `dy` over batch and space per output channel) when given.
///
/// ```
/// use tracejit_kernels::{conv, Isa};
///
/// let g = conv::Conv2dGeometry { batch: 1, in_channels: 1, in_h: 2, in_w: 2, out_channels: 1,
///     kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad: [0; 4], groups: 1 };
/// let (mut dw, mut db) = ([0.0], [0.0]);
/// conv::backward_filter(&g, &[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &mut dw, Some(&mut db), Isa::native());
/// assert_eq!((dw, db), ([10.0], [4.0]));
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it
/// (`db`: `out_channels`).
pub fn backward_filter(g: &Conv2dGeometry, x: &[f32], dy: &[f32], dw: &mut [f32], db: Option<&mut [f32]>, isa: Isa) {
    backward_filter_on(Path::of(isa), g, x, dy, dw, db)
}

/// [`backward_filter`] on a given path.
pub(crate) fn backward_filter_on(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
) {
    g.check("backward_filter");
    check_len("backward_filter", "x", x.len(), g.x_len());
    check_len("backward_filter", "dy", dy.len(), g.y_len());
    check_len("backward_filter", "dw", dw.len(), g.w_len());
    if let Some(b) = db.as_deref() {
        check_len("backward_filter", "db", b.len(), g.out_channels);
    }
    let lanes = match path {
        Path::W16 if cfg!(target_arch = "x86_64") => 16,
        Path::W8 if cfg!(target_arch = "x86_64") => 8,
        _ => return lowered::backward_filter(path, g, x, dy, dw, db),
    };
    let shape = shape_of(g);
    if filter_px::suits(&shape, lanes) {
        filter_px::run(lanes, &shape, x, dy, dw, db)
    } else {
        filter::run(lanes, &shape, x, dy, dw, db)
    }
}

/// The direct kernels' view of a geometry.
fn shape_of(g: &Conv2dGeometry) -> engine::Shape {
    engine::Shape {
        batch: g.batch,
        groups: g.groups,
        in_c: g.in_channels / g.groups,
        out_c: g.out_channels / g.groups,
        in_hw: [g.in_h, g.in_w],
        out_hw: [g.out_h(), g.out_w()],
        kernel: g.kernel,
        stride: g.stride,
        dilation: g.dilation,
        pad: [g.pad[0] as isize, g.pad[1] as isize],
    }
}

/// A pointer shared with the pool's tasks, which write disjoint parts of
/// its buffer while the caller waits.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the buffer outlives the pool run that uses it, and every task
// writes its own elements only (see the callers).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so that closures capture the wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `n` split in `parts` near-equal ranges (the first ones never longer).
fn split(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    (0..parts).map(|i| i * n / parts..(i + 1) * n / parts).collect()
}

/// Runs `task(t)` for `t` in `0..tasks`, on the pool when there is more
/// than one task, the work (multiply-adds) reaches
/// [`crate::threads::gemm_threshold`] and the thread count is above 1; each
/// task inside [`crate::threads::serial`], so its matrix products stay on
/// its thread.
fn run_tasks(tasks: usize, work: usize, task: &(dyn Fn(usize) + Sync)) {
    let each = |t: usize| crate::threads::serial(|| task(t));
    if tasks > 1 && work >= crate::threads::gemm_threshold() {
        if let Some(pool) = crate::threads::pool() {
            pool.run(tasks, &each);
            return;
        }
    }
    (0..tasks).for_each(each);
}
