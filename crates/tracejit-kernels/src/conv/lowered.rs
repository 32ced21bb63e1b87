//! The passes run as matrix products over bands of output rows, through
//! [`crate::gemm::product`] on the task's own thread:
//! - [`backward_data`] for strides above 1: `dcol[t, p] = Σ_o w[o, t] ·
//!   dy[o, p]` per band, then added into `dx` where each tap's pixel came
//!   from (col2im), bands in row order;
//! - [`backward_filter`] without vector code (the portable path): `dw[o,
//!   t] += Σ_p dy[o, p] · col[t, p]` per band, `col` the band's im2col tile
//!   (taps `t` = (input channel, kernel row, kernel column) of the task's
//!   tap block, pixels `p` of the band's rows), bands in (image, row)
//!   order; `db` summed in the same order.
//!
//! A tile is at most [`TILE_BYTES`] (at least one output row), so the
//! memory per thread stays that of a tile whatever the image size. Tasks:
//! (image, group, input-channel block) for the data, each owning its `dx`
//! channels; (group, output-channel block, tap block) for the filter, each
//! owning its `dw` block (and `db` for its channels when its tap block is
//! the first). Blocks are fixed by the geometry.

use super::{run_tasks, Conv2dGeometry, Path, SendPtr};

/// Most bytes of an im2col (or col2im) tile.
const TILE_BYTES: usize = 256 << 10;

/// Least multiply-adds per task before blocks are cut smaller.
const TASK_WORK: usize = 1 << 21;

thread_local! {
    /// Each thread's tile, grown to the largest and kept.
    static TILE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's tile of at least `len` values.
pub(super) fn with_tile<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    TILE.with(|cell| {
        let mut tile = cell.borrow_mut();
        if tile.len() < len {
            tile.resize(len, 0.0);
        }
        f(&mut tile[..len])
    })
}

/// The taps of a group's weights in their storage order: `t = (ic·kh +
/// r)·kw + c`, as (input channel, kernel row, kernel column).
fn tap(g: &Conv2dGeometry, t: usize) -> (usize, usize, usize) {
    let [kh, kw] = g.kernel;
    (t / (kh * kw), t / kw % kh, t % kw)
}

/// The input column range `ow` of an output row at which kernel column `c`
/// reads inside the input: `ow·s - pad + c·d` in `0..in_w`.
fn inside_cols(g: &Conv2dGeometry, c: usize) -> (usize, usize) {
    let (s, off, n, ow_n) = (g.stride[1], (c * g.dilation[1]) as isize - g.pad[1] as isize, g.in_w, g.out_w());
    let first = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(s) };
    let end = if off >= n as isize { 0 } else { ((n as isize - off) as usize).div_ceil(s) };
    (first.min(ow_n), end.min(ow_n).max(first.min(ow_n)))
}

/// The input row of output row `oh` at kernel row `r`, if inside.
fn input_row(g: &Conv2dGeometry, oh: usize, r: usize) -> Option<usize> {
    let ih = (oh * g.stride[0] + r * g.dilation[0]) as isize - g.pad[0] as isize;
    (ih >= 0 && ih < g.in_h as isize).then_some(ih as usize)
}

/// Output rows per band for tiles of `taps` rows: as many as fit in
/// [`TILE_BYTES`], at least one.
fn band_rows(g: &Conv2dGeometry, taps: usize) -> usize {
    (TILE_BYTES / 4 / (taps * g.out_w()).max(1)).clamp(1, g.out_h().max(1))
}

/// Splits `n` into `parts` near-equal ranges; range `i`.
fn part(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    i * n / parts..(i + 1) * n / parts
}

