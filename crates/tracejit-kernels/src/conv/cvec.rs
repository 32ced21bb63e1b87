//! The forward convolution with output channels in the vector lanes, for
//! the geometries where the pixel-lane kernel (`engine`) leaves lanes idle
//! and a matrix product (`forward_gemm`) pays an im2col copy and a packing
//! of the weights in every call: ResNet's 14×14 and 7×7 stages, whose maps
//! are narrower than two vectors and whose weights are most of the model.
//!
//! The filter is packed once ([`PackedFilter`]: blocks of `A` vectors of
//! output channels, `[tap][A·lanes]` each, taps in `w`'s own (input
//! channel, kernel row, kernel column) order). A register tile holds `A`
//! channel vectors × `B` output pixels; per tap it loads the `A` weight
//! vectors and broadcasts each pixel's input value, `A·B` FMAs (24 of
//! AVX-512's 32 registers at 4 × 6, 12 of AVX2's 16 at 2 × 6). A pixel's
//! input at a tap lies at the pixel's base in the image's zero-padded
//! copy (the panel; `x` itself when there is no padding) plus an offset
//! that is the tap's alone, so tiles read the activations in place: no
//! im2col. The taps run in chunks whose weights stay in the level-1 cache
//! while every tile of the map passes over them, the partial sums of a
//! chunk kept in a scratch `[pixel][channel]` between chunks (the first
//! tile of a chunk prefetches the next chunk's weights: a model's weights
//! come from memory); after the last chunk the tile applies its epilogue
//! (the bias and relu; channels last also a per-channel scale and a
//! residual, see [`super::Epilogue`]) and stores its pixels of each
//! channel into `y`'s NCHW planes, or,
//! channels last (`x [n, h, w, c]`, `y [n, oh, ow, o]`: the same tiles with
//! the taps' offsets of that layout), each pixel's channels as whole
//! vectors. A map is cut into near-equal tiles of at most 6 pixels (a 7×7
//! map into tiles of 6 and 5, not eight of 6 and one of 1).
//!
//! Tasks are (block of channels, range of pixels) per group of images,
//! fixed by the geometry (NCHW: one range); each output value is one
//! tile's sum over the taps in their order, so the bits do not depend on
//! the thread count. Padding is multiplied as zeros,
//! and NaN and infinities in `x` reach exactly the outputs whose windows
//! hold them, as on the module's other paths.

use super::{run_tasks, Conv2dGeometry, Epilogue, Path, SendPtr};

/// Bytes of one chunk of a block's weights: they stay in the level-1 cache
/// (48 KiB on the Xeon, 32 on Zen 3 and 4) beside a few lines of the panel.
const CHUNK_BYTES: usize = 24 << 10;

/// A convolution's weights packed for [`run`]: per block of output
/// channels (the last one zero-padded), `[tap][width]`.
#[derive(Clone, Debug)]
pub struct PackedFilter {
    /// Vector lanes the packing is for (16 or 8).
    lanes: usize,
    /// Output channels per block: `A · lanes`.
    width: usize,
    /// Output channels.
    out_c: usize,
    /// Taps per output value: `in_channels · kh · kw`.
    taps: usize,
    /// The blocks' weights.
    weights: Vec<f32>,
}

impl PackedFilter {
    /// `w` (`[out_c, taps]`, a group's filter) packed for `lanes` lanes.
    fn packed(lanes: usize, out_c: usize, taps: usize, w: &[f32]) -> PackedFilter {
        let width = vecs_for(lanes) * lanes;
        let blocks = out_c.div_ceil(width);
        let mut weights = vec![0.0f32; blocks * taps * width];
        // Taps in runs of 16 (a cache line of each of the block's rows of
        // `w`), each row's run written to its column of the run's taps: a
        // scatter through the whole block one row of `w` at a time took 4x
        // the time of a 3x3 512 -> 512 layer's convolution on a 7x7 map.
        for (block, dst) in weights.chunks_exact_mut(taps * width).enumerate() {
            let oc0 = block * width;
            let rows = &w[oc0 * taps..(oc0 + width).min(out_c) * taps];
            for t0 in (0..taps).step_by(16) {
                let run = 16.min(taps - t0);
                for (j, row) in rows.chunks_exact(taps).enumerate() {
                    for (dt, &v) in row[t0..t0 + run].iter().enumerate() {
                        dst[(t0 + dt) * width + j] = v;
                    }
                }
            }
        }
        PackedFilter { lanes, width, out_c, taps, weights }
    }

