//! tracejit-kernels: the pure-Rust compute kernels of tracejit, with no
//! dependency on the graph IR or the code generator, so that both the JIT
//! (`tracejit-jit`) and the composite ops (`tracejit-nn`) sit on top of it
//! and neither reaches into the other (Cranelift keeps runtime helpers out
//! of `cranelift-codegen` the same way).
//!
//! What lives here:
//! - [`fastmath`]: tracejit's f32 `exp`, `tanh`, `sigmoid` and `erf`
//!   approximations, scalar and over slices, with the constants every form
//!   of them (including the JIT's in-line Cranelift code) shares;
//! - [`simd`]: the same recipes written once over a [`simd::Lanes`] vector
//!   trait and compiled at 8 (AVX2 + FMA) and 16 (AVX-512F) lanes, as
//!   `extern "C"` chunk functions the JIT's kernels call;
//! - [`softmax`]: the row softmax in 256- or 512-bit code;
//! - [`layer_norm`]: the row layer norm (of a sum of up to three inputs) likewise;
//! - [`gemm`]: f32/f64 products of strided matrices through the `gemm`
//!   crate's micro-kernels, chosen per product and cut into output blocks
//!   over the thread pool;
//! - [`threads`]: that pool and the process's thread count;
//! - [`pages`]: transparent huge pages for the large buffers kernels
//!   allocate.
//!
//! Every kernel takes an [`Isa`] from its caller instead of reading a
//! process-wide setting. Kernels whose vector code needs CPU features check
//! them at run time and fall back to portable code with the same results
//! (bit for bit for the math lanes, within the documented tolerance for
//! reductions).
//!
//! ```
//! use tracejit_kernels::{fastmath, simd, Isa};
//!
//! let mut v = [0.0f32, 1.0];
//! simd::exp_in_place_with(&mut v, Isa::native());
//! assert_eq!(v, [1.0, fastmath::exp(1.0)]);
//! ```

#[cfg(target_arch = "x86_64")]
mod amx;
pub mod attention;
pub mod bf16;
pub mod conv;
pub mod fastmath;
pub mod gemm;
pub mod int8;
mod isa;
pub mod layer_norm;
pub mod pages;
pub mod philox;
pub mod pool2d;
pub mod simd;
pub mod softmax;
pub mod target;
pub mod threads;

pub use isa::{Isa, Width, ENV_VAR as ISA_ENV_VAR};
pub use target::{Target, TargetScope};
