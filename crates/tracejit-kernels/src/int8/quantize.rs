//! int8 quantization: of an f32 lhs row by row at run time (stored as
//! `vpdpbusd`'s unsigned operand), and of a weight column by column once
//! per version (symmetric).
//!
//! The symmetric rule, for a weight column and for an lhs row holding a
//! negative value: `scale = max |xᵢ| / 127`, or 1 when that is 0 (an
//! all-zero row, or one so small that the division underflows);
//! `qᵢ = round_half_even(xᵢ / scale)` clamped to `[-127, 127]`, an lhs
//! row stored as `u8 = q + 128`. An lhs row with no negative value (the
//! input of a layer after a relu) uses the whole unsigned range instead,
//! half the step: `scale = max xᵢ / 255` (or 1), `uᵢ =
//! round_half_even(xᵢ / scale)` clamped to `[0, 255]`, stored as it is,
//! when the depth allows its sums in i32 ([`UNSIGNED_MAX_K`]). A row
//! holding a NaN or ±Inf gets `scale = NaN` and `q = 0`, so that every
//! output it reaches is NaN. The vector and the scalar forms perform the
//! same IEEE operations (a true division, the same rounding) and give the
//! same bytes.

use ndarray::ArrayView2;

use crate::bf16::tiles::{bytes_mut, pack_rows, rhs_index};
use crate::Isa;

/// The scale of values whose largest magnitude is `top` (see the module).
fn scale_of(top: f32, finite: bool) -> f32 {
    let scale = top / 127.0;
    if !finite {
        f32::NAN
    } else if scale == 0.0 {
        1.0
    } else {
        scale
    }
}

/// The deepest product whose lhs rows may be quantized unsigned: their
/// sums `Σ u · q` stay within i32 (`255 · 127 · 2¹⁶ < 2³¹`).
pub(super) const UNSIGNED_MAX_K: usize = 1 << 16;

