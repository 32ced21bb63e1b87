//! The JIT's kernels and executor against the interpreter: regions, reductions, GEMM, ULP bounds, scalars.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! Tests that change process-wide state (thread counts, thresholds, the
//! eager switch, a counting allocator) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod agreement;
mod executor;
mod gemm;
mod lowering;
mod narrow_int;
mod one_hot;
mod reductions;
mod regions;
mod scalars;
mod smoke;
mod ulp;
