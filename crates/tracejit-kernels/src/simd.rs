//! f32 `exp`, `tanh`, `sigmoid` and `erf` over a chunk of memory, in place, with
//! 512-bit AVX-512 or 256-bit AVX2 + FMA code compiled by rustc.
//!
//! Why: Cranelift lowers 128-bit vectors only, and these functions are most
//! of the work of the regions that use them (gelu, softmax, LSTM gates).
//! On this machine the same tanh recipe runs 1.04 ns/element with 128-bit
//! code and 0.55 with 256-bit code. A kernel therefore stores the argument
//! of such a function into a scratch chunk, calls one of these, and reads
//! the results back (see `tracejit-jit`'s `kernel.rs`, "staged" nodes).
//!
//! The recipes are exactly those of the JIT's in-line code (the constants of
//! [`crate::fastmath`], same operation order, same FMAs, Estrin's scheme for
//! exp's polynomial), so a staged kernel computes the same bits as the
//! in-kernel code and as `fastmath`, and the documented ULP bounds hold for
//! all three (`tests/kernels/agreement.rs`). The tail of a chunk that does not
//! fill a vector is padded, computed as a vector and copied back.
//!
//! Each recipe is written once over [`lanes::Lanes`] and compiled twice:
//! 16 lanes where the CPU has AVX-512F and the caller's [`Isa`] allows it
//! (W3's row softmax ran 1.5x faster than with 8 lanes on a Zen 4: the
//! 8-lane code spills registers and re-loads its constants, 32 registers
//! hold them all), else 8 lanes with AVX2 + FMA. Both compute the same
//! bits. Other x86_64 CPUs and other architectures compute everything
//! in-line.

use crate::{Isa, Width};

#[cfg(target_arch = "x86_64")]
pub mod lanes;
#[cfg(target_arch = "x86_64")]
pub use lanes::Lanes;

/// A chunk function: `p[i] = f(p[i])` for `i < n`.
pub type ChunkFn = unsafe extern "C" fn(*mut f32, i64);

/// The functions with vector chunk code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathFn {
    /// `e^x` ([`crate::fastmath::exp`]).
    Exp,
    /// `tanh(x)` ([`crate::fastmath::tanh`]).
    Tanh,
    /// `1 / (1 + e^-x)` ([`crate::fastmath::sigmoid`]).
    Sigmoid,
    /// `erf(x)` ([`crate::fastmath::erf`]).
    Erf,
}

impl MathFn {
    /// Every function, in table order.
    pub const ALL: [MathFn; 4] = [MathFn::Exp, MathFn::Tanh, MathFn::Sigmoid, MathFn::Erf];

    /// The scalar form ([`crate::fastmath`]), which the chunks match bit
    /// for bit.
    pub fn scalar(self) -> fn(f32) -> f32 {
        match self {
            MathFn::Exp => crate::fastmath::exp,
            MathFn::Tanh => crate::fastmath::tanh,
            MathFn::Sigmoid => crate::fastmath::sigmoid,
            MathFn::Erf => crate::fastmath::erf,
        }
    }
}