/// See the module. `dw` and `db` are overwritten.
pub(super) fn backward_filter(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
) {
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let taps = icg * g.kernel[0] * g.kernel[1];
    let ([oh_n, ow_n], plane_in) = ([g.out_h(), g.out_w()], g.in_h * g.in_w);
    // Blocks: output channels by 16, then taps split while a task would do
    // more than TASK_WORK (in blocks of at least 32 taps).
    let work = g.macs();
    let oc_blocks = ocg.div_ceil(16);
    let tasks_wanted = (work / TASK_WORK).clamp(1, 8);
    let tap_blocks = tasks_wanted.div_ceil(g.groups * oc_blocks).min(taps.div_ceil(32)).max(1);
    let tasks = g.groups * oc_blocks * tap_blocks;
    let (dw_ptr, db_ptr) = (SendPtr(dw.as_mut_ptr()), db.map(|d| SendPtr(d.as_mut_ptr())));
    let task = |t: usize| {
        let (grp, ob, tb) = (t / (oc_blocks * tap_blocks), t / tap_blocks % oc_blocks, t % tap_blocks);
        let ocs = part(ocg, oc_blocks, ob);
        let tps = part(taps, tap_blocks, tb);
        let oc0 = grp * ocg + ocs.start;
        // Zero the task's dw block, then accumulate band after band.
        for o in ocs.clone() {
            // SAFETY: row `grp·ocg + o` of dw, columns `tps`: this task's.
            unsafe { std::ptr::write_bytes(dw_ptr.get().add((grp * ocg + o) * taps + tps.start), 0, tps.len()) };
        }
        if let (Some(db), 0) = (db_ptr, tb) {
            for o in ocs.clone() {
                let c = grp * ocg + o;
                let sum = (0..g.batch)
                    .fold(0.0f32, |acc, n| acc + sum(&dy[(n * g.out_channels + c) * oh_n * ow_n..][..oh_n * ow_n]));
                // SAFETY: db[c] belongs to this task (its channels, tap block 0).
                unsafe { *db.get().add(c) = sum };
            }
        }
        if ocs.is_empty() || tps.is_empty() || oh_n * ow_n == 0 {
            return;
        }
        let rows = band_rows(g, tps.len());
        with_tile(tps.len() * rows * ow_n, |tile| {
            for n in 0..g.batch {
                let x_img = &x[(n * g.in_channels + grp * icg) * plane_in..][..icg * plane_in];
                for oh0 in (0..oh_n).step_by(rows) {
                    let r = rows.min(oh_n - oh0);
                    let pixels = r * ow_n;
                    im2col(g, x_img, oh0, r, tps.clone(), &mut tile[..tps.len() * pixels]);
                    let a = dy[(n * g.out_channels + oc0) * oh_n * ow_n + oh0 * ow_n..].as_ptr();
                    // SAFETY: `a` is the block's dy rows (ocs × pixels at row
                    // stride oh·ow), `tile` is tps × pixels (read
                    // transposed), dw's block is ocs × tps at row stride
                    // `taps`, this task's alone.
                    unsafe {
                        crate::gemm::product::<f32>(
                            path.isa(),
                            ocs.len(),
                            pixels,
                            tps.len(),
                            a,
                            (oh_n * ow_n) as isize,
                            1,
                            tile.as_ptr(),
                            1,
                            pixels as isize,
                            dw_ptr.get().add(oc0 * taps + tps.start),
                            taps as isize,
                            1,
                            true,
                        )
                    }
                }
            }
        });
    };
    run_tasks(tasks, work, &task);
}

/// Sum of `v` in 16 interleaved partial sums (vectorizable, and fixed by
/// the length alone), then those in order.
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    for (a, x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += x;
    }
    acc.iter().sum()
}

/// `tile[t - taps.start][p] = x[ic, oh·s - pad + r·d, ow·s - pad + c·d]`
/// (zero in the padding) for the taps `(ic, r, c)` of `taps` and the
/// pixels `p = (oh - oh0)·out_w + ow` of `rows` output rows from `oh0`.
pub(super) fn im2col(
    g: &Conv2dGeometry,
    x: &[f32],
    oh0: usize,
    rows: usize,
    taps: std::ops::Range<usize>,
    tile: &mut [f32],
) {
    let ow_n = g.out_w();
    let (s, iw_n) = (g.stride[1], g.in_w);
    for (t, dst) in taps.zip(tile.chunks_exact_mut(rows * ow_n)) {
        let (ic, r, c) = tap(g, t);
        let (first, end) = inside_cols(g, c);
        let off = (c * g.dilation[1]) as isize - g.pad[1] as isize;
        for (i, row) in dst.chunks_exact_mut(ow_n).enumerate() {
            let Some(ih) = input_row(g, oh0 + i, r) else {
                row.fill(0.0);
                continue;
            };
            let src = &x[(ic * g.in_h + ih) * iw_n..][..iw_n];
            row[..first].fill(0.0);
            row[end..].fill(0.0);
            if s == 1 {
                let start = (first as isize + off) as usize;
                row[first..end].copy_from_slice(&src[start..start + end - first]);
            } else {
                for (ow, v) in (first..end).zip(&mut row[first..end]) {
                    *v = src[(ow as isize * s as isize + off) as usize];
                }
            }
        }
    }
}

