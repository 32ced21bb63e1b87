//! The row layer norm `y = ((h - mean(h)) · rsqrt(mean((h - mean(h))²) + ε))
//! · γ + β` over f32 rows, with `h` the sum of one to three inputs (a
//! residual stream and a bias added first, as transformers write it), in
//! 512-bit AVX-512 or 256-bit AVX2 code; the JIT runs its f32 layer-norm
//! regions through [`rows`].
//!
//! Why: the generated kernel of such a region runs its three passes over
//! the row in Cranelift's 128-bit vectors, about 13 cycles per 16 values on
//! an AMD Zen 5 (W4, a 1024 × 1024 layer norm, 0.21 ns a value whether the
//! rows sit in the level-2 cache or not); here a pass is a few 16- or
//! 8-lane instructions per vector.
//!
//! Results: every elementwise step rounds as the reference does, one
//! operation at a time (no fused multiply-add): `h = (t₀ + t₁) + t₂`,
//! `d = h − mean`, `d · d`, `((d · r) · γ) + β`; the mean divides the sum by
//! `n`, and `r = 1 / sqrt(var + ε)`. The two sums add in four partial
//! vectors of 8 or 16 lanes, by index from the row's start, then the tail
//! in order, so the bits depend on the row alone (not on where its buffers
//! lie or how the rows are shared among threads); the generated kernel adds
//! in another order, so the two agree within the sums' rounding.

use crate::Width;

/// An input of [`rows`]: its first row's first value and the byte stride
/// from one row to the next (0 for an input broadcast along the rows, such
/// as `γ`); values are contiguous within a row.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    /// The first row's first value.
    pub ptr: *const f32,
    /// Bytes from one row to the next.
    pub row_stride: isize,
}

/// An output of [`rows`], laid out as an [`Operand`].
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// The first row's first value.
    pub ptr: *mut f32,
    /// Bytes from one row to the next.
    pub row_stride: isize,
}

/// The `ε` added to the variance: one value, or one per row (the value at
/// the operand's row pointer).
#[derive(Clone, Copy, Debug)]
pub enum Epsilon {
    /// The same value for every row.
    Value(f32),
    /// A value per row (a stride of 0 gives every row the same one).
    PerRow(Operand),
}

