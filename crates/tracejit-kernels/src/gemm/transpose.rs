//! A row-major matrix copied out column-major, for the products whose
//! left-hand operand the `gemm` crate would otherwise pack from rows.
//!
//! Why a kernel of its own: ndarray's `assign` of a transposed view walks
//! the destination at a stride of the row length and took 560 µs for a
//! 512×512 f32 matrix here; 8×8 tiles transposed in AVX registers move it
//! at close to the cache's copy rate.

/// Writes the `rows×cols` matrix at `src` (row stride `rs`, column stride
/// 1) into `dst` column-major: element `(i, j)` at `dst[j·rows + i]`.
///
/// # Safety
/// `src` must address `rows` rows of `cols` values at stride `rs` (`rs`
/// may be negative); `dst` must hold `rows · cols` values.
pub(crate) unsafe fn to_column_major(src: *const f32, rows: usize, cols: usize, rs: isize, dst: &mut [f32]) {
    assert!(dst.len() >= rows * cols, "transpose: {} values for {rows}x{cols}", dst.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; the bounds are forwarded from the caller.
        unsafe { tiles_avx(src, rows, cols, rs, dst.as_mut_ptr()) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { scalar(src, 0, rows, 0, cols, rows, rs, dst.as_mut_ptr()) }
}

/// Rows `r0..r1`, columns `c0..c1` of the transpose, one value at a time.
///
/// # Safety
/// As [`to_column_major`], for the whole `rows`-row matrix.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar(src: *const f32, r0: usize, r1: usize, c0: usize, c1: usize, rows: usize, rs: isize, dst: *mut f32) {
    for i in r0..r1 {
        for j in c0..c1 {
            // SAFETY: (i, j) lies inside both matrices.
            unsafe { *dst.add(j * rows + i) = *src.offset(i as isize * rs + j as isize) };
        }
    }
}

/// [`to_column_major`] in 8×8 tiles; the ragged edges one value at a time.
///
/// # Safety
/// As [`to_column_major`], and the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn tiles_avx(src: *const f32, rows: usize, cols: usize, rs: isize, dst: *mut f32) {
    use std::arch::x86_64::*;
    let (full_r, full_c) = (rows / 8 * 8, cols / 8 * 8);
    // Strips of 16 destination rows (source columns), walked down the
    // source: every line read and every line written is used whole before
    // it leaves L1, and the 16 destination rows fill as sequential streams
    // (tiles in source-row order took 88 µs for 512×512, 1.5x this).
    for strip in (0..full_c).step_by(16) {
        for i in (0..full_r).step_by(8) {
            for j in (strip..(strip + 16).min(full_c)).step_by(8) {
                // SAFETY: rows i..i+8 and columns j..j+8 are inside both
                // matrices (full tiles only); unaligned loads and stores.
                unsafe {
                    let at = |r: usize| _mm256_loadu_ps(src.offset((i + r) as isize * rs + j as isize));
                    let (r0, r1, r2, r3) = (at(0), at(1), at(2), at(3));
                    let (r4, r5, r6, r7) = (at(4), at(5), at(6), at(7));
                    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
                    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
                    let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
                    let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
                    let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
                    let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
                    let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
                    let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
                    let put = |c: usize, v: __m256| _mm256_storeu_ps(dst.add((j + c) * rows + i), v);
                    put(0, _mm256_permute2f128_ps::<0x20>(u0, u4));
                    put(1, _mm256_permute2f128_ps::<0x20>(u1, u5));
                    put(2, _mm256_permute2f128_ps::<0x20>(u2, u6));
                    put(3, _mm256_permute2f128_ps::<0x20>(u3, u7));
                    put(4, _mm256_permute2f128_ps::<0x31>(u0, u4));
                    put(5, _mm256_permute2f128_ps::<0x31>(u1, u5));
                    put(6, _mm256_permute2f128_ps::<0x31>(u2, u6));
                    put(7, _mm256_permute2f128_ps::<0x31>(u3, u7));
                }
            }
        }
    }
    // SAFETY: the edges lie inside both matrices.
    unsafe {
        scalar(src, 0, full_r, full_c, cols, rows, rs, dst);
        scalar(src, full_r, rows, 0, cols, rows, rs, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size around the tile edges, both row directions, against the
    /// definition.
    #[test]
    fn matches_the_definition_at_ragged_sizes_and_negative_strides() {
        for rows in [0, 1, 3, 7, 8, 9, 16, 17, 33] {
            for cols in [0, 1, 5, 8, 15, 24, 31] {
                let pad = 3;
                let rs = cols + pad;
                let src: Vec<f32> = (0..rows * rs).map(|x| x as f32 * 0.5 - 7.0).collect();
                for reversed in [false, true] {
                    let (base, stride) =
                        if reversed && rows > 0 { ((rows - 1) * rs, -(rs as isize)) } else { (0, rs as isize) };
                    let mut dst = vec![f32::NAN; rows * cols];
                    // SAFETY: `src` holds `rows` rows of `rs >= cols` values.
                    unsafe { to_column_major(src.as_ptr().add(base), rows, cols, stride, &mut dst) };
                    for i in 0..rows {
                        for j in 0..cols {
                            let want = src[(base as isize + i as isize * stride) as usize + j];
                            assert_eq!(
                                dst[j * rows + i].to_bits(),
                                want.to_bits(),
                                "{rows}x{cols} rev {reversed} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
