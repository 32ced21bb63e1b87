//! The backward-filter kernel for small filters (output channels × taps
//! per group at most [`MAX_PAIRS`], such as W12's first layer: 16 × 25),
//! with vectors along output pixels: no transposition of `dy`, whose rows
//! are read as they lie.
//!
//! A tile is `A` output channels × `T` taps, `A·T` vector accumulators
//! (4 × 6 at 16 lanes, 3 × 4 at 8): per vector of an output row's pixels
//! it loads `A` vectors of `dy` and `T` of the band's panel ([`Panel`], as
//! the forward kernel's) and runs `A·T` FMAs; a row's last, partial vector
//! is loaded masked (zeros past the row, never the next row's values). At
//! the end of each band the accumulators are added into the task's partial
//! sums, one vector per (channel, tap), small enough to stay in the cache;
//! at the end the partial sums' lanes are added in order into `dw`. `db`
//! is summed the same way, by the first task of each group.
//!
//! Bands are fixed by the shape and every (channel, tap) pair is summed in
//! the same order whichever task holds it, so the tasks (the pairs' tiles
//! split in contiguous ranges, one range per thread) do not change the
//! bits.

use std::ops::Range;

use super::engine::Shape;
use super::panel::{with_scratch, Panel};
use super::{run_tasks, split, SendPtr};

/// Most (output channel, tap) pairs per group for this kernel: their
/// partial sums (16 lanes each) then take at most 64 KiB.
pub(super) const MAX_PAIRS: usize = 1024;

/// Bytes of a band's panel.
const PANEL_BYTES: usize = 64 << 10;

/// Whether this kernel suits `s` at `lanes` lanes: few pairs, and rows at
/// least half a vector wide (narrower rows would waste most lanes).
pub(super) fn suits(s: &Shape, lanes: usize) -> bool {
    s.out_c * s.taps() <= MAX_PAIRS && s.out_hw[1] >= lanes / 2
}

/// One tile's work over one band, for the vector code.
pub(super) struct PxBlock<'a> {
    /// The band's panel.
    pub panel: &'a [f32],
    /// The tile's taps' panel offsets (`T` of them).
    pub offs: &'a [u32],
    /// Panel values between output rows.
    pub row_step: usize,
    /// The band's `dy` rows of the tile's first channel (channel `a` at
    /// `a · plane` after it), `rows` rows of `ow_n` values each.
    pub dy: &'a [f32],
    /// Values per `dy` plane.
    pub plane: usize,
    /// Output rows in the band.
    pub rows: usize,
    /// Output width.
    pub ow_n: usize,
    /// The tile's partial sums, `[A][T][lanes]`, added to.
    pub partial: &'a mut [f32],
}

/// How [`run`] cuts a shape at one width.
struct Plan {
    /// f32 lanes per vector.
    lanes: usize,
    /// Every tile of a group: (its output channels, its taps).
    tiles: Vec<(Range<usize>, Range<usize>)>,
    /// Chunks of tiles (each a task's, per group).
    chunks: Vec<Range<usize>>,
    /// The bands' panel.
    panel: Panel,
    /// The panel offset of each tap, in `dw`'s order (ic, kh, kw).
    offs: Vec<u32>,
}

impl Plan {
    /// The plan of `s` at `lanes` lanes for `threads` threads.
    fn new(s: &Shape, lanes: usize, threads: usize) -> Plan {
        let (a_max, t_max) = if lanes == 16 { (4, 6) } else { (3, 4) };
        let taps = s.taps();
        let ocs = split(s.out_c, s.out_c.div_ceil(a_max));
        let tps = split(taps, taps.div_ceil(t_max));
        let tiles: Vec<_> = ocs.iter().flat_map(|o| tps.iter().map(move |t| (o.clone(), t.clone()))).collect();
        let chunks = split(tiles.len(), threads.div_ceil(s.groups).clamp(1, tiles.len()));
        let (oh_n, q) = (s.out_hw[0], Panel::least_q(s, s.out_hw[1]));
        let mut rows = 1;
        while rows < oh_n && Panel::bytes(s, rows + 1, q) <= PANEL_BYTES {
            rows += 1;
        }
        let panel = Panel::new(s, rows, q);
        let [kh_n, kw_n] = s.kernel;
        let offs = (0..taps).map(|t| panel.offset(s, t / kw_n % kh_n, t / (kh_n * kw_n), t % kw_n) as u32).collect();
        Plan { lanes, tiles, chunks, panel, offs }
    }
}

