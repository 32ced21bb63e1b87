//! ONNX import without downloads: hand-built `ModelProto`s (prost) for a
//! few ops checked against independent references (plain loops, or the
//! eager `Tensor` / `tracejit::nn` functions the ops map onto), the
//! importer's errors, static inputs and retracing, and round trips through
//! the exporter (`to_bytes` -> `import_bytes` -> the same outputs).
//!
//! ONNX's own suite is `crate::conformance` (it needs the test data).

mod attention;
mod attention_chain;
mod builder;
mod control;
mod conv3d;
mod cumprod;
mod einsum;
mod errors;
mod fine_tune;
mod flex_attention;
mod linear_attention;
mod ops;
mod pool_nd;
mod quant;
mod resize;
mod rnn;
mod rotary;
mod round_trip;
mod scan;
mod signal;
mod state;
