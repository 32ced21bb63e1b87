//! The JIT's kernels and executor against the interpreter: regions, reductions, GEMM, ULP bounds, scalars,
//! the lowering filetests, the compile cache across processes and the thread count's environment variable.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! Nothing here changes process-wide state: the compile cache and
//! `TRACEJIT_NUM_THREADS` cases run this binary again as child processes
//! for one test each. The tests that change the thread count or the split
//! thresholds share the `threaded` binary, under one lock.

#[path = "../common/mod.rs"]
mod common;

mod agreement;
mod compile_cache;
mod executor;
mod filetests;
mod first_call;
mod gemm;
mod lowering;
mod narrow_int;
mod one_hot;
mod reductions;
mod regions;
mod scalars;
mod schedule;
mod smoke;
mod threads_env;
mod ulp;