    /// Blocks of output channels.
    fn blocks(&self) -> usize {
        self.out_c.div_ceil(self.width)
    }
}

/// Channel vectors per tile at `lanes` lanes.
fn vecs_for(lanes: usize) -> usize {
    if lanes == 16 {
        4
    } else {
        2
    }
}

/// The vector lanes of `path` when this kernel can run there.
pub(super) fn lanes_of(path: Path) -> Option<usize> {
    match path {
        Path::W16 if cfg!(target_arch = "x86_64") => Some(16),
        Path::W8 if cfg!(target_arch = "x86_64") => Some(8),
        _ => None,
    }
}

/// Most bytes of an image's panel (its padded copy, or `x`'s image when
/// there is no padding) for this kernel: every block of channels reads the
/// whole panel again, which must stay in the level-2 cache. ResNet's 1×1
/// stride-2 projection of a 56×56 map (3.2 MB) ran at 44 G multiply-adds/s
/// here against 67 as a product (one Xeon core).
const PANEL_MAX_BYTES: usize = 2 << 20;

/// Most bytes of the panels of the images one pass over the weights
/// serves: images are taken together up to this, so that a batch streams
/// each chunk of weights from memory once per group, not once per image
/// (ResNet-50's 7×7 stage at batch 8: groups of 3 images). Half a Zen 5
/// core's level-2 cache: groups of up to 1 MiB left no room there for the
/// outputs and the weights, and at two threads W14b took 188 ms against
/// 175 (medians of eight runs, alternating) and W11 4.36 against 3.88 ms;
/// at one thread the two tie.
const GROUP_BYTES: usize = 512 << 10;

/// Whether [`run`] is the faster forward for `g` on `path`, filter packed
/// beforehand. Measured on a Xeon core (`examples/conv`, ResNet-50's
/// layers at batch 1, W11 and W12), against the pixel-lane kernel and the
/// product route: one group, taps enough that a tile's store through the
/// NCHW planes is small beside its FMAs, at least half a block of output
/// channels, a panel that stays in cache, and
/// - at 16 lanes, output rows narrower than two vectors (ResNet's 28×28,
///   14×14 and 7×7 stages: 3×3 layers 52-63 -> 65-78 G/s); on wider maps
///   the pixel-lane kernel is as fast or faster (W11: 75 against 66);
/// - at 8 lanes, any kernel larger than 1×1 (the pixel-lane kernel's 4 × 3
///   tiles ran ResNet's 3×3 layers at 19-30 G/s, this one at 36-42; W11
///   27 -> 38, W12's second layer 25 -> 39), and 1×1 ones on narrow maps.
///
/// At 16 lanes a whole block of 64 output channels, at 8 half of one (16):
/// on an AMD Zen 5 core a layer of 32 to 63 channels half-filled the
/// 16-lane tiles, and in NCHW a block is one task per group of images, so
/// it also ran on one thread: W12's second layer (5×5, 16 -> 32 on 14×14,
/// batch 64) took 3.5 ms at one and at two threads (46 G/s), the direct
/// kernel 1.6 and 0.85 ms; 3×3 layers of 32 channels likewise (2.2-2.5x
/// at one thread, 4-7x at two).
pub(super) fn prefers(path: Path, g: &Conv2dGeometry) -> bool {
    let Some(lanes) = lanes_of(path) else { return false };
    let taps = g.in_channels * g.kernel[0] * g.kernel[1];
    let [ph, pw] = panel_hw(g).unwrap_or([g.in_h, g.in_w]);
    let narrow = g.out_w() < 2 * lanes;
    let shape_suits = if lanes == 16 { narrow } else { narrow || g.kernel[0] * g.kernel[1] > 1 };
    let block = vecs_for(lanes) * lanes;
    let min_out = if lanes == 16 { block } else { block / 2 };
    g.groups == 1
        && taps >= 256
        && g.out_channels >= min_out
        && g.in_channels * ph * pw * 4 <= PANEL_MAX_BYTES
        && shape_suits
}

