//! Products with at most [`MAX_N`] columns in the canonical form, whose
//! operands both lie along `k`: the lhs row-major (each of its `m` rows `k`
//! adjacent values) and the rhs column-major (each column `k` adjacent
//! values). That is a linear layer's `x · wᵀ` at a batch of at most 8 rows
//! with the weights stored `[out, in]` (ONNX's `Gemm` with `transB = 1`,
//! ResNet-50's classifier: `[8, 2048] · [1000, 2048]ᵀ`), computed as dot
//! products that read each weight once, where it lies.
//!
//! Why: the crate's kernels want that lhs column-major. From 8 columns
//! the product copied it so first ([`super::micro`]'s repacking: 8 MB of
//! weights written and read again for 16 M multiply-adds), below 8 the
//! crate packed it itself; ResNet-50's classifier took 1.2 ms at batch 8
//! and 1.1 at batch 1 on one Zen 5 core where reading the weights once
//! takes about 0.5.
//!
//! A register tile is `R` rows of the lhs × `C` columns of the rhs, `R·C`
//! vector accumulators over `k` (3 × 8 of AVX-512's 32 registers, 2 × 4 of
//! AVX2's 16); per step it loads a vector of each of the `R` rows and, one
//! column at a time, a vector of the column and `R` FMAs. At the end each
//! accumulator's lanes are added pairwise in a fixed tree, then the tail of
//! `k` past the last whole vector term by term. Every output is summed in
//! an order fixed by `k` and the vector width alone, so thread blocks (and
//! the thread count) never change its bits.

use std::arch::x86_64::*;

use super::micro::Product;
use crate::simd::Lanes;

/// The most columns (canonical `n`, the batch's rows) a product of this
/// kind has.
pub(super) const MAX_N: usize = super::DOT_ROWS;

/// The least `k` (the vectors' axis): below one vector of 16 every value
/// is a tail.
const MIN_K: usize = 16;

impl Product<f32> {
    /// Whether this canonical product runs as dot products: at most
    /// [`MAX_N`] columns in the whole product (so that its thread blocks
    /// decide as it does), both operands contiguous along `k`.
    pub(super) fn dots(&self) -> bool {
        self.whole_n <= MAX_N
            && self.n <= MAX_N
            && self.k >= MIN_K
            && self.lhs_cs == 1
            && self.rhs_rs == 1
            && super::dots_allowed()
    }

    /// The product as dot products in 512-bit code (16 lanes).
    ///
    /// # Safety
    /// The CPU has AVX-512F; the pointers and strides describe valid
    /// matrices as for `gemm::gemm`, `dst` aliasing neither operand, and
    /// [`Product::dots`] holds.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dots_w16(&self) {
        // SAFETY: forwarded.
        unsafe { run::<__m512, 3, 8>(self) }
    }

    /// The product as dot products in 256-bit code (8 lanes).
    ///
    /// # Safety
    /// As [`Product::dots_w16`], with AVX2 and FMA for AVX-512F.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dots_w8(&self) {
        // SAFETY: forwarded.
        unsafe { run::<__m256, 2, 4>(self) }
    }
}

