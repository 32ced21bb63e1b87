//! The direct convolution: [`run`] computes `y = conv(x, w) + bias` (relu
//! optional) for a [`Shape`], cutting the output into bands of rows and
//! register tiles.
//!
//! Per band (image, group, [`Panel::rows`] output rows) the input rows the
//! band reads are copied into a panel ([`Panel`]: padding as zeros,
//! columns split by stride phase, so that the values a vector of adjacent
//! output pixels needs at one tap are adjacent). A tile is a block of up
//! to 8 output channels (4 at 8 lanes; 2 for groups of one or two
//! channels) × up to 3 vectors of output pixels (6 for those small
//! groups), each vector a segment of one output row — the row's last one
//! partial when the width is not a multiple of the lanes, its extra lanes
//! computed and not stored — and a tile's vectors possibly from
//! consecutive rows. Its accumulators stay in registers over its taps, in
//! (kernel row, input channel, kernel column) order, from the first to the
//! last kernel row that reads any of its rows inside the input (the rows
//! of padding are zeros in the panel: the taps skipped add nothing). The
//! output pass adds the bias, applies relu and stores (masked for partial
//! vectors). Bands hold whole tiles and as many rows as fit in
//! [`PANEL_BYTES`].
//!
//! Pads are signed: the transposed convolution of `backward_data` may have
//! negative ones, which skip input rows and columns.
//!
//! Tasks are (image, group, chunk of bands), fixed by the shape; each
//! output element is computed by one tile whose taps are in a fixed order,
//! so the result does not depend on the thread count. Without vector code
//! ([`Path::Portable`]) the same sums run as plain loops.

use super::panel::{with_scratch, Panel};
use super::{run_tasks, Path, SendPtr};

/// A convolution as the direct kernel runs it, per group: `x [batch,
/// groups·in_c, in_hw]`, weights `[groups·out_c, in_c, kernel]`, `y
/// [batch, groups·out_c, out_hw]`; output pixel `(oh, ow)` reads input
/// `(oh·stride - pad + k·dilation)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    /// Images.
    pub batch: usize,
    /// Groups.
    pub groups: usize,
    /// Input channels per group.
    pub in_c: usize,
    /// Output channels per group.
    pub out_c: usize,
    /// Input (height, width).
    pub in_hw: [usize; 2],
    /// Output (height, width).
    pub out_hw: [usize; 2],
    /// Kernel (height, width).
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Top and left padding (negative: input rows or columns skipped).
    pub pad: [isize; 2],
}

impl Shape {
    /// Taps per output value: `kernel height · in_c · kernel width`.
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.in_c * self.kernel[1]
    }

    /// Multiply-adds of the whole convolution.
    pub fn work(&self) -> usize {
        self.batch * self.groups * self.out_c * self.out_hw[0] * self.out_hw[1] * self.taps()
    }

    /// The kernel rows `kh` whose input row `oh·s - pad + kh·d` lies inside
    /// the input, for output row `oh`: `first..end` (empty when the row
    /// reads only padding).
    fn kernel_rows(&self, oh: usize) -> (u32, u32) {
        let (s, d, pad, n, k) = (self.stride[0], self.dilation[0], self.pad[0], self.in_hw[0], self.kernel[0]);
        let base = (oh * s) as isize - pad;
        let first = if base >= 0 { 0 } else { (-base as usize).div_ceil(d) };
        if base > n as isize - 1 || first >= k {
            return (0, 0);
        }
        let end = ((n as isize - 1 - base) as usize / d + 1).min(k);
        if first < end {
            (first as u32, end as u32)
        } else {
            (0, 0)
        }
    }
}

/// A block of output channels with its packed weights.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    /// First output channel of the block, within its group.
    pub oc: usize,
    /// Output channels in the block (at most 8, see [`Plan::new`]).
    pub width: usize,
    /// Where the block's weights start in [`Plan::weights`]: `[tap][width]`.
    pub at: usize,
}

/// The panel's budget: bands take as many rows as fit (at least one tile's
/// worth). A band's panel is read once per block of output channels, so
/// tall bands copy each input row fewer times (`rows_in / rows`); the
/// panel then stays in the level-2 cache, the block's weights in level 1.
/// Measured on W11 (one thread): 24 KiB 12.0 ms, 48 KiB 11.7, 128 KiB 11.4;
/// W12's second layer's backward-data 3.66, 3.42, 3.43 ms.
const PANEL_BYTES: usize = 128 << 10;