/// Whether an image's padded copy is addressed by the kernel's 32-bit
/// offsets.
pub(super) fn offsets_fit(g: &Conv2dGeometry) -> bool {
    let [ph, pw] = panel_hw(g).unwrap_or([g.in_h, g.in_w]);
    // Channels last's pitch, the larger of the two layouts'.
    pixel_pitch(g, true).checked_mul(ph).and_then(|v| v.checked_mul(pw)).is_some_and(|v| v <= u32::MAX as usize)
}

/// Whether packing the filter in every call still pays (each weight is
/// used at enough pixels): at 49 pixels (a 7×7 map at batch 1) the packing
/// of a 3×3 512 -> 512 filter took longer than the convolution.
pub(super) fn packing_pays(g: &Conv2dGeometry) -> bool {
    g.batch * g.out_h() * g.out_w() >= 256
}

/// Packs `w` (`[out_channels, in_channels, kh, kw]`, one group) for `path`.
pub(super) fn pack(path: Path, g: &Conv2dGeometry, w: &[f32]) -> Option<PackedFilter> {
    let lanes = lanes_of(path)?;
    (g.groups == 1).then(|| PackedFilter::packed(lanes, g.out_channels, g.in_channels * g.kernel[0] * g.kernel[1], w))
}

/// What a task needs: the geometry's walk of the images of a group, their
/// panels one after another.
pub(super) struct Walk<'a> {
    /// The packed filter.
    pub filter: &'a PackedFilter,
    /// Panel offset of each tap, in the filter's tap order.
    pub offs: Vec<u32>,
    /// Panel offset of each output pixel's window (its first tap).
    pub bases: Vec<u32>,
    /// Taps per chunk.
    pub chunk: usize,
    /// Output pixels per image.
    pub plane: usize,
    /// Values per image's panel.
    pub panel_len: usize,
    /// Values per image's output (`out_c · plane`).
    pub out_len: usize,
    /// What each sum takes before it is stored: scale, bias, residual,
    /// relu.
    pub epi: Epilogue<'a>,
    /// Channels last: `x` and `y` are `[batch, h, w, channels]` (else NCHW).
    pub channels_last: bool,
    /// The residual is `y`'s own values on entry (`epi` has none).
    pub onto: bool,
    /// Pixel ranges each block is cut into, one task each.
    pub parts: usize,
}

/// Pixels (images · output pixels) per task at the least when a block's
/// map is cut into ranges for the pool: a range's tiles then still reuse
/// each chunk of weights from the level-1 cache many times over.
const PART_PIXELS: usize = 384;

/// Values from one pixel of an image's panel to the next, channels last:
/// the input channels, and one cache line more when a pixel would be an
/// even number of lines. A 512-channel pixel is 2 KiB, so a 3×3 window's
/// nine pixels (and the rows of a 7×7 or 14×14 map) fell into two of the
/// level-1 cache's 64 sets, where the chunk's weights leave six of each
/// set's twelve lines: tiles re-read their inputs from the level-2 cache
/// (ResNet-50's 3×3 512 -> 512 layers at 94 and 69 G multiply-adds/s on a
/// Zen 5 core, stride 1 and 2, against 115 at 256 channels). The zeros
/// between pixels are never read: the taps address channels below
/// `in_channels` only.
fn pixel_pitch(g: &Conv2dGeometry, channels_last: bool) -> usize {
    let c = g.in_channels;
    if channels_last && panel_hw(g).is_some() && c.is_multiple_of(32) {
        c + 16
    } else {
        c
    }
}

