//! One walk that records everything the provided methods of `Module` need:
//! every module and variable reached, with its path, its name scope, and
//! (for variables) the modules enclosing it. `named_variables`, `variables`,
//! `submodules`, `summary`, `assign_names` and the checkpoints all read this
//! record, so they agree on order, paths and names by construction.

use std::collections::HashSet;

use tracejit_trace::Variable;

use crate::naming::uniquify;
use crate::visitor::{ModulePath, Segment, Visitor};
use crate::Module;

/// A module reached by the walk.
pub(crate) struct ModuleEntry<'m> {
    /// Its path (`""` for the root).
    pub path: String,
    /// Its name scope (`mlp/dense_1`).
    pub scope: String,
    /// Its type name.
    pub type_name: &'static str,
    /// Nesting depth (0 for the root).
    pub depth: usize,
    /// The module; `None` for the root, which the walk does not hand out
    /// (it may be unsized).
    pub module: Option<&'m dyn Module>,
}

/// A variable reached by the walk, once per path.
pub(crate) struct VariableEntry<'m> {
    /// Its path (`layers[0].w`).
    pub path: String,
    /// Its scope-qualified name (`mlp/dense/w`).
    pub scoped_name: String,
    /// The variable.
    pub variable: &'m Variable,
    /// Indices into `Inventory::modules` of the enclosing modules, root first.
    pub owners: Vec<usize>,
}

/// What one walk found, in walk order. `modules[0]` is the root.
pub(crate) struct Inventory<'m> {
    pub modules: Vec<ModuleEntry<'m>>,
    pub variables: Vec<VariableEntry<'m>>,
}

/// A module being walked: its entry, its scope, the names its submodules
/// took, and where its own path starts.
struct Frame {
    entry: usize,
    scope: String,
    used: HashSet<String>,
    path_len: usize,
}

struct Recorder<'m> {
    path: ModulePath<'m>,
    frames: Vec<Frame>,
    out: Inventory<'m>,
}

impl<'m> Inventory<'m> {
    /// Walks `root` (its fields; the root itself gets no segment).
    pub fn of<M: Module + ?Sized>(root: &'m M) -> Inventory<'m> {
        let scope = root.name();
        let mut rec = Recorder {
            path: ModulePath::new(),
            frames: vec![Frame { entry: 0, scope: scope.clone(), used: HashSet::new(), path_len: 0 }],
            out: Inventory {
                modules: vec![ModuleEntry {
                    path: String::new(),
                    scope,
                    type_name: root.type_name(),
                    depth: 0,
                    module: None,
                }],
                variables: Vec::new(),
            },
        };
        root.visit_fields(&mut rec);
        rec.out
    }

    /// The variables without repeats (by id), each at its first path.
    pub fn distinct_variables(&self) -> impl Iterator<Item = &VariableEntry<'m>> {
        let mut seen = HashSet::new();
        self.variables.iter().filter(move |v| seen.insert(v.variable.id()))
    }
}

impl<'m> Visitor<'m> for Recorder<'m> {
    fn enter(&mut self, segment: Segment<'m>) {
        self.path.push(segment);
    }

    fn exit(&mut self, _segment: Segment<'m>) {
        self.path.pop();
    }

    fn enter_module(&mut self, module: &'m dyn Module) {
        let parent = self.frames.last_mut().expect("the root frame is never popped");
        let scope = format!("{}/{}", parent.scope, uniquify(&module.name(), &mut parent.used));
        let entry = self.out.modules.len();
        self.out.modules.push(ModuleEntry {
            path: self.path.to_string(),
            scope: scope.clone(),
            type_name: module.type_name(),
            depth: self.frames.len(),
            module: Some(module),
        });
        self.frames.push(Frame { entry, scope, used: HashSet::new(), path_len: self.path.len() });
    }

    fn exit_module(&mut self, _module: &'m dyn Module) {
        if self.frames.len() > 1 {
            self.frames.pop();
        }
    }

    fn variable(&mut self, variable: &'m Variable) {
        let frame = self.frames.last().expect("the root frame is never popped");
        let suffix = self.path.scope_suffix(frame.path_len);
        let scoped_name = if suffix.is_empty() {
            // Reached with no segment inside its module (a hand-written walk):
            // keep the last component of its current name, so renaming twice
            // gives the same name.
            let name = variable.name();
            format!("{}/{}", frame.scope, name.rsplit('/').next().unwrap_or_default())
        } else {
            format!("{}/{suffix}", frame.scope)
        };
        self.out.variables.push(VariableEntry {
            path: self.path.to_string(),
            scoped_name,
            variable,
            owners: self.frames.iter().map(|f| f.entry).collect(),
        });
    }
}