/// `x` quantized with `scale` (not NaN).
#[inline(always)]
fn level(x: f32, scale: f32) -> i8 {
    (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// How a row is stored: its scale, and whether it is unsigned (`u`, else
/// `q + 128`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct RowForm {
    pub scale: f32,
    pub unsigned: bool,
}

/// The form of a row from its largest magnitude, whether it is finite and
/// whether it has a negative value (see the module).
fn form_of(top: f32, finite: bool, negative: bool, unsigned_ok: bool) -> RowForm {
    if finite && !negative && unsigned_ok {
        let scale = top / 255.0;
        return RowForm { scale: if scale == 0.0 { 1.0 } else { scale }, unsigned: true };
    }
    RowForm { scale: scale_of(top, finite), unsigned: false }
}

/// Quantizes `row` into `out` (as long) by the module's rule; unsigned
/// only where `unsigned_ok`.
fn quantize_row(row: &[f32], out: &mut [u8], unsigned_ok: bool, isa: Isa) -> RowForm {
    debug_assert_eq!(row.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx512_vnni() {
        // SAFETY: the features were checked; the lengths are equal.
        return unsafe { quantize_row_avx512(row, out, unsigned_ok) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.width().is_some() {
        // SAFETY: `width` found AVX2 and FMA; the lengths are equal.
        return unsafe { quantize_row_avx2(row, out, unsigned_ok) };
    }
    let _ = isa;
    quantize_row_portable(row, out, unsigned_ok)
}

/// [`quantize_row`] 8 values per register with AVX2 (the portable loop,
/// even compiled for AVX2, took 6 ns a value: a `rintf` call per value
/// without SSE4.1 and scalar saturating casts; a quarter of an int8
/// product on the Xeon held to AVX2). The same operations as the portable
/// and AVX-512 paths: the largest magnitude, then `x / scale` clamped and
/// rounded to nearest even (clamping first is the same: the bounds are
/// integers), `+ 128` on a signed row.
///
/// # Safety
/// The CPU has AVX2 and FMA; `out` is as long as `row`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(row: &[f32], out: &mut [u8], unsigned_ok: bool) -> RowForm {
    use std::arch::x86_64::*;
    let len = row.len();
    let whole = len / 8 * 8;
    let magnitude = _mm256_set1_epi32(0x7fff_ffff);
    let (mut top_v, mut bad_v, mut negative_v) = (_mm256_setzero_ps(), _mm256_setzero_si256(), _mm256_setzero_ps());
    for i in (0..whole).step_by(8) {
        // SAFETY: 8 values from `i` lie inside `row`.
        let x = unsafe { _mm256_loadu_ps(row.as_ptr().add(i)) };
        let abs = _mm256_and_si256(_mm256_castps_si256(x), magnitude);
        bad_v = _mm256_or_si256(bad_v, _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f7f_ffff)));
        negative_v = _mm256_or_ps(negative_v, _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps()));
        top_v = _mm256_max_ps(top_v, _mm256_castsi256_ps(abs));
    }
    let (bad, negative) = (_mm256_movemask_epi8(bad_v), _mm256_movemask_ps(negative_v));
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats into a local array.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), top_v) };
    let start = (lanes.iter().fold(0f32, |t, &v| t.max(v)), bad == 0, negative != 0);
    let (top, finite, negative) = stats(start, &row[whole..]);
    let form = form_of(top, finite, negative, unsigned_ok);
    if !finite {
        out.fill(128);
        return form;
    }
    let (lo, hi, offset) = if form.unsigned { (0.0, 255.0, 0) } else { (-127.0, 127.0, 128) };
    let (lo_v, hi_v, scale_v, offset_v) =
        (_mm256_set1_ps(lo), _mm256_set1_ps(hi), _mm256_set1_ps(form.scale), _mm256_set1_epi32(offset));
    // The low 32 bits of each 128-bit lane, side by side.
    let gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    for i in (0..whole).step_by(8) {
        // SAFETY: 8 values from `i` lie inside `row`, 8 bytes inside `out`.
        unsafe {
            let x = _mm256_loadu_ps(row.as_ptr().add(i));
            let level = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(x, scale_v), lo_v), hi_v);
            // Round to nearest even (the default rounding mode); 0 to 255.
            let level = _mm256_add_epi32(_mm256_cvtps_epi32(level), offset_v);
            // Narrowed without saturating (every value fits a byte): lane
            // `l`'s four values become the low four bytes of lane `l`.
            let words = _mm256_packus_epi32(level, level);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, words), gather);
            _mm_storel_epi64(out.as_mut_ptr().add(i).cast(), _mm256_castsi256_si128(bytes));
        }
    }
    for (o, &x) in out[whole..].iter_mut().zip(&row[whole..]) {
        *o = byte(x, form);
    }
    form
}

/// The largest magnitude, whether all are finite, whether any is negative:
/// `start` updated with `values`.
#[inline(always)]
fn stats(start: (f32, bool, bool), values: &[f32]) -> (f32, bool, bool) {
    values
        .iter()
        .fold(start, |(top, finite, negative), &x| (top.max(x.abs()), finite && x.is_finite(), negative || x < 0.0))
}

/// The stored byte of a finite `x` in a row of form `form`: its level, plus
/// 128 on a signed row.
#[inline(always)]
fn byte(x: f32, form: RowForm) -> u8 {
    if form.unsigned {
        (x / form.scale).round_ties_even().clamp(0.0, 255.0) as u8
    } else {
        (level(x, form.scale) as u8).wrapping_add(128)
    }
}

/// [`quantize_row`] in portable code.
#[inline(always)]
fn quantize_row_portable(row: &[f32], out: &mut [u8], unsigned_ok: bool) -> RowForm {
    let (top, finite, negative) = stats((0.0, true, false), row);
    let form = form_of(top, finite, negative, unsigned_ok);
    for (o, &x) in out.iter_mut().zip(row) {
        *o = if finite { byte(x, form) } else { 128 };
    }
    form
}

