//! Optimizers for tracejit: [`Sgd`] (momentum, Nesterov, weight decay) and
//! [`Adam`] (AdamW-style decoupled weight decay, AMSGrad), behind one
//! [`Optimizer`] trait.
//!
//! An optimizer is a cheap shared handle (`Clone` shares its state),
//! `Send + Sync`, and a [`Module`]: its slot variables (momentum, first and
//! second moments) and its `iterations` counter are variables that
//! checkpoints save and restore with the model. Slots are created by
//! [`Optimizer::build`] / [`Optimizer::build_for`], or on the first
//! [`Optimizer::apply_gradients`], which inside a traced function is the
//! first trace; later traces and calls reuse them.
//!
//! Updates are ordinary tensor ops and variable assignments, so the same
//! step runs eagerly or inside a traced function, where forward, backward
//! and update are one graph that the passes fuse. A mismatch (lengths,
//! shapes, dtypes, a frozen variable) panics naming the variable before any
//! variable changes: an update applies to every variable or to none.
//!
//! A step is atomic with respect to other steps on the same variables, on
//! any thread, eagerly and inside compiled functions (TF's
//! `use_locking=True`): it runs inside [`tracejit_trace::locked_update`]
//! of the step counter, the variables and their slots, so threads sharing
//! a model and an optimizer lose no step and never mix one step's moments
//! with another's weight. Reads of the weights outside the step (a forward
//! pass on another thread) take no lock. An uncontended step pays a few
//! uncontended mutex operations per variable.
//!
//! ```
//! use tracejit_optim::{Optimizer, Sgd};
//! use tracejit_trace::{value_and_grad, Tensor, Variable};
//!
//! let w = Variable::new(Tensor::from_vec(vec![1.0f32, -2.0], &[2]));
//! let opt = Sgd::new(0.1);
//! for _ in 0..50 {
//!     let (_, g) = value_and_grad(&[w.clone()], || w.read().square().sum_all())?;
//!     opt.apply_gradients(&g, &[w.clone()]);
//! }
//! assert!(w.value().to_vec::<f32>()?.iter().all(|v| v.abs() < 1e-3));
//! assert_eq!(opt.iterations().value().to_vec::<i64>()?, vec![50]);
//! # Ok::<(), tracejit_trace::Error>(())
//! ```

mod adam;
mod optimizer;
mod schedule;
mod sgd;

pub use adam::Adam;
pub use optimizer::Optimizer;
pub use schedule::LearningRate;
pub use sgd::Sgd;
pub use tracejit_module::Module;
