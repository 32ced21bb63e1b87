//! f32 row sums and products in the reference's order, eight rows to the
//! lanes of an AVX register.
//!
//! Why: the reference folds each row's elements one after the other, so a
//! row reduction cannot be vectorized along the row without changing its
//! bits. [`super::fold`] runs sixteen rows' chains side by side in scalar
//! accumulators, but the compiler assembled each step's sixteen values
//! with scalar loads and shuffles and kept the accumulators in memory: an
//! eager `mean` over [1024, 1024] took ~0.3 ms on an AMD Zen 5, and the two
//! of layer norm were half of eager W4 (1.8x PyTorch eager's time).
//!
//! Here eight rows' next eight values are loaded as eight vectors and
//! transposed in registers, so that each of the eight resulting column
//! vectors holds one value of every row: adding them to the accumulator in
//! column order is exactly each row's sequential fold, lane by lane (the
//! same IEEE operation, the accumulator first, in the same order; no FMA,
//! no reassociation), so every bit, signed zeros included, matches the
//! scalar fold (a NaN stays a NaN; which of two NaNs' payloads survives
//! is, as in the scalar code, not part of Rust's float semantics). Two groups of eight rows run side by side to hide the add
//! latency behind the shuffles.

/// The fold of a row: `acc + x` (sum, mean) or `acc * x` (product).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Combine {
    /// `acc + x`.
    Add,
    /// `acc * x`.
    Mul,
}

impl Combine {
    /// One step of the reference's scalar fold.
    fn step(self, acc: f32, x: f32) -> f32 {
        match self {
            Combine::Add => acc + x,
            Combine::Mul => acc * x,
        }
    }
}

/// Folds each `n`-element row of `flat` (row-major, `flat.len()` a
/// multiple of `n`, `n > 0`) from `init`, appending one value per row to
/// `out`, with the bits of the sequential fold. Returns `false`, having
/// done nothing, unless `T` is `f32` and the CPU has AVX: the caller's
/// generic path then runs.
pub(super) fn fold_rows<T: 'static>(combine: Combine, init: f32, flat: &[T], n: usize, out: &mut Vec<T>) -> bool {
    use std::any::TypeId;
    if TypeId::of::<T>() != TypeId::of::<f32>() || !has_avx() {
        return false;
    }
    // SAFETY: `T` is `f32` (same type id), so the slice and the vector are
    // an f32 slice and vector.
    let (flat, out) = unsafe {
        (
            std::slice::from_raw_parts(flat.as_ptr().cast::<f32>(), flat.len()),
            &mut *(out as *mut Vec<T>).cast::<Vec<f32>>(),
        )
    };
    out.reserve(flat.len() / n);
    let mut groups = flat.chunks_exact(16 * n);
    for group in &mut groups {
        let mut acc = [init; 16];
        // SAFETY: the CPU has AVX (checked above); `group` holds 16 rows
        // of `n` values.
        unsafe { x86::fold16(combine, group.as_ptr(), n, &mut acc) };
        out.extend_from_slice(&acc);
    }
    for row in groups.remainder().chunks_exact(n) {
        out.push(row.iter().fold(init, |a, &x| combine.step(a, x)));
    }
    true
}

