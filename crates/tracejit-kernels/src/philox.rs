//! Philox4x32-10, the counter-based random number generator of Salmon et
//! al. ("Parallel random numbers: as easy as 1, 2, 3", SC'11), with the
//! constants of Random123, TensorFlow and JAX, and its mappings to uniform
//! and normal floats.
//!
//! A [`Stream`] is a 64-bit key and a 128-bit base counter. Block `b` of a
//! stream is `philox4x32_10(counter + b, key)`, the add taken on the
//! counter as one little-endian 128-bit integer (word 0 lowest) modulo
//! 2^128. Element `i` of a draw is a function of (key, counter, `i`) only:
//! - `bits_u32`: block `i / 4`, word `i % 4`;
//! - `uniform_f32`: that word `w` as
//!   `f32::from_bits((w >> 9) | 0x3f80_0000) - 1.0`, the top 23 bits as the
//!   mantissa (JAX's mapping; TensorFlow's `Uint32ToFloat` keeps the low 23
//!   bits instead), so `[0, 1)` in steps of 2^-23;
//! - `uniform_f64`: block `i / 2`, words `2(i % 2)` (low) and
//!   `2(i % 2) + 1` (high) as one little-endian u64 `x`, then
//!   `f64::from_bits((x >> 12) | 0x3ff0_0000_0000_0000) - 1.0`, the top 52
//!   bits as the mantissa: `[0, 1)` in steps of 2^-52;
//! - `normal_f32` / `normal_f64`: Box-Muller on the uniforms of elements
//!   `i & !1` and `i | 1` of the same draw (so in the same block), each
//!   mapped to `(0, 1]` as `1 - u` (exact), `z0 = sqrt(-2 ln u1) cos(2π u2)`
//!   for even `i` and `z1 = sqrt(-2 ln u1) sin(2π u2)` for odd `i`. For f32
//!   both words of block `i / 4` at `i % 4 & !1` and `i % 4 | 1`; for f64
//!   the two u64 halves of block `i / 2`.
//!
//! So a range `first..first + n` equals the same elements of any longer
//! draw, and the way work is split (threads, chunks) never changes a value.
//! After a draw of `n` elements a generator moves on with
//! [`Stream::advanced`] by `n.div_ceil(4)` blocks (`n.div_ceil(2)` for f64).
//!
//! Code paths: 32 blocks per iteration with AVX-512F, 16 with AVX2 (where
//! the caller's [`Isa`] and the CPU allow), one block at a time otherwise.
//! The vector code keeps each block's four words in one 128-bit lane, so a
//! single `vpmuludq` gives both 32×32→64 products of a round for every
//! block in the register, and the result is already in element order. All
//! paths give the same bits: the rounds are integer arithmetic, and the
//! uniform maps are exact (a float with exponent 0 minus 1.0).
//!
//! The normals' transcendentals have one implementation, `normal`'s
//! Box-Muller in f64: fdlibm's `ln`, `sin` and `cos` recipes in plain IEEE
//! arithmetic (no libm, no fused or reordered operations), so the bits
//! are the same on every path (its AVX2 and AVX-512 entry points only
//! let LLVM vectorize the same loop) and on every machine. f32 normals are
//! the f64 values rounded once.

use crate::Isa;

mod normal;
#[cfg(target_arch = "x86_64")]
mod x86;

use normal::Normal;

#[cfg(test)]
mod tests;

/// Philox's multipliers (Random123's `PHILOX_M4x32_0` and `_1`).
const M: [u32; 2] = [0xd251_1f53, 0xcd9e_8d57];
/// The key schedule's Weyl increments (the golden ratio and `sqrt(3) - 1`).
const W: [u32; 2] = [0x9e37_79b9, 0xbb67_ae85];
/// Rounds per block.
const ROUNDS: usize = 10;

/// One Philox4x32 block with 10 rounds: the 4 words of a 128-bit counter
/// (word 0 lowest) under a 64-bit key, as Random123's `philox4x32_R(10,
/// ctr, key)`, TensorFlow's `PhiloxRandom` and JAX's `philox`.
///
/// ```
/// use tracejit_kernels::philox::philox4x32_10;
///
/// assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let keys = round_keys(key);
    block(counter, &keys)
}