/// A convolution cut for the direct kernel at one vector width.
pub(super) struct Plan {
    /// The convolution.
    pub shape: Shape,
    /// f32 lanes per vector.
    pub lanes: usize,
    /// Most pixel vectors per tile.
    pub b_max: usize,
    /// Vectors per output row.
    pub segs: usize,
    /// The bands' panel layout (phase rows long enough for whole vectors).
    pub panel: Panel,
    /// The panel offset of each tap, in (kernel row, input channel,
    /// kernel column) order.
    pub offs: Vec<u32>,
    /// Every group's blocks, `blocks_per_group` each.
    pub blocks: Vec<Block>,
    /// Blocks per group.
    pub blocks_per_group: usize,
    /// The weights of every block, `[tap][width]` each.
    pub weights: Vec<f32>,
    /// Per output row, the kernel rows that read inside the input
    /// (`first..end`, see [`Shape::kernel_rows`]).
    pub kernel_rows: Vec<(u32, u32)>,
}

impl Plan {
    /// The plan of `s` at `lanes` lanes with weights `w` (`[groups·out_c,
    /// in_c, kh, kw]`).
    pub fn new(s: &Shape, lanes: usize, w: &[f32]) -> Plan {
        // 8 channels × 3 vectors fill 24 of AVX-512's 32 registers (4 × 3 of
        // AVX2's 16); a group of one or two channels (depthwise) takes
        // more pixel vectors instead.
        let (a_max, b_max) = match (lanes, s.out_c) {
            (_, 1..=2) => (2, 6),
            (16, _) => (8, 3),
            _ => (4, 3),
        };
        let segs = s.out_hw[1].div_ceil(lanes).max(1);
        // Bands of whole tiles: rows · segs a multiple of b_max.
        let unit = b_max / gcd(b_max, segs);
        let q = Panel::least_q(s, segs * lanes);
        let mut rows = unit;
        while rows + unit <= s.out_hw[0].max(unit) && Panel::bytes(s, rows + unit, q) <= PANEL_BYTES {
            rows += unit;
        }
        let panel = Panel::new(s, rows.min(s.out_hw[0].max(1)), q);
        let mut offs = Vec::with_capacity(s.taps());
        for kh in 0..s.kernel[0] {
            for ic in 0..s.in_c {
                for kw in 0..s.kernel[1] {
                    offs.push(panel.offset(s, kh, ic, kw) as u32);
                }
            }
        }
        let (blocks, weights) = pack_weights(s, a_max, w);
        let blocks_per_group = blocks.len() / s.groups;
        let kernel_rows = (0..s.out_hw[0]).map(|oh| s.kernel_rows(oh)).collect();
        Plan { shape: *s, lanes, b_max, segs, panel, offs, blocks, blocks_per_group, weights, kernel_rows }
    }
}

/// Greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Every group's output channels in near-equal blocks of at most `a_max`,
/// with their weights `[tap][width]` in the taps' order (kernel row, input
/// channel, kernel column).
///
/// Filled one output channel's row of `w` at a time: the reads run along
/// the row and the writes stride by the block's width through the block's
/// `taps · width` values, which stay in the level-1 cache (36 KiB for 8
/// channels of a 3x3 over 128). Gathering each tap's `width` values from
/// `width` rows instead made a 3x3 128 -> 128 layer's forward on a 28x28
/// map at batch 1 10-27 % slower (three alternating runs on one Xeon
/// core), packing being per call.
fn pack_weights(s: &Shape, a_max: usize, w: &[f32]) -> (Vec<Block>, Vec<f32>) {
    let count = s.out_c.div_ceil(a_max);
    let [kh, kw] = s.kernel;
    let row_len = s.in_c * kh * kw;
    let mut blocks = Vec::with_capacity(count * s.groups);
    let mut weights = vec![0.0f32; s.groups * s.out_c * row_len];
    let mut at = 0;
    for g in 0..s.groups {
        for j in 0..count {
            let (oc, end) = (j * s.out_c / count, (j + 1) * s.out_c / count);
            let width = end - oc;
            blocks.push(Block { oc, width, at });
            let block = &mut weights[at..at + width * row_len];
            for (a, o) in (g * s.out_c + oc..g * s.out_c + end).enumerate() {
                let row = &w[o * row_len..][..row_len];
                for i in 0..s.in_c {
                    for r in 0..kh {
                        let src = &row[(i * kh + r) * kw..][..kw];
                        let tap0 = (r * s.in_c + i) * kw;
                        for (c, &v) in src.iter().enumerate() {
                            block[(tap0 + c) * width + a] = v;
                        }
                    }
                }
            }
            at += width * row_len;
        }
    }
    (blocks, weights)
}

/// One band for the vector code: the packed panel, the plan, and where the
/// band's outputs go.
pub(super) struct BandJob<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// The band's input rows (see the module).
    pub panel: &'a [f32],
    /// The group's blocks.
    pub blocks: &'a [Block],
    /// The group's biases (`out_c`), if any.
    pub bias: Option<&'a [f32]>,
    /// Whether relu follows.
    pub relu: bool,
    /// First output row of the band.
    pub oh0: usize,
    /// Output rows of the band (`plan.rows`, or fewer at the bottom).
    pub rows: usize,
    /// The group's output planes of this image (`out_c · oh · ow` values).
    pub out: *mut f32,
}

