//! The [`Module`] trait and [`Visit`], the walk every field type knows.
//!
//! `Module` is implemented by containers of state (usually through
//! `#[derive(Module)]`); `Visit` by everything that may be a module's field:
//! [`Variable`], every module, and `Vec`, slices, arrays, `Option`, `Box`,
//! `Arc`, `Rc` and `BTreeMap<String, _>` of those. Containers add path
//! segments (`[i]`, `["key"]`) or nothing (`Option`, `Box`, `Arc`, `Rc`);
//! only struct fields add a `Field` segment, written by `visit_fields`.
//!
//! The two traits are separate because a blanket `impl<M: Module> Visit for
//! M` would overlap `Box<T>` (a downstream crate may implement `Module` for
//! `Box<ItsType>`); the derive writes both impls.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use tracejit_trace::Variable;

use crate::inventory::Inventory;
use crate::naming::to_snake_case;
use crate::summary::Summary;
use crate::visitor::{Segment, Visitor};

/// A container of state: variables and submodules found by walking its
/// fields. See the [crate docs](crate) for paths, names and name scopes.
///
/// Derive it with `#[derive(Module)]`; attributes: `#[module(skip)]` on a
/// field that holds no state (it is ignored), `#[module(name = "...")]` on the
/// struct to fix its name, `#[module(name)]` on a field whose value
/// (`ToString`) is the instance's name.
pub trait Module {
    /// The type's name as written (`Dense`), for summaries.
    fn type_name(&self) -> &'static str;

    /// The module's name: by default the snake_case type name (`Dense` →
    /// `dense`).
    fn name(&self) -> String {
        to_snake_case(self.type_name())
    }

    /// Walks the fields (not the module itself): for each field,
    /// `visitor.enter(Segment::Field(name))`, the field's [`Visit::visit`],
    /// `visitor.exit(Segment::Field(name))`, in declaration order.
    fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>);

    /// Every (path, variable) pair in walk order: field order, depth first.
    /// A variable reachable by two paths is listed under both.
    fn named_variables(&self) -> Vec<(String, Variable)> {
        Inventory::of(self).variables.into_iter().map(|v| (v.path, v.variable.clone())).collect()
    }

    /// The distinct variables (by [`Variable::id`]) in walk order, each at
    /// its first path.
    fn variables(&self) -> Vec<Variable> {
        Inventory::of(self).distinct_variables().map(|v| v.variable.clone()).collect()
    }

    /// [`variables`](Module::variables) that are trainable.
    fn trainable_variables(&self) -> Vec<Variable> {
        self.variables().into_iter().filter(Variable::trainable).collect()
    }

    /// Every module below this one (not itself), depth first, once per path
    /// (a module reachable by two paths appears under both).
    fn submodules(&self) -> Vec<&dyn Module> {
        self.named_submodules().into_iter().map(|(_, m)| m).collect()
    }

    /// [`submodules`](Module::submodules) with their paths.
    fn named_submodules(&self) -> Vec<(String, &dyn Module)> {
        Inventory::of(self).modules.into_iter().filter_map(|m| Some((m.path, m.module?))).collect()
    }

    /// A table of this module and its submodules: path, name scope, type,
    /// parameter count and bytes (each variable counted once per module).
    /// `Display` prints it.
    fn summary(&self) -> Summary {
        Summary::of(self)
    }

    /// Renames every variable after its name scope (`mlp/dense_1/w`; see the
    /// [crate docs](crate)). Deterministic; a variable reachable by two paths
    /// is named after the first. Returns the (path, new name) pairs, one per
    /// distinct variable.
    fn assign_names(&self) -> Vec<(String, String)> {
        Inventory::of(self)
            .distinct_variables()
            .map(|v| {
                v.variable.set_name(v.scoped_name.clone());
                (v.path.clone(), v.scoped_name.clone())
            })
            .collect()
    }
}

/// Something that can be walked: a module's field type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Variable, a Module or a container of them",
    label = "a field of a #[derive(Module)] struct must hold state",
    note = "mark fields that hold no variables with #[module(skip)]"
)]
pub trait Visit {
    /// Walks `self`, reporting what it finds to `visitor`.
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>);
}

/// Walks a module: `enter_module`, its fields, `exit_module`. The root gets
/// no path segment.
pub fn walk<'m>(module: &'m dyn Module, visitor: &mut dyn Visitor<'m>) {
    visitor.enter_module(module);
    module.visit_fields(visitor);
    visitor.exit_module(module);
}

impl Visit for Variable {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        visitor.variable(self);
    }
}

impl<T: Visit> Visit for [T] {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        for (i, item) in self.iter().enumerate() {
            visitor.enter(Segment::Index(i));
            item.visit(visitor);
            visitor.exit(Segment::Index(i));
        }
    }
}

impl<T: Visit> Visit for Vec<T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        self.as_slice().visit(visitor);
    }
}

impl<T: Visit, const N: usize> Visit for [T; N] {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        self.as_slice().visit(visitor);
    }
}

impl<T: Visit> Visit for Option<T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        if let Some(x) = self {
            x.visit(visitor);
        }
    }
}

impl<T: Visit + ?Sized> Visit for Box<T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        (**self).visit(visitor);
    }
}

impl<T: Visit + ?Sized> Visit for Arc<T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        (**self).visit(visitor);
    }
}

impl<T: Visit + ?Sized> Visit for Rc<T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        (**self).visit(visitor);
    }
}

impl<T: Visit> Visit for BTreeMap<String, T> {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        for (k, v) in self {
            visitor.enter(Segment::Key(k));
            v.visit(visitor);
            visitor.exit(Segment::Key(k));
        }
    }
}

impl Visit for dyn Module + '_ {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor);
    }
}

impl Visit for dyn Module + Send + '_ {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor);
    }
}

impl Visit for dyn Module + Send + Sync + '_ {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor);
    }
}
