//! The [`Optimizer`] trait and what every optimizer shares: checking an
//! update before it applies, and slot variables visited as a [`Module`]'s
//! fields, each reported as the slot of its variable
//! ([`Visitor::slot`](tracejit_module::Visitor::slot)) so that walks of the
//! whole tree name it by that variable's path there (`opt.m.model.w`), and
//! values a checkpoint restored before the slots existed.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tracejit_module::{Segment, SlotHolder, Visit, Visitor};
use tracejit_tensor::DType;
use tracejit_trace::{Tensor, Variable};

/// An optimizer: turns gradients into variable updates.
pub trait Optimizer: tracejit_module::Module + Send + Sync {
    /// Applies one step: `grads[i]` updates `vars[i]`. Creates the slot
    /// variables on the first call (inside a traced function: on its first
    /// trace). Panics, changing nothing, when the lists differ in length, a
    /// gradient's dtype or shape differs from its variable's, or a variable
    /// is not trainable.
    #[track_caller]
    fn apply_gradients(&self, grads: &[Tensor], vars: &[Variable]);

    /// Creates the slot variables for `vars` now (named after
    /// [`Variable::name`]). Later calls with the same variables do nothing.
    fn build(&self, vars: &[Variable]);

    /// Creates the slot variables for `model`'s trainable variables, named
    /// after their paths (`m.layers[0].w`).
    fn build_for(&self, model: &dyn tracejit_module::Module);

    /// Steps taken (an i64 scalar variable, saved with the optimizer).
    fn iterations(&self) -> Variable;
}

/// Panics, naming the variable, unless every `grads[i]` fits `vars[i]`.
pub(crate) fn check_update(optimizer: &str, grads: &[Tensor], vars: &[Variable]) {
    assert!(
        grads.len() == vars.len(),
        "{optimizer}.apply_gradients: {} gradients for {} variables",
        grads.len(),
        vars.len()
    );
    for (g, v) in grads.iter().zip(vars) {
        assert!(v.trainable(), "{optimizer}.apply_gradients: variable `{}` is not trainable", v.name());
        let (gt, vt) = (g.tensor_type(), (v.dtype(), v.shape()));
        let shape_ok = gt.rank() == vt.1.len() && gt.dims.iter().zip(vt.1).all(|(d, s)| d.is_none_or(|d| d == *s));
        assert!(
            gt.dtype == vt.0 && shape_ok,
            "{optimizer}.apply_gradients: the gradient of variable `{}` is {gt}, the variable is {}{:?}",
            v.name(),
            vt.0,
            vt.1
        );
        assert!(vt.0.is_float(), "{optimizer}.apply_gradients: variable `{}` is {}, not a float", v.name(), vt.0);
    }
}

/// Panics, at the user's line, unless `value` (the hyperparameter
/// `what` of `optimizer`) is finite and within `range`, named as
/// `expected` in the message: a NaN, an infinity or an out-of-range value
/// would otherwise give NaN weights on the first step (Adam with β = 1
/// divides by `1 - β^t = 0`), silently.
#[track_caller]
pub(crate) fn check_hyperparameter(
    optimizer: &str,
    what: &str,
    value: f64,
    range: impl std::ops::RangeBounds<f64>,
    expected: &str,
) {
    assert!(value.is_finite() && range.contains(&value), "{optimizer}: {what} must be {expected}, got {value}");
}

/// One path segment, owned (slots outlive the walk that named them).
#[derive(Clone, Debug)]
enum OwnedSegment {
    Field(String),
    Index(usize),
    Key(String),
}

/// `layers[0].w` -> `layers`, `[0]`, `w`; `["k"]` entries too. A name that
/// is not a path (`mlp/dense/w`) is one field.
fn parse_path(path: &str) -> Vec<OwnedSegment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (head, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !head.is_empty() {
            out.push(OwnedSegment::Field(head.to_string()));
        }
        while let Some(end) = rest.find(']') {
            let inner = &rest[1..end];
            match inner.parse::<usize>() {
                Ok(i) => out.push(OwnedSegment::Index(i)),
                Err(_) => out.push(OwnedSegment::Key(inner.trim_matches('"').to_string())),
            }
            rest = &rest[end + 1..];
        }
    }
    out
}

/// One kind of slot (`m`, `v`, `velocity`) for every variable.
pub(crate) struct SlotSet {
    /// The slot's field name.
    pub name: &'static str,
    /// Per variable, in order.
    pub vars: Vec<Variable>,
}

/// The slots of an optimizer, built once for one list of variables.
pub(crate) struct Slots {
    /// Ids of the variables the slots belong to, in order.
    pub ids: Vec<u64>,
    /// Each variable's path.
    paths: Vec<Vec<OwnedSegment>>,
    pub sets: Vec<SlotSet>,
}

