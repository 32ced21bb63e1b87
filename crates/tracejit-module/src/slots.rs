//! Slot variables: state a module keeps *for* other variables (an
//! optimizer's `m` and `v` of each weight), named in checkpoints by the
//! path of the variable they belong to in the tree being saved, as
//! TensorFlow's object-graph checkpoints key slots.
//!
//! A module reports a slot with [`Visitor::slot`](crate::Visitor::slot)
//! (the owner's id, a fallback path, the slot) and itself with
//! [`Visitor::slot_holder`](crate::Visitor::slot_holder). The walk behind
//! `named_variables` and checkpoints names the slot by the current path
//! followed by the owner's first path in the tree: `TrainState { model,
//! opt }` saves `opt.m.model.layers[0].w`, whatever process-wide number
//! the weight got and whether or not `build_for` named the slots; the
//! fallback (the owner's path given to `build_for`, else its name) is used
//! only when the owner is not in the tree.
//!
//! Restoring into a module whose holder has not created a slot yet (a
//! fresh optimizer, before its first step) hands the value to the holder
//! ([`SlotHolder::defer_slot`]): the slot starts from it when created,
//! instead of zeros (TensorFlow's deferred restoration). So `build_for`
//! is an optimization, not a requirement.

use tracejit_trace::{Tensor, Variable};

use crate::inventory::Inventory;

/// A module that keeps slot variables per variable and can take their
/// values before it creates them.
pub trait SlotHolder: Send + Sync {
    /// The names of the slot kinds it may keep (`m`, `v`, `v_max`), each a
    /// path segment under the holder (`opt.m.<owner path>`).
    fn slot_names(&self) -> Vec<&'static str>;

    /// Takes `value` for slot `name` of `owner`, which has no such slot
    /// yet: the slot is created holding it (of `owner`'s dtype and shape,
    /// which the caller checked) instead of zeros.
    fn defer_slot(&self, name: &str, owner: &Variable, value: Tensor);
}

/// A slot a walk reached, to be named once the whole tree is known.
pub(crate) struct PendingSlot {
    /// Index of the slot's entry among the walk's variables.
    pub entry: usize,
    /// The id of the variable it belongs to.
    pub owner: u64,
    /// How many path segments precede the slot's own (its holder's path
    /// and the slot kind).
    pub prefix_len: usize,
    /// The name scope of the module holding it, and where that module's
    /// path ends (its scoped name is the scope, then the rest of the path).
    pub scope: String,
    /// See `scope`.
    pub scope_from: usize,
}

/// The holder, slot kind and owner that checkpoint key `key` names, when
/// it names a slot of a variable of the tree (by its first path) under a
/// holder of the tree: `opt.m.model.w` is slot `m` of `model.w` under the
/// holder at `opt`.
pub(crate) fn owner_of<'m>(
    inventory: &Inventory<'m>,
    key: &str,
) -> Option<(&'m dyn SlotHolder, &'static str, &'m Variable)> {
    for (holder_path, holder) in &inventory.holders {
        for name in holder.slot_names() {
            let prefix = if holder_path.is_empty() { name.to_string() } else { format!("{holder_path}.{name}") };
            let Some(rest) = key.strip_prefix(prefix.as_str()) else { continue };
            let owner_path = match rest.strip_prefix('.') {
                Some(field) => field,
                None if rest.starts_with('[') => rest,
                None => continue,
            };
            let owner = inventory.distinct_variables().find(|v| v.slot_of.is_none() && v.path == owner_path);
            if let Some(owner) = owner {
                return Some((*holder, name, owner.variable));
            }
        }
    }
    None
}
