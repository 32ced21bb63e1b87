//! tracejit: a tracing JIT for Rust.
//!
//! Write tensor code as ordinary closures over [`Tensor`]; [`function`]
//! traces a closure once per input signature into a graph, caches the
//! resulting [`ConcreteFunction`], and runs the graph on later calls. The same
//! closure still runs eagerly, which is how it is debugged
//! ([`config::run_functions_eagerly`]).
//!
//! ```
//! use tracejit::prelude::*;
//!
//! let f = function(|(a, b): (Tensor, Tensor)| (&a * &b + 1.0).relu());
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2]);
//! let y = Tensor::ones(&[2, 2], DType::F32);
//! let out = f.call((x.clone(), y.clone()))?;
//! assert_eq!(out.to_vec::<f32>()?, vec![2.0, 0.0, 4.0, 0.0]);
//! assert_eq!(f.tracing_count(), 1);
//! # Ok::<(), tracejit::Error>(())
//! ```
//!
//! This crate is a facade: it re-exports the workspace's crates
//! (`tracejit-tensor`, `tracejit-ir`, `tracejit-trace`, `tracejit-nn`,
//! `tracejit-module`, `tracejit-optim`, `tracejit-onnx`,
//! `tracejit-distributed`) and offers a
//! [`prelude`].
//!
//! State lives in [`Variable`]s held by [`Module`]s (`#[derive(Module)]`),
//! which list their variables by path ([`Module::named_variables`]) and are
//! saved and restored by [`checkpoint`]:
//!
//! ```
//! use tracejit::prelude::*;
//!
//! #[derive(Module)]
//! struct Dense { w: Variable, b: Variable }
//!
//! #[derive(Module)]
//! struct Mlp { layers: Vec<Dense>, #[module(skip)] act: fn(Tensor) -> Tensor }
//!
//! let dense = |i, o| Dense {
//!     w: Variable::new(Tensor::zeros(&[i, o], DType::F32)),
//!     b: Variable::new(Tensor::zeros(&[o], DType::F32)),
//! };
//! let mlp = Mlp { layers: vec![dense(4, 3), dense(3, 1)], act: |x| x.relu() };
//! let paths: Vec<String> = mlp.named_variables().into_iter().map(|(p, _)| p).collect();
//! assert_eq!(paths, ["layers[0].w", "layers[0].b", "layers[1].w", "layers[1].b"]);
//! mlp.assign_names();
//! assert_eq!(mlp.layers[1].w.name(), "mlp/dense_1/w");
//! assert_eq!(mlp.summary().total_parameters, 12 + 3 + 3 + 1);
//! assert_eq!((mlp.act)(Tensor::scalar(-1.0f32)).to_vec::<f32>()?, [0.0]);
//! # Ok::<(), tracejit::Error>(())
//! ```

