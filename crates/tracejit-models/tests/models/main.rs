//! tracejit-models' integration tests: the BERT encoder against a plain f64
//! implementation (`bert`), and, `#[ignore]`d until their data is fetched
//! (`scripts/fetch_minilm.sh`, `scripts/fetch_test_data.sh`),
//! all-MiniLM-L6-v2 from its published files (`minilm::`), as an ONNX
//! file (`minilm_onnx::`) and in its two int8 ONNX forms (`minilm_int8::`).
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! None of these tests changes process-wide state. CI runs the ignored
//! suites by module: `cargo test --workspace --test models -- --ignored
//! minilm::` (and `minilm_onnx::`, `minilm_int8::`).

mod bert;
mod minilm;
mod minilm_int8;
mod minilm_onnx;
