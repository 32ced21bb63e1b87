//! Which compiled form runs a call's tasks: the passes' generic code
//! instantiated at 16 lanes inside `avx512f` functions, at 8 inside
//! `avx2,fma` ones, and as [`Portable`] lanes without target features.
//! Every function reached from an entry point is `#[inline(always)]`, so
//! the intrinsics compile with the entry point's features.
//!
//! Block shapes (`MR` rows × `NV` vectors of the product kernel): 8 × 2
//! at 16 lanes (16 accumulators of the 32 registers: of 8 × 2, 8 × 3,
//! 6 × 4, 4 × 4 and 12 × 2 on W9 and at tq = 1024, the fastest; the
//! larger blocks spill registers in the backward, 12 × 2 in the forward
//! too), 6 × 2 at 8 lanes (12 of 16), 4 × 2 portable.

use super::gradients::{self, BackwardCall};
use super::online::{self, ForwardCall};
use super::vector::Portable;
use crate::{Isa, Width};

/// The code a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// AVX-512F, 16 lanes.
    Avx512,
    /// AVX-512F at 16 lanes with the forward's products in bf16
    /// (`vdpbf16ps`, [`super::lowp`]); the backward as [`Path::Avx512`].
    Avx512Bf16,
    /// AVX2 + FMA, 8 lanes.
    Avx2,
    /// Plain Rust, 8 lanes.
    Portable,
}

impl Path {
    /// The widest code `isa` allows on this CPU ([`Isa::width`] checked
    /// the features).
    pub fn of(isa: Isa) -> Path {
        match isa.width() {
            Some(Width::W16) => Path::Avx512,
            Some(Width::W8) => Path::Avx2,
            None => Path::Portable,
        }
    }

    /// The path of a call whose forward may take bf16 products: with
    /// AVX-512 BF16 (and 16 lanes allowed) [`Path::Avx512Bf16`], else
    /// [`Path::of`] — f32 products, within any bf16 tolerance.
    pub fn of_bf16(isa: Isa) -> Path {
        match Path::of(isa) {
            Path::Avx512 if isa.has_avx512_bf16() => Path::Avx512Bf16,
            other => other,
        }
    }

    /// Floats of scratch a forward task on this path needs.
    pub fn forward_scratch(self, d: usize, dv: usize) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Bf16 => super::lowp::scratch_len(d, dv),
            _ => online::scratch_len(d, dv),
        }
    }
}

/// A width's entry points.
#[cfg(target_arch = "x86_64")]
macro_rules! entry_points {
    ($module:ident, $v:ty, $mr:literal, $nv:literal, $features:literal) => {
        mod $module {
            use super::*;

            /// A forward task.
            ///
            /// # Safety
            /// As [`online::task`]; the CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn forward(call: &ForwardCall<'_>, t: usize, scratch: *mut f32) {
                // SAFETY: forwarded from the caller.
                unsafe { online::task::<$v, $mr, $nv>(call, t, scratch) }
            }

            /// A backward task.
            ///
            /// # Safety
            /// As [`gradients::task`]; the CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn backward(call: &BackwardCall<'_>, t: usize, scratch: *mut f32) {
                // SAFETY: forwarded from the caller.
                unsafe { gradients::task::<$v, $mr, $nv>(call, t, scratch) }
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
entry_points!(x16, std::arch::x86_64::__m512, 8, 2, "avx512f");
#[cfg(target_arch = "x86_64")]
entry_points!(x8, std::arch::x86_64::__m256, 6, 2, "avx2,fma");

/// Forward task `t` on `path`.
///
/// # Safety
/// As [`online::task`]; `path` came from [`Path::of`] (or is portable).
pub(super) unsafe fn forward(path: Path, call: &ForwardCall<'_>, t: usize, scratch: *mut f32) {
    // SAFETY: forwarded; `Path::of` found the features of the width.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => x16::forward(call, t, scratch),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Bf16 => super::lowp::task(call, t, scratch),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => x8::forward(call, t, scratch),
            _ => online::task::<Portable, 4, 2>(call, t, scratch),
        }
    }
}

/// Backward task `t` on `path`.
///
/// # Safety
/// As [`gradients::task`]; `path` came from [`Path::of`] (or is portable).
pub(super) unsafe fn backward(path: Path, call: &BackwardCall<'_>, t: usize, scratch: *mut f32) {
    // SAFETY: forwarded; `Path::of` found the features of the width.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 | Path::Avx512Bf16 => x16::backward(call, t, scratch),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => x8::backward(call, t, scratch),
            _ => gradients::task::<Portable, 4, 2>(call, t, scratch),
        }
    }
}
