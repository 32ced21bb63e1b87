//! The Philox rounds in AVX2 (2 blocks per register) and AVX-512F (4 per
//! register), 8 registers per iteration.
//!
//! Layout: each 128-bit lane holds one block's words `[c0, c1, c2, c3]`,
//! the order of the output. `vpmuludq` multiplies the low word of every
//! 64-bit half, c0 and c2, by `[M0, _, M1, _]`, giving `[lo0, hi0, lo1,
//! hi1]` per block in one instruction; reversing the words gives `[hi1,
//! lo1, hi0, lo0]`, and xoring in `[c1, 0, c3, 0]` (the counter shifted
//! right by 32 in each 64-bit half) and the round key `[k0, 0, k1, 0]`
//! completes the round `[hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0]`. The
//! registers of an iteration are independent chains, which hides the
//! multiply's latency. No transpose is needed at the end: a register
//! stores as consecutive elements.

use std::arch::x86_64::*;

use super::{to_words, Elem, Kind, Normal, M, ROUNDS};

/// Blocks per iteration with AVX2: 8 registers of 2 blocks, 8 independent
/// chains (4 expose the multiply's latency: 1.51 against 1.86 G
/// uniforms/s on this Zen 4, best of many runs at 64 Ki elements).
pub(super) const AVX2_GROUP: usize = 16;
/// Blocks per iteration with AVX-512F: 8 registers of 4 blocks (2.51
/// against 2.35 G uniforms/s with 4 registers).
pub(super) const AVX512_GROUP: usize = 32;
/// The larger group.
pub(super) const MAX_GROUP: usize = if AVX2_GROUP > AVX512_GROUP { AVX2_GROUP } else { AVX512_GROUP };

/// Block `j`'s offset `[j, 0, 0, 0]`, for the blocks of an iteration.
static OFFSETS: [u32; 4 * MAX_GROUP] = {
    let mut o = [0u32; 4 * MAX_GROUP];
    let mut j = 0;
    while j < MAX_GROUP {
        o[4 * j] = j as u32;
        j += 1;
    }
    o
};

/// A register of whole blocks.
///
/// # Safety
/// Every method needs its width's features (AVX2, or AVX-512F) enabled in
/// the function it is inlined into; loads and stores need a register's
/// worth of valid memory at the pointer.
trait Words: Copy {
    /// Blocks per register.
    const BLOCKS: usize;
    /// `w` in every block.
    unsafe fn blocks_of(w: [u32; 4]) -> Self;
    /// `4 · BLOCKS` words from `p` (unaligned).
    unsafe fn load(p: *const u32) -> Self;
    /// Word-wise wrapping add.
    unsafe fn add32(self, b: Self) -> Self;
    /// One Philox round: multipliers `m`, round key `k` (both as
    /// `[x0, 0, x1, 0]` per block).
    unsafe fn round(self, m: Self, k: Self) -> Self;
    /// The words as they are.
    unsafe fn store_bits(self, p: *mut u32);
    /// Each word as a uniform f32 (`super::unit_f32`).
    unsafe fn store_unit_f32(self, p: *mut f32);
    /// Each pair of words as a uniform f64 (`super::unit_f64`).
    unsafe fn store_unit_f64(self, p: *mut f64);
}

