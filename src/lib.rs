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
//! (`tracejit-tensor`, `tracejit-ir`, `tracejit-trace`) and offers a
//! [`prelude`].

pub use tracejit_ir as ir;
pub use tracejit_tensor as tensor;
pub use tracejit_trace::{
    config, function, remember, remember_in, ConcreteFunction, DType, Error, Flattener, Function, Nest, Operand,
    Result, Scalar, Scope, SliceSpec, SpecFlattener, SpecNest, Static, StaticValue, Tensor, TensorSpec, Unflattener,
    Variable,
};

/// The names most programs need: `use tracejit::prelude::*;`.
pub mod prelude {
    pub use tracejit_trace::{
        function, ConcreteFunction, DType, Error, Function, Nest, Result, SliceSpec, Static, Tensor, TensorSpec,
    };
}
