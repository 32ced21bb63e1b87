//! tracejit-jit compiles the hot parts of a tracejit graph to native code
//! with Cranelift and runs whole graphs fast.
//!
//! Three layers:
//! - **Fused region kernels** ([`supports`], [`compile_region`],
//!   [`CompiledRegion`]): a region is a small graph of elementwise ops,
//!   broadcasts and row/column reductions; it becomes one kernel function
//!   with vectorized (`f32x4`/`f64x2`/`i32x4`/`i64x2`), unrolled, rotated
//!   loops, transcendentals approximated in-line, and strides per input so
//!   that broadcasting costs nothing. Kernels are cached by structure, so
//!   identical regions in different functions compile once.
//! - **The codegen passes** ([`codegen`]): every decision the JIT makes
//!   about a graph — regions, the steps, which products pair, which loops
//!   run in row blocks, which buffers are reused — as a named pass in a
//!   list, each verified and dumped like the IR's passes.
//! - **The executor** ([`Executable`]): runs the flat schedule of steps the
//!   passes leave over a whole graph — fused regions, matrix products
//!   through a fast GEMM, native kernels, and every other op through the
//!   reference kernels — freeing values after their last use.
//!
//! The SIMD kernels themselves (vector math, GEMM entry points, the thread
//! pool) live in `tracejit-kernels`, below this crate and the composites.
//!
//! What the code is built for comes down from the entry point as one
//! [`Target`] inside [`JitOptions`] (the ISA, the thread count, the GEMM
//! and split thresholds): the ISA picks the code and keys the kernel
//! caches, the GEMM threshold is planned into the schedule, and an
//! [`Executable`] enters its target on every call, so nothing below it
//! reads a process-wide setting while it runs.
//!
//! # Memory
//!
//! Region outputs, matrix products and the row kernels' scratch space come
//! from a per-executable buffer pool: values freed at their last use and
//! results the caller has dropped are reused by later calls (a buffer is
//! only reused once nothing else holds it, so a live result is never
//! overwritten). A steady-state call therefore allocates only the outputs
//! the caller still holds, plus bookkeeping that does not grow with tensor
//! sizes (`tests/steady_state_alloc.rs` checks this with a counting
//! allocator).
//! Steps that fall back to the reference kernels allocate their results.
//! Concurrent calls never share a pool: a call that finds the pool busy runs
//! with an empty one.
//!
//! # Threads
//!
//! Large region kernels and f32/f64 matrix products split across a thread
//! pool ([`threads`]: `set_num_threads`, default the cores available or
//! `TRACEJIT_NUM_THREADS`); small ones run on the calling thread. Results
//! are bit-identical for every thread count: kernels split only where
//! outputs are independent (rows of a row reduction, element ranges,
//! columns of a column reduction), and never along a reduced axis.
//!
//! # Which regions compile
//!
//! See [`supports`]: elementwise regions over any broadcasting; *row*
//! reductions (over trailing axes: softmax, layernorm, full sums) with any
//! number of chained passes; *column* reductions (over leading axes: bias
//! gradients) in one pass. All five dtypes. Anything else stays with the
//! reference kernels.
//!
//! # Numerics
//!
//! Results are **bit-identical** to the interpreter (the reference kernels)
//! for every op except the cases below; NaN payloads are not preserved (any
//! NaN stands for NaN, as the reference's own NaN operand order is not
//! specified). User arithmetic is never contracted into FMA.
//!
//! - f32 `exp`, `log`, `tanh`, `sigmoid` and `erf` are in-kernel polynomial
//!   or rational approximations (recipes from Cephes and Eigen, see the
//!   `math` module). Measured maximum error against a correctly rounded f64
//!   reference, over a dense sweep of every binade plus edge cases
//!   (±0, ±inf, NaN, subnormals, overflow), enforced by `tests/kernels/ulp.rs`:
//!
//!   | function | max ULP measured (worst input) | bound enforced |
//!   |---|---|---|
//!   | exp | 1 (x ≈ 6e-8) | 1 |
//!   | log | 4 (x ≈ 1.007, where the result is small) | 4 |
//!   | tanh | 4 (x ≈ 8.02, near the clamp) | 4 |
//!   | sigmoid | 2 (x ≈ -1.11) | 2 |
//!   | erf | 6 (x ≈ 3.449, where the result is within 1e-6 of 1; every f32 in [0, 4] checked) | 6 |
//!
//!   (ULP distances are counted in f32 values; near zero, where a result is
//!   subnormal, the same count applies.)
//!
//!   On x86_64 CPUs with AVX-512F, or AVX2 and FMA, the f32 `exp`, `tanh`,
//!   `sigmoid` and `erf` of elementwise and row regions run in 512-bit or 256-bit
//!   functions compiled by rustc (Cranelift emits 128-bit vectors only;
//!   `TRACEJIT_JIT_AVX512=0` or [`JitOptions::avx512`] keeps them at 256
//!   bits, and both widths compute the same bits): the kernel stores their
//!   argument into a scratch buffer (a chunk of 512 elements, or the row of
//!   a row region), calls the function and reads the results back. They
//!   follow the same recipes operation for operation, so the bounds above
//!   hold for both (`TRACEJIT_JIT_STAGE=0`, or
//!   [`JitOptions::stage`], turns this off; CI runs the ULP
//!   and region tests both ways).
//!
//! - In the last loop of a row region, a division by a row invariant (a
//!   softmax's row sum) is a multiplication by its reciprocal, computed once
//!   per row: within one epsilon (relative) of the division. Rows whose
//!   divisor is 0, ±inf, NaN, subnormal or too large for a normal
//!   reciprocal divide instead, bit for bit (`tests/kernels/reductions.rs`).
//!
//!   [`fastmath`] offers the same f32 `exp`, `tanh`, `sigmoid` and `erf` to Rust
//!   code (the `tracejit-nn` kernels use it): scalar functions and in-place
//!   slice functions, with the constants the Cranelift and vector code share.
//!   The in-line code, the chunk functions and `fastmath` compute the same
//!   bits for every non-NaN result (`tests/kernels/agreement.rs`), so the exp,
//!   tanh, sigmoid and erf rows of the table above hold for all three. (Why
//!   wider code pays, with figures: `examples/throughput.rs` and the
//!   benchmark table in the README.)
//! - f64 transcendentals and f32/f64 `expm1`, `log1p`, `sin`, `cos`, `sinh`,
//!   `cosh`, `atan`, `softplus`, `pow`
//!   and float `rem` call a Rust helper per element (the same `std`/`libm`
//!   function as the reference), so they are exact.
//! - Reductions: integer reductions and `max`/`min` are exact (`max`/`min`
//!   propagate NaN; the sign of a zero result may differ when both `+0` and
//!   `-0` reach the extreme, as lanes are visited in a different order).
//!   Float `sum`/`mean`/`prod` over trailing axes accumulate in `4·U` lane
//!   partials combined in a fixed order, not sequentially; the result is
//!   within `n·ε·Σ|xᵢ|` of the reference (ε the dtype's epsilon). Over
//!   leading axes (column regions) the order is the reference's, so the
//!   result is exact.
//! - Hand-written kernels: an f32 row softmax region (`exp(x - max(x)) /
//!   sum(...)` over the row, nothing else) runs a Rust kernel with the
//!   generated kernels' arguments instead of Cranelift code
//!   ([`CompiledRegion::native_kernel`] names it): every pass in 512-bit
//!   (AVX-512F) or 256-bit (AVX2) vectors, `exp` written straight into the
//!   output, the same `exp` bits, max and reciprocal rule as the generated
//!   kernel, the sum in four 16- or 8-lane partials (within the sum bound
//!   above). W3 went from about 940 to about 650 µs with the 256-bit kernel
//!   on one core, and to about 425 µs with the 512-bit one on a Zen 4 (whose
//!   32 vector registers hold every constant of `exp`; the 256-bit loop
//!   spills). Needs AVX2 + FMA or AVX-512F, and staging on
//!   (`TRACEJIT_JIT_STAGE=0` keeps the generated kernel; `tests/threaded/native.rs`
//!   compares the two). Likewise an f32 row layer norm (`((h - mean) ·
//!   rsqrt(var + ε)) · γ + β` with `h` one input or the sum of two or three,
//!   `h` returned too or not, nothing else): the three passes in 16- or
//!   8-lane vectors, every elementwise step rounded as written, the sums in
//!   four partials (`tests/threaded/native_layer_norm.rs`). W4 (a 1024 ×
//!   1024 layer norm) went from 225 to 125 µs on one Zen 5 core.

