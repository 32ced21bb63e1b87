//! The f32 vector the attention passes are written over once: AVX-512
//! (`__m512`) and AVX2 + FMA (`__m256`) through [`crate::simd::Lanes`], and
//! [`Portable`], eight plain lanes for CPUs with neither.
//!
//! Every method is the same IEEE operation lane by lane at every width
//! (multiply-adds fused, `max` keeping x86's rule of returning its second
//! operand when either is NaN, `exp_flushed` the [`crate::fastmath::exp`]
//! recipe bit for bit), and the passes never combine lanes, so the three forms compute
//! the same bits.

/// A vector of f32 lanes.
///
/// # Safety
/// The methods need the CPU features of their width enabled in the
/// function they are inlined into (none for [`Portable`]); `load`/`store`
/// need `LANES` readable/writable f32 values at the pointer.
pub(super) trait Vector: Copy {
    /// f32 values per vector.
    const LANES: usize;
    /// Every lane 0.
    unsafe fn zero() -> Self;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// Writes the lanes to `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    /// `self + b` per lane.
    unsafe fn add(self, b: Self) -> Self;
    /// `self - b` per lane.
    unsafe fn sub(self, b: Self) -> Self;
    /// `self * b` per lane.
    unsafe fn mul(self, b: Self) -> Self;
    /// `self * b + c`, rounded once.
    unsafe fn fma(self, b: Self, c: Self) -> Self;
    /// `self > b ? self : b` per lane: `b` when either is NaN.
    unsafe fn max(self, b: Self) -> Self;
    /// [`crate::fastmath::exp`] per lane, but 0 for `self < EXP_FLOOR` (`-inf` included) with
    /// no subnormal value ever formed: a masked score's weight, or one
    /// 87 below the row's max, would otherwise underflow through
    /// subnormals, and Intel cores take a microcode assist (about a
    /// hundred cycles) for each such result — a third of a masked BERT
    /// attention's time. The weights lost are below 2⁻¹²⁵ of the row's
    /// largest. NaN stays NaN.
    unsafe fn exp_flushed(self) -> Self;
    /// Writes the `LANES × LANES` block at `src` (rows `ss` apart)
    /// transposed to `dst` (rows `ds` apart), each value times `scale`.
    unsafe fn transpose(src: *const f32, ss: usize, dst: *mut f32, ds: usize, scale: f32);
}

/// The x86 widths, by their [`crate::simd::Lanes`] methods.
#[cfg(target_arch = "x86_64")]
macro_rules! via_lanes {
    ($t:ty, $transpose:ident) => {
        impl Vector for $t {
            const LANES: usize = <$t as crate::simd::Lanes>::LANES;
            #[inline(always)]
            unsafe fn zero() -> Self {
                // SAFETY: the caller's features (see `Vector`).
                unsafe { <$t as crate::simd::Lanes>::zero() }
            }
            #[inline(always)]
            unsafe fn splat(x: f32) -> Self {
                // SAFETY: as above.
                unsafe { <$t as crate::simd::Lanes>::splat(x) }
            }
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                // SAFETY: as above; the caller's pointer.
                unsafe { <$t as crate::simd::Lanes>::load(p) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                // SAFETY: as above; the caller's pointer.
                unsafe { crate::simd::Lanes::store(self, p) }
            }
            #[inline(always)]
            unsafe fn add(self, b: Self) -> Self {
                // SAFETY: the caller's features.
                unsafe { crate::simd::Lanes::add(self, b) }
            }
            #[inline(always)]
            unsafe fn sub(self, b: Self) -> Self {
                // SAFETY: the caller's features.
                unsafe { crate::simd::Lanes::sub(self, b) }
            }
            #[inline(always)]
            unsafe fn mul(self, b: Self) -> Self {
                // SAFETY: the caller's features.
                unsafe { crate::simd::Lanes::mul(self, b) }
            }
            #[inline(always)]
            unsafe fn fma(self, b: Self, c: Self) -> Self {
                // SAFETY: the caller's features.
                unsafe { crate::simd::Lanes::fma(self, b, c) }
            }
            #[inline(always)]
            unsafe fn max(self, b: Self) -> Self {
                // SAFETY: the caller's features.
                unsafe { crate::simd::Lanes::max(self, b) }
            }
            #[inline(always)]
            unsafe fn exp_flushed(self) -> Self {
                use crate::simd::Lanes;
                // SAFETY: the caller's features.
                unsafe {
                    let floor = <$t as Lanes>::splat(EXP_FLOOR);
                    // `vmaxps floor, x` is `x` when `x` is NaN, so NaN
                    // reaches `exp`; `min(x, 0) - floor` is negative
                    // exactly when `x < floor` (NaN gives `-floor`).
                    let e = crate::simd::recipes::exp(Lanes::max(floor, self));
                    let below = Lanes::sub(Lanes::min(self, <$t as Lanes>::zero()), floor);
                    below.where_negative(<$t as Lanes>::zero(), e)
                }
            }
            #[inline(always)]
            unsafe fn transpose(src: *const f32, ss: usize, dst: *mut f32, ds: usize, scale: f32) {
                // SAFETY: the caller's features and blocks.
                unsafe { $transpose(src, ss, dst, ds, scale) }
            }
        }
    };
}

