//! The register tiles of the channel-lane convolution ([`super::cvec`]),
//! one generic body over [`Lanes`] compiled at 16 lanes (AVX-512F, 4
//! channel vectors × 6 pixels) and 8 (AVX2 + FMA, 2 × 6). `A` and `B` are
//! constants, one instance per pixel count a map's last tile needs, so the
//! accumulators are registers.

use std::arch::x86_64::*;
use std::ops::Range;

use super::cvec::Walk;
use super::panel::with_scratch;
use crate::simd::Lanes;

/// Most pixels per tile.
const B_MAX: usize = 6;

/// Most channels per block (4 vectors of 16).
const WIDTH_MAX: usize = 64;

/// Runs part `part` of block `block` of a group of `images` images: every
/// output channel of the block at the part's pixels (the group's pixels
/// cut into `walk.parts` near-equal ranges), into `y`.
///
/// # Safety
/// The CPU has `lanes` (16: AVX-512F; 8: AVX2 and FMA), the filter was
/// packed at `lanes`; `panels` are the images' (padded) inputs `walk` was
/// made for, `walk.panel_len` values each; `y` points at the images'
/// `out_len` writable outputs each, and a non-null `r` as many readable
/// values of the residual (`walk.epi.residual` from the group's first
/// image).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn task(
    lanes: usize,
    walk: &Walk,
    panels: &[f32],
    images: usize,
    (block, part): (usize, usize),
    y: *mut f32,
    r: *mut f32,
) {
    let (width, _, taps) = walk.sizes();
    let all = images * walk.plane;
    let pixels = part * all / walk.parts..(part + 1) * all / walk.parts;
    // Partial sums between chunks, when there is more than one.
    let scratch_len = if taps > walk.chunk { pixels.len() * width } else { 0 };
    // The vector code is in the entry points, not in this closure: a
    // closure is compiled without their target features.
    with_scratch(scratch_len, |scratch| {
        // SAFETY: forwarded from the caller.
        unsafe {
            if lanes == 16 {
                task_w16(walk, panels, pixels, block, [y, r], scratch)
            } else {
                task_w8(walk, panels, pixels, block, [y, r], scratch)
            }
        }
    })
}

/// [`task`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn task_w16(
    walk: &Walk,
    panels: &[f32],
    pixels: Range<usize>,
    block: usize,
    yr: [*mut f32; 2],
    scratch: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { run::<__m512, 4>(walk, panels, pixels, block, yr, scratch) }
}

/// [`task`] at 8 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn task_w8(
    walk: &Walk,
    panels: &[f32],
    pixels: Range<usize>,
    block: usize,
    yr: [*mut f32; 2],
    scratch: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { run::<__m256, 2>(walk, panels, pixels, block, yr, scratch) }
}

/// Where a tile's sums go after a chunk.
#[derive(Clone, Copy)]
struct Sink {
    /// Partial sums `[pixel][width]` between chunks, from the task's first
    /// pixel.
    scratch: *mut f32,
    /// The task's first pixel.
    first: usize,
    /// Whether the sums start from `scratch` (a chunk after the first).
    resume: bool,
    /// Whether this is the last chunk: the sums are finished into `y`.
    last: bool,
    /// The image's output planes.
    y: *mut f32,
    /// The residual's values, laid out as `y`'s (null: none).
    r: *const f32,
    /// The block's first output channel.
    oc0: usize,
    /// Which weights the tile fetches into the level-2 cache while it runs.
    prefetch: Prefetch,
}

/// The next chunk's weights a tile fetches into the level-2 cache (see
/// [`run`]).
#[derive(Clone, Copy)]
enum Prefetch {
    None,
    /// Each tap's: those this many values past its own.
    Ahead(usize),
    /// The tile's share, over its first taps (16 lanes only).
    Spread(Fetch),
}

/// The most tiles a chunk's map may have for its tiles to share the
/// prefetch of the next chunk's weights (a 14×14 map is 33 tiles, 28×28
/// 131).
const SPREAD_TILES_MAX: usize = 64;

/// A run of cache lines to prefetch over a tile's first taps.
#[derive(Clone, Copy)]
struct Fetch {
    /// The first line (any address: prefetches never fault).
    from: *const i8,
    /// Lines from `from`.
    lines: usize,
}