/// Every output of `p`: rows in tiles of `R` (the last ones one by one),
/// within a tile of rows the columns in chunks of at most `CMAX` (8, 4, 2,
/// 1), so the tile's rows are read from the level-1 cache by every chunk.
///
/// # Safety
/// As [`Product::dots_w16`], with `V`'s features enabled.
#[inline(always)]
unsafe fn run<V: Lanes, const R: usize, const CMAX: usize>(p: &Product<f32>) {
    let mut i0 = 0;
    while i0 < p.m {
        let rows = if p.m - i0 >= R { R } else { 1 };
        let mut j0 = 0;
        while j0 < p.n {
            let left = (p.n - j0).min(CMAX);
            let cols = [8, 4, 2, 1].into_iter().find(|&c| c <= left).unwrap_or(1);
            // SAFETY: rows i0..i0 + rows and columns j0..j0 + cols lie in
            // the product; the rest is forwarded.
            unsafe {
                match (rows == R, cols) {
                    (true, 8) => tile::<V, R, 8>(p, i0, j0),
                    (true, 4) => tile::<V, R, 4>(p, i0, j0),
                    (true, 2) => tile::<V, R, 2>(p, i0, j0),
                    (true, _) => tile::<V, R, 1>(p, i0, j0),
                    (false, 8) => tile::<V, 1, 8>(p, i0, j0),
                    (false, 4) => tile::<V, 1, 4>(p, i0, j0),
                    (false, 2) => tile::<V, 1, 2>(p, i0, j0),
                    (false, _) => tile::<V, 1, 1>(p, i0, j0),
                }
            }
            j0 += cols;
        }
        i0 += rows;
    }
}

/// Outputs `(i0 + r, j0 + c)` for `r < R`, `c < C`.
///
/// # Safety
/// As [`run`]; the tile lies in the product.
#[inline(always)]
unsafe fn tile<V: Lanes, const R: usize, const C: usize>(p: &Product<f32>, i0: usize, j0: usize) {
    // SAFETY: rows of the lhs and columns of the rhs of the product, each
    // `k` values from these pointers (contiguous: `dots` holds).
    unsafe {
        let a: [*const f32; R] = std::array::from_fn(|r| p.lhs.offset((i0 + r) as isize * p.lhs_rs));
        let b: [*const f32; C] = std::array::from_fn(|c| p.rhs.offset((j0 + c) as isize * p.rhs_cs));
        let mut acc = [[V::zero(); C]; R];
        let whole = p.k / V::LANES * V::LANES;
        let mut q = 0;
        while q < whole {
            let av: [V; R] = std::array::from_fn(|r| V::load(a[r].add(q)));
            for c in 0..C {
                let bv = V::load(b[c].add(q));
                for r in 0..R {
                    acc[r][c] = av[r].fma(bv, acc[r][c]);
                }
            }
            q += V::LANES;
        }
        for r in 0..R {
            for c in 0..C {
                let mut s = lane_sum(acc[r][c]);
                for q in whole..p.k {
                    s += *a[r].add(q) * *b[c].add(q);
                }
                let d = p.dst.offset((i0 + r) as isize * p.dst_rs + (j0 + c) as isize * p.dst_cs);
                *d = if p.read_dst { p.alpha * *d + p.beta * s } else { p.beta * s };
            }
        }
    }
}

