//! tracejit-onnx's integration tests: export (every exported model run in
//! tract), import (hand-built models against independent references, round
//! trips through the exporter), and, `#[ignore]`d until their data is
//! fetched (`scripts/fetch_test_data.sh`), ONNX's conformance suite
//! (`conformance::`) and the nine light ImageNet models (`real_models::`).
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace (and tract, the export tests' runtime), so merging them cut
//! the test build's link time and disk. None of these tests changes
//! process-wide state (the conformance runner catches panics with
//! `tracejit_ir::catch_quietly` instead of replacing the panic hook), so
//! they share the process. CI runs the ignored suites by module:
//! `cargo test --workspace --test onnx -- --ignored conformance::` and
//! `... real_models::`.

mod common;
mod conformance;
mod export;
mod import;
mod real_models;