/// The zero-padded copy's (height, width) when `g` has padding.
fn panel_hw(g: &Conv2dGeometry) -> Option<[usize; 2]> {
    (g.pad != [0; 4]).then(|| [g.in_h + g.pad[0] + g.pad[2], g.in_w + g.pad[1] + g.pad[3]])
}

/// `y = epi(conv(x, w))` (see [`Epilogue`]: `conv + bias`, then relu, in
/// the NCHW uses) from `filter` (packed for `g` on `path`); `y`
/// overwritten. With `channels_last`, `x` is `[batch, in_h,
/// in_w, in_channels]` and `y` `[batch, out_h, out_w, out_channels]`: the
/// same tiles and sums, the taps' offsets and the stores changed (a tile's
/// channels of a pixel are adjacent, stored as vectors).
pub(super) fn run(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    filter: &PackedFilter,
    epi: Epilogue<'_>,
    y: &mut [f32],
    channels_last: bool,
) {
    run_on(path, g, x, filter, epi, y, channels_last, false)
}

/// [`run`] channels last with the residual in `y` on entry (`epi` has
/// none of its own): each tile reads a vector of the shortcut and writes
/// its output over it, the same values in the same order, so no value is
/// read after it was overwritten.
pub(super) fn run_onto(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    filter: &PackedFilter,
    epi: Epilogue<'_>,
    y: &mut [f32],
) {
    debug_assert!(epi.residual.is_none());
    run_on(path, g, x, filter, epi, y, true, true)
}

/// [`run`], the residual in `y` when `onto`.
#[allow(clippy::too_many_arguments)]
fn run_on(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    filter: &PackedFilter,
    epi: Epilogue<'_>,
    y: &mut [f32],
    channels_last: bool,
    onto: bool,
) {
    let lanes =
        lanes_of(path).unwrap_or_else(|| panic!("conv2d: a packed filter runs on vector code, which {path:?} is not"));
    assert_eq!(filter.lanes, lanes, "conv2d: a filter packed for {} lanes run at {lanes}", filter.lanes);
    let taps = g.in_channels * g.kernel[0] * g.kernel[1];
    assert!(
        g.groups == 1 && filter.out_c == g.out_channels && filter.taps == taps,
        "conv2d: a filter packed for {} output channels of {} taps run with {} of {taps} in {} groups",
        filter.out_c,
        filter.taps,
        g.out_channels,
        g.groups
    );
    let [oh_n, ow_n] = [g.out_h(), g.out_w()];
    let plane = oh_n * ow_n;
    if plane == 0 || g.batch == 0 {
        return;
    }
    let [ph, pw] = panel_hw(g).unwrap_or([g.in_h, g.in_w]);
    let pitch = pixel_pitch(g, channels_last);
    // Offsets within an image's panel are kept as u32.
    assert!(
        pitch * ph * pw <= u32::MAX as usize,
        "conv2d: an image of {} x {ph} x {pw} values is too large for the channel-lane kernel",
        g.in_channels
    );
    let (offs, bases) = offsets(g, [ph, pw], channels_last, pitch);
    let chunk = (CHUNK_BYTES / 4 / filter.width).max(1);
    let panel_len = pitch * ph * pw;
    let out_len = g.out_channels * plane;
    let mut walk = Walk { filter, offs, bases, chunk, plane, panel_len, out_len, epi, channels_last, onto, parts: 1 };
    let group = (GROUP_BYTES / (4 * panel_len).max(1)).clamp(1, g.batch);
    // Channels last, a block's map is cut into ranges of pixels when there
    // are fewer blocks than threads could take (a 64-channel layer is one
    // block); the NCHW layout keeps one task per block.
    if channels_last {
        walk.parts = (group * plane / PART_PIXELS).clamp(1, 8);
    }
    PANELS.with(|cell| run_groups(g, x, &walk, group, lanes, &mut cell.borrow_mut(), y));
}

