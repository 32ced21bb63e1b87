//! [`ExternalKernel`]: the interface of native code in a graph (an
//! [`crate::Op::Kernel`] node): a composite's kernel the selector chose,
//! or an action such as `tracejit::debug::print`, with what passes,
//! executors, `vmap` and gradients may assume of it.

use std::fmt;

use tracejit_tensor::{DType, Storage};

use crate::Effects;

/// Native code standing in for a composite function: the implementation
/// selector replaces a `Call` of a function marked `implements = name` by an
/// [`crate::Op::Kernel`] node holding one of these when a kernel is registered for
/// `name` in [`crate::registry`] (which `tracejit::composite` fills).
///
/// A kernel must be a pure function of its inputs unless its
/// [`ExternalKernel::effects`] say otherwise (passes may merge two
/// identical pure kernel nodes, or drop one whose results are unused) and return
/// one value per declared output, of the declared dtype and a shape the
/// declared type accepts; `eval_primitive` checks that and panics naming the
/// kernel otherwise.
pub trait ExternalKernel: Send + Sync + fmt::Debug {
    /// Runs the kernel on concrete inputs, with the vector code `isa`
    /// allows (the JIT passes its options' [`tracejit_kernels::Isa`]; the
    /// interpreter [`tracejit_kernels::Isa::from_env`]).
    fn run(&self, inputs: &[Storage], isa: tracejit_kernels::Isa) -> Vec<Storage>;

    /// What running it does besides computing its outputs: pure for every
    /// composite's kernel (the default). A kernel that acts on the world
    /// (`tracejit::debug::print` and `callback`, which return nothing)
    /// says [`Effects::WRITES`], so that passes keep it and executors run
    /// it in program order with the other stateful nodes.
    fn effects(&self) -> Effects {
        Effects::PURE
    }

    /// True when the kernel maps over a leading axis of all its inputs
    /// and outputs: run on inputs with a batch axis in front, it returns
    /// each example's results stacked the same way. `vmap` then batches a
    /// call of it as one call; otherwise it refuses it by name.
    fn maps_leading_axis(&self) -> bool {
        false
    }

    /// `Some(i)` when, for gradients, the kernel is the identity of its
    /// input `i` (the others get no gradient): `checkpoint`'s barrier,
    /// which only orders the recomputation, so a second derivative
    /// through it is the block's own. `None` (the default): a kernel is
    /// differentiated through its composite's body, before the selector
    /// chooses it, and reaching one in a gradient is an error.
    fn gradient_passes_through(&self) -> Option<usize> {
        None
    }

    /// True when compiled code should run the composite's body instead:
    /// an elementwise body that the JIT fuses with its neighbours and
    /// splits over threads beats the kernel there (GELU after a product's
    /// bias). The implementation selector then skips the kernel; eager
    /// calls still run it.
    fn eager_only(&self) -> bool {
        false
    }

    /// The kernel to run instead under mixed precision with `low` (bf16):
    /// one whose products may read their operands rounded to `low` and
    /// accumulate in f32, as the `auto_mixed_precision` pass does to the
    /// allow list's products (attention's `q·kᵀ` and `P·v`). Its results
    /// may differ from this kernel's within the rounding of `low`; its
    /// inputs and outputs are this kernel's. `None` (the default): the
    /// kernel keeps its own precision.
    fn mixed_precision(&self, low: DType) -> Option<std::sync::Arc<dyn ExternalKernel>> {
        let _ = low;
        None
    }

    /// True when the kernel only *starts* work that a later node finishes
    /// (a non-blocking collective's start, whose token a wait node takes):
    /// the JIT's `start_early` pass runs it as soon as its inputs and
    /// control inputs exist instead of at its place in program order, so
    /// the work proceeds (see [`crate::progress`]) while the steps in
    /// between compute. Only for kernels whose effects are ordered by
    /// their control inputs alone. False by default.
    fn starts_early(&self) -> bool {
        false
    }
}
