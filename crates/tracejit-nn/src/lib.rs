//! tracejit-nn (`tracejit::nn`): neural-network composite ops written with
//! primitives, each inside a `Function` marked
//! `implements("tracejit.nn.<name>")`, fast native kernels for the ones
//! that matter most (registered lazily), and the user-facing composite
//! kernel API itself ([`composite`], re-exported as `tracejit::composite`).
//!
//! Inside a trace, calling one of these records a `Call` of the composite;
//! the implementation selector then swaps in the registered kernel when it
//! accepts the argument types (f32, the shapes each kernel documents), or
//! inlines the primitive body, which the fusion planner then fuses with its
//! surroundings. Called on eager tensors, the registered kernel runs directly
//! when it accepts them, and the primitive body runs eagerly otherwise.
//!
//! Each composite is declared once, as a [`Composite`] `static`: its
//! `implements` name, primitive body, native kernel (a [`NativeFn`] over
//! the arguments' values, as the IR runs kernels) with the predicate
//! saying which arguments it takes, and backward kernel. [`declared`]
//! lists them; the tables the tracer and tapes consult are filled from the
//! declarations, and the tests iterate them (kernel against body, backward
//! kernel against the body's VJP, an ONNX local function each). Each
//! composite's `Function` is created on first use, so every caller shares
//! its traces. Composite bodies use only
//! primitives (never other composites), so turning the selector off in a
//! caller really means "no kernels" for what it calls directly.
//!
//! | function | composite name | registered kernel |
//! |---|---|---|
//! | [`gelu`] | `tracejit.nn.gelu` | f32, and a backward kernel (`tracejit.nn.gelu_grad`, f32) |
//! | [`softmax`] | `tracejit.nn.softmax` (last axis) | f32, rank >= 1 |
//! | [`log_softmax`] | `tracejit.nn.log_softmax` (last axis) | f32, rank >= 1 |
//! | [`layer_norm`] | `tracejit.nn.layer_norm` | f32, and a backward kernel ([`layer_norm_grad`]) |
//! | [`layer_norm_grad`] | `tracejit.nn.layer_norm_grad` | f32 and f64 |
//! | [`lstm_cell`] | `tracejit.nn.lstm_cell` | f32, rank-2 operands |
//! | [`softmax_cross_entropy_with_logits`] | `tracejit.nn.softmax_cross_entropy_with_logits` | — (a backward kernel) |
//! | [`dense`] | `tracejit.nn.dense` | — (matmul + fused epilogue) |
//! | [`scaled_dot_product_attention`] | `tracejit.nn.scaled_dot_product_attention` (and `_grad`) | f32 flash attention, forward and backward |
//! | [`dropout`] | `tracejit.nn.dropout` | f32 and f64, drawing in chunks; its backward is dropout of the cotangent |
//!
//! Convolutional layers are not composites but ops of the IR's spatial
//! family, which compiled functions run through direct kernels:
//! [`conv2d`] (with [`Conv2dOptions`]), [`max_pool2d`], [`avg_pool2d`];
//! [`batch_norm`] is written with primitives and assigns its moving
//! statistics in training.
//!
//! The kernels compute `exp`, `tanh` and `sigmoid` with the JIT's own
//! approximations (`tracejit_kernels::fastmath`: the same bits as the JIT's
//! in-line and AVX2 code, within the ULP bounds `tracejit-jit` documents;
//! NaN propagates) and sum in several partial accumulators, so they agree
//! with the primitive bodies to about 1e-6 relative, not bitwise.
//!
//! ```
//! use tracejit_trace::{function, Tensor};
//!
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3]);
//! let eager = tracejit_nn::softmax(&x, -1);
//! let traced = function(|x: Tensor| tracejit_nn::softmax(&x, -1)).call(x)?;
//! let (a, b) = (eager.to_vec::<f32>()?, traced.to_vec::<f32>()?);
//! assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 1e-6));
//! assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! # Ok::<(), tracejit_trace::Error>(())
//! ```
//!
//! # Where this sits
//!
//! This crate sits above the tracer (`tracejit-trace`), as `candle-nn` sits
//! above `candle-core`: composites are ordinary traced `Function`s, and the
//! tracer knows nothing of them. The kernel table the tracer consults lives
//! below both, in `tracejit_ir::registry`; [`composite`] fills it.

mod attention;
mod backward;
mod batch_norm;
mod bodies;
pub mod composite;
mod composites;
mod conv;
mod decl;
mod dropout;
mod kernels;
pub mod random;
mod samples;

pub use attention::scaled_dot_product_attention;
pub use batch_norm::{batch_norm, BATCH_NORM};
pub use bodies::Activation;
pub use composites::{
    dense, gelu, layer_norm, layer_norm_grad, log_softmax, lstm_cell, softmax, softmax_cross_entropy_with_logits,
};
pub use conv::{avg_pool2d, conv2d, max_pool2d, Conv2dOptions, Padding, Pair};
pub use decl::{
    declared, AcceptsFn, BackwardFn, BodyFn, Composite, ExamplesFn, Native, NativeFn, COMPOSITE_MAX_TRACES,
};
pub use dropout::{dropout, dropout_at, embedding};