/// The 8 × 8 transpose: pairs, then quads within 128-bit halves, then
/// halves.
///
/// # Safety
/// AVX (part of AVX2) is enabled; `src` and `dst` address 8 rows of 8
/// values at their strides.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8(src: *const f32, ss: usize, dst: *mut f32, ds: usize, scale: f32) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's features and blocks.
    unsafe {
        // Closures would compile without the caller's features: loops.
        let k = _mm256_set1_ps(scale);
        let mut r = [k; 8];
        for (i, x) in r.iter_mut().enumerate() {
            *x = _mm256_mul_ps(_mm256_loadu_ps(src.add(i * ss)), k);
        }
        let mut t = [k; 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4h + m]: columns m and 4 + m of rows 4h..4h + 4.
        let mut u = [k; 8];
        for h in 0..2 {
            let t = &t[4 * h..];
            u[4 * h] = _mm256_shuffle_ps::<0x44>(t[0], t[2]);
            u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(t[0], t[2]);
            u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(t[1], t[3]);
            u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(t[1], t[3]);
        }
        for m in 0..4 {
            _mm256_storeu_ps(dst.add(m * ds), _mm256_permute2f128_ps::<0x20>(u[m], u[4 + m]));
            _mm256_storeu_ps(dst.add((4 + m) * ds), _mm256_permute2f128_ps::<0x31>(u[m], u[4 + m]));
        }
    }
}

/// The 16 × 16 transpose: pairs and quads within 128-bit lanes, then
/// lanes across the four quads of rows.
///
/// # Safety
/// AVX-512F is enabled; `src` and `dst` address 16 rows of 16 values at
/// their strides.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16(src: *const f32, ss: usize, dst: *mut f32, ds: usize, scale: f32) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's features and blocks.
    unsafe {
        // Closures would compile without the caller's features: loops.
        let k = _mm512_set1_ps(scale);
        let mut r = [k; 16];
        for (i, x) in r.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(src.add(i * ss)), k);
        }
        let mut t = [k; 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4h + m]: in 128-bit lane q, column 4q + m of rows 4h..4h + 4.
        let mut u = [k; 16];
        for h in 0..4 {
            let t = &t[4 * h..];
            u[4 * h] = _mm512_shuffle_ps::<0x44>(t[0], t[2]);
            u[4 * h + 1] = _mm512_shuffle_ps::<0xEE>(t[0], t[2]);
            u[4 * h + 2] = _mm512_shuffle_ps::<0x44>(t[1], t[3]);
            u[4 * h + 3] = _mm512_shuffle_ps::<0xEE>(t[1], t[3]);
        }
        for m in 0..4 {
            let (a, b) = (u[m], u[4 + m]);
            let (c, d) = (u[8 + m], u[12 + m]);
            // Lanes 0 and 2 of each, then 1 and 3.
            let (v02, w02) = (_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0x88>(c, d));
            let (v13, w13) = (_mm512_shuffle_f32x4::<0xDD>(a, b), _mm512_shuffle_f32x4::<0xDD>(c, d));
            _mm512_storeu_ps(dst.add(m * ds), _mm512_shuffle_f32x4::<0x88>(v02, w02));
            _mm512_storeu_ps(dst.add((8 + m) * ds), _mm512_shuffle_f32x4::<0xDD>(v02, w02));
            _mm512_storeu_ps(dst.add((4 + m) * ds), _mm512_shuffle_f32x4::<0x88>(v13, w13));
            _mm512_storeu_ps(dst.add((12 + m) * ds), _mm512_shuffle_f32x4::<0xDD>(v13, w13));
        }
    }
}

#[cfg(target_arch = "x86_64")]
via_lanes!(std::arch::x86_64::__m256, transpose8);
#[cfg(target_arch = "x86_64")]
via_lanes!(std::arch::x86_64::__m512, transpose16);

/// See [`Vector::exp_flushed`]: `e^-87` is normal (`2^-125.5`), and so is
/// every intermediate of the recipe from there up.
pub(super) const EXP_FLOOR: f32 = -87.0;

/// Eight lanes of portable code: the passes' arithmetic on any CPU (LLVM
/// vectorizes what it can).
#[derive(Clone, Copy)]
pub(super) struct Portable([f32; 8]);

impl Portable {
    /// `f` lane by lane.
    #[inline(always)]
    fn map2(self, b: Portable, f: impl Fn(f32, f32) -> f32) -> Portable {
        let mut out = self.0;
        for (o, y) in out.iter_mut().zip(b.0) {
            *o = f(*o, y);
        }
        Portable(out)
    }
}

impl Vector for Portable {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable([0.0; 8])
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Portable([x; 8])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's pointer addresses 8 readable f32 values.
        Portable(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's pointer addresses 8 writable f32 values.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(self.0) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        self.map2(b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        self.map2(b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        self.map2(b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn fma(self, b: Self, c: Self) -> Self {
        let mut out = self.0;
        for ((o, y), z) in out.iter_mut().zip(b.0).zip(c.0) {
            *o = o.mul_add(y, z);
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        // `vmaxps`'s rule: the second operand unless the first is greater.
        self.map2(b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    unsafe fn exp_flushed(self) -> Self {
        Portable(self.0.map(|x| if x < EXP_FLOOR { 0.0 } else { crate::fastmath::exp(x) }))
    }
    #[inline(always)]
    unsafe fn transpose(src: *const f32, ss: usize, dst: *mut f32, ds: usize, scale: f32) {
        for r in 0..8 {
            for c in 0..8 {
                // SAFETY: the caller's blocks.
                unsafe { *dst.add(c * ds + r) = *src.add(r * ss + c) * scale };
            }
        }
    }
}
