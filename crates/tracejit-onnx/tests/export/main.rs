//! ONNX export: every exported model run in tract and compared with tracejit.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! Tests that change process-wide state (thread counts, thresholds, the
//! eager switch, a counting allocator) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod control;
mod errors;
mod models;
mod names;
mod ops;
mod spatial;
mod transforms;
mod windows;