/// The chunks of taps, each over every tile of the map.
///
/// # Safety
/// As [`task`], with `V`'s features enabled; `A · V::LANES` is the
/// filter's width; `pixels` lie among the group's (`images · plane`);
/// `scratch` holds `pixels.len() · width` values when there is more than
/// one chunk.
#[inline(always)]
unsafe fn run<V: Lanes, const A: usize>(
    walk: &Walk,
    panels: &[f32],
    pixels: Range<usize>,
    block: usize,
    [y, r]: [*mut f32; 2],
    scratch: &mut [f32],
) {
    let (width, _, taps) = walk.sizes();
    debug_assert_eq!(width, A * V::LANES);
    let w = walk.weights(block);
    let chunks = taps.div_ceil(walk.chunk);
    {
        for c in 0..chunks {
            let taps = c * walk.chunk..((c + 1) * walk.chunk).min(taps);
            let sink = Sink {
                scratch: scratch.as_mut_ptr(),
                first: pixels.start,
                resume: c > 0,
                last: c + 1 == chunks,
                y,
                r,
                oc0: block * width,
                prefetch: Prefetch::None,
            };
            // SAFETY: the chunk's weights are `taps.len() · width` values.
            let w = unsafe { w.as_ptr().add(taps.start * width) };
            let lines = taps.len() * width / 16;
            let offs = &walk.offs[taps];
            // Near-equal tiles of at most B_MAX pixels: a 7x7 map is tiles
            // of 6 and 5 pixels, not eight of 6 and one of 1 (a tile of
            // one pixel runs its FMAs at a quarter of the rate).
            let (start, count) = (pixels.start, pixels.len());
            let tiles = count.div_ceil(B_MAX);
            // The first tile of a chunk fetches the next chunk's weights (or
            // the next block's first, which follow) into the level-2 cache,
            // a tap at a time, while it computes: a model's weights come
            // from memory, not from a cache (a 3x3 512 -> 512 layer on a 7x7
            // map with its weights out of the caches: 2.30 -> 2.02 ms).
            // With 16 lanes, each tile fetches its share instead: one tile
            // asking for all 24 KiB within a few hundred cycles left much
            // of it to arrive as misses of the next chunk (a 1×1 1024 ->
            // 512 layer on a 7×7 map, weights out of the caches, on a Zen 5:
            // 529-546 -> 462-471 µs, as fast as with warm weights). The
            // 8-lane tiles keep the first-tile fetch: the spread's
            // bookkeeping took registers their pointers need (10-30% slower);
            // so do maps of many tiles, whose chunks run long enough for the
            // first tile's fetches to arrive (spread, the 3×3 64 -> 64 layer
            // on a 56×56 map ran 2-6% slower).
            let next = w.wrapping_add(walk.chunk * width) as *const i8;
            let spread = V::LANES >= 16 && tiles <= SPREAD_TILES_MAX;
            for i in 0..tiles {
                let prefetch = if spread {
                    let share = i * lines / tiles..(i + 1) * lines / tiles;
                    let from = next.wrapping_add(share.start * 64);
                    Prefetch::Spread(Fetch { from, lines: share.len() })
                } else if i == 0 {
                    Prefetch::Ahead(walk.chunk * width)
                } else {
                    Prefetch::None
                };
                let sink = Sink { prefetch, ..sink };
                let (p0, n) = (start + i * count / tiles, (i + 1) * count / tiles - i * count / tiles);
                // SAFETY: pixels p0..p0 + n of the map; the caller's rest.
                unsafe {
                    match n {
                        6 => tile::<V, A, 6>(walk, panels, w, offs, p0, sink),
                        5 => tile::<V, A, 5>(walk, panels, w, offs, p0, sink),
                        4 => tile::<V, A, 4>(walk, panels, w, offs, p0, sink),
                        3 => tile::<V, A, 3>(walk, panels, w, offs, p0, sink),
                        2 => tile::<V, A, 2>(walk, panels, w, offs, p0, sink),
                        _ => tile::<V, A, 1>(walk, panels, w, offs, p0, sink),
                    }
                }
            }
        }
    }
}

