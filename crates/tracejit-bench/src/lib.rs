//! The tracejit benchmark harness as a library: the workloads of
//! shared/WORKLOADS.md ([`workloads`]), output verification against eager
//! ([`verify`]), timing ([`measure`]) and peak memory ([`peak`]), the
//! machine's floors ([`floors`]), the
//! per-mode runner ([`runner`]) and the reports ([`report`]). The
//! `tracejit-bench` binary strings them together; keeping the logic here
//! makes it testable (a wrong result must fail the run). [`micro`] adds rows
//! beside the workloads: a backward kernel against its body's VJP.
//! [`onnx_models`] runs real ONNX files through the importer (W14, W15
//! `minilm_onnx`), and, with the `tract` feature, [`tract_peer`] runs them
//! in tract for comparison.

pub mod case;
pub mod cli;
pub mod cnn;
pub mod floors;
mod int8;
pub mod measure;
pub mod micro;
pub mod minilm;
pub mod modes;
pub mod onnx_models;
pub mod peak;
pub mod per_example;
pub mod report;
pub mod runner;
#[cfg(feature = "tract")]
pub mod tract_peer;
pub mod transformer;
pub mod verify;
pub mod workloads;

pub use measure::{Budget, Timing};
pub use runner::{profile_workload, run_case, run_workload, Row, RunConfig, Status};
pub use verify::{check_outputs, check_tensors, Mismatch, OutputValues, Tolerance};
pub use workloads::{Mode, WorkloadSpec};
