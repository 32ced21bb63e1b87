//! The harness's workloads: their schedules and their verification against eager.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! Tests that change process-wide state (thread counts, thresholds, the
//! eager switch, a counting allocator) keep binaries of their own.

mod schedule;
mod verification;