/// One tile: `A` channel vectors × pixels `p0..p0 + B` of the group (in
/// image order, a tile possibly across two images) over the chunk's taps,
/// then into the scratch or, after the last chunk, into `y`.
///
/// # Safety
/// As [`run`]; `w` holds the chunk's `offs.len() · A · V::LANES` weights;
/// the pixels lie in the group.
#[inline(always)]
unsafe fn tile<V: Lanes, const A: usize, const B: usize>(
    walk: &Walk,
    panels: &[f32],
    w: *const f32,
    offs: &[u32],
    p0: usize,
    sink: Sink,
) {
    let width = A * V::LANES;
    // SAFETY: every base plus every tap's offset addresses a value of the
    // image's panel (the windows of output pixels lie in the padded input); the
    // scratch's rows of these pixels hold `width` values each.
    unsafe {
        // Each pixel's image and place in it: its window's start in the
        // panels, and its output's offset from the start of a channel's
        // plane in the first image.
        // One division for the tile, then steps (a tile of 1×1 taps is
        // a few hundred cycles: two divisions a pixel were a tenth of it).
        let (img0, q0) = (p0 / walk.plane, p0 % walk.plane);
        let at = |b: usize| {
            let q = q0 + b;
            if q < walk.plane {
                (img0, q)
            } else {
                (img0 + q / walk.plane, q % walk.plane)
            }
        };
        let places: [(usize, usize); B] = std::array::from_fn(at);
        let srcs: [*const f32; B] = std::array::from_fn(|b| {
            panels.as_ptr().add(places[b].0 * walk.panel_len + walk.bases[places[b].1] as usize)
        });
        let dsts: [usize; B] = std::array::from_fn(|b| places[b].0 * walk.out_len + places[b].1);
        let mut acc = [[V::zero(); A]; B];
        if sink.resume {
            for (b, row) in acc.iter_mut().enumerate() {
                for (a, v) in row.iter_mut().enumerate() {
                    *v = V::load(sink.scratch.add((p0 - sink.first + b) * width + a * V::LANES));
                }
            }
        }
        if sink.last && walk.channels_last {
            fetch_outputs::<B>(width, walk.sizes().1, p0, sink);
        }
        let acc = match sink.prefetch {
            // The 8-lane tiles never spread: no spread code in them.
            Prefetch::Spread(fetch) if V::LANES >= 16 && fetch.lines > 0 => {
                accumulate_fetching::<V, A, B>(offs, w, &srcs, acc, fetch)
            }
            Prefetch::Ahead(ahead) => accumulate::<V, A, B, true>(offs, w, &srcs, acc, ahead),
            Prefetch::None | Prefetch::Spread(_) => accumulate::<V, A, B, false>(offs, w, &srcs, acc, 0),
        };
        if !sink.last {
            for (b, row) in acc.iter().enumerate() {
                for (a, v) in row.iter().enumerate() {
                    v.store(sink.scratch.add((p0 - sink.first + b) * width + a * V::LANES));
                }
            }
            return;
        }
        if walk.channels_last {
            return store_channels_last::<V, A, B>(walk, acc, p0, sink);
        }
        let mut sums = [0.0f32; B_MAX * WIDTH_MAX];
        for (b, row) in acc.iter().enumerate() {
            for (a, v) in row.iter().enumerate() {
                v.store(sums.as_mut_ptr().add(b * width + a * V::LANES));
            }
        }
        let (_, out_c, _) = walk.sizes();
        for j in 0..width.min(out_c - sink.oc0) {
            let o = sink.oc0 + j;
            let dst = sink.y.add(o * walk.plane);
            for (b, &d) in dsts.iter().enumerate() {
                let r = if sink.r.is_null() { sink.r } else { sink.r.add(o * walk.plane + d) };
                *dst.add(d) = walk.finish(o, sums[b * width + j], r);
            }
        }
    }
}

