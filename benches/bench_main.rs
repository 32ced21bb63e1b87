//! criterion microbenchmarks of tracejit: the signature cache (`cache`),
//! eager per-op overhead against plain ndarray (`eager`), a fused kernel's
//! throughput through a traced function (`kernel`), and first-call latency
//! against graph size (`first_call`).
//!
//! `cargo bench --features bench --bench bench_main` runs them all; pass a filter such as
//! `cargo bench --features bench --bench bench_main -- cache` to run one group.

use criterion::criterion_main;

mod benchmarks;

criterion_main!(
    benchmarks::cache::benches,
    benchmarks::eager::benches,
    benchmarks::kernel::benches,
    benchmarks::first_call::benches
);