/// The panel offset of each tap (in the filter's order: input channel,
/// kernel row, kernel column) and of each output pixel's window, for
/// panels of `[ph, pw]` pixels in either layout, channels last `pitch`
/// values a pixel ([`pixel_pitch`]).
fn offsets(g: &Conv2dGeometry, [ph, pw]: [usize; 2], channels_last: bool, pitch: usize) -> (Vec<u32>, Vec<u32>) {
    let c = g.in_channels;
    // The distance between adjacent pixels of a row, between rows, and
    // between channels.
    let (px, row, ch) = if channels_last { (pitch, pw * pitch, 1) } else { (1, pw, ph * pw) };
    let mut offs = Vec::with_capacity(c * g.kernel[0] * g.kernel[1]);
    for ic in 0..c {
        for kh in 0..g.kernel[0] {
            for kw in 0..g.kernel[1] {
                offs.push((ic * ch + kh * g.dilation[0] * row + kw * g.dilation[1] * px) as u32);
            }
        }
    }
    let ow_n = g.out_w();
    let bases =
        (0..g.out_h() * ow_n).map(|p| ((p / ow_n * g.stride[0]) * row + p % ow_n * g.stride[1] * px) as u32).collect();
    (offs, bases)
}

thread_local! {
    /// The zero-padded copies of a group's images, kept between calls on
    /// this thread (not `panel`'s scratch: the tasks borrow that one, on
    /// this thread too).
    static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`run`]'s groups of images, each over the blocks of channels on the
/// pool, padded copies in `padded`.
fn run_groups(
    g: &Conv2dGeometry,
    x: &[f32],
    walk: &Walk,
    group: usize,
    lanes: usize,
    padded: &mut Vec<f32>,
    y: &mut [f32],
) {
    let (filter, [ph, pw]) = (walk.filter, panel_hw(g).unwrap_or([g.in_h, g.in_w]));
    let (plane, out_len) = (walk.plane, walk.out_len);
    let out = SendPtr(y.as_mut_ptr());
    for n0 in (0..g.batch).step_by(group) {
        let images = group.min(g.batch - n0);
        let image_len = g.in_channels * g.in_h * g.in_w;
        let x_group = &x[n0 * image_len..][..images * image_len];
        // The group's multiply-adds: whether its tasks (and its panel
        // copy) go to the pool.
        let (blocks, parts) = (filter.blocks(), walk.parts);
        let work = filter.taps * plane * images * filter.width * blocks;
        // Without padding the images are their own panels.
        let panels: &[f32] = if panel_hw(g).is_some() {
            let pitch = walk.channels_last.then(|| pixel_pitch(g, true));
            fill_panels(g, x_group, images, [ph, pw], pitch, padded, work);
            &padded[..images * walk.panel_len]
        } else {
            x_group
        };
        let y_group = SendPtr(out.get().wrapping_add(n0 * out_len));
        // The residual's values sit where the outputs they join do.
        // Onto `y`: the residual is the output's own buffer, read through
        // the same pointer the tiles write through.
        let r_group = match walk.epi.residual {
            _ if walk.onto => y_group.get(),
            Some(r) => r[n0 * out_len..].as_ptr().cast_mut(),
            None => std::ptr::null_mut(),
        };
        let r_group = SendPtr(r_group);
        run_tasks(blocks * parts, work, &|t| {
            // Part-major: a part's inputs stay in the level-2 cache while
            // every block passes over them, and its outputs are written
            // one contiguous range (block-major, ResNet's 1×1 64 -> 256
            // layer on a 56×56 map wrote 256 of every 1024 bytes per pass:
            // 0.85 against 0.76 ms).
            let (block, part) = (t % blocks, t / blocks);
            // SAFETY: the group's outputs are `images · out_len` values of
            // `y` from `y_group`; task `t` writes the channels of `block`
            // at `part` of the pixels only; `lanes` is the path's, which
            // the CPU has.
            unsafe { super::cvec_tiles::task(lanes, walk, panels, images, (block, part), y_group.get(), r_group.get()) }
        });
    }
}

