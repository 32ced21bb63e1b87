//! Tests of the public surface of `tracejit-ir`, one module per concern,
//! compiled as a single test binary to keep link times down.
//!
//! Tests that run kernels compare the interpreter with calling
//! `tracejit_tensor::kernels` directly; inference, verifier and printer tests
//! need no kernels.

mod autodiff;
mod autodiff_unknown;
mod batching;
mod channels_last;
mod common;
mod conv_epilogue;
mod filetests;
mod infer;
mod interp;
mod parser;
mod pass_props;
mod passes;
mod pipeline;
mod printer;
mod props;
mod simplify_moves;
mod spatial;
mod subgraphs;
mod verifier;
