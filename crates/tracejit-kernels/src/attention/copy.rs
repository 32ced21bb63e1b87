//! Moving a task's own tile between the row-major operands and its
//! transposed scratch (`[cols, TILE]`, the tile's rows along the lanes):
//! whole `L × L` blocks through [`Vector::transpose`] (in registers), the
//! edges one value at a time. Exact, apart from the `scale` product.
//!
//! Why blocks: a value-by-value transposition is what LLVM turns into
//! AVX-512 scatters, which took a quarter of W9's forward on Zen 4.

use super::plan::TILE;
use super::vector::Vector;

/// `dst[c·TILE + r] = src[r·ss + c] · scale` for `r < n`, `c < cols`,
/// and 0 for `n ≤ r < width`.
///
/// # Safety
/// `src` has `n` rows of `cols` readable values `ss` apart, `dst` `cols` rows of
/// `width ≤ TILE` writable ones (`width` a multiple of the lanes, at least
/// `n`); the features of `V`.
#[inline(always)]
pub(super) unsafe fn pack<V: Vector>(
    src: *const f32,
    ss: usize,
    n: usize,
    cols: usize,
    scale: f32,
    dst: *mut f32,
    width: usize,
) {
    let l = V::LANES;
    let (full_r, full_c) = (n / l * l, cols / l * l);
    // SAFETY: blocks within `n × cols` and `cols × width`.
    unsafe {
        for r in (0..full_r).step_by(l) {
            for c in (0..full_c).step_by(l) {
                V::transpose(src.add(r * ss + c), ss, dst.add(c * TILE + r), TILE, scale);
            }
        }
        for r in 0..width {
            let from = if r < full_r { full_c } else { 0 };
            for c in from..cols {
                *dst.add(c * TILE + r) = if r < n { *src.add(r * ss + c) * scale } else { 0.0 };
            }
        }
    }
}

/// `dst[r·cols + c] = src[c·TILE + r] · scale` for `r < n`, `c < cols`.
///
/// # Safety
/// `src` has `cols` rows of `n` readable values (`TILE` apart), `dst` `n`
/// rows of `cols` writable ones; the features of `V`.
#[inline(always)]
pub(super) unsafe fn unpack<V: Vector>(src: *const f32, n: usize, cols: usize, scale: f32, dst: *mut f32) {
    let l = V::LANES;
    let (full_r, full_c) = (n / l * l, cols / l * l);
    // SAFETY: blocks within `cols × n` and `n × cols`.
    unsafe {
        for r in (0..full_r).step_by(l) {
            for c in (0..full_c).step_by(l) {
                V::transpose(src.add(c * TILE + r), TILE, dst.add(r * cols + c), cols, scale);
            }
        }
        for r in 0..n {
            let from = if r < full_r { full_c } else { 0 };
            for c in from..cols {
                *dst.add(r * cols + c) = *src.add(c * TILE + r) * scale;
            }
        }
    }
}

/// Zeros `rows` rows of `width` values, `TILE` apart.
///
/// # Safety
/// `dst` has those rows, writable; `width` a multiple of the lanes.
#[inline(always)]
pub(super) unsafe fn zero<V: Vector>(dst: *mut f32, rows: usize, width: usize) {
    // SAFETY: the caller's rows.
    unsafe {
        let z = V::zero();
        for c in 0..rows {
            for v in (0..width).step_by(V::LANES) {
                z.store(dst.add(c * TILE + v));
            }
        }
    }
}