/// `rows` rows of `n` values: `y = layer_norm(h)` with `h = (terms[0] +
/// terms[1]) + terms[2]` (one to three terms), also written to `h_out`
/// when given, at width `w`.
///
/// ```
/// use tracejit_kernels::layer_norm::{rows, Epsilon, Operand, Output};
/// use tracejit_kernels::Isa;
///
/// let (x, ones, zeros) = ([1.0f32, 2.0, 3.0, 4.0], [1.0f32; 4], [0.0f32; 4]);
/// let mut y = [0.0f32; 4];
/// let at = |p: &[f32]| Operand { ptr: p.as_ptr(), row_stride: 0 };
/// if let Some(w) = Isa::native().width() {
///     // SAFETY: one row of four values in each buffer; `width` found the features.
///     unsafe {
///         let out = Output { ptr: y.as_mut_ptr(), row_stride: 0 };
///         rows(1, 4, &[at(&x)], at(&ones), at(&zeros), Epsilon::Value(0.0), out, None, w);
///     }
///     assert!((y[0] + 1.3416408).abs() < 1e-6 && (y[3] - 1.3416408).abs() < 1e-6);
/// }
/// ```
///
/// # Safety
/// Every operand addresses `rows` rows of `n` readable values at its
/// stride (an `Epsilon::PerRow` one value per row), the outputs `rows`
/// rows of `n` writable values aliasing no input and each other; the CPU
/// has the features of `w` ([`crate::Isa::width`]).
///
/// # Panics
/// If `terms` has no element or more than three.
#[allow(clippy::too_many_arguments, reason = "the operands of one layer norm")]
pub unsafe fn rows(
    rows: usize,
    n: usize,
    terms: &[Operand],
    gamma: Operand,
    beta: Operand,
    eps: Epsilon,
    y: Output,
    h_out: Option<Output>,
    w: Width,
) {
    assert!((1..=3).contains(&terms.len()), "layer_norm::rows: {} terms (1 to 3)", terms.len());
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        let p = simd::Rows { terms, gamma, beta, eps, y, h_out };
        match w {
            Width::W16 => simd::rows_x16(rows, n, &p),
            Width::W8 => simd::rows_x8(rows, n, &p),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, terms, gamma, beta, eps, y, h_out, w);
        unreachable!("no vector width exists off x86_64");
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Epsilon, Operand, Output};
    use crate::simd::lanes::Lanes;

    /// The operands of [`super::rows`].
    pub(super) struct Rows<'a> {
        pub terms: &'a [Operand],
        pub gamma: Operand,
        pub beta: Operand,
        pub eps: Epsilon,
        pub y: Output,
        pub h_out: Option<Output>,
    }

    macro_rules! entry_point {
        ($name:ident, $v:ty, $features:literal) => {
            /// [`super::rows`] at this width.
            ///
            /// # Safety
            /// As [`super::rows`]; the CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(rows: usize, n: usize, p: &Rows<'_>) {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match p.terms.len() {
                        1 => all_rows::<$v, 1>(rows, n, p),
                        2 => all_rows::<$v, 2>(rows, n, p),
                        _ => all_rows::<$v, 3>(rows, n, p),
                    }
                }
            }
        };
    }
    entry_point!(rows_x8, __m256, "avx2,fma");
    entry_point!(rows_x16, __m512, "avx512f");

    /// Every row, with `K` terms.
    #[inline(always)]
    unsafe fn all_rows<V: Lanes, const K: usize>(rows: usize, n: usize, p: &Rows<'_>) {
        let at = |o: Operand, r: isize| o.ptr.wrapping_byte_offset(r * o.row_stride);
        for r in 0..rows as isize {
            let terms: [*const f32; K] = std::array::from_fn(|k| at(p.terms[k], r));
            let eps = match p.eps {
                Epsilon::Value(e) => e,
                // SAFETY: the caller's contract: one value per row.
                Epsilon::PerRow(o) => unsafe { *at(o, r) },
            };
            let out = |o: Output| o.ptr.wrapping_byte_offset(r * o.row_stride);
            let row =
                Row { n, terms, gamma: at(p.gamma, r), beta: at(p.beta, r), eps, y: out(p.y), h: p.h_out.map(out) };
            // SAFETY: the caller's contract: this row of every operand.
            unsafe { row.run::<V>() }
        }
    }

    /// One row's pointers.
    struct Row<const K: usize> {
        n: usize,
        terms: [*const f32; K],
        gamma: *const f32,
        beta: *const f32,
        eps: f32,
        y: *mut f32,
        h: Option<*mut f32>,
    }

    impl<const K: usize> Row<K> {
        /// `h` at `i` as a vector.
        #[inline(always)]
        unsafe fn h<V: Lanes>(&self, i: usize) -> V {
            // SAFETY: the caller's `i + V::LANES <= n`.
            unsafe {
                let mut h = V::load(self.terms[0].add(i));
                for t in &self.terms[1..] {
                    h = h.add(V::load(t.add(i)));
                }
                h
            }
        }

        /// `h` at `i` as a scalar, rounding as [`Row::h`] does.
        #[inline(always)]
        unsafe fn h1(&self, i: usize) -> f32 {
            // SAFETY: the caller's `i < n`.
            unsafe { self.terms[1..].iter().fold(*self.terms[0].add(i), |h, t| h + *t.add(i)) }
        }

        /// Sums `f(h)` over the row: four partial vectors by index from the
        /// row's start, then one more vector, the lanes in order, the tail.
        #[inline(always)]
        unsafe fn sum<V: Lanes>(&self, f: impl Fn(V) -> V, f1: impl Fn(f32) -> f32) -> f32 {
            let (n, w) = (self.n, V::LANES);
            // SAFETY: every index below keeps `i + w <= n` (vectors) or
            // `i < n` (scalars).
            unsafe {
                let mut acc = [V::zero(); 4];
                let mut i = 0;
                while i + 4 * w <= n {
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = a.add(f(self.h::<V>(i + k * w)));
                    }
                    i += 4 * w;
                }
                while i + w <= n {
                    acc[0] = acc[0].add(f(self.h::<V>(i)));
                    i += w;
                }
                let v = acc[0].add(acc[1]).add(acc[2].add(acc[3]));
                let mut lanes = [0.0f32; 16];
                v.store(lanes.as_mut_ptr());
                let mut s = lanes[..w].iter().fold(0.0f32, |s, &l| s + l);
                while i < n {
                    s += f1(self.h1(i));
                    i += 1;
                }
                s
            }
        }

        /// The three passes: the mean (writing `h` if asked), the variance,
        /// the output.
        #[inline(always)]
        unsafe fn run<V: Lanes>(&self) {
            let (n, w) = (self.n, V::LANES);
            // SAFETY: the caller's contract: `n` values at every pointer;
            // indices as in `sum`.
            unsafe {
                if let Some(out) = self.h {
                    let mut i = 0;
                    while i + w <= n {
                        self.h::<V>(i).store(out.add(i));
                        i += w;
                    }
                    while i < n {
                        *out.add(i) = self.h1(i);
                        i += 1;
                    }
                }
                let mean = self.sum::<V>(|h| h, |h| h) / n as f32;
                let m = V::splat(mean);
                let var = self.sum::<V>(
                    |h| {
                        let d = h.sub(m);
                        d.mul(d)
                    },
                    |h| (h - mean) * (h - mean),
                ) / n as f32;
                let r = 1.0 / (var + self.eps).sqrt();
                let rv = V::splat(r);
                let mut i = 0;
                while i + w <= n {
                    let d = self.h::<V>(i).sub(m);
                    let t = d.mul(rv).mul(V::load(self.gamma.add(i))).add(V::load(self.beta.add(i)));
                    t.store(self.y.add(i));
                    i += w;
                }
                while i < n {
                    *self.y.add(i) = (self.h1(i) - mean) * r * *self.gamma.add(i) + *self.beta.add(i);
                    i += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;

    /// The reference's steps in f32, one rounding per operation, sums in
    /// order; and the f64 value.
    fn reference(terms: &[Vec<f32>], g: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
        let n = g.len();
        let h: Vec<f32> = (0..n).map(|i| terms[1..].iter().fold(terms[0][i], |h, t| h + t[i])).collect();
        let mean = h.iter().sum::<f32>() / n as f32;
        let var = h.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let r = 1.0 / (var + eps).sqrt();
        (0..n).map(|i| (h[i] - mean) * r * g[i] + b[i]).collect()
    }

    #[test]
    fn matches_the_reference_steps_at_every_width_and_length() {
        let Some(native) = Isa::native().width() else { return };
        let widths = if native == Width::W16 { vec![Width::W16, Width::W8] } else { vec![Width::W8] };
        for n in [1usize, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 100, 384, 1023] {
            for k in 1..=3 {
                let val = |s: usize, i: usize| (((i * 7919 + s * 104_729) % 1000) as f32 - 500.0) * 0.01;
                let terms: Vec<Vec<f32>> = (0..k).map(|s| (0..n).map(|i| val(s, i)).collect()).collect();
                let g: Vec<f32> = (0..n).map(|i| 0.5 + val(7, i).abs() * 0.1).collect();
                let b: Vec<f32> = (0..n).map(|i| val(8, i) * 0.1).collect();
                let want = reference(&terms, &g, &b, 1e-5);
                for &w in &widths {
                    let mut y = vec![0.0f32; n];
                    let mut h = vec![0.0f32; n];
                    let ops: Vec<Operand> = terms.iter().map(|t| Operand { ptr: t.as_ptr(), row_stride: 0 }).collect();
                    let op = |v: &[f32]| Operand { ptr: v.as_ptr(), row_stride: 0 };
                    // SAFETY: one row of `n` values in every buffer.
                    unsafe {
                        rows(
                            1,
                            n,
                            &ops,
                            op(&g),
                            op(&b),
                            Epsilon::Value(1e-5),
                            Output { ptr: y.as_mut_ptr(), row_stride: 0 },
                            Some(Output { ptr: h.as_mut_ptr(), row_stride: 0 }),
                            w,
                        )
                    };
                    // Sums in another order: within n·ε of the normalized
                    // values' scale (|y| is a few units).
                    let tol = (n as f32 + 8.0) * f32::EPSILON * 8.0;
                    for i in 0..n {
                        assert!(
                            (y[i] - want[i]).abs() <= tol * (1.0 + want[i].abs()),
                            "n {n}, k {k}, {w:?}, {i}: {} vs {}",
                            y[i],
                            want[i]
                        );
                        let hi = terms[1..].iter().fold(terms[0][i], |s, t| s + t[i]);
                        assert_eq!(h[i].to_bits(), hi.to_bits());
                    }
                }
            }
        }
    }
}