/// `dx[ic, oh·s - pad + r·d, ow·s - pad + c·d] += tile[t][p]` for the taps
/// `(ic, r, c)` of `taps` (relative to the task's first channel
/// `ic_base`), the inverse placement of [`im2col`].
#[allow(clippy::too_many_arguments)]
fn col2im(
    g: &Conv2dGeometry,
    dx: &mut [f32],
    ic_base: usize,
    oh0: usize,
    rows: usize,
    taps: std::ops::Range<usize>,
    tile: &[f32],
) {
    let ow_n = g.out_w();
    let (s, iw_n) = (g.stride[1], g.in_w);
    for (t, src) in taps.zip(tile.chunks_exact(rows * ow_n)) {
        let (ic, r, c) = tap(g, t);
        let (first, end) = inside_cols(g, c);
        let off = (c * g.dilation[1]) as isize - g.pad[1] as isize;
        for (i, row) in src.chunks_exact(ow_n).enumerate() {
            let Some(ih) = input_row(g, oh0 + i, r) else { continue };
            let dst = &mut dx[((ic - ic_base) * g.in_h + ih) * iw_n..][..iw_n];
            for (ow, v) in (first..end).zip(&row[first..end]) {
                dst[(ow as isize * s as isize + off) as usize] += v;
            }
        }
    }
}

/// See the module: `dx` (overwritten) for strides above 1.
pub(super) fn backward_data(path: Path, g: &Conv2dGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let [kh, kw] = g.kernel;
    let taps = icg * kh * kw;
    let ([oh_n, ow_n], plane_in) = ([g.out_h(), g.out_w()], g.in_h * g.in_w);
    let work = g.macs();
    let images = g.batch * g.groups;
    let ic_blocks = (work / TASK_WORK).clamp(1, 8).div_ceil(images).min(icg);
    let dx_ptr = SendPtr(dx.as_mut_ptr());
    let task = |t: usize| {
        let (n, grp, ib) = (t / (g.groups * ic_blocks), t / ic_blocks % g.groups, t % ic_blocks);
        let ics = part(icg, ic_blocks, ib);
        let c0 = n * g.in_channels + grp * icg + ics.start;
        // SAFETY: channels `ics` of image `n`, group `grp`: this task's.
        let dx_blk = unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(c0 * plane_in), ics.len() * plane_in) };
        dx_blk.fill(0.0);
        let tps = ics.start * kh * kw..ics.end * kh * kw;
        if tps.is_empty() || oh_n * ow_n == 0 {
            return;
        }
        let rows = band_rows(g, tps.len());
        with_tile(tps.len() * rows * ow_n, |tile| {
            for oh0 in (0..oh_n).step_by(rows) {
                let r = rows.min(oh_n - oh0);
                let pixels = r * ow_n;
                let tile = &mut tile[..tps.len() * pixels];
                let a = w[grp * ocg * taps + tps.start..].as_ptr();
                let b = dy[(n * g.out_channels + grp * ocg) * oh_n * ow_n + oh0 * ow_n..].as_ptr();
                // SAFETY: `a` is wᵀ for the taps (tps × ocg, column stride
                // `taps`), `b` the group's dy rows (ocg × pixels at row
                // stride oh·ow), `tile` tps × pixels, this thread's.
                unsafe {
                    crate::gemm::product::<f32>(
                        path.isa(),
                        tps.len(),
                        ocg,
                        pixels,
                        a,
                        1,
                        taps as isize,
                        b,
                        (oh_n * ow_n) as isize,
                        1,
                        tile.as_mut_ptr(),
                        pixels as isize,
                        1,
                        false,
                    )
                }
                col2im(g, dx_blk, ics.start, oh0, r, tps.clone(), tile);
            }
        });
    };
    run_tasks(images * ic_blocks, work, &task);
}
