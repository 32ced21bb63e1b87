//! The forward convolution as matrix products, for the geometries where the
//! direct kernel (`engine`) leaves most of its vector lanes or threads
//! idle: ResNet-style 1×1 convolutions and convolutions whose output rows
//! are shorter than about a vector and a half (7×7 and 14×14 maps at 16
//! lanes: a row of 7 fills 7 of 16 lanes, and the whole map is one band,
//! one task, so a second thread has nothing to do).
//!
//! Per (image, group): `y[o, p] = Σ_t w[o, t] · col[t, p]` through
//! [`crate::gemm::product`] (its blocks over the thread pool, bits fixed
//! by the sizes), `col` the im2col tile of a band of output rows (at most
//! [`TILE_BYTES`]: a whole 7×7 or 14×14 map of ResNet-50 at once; for an
//! unpadded strided 1×1 convolution, `x` subsampled) or, for an unpadded
//! stride-1 1×1 convolution, `x` itself (no copy). Then one
//! pass adds the bias and applies relu. The sums are the reference's in
//! another order (within `taps · ε · Σ|terms|`), NaN and infinities in `x`
//! reach the outputs whose windows hold them, and padding is multiplied as
//! zeros, as the module documents for every path.

use super::lowered::{im2col, with_tile};
use super::{Conv2dGeometry, Path};

/// Most bytes of one im2col tile.
const TILE_BYTES: usize = 4 << 20;

/// Whether `g` is an unpadded stride-1 1×1 convolution: its `x` is the
/// product's right operand as it is.
fn pointwise(g: &Conv2dGeometry) -> bool {
    g.kernel == [1, 1] && g.stride == [1, 1] && g.pad == [0; 4]
}

/// Whether `g` is an unpadded 1×1 convolution of any stride: its im2col
/// tile is `x` subsampled (a quarter of it at stride 2), cheap beside the
/// product. ResNet's stride-2 1×1 projections ran 1.6x faster as products
/// than in the direct kernel (256 -> 512 channels, 56×56 -> 28×28: 2.49
/// -> 1.52 ms on one Xeon core), whose strided panels and two-vector rows
/// leave it at half the FMA peak.
fn projection(g: &Conv2dGeometry) -> bool {
    g.kernel == [1, 1] && g.pad == [0; 4]
}

/// Whether [`run`] computes `g` on `path` (the direct kernel otherwise):
/// products of at least 32 output channels and 64 taps per group (below
/// that the GEMM's packing costs more than the lanes it fills), for
/// unpadded 1×1 convolutions, and for output rows narrower than 1.5
/// vectors with at least 64 output channels: with fewer, a product per
/// image of 32 rows ran at 38-48 G/s on an AMD Zen 5 core where the direct
/// kernel ran 84-98 (W12's second layer, 5×5 16 -> 32 on 14×14: 3.7 ->
/// 1.6 ms). Plain-loop paths keep the direct kernel's loops.
pub(super) fn prefers(path: Path, g: &Conv2dGeometry) -> bool {
    let lanes = match path {
        Path::W16 => 16,
        Path::W8 => 8,
        Path::Portable => return false,
    };
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    ocg >= 32 && icg * g.kernel[0] * g.kernel[1] >= 64 && (projection(g) || (ocg >= 64 && 2 * g.out_w() < 3 * lanes))
}

/// `y = conv(x, w) + bias` (then relu) as products; `y` overwritten.
pub(super) fn run(
    path: Path,
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) {
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let taps = icg * g.kernel[0] * g.kernel[1];
    let ([oh_n, ow_n], plane_in) = ([g.out_h(), g.out_w()], g.in_h * g.in_w);
    let plane = oh_n * ow_n;
    if plane == 0 {
        return;
    }
    let rows = (TILE_BYTES / 4 / (taps * ow_n).max(1)).clamp(1, oh_n);
    with_tile(if pointwise(g) { 0 } else { taps * rows * ow_n }, |tile| {
        for n in 0..g.batch {
            for grp in 0..g.groups {
                let x_img = &x[(n * g.in_channels + grp * icg) * plane_in..][..icg * plane_in];
                let y_img = &mut y[(n * g.out_channels + grp * ocg) * plane..][..ocg * plane];
                let a = w[grp * ocg * taps..][..ocg * taps].as_ptr();
                if pointwise(g) {
                    // SAFETY: `a` is the group's weights (ocg × taps, row
                    // stride taps), `x_img` its input (taps = icg channels
                    // × plane pixels), `y_img` its output (ocg × plane).
                    unsafe { product(path, [ocg, taps, plane], a, (x_img.as_ptr(), plane), y_img.as_mut_ptr(), plane) };
                } else {
                    for oh0 in (0..oh_n).step_by(rows) {
                        let pixels = rows.min(oh_n - oh0) * ow_n;
                        let col = &mut tile[..taps * pixels];
                        im2col(g, x_img, oh0, rows.min(oh_n - oh0), 0..taps, col);
                        // SAFETY: as above, the right operand the band's
                        // tile (taps × pixels), the output the band's
                        // columns of `y_img` (row stride plane).
                        unsafe {
                            product(
                                path,
                                [ocg, taps, pixels],
                                a,
                                (col.as_ptr(), pixels),
                                y_img[oh0 * ow_n..].as_mut_ptr(),
                                plane,
                            )
                        };
                    }
                }
                finish(y_img, bias.map(|b| &b[grp * ocg..][..ocg]), relu, plane);
            }
        }
    });
}

/// `c [m, n] (row stride rsc) = a [m, k] (row stride k) · b [k, n] (row stride rsb)`.
///
/// # Safety
/// The pointers must describe those matrices; `c` aliases neither.
unsafe fn product(
    path: Path,
    [m, k, n]: [usize; 3],
    a: *const f32,
    (b, rsb): (*const f32, usize),
    c: *mut f32,
    rsc: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        crate::gemm::product::<f32>(
            path.isa(),
            m,
            k,
            n,
            a,
            k as isize,
            1,
            b,
            rsb as isize,
            1,
            c,
            rsc as isize,
            1,
            false,
        )
    }
}

/// Adds each channel's bias to its plane, then relu (NaN stays NaN).
fn finish(y: &mut [f32], bias: Option<&[f32]>, relu: bool, plane: usize) {
    if bias.is_none() && !relu {
        return;
    }
    for (o, row) in y.chunks_exact_mut(plane).enumerate() {
        let b = bias.map_or(0.0, |b| b[o]);
        for v in row {
            let s = *v + b;
            *v = if relu && s < 0.0 { 0.0 } else { s };
        }
    }
}