/// [`quantize_row`] 16 values per register.
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI (the vector path goes with the
/// `vpdpbusd` kernel); `out` is as long as `row`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn quantize_row_avx512(row: &[f32], out: &mut [u8], unsigned_ok: bool) -> RowForm {
    use std::arch::x86_64::*;
    let len = row.len();
    let mask = |i: usize| if len - i >= 16 { u16::MAX } else { ((1u32 << (len - i)) - 1) as u16 };
    let (mut top, mut bad, mut negative) = (_mm512_setzero_ps(), 0u16, 0u16);
    for i in (0..len).step_by(16) {
        // SAFETY: the masked lanes lie inside `row`.
        let x = unsafe { _mm512_maskz_loadu_ps(mask(i), row.as_ptr().add(i)) };
        let abs = _mm512_castps_si512(_mm512_abs_ps(x));
        bad |= _mm512_cmpge_epi32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
        negative |= _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
        top = _mm512_max_ps(top, _mm512_castsi512_ps(abs));
    }
    let form = form_of(_mm512_reduce_max_ps(top), bad == 0, negative != 0, unsigned_ok);
    if bad != 0 {
        out.fill(128);
        return form;
    }
    // Clamping before rounding is the same as after: the bounds are
    // integers. A signed row's `q + 128` is `q ^ 0x80` on a byte; an
    // unsigned row's levels (0 to 255) are its bytes.
    let (lo, hi, flip, offset) = if form.unsigned { (0.0, 255.0, 0i8, 0) } else { (-127.0, 127.0, i8::MIN, 128) };
    let (lo, hi, scale_v) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi), _mm512_set1_ps(form.scale));
    let levels = |x: __m512| {
        let q = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(x, scale_v), lo), hi);
        _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q)
    };
    let mut i = 0;
    while i + 64 <= len {
        let mut q = [_mm_setzero_si128(); 4];
        for (j, q) in q.iter_mut().enumerate() {
            // SAFETY: 64 values from `i` lie inside `row`.
            let x = unsafe { _mm512_loadu_ps(row.as_ptr().add(i + 16 * j)) };
            *q = _mm512_cvtepi32_epi8(levels(x));
        }
        let bytes =
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])), _mm256_set_m128i(q[3], q[2]));
        let bytes = _mm512_xor_si512(bytes, _mm512_set1_epi8(flip));
        // SAFETY: 64 bytes from `i` lie inside `out`.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(i).cast(), bytes) };
        i += 64;
    }
    while i < len {
        // SAFETY: the masked lanes lie inside `row` and `out`.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask(i), row.as_ptr().add(i));
            let q = _mm512_add_epi32(levels(x), _mm512_set1_epi32(offset));
            _mm512_mask_cvtepi32_storeu_epi8(out.as_mut_ptr().add(i).cast(), mask(i), q);
        }
        i += 16;
    }
    form
}

/// Packs `a [m, k]` (any strides) quantized row by row into `out`
/// (`tiles::lhs_len(m, ceil(k / 4))` words of four `u8`), the rows' forms
/// into `forms` (`m` values). Pad bytes hold 128 (they meet the weight's
/// zero pads).
pub(super) fn pack_lhs(a: ArrayView2<'_, f32>, out: &mut [u32], forms: &mut [RowForm], isa: Isa) {
    let k = a.ncols();
    let unsigned_ok = k <= UNSIGNED_MAX_K;
    pack_rows(a, super::panel_rows(isa), k.div_ceil(4), out, 0x8080_8080, |i, row, words| {
        forms[i] = quantize_row(row, &mut bytes_mut(words)[..k], unsigned_ok, isa);
    });
}

/// A weight `w [k, n]` quantized per column into packed rhs words of
/// four `i8` (`out`, zeroed, `tiles::rhs_len(n, ceil(k / 4))` words);
/// returns each column's scale and `−128 · Σᵢ qᵢ` (the correction of the
/// lhs's `+ 128`, where the column's sums start).
pub(super) fn pack_weight(w: ArrayView2<'_, f32>, out: &mut [u32]) -> (Vec<f32>, Vec<i32>) {
    let (k, n) = w.dim();
    let kw = k.div_ceil(4);
    let out = bytes_mut(out);
    let (mut scales, mut starts) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (j, col) in w.columns().into_iter().enumerate() {
        let finite = col.iter().all(|x| x.is_finite());
        let scale = scale_of(col.iter().fold(0f32, |t, x| t.max(x.abs())), finite);
        let mut sum = 0i32;
        if finite {
            for (i, &x) in col.iter().enumerate() {
                let q = level(x, scale);
                out[4 * rhs_index(kw, i / 4, j) + i % 4] = q as u8;
                sum += i32::from(q);
            }
        }
        scales.push(scale);
        starts.push(sum.wrapping_mul(-128));
    }
    (scales, starts)
}