//!
//! # Debugging
//!
//! Every knob is a field of [`JitOptions`], read from the environment once
//! per process ([`JitOptions::global`]) and part of the kernel cache key:
//! `TRACEJIT_JIT_DUMP=1` prints each kernel's Cranelift IR and machine code
//! as it compiles; `TRACEJIT_JIT_UNROLL=1|2|4|8` overrides the vector unroll
//! factor (default 4, or 2 for kernels with transcendentals) for experiments;
//! `TRACEJIT_JIT_STAGE=0` keeps every transcendental in-line.
//! [`compile_region_with`] and [`Executable::with_options`] take explicit
//! options.

mod analysis;
mod cache_entry;
mod chunks;
mod clif_casts;
mod clif_ops;
mod code_image;
pub mod codegen;
pub mod compile_cache;
mod const_table;
mod dispatch;
mod error;
mod executor;
mod gemm;
mod gemm_bf16;
mod helpers;
mod jit;
mod kernel;
mod loader;
mod malloc;
pub use malloc::Warmed;
mod math;
mod native;
mod options;
mod pool;
mod region;
mod row_blocks;
mod scalar;
mod schedule;
mod spatial;
pub mod wire;

pub use analysis::MAX_CONST_ELEMENTS;
pub use error::JitError;
pub use executor::{Executable, Profile, ScheduleStats, StepTime};
pub use gemm::{matmul, matmul_reusing};
pub use options::JitOptions;
pub use region::{
    compile_region, compile_region_with, kernel_cache_len, region_program, supports, unsupported_reason, CompiledRegion,
};
pub use spatial::spatial;

/// Fixes glibc malloc's mmap and trim thresholds the first time it is
/// called (once per process; opt out with `TRACEJIT_MALLOC_TUNING=0`, and a
/// threshold the user set is kept), so that the 0.1-32 MiB buffers of
/// compiled calls and eager ops come from the heap and are reused instead
/// of being mapped, faulted in and unmapped on every call. Building an
/// executable calls it; eager ops call it too (an eager softmax over
/// [1024, 1024] took 10.6 ms with the glibc defaults and 3.1 ms with these).
/// True when this process's thresholds are the ones set here.
pub fn tune_malloc() -> bool {
    malloc::tune_once()
}
/// The thread pool and thread count, and the f32 approximations of `exp`,
/// `tanh`, `sigmoid` and `erf` the kernels share: they live in the kernel crate
/// (`tracejit-kernels`) under both this crate and the composites.
pub use tracejit_kernels::{fastmath, simd, threads, Target};