/// The key of every round: round `r` uses `key + r·W` (word-wise, wrapping).
fn round_keys(key: [u32; 2]) -> [[u32; 2]; ROUNDS] {
    let mut k = [key; ROUNDS];
    for r in 1..ROUNDS {
        k[r] = [k[r - 1][0].wrapping_add(W[0]), k[r - 1][1].wrapping_add(W[1])];
    }
    k
}

/// The ten rounds on one counter.
#[inline(always)]
fn block(mut c: [u32; 4], keys: &[[u32; 2]; ROUNDS]) -> [u32; 4] {
    for k in keys {
        let p0 = u64::from(M[0]) * u64::from(c[0]);
        let p1 = u64::from(M[1]) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// A 128-bit counter from its words, word 0 lowest.
fn to_u128(c: [u32; 4]) -> u128 {
    c.iter().rev().fold(0, |acc, &w| (acc << 32) | u128::from(w))
}

/// The words of a 128-bit counter, lowest first.
fn to_words(c: u128) -> [u32; 4] {
    [c as u32, (c >> 32) as u32, (c >> 64) as u32, (c >> 96) as u32]
}

/// A stream position: a key and a 128-bit base counter (word 0 lowest).
///
/// Every draw is a pure function of the stream and the element indices, so
/// any split of a draw gives the bits of the whole draw:
///
/// ```
/// use tracejit_kernels::philox::{philox4x32_10, Stream};
/// use tracejit_kernels::Isa;
///
/// let s = Stream { key: [7, 11], counter: [u32::MAX, 0, 0, 0] };
/// let mut all = [0u32; 12];
/// s.bits_u32(0, &mut all, Isa::native());
/// // Block 1's counter carries into word 1.
/// assert_eq!(all[4..8], philox4x32_10([0, 1, 0, 0], [7, 11]));
/// let mut part = [0u32; 5];
/// s.bits_u32(6, &mut part, Isa::native());
/// assert_eq!(part, all[6..11]);
///
/// let mut u = [0.0f32; 1000];
/// s.uniform_f32(0, &mut u, Isa::native());
/// assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
/// // The next draw starts after the blocks this one used.
/// assert_eq!(s.advanced(250).counter, [249, 1, 0, 0]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    /// The 64-bit key, word 0 first.
    pub key: [u32; 2],
    /// The base counter: block `b` of a draw uses `counter + b`.
    pub counter: [u32; 4],
}

impl Stream {
    /// Random bits: `out[j]` is element `first + j`, word `(first + j) % 4`
    /// of block `(first + j) / 4`.
    pub fn bits_u32(&self, first: u64, out: &mut [u32], isa: Isa) {
        self.draw(u128::from(first), out, Path::of(isa));
    }

    /// Uniform f32 in `[0, 1)`: `(word >> 9) | 0x3f80_0000` as f32 bits,
    /// minus 1.0 (23 random bits), the word of [`Stream::bits_u32`]'s
    /// element `first + j`.
    pub fn uniform_f32(&self, first: u64, out: &mut [f32], isa: Isa) {
        self.draw(u128::from(first), out, Path::of(isa));
    }

    /// Uniform f64 in `[0, 1)` from two words: element `i` reads block
    /// `i / 2`, words `2(i % 2)` (low half) and `2(i % 2) + 1` (high half)
    /// of a u64 `x`, and is `(x >> 12) | 0x3ff0_0000_0000_0000` as f64 bits,
    /// minus 1.0 (52 random bits).
    pub fn uniform_f64(&self, first: u64, out: &mut [f64], isa: Isa) {
        self.draw(u128::from(first), out, Path::of(isa));
    }

    /// Standard normals by Box-Muller: element `i` uses the words at
    /// `i % 4 & !1` and `i % 4 | 1` of block `i / 4` as [`Stream::uniform_f32`]
    /// maps them, each taken to `(0, 1]` as `u = 1 - uniform` (never 0, so
    /// `ln u` is finite); then `z0 = sqrt(-2 ln u1) cos(2π u2)` for even `i`,
    /// `z1 = sqrt(-2 ln u1) sin(2π u2)` for odd `i`, computed in f64 (to
    /// about 1 ulp, the same bits on every machine) and rounded to f32.
    /// `|z| <= sqrt(2·23·ln 2) < 5.65`.
    pub fn normal_f32(&self, first: u64, out: &mut [f32], isa: Isa) {
        self.normals(first, out, Path::of(isa));
    }

    /// Standard normals by Box-Muller from pairs of [`Stream::uniform_f64`]
    /// values: element `i` uses block `i / 2`, whose two f64 uniforms
    /// (words 0-1, then words 2-3) taken to `(0, 1]` as `1 - u` are `u1`
    /// and `u2`; `z0 = sqrt(-2 ln u1) cos(2π u2)` for even `i`,
    /// `z1 = sqrt(-2 ln u1) sin(2π u2)` for odd `i` (to about 1 ulp, the
    /// same bits on every machine). `|z| <= sqrt(2·52·ln 2) < 8.5`.
    pub fn normal_f64(&self, first: u64, out: &mut [f64], isa: Isa) {
        self.normals(first, out, Path::of(isa));
    }

    /// The counter advanced by `blocks` (a 128-bit add, wrapping), the key
    /// kept: what a generator does after a draw of `n` elements, with
    /// `blocks = n.div_ceil(4)` (`n.div_ceil(2)` for f64).
    pub fn advanced(&self, blocks: u64) -> Stream {
        Stream { key: self.key, counter: to_words(to_u128(self.counter).wrapping_add(u128::from(blocks))) }
    }

    /// Elements `first..first + out.len()` of the draw of `E`, by `path`.
    fn draw<E: Elem>(&self, first: u128, out: &mut [E], path: Path) {
        let keys = round_keys(self.key);
        let base = to_u128(self.counter);
        let per_block = E::PER_BLOCK as u128;
        let group = path.group_blocks() * E::PER_BLOCK;
        let mut buf = [E::default(); MAX_GROUP_WORDS];
        let mut e = first;
        let mut i = 0;
        while i < out.len() {
            let start = base.wrapping_add(e / per_block);
            let skip = (e % per_block) as usize;
            let left = out.len() - i;
            let take = if skip == 0 && left >= group {
                // Whole groups straight into `out`.
                let n = left - left % group;
                fill(path, &keys, start, &mut out[i..i + n]);
                n
            } else {
                // A partial group (the draw's first or last elements) goes
                // through a buffer, which keeps every group whole.
                fill(path, &keys, start, &mut buf[..group]);
                let n = left.min(group - skip);
                out[i..i + n].copy_from_slice(&buf[skip..skip + n]);
                n
            };
            i += take;
            e += take as u128;
        }
    }

    /// Normals `first..first + out.len()`: the bits of the blocks they
    /// lie in, a chunk at a time, through [`Normal::from_words`] (every
    /// pair of every block; the chunk's first and last blocks may hold
    /// elements outside the range, which are dropped).
    fn normals<N: Normal>(&self, first: u64, out: &mut [N], path: Path) {
        const CHUNK_BLOCKS: usize = 64;
        let per_block = N::PER_BLOCK as u128;
        let mut words = [0u32; 4 * CHUNK_BLOCKS];
        let mut z = [N::default(); 4 * CHUNK_BLOCKS];
        let mut e = u128::from(first);
        let mut i = 0;
        while i < out.len() {
            let skip = (e % per_block) as usize;
            let n = (out.len() - i).min(CHUNK_BLOCKS * N::PER_BLOCK - skip);
            let blocks = (skip + n).div_ceil(N::PER_BLOCK);
            // Element e's block starts at word 4 (e / per_block) of the draw.
            self.draw(e / per_block * 4, &mut words[..4 * blocks], path);
            normals_of(path, &words[..4 * blocks], &mut z[..blocks * N::PER_BLOCK]);
            out[i..i + n].copy_from_slice(&z[skip..skip + n]);
            i += n;
            e += n as u128;
        }
    }
}

/// The most elements a group makes (4 per block).
#[cfg(target_arch = "x86_64")]
const MAX_GROUP_WORDS: usize = 4 * x86::MAX_GROUP;
#[cfg(not(target_arch = "x86_64"))]
const MAX_GROUP_WORDS: usize = 4;

/// The code that makes blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// One block at a time in portable Rust.
    Portable,
    /// 16 blocks an iteration in AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// 32 blocks an iteration in AVX-512F.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The widest path `isa` allows on this CPU ([`Isa::width`]).
    fn of(isa: Isa) -> Path {
        #[cfg(target_arch = "x86_64")]
        match isa.width() {
            Some(crate::Width::W16) => Path::Avx512,
            Some(crate::Width::W8) => Path::Avx2,
            None => Path::Portable,
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            Path::Portable
        }
    }

    /// Blocks per call of the path's kernel.
    fn group_blocks(self) -> usize {
        match self {
            Path::Portable => 1,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => x86::AVX2_GROUP,
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => x86::AVX512_GROUP,
        }
    }
}

