//! Stateful containers for tracejit, after the `tf.Module` RFC: the
//! [`Module`] trait (naming, variable tracking, module tracking, walks with
//! paths), [`Summary`] tables and [`checkpoint`]s in the safetensors format.
//!
//! A module is a struct whose fields hold [`Variable`]s, other modules, or
//! containers of them (`Vec`, arrays, `Option`, `Box`, `Arc`, `Rc`,
//! `BTreeMap<String, _>`). `#[derive(Module)]` writes the walk; everything
//! else is built on it:
//!
//! ```text
//! use tracejit::prelude::*;
//!
//! #[derive(Module)]
//! struct Dense { w: Variable, b: Variable }
//!
//! #[derive(Module)]
//! struct Mlp { layers: Vec<Dense>, #[module(skip)] act: fn(&Tensor) -> Tensor }
//!
//! let paths: Vec<String> = mlp.named_variables().into_iter().map(|(p, _)| p).collect();
//! assert_eq!(paths, ["layers[0].w", "layers[0].b", "layers[1].w", "layers[1].b"]);
//! ```
//!
//! # Paths
//!
//! A variable's *path* is the chain of fields, elements and entries that
//! reaches it from the root module: field names joined with `.`, `[i]` for an
//! element of a `Vec`, slice or array, `["key"]` for an entry of a
//! `BTreeMap<String, _>` (the key is printed as a Rust string literal), and
//! nothing for `Option`, `Box`, `Arc` or `Rc` (`encoder.layers[0].w`,
//! `head.b`). Walks are deterministic: fields in declaration order, elements
//! in index order, map entries in key order, depth first.
//!
//! The same variable may be reachable by two paths (a shared submodule, or
//! one `Variable` handle stored twice). [`Module::named_variables`] lists it
//! under every path; [`Module::variables`] lists it once, at its first path.
//! Variables are identified by [`Variable::id`].
//!
//! # Names and name scopes
//!
//! A module's [`name`](Module::name) is its type name in snake_case (`Mlp` →
//! `mlp`, `DenseLayer` → `dense_layer`) unless `#[module(name = "...")]` on
//! the struct, or a `#[module(name)]` field holding the name, says otherwise.
//! Its *name scope* is the chain of module names from the root, joined with
//! `/`: the root's scope is its name, and a submodule's is its parent's scope,
//! `/`, and its own name made unique among the submodules of that parent in
//! walk order (`dense`, `dense_1`, `dense_2`, as TensorFlow does).
//! [`Module::assign_names`] renames every variable to its innermost module's
//! scope plus its path inside that module, with `/` between segments:
//! `mlp/dense_1/w`. Names are not assigned at construction (a struct literal
//! runs no code); call `assign_names` once the model is built. Checkpoints
//! key by path, not by name, so they do not depend on it.
//!
//! # Walks
//!
//! [`Visitor`] receives `enter`/`exit` for every path [`Segment`], and
//! `enter_module`/`exit_module` and `variable` as the walk reaches them;
//! [`ModulePath`] keeps the current path for visitors that want it. Start a
//! walk with [`walk`] (or [`Visit::visit`]).
//!
//! # Implementing `Module` by hand
//!
//! Implement [`Module`] (with [`Module::visit_fields`] calling
//! `Visitor::enter(Segment::Field(..))`, [`Visit::visit`] on the field, and
//! `exit` for each field) and [`Visit`] (whose body is `walk(self, visitor)`),
//! which is exactly what the derive writes.

pub mod atomic_file;
pub mod checkpoint;
mod checksum;
mod inventory;
mod module;
mod naming;
pub mod slots;
mod summary;
mod visitor;

pub use checkpoint::CheckpointError;
pub use module::{walk, Module, Visit};
pub use naming::to_snake_case;
pub use slots::SlotHolder;
pub use summary::{Summary, SummaryRow};
pub use tracejit_derive::Module;
pub use tracejit_trace::Variable;
pub use visitor::{ModulePath, Segment, Visitor};