/// Ahead-of-time artifacts: `save(&cf, path)`, `load(path)` ->
/// [`artifact::Artifact`] (`call`, `variables`), `save_artifact` (the
/// `tracejit-artifact` crate): a compiled function shipped as one file and
/// run without its closure.
pub use tracejit_artifact as artifact;
/// Data-parallel training over MPI: `init`, `World`, `all_reduce`,
/// `broadcast`, `all_gather` (eagerly and as graph nodes, with gradients),
/// `average_gradients` (bucketed, non-blocking), `set_timeout`,
/// `set_bucket_bytes` (the `tracejit-distributed` crate; MPI with the
/// cargo feature `mpi`, otherwise a world of one).
pub use tracejit_distributed as distributed;
pub use tracejit_ir as ir;
/// Modules: the [`Module`] trait and derive, walks with paths, summaries
/// (the `tracejit-module` crate; `#[derive(Module)]` names `tracejit::module`).
pub use tracejit_module as module;
/// Checkpoints in the safetensors format: `save`, `restore`, `read`.
pub use tracejit_module::checkpoint;
/// The `Module` trait and its derive macro (one name, as serde does).
pub use tracejit_module::Module;
/// Composite ops (`gelu`, `softmax`, `layer_norm`, `lstm_cell`, ...) with
/// registered fast kernels (the `tracejit-nn` crate).
pub use tracejit_nn as nn;
/// Composite kernels: `register_kernel(name, kernel)` for functions marked
/// `implements(name)` (the `tracejit-nn` crate's `composite` module).
pub use tracejit_nn::composite;
/// Random numbers as graph state: [`random::Generator`] (Philox4x32-10,
/// its key and counter in a variable, a module that checkpoints) and the
/// stateless draws `stateless_normal` / `stateless_uniform` (the
/// `tracejit-nn` crate's `random` module).
pub use tracejit_nn::random;
/// Export to ONNX: `save(&cf, path)`, `to_bytes(&cf)` and the `Exporter`
/// with names and options (the `tracejit-onnx` crate), so a traced
/// function runs in ONNX Runtime, Triton or tract.
pub use tracejit_onnx as onnx;
/// Optimizers: `Sgd`, `Adam`, the `Optimizer` trait (the `tracejit-optim` crate).
pub use tracejit_optim as optim;
pub use tracejit_tensor as tensor;
/// The element types of [`DType::BF16`] and [`DType::F16`] (the `half` crate's).
pub use tracejit_tensor::{bf16, f16};
/// Control flow on tensor values: plain Rust eagerly, `cond` / `while`
/// graph nodes (subgraphs traced once) inside a traced function.
pub use tracejit_trace::{cond, fori_loop, while_loop, while_loop_with, CancelToken, WhileOptions, MAX_NESTING};
pub use tracejit_trace::{
    config, function, locked_update, nest_join_field, nest_paths, remember, remember_in, CacheStats, ConcreteFunction,
    DType, Error, Flattener, Function, Nest, Operand, Result, RetracePolicy, Scalar, Scope, SliceSpec, SpecFlattener,
    SpecNest, Static, StaticValue, Tensor, TensorSpec, Unflattener, Variable, DEFAULT_MAX_TRACES,
};
pub use tracejit_trace::{OptimizationOptions, PipelineReport, Profile, ScheduleStats, StepTime, Target};

/// Gradients: [`autodiff::GradientTape`] records ops eagerly
/// or while tracing, [`value_and_grad`](autodiff::value_and_grad)
/// differentiates a closure with respect to variables, and
/// [`custom_gradient`](autodiff::custom_gradient) gives a function a
/// gradient rule of your own. The VJP rules are `tracejit::ir::autodiff`'s.
///
/// ```
/// use tracejit::prelude::*;
///
/// let clip = tracejit::autodiff::custom_gradient(|x: &Tensor| (x.clone(), |dy: &Tensor| dy.clamp(-1.0, 1.0)));
/// let w = Variable::new(Tensor::from_vec(vec![0.5f32, -2.0], &[2]));
/// let (loss, grads) = tracejit::autodiff::value_and_grad(&[w.clone()], || (clip(&w.read()) * 4.0).sum_all())?;
/// assert_eq!(loss.to_vec::<f32>()?, [-6.0]);
/// assert_eq!(grads[0].to_vec::<f32>()?, [1.0, 1.0]);   // 4 clipped to 1
/// # Ok::<(), tracejit::Error>(())
/// ```
pub mod autodiff {
    pub use tracejit_trace::{
        checkpoint, checkpoint_with, custom_gradient, custom_gradient_n, grad, hessian, jacfwd, jacrev, jvp,
        value_and_grad, CheckpointPolicy, GradientTape, Source, REMAT_BARRIER,
    };
}
pub use tracejit_trace::GradientTape;
/// JAX's vectorizing map: [`vmap`] maps axis 0 of a closure's argument
/// and result, [`vmap_axes`] chosen axes of several (see
/// `tracejit::ir::batching` for the per-op rules).
pub use tracejit_trace::{vmap, vmap_axes};

/// Printing and inspecting run-time values inside compiled functions
/// (`jax.debug.print`, `jax.debug.callback`): a `println!` in a traced
/// closure runs once, at trace time.
pub use tracejit_trace::debug;

/// Dynamic int8 quantization of a traced function for inference
/// (`quantize::dynamic(&cf)`): products against variables or constants
/// run in int8 on `vpdpbusd`.
pub use tracejit_trace::quantize;

/// The names most programs need: `use tracejit::prelude::*;`.
pub mod prelude {
    pub use tracejit_module::Module;
    pub use tracejit_trace::{
        cond, fori_loop, function, remember, while_loop, ConcreteFunction, DType, Error, Function, GradientTape, Nest,
        Result, SliceSpec, Static, Tensor, TensorSpec, Variable,
    };
}