#[cfg(target_arch = "x86_64")]
fn has_avx() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    /// Never called: [`super::has_avx`] is false off x86-64.
    pub(super) unsafe fn fold16(_: super::Combine, _: *const f32, _: usize, _: &mut [f32; 16]) {
        unreachable!("AVX row folds run on x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Combine;

    /// Folds 16 rows of `n` values starting at `rows` into `acc` (which
    /// holds each row's starting value), in each row's order.
    ///
    /// # Safety
    /// The CPU has AVX; `rows` points to `16 * n` readable f32 values.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn fold16(combine: Combine, rows: *const f32, n: usize, acc: &mut [f32; 16]) {
        match combine {
            // SAFETY: forwarded.
            Combine::Add => unsafe { fold16_with::<false>(rows, n, acc) },
            // SAFETY: forwarded.
            Combine::Mul => unsafe { fold16_with::<true>(rows, n, acc) },
        }
    }

    /// [`fold16`] with the step chosen at compile time.
    #[target_feature(enable = "avx")]
    unsafe fn fold16_with<const MUL: bool>(rows: *const f32, n: usize, acc: &mut [f32; 16]) {
        // SAFETY: `acc` holds 16 values.
        let (mut lo, mut hi) = unsafe { (_mm256_loadu_ps(acc.as_ptr()), _mm256_loadu_ps(acc.as_ptr().add(8))) };
        let whole = n - n % 8;
        let mut k = 0;
        while k < whole {
            // SAFETY: rows `0..16` hold `n` values each and `k + 8 <= n`.
            let (a, b) = unsafe { (columns(rows.add(k), n), columns(rows.add(8 * n + k), n)) };
            for (x, y) in a.into_iter().zip(b) {
                (lo, hi) = if MUL {
                    (_mm256_mul_ps(lo, x), _mm256_mul_ps(hi, y))
                } else {
                    (_mm256_add_ps(lo, x), _mm256_add_ps(hi, y))
                };
            }
            k += 8;
        }
        // SAFETY: `acc` holds 16 values.
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), lo);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
        }
        for (i, a) in acc.iter_mut().enumerate() {
            for kk in whole..n {
                // SAFETY: row `i < 16`, column `kk < n`.
                let x = unsafe { *rows.add(i * n + kk) };
                *a = if MUL { *a * x } else { *a + x };
            }
        }
    }

    /// The 8 × 8 block of the 8 rows (each `n` apart) starting at `p`,
    /// transposed: vector `j` holds column `j`, one value of each row.
    ///
    /// # Safety
    /// The CPU has AVX; 8 values are readable at `p + i * n` for `i < 8`.
    #[target_feature(enable = "avx")]
    #[inline]
    unsafe fn columns(p: *const f32, n: usize) -> [__m256; 8] {
        // SAFETY: forwarded.
        let r = unsafe {
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(n)),
                _mm256_loadu_ps(p.add(2 * n)),
                _mm256_loadu_ps(p.add(3 * n)),
                _mm256_loadu_ps(p.add(4 * n)),
                _mm256_loadu_ps(p.add(5 * n)),
                _mm256_loadu_ps(p.add(6 * n)),
                _mm256_loadu_ps(p.add(7 * n)),
            ]
        };
        // Pairs of rows interleaved: [r0[0], r1[0], r0[1], r1[1] | r0[4], ...].
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        // Four rows' values of columns j and j + 4 in each 128-bit half.
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        // Low halves give columns 0-3, high halves columns 4-7.
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{fold_rows, Combine};

    /// Values that make the order visible: large and tiny magnitudes,
    /// signed zeros, subnormals, infinities and NaNs of several payloads.
    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => -4.0f32..4.0,
            2 => prop::num::f32::ANY,
            1 => Just(-0.0f32),
            1 => Just(0.0f32),
            1 => Just(f32::INFINITY),
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::from_bits(0x7fc0_0001)),
            1 => Just(f32::from_bits(0xffc0_0123)),
            1 => Just(1e-40f32),
            1 => Just(3.0e38f32),
        ]
    }

    proptest! {
        /// Every row's value has the bits of the sequential fold, for row
        /// lengths around the 8-value blocks and row counts around the
        /// 16-row groups.
        #[test]
        fn rows_fold_with_the_sequential_bits(
            n in 1usize..40,
            rows in 1usize..40,
            mul in any::<bool>(),
            init in prop_oneof![Just(0.0f32), Just(1.0f32), Just(-0.0f32)],
            seed in prop::collection::vec(value(), 1..64),
        ) {
            let flat: Vec<f32> = (0..n * rows).map(|i| seed[(i * 7 + i / 3) % seed.len()]).collect();
            let combine = if mul { Combine::Mul } else { Combine::Add };
            let mut got = vec![42.0f32];
            if !fold_rows(combine, init, &flat, n, &mut got) {
                // No AVX here: nothing to compare, the generic path runs.
                return Ok(());
            }
            prop_assert_eq!(got.len(), rows + 1);
            prop_assert_eq!(got[0], 42.0);
            for (r, row) in flat.chunks_exact(n).enumerate() {
                let want = row.iter().fold(init, |a, &x| combine.step(a, x));
                // A NaN's payload is not part of Rust's float semantics
                // (RFC 3514: the compiler may commute an add of two NaNs);
                // every other result keeps its bits, signed zeros included.
                let same = if want.is_nan() { got[r + 1].is_nan() } else { got[r + 1].to_bits() == want.to_bits() };
                prop_assert!(same, "row {} of {:?}: {} vs {}", r, row, got[r + 1], want);
            }
        }
    }

    #[test]
    fn other_element_types_are_left_to_the_generic_path() {
        let mut out = Vec::<f64>::new();
        assert!(!fold_rows(Combine::Add, 0.0, &[1.0f64, 2.0], 2, &mut out));
        assert!(out.is_empty());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn runs_on_a_cpu_with_avx() {
        // The test above compares only where this path runs: say where.
        let mut out = Vec::<f32>::new();
        let ran = fold_rows(Combine::Add, 0.0, &[1.0f32; 48], 3, &mut out);
        assert_eq!(ran, std::arch::is_x86_feature_detected!("avx"));
        if ran {
            assert_eq!(out, vec![3.0; 16]);
        }
    }
}
