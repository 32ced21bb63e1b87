//! The 2x2 stride-2 loops ([`super::fast`]) in 512-bit (AVX-512F) or
//! 256-bit (AVX2) code: a vector holds the two columns of `LANES / 2`
//! windows of one input row, interleaved; adjacent lanes are swapped to
//! bring a window's two columns together, and the even lanes (one per
//! window) are packed into the output. Every lane runs the scalar loops'
//! operations in their order (the same compares and selects, the same
//! additions), so the results are their bits; a row's last windows that
//! do not fill a vector take masked loads and stores.

use std::arch::x86_64::*;

use super::fast::Pass;
use super::Pool2dGeometry;
use crate::Width;

/// The vector operations of the 2x2 loops.
///
/// # Safety
/// Every method needs the CPU features of its width enabled in the caller;
/// loads and stores need the values they touch.
trait Pairs: Copy {
    /// A lane mask.
    type Mask: Copy;
    /// f32 lanes.
    const LANES: usize;
    /// `LANES` values.
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` values.
    unsafe fn store(self, p: *mut f32);
    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self;
    /// `self + o`.
    unsafe fn add(self, o: Self) -> Self;
    /// `self / o`.
    unsafe fn div(self, o: Self) -> Self;
    /// Lanes `2i` and `2i + 1` exchanged.
    unsafe fn swap(self) -> Self;
    /// `v > m || v is NaN` per lane (PyTorch's max update).
    unsafe fn takes(v: Self, m: Self) -> Self::Mask;
    /// `a` where `m`, else `b`.
    unsafe fn select(m: Self::Mask, a: Self, b: Self) -> Self;
    /// `a && b`.
    unsafe fn and(a: Self::Mask, b: Self::Mask) -> Self::Mask;
    /// `!a && b`.
    unsafe fn and_not(a: Self::Mask, b: Self::Mask) -> Self::Mask;
    /// All lanes set.
    unsafe fn all() -> Self::Mask;
    /// Even lanes of `even`, odd lanes of `odd`.
    unsafe fn even_odd(even: Self, odd: Self) -> Self;
    /// `LANES / 2` values, each in two adjacent lanes.
    unsafe fn load_dup(p: *const f32) -> Self;
    /// The even lanes to `LANES / 2` values.
    unsafe fn store_even(self, p: *mut f32);
    /// Lanes `0..n` from `p`, the others zero (`n < LANES`).
    unsafe fn load_part(p: *const f32, n: usize) -> Self;
    /// Lanes `0..n` to `p` (`n < LANES`).
    unsafe fn store_part(self, p: *mut f32, n: usize);
    /// [`Pairs::load_dup`] of `n < LANES / 2` values.
    unsafe fn load_dup_part(p: *const f32, n: usize) -> Self;
    /// [`Pairs::store_even`] of `n < LANES / 2` values.
    unsafe fn store_even_part(self, p: *mut f32, n: usize);
}

impl Pairs for __m512 {
    type Mask = __mmask16;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn swap(self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_permute_ps::<0xb1>(self) }
    }
    #[inline(always)]
    unsafe fn takes(v: Self, m: Self) -> __mmask16 {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, m) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) }
    }
    #[inline(always)]
    unsafe fn select(m: __mmask16, a: Self, b: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_mask_blend_ps(m, b, a) }
    }
    #[inline(always)]
    unsafe fn and(a: __mmask16, b: __mmask16) -> __mmask16 {
        a & b
    }
    #[inline(always)]
    unsafe fn and_not(a: __mmask16, b: __mmask16) -> __mmask16 {
        !a & b
    }
    #[inline(always)]
    unsafe fn all() -> __mmask16 {
        0xffff
    }
    #[inline(always)]
    unsafe fn even_odd(even: Self, odd: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm512_mask_blend_ps(0xaaaa, even, odd) }
    }
    #[inline(always)]
    unsafe fn load_dup(p: *const f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe {
            let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(p)))
        }
    }
    #[inline(always)]
    unsafe fn store_even(self, p: *mut f32) {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe {
            let idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm256_storeu_ps(p, _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, self)))
        }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> Self {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, p) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut f32, n: usize) {
        // SAFETY: the trait's contract; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as u16, self) }
    }
    #[inline(always)]
    unsafe fn load_dup_part(p: *const f32, n: usize) -> Self {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe {
            let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, p))
        }
    }
    #[inline(always)]
    unsafe fn store_even_part(self, p: *mut f32, n: usize) {
        // SAFETY: the trait's contract; masked-off lanes are not written.
        unsafe {
            let idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as u16, _mm512_permutexvar_ps(idx, self))
        }
    }
}

impl Pairs for __m256 {
    type Mask = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn swap(self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_permute_ps::<0xb1>(self) }
    }
    #[inline(always)]
    unsafe fn takes(v: Self, m: Self) -> __m256 {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_or_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(v, m), _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)) }
    }
    #[inline(always)]
    unsafe fn select(m: __m256, a: Self, b: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_blendv_ps(b, a, m) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_and_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn and_not(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_andnot_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn all() -> __m256 {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_castsi256_ps(_mm256_set1_epi32(-1)) }
    }
    #[inline(always)]
    unsafe fn even_odd(even: Self, odd: Self) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe { _mm256_blend_ps::<0xaa>(even, odd) }
    }
    #[inline(always)]
    unsafe fn load_dup(p: *const f32) -> Self {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe {
            let idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), idx)
        }
    }
    #[inline(always)]
    unsafe fn store_even(self, p: *mut f32) {
        // SAFETY: the trait's contract (the features; the memory touched).
        unsafe {
            let idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0);
            _mm_storeu_ps(p, _mm256_castps256_ps128(_mm256_permutevar8x32_ps(self, idx)))
        }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> Self {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe { _mm256_maskload_ps(p, first8(n)) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut f32, n: usize) {
        // SAFETY: the trait's contract; masked-off lanes are not written.
        unsafe { _mm256_maskstore_ps(p, first8(n), self) }
    }
    #[inline(always)]
    unsafe fn load_dup_part(p: *const f32, n: usize) -> Self {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe {
            let idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            let low = _mm_maskload_ps(p, _mm256_castsi256_si128(first8(n)));
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(low), idx)
        }
    }
    #[inline(always)]
    unsafe fn store_even_part(self, p: *mut f32, n: usize) {
        // SAFETY: the trait's contract; masked-off lanes are not written.
        unsafe {
            let idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0);
            let even = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(self, idx));
            _mm_maskstore_ps(p, _mm256_castsi256_si128(first8(n)), even)
        }
    }
}

/// The AVX2 mask of lanes `0..n` (negative lanes are taken).
///
/// # Safety
/// AVX2 is enabled in the caller.
#[inline(always)]
unsafe fn first8(n: usize) -> __m256i {
    // SAFETY: the caller's features.
    unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
}

/// One plane of `pass` at width `w` (the CPU has it): `src` is `x` (`dy`
/// for [`Pass::AvgBack`]), `dy` the max backward's, `out` the output
/// plane.
///
/// # Safety
/// The CPU has the features of `w`.
pub(super) unsafe fn plane(w: Width, pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match w {
            Width::W16 => plane_w16(pass, g, src, dy, out),
            Width::W8 => plane_w8(pass, g, src, dy, out),
        }
    }
}

/// [`rows`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn plane_w16(pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { rows::<__m512>(pass, g, src, dy, out) }
}

/// [`rows`] at 8 lanes.
#[target_feature(enable = "avx2")]
unsafe fn plane_w8(pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded; the features are enabled here.
    unsafe { rows::<__m256>(pass, g, src, dy, out) }
}

/// Every output row of the plane: whole vectors of windows, then the
/// row's last windows in a masked vector.
///
/// # Safety
/// The features of `V` are enabled in the caller.
#[inline(always)]
unsafe fn rows<V: Pairs>(pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32]) {
    let (iw, ow) = (g.in_w, g.out_w());
    let per = V::LANES / 2;
    let whole = ow / per * per;
    let backward = matches!(pass, Pass::MaxBack | Pass::AvgBack);
    if backward && (g.in_h % 2 == 1 || iw % 2 == 1) {
        out.fill(0.0);
    }
    for oh in 0..g.out_h() {
        for j in (0..whole).step_by(per) {
            // SAFETY: windows j..j + per of row oh lie in the plane; the
            // features of `V`.
            unsafe { windows::<V>(pass, g, src, dy, out, oh, j, per) };
        }
        if whole < ow {
            // SAFETY: as above, for the row's last `ow - whole` windows.
            unsafe { windows::<V>(pass, g, src, dy, out, oh, whole, ow - whole) };
        }
    }
}

/// Windows `j..j + n` (`n ≤ LANES / 2`) of output row `oh`: whole vectors,
/// or the lanes of `n` windows when fewer (masked loads and stores).
///
/// # Safety
/// As [`rows`]; the windows lie in the plane.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn windows<V: Pairs>(
    pass: Pass,
    g: &Pool2dGeometry,
    src: &[f32],
    dy: &[f32],
    out: &mut [f32],
    oh: usize,
    j: usize,
    n: usize,
) {
    let (iw, ow) = (g.in_w, g.out_w());
    let whole = n == V::LANES / 2;
    let (i0, i1) = (2 * oh * iw + 2 * j, (2 * oh + 1) * iw + 2 * j);
    // SAFETY: forwarded; the input rows hold 2n values from i0 and i1, the
    // output row n from oh·ow + j (the masked forms touch no others).
    unsafe {
        // (Functions, not closures: a closure would not get the features.)
        let (load, store, load_dup, store_even) = (ld::<V>, st::<V>, ld_dup::<V>, st_even::<V>);
        let n2 = 2 * n;
        let (s, o) = (src.as_ptr(), out.as_mut_ptr());
        match pass {
            Pass::Max => {
                let (r0, r1) = (load(s.add(i0), n2, whole), load(s.add(i1), n2, whole));
                let cols = V::select(V::takes(r1, r0), r1, r0);
                let other = cols.swap();
                store_even(V::select(V::takes(other, cols), other, cols), o.add(oh * ow + j), n, whole);
            }
            Pass::Avg => {
                let zero = V::splat(0.0);
                let cols = zero.add(load(s.add(i0), n2, whole)).add(load(s.add(i1), n2, whole));
                store_even(zero.add(cols).add(cols.swap()).div(V::splat(4.0)), o.add(oh * ow + j), n, whole);
            }
            Pass::AvgBack => {
                let zero = V::splat(0.0);
                let v = zero.add(zero.add(load_dup(s.add(oh * ow + j), n, whole).div(V::splat(4.0))));
                store(v, o.add(i0), n2, whole);
                store(v, o.add(i1), n2, whole);
            }
            Pass::MaxBack => {
                let (r0, r1) = (load(s.add(i0), n2, whole), load(s.add(i1), n2, whole));
                let (d0, d1) = max_back::<V>(r0, r1, load_dup(dy.as_ptr().add(oh * ow + j), n, whole));
                store(d0, o.add(i0), n2, whole);
                store(d1, o.add(i1), n2, whole);
            }
        }
    }
}

/// `LANES` values, or the first `n` (the rest zero) unless `whole`.
///
/// # Safety
/// The features of `V`; the values read exist.
#[inline(always)]
unsafe fn ld<V: Pairs>(p: *const f32, n: usize, whole: bool) -> V {
    // SAFETY: forwarded.
    unsafe {
        if whole {
            V::load(p)
        } else {
            V::load_part(p, n)
        }
    }
}

/// `LANES` values, or the first `n` unless `whole`.
///
/// # Safety
/// The features of `V`; the values written exist.
#[inline(always)]
unsafe fn st<V: Pairs>(v: V, p: *mut f32, n: usize, whole: bool) {
    // SAFETY: forwarded.
    unsafe {
        if whole {
            v.store(p)
        } else {
            v.store_part(p, n)
        }
    }
}

/// [`Pairs::load_dup`], of `n` values unless `whole`.
///
/// # Safety
/// As [`ld`].
#[inline(always)]
unsafe fn ld_dup<V: Pairs>(p: *const f32, n: usize, whole: bool) -> V {
    // SAFETY: forwarded.
    unsafe {
        if whole {
            V::load_dup(p)
        } else {
            V::load_dup_part(p, n)
        }
    }
}

/// [`Pairs::store_even`], of `n` values unless `whole`.
///
/// # Safety
/// As [`st`].
#[inline(always)]
unsafe fn st_even<V: Pairs>(v: V, p: *mut f32, n: usize, whole: bool) {
    // SAFETY: forwarded.
    unsafe {
        if whole {
            v.store_even(p)
        } else {
            v.store_even_part(p, n)
        }
    }
}

/// The max's gradient of the windows in `r0` (their top rows, two lanes
/// each) and `r1` (bottom rows), `d` holding each window's `dy` twice: the
/// scalar loop's scan with the flags in the even lanes, then each value's
/// share (`0 + dy` at the winner, else 0) put back in its lane; the new
/// top and bottom rows of `dx`.
///
/// # Safety
/// The features of `V` are enabled in the caller.
#[inline(always)]
unsafe fn max_back<V: Pairs>(r0: V, r1: V, d: V) -> (V, V) {
    // SAFETY: the caller's features.
    unsafe {
        // Even lanes: a = x[0,0], b = x[0,1], c = x[1,0], e = x[1,1].
        let (a, c) = (r0, r1);
        let (b, e) = (a.swap(), c.swap());
        let tb = V::takes(b, a);
        let m = V::select(tb, b, a);
        let tc = V::takes(c, m);
        let m = V::select(tc, c, m);
        let te = V::takes(e, m);
        let not_ce = V::and_not(tc, V::and_not(te, V::all()));
        let (w0, w1) = (V::and_not(tb, not_ce), V::and(tb, not_ce));
        let (w2, w3) = (V::and_not(te, tc), te);
        let zero = V::splat(0.0);
        let share = zero.add(d);
        let (d0, d1) = (V::select(w0, share, zero), V::select(w1, share, zero));
        let (d2, d3) = (V::select(w2, share, zero), V::select(w3, share, zero));
        (V::even_odd(d0, d1.swap()), V::even_odd(d2, d3.swap()))
    }
}

/// `m[i] = pick(m[i], v[i])` (PyTorch's max update) over a row in vector
/// code of width `w`: the vertical step of the general max
/// ([`super::general::max_plane`]), lane by lane the scalar loop's compare
/// and select.
///
/// # Safety
/// The CPU has the features of `w`.
pub(super) unsafe fn max_row(w: Width, m: &mut [f32], v: &[f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match w {
            Width::W16 => max_row_w16(m, v),
            Width::W8 => max_row_w8(m, v),
        }
    }
}

/// [`max_row_at`] at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn max_row_w16(m: &mut [f32], v: &[f32]) {
    // SAFETY: the features are enabled here.
    unsafe { max_row_at::<__m512>(m, v) }
}

/// [`max_row_at`] at 8 lanes.
#[target_feature(enable = "avx2")]
unsafe fn max_row_w8(m: &mut [f32], v: &[f32]) {
    // SAFETY: the features are enabled here.
    unsafe { max_row_at::<__m256>(m, v) }
}

/// [`max_row`]: whole vectors, then the row's end masked.
///
/// # Safety
/// The features of `V` are enabled in the caller.
#[inline(always)]
unsafe fn max_row_at<V: Pairs>(m: &mut [f32], v: &[f32]) {
    let n = m.len().min(v.len());
    let (mp, vp) = (m.as_mut_ptr(), v.as_ptr());
    let mut i = 0;
    // SAFETY: the features (the caller's); lanes i..i + LANES (or the
    // masked i..n) of both rows are in bounds.
    unsafe {
        while i + V::LANES <= n {
            let (a, b) = (V::load(mp.add(i)), V::load(vp.add(i)));
            V::select(V::takes(b, a), b, a).store(mp.add(i));
            i += V::LANES;
        }
        if i < n {
            let (a, b) = (V::load_part(mp.add(i), n - i), V::load_part(vp.add(i), n - i));
            V::select(V::takes(b, a), b, a).store_part(mp.add(i), n - i);
        }
    }
}

/// Deals the first whole blocks of `src` into its even and odd values
/// (`even[i] = src[2i]`, `odd[i] = src[2i + 1]`) in vector code of width
/// `w`, 32 source values a block: the stride-2 phases of
/// [`super::general::max_plane`]. Returns how many values of each phase
/// it wrote; the caller deals the rest.
///
/// # Safety
/// The CPU has the features of `w`.
pub(super) unsafe fn deal2(w: Width, src: &[f32], even: &mut [f32], odd: &mut [f32]) -> usize {
    let whole = (src.len() / 32).min(even.len() / 16).min(odd.len() / 16);
    // SAFETY: forwarded from the caller; `whole` blocks of 32 values in
    // `src` and of 16 in `even` and `odd`.
    unsafe {
        match w {
            Width::W16 => deal2_w16(whole, src, even, odd),
            Width::W8 => deal2_w8(whole, src, even, odd),
        }
    }
    whole * 16
}

/// [`deal2`]'s first `blocks · 32` values at 16 lanes.
#[target_feature(enable = "avx512f")]
unsafe fn deal2_w16(blocks: usize, src: &[f32], even: &mut [f32], odd: &mut [f32]) {
    // SAFETY: the features are enabled here; the caller checked that the
    // blocks lie in the slices.
    unsafe {
        let ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
        for b in 0..blocks {
            let (lo, hi) = (_mm512_loadu_ps(src.as_ptr().add(32 * b)), _mm512_loadu_ps(src.as_ptr().add(32 * b + 16)));
            _mm512_storeu_ps(even.as_mut_ptr().add(16 * b), _mm512_permutex2var_ps(lo, ie, hi));
            _mm512_storeu_ps(odd.as_mut_ptr().add(16 * b), _mm512_permutex2var_ps(lo, io, hi));
        }
    }
}

/// [`deal2`]'s first `blocks · 32` values at 8 lanes (two vectors a
/// block).
#[target_feature(enable = "avx2")]
unsafe fn deal2_w8(blocks: usize, src: &[f32], even: &mut [f32], odd: &mut [f32]) {
    // SAFETY: the features are enabled here; the caller checked that the
    // blocks lie in the slices.
    unsafe {
        for h in 0..2 * blocks {
            let (lo, hi) = (_mm256_loadu_ps(src.as_ptr().add(16 * h)), _mm256_loadu_ps(src.as_ptr().add(16 * h + 8)));
            // Within each 128-bit half: evens (0 2 | 8 10 ...) and odds,
            // then the 64-bit quarters put in order.
            let e = _mm256_shuffle_ps(lo, hi, 0b10_00_10_00);
            let o = _mm256_shuffle_ps(lo, hi, 0b11_01_11_01);
            let order = |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0b11_01_10_00));
            _mm256_storeu_ps(even.as_mut_ptr().add(8 * h), order(e));
            _mm256_storeu_ps(odd.as_mut_ptr().add(8 * h), order(o));
        }
    }
}
