//! Integration tests of the public surface: tracing, autodiff, control flow, optimizers, modules, checkpoints, passes and validation.
//!
//! One test binary instead of one per file: each binary links the whole
//! workspace, so merging them cut the test build's link time and disk.
//! Tests that change process-wide state (thread counts, thresholds, the
//! eager switch, a counting allocator) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod attention_float_mask;
mod checkpoint;
mod composite;
mod control_flow;
mod control_limits;
mod conv;
mod conv_grad;
mod custom_gradient;
mod debug_print;
mod differential;
mod distributed;
mod doc_examples;
mod eager_api;
mod effects;
mod error_lines;
mod gradients;
mod gradients_coverage;
mod limits;
mod loops_compiled;
mod modules;
mod optim;
mod optim_fusion;
mod passes;
mod per_example_grads;
mod precision;
mod primitives;
mod profile;
mod quantize;
mod random;
mod remat;
mod retrace_policy;
mod schedule_stats;
mod source_locations;
mod sparse_update;
mod target;
mod tracing;
mod train_charlm;
mod train_cnn_digits;
mod train_digits;
mod transforms;
mod validation;
mod variables;
mod vmap;
mod vmap_control;