/// `y = conv(x, w) + bias` (then relu) on `path`; `y` overwritten.
pub(super) fn run(path: Path, s: &Shape, x: &[f32], w: &[f32], bias: Option<&[f32]>, relu: bool, y: &mut [f32]) {
    let [oh_n, ow_n] = s.out_hw;
    if y.is_empty() {
        return;
    }
    let lanes = match path {
        Path::W16 if cfg!(target_arch = "x86_64") => 16,
        Path::W8 if cfg!(target_arch = "x86_64") => 8,
        _ => return portable(s, x, w, bias, relu, y),
    };
    let plan = Plan::new(s, lanes, w);
    let bands = oh_n.div_ceil(plan.panel.rows);
    // Enough tasks for a few threads when the batch is small, each at least
    // 2^19 multiply-adds; a function of the shape alone.
    let images = s.batch * s.groups;
    let per_image = s.work() / images.max(1);
    let chunks = 8usize.div_ceil(images).min(bands).min((per_image >> 19).max(1)).max(1);
    let bands_per_chunk = bands.div_ceil(chunks);
    let chunks = bands.div_ceil(bands_per_chunk);
    let (in_plane, out_plane) = (s.in_hw[0] * s.in_hw[1], oh_n * ow_n);
    let out = SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let (image, chunk) = (t / chunks, t % chunks);
        let (n, g) = (image / s.groups, image % s.groups);
        let x_img = &x[(n * s.groups + g) * s.in_c * in_plane..][..s.in_c * in_plane];
        // SAFETY: the group's output planes of image `n` lie inside `y`.
        let out_img = unsafe { out.get().add((n * s.groups + g) * s.out_c * out_plane) };
        let rows = plan.panel.rows;
        with_scratch(plan.panel.len(s), |panel| {
            for band in chunk * bands_per_chunk..((chunk + 1) * bands_per_chunk).min(bands) {
                let oh0 = band * rows;
                // SAFETY: the plan's width is one this CPU has (see below).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    super::tiles::pack(lanes, &plan.panel, s, x_img, oh0, panel)
                };
                let job = BandJob {
                    plan: &plan,
                    panel,
                    blocks: &plan.blocks[g * plan.blocks_per_group..][..plan.blocks_per_group],
                    bias: bias.map(|b| &b[g * s.out_c..][..s.out_c]),
                    relu,
                    oh0,
                    rows: rows.min(oh_n - oh0),
                    out: out_img,
                };
                // SAFETY: the plan's width is one this CPU has (the path
                // came from `Isa::width` or a test that checked it); the
                // band's outputs are this task's alone.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    super::tiles::band(&job)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let _ = job;
            }
        });
    };
    run_tasks(images * chunks, s.work(), &task);
}

/// [`run`] in plain loops: each output is the sum over its taps inside the
/// input, in (kernel row, input channel, kernel column) order, then the
/// bias and relu.
fn portable(s: &Shape, x: &[f32], w: &[f32], bias: Option<&[f32]>, relu: bool, y: &mut [f32]) {
    let ([ih_n, iw_n], [oh_n, ow_n], [kh_n, kw_n]) = (s.in_hw, s.out_hw, s.kernel);
    let (in_plane, out_plane) = (ih_n * iw_n, oh_n * ow_n);
    let images = s.batch * s.groups;
    let out = SendPtr(y.as_mut_ptr());
    let task = |image: usize| {
        let g = image % s.groups;
        let x_img = &x[image * s.in_c * in_plane..][..s.in_c * in_plane];
        // SAFETY: each task writes its own image and group's planes.
        let y_img =
            unsafe { std::slice::from_raw_parts_mut(out.get().add(image * s.out_c * out_plane), s.out_c * out_plane) };
        for o in 0..s.out_c {
            let go = g * s.out_c + o;
            let b = bias.map_or(0.0, |b| b[go]);
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let mut acc = 0.0f32;
                    for kh in 0..kh_n {
                        let ih = (oh * s.stride[0]) as isize - s.pad[0] + (kh * s.dilation[0]) as isize;
                        if ih < 0 || ih >= ih_n as isize {
                            continue;
                        }
                        for i in 0..s.in_c {
                            for kw in 0..kw_n {
                                let iw = (ow * s.stride[1]) as isize - s.pad[1] + (kw * s.dilation[1]) as isize;
                                if iw >= 0 && iw < iw_n as isize {
                                    let xv = x_img[i * in_plane + ih as usize * iw_n + iw as usize];
                                    acc += w[((go * s.in_c + i) * kh_n + kh) * kw_n + kw] * xv;
                                }
                            }
                        }
                    }
                    let v = acc + b;
                    // `v < 0` is false for NaN: NaN stays.
                    y_img[(o * oh_n + oh) * ow_n + ow] = if relu && v < 0.0 { 0.0 } else { v };
                }
            }
        }
    };
    run_tasks(images, s.work(), &task);
}
