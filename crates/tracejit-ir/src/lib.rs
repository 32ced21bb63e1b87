//! The graph IR of tracejit.
//!
//! A [`Graph`] is an arena of [`Node`]s addressed by [`NodeId`]; each node has
//! an [`Op`] (a closed enum), data inputs ([`ValueId`]: node + output index),
//! control inputs, and the inferred [`TensorType`] of each output (dtype plus
//! a shape whose dims may be unknown). Functions called by `Call` nodes live
//! in the graph's [`FunctionLibrary`]; variables used by stateful nodes are
//! [`VariableResource`] handles. [`infer`] states every op's type rule,
//! [`verify`] checks a graph's invariants, [`interpret`] runs a graph with the
//! reference kernels of `tracejit-tensor`, and `Display` / [`Graph::to_dot`]
//! print it; [`Graph::parse`] reads the `Display` text back, and
//! [`Graph::structurally_eq`] says when two graphs are the same. [`passes`]
//! holds the optimization passes and the pass manager; [`registry`] the
//! process-wide table of composite kernels they consult.

mod attr;
pub mod autodiff;
pub mod batching;
mod boundary;
pub mod control;
mod effects;
mod equality;
mod error;
mod external;
mod graph;
mod infer;
mod interp;
pub mod locks;
mod op;
mod op_key;
mod op_table;
mod parser;
pub mod passes;
mod printer;
pub mod progress;
pub mod registry;
pub mod tolerance;
mod types;
mod verifier;

pub use boundary::{catch_quietly, in_boundary, note_running, running_location};
pub use effects::Effects;
pub use error::{panic_message, IrError, OpError};
pub use graph::{
    FuncId, FunctionAttrs, FunctionLibrary, Graph, LibraryFunction, Node, NodeId, ValueId, VarId, VariableResource,
};
pub use infer::{broadcast_dims, check_outputs_allocatable, infer, join_types};
pub use interp::{eval_kernel, eval_primitive, interpret};
pub use op::{AssignKind, ExternalKernel, Op, OpClass};
pub use op_key::OpKey;
pub use parser::{ParseError, ParsedVariable};
pub use types::{Dim, Dims, DimsDisplay, TensorType};
pub use verifier::verify;

pub use tracejit_tensor as tensor;