impl Slots {
    /// Slots `names` for `vars`, named by `paths`: zeros, or the value a
    /// checkpoint restored for the slot before it existed (`pending`, by
    /// slot name and variable id; taken out).
    fn new(
        names: &[&'static str],
        vars: &[Variable],
        paths: Vec<String>,
        pending: &mut HashMap<(String, u64), Tensor>,
    ) -> Slots {
        let sets = names
            .iter()
            .map(|&name| SlotSet {
                name,
                vars: vars
                    .iter()
                    .zip(&paths)
                    .map(|(v, p)| {
                        let initial = pending
                            .remove(&(name.to_string(), v.id()))
                            .unwrap_or_else(|| Tensor::zeros(v.shape(), v.dtype()));
                        Variable::new(initial).with_name(format!("{name}.{p}"))
                    })
                    .collect(),
            })
            .collect();
        Slots {
            ids: vars.iter().map(Variable::id).collect(),
            paths: paths.iter().map(|p| parse_path(p)).collect(),
            sets,
        }
    }

    /// The slot `set` of the variable at `i`.
    pub fn get(&self, set: usize, i: usize) -> &Variable {
        &self.sets[set].vars[i]
    }
}

/// An optimizer's slots, built once, and the values restored for slots it
/// has not built yet.
#[derive(Default)]
pub(crate) struct SlotStore {
    cell: OnceLock<Slots>,
    /// Restored values by (slot name, variable id), waiting for the slots.
    pending: Mutex<HashMap<(String, u64), Tensor>>,
}

impl SlotStore {
    /// The slots, if built.
    pub fn get(&self) -> Option<&Slots> {
        self.cell.get()
    }

    /// Takes a restored value for slot `name` of `owner`: into the slot if
    /// it exists, else kept until the slots are built.
    pub fn defer(&self, name: &str, owner: &Variable, value: Tensor) {
        if let Some(slots) = self.cell.get() {
            let set = slots.sets.iter().find(|s| s.name == name);
            let at = slots.ids.iter().position(|&id| id == owner.id());
            if let (Some(set), Some(i)) = (set, at) {
                set.vars[i].set_value(&value);
                return;
            }
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert((name.to_string(), owner.id()), value);
    }
}

/// The slots of `vars`, created on first use; panics when an optimizer
/// built for other variables is applied to these.
pub(crate) fn slots_for<'s>(
    store: &'s SlotStore,
    optimizer: &str,
    names: &[&'static str],
    vars: &[Variable],
    paths: impl FnOnce() -> Vec<String>,
) -> &'s Slots {
    let slots = store.cell.get_or_init(|| {
        let mut pending = store.pending.lock().unwrap_or_else(|e| e.into_inner());
        Slots::new(names, vars, paths(), &mut pending)
    });
    let ids: Vec<u64> = vars.iter().map(Variable::id).collect();
    assert!(
        slots.ids == ids,
        "{optimizer}: its slots were built for {} other variables; an optimizer updates one list of variables",
        slots.ids.len()
    );
    slots
}

/// Visits `iterations` and every slot as the slot of its variable (walks
/// of the whole tree name it `name.<the variable's path there>`; others
/// `name.<path given to build_for, or the variable's name>`), and the
/// optimizer as a [`SlotHolder`].
pub(crate) fn visit_state<'m>(
    iterations: &'m Variable,
    slots: Option<&'m Slots>,
    holder: &'m dyn SlotHolder,
    visitor: &mut dyn Visitor<'m>,
) {
    visitor.slot_holder(holder);
    visitor.enter(Segment::Field("iterations"));
    iterations.visit(visitor);
    visitor.exit(Segment::Field("iterations"));
    let Some(slots) = slots else { return };
    for set in &slots.sets {
        visitor.enter(Segment::Field(set.name));
        for ((var, path), &owner) in set.vars.iter().zip(&slots.paths).zip(&slots.ids) {
            let segs: Vec<Segment<'m>> = path
                .iter()
                .map(|s| match s {
                    OwnedSegment::Field(f) => Segment::Field(f),
                    OwnedSegment::Index(i) => Segment::Index(*i),
                    OwnedSegment::Key(k) => Segment::Key(k),
                })
                .collect();
            visitor.slot(owner, &segs, var);
        }
        visitor.exit(Segment::Field(set.name));
    }
}

/// The paths of `model`'s trainable variables, and the variables.
pub(crate) fn trainable_paths(model: &dyn tracejit_module::Module) -> (Vec<Variable>, Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    let mut vars = Vec::new();
    let mut paths = Vec::new();
    for (p, v) in model.named_variables() {
        if v.trainable() && seen.insert(v.id()) {
            vars.push(v);
            paths.push(p);
        }
    }
    (vars, paths)
}

/// Everything one step reads and writes: the step counter, the variables
/// and their slots. A step runs inside `locked_update` of all of them, so
/// steps on threads sharing the variables never interleave (TF's
/// `use_locking=True`): 8 threads x 1,000 SGD steps used to lose most of
/// them, and Adam's moments could be updated by one step and the weight by
/// another.
pub(crate) fn step_state<'a>(
    iterations: &'a Variable,
    vars: &'a [Variable],
    slots: Option<&'a Slots>,
) -> Vec<&'a Variable> {
    let mut all: Vec<&Variable> = vec![iterations];
    all.extend(vars);
    if let Some(slots) = slots {
        all.extend(slots.sets.iter().flat_map(|set| set.vars.iter()));
    }
    all
}

/// A new `iterations` counter.
pub(crate) fn new_iterations() -> Variable {
    Variable::new(Tensor::zeros(&[], DType::I64)).with_name("iterations").with_trainable(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_into_segments() {
        let p = parse_path("layers[0].w");
        assert!(
            matches!(&p[..], [OwnedSegment::Field(a), OwnedSegment::Index(0), OwnedSegment::Field(b)] if a == "layers" && b == "w")
        );
        let p = parse_path("mlp/dense_1/w");
        assert!(matches!(&p[..], [OwnedSegment::Field(a)] if a == "mlp/dense_1/w"));
        let p = parse_path("heads[\"x\"].b");
        assert!(matches!(&p[..], [OwnedSegment::Field(_), OwnedSegment::Key(k), OwnedSegment::Field(_)] if k == "x"));
    }
}
