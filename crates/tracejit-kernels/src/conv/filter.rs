//! The direct backward-filter kernel: `dw[o, (ic, kh, kw)] = Σ_n Σ_(oh, ow)
//! dy[n, o, oh, ow] · x[n, ic, oh·s - pad + kh·d, ow·s - pad + kw·d]`,
//! with vectors along output channels (the small filters take
//! [`super::filter_px`] instead).
//!
//! Per band of output rows of one image: the input rows go into a panel
//! ([`Panel`], as the forward kernel's), and the band's `dy` is transposed
//! into `dyᵀ [pixel][channel]` (16×16 or 8×8 register transposes), padded
//! with zero lanes to whole vectors. A tile is `T` taps × `C` vectors of
//! output channels: per pixel it loads `C` vectors of `dyᵀ`, broadcasts
//! the `T` taps' input values and runs `T·C` FMAs, the accumulators in
//! registers over the band's pixels; then adds them into the task's `dwᵀ
//! [tap][channel]`, transposed into `dw` at the end. The tile sizes fill
//! 24 of AVX-512's 32 registers (6 × 4, 8 × 3, 12 × 2; 12 × 1 for 16
//! channels), 12 of AVX2's 16. `db` comes from the same `dyᵀ`.
//!
//! Bands are fixed by the shape; each `dw` value is the sum over images
//! and bands, in order, of its band sums, whichever task computes it. So
//! the tasks — (group, chunk of output channels, chunk of tap blocks), one
//! per thread — follow the thread count without changing the bits.

use std::ops::Range;

use super::engine::Shape;
use super::panel::{with_scratch, Panel};
use super::{run_tasks, split, SendPtr};

/// Bytes of a band's panel and transposed `dy` together (level-2 cache):
/// taller bands read `dy` in longer runs. W11 (one thread): 40 KiB 13.6
/// ms, 160 KiB 13.1; W12's second layer 3.15 and 3.04 ms.
const BAND_BYTES: usize = 160 << 10;

/// Most taps per tile for `c` vectors of channels at `lanes` lanes.
fn taps_per_tile(lanes: usize, c: usize) -> usize {
    match (lanes, c) {
        (_, 1) => 12,
        (16, 2) => 12,
        (16, 3) => 8,
        (16, _) => 6,
        (_, 2) => 6,
        (_, 3) => 4,
        _ => 3,
    }
}

/// One tile's work for the vector code: a block of taps over one band.
pub(super) struct FilterBlock<'a> {
    /// The band's panel.
    pub panel: &'a [f32],
    /// The block's taps' panel offsets (`T` of them).
    pub offs: &'a [u32],
    /// Panel values between output rows.
    pub row_step: usize,
    /// Output rows of the band.
    pub rows: usize,
    /// Output width.
    pub ow_n: usize,
    /// The band's `dyᵀ`, `rows · ow_n` pixels of `cv` values.
    pub dyt: &'a [f32],
    /// Channel values per pixel in `dyt` and per tap in `dwt` (`C` vectors).
    pub cv: usize,
    /// The block's rows of the task's `dwᵀ` (`T · cv` values), added to.
    pub dwt: &'a mut [f32],
}

/// How [`run`] cuts a shape at one width.
struct Plan {
    /// f32 lanes per vector.
    lanes: usize,
    /// Output-channel chunks of a group (each a task's).
    oc_chunks: Vec<Range<usize>>,
    /// Channel values per pixel of `dyᵀ` (whole vectors, for the widest
    /// chunk).
    cv: usize,
    /// Tap blocks (one tile each).
    tap_blocks: Vec<Range<usize>>,
    /// Chunks of tap blocks (each a task's).
    tap_chunks: Vec<Range<usize>>,
    /// The bands' panel.
    panel: Panel,
    /// The panel offset of each tap, in `dw`'s order (ic, kh, kw).
    offs: Vec<u32>,
}