/// The exp, tanh, sigmoid and erf chunk functions of width `w`, with their
/// symbol names.
#[cfg(target_arch = "x86_64")]
fn table(w: Width) -> [(&'static str, ChunkFn); 4] {
    match w {
        Width::W16 => [
            ("tracejit_chunk_exp_f32x16", avx512::exp_chunk),
            ("tracejit_chunk_tanh_f32x16", avx512::tanh_chunk),
            ("tracejit_chunk_sigmoid_f32x16", avx512::sigmoid_chunk),
            ("tracejit_chunk_erf_f32x16", avx512::erf_chunk),
        ],
        Width::W8 => [
            ("tracejit_chunk_exp_f32x8", avx2::exp_chunk),
            ("tracejit_chunk_tanh_f32x8", avx2::tanh_chunk),
            ("tracejit_chunk_sigmoid_f32x8", avx2::sigmoid_chunk),
            ("tracejit_chunk_erf_f32x8", avx2::erf_chunk),
        ],
    }
}

/// The chunk function for `f` on this CPU under `isa`, with its symbol
/// name; `None` where the CPU has neither AVX2 + FMA nor AVX-512F.
pub fn chunk_fn(f: MathFn, isa: Isa) -> Option<(&'static str, ChunkFn)> {
    #[cfg(target_arch = "x86_64")]
    {
        let t = table(isa.width()?);
        Some(match f {
            MathFn::Exp => t[0],
            MathFn::Tanh => t[1],
            MathFn::Sigmoid => t[2],
            MathFn::Erf => t[3],
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (f, isa);
        None
    }
}

/// Every chunk function this CPU has, at each width it has: (symbol name,
/// address), for the JIT's symbol table.
pub fn symbols() -> Vec<(&'static str, *const u8)> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut widths: Vec<Width> =
            [Isa::native(), Isa::native().with_avx512(false)].iter().filter_map(|i| i.width()).collect();
        // Without AVX-512F both give 8 lanes.
        widths.dedup();
        widths.into_iter().flat_map(table).map(|(name, f)| (name, f as *const u8)).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// `v[i] = f(v[i])` over a slice: the slice forms of [`crate::fastmath`]'s
/// functions, in the chunk code `isa` allows (the scalar functions where the
/// CPU has no vector code: slower where `mul_add` has no FMA instruction
/// under it, never different).
///
/// ```
/// use tracejit_kernels::{fastmath, simd};
///
/// let mut v = [0.0f32, 1.0, -1.0, f32::INFINITY];
/// simd::exp_in_place(&mut v);
/// assert_eq!(v, [1.0, fastmath::exp(1.0), fastmath::exp(-1.0), f32::INFINITY]);
/// ```
///
/// This one: `v[i] = exp(v[i])` for every element, with the widest vector
/// code this CPU has ([`exp_in_place_with`] to choose).
pub fn exp_in_place(v: &mut [f32]) {
    exp_in_place_with(v, Isa::native());
}

/// `v[i] = tanh(v[i])` for every element ([`tanh_in_place_with`] to choose
/// the vector code).
pub fn tanh_in_place(v: &mut [f32]) {
    tanh_in_place_with(v, Isa::native());
}

/// `v[i] = sigmoid(v[i])` for every element ([`sigmoid_in_place_with`] to
/// choose the vector code).
pub fn sigmoid_in_place(v: &mut [f32]) {
    sigmoid_in_place_with(v, Isa::native());
}

/// [`exp_in_place`] with the vector code `isa` allows (the same bits at
/// every width).
pub fn exp_in_place_with(v: &mut [f32], isa: Isa) {
    apply(v, MathFn::Exp, isa);
}

/// [`tanh_in_place`] with the vector code `isa` allows.
pub fn tanh_in_place_with(v: &mut [f32], isa: Isa) {
    apply(v, MathFn::Tanh, isa);
}

/// [`sigmoid_in_place`] with the vector code `isa` allows.
pub fn sigmoid_in_place_with(v: &mut [f32], isa: Isa) {
    apply(v, MathFn::Sigmoid, isa);
}

/// `v[i] = erf(v[i])` for every element ([`erf_in_place_with`] to choose
/// the vector code).
pub fn erf_in_place(v: &mut [f32]) {
    erf_in_place_with(v, Isa::native());
}

/// [`erf_in_place`] with the vector code `isa` allows.
pub fn erf_in_place_with(v: &mut [f32], isa: Isa) {
    apply(v, MathFn::Erf, isa);
}

fn apply(v: &mut [f32], f: MathFn, isa: Isa) {
    match chunk_fn(f, isa) {
        // SAFETY: `v` holds `v.len()` writable f32 values, and `chunk_fn`
        // hands out a function only when the CPU has the features it needs.
        Some((_, chunk)) => unsafe { chunk(v.as_mut_ptr(), v.len() as i64) },
        None => v.iter_mut().for_each(|x| *x = f.scalar()(*x)),
    }
}

/// The recipes, generic over the vector width.
#[cfg(target_arch = "x86_64")]
pub mod recipes {
    use super::lanes::Lanes;
    use crate::fastmath::{
        ERF_LIM, ERF_P, ERF_Q, EXP_MAX, EXP_MIN, EXP_NEG_LN2_HI, EXP_NEG_LN2_LO, EXP_POLY, ROUND_MAGIC,
        ROUND_MAGIC_BITS, TANH_CLAMP, TANH_P, TANH_Q,
    };

    /// `x < lo ? lo : x`, then `hi < y ? hi : y` (NaN kept): `maxps` /
    /// `minps` return their second operand when either is NaN.
    #[inline(always)]
    unsafe fn clamp<V: Lanes>(x: V, lo: f32, hi: f32) -> V {
        // SAFETY: the caller's features (see `Lanes`).
        unsafe { V::splat(hi).min(V::splat(lo).max(x)) }
    }

    /// `math::exp_f32`, `fastmath::exp`.
    ///
    /// # Safety
    /// The features of `V` are enabled in the caller.
    #[inline(always)]
    pub unsafe fn exp<V: Lanes>(x: V) -> V {
        // SAFETY: the caller's features.
        unsafe {
            let k = |c: f32| V::splat(c);
            let x = clamp(x, EXP_MIN, EXP_MAX);
            let magic = k(ROUND_MAGIC);
            let t = x.fma(k(std::f32::consts::LOG2_E), magic);
            let n = t.sub(magic);
            let r = n.fma(k(EXP_NEG_LN2_HI), x);
            let r = n.fma(k(EXP_NEG_LN2_LO), r);
            // Estrin, pairing coefficients from the lowest degree up.
            let [c5, c4, c3, c2, c1, c0] = EXP_POLY;
            let t0 = k(c1).fma(r, k(c0));
            let t1 = k(c3).fma(r, k(c2));
            let t2 = k(c5).fma(r, k(c4));
            let r2 = r.mul(r);
            let t01 = t1.fma(r2, t0);
            let r4 = r2.mul(r2);
            let p = t2.fma(r4, t01);
            let y = p.fma(r2, r).add(k(1.0));
            let (s1, s2) = V::exp_scales(t, ROUND_MAGIC_BITS);
            y.mul(s1).mul(s2)
        }
    }

    /// The polynomial `coeffs` (highest degree first) at `x` by Horner's
    /// rule, one FMA a step (`math`'s `horner`, `fastmath::horner`).
    #[inline(always)]
    unsafe fn horner<V: Lanes>(x: V, coeffs: &[f32]) -> V {
        // SAFETY: the caller's features.
        unsafe { coeffs[1..].iter().fold(V::splat(coeffs[0]), |p, &c| p.fma(x, V::splat(c))) }
    }

    /// `math::tanh_f32`, `fastmath::tanh`.
    #[inline(always)]
    unsafe fn tanh<V: Lanes>(x: V) -> V {
        // SAFETY: the caller's features.
        unsafe {
            let x = clamp(x, -TANH_CLAMP, TANH_CLAMP);
            let x2 = x.mul(x);
            let x3 = x2.mul(x);
            x3.fma(horner(x2, &TANH_P), x).div(horner(x2, &TANH_Q))
        }
    }

    /// `math::sigmoid_f32`, `fastmath::sigmoid`.
    #[inline(always)]
    unsafe fn sigmoid<V: Lanes>(x: V) -> V {
        // SAFETY: the caller's features.
        unsafe {
            let e = exp(x.abs().neg());
            let one = V::splat(1.0);
            x.where_negative(e, one).div(one.add(e))
        }
    }

    /// `math::erf_f32`, `fastmath::erf`.
    #[inline(always)]
    unsafe fn erf<V: Lanes>(x: V) -> V {
        // SAFETY: the caller's features.
        unsafe {
            let x2 = x.mul(x);
            let r = x.mul(horner(x2, &ERF_P)).div(horner(x2, &ERF_Q));
            // ±1 where `ERF_LIM <= |x|`, which for floats is `|x| > the
            // float below ERF_LIM`: that difference is negative exactly
            // then (a difference of two floats is 0 only when they are
            // equal), and NaN (never selected) for a NaN `x`.
            let below = V::splat(f32::from_bits(ERF_LIM.to_bits() - 1));
            let s = x.where_negative(V::splat(-1.0), V::splat(1.0));
            below.sub(x.abs()).where_negative(s, r)
        }
    }

    /// One of the recipes, as a type: a closure would be compiled without
    /// the entry point's target features and stay an out-of-line call.
    pub trait Recipe {
        /// The recipe at width `V`.
        ///
        /// # Safety
        /// The features of `V` are enabled in the caller.
        unsafe fn at<V: Lanes>(x: V) -> V;
    }
    /// [`exp`].
    pub struct Exp;
    /// [`tanh`].
    pub struct Tanh;
    /// [`sigmoid`].
    pub struct Sigmoid;
    /// [`erf`].
    pub struct Erf;
    impl Recipe for Exp {
        #[inline(always)]
        unsafe fn at<V: Lanes>(x: V) -> V {
            // SAFETY: forwarded.
            unsafe { exp(x) }
        }
    }
    impl Recipe for Tanh {
        #[inline(always)]
        unsafe fn at<V: Lanes>(x: V) -> V {
            // SAFETY: forwarded.
            unsafe { tanh(x) }
        }
    }
    impl Recipe for Sigmoid {
        #[inline(always)]
        unsafe fn at<V: Lanes>(x: V) -> V {
            // SAFETY: forwarded.
            unsafe { sigmoid(x) }
        }
    }
    impl Recipe for Erf {
        #[inline(always)]
        unsafe fn at<V: Lanes>(x: V) -> V {
            // SAFETY: forwarded.
            unsafe { erf(x) }
        }
    }

    /// Applies `R` to `n` values at `p`, a vector at a time; the last
    /// partial vector goes through a padded copy.
    ///
    /// # Safety
    /// `p` addresses `n` writable f32 values; the features of `V` are
    /// enabled in the caller.
    #[inline(always)]
    pub unsafe fn apply<V: Lanes, R: Recipe>(p: *mut f32, n: i64) {
        let n = usize::try_from(n).unwrap_or(0);
        let mut i = 0;
        // SAFETY: forwarded from the caller.
        unsafe {
            while i + V::LANES <= n {
                R::at(V::load(p.add(i))).store(p.add(i));
                i += V::LANES;
            }
            if i < n {
                let mut tail = [0.0f32; 16];
                std::ptr::copy_nonoverlapping(p.add(i), tail.as_mut_ptr(), n - i);
                R::at(V::load(tail.as_ptr())).store(tail.as_mut_ptr());
                std::ptr::copy_nonoverlapping(tail.as_ptr(), p.add(i), n - i);
            }
        }
    }
}

/// The entry points of one width: `extern "C"` functions compiled with its
/// target features, handed to kernels by [`chunk_fn`].
macro_rules! entry_points {
    ($module:ident, $v:ty, $features:literal, $cpu:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[doc = concat!("The chunk functions compiled for ", $cpu, ".")]
        pub mod $module {
            use super::recipes::{apply, Erf, Exp, Sigmoid, Tanh};
            use std::arch::x86_64::*;

            entry_points!(@one exp_chunk, Exp, $v, $features, $cpu);
            entry_points!(@one tanh_chunk, Tanh, $v, $features, $cpu);
            entry_points!(@one sigmoid_chunk, Sigmoid, $v, $features, $cpu);
            entry_points!(@one erf_chunk, Erf, $v, $features, $cpu);
        }
    };
    (@one $name:ident, $recipe:ident, $v:ty, $features:literal, $cpu:literal) => {
        #[doc = concat!("In place over `n` f32 values at `p`.\n\n# Safety\n`p` addresses `n` writable f32 values; the CPU has ", $cpu, " ([`super::chunk_fn`] hands it out only then).")]
        #[target_feature(enable = $features)]
        pub unsafe extern "C" fn $name(p: *mut f32, n: i64) {
            // SAFETY: forwarded from the caller.
            unsafe { apply::<$v, $recipe>(p, n) }
        }
    };
}
entry_points!(avx2, __m256, "avx2,fma", "AVX2 and FMA");
entry_points!(avx512, __m512, "avx512f", "AVX-512F");

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice forms (vector code here when the CPU has it) give the scalar
    /// functions' bits, tails included.
    #[test]
    fn slices_match_the_scalar_functions() {
        let xs: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) * 0.037).collect();
        for (f, slice) in [
            (crate::fastmath::exp as fn(f32) -> f32, exp_in_place as fn(&mut [f32])),
            (crate::fastmath::tanh, tanh_in_place),
            (crate::fastmath::sigmoid, sigmoid_in_place),
            (crate::fastmath::erf, erf_in_place),
        ] {
            let mut v = xs.clone();
            slice(&mut v);
            for (&x, &y) in xs.iter().zip(&v) {
                assert_eq!(y.to_bits(), f(x).to_bits(), "at {x}");
            }
        }
    }

    /// Both widths against the scalar recipe, bit for bit, on special
    /// values and a sweep of exponents, in chunks that end in every tail
    /// length.
    #[test]
    fn both_widths_match_fastmath_bit_for_bit() {
        let mut xs: Vec<f32> = vec![
            f32::NAN,
            0.0,
            -0.0,
            1.0,
            -1.0,
            100.0,
            -100.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.5,
            3.0,
            -88.5,
            89.5,
        ];
        let mut s = 0x9e37_79b9u32;
        for _ in 0..4000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // Uniform bits over finite magnitudes below 2^8, both signs.
            let bits = (s & 0x8000_0000) | (s % 0x4380_0000);
            xs.push(f32::from_bits(bits));
        }
        for avx512 in [true, false] {
            let isa = Isa::native().with_avx512(avx512);
            for op in MathFn::ALL {
                let f = op.scalar();
                let Some((name, chunk)) = chunk_fn(op, isa) else { return };
                for len in [0, 1, 3, 5, 8, 15, 16, 17, 31, 1023] {
                    for part in xs.chunks(len.max(1)).take(if len == 0 { 1 } else { 40 }) {
                        let mut v = part[..len.min(part.len())].to_vec();
                        // SAFETY: `v` holds `v.len()` f32 values.
                        unsafe { chunk(v.as_mut_ptr(), v.len() as i64) };
                        for (x, g) in part.iter().zip(&v) {
                            let w = f(*x);
                            assert!(
                                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                                "{name}({x:e}) = {g:e}, fastmath {w:e}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The values themselves are right (the recipes, not only their
    /// agreement): NaN, the tail path and the special values.
    #[test]
    fn chunks_handle_tails_and_specials() {
        for avx512 in [true, false] {
            let isa = Isa::native().with_avx512(avx512);
            for op in MathFn::ALL {
                let Some((_, f)) = chunk_fn(op, isa) else { return };
                let mut v: Vec<f32> =
                    vec![f32::NAN, 0.0, -0.0, 1.0, -1.0, 100.0, -100.0, f32::INFINITY, f32::NEG_INFINITY, 0.5, 3.0];
                let want: Vec<f64> = v
                    .iter()
                    .map(|&x| {
                        let x = f64::from(x);
                        let y = if op == MathFn::Exp {
                            x.exp()
                        } else if op == MathFn::Tanh {
                            x.tanh()
                        } else if op == MathFn::Erf {
                            libm::erf(x)
                        } else {
                            1.0 / (1.0 + (-x).exp())
                        };
                        // Rounded to f32: exp(100) overflows to inf there.
                        f64::from(y as f32)
                    })
                    .collect();
                // SAFETY: `v` holds `v.len()` f32 values.
                unsafe { f(v.as_mut_ptr(), v.len() as i64) };
                for (g, w) in v.iter().zip(&want) {
                    let g = f64::from(*g);
                    let ok = (g.is_nan() && w.is_nan()) || g == *w || (g - w).abs() <= 1e-6 * w.abs().max(1e-30);
                    assert!(ok || (w.abs() < 1e-38 && g.abs() < 1e-38), "{op:?}: {g} vs {w}");
                }
            }
        }
    }
}
