//! ONNX import without downloads: hand-built `ModelProto`s (prost) for a
//! few ops checked against independent references (plain loops, or the
//! eager `Tensor` / `tracejit::nn` functions the ops map onto), the
//! importer's errors, static inputs and retracing, and round trips through
//! the exporter (`to_bytes` -> `import_bytes` -> the same outputs).
//!
//! ONNX's own suite is `tests/conformance.rs` (it needs the test data).

mod builder;
mod errors;
mod ops;
mod quant;
mod round_trip;