/// Asks for the lines a channels-last tile will store (a write hint:
/// `prefetchw` where the build enables PRFCHW, else a plain prefetch) and,
/// when the residual is a tensor of its own, the lines it will read,
/// before the tile's last chunk of FMAs: they arrive while it computes.
/// Each pixel's `width` channels are a run of lines, pixels `out_c`
/// values apart, a pattern the hardware's prefetchers did not follow
/// (ResNet's 1×1 64 -> 256 layer at batch 8 with its shortcut added: the
/// shortcut's misses took it from 10.0 to 15.9 ms on a Zen 4 core).
///
/// # Safety
/// None needed: prefetches never fault, wherever they point; the
/// addresses are computed with wrapping arithmetic.
#[inline(always)]
unsafe fn fetch_outputs<const B: usize>(width: usize, out_c: usize, p0: usize, sink: Sink) {
    let run = width.min(out_c - sink.oc0) * 4;
    let separate = !sink.r.is_null() && !std::ptr::eq(sink.r, sink.y.cast_const());
    for b in 0..B {
        let at = (p0 + b) * out_c + sink.oc0;
        let (dst, res) = (sink.y.wrapping_add(at) as *const i8, sink.r.wrapping_add(at) as *const i8);
        // Every line the run touches and no other (the next block's
        // channels are another task's), the first one possibly partial;
        // the residual's at the same offsets (exact when both buffers
        // are equally aligned, as the executor's are).
        let lead = dst as usize % 64;
        let (dst, res) = (dst.wrapping_sub(lead), res.wrapping_sub(lead));
        let mut off = 0;
        while off < lead + run {
            // SAFETY: a hint; see the function's doc.
            unsafe {
                _mm_prefetch::<_MM_HINT_ET0>(dst.wrapping_add(off));
                if separate {
                    _mm_prefetch::<_MM_HINT_T0>(res.wrapping_add(off));
                }
            }
            off += 64;
        }
    }
}

/// A tile's finished sums into channels-last `y`: each pixel's `A`
/// vectors of channels are adjacent there (and in the residual), so whole
/// vectors take the epilogue and are stored; the lanes past the last
/// channel (a last block of fewer channels) are written one by one.
///
/// # Safety
/// As [`tile`]; `y` (and a non-null residual) holds the group's `images ·
/// plane · out_c` values.
#[inline(always)]
unsafe fn store_channels_last<V: Lanes, const A: usize, const B: usize>(
    walk: &Walk,
    acc: [[V; A]; B],
    p0: usize,
    sink: Sink,
) {
    let (_, out_c, _) = walk.sizes();
    let room = out_c - sink.oc0;
    let epi = &walk.epi;
    // SAFETY: pixel `p0 + b`'s channels `oc0..oc0 + width.min(room)` are
    // in `y` and the residual; the scale and bias have `out_c` values.
    unsafe {
        if room >= A * V::LANES {
            // A whole block: straight-line products, adds, maxes and
            // stores, each rounded as the graph's own op rounds it; a
            // missing step is skipped (so a product's -0 stays -0, as the
            // ops keep it; a sum of products from +0 is never -0).
            let per_channel = |p: Option<&[f32]>, or: f32| -> [V; A] {
                std::array::from_fn(|a| match p {
                    Some(p) => V::load(p.as_ptr().add(sink.oc0 + a * V::LANES)),
                    None => V::splat(or),
                })
            };
            let (scale, bias) = (per_channel(epi.scale, 1.0), per_channel(epi.bias, 0.0));
            let at = p0 * out_c + sink.oc0;
            let (dst, res) = (sink.y.add(at), if sink.r.is_null() { sink.r } else { sink.r.add(at) });
            for (b, row) in acc.into_iter().enumerate() {
                for (a, v) in row.into_iter().enumerate() {
                    let i = b * out_c + a * V::LANES;
                    let mut v = if epi.scale.is_some() { v.mul(scale[a]) } else { v };
                    if epi.bias.is_some() {
                        v = v.add(bias[a]);
                    }
                    if !res.is_null() {
                        v = v.add(V::load(res.add(i)));
                    }
                    // `vmaxps 0, v` is `v` when `v` is NaN.
                    if epi.relu {
                        v = V::zero().max(v);
                    }
                    v.store(dst.add(i));
                }
            }
            return;
        }
        // The last block of fewer channels: lane by lane.
        for (b, row) in acc.into_iter().enumerate() {
            let at = (p0 + b) * out_c + sink.oc0;
            for (a, v) in row.into_iter().enumerate() {
                let o = a * V::LANES;
                if o < room {
                    let mut lanes = [0.0f32; 16];
                    v.store(lanes.as_mut_ptr());
                    for (j, &s) in lanes[..V::LANES.min(room - o)].iter().enumerate() {
                        let r = if sink.r.is_null() { sink.r } else { sink.r.add(at + o + j) };
                        *sink.y.add(at + o + j) = walk.finish(sink.oc0 + o + j, s, r);
                    }
                }
            }
        }
    }
}