/// One band of one image for one task: the panel packed, every tile's
/// sums added into `partial` (the tiles' partial sums in order), and the
/// channels' sums of `dy` into `db_sums` (when not empty).
#[allow(clippy::too_many_arguments)]
fn band(
    p: &Plan,
    s: &Shape,
    x_img: &[f32],
    dy_img: &[f32],
    oh0: usize,
    tiles: &[(Range<usize>, Range<usize>)],
    panel: &mut [f32],
    partial: &mut [f32],
    db_sums: &mut [f32],
) {
    let ([oh_n, ow_n], lanes) = (s.out_hw, p.lanes);
    let (rows, plane) = (p.panel.rows.min(oh_n - oh0), oh_n * ow_n);
    // SAFETY: the CPU has `lanes` (the plan's).
    unsafe { super::tiles::pack(lanes, &p.panel, s, x_img, oh0, panel) };
    let mut rest = partial;
    for (o, tp) in tiles {
        let (block, after) = rest.split_at_mut(o.len() * tp.len() * lanes);
        rest = after;
        let mut job = PxBlock {
            panel,
            offs: &p.offs[tp.clone()],
            row_step: p.panel.row_step(s),
            dy: &dy_img[o.start * plane + oh0 * ow_n..],
            plane,
            rows,
            ow_n,
            partial: block,
        };
        // SAFETY: the CPU has `lanes`; the tile's taps read the panel
        // inside its rows, its channels' dy rows lie in the image.
        unsafe { super::filter_px_tiles::accumulate(lanes, o.len(), &mut job) };
    }
    if !db_sums.is_empty() {
        // SAFETY: the CPU has `lanes`; the band's rows of every channel lie
        // in the image.
        unsafe { super::filter_px_tiles::sum_rows(lanes, &dy_img[oh0 * ow_n..], plane, s.out_c, rows * ow_n, db_sums) };
    }
}

/// `dw` (and `db`) overwritten, at `lanes` lanes (16 or 8; the CPU has
/// them). See the module.
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
    let task = |t: usize| {
        let (g, chunk) = (t / p.chunks.len(), t % p.chunks.len());
        let mine = &p.tiles[p.chunks[chunk].clone()];
        let pairs: usize = mine.iter().map(|(o, t)| o.len() * t.len()).sum();
        // The group's channel sums (db), by the group's first task.
        let db_len = if db_ptr.is_some() && chunk == 0 { s.out_c * lanes } else { 0 };
        let panel_len = p.panel.len(s);
        with_scratch(panel_len + pairs * lanes + db_len, |scratch| {
            let (panel, partial) = scratch.split_at_mut(panel_len);
            partial.fill(0.0);
            let (partial, db_sums) = partial.split_at_mut(pairs * lanes);
            for n in 0..s.batch {
                let x_img = &x[(n * s.groups + g) * s.in_c * in_plane..][..s.in_c * in_plane];
                let dy_img = &dy[(n * s.groups + g) * s.out_c * out_plane..][..s.out_c * out_plane];
                for oh0 in (0..oh_n).step_by(p.panel.rows) {
                    band(&p, s, x_img, dy_img, oh0, mine, panel, partial, db_sums);
                }
            }
            // The lanes of each pair's partial sums, in order.
            let total = |v: &[f32]| v.iter().fold(0.0f32, |a, &b| a + b);
            let mut sums = partial.chunks_exact(lanes);
            for (o, tp) in mine {
                for oc in o.clone() {
                    for t in tp.clone() {
                        let v = total(sums.next().expect("a partial sum per pair"));
                        // SAFETY: dw[g·out_c + oc][t]: this task's pair.
                        unsafe { *dw_ptr.get().add((g * s.out_c + oc) * taps + t) = v };
                    }
                }
            }
            if let (Some(db), true) = (db_ptr, db_len > 0) {
                for (oc, lanes_of) in db_sums.chunks_exact(lanes).enumerate() {
                    // SAFETY: db[g·out_c + oc]: the group's first task's.
                    unsafe { *db.get().add(g * s.out_c + oc) = total(lanes_of) };
                }
            }
        });
    };
    run_tasks(s.groups * p.chunks.len(), s.work(), &task);
}