impl Plan {
    /// The plan of `s` at `lanes` lanes for `threads` threads.
    fn new(s: &Shape, lanes: usize, threads: usize) -> Plan {
        // At most a task per thread: by channel chunks first, down to one
        // vector each (each task then transposes only its channels of dy;
        // W12's second layer as two tasks on one thread: 3.19 ms by
        // channels, 3.41 by taps), then by tap chunks.
        // Chunks of at most 4 vectors at 16 lanes, 2 at 8: AVX2's 16
        // registers hold a tile of 6 taps × 2 vectors, while 3 × 4 spilled
        // (W12's second layer on one thread under `TRACEJIT_ISA=avx2`, AMD
        // Zen 5: 5.2 ms in one chunk of 4 vectors, 1.6 in two of 2).
        let most = s.out_c.div_ceil(lanes).max(1);
        let per_task = if lanes >= 16 { 4 } else { 2 };
        let chunks = s.out_c.div_ceil(per_task * lanes).max(threads.div_ceil(s.groups).min(most));
        let oc_chunks = split(s.out_c, chunks);
        let c = oc_chunks.iter().map(|r| r.len()).max().unwrap_or(1).div_ceil(lanes);
        let taps = s.taps();
        let tap_blocks = split(taps, taps.div_ceil(taps_per_tile(lanes, c)));
        let tap_chunks = split(tap_blocks.len(), threads.div_ceil(s.groups * chunks).min(tap_blocks.len()));
        // Bands, whose sums are added into dwᵀ one after another, are fixed
        // by the shape: sized for the widest chunk, whatever the split.
        let ([oh_n, ow_n], q) = (s.out_hw, Panel::least_q(s, s.out_hw[1]));
        let widest = s.out_c.min(4 * lanes).next_multiple_of(lanes);
        let mut rows = 1;
        while rows < oh_n && Panel::bytes(s, rows + 1, q) + (rows + 1) * ow_n * widest * 4 <= BAND_BYTES {
            rows += 1;
        }
        let panel = Panel::new(s, rows, q);
        let [kh_n, kw_n] = s.kernel;
        let offs = (0..taps).map(|t| panel.offset(s, t / kw_n % kh_n, t / (kh_n * kw_n), t % kw_n) as u32).collect();
        Plan { lanes, oc_chunks, cv: c * lanes, tap_blocks, tap_chunks, panel, offs }
    }
}

/// One task's buffers: the panel, the band's `dyᵀ`, the channels' sums of
/// `dy` (`cv`) and the task's `dwᵀ` (`taps · cv`).
struct Buffers<'a> {
    /// The band's panel.
    panel: &'a mut [f32],
    /// The band's `dyᵀ`.
    dyt: &'a mut [f32],
    /// Sums of `dy` per channel (for `db`).
    sums: &'a mut [f32],
    /// The task's `dwᵀ`.
    dwt: &'a mut [f32],
}

/// One band of one image for one task: the panel and `dyᵀ` packed, `db`'s
/// sums (when `with_db`), then every tap block's tile.
#[allow(clippy::too_many_arguments)]
fn band(
    p: &Plan,
    s: &Shape,
    x_img: &[f32],
    dy_band: &[f32],
    channels: usize,
    oh0: usize,
    blocks: &[Range<usize>],
    with_db: bool,
    buf: &mut Buffers,
) {
    let (lanes, cv, ow_n) = (p.lanes, p.cv, s.out_hw[1]);
    let rows = p.panel.rows.min(s.out_hw[0] - oh0);
    let pixels = rows * ow_n;
    let dyt = &mut buf.dyt[..pixels * cv];
    // SAFETY: the CPU has `lanes` (the plan's); `dy_band` holds the
    // channels' band rows at the plane stride, `dyt` the band's pixels.
    unsafe {
        super::tiles::pack(lanes, &p.panel, s, x_img, oh0, buf.panel);
        let plane = s.out_hw[0] * ow_n;
        super::filter_tiles::transpose(lanes, dy_band.as_ptr(), plane, channels, pixels, dyt, cv);
        if with_db {
            super::filter_tiles::sum_pixels(lanes, dyt, pixels, cv, buf.sums);
        }
    }
    let mut dwt = &mut buf.dwt[..];
    for b in blocks {
        let (mine, rest) = dwt.split_at_mut(b.len() * cv);
        dwt = rest;
        let mut job = FilterBlock {
            panel: buf.panel,
            offs: &p.offs[b.clone()],
            row_step: p.panel.row_step(s),
            rows,
            ow_n,
            dyt,
            cv,
            dwt: mine,
        };
        // SAFETY: the CPU has `lanes`; the block's taps read the panel
        // inside its rows (see `Panel`).
        unsafe { super::filter_tiles::accumulate(lanes, &mut job) };
    }
}