impl Words for __m256i {
    const BLOCKS: usize = 2;
    #[inline(always)]
    unsafe fn blocks_of(w: [u32; 4]) -> Self {
        let [a, b, c, d] = w.map(|x| x as i32);
        unsafe { _mm256_setr_epi32(a, b, c, d, a, b, c, d) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u32) -> Self {
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn add32(self, b: Self) -> Self {
        unsafe { _mm256_add_epi32(self, b) }
    }
    #[inline(always)]
    unsafe fn round(self, m: Self, k: Self) -> Self {
        unsafe {
            let p = _mm256_mul_epu32(self, m);
            let swapped = _mm256_shuffle_epi32::<0x1b>(p);
            _mm256_xor_si256(_mm256_xor_si256(swapped, _mm256_srli_epi64::<32>(self)), k)
        }
    }
    #[inline(always)]
    unsafe fn store_bits(self, p: *mut u32) {
        unsafe { _mm256_storeu_si256(p.cast(), self) }
    }
    #[inline(always)]
    unsafe fn store_unit_f32(self, p: *mut f32) {
        unsafe {
            let one_m = _mm256_or_si256(_mm256_srli_epi32::<9>(self), _mm256_set1_epi32(0x3f80_0000));
            _mm256_storeu_ps(p, _mm256_sub_ps(_mm256_castsi256_ps(one_m), _mm256_set1_ps(1.0)));
        }
    }
    #[inline(always)]
    unsafe fn store_unit_f64(self, p: *mut f64) {
        unsafe {
            let one_m = _mm256_or_si256(_mm256_srli_epi64::<12>(self), _mm256_set1_epi64x(0x3ff0_0000_0000_0000));
            _mm256_storeu_pd(p, _mm256_sub_pd(_mm256_castsi256_pd(one_m), _mm256_set1_pd(1.0)));
        }
    }
}

impl Words for __m512i {
    const BLOCKS: usize = 4;
    #[inline(always)]
    unsafe fn blocks_of(w: [u32; 4]) -> Self {
        let [a, b, c, d] = w.map(|x| x as i32);
        unsafe { _mm512_broadcast_i32x4(_mm_setr_epi32(a, b, c, d)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u32) -> Self {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn add32(self, b: Self) -> Self {
        unsafe { _mm512_add_epi32(self, b) }
    }
    #[inline(always)]
    unsafe fn round(self, m: Self, k: Self) -> Self {
        unsafe {
            let p = _mm512_mul_epu32(self, m);
            let swapped = _mm512_shuffle_epi32::<0x1b>(p);
            // 0x96: a ^ b ^ c in one instruction.
            _mm512_ternarylogic_epi32::<0x96>(swapped, _mm512_srli_epi64::<32>(self), k)
        }
    }
    #[inline(always)]
    unsafe fn store_bits(self, p: *mut u32) {
        unsafe { _mm512_storeu_si512(p.cast(), self) }
    }
    #[inline(always)]
    unsafe fn store_unit_f32(self, p: *mut f32) {
        unsafe {
            let one_m = _mm512_or_si512(_mm512_srli_epi32::<9>(self), _mm512_set1_epi32(0x3f80_0000));
            _mm512_storeu_ps(p, _mm512_sub_ps(_mm512_castsi512_ps(one_m), _mm512_set1_ps(1.0)));
        }
    }
    #[inline(always)]
    unsafe fn store_unit_f64(self, p: *mut f64) {
        unsafe {
            let one_m = _mm512_or_si512(_mm512_srli_epi64::<12>(self), _mm512_set1_epi64(0x3ff0_0000_0000_0000));
            _mm512_storeu_pd(p, _mm512_sub_pd(_mm512_castsi512_pd(one_m), _mm512_set1_pd(1.0)));
        }
    }
}

/// The counters of `blocks` blocks from `start` when word 0 carries within
/// them: the 128-bit adds one at a time (once every 2^32 blocks).
#[cold]
fn carried_counters(start: u128, blocks: usize) -> [u32; 4 * MAX_GROUP] {
    let mut w = [0u32; 4 * MAX_GROUP];
    for (j, c) in w.chunks_exact_mut(4).take(blocks).enumerate() {
        c.copy_from_slice(&to_words(start.wrapping_add(j as u128)));
    }
    w
}

/// `groups` iterations of `R · V::BLOCKS` blocks from counter `start`,
/// their elements stored from `out` on.
///
/// # Safety
/// The features of `V` are enabled in the caller; `out` has room for
/// `groups · R · V::BLOCKS · E::PER_BLOCK` elements.
#[inline(always)]
unsafe fn fill<V: Words, E: Elem, const R: usize>(
    keys: &[[u32; 2]; ROUNDS],
    mut start: u128,
    out: *mut E,
    groups: usize,
) {
    let group = R * V::BLOCKS;
    debug_assert!(group <= MAX_GROUP);
    // SAFETY: the caller's features; `OFFSETS` and `carried_counters` hold
    // the blocks of the widest group; the stores stay within the `groups`
    // groups of `out`.
    unsafe {
        let m = V::blocks_of([M[0], 0, M[1], 0]);
        let mut k = [m; ROUNDS];
        for (kv, key) in k.iter_mut().zip(keys) {
            *kv = V::blocks_of([key[0], 0, key[1], 0]);
        }
        let mut offsets = [m; R];
        for (r, o) in offsets.iter_mut().enumerate() {
            *o = V::load(OFFSETS.as_ptr().add(4 * r * V::BLOCKS));
        }
        let mut p = out;
        for _ in 0..groups {
            let mut x = offsets;
            if (start as u32).checked_add(group as u32 - 1).is_some() {
                // No carry out of word 0 within the group: one vector add.
                let base = V::blocks_of(to_words(start));
                for xr in &mut x {
                    *xr = base.add32(*xr);
                }
            } else {
                let w = carried_counters(start, group);
                for (r, xr) in x.iter_mut().enumerate() {
                    *xr = V::load(w.as_ptr().add(4 * r * V::BLOCKS));
                }
            }
            for &kr in &k {
                for xr in &mut x {
                    *xr = xr.round(m, kr);
                }
            }
            for xr in x {
                match E::KIND {
                    Kind::Bits => xr.store_bits(p.cast()),
                    Kind::UnitF32 => xr.store_unit_f32(p.cast()),
                    Kind::UnitF64 => xr.store_unit_f64(p.cast()),
                }
                p = p.add(V::BLOCKS * E::PER_BLOCK);
            }
            start = start.wrapping_add(group as u128);
        }
    }
}

/// [`fill`] with AVX2, [`AVX2_GROUP`] blocks per group.
///
/// # Safety
/// The CPU has AVX2; `out` has room for `groups · AVX2_GROUP · E::PER_BLOCK`
/// elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn fill_avx2<E: Elem>(keys: &[[u32; 2]; ROUNDS], start: u128, out: *mut E, groups: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { fill::<__m256i, E, { AVX2_GROUP / 2 }>(keys, start, out, groups) }
}

/// [`fill`] with AVX-512F, [`AVX512_GROUP`] blocks per group.
///
/// # Safety
/// The CPU has AVX-512F; `out` has room for
/// `groups · AVX512_GROUP · E::PER_BLOCK` elements.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn fill_avx512<E: Elem>(keys: &[[u32; 2]; ROUNDS], start: u128, out: *mut E, groups: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { fill::<__m512i, E, { AVX512_GROUP / 4 }>(keys, start, out, groups) }
}

/// [`Normal::from_words`] with AVX2 enabled, for LLVM to vectorize.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn normals_avx2<N: Normal>(words: &[u32], out: &mut [N]) {
    N::from_words(words, out);
}

/// [`Normal::from_words`] with AVX-512F enabled, for LLVM to vectorize.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn normals_avx512<N: Normal>(words: &[u32], out: &mut [N]) {
    N::from_words(words, out);
}