/// The lanes of `v` added pairwise: (0 + 1), (2 + 3), ..., then those
/// sums pairwise, down to one.
///
/// # Safety
/// `V`'s features are enabled.
#[inline(always)]
unsafe fn lane_sum<V: Lanes>(v: V) -> f32 {
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds 16 >= `V::LANES` values.
    unsafe { v.store(lanes.as_mut_ptr()) };
    let mut len = V::LANES;
    while len > 1 {
        len /= 2;
        for i in 0..len {
            lanes[i] = lanes[2 * i] + lanes[2 * i + 1];
        }
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::micro::Kernels;
    use crate::Isa;

    /// `x [n, k] · w [m, k]ᵀ` into `y [n, m]` row-major through the
    /// product's entry (`force` the kernel set), as the JIT calls it.
    fn linear(x: &[f32], w: &[f32], y: &mut [f32], [n, k, m]: [usize; 3], force: Option<Kernels>, acc: bool) {
        // SAFETY: row-major buffers of these sizes; `y` is its own.
        unsafe {
            Product {
                whole_m: n,
                whole_n: m,
                m: n,
                n: m,
                k,
                dst: y.as_mut_ptr(),
                dst_cs: 1,
                dst_rs: m as isize,
                read_dst: acc,
                lhs: x.as_ptr(),
                lhs_cs: 1,
                lhs_rs: k as isize,
                rhs: w.as_ptr(),
                rhs_cs: k as isize,
                rhs_rs: 1,
                alpha: if acc { 1.0 } else { 0.0 },
                beta: 1.0,
            }
            .run_with(force, Isa::native())
        }
    }

    /// Batches of 1 to 9 rows through layers of odd and even sizes, with
    /// and without accumulation, at both widths: within the rounding bound
    /// `(k + 4) · ε · Σ|terms|` of an f64 reference (the crate's path for
    /// 9 rows); NaN and infinities reach exactly their outputs.
    #[test]
    fn small_batches_match_the_reference() {
        let mut seed = 0x9e37_79b9u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        for (n, k, m) in [(1, 16, 1), (1, 2048, 1000), (8, 2048, 37), (3, 17, 5), (5, 129, 7), (7, 64, 4), (9, 40, 11)]
        {
            let mut x: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            x[k - 1] = f32::NAN; // row 0 of the output
            if n > 1 {
                x[k] = f32::INFINITY; // row 1
            }
            let y0: Vec<f32> = (0..n * m).map(|_| rnd()).collect();
            for force in [None, Some(Kernels::Wide), Some(Kernels::Narrow)] {
                for acc in [false, true] {
                    let mut y = y0.clone();
                    linear(&x, &w, &mut y, [n, k, m], force, acc);
                    for i in 0..n {
                        for j in 0..m {
                            let (mut want, mut mag) = (0f64, 0f64);
                            for q in 0..k {
                                let t = f64::from(x[i * k + q]) * f64::from(w[j * k + q]);
                                want += t;
                                mag += t.abs();
                            }
                            if acc {
                                want += f64::from(y0[i * m + j]);
                                mag += f64::from(y0[i * m + j]).abs();
                            }
                            let got = f64::from(y[i * m + j]);
                            let what = format!("{force:?} {n}x{k}x{m} acc {acc}: ({i}, {j}) = {got} vs {want}");
                            if want.is_nan() || want.is_infinite() {
                                assert!(got.is_nan() || got == want, "{what}");
                                continue;
                            }
                            let tol = (k as f64 + 4.0) * f64::from(f32::EPSILON) * mag + 1e-30;
                            assert!((got - want).abs() <= tol, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// The layer's layout takes this path up to 8 rows and not at 9, with
    /// the weights stored `[in, out]` or inside `without_dot_products`; a
    /// block of the product decides as the whole.
    #[test]
    fn the_path_is_chosen_by_the_whole_product() {
        let (x, w, mut y) = ([0f32; 4], [0f32; 4], [0f32; 4]);
        let dst = y.as_mut_ptr();
        let product = |rows: usize, block: usize, rhs_cs: isize, rhs_rs: isize| Product {
            whole_m: rows,
            whole_n: 1000,
            m: block,
            n: 1000,
            k: 2048,
            dst,
            dst_cs: 1,
            dst_rs: 1000,
            read_dst: false,
            lhs: x.as_ptr(),
            lhs_cs: 1,
            lhs_rs: 2048,
            rhs: w.as_ptr(),
            rhs_cs,
            rhs_rs,
            alpha: 0.0,
            beta: 1.0,
        };
        assert!(product(8, 8, 2048, 1).canonical().dots());
        assert!(product(1, 1, 2048, 1).canonical().dots());
        assert!(product(8, 4, 2048, 1).canonical().dots(), "a block of a batch of 8");
        assert!(!product(9, 4, 2048, 1).canonical().dots(), "a block of a batch of 9");
        assert!(!product(8, 8, 1, 1000).canonical().dots(), "weights stored [in, out]");
        let inside = crate::gemm::without_dot_products(|| product(8, 8, 2048, 1).canonical().dots());
        assert!(!inside, "inside without_dot_products");
        assert!(product(8, 8, 2048, 1).canonical().dots(), "after it");
    }
}