/// `dw` (and `db`) overwritten, at `lanes` lanes (16 or 8; the CPU has
/// them).
pub(super) fn run(lanes: usize, s: &Shape, x: &[f32], dy: &[f32], dw: &mut [f32], db: Option<&mut [f32]>) {
    let ([oh_n, ow_n], taps) = (s.out_hw, s.taps());
    let (in_plane, out_plane) = (s.in_hw[0] * s.in_hw[1], oh_n * ow_n);
    let threads = if s.work() >= crate::threads::gemm_threshold() {
        crate::threads::pool().map_or(1, |p| p.threads())
    } else {
        1
    };
    let p = Plan::new(s, lanes, threads);
    let (dw_ptr, db_ptr) = (SendPtr(dw.as_mut_ptr()), db.map(|d| SendPtr(d.as_mut_ptr())));
    let per_group = p.oc_chunks.len() * p.tap_chunks.len();
    let task = |t: usize| {
        let (g, oc_chunk, tap_chunk) =
            (t / per_group, t / p.tap_chunks.len() % p.oc_chunks.len(), t % p.tap_chunks.len());
        let ocs = p.oc_chunks[oc_chunk].clone();
        let blocks = &p.tap_blocks[p.tap_chunks[tap_chunk].clone()];
        let tps = blocks[0].start..blocks[blocks.len() - 1].end;
        // The channels' sums of dy (db), by the first tap chunk's task.
        let with_db = db_ptr.is_some() && tap_chunk == 0;
        let (panel_len, dyt_len, cv) = (p.panel.len(s), p.panel.rows * ow_n * p.cv, p.cv);
        with_scratch(panel_len + dyt_len + (tps.len() + 1) * cv, |scratch| {
            let (panel, rest) = scratch.split_at_mut(panel_len);
            let (dyt, rest) = rest.split_at_mut(dyt_len);
            let (sums, dwt) = rest.split_at_mut(cv);
            sums.fill(0.0);
            dwt.fill(0.0);
            let mut buf = Buffers { panel, dyt, sums, dwt };
            for n in 0..s.batch {
                let x_img = &x[(n * s.groups + g) * s.in_c * in_plane..][..s.in_c * in_plane];
                let dy_chunk = &dy[((n * s.groups + g) * s.out_c + ocs.start) * out_plane..];
                for oh0 in (0..oh_n).step_by(p.panel.rows) {
                    band(&p, s, x_img, &dy_chunk[oh0 * ow_n..], ocs.len(), oh0, blocks, with_db, &mut buf);
                }
            }
            for (j, o) in ocs.clone().enumerate() {
                let o = g * s.out_c + o;
                if let (Some(db), true) = (db_ptr, with_db) {
                    // SAFETY: db[o] belongs to this task (its channels, tap
                    // chunk 0).
                    unsafe { *db.get().add(o) = buf.sums[j] };
                }
                for (i, t) in tps.clone().enumerate() {
                    // SAFETY: dw[o][t]: this task's (its channels and taps).
                    unsafe { *dw_ptr.get().add(o * taps + t) = buf.dwt[i * cv + j] };
                }
            }
        });
    };
    run_tasks(s.groups * per_group, s.work(), &task);
}