/// Values of panel rows per task when the copy is shared among threads:
/// large enough that a task is many cache lines of copying.
const FILL_TASK_VALUES: usize = 64 << 10;

/// Writes `images` images from `x` into `panels`, each zero-padded to
/// `hw`, one after another, in `x`'s layout (channels last when `pitch`
/// is given: each pixel's channels then `pitch` values apart, the gap
/// zero). Every value of the images'
/// panels is written once, as padding or as an input: the buffer (kept
/// between calls) is not cleared first, which wrote a large layer's
/// panels twice. The rows are shared among the pool's threads when the
/// convolution's `work` (multiply-adds) would be: on one thread the copy
/// was a serial part of a two-thread layer (ResNet-50's 3×3 128 -> 128
/// layer over a 56×56 map, 1.7 MB of panel at batch 1).
fn fill_panels(
    g: &Conv2dGeometry,
    x: &[f32],
    images: usize,
    [ph, pw]: [usize; 2],
    pitch: Option<usize>,
    panels: &mut Vec<f32>,
    work: usize,
) {
    let len = images * pitch.unwrap_or(g.in_channels) * ph * pw;
    if panels.len() < len {
        panels.resize(len, 0.0);
    }
    // Channels last a panel row is `pw` pixels of `c` values a `pitch`
    // apart; NCHW it is `pw` values of one channel's plane.
    let (c, pitch, planes) = match pitch {
        Some(pitch) => (g.in_channels, pitch, images),
        None => (1, 1, images * g.in_channels),
    };
    let (row, left, width) = (g.in_w * c, g.pad[1] * pitch, pw * pitch);
    let rows = planes * ph;
    let tasks = (rows * width / FILL_TASK_VALUES).clamp(1, rows);
    let out = SendPtr(panels.as_mut_ptr());
    run_tasks(tasks, work, &|t| {
        for i in t * rows / tasks..(t + 1) * rows / tasks {
            let (p, h) = (i / ph, i % ph);
            // SAFETY: row `i` of the `planes · ph` rows of `width` values
            // in `panels[..len]`; each task writes its own rows only.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(i * width), width) };
            match h.checked_sub(g.pad[0]).filter(|&r| r < g.in_h) {
                Some(r) => {
                    let src = &x[(p * g.in_h + r) * row..][..row];
                    dst[..left].fill(0.0);
                    if pitch == c {
                        dst[left..left + row].copy_from_slice(src);
                    } else {
                        let pixels = dst[left..left + g.in_w * pitch].chunks_exact_mut(pitch);
                        for (d, s) in pixels.zip(src.chunks_exact(c)) {
                            d[..c].copy_from_slice(s);
                            d[c..].fill(0.0);
                        }
                    }
                    dst[left + g.in_w * pitch..].fill(0.0);
                }
                None => dst.fill(0.0),
            }
        }
    });
}

impl Walk<'_> {
    /// The stored value of output channel `o` from its sum `acc`, the
    /// residual's value there at `r` (null: none).
    ///
    /// # Safety
    /// A non-null `r` is readable.
    #[inline(always)]
    pub unsafe fn finish(&self, o: usize, acc: f32, r: *const f32) -> f32 {
        // SAFETY: forwarded from the caller.
        let r = (!r.is_null()).then(|| unsafe { *r });
        self.epi.apply(o, acc, r)
    }

    /// The packed filter's (width, out_c, taps).
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.filter.width, self.filter.out_c, self.filter.taps)
    }

    /// Block `b`'s weights.
    pub fn weights(&self, b: usize) -> &[f32] {
        let (w, _, t) = self.sizes();
        &self.filter.weights[b * t * w..][..t * w]
    }
}