/// Elements of `out.len() / E::PER_BLOCK` blocks from counter `start` on;
/// `out.len()` is a multiple of the path's group.
fn fill<E: Elem>(path: Path, keys: &[[u32; 2]; ROUNDS], start: u128, out: &mut [E]) {
    match path {
        Path::Portable => {
            for (b, chunk) in out.chunks_exact_mut(E::PER_BLOCK).enumerate() {
                E::from_block(block(to_words(start.wrapping_add(b as u128)), keys), chunk);
            }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            let groups = out.len() / (x86::AVX2_GROUP * E::PER_BLOCK);
            // SAFETY: `Path::of` (or a test) chose AVX2 only where
            // `Isa::width` found AVX2; `out` holds the groups' elements.
            unsafe { x86::fill_avx2(keys, start, out.as_mut_ptr(), groups) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => {
            let groups = out.len() / (x86::AVX512_GROUP * E::PER_BLOCK);
            // SAFETY: AVX-512 only where `Isa::width` found AVX-512F; `out`
            // holds the groups' elements.
            unsafe { x86::fill_avx512(keys, start, out.as_mut_ptr(), groups) }
        }
    }
}

/// [`Normal::from_words`] compiled for `path`'s features, where LLVM
/// vectorizes it (the same IEEE operations, so the same bits).
fn normals_of<N: Normal>(path: Path, words: &[u32], out: &mut [N]) {
    match path {
        Path::Portable => N::from_words(words, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 only where `Isa::width` found it.
        Path::Avx2 => unsafe { x86::normals_avx2(words, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 only where `Isa::width` found AVX-512F.
        Path::Avx512 => unsafe { x86::normals_avx512(words, out) },
    }
}

/// What the vector code stores per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The four words.
    Bits,
    /// Four uniform f32.
    UnitF32,
    /// Two uniform f64.
    UnitF64,
}

/// An element type of a draw.
trait Elem: Copy + Default {
    /// Elements per block.
    const PER_BLOCK: usize;
    /// How the vector code maps the words.
    const KIND: Kind;
    /// The block's `PER_BLOCK` elements into `out`.
    fn from_block(w: [u32; 4], out: &mut [Self]);
}

impl Elem for u32 {
    const PER_BLOCK: usize = 4;
    const KIND: Kind = Kind::Bits;
    fn from_block(w: [u32; 4], out: &mut [u32]) {
        out.copy_from_slice(&w);
    }
}

impl Elem for f32 {
    const PER_BLOCK: usize = 4;
    const KIND: Kind = Kind::UnitF32;
    fn from_block(w: [u32; 4], out: &mut [f32]) {
        for (o, &w) in out.iter_mut().zip(&w) {
            *o = unit_f32(w);
        }
    }
}

impl Elem for f64 {
    const PER_BLOCK: usize = 2;
    const KIND: Kind = Kind::UnitF64;
    fn from_block(w: [u32; 4], out: &mut [f64]) {
        out[0] = unit_f64(pair_u64(w[0], w[1]));
        out[1] = unit_f64(pair_u64(w[2], w[3]));
    }
}

/// `[0, 1)` from a word's top 23 bits; the subtraction is exact.
#[inline(always)]
fn unit_f32(w: u32) -> f32 {
    f32::from_bits((w >> 9) | 0x3f80_0000) - 1.0
}

/// `[0, 1)` from the top 52 bits; the subtraction is exact.
#[inline(always)]
fn unit_f64(x: u64) -> f64 {
    f64::from_bits((x >> 12) | 0x3ff0_0000_0000_0000) - 1.0
}

/// Two words as a little-endian u64.
#[inline(always)]
fn pair_u64(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}