/// `acc[b][a] += Σ_t w[t][a] · src_b[offs[t]]` over the taps in order, one
/// FMA each: per tap `A` weight vectors loaded, each pixel's value
/// broadcast.
///
/// # Safety
/// The features of `V`; `w` holds `A · V::LANES · offs.len()` values;
/// every `srcs[b] + offs[t]` is readable.
#[inline(always)]
unsafe fn accumulate<V: Lanes, const A: usize, const B: usize, const FETCH: bool>(
    offs: &[u32],
    mut w: *const f32,
    srcs: &[*const f32; B],
    mut acc: [[V; A]; B],
    ahead: usize,
) -> [[V; A]; B] {
    // SAFETY: forwarded from the caller.
    unsafe {
        // Four taps an iteration: a quarter of the loop's own
        // instructions, which share ports with the FMAs (ResNet-50's
        // layers at batch 8 on a Xeon core: 8-12% faster than one tap an
        // iteration, two taps about as fast as four).
        let mut quads = offs.chunks_exact(4);
        for quad in &mut quads {
            for &o in quad {
                step::<V, A, B, FETCH>(o as usize, &mut w, srcs, &mut acc, ahead);
            }
        }
        for &o in quads.remainder() {
            step::<V, A, B, FETCH>(o as usize, &mut w, srcs, &mut acc, ahead);
        }
        acc
    }
}

/// [`accumulate`], prefetching `fetch`'s lines into the level-2 cache
/// over the first taps: the fewest lines a group of four taps that spread
/// the run over the taps (one, in a chunk of a map of several tiles).
///
/// # Safety
/// As [`accumulate`].
#[inline(always)]
unsafe fn accumulate_fetching<V: Lanes, const A: usize, const B: usize>(
    offs: &[u32],
    mut w: *const f32,
    srcs: &[*const f32; B],
    mut acc: [[V; A]; B],
    fetch: Fetch,
) -> [[V; A]; B] {
    let quads = offs.len() / 4;
    let per_quad = if quads == 0 { 0 } else { fetch.lines.div_ceil(quads) };
    let fetching = if per_quad == 0 { 0 } else { fetch.lines.div_ceil(per_quad) };
    let (head, tail) = offs.split_at(fetching * 4);
    let mut from = fetch.from;
    // SAFETY: forwarded from the caller.
    unsafe {
        for quad in head.chunks_exact(4) {
            for line in 0..per_quad {
                // A hint: prefetches never fault, wherever they point.
                _mm_prefetch::<_MM_HINT_T1>(from.wrapping_add(line * 64));
            }
            from = from.wrapping_add(per_quad * 64);
            for &o in quad {
                step::<V, A, B, false>(o as usize, &mut w, srcs, &mut acc, 0);
            }
        }
        accumulate::<V, A, B, false>(tail, w, srcs, acc, 0)
    }
}

/// One tap of [`accumulate`].
///
/// # Safety
/// As [`accumulate`], for the tap's weights at `w`.
#[inline(always)]
unsafe fn step<V: Lanes, const A: usize, const B: usize, const FETCH: bool>(
    o: usize,
    w: &mut *const f32,
    srcs: &[*const f32; B],
    acc: &mut [[V; A]; B],
    ahead: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if FETCH {
            // A hint: prefetches never fault, wherever they point.
            let next = w.wrapping_add(ahead) as *const i8;
            for line in 0..A * V::LANES / 16 {
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(line * 64));
            }
        }
        let mut ws = [V::zero(); A];
        for (a, v) in ws.iter_mut().enumerate() {
            *v = V::load(w.add(a * V::LANES));
        }
        *w = w.add(A * V::LANES);
        for b in 0..B {
            let x = V::splat(*srcs[b].add(o));
            for a in 0..A {
                acc[b][a] = ws[a].fma(x, acc[b][a]);
            }
        }
    }
}
