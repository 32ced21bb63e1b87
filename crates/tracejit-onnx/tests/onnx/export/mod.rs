//! ONNX export: every exported model run in tract and compared with
//! tracejit (through `crate::common`).

mod control;
mod errors;
mod models;
mod names;
mod ops;
mod spatial;
mod transforms;
mod windows;
