//! One walk that records everything the provided methods of `Module` need:
//! every module and variable reached, with its path, its name scope, and
//! (for variables) the modules enclosing it. `named_variables`, `variables`,
//! `submodules`, `summary`, `assign_names` and the checkpoints all read this
//! record, so they agree on order, paths and names by construction.

use std::collections::HashSet;

use tracejit_trace::Variable;

use crate::naming::uniquify;
use crate::slots::PendingSlot;
use crate::visitor::{ModulePath, Segment, Visitor};
use crate::{Module, SlotHolder};

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
    /// The path's segments (slots' paths are built from their owners').
    pub segments: Vec<Segment<'m>>,
    /// For a slot, the id of the variable it belongs to.
    pub slot_of: Option<u64>,
}

/// What one walk found, in walk order. `modules[0]` is the root.
pub(crate) struct Inventory<'m> {
    pub modules: Vec<ModuleEntry<'m>>,
    pub variables: Vec<VariableEntry<'m>>,
    /// Modules keeping slots, with their paths.
    pub holders: Vec<(String, &'m dyn SlotHolder)>,
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
    slots: Vec<PendingSlot>,
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
                holders: Vec::new(),
            },
            slots: Vec::new(),
        };
        root.visit_fields(&mut rec);
        rec.name_slots();
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
            segments: self.path.segments().to_vec(),
            slot_of: None,
        });
    }

    fn slot(&mut self, owner: u64, fallback: &[Segment<'m>], slot: &'m Variable) {
        let prefix_len = self.path.len();
        for s in fallback {
            self.enter(*s);
        }
        let entry = self.out.variables.len();
        self.variable(slot);
        self.out.variables[entry].slot_of = Some(owner);
        for s in fallback.iter().rev() {
            self.exit(*s);
        }
        let frame = self.frames.last().expect("the root frame is never popped");
        let (scope, scope_from) = (frame.scope.clone(), frame.path_len);
        self.slots.push(PendingSlot { entry, owner, prefix_len, scope, scope_from });
    }

    fn slot_holder(&mut self, holder: &'m dyn SlotHolder) {
        self.out.holders.push((self.path.to_string(), holder));
    }
}

impl Recorder<'_> {
    /// Names every slot whose owner the walk reached by the owner's first
    /// path: the slot's prefix (its holder's path and kind), then that path.
    fn name_slots(&mut self) {
        for pending in std::mem::take(&mut self.slots) {
            let owner = self.out.variables.iter().find(|v| v.slot_of.is_none() && v.variable.id() == pending.owner);
            let Some(owner_segments) = owner.map(|o| o.segments.clone()) else { continue };
            let entry = &mut self.out.variables[pending.entry];
            let mut path = ModulePath::new();
            for s in entry.segments[..pending.prefix_len].iter().chain(&owner_segments) {
                path.push(*s);
            }
            entry.scoped_name = format!("{}/{}", pending.scope, path.scope_suffix(pending.scope_from));
            entry.path = path.to_string();
            entry.segments = path.segments().to_vec();
        }
    }
}
