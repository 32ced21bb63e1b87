//! The user-facing half of tracejit: [`Tensor`] (eager or symbolic), tracing
//! contexts, [`function`] / [`Function`] with its signature cache, and
//! [`ConcreteFunction`].
//!
//! Every op on `Tensor` goes through one function (`interpreters::apply`),
//! down a stack of interpreters (JAX's trace stack): the tape layer records
//! it for gradients, the remat layer replays a checkpoint's saved products,
//! and at the bottom it runs the reference kernel now (eager inputs) or
//! records a node in the innermost graph of this thread (while tracing).
//! That is why the same closure runs eagerly and as a graph; a new per-op
//! transform or effect is a new layer.

// The derive macros name `::tracejit::...`; this makes those paths resolve
// inside this crate too.
extern crate self as tracejit;

mod concrete;
pub mod config;
mod context;
mod control;
mod custom;
pub mod debug;
mod eager;
mod error;
mod external;
mod function;
mod interpreters;
mod nest;
mod operators;
mod ops;
pub mod quantize;
mod remat;
mod spatial;
mod tape;
mod tensor;
mod tracelock;
mod transforms;
mod validate;
mod variable;
mod vmap;
mod windows;

pub use concrete::ConcreteFunction;
pub use context::attributed_to;
pub use control::{cond, fori_loop, while_loop, while_loop_with, CancelToken, WhileOptions, MAX_NESTING};
pub use custom::{custom_gradient, custom_gradient_n};
pub use error::{Error, Result};
pub use external::{call_external, ExternalCall, ExternalVjp};
pub use function::{function, CacheStats, Function, RetracePolicy, DEFAULT_MAX_TRACES};
pub use nest::{
    nest_join_field, nest_paths, Flattener, Nest, SpecFlattener, SpecNest, Static, StaticValue, TensorSpec, Unflattener,
};
pub use ops::{Operand, Scalar};
pub use remat::{checkpoint, checkpoint_with, CheckpointPolicy, REMAT_BARRIER};
pub use spatial::spatial;
pub use tape::{register_gradient, unregister_gradient, value_and_grad, GradientFn, GradientTape, Source};
pub use tensor::Tensor;
pub use tracejit_derive::Nest;
pub use tracejit_ir::passes::{OptimizationOptions, PipelineReport};
pub use tracejit_jit::{Profile, ScheduleStats, StepTime};
pub use tracejit_kernels::Target;
pub use tracejit_tensor::{Conv2dAttrs, DType, Pool2dAttrs, RandomDist, SliceSpec, SpatialOp};
pub use transforms::{grad, hessian, jacfwd, jacrev, jvp};
pub use variable::{locked_update, remember, remember_in, Scope, Variable};
pub use vmap::{vmap, vmap_axes, ByRef, ByValue, TensorFn};
