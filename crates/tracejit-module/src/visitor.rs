//! The walk interface: [`Visitor`] callbacks, the path [`Segment`]s a walk
//! enters and leaves, and [`ModulePath`], which renders them as
//! `encoder.layers[0].w`.
//!
//! Invariant of every walk: each `enter(s)` is matched by one `exit(s)` with
//! the same segment, each `enter_module(m)` by one `exit_module(m)`, and the
//! calls nest properly, so a visitor that pushes on enter and pops on exit
//! always knows the current path.

use std::fmt;

use tracejit_trace::Variable;

use crate::Module;

/// One step of a path from the root module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Segment<'a> {
    /// A struct field (`w`; a tuple struct's fields are `0`, `1`, ...).
    Field(&'a str),
    /// An element of a `Vec`, slice or array.
    Index(usize),
    /// An entry of a `BTreeMap<String, _>`.
    Key(&'a str),
}

impl fmt::Display for Segment<'_> {
    /// The segment as it appears inside a path: `w`, `[0]`, `["key"]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Field(name) => f.write_str(name),
            Segment::Index(i) => write!(f, "[{i}]"),
            Segment::Key(k) => write!(f, "[{k:?}]"),
        }
    }
}

impl Segment<'_> {
    /// The segment as one component of a `/`-separated name: `w`, `0`, `key`.
    pub fn scope_component(&self) -> String {
        match self {
            Segment::Field(name) => (*name).to_string(),
            Segment::Index(i) => i.to_string(),
            Segment::Key(k) => (*k).to_string(),
        }
    }
}

/// The callbacks of a walk over a module. Every method does nothing by
/// default; implement the ones you need.
///
/// `'m` is the lifetime of the walked module: references handed to the
/// visitor may be kept for as long as the module is borrowed.
pub trait Visitor<'m> {
    /// The walk steps into a field, element or map entry. (`Option`, `Box`,
    /// `Arc` and `Rc` add no segment.)
    fn enter(&mut self, segment: Segment<'m>) {
        let _ = segment;
    }

    /// The walk steps back out of `segment` (the one last entered).
    fn exit(&mut self, segment: Segment<'m>) {
        let _ = segment;
    }

    /// A module is reached at the current path. Its fields are walked next,
    /// then `exit_module` is called with the same module.
    fn enter_module(&mut self, module: &'m dyn Module) {
        let _ = module;
    }

    /// The walk has finished the fields of `module`.
    fn exit_module(&mut self, module: &'m dyn Module) {
        let _ = module;
    }

    /// A variable is reached at the current path.
    fn variable(&mut self, variable: &'m Variable) {
        let _ = variable;
    }

    /// A slot variable is reached: state kept for the variable with id
    /// `owner` (an optimizer's `m` of a weight; see [`crate::slots`]). The
    /// walk behind `named_variables` and checkpoints names it by the current
    /// path followed by the owner's path in the tree; `fallback` is the path
    /// below the current one for walks that do not know the tree, and for
    /// owners outside it. By default the slot is a variable at `fallback`.
    fn slot(&mut self, owner: u64, fallback: &[Segment<'m>], slot: &'m Variable) {
        let _ = owner;
        for s in fallback {
            self.enter(*s);
        }
        self.variable(slot);
        for s in fallback.iter().rev() {
            self.exit(*s);
        }
    }

    /// A module keeping slots is reached at the current path (checkpoints
    /// hand it values for slots it has not created yet).
    fn slot_holder(&mut self, holder: &'m dyn crate::SlotHolder) {
        let _ = holder;
    }
}

/// The current path of a walk, for visitors: `push` on
/// [`Visitor::enter`], `pop` on [`Visitor::exit`], `to_string()` for the
/// `encoder.layers[0].w` form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ModulePath<'a> {
    segments: Vec<Segment<'a>>,
}

impl<'a> ModulePath<'a> {
    /// The empty path (the root module).
    pub fn new() -> ModulePath<'a> {
        ModulePath { segments: Vec::new() }
    }

    /// Appends a segment.
    pub fn push(&mut self, segment: Segment<'a>) {
        self.segments.push(segment);
    }

    /// Removes and returns the last segment.
    pub fn pop(&mut self) -> Option<Segment<'a>> {
        self.segments.pop()
    }

    /// The segments, root first.
    pub fn segments(&self) -> &[Segment<'a>] {
        &self.segments
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// True at the root.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The segments from `start` on, joined with `/` (`layers/0/w`); how
    /// name scopes render a path inside a module.
    pub fn scope_suffix(&self, start: usize) -> String {
        let parts: Vec<String> =
            self.segments[start.min(self.segments.len())..].iter().map(|s| s.scope_component()).collect();
        parts.join("/")
    }
}

impl fmt::Display for ModulePath<'_> {
    /// Fields joined with `.`, `[i]` for elements, `["key"]` for entries.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.segments.iter().enumerate() {
            if i > 0 && matches!(s, Segment::Field(_)) {
                f.write_str(".")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_with_dots_indices_and_keys() {
        let mut p = ModulePath::new();
        assert_eq!(p.to_string(), "");
        p.push(Segment::Field("encoder"));
        p.push(Segment::Field("layers"));
        p.push(Segment::Index(0));
        p.push(Segment::Field("w"));
        assert_eq!(p.to_string(), "encoder.layers[0].w");
        assert_eq!(p.scope_suffix(1), "layers/0/w");
        p.pop();
        p.pop();
        p.push(Segment::Key("a \"b\""));
        p.push(Segment::Index(2));
        assert_eq!(p.to_string(), r#"encoder.layers["a \"b\""][2]"#);
        let mut q = ModulePath::new();
        q.push(Segment::Index(3));
        q.push(Segment::Field("w"));
        assert_eq!(q.to_string(), "[3].w");
    }
}
