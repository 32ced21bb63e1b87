//! Nests: the argument and result types of a `Function`.
//!
//! A nest flattens, in a fixed depth-first order, into tensor leaves, static
//! leaves (values that go into the cache key by value) and structure tokens
//! (a `Vec`'s length, an `Option`'s presence), and rebuilds from the same three
//! streams. Flattening borrows, so building a call's signature allocates
//! nothing for the common shapes of arguments.
//!
//! Implemented for `Tensor`, [`Static<T>`], `()`, tuples up to 8, `Vec<T>`,
//! arrays, `Option<T>`, `Box<T>`, and user structs with `#[derive(Nest)]`.
//! [`SpecNest`] is the mirror used by `get_concrete_function`: the same
//! shapes of nest with [`TensorSpec`] (or a `Tensor`, standing for its own
//! type) in place of each tensor.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::TensorType;
use tracejit_tensor::DType;

use crate::Tensor;

/// A value passed by value into the cache key: calls with different static
/// values trace separately (like `static_argnums` in JAX). Derefs to the value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Static<T>(pub T);

impl<T> Deref for Static<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A static leaf seen through its dynamic interface: equality and hashing by
/// value, cloning into an `Arc`, and downcasting on the way back.
pub trait StaticValue: Any + Send + Sync {
    /// Equality with another static leaf (false for another type).
    fn dyn_eq(&self, other: &dyn StaticValue) -> bool;
    /// Feeds the value to a hasher.
    fn dyn_hash(&self, state: &mut dyn Hasher);
    /// An owned copy.
    fn clone_arc(&self) -> Arc<dyn StaticValue>;
    /// The Rust type's name, for retrace messages.
    fn type_name(&self) -> &'static str;
    /// For downcasting.
    fn as_any(&self) -> &dyn Any;
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> StaticValue for T {
    fn dyn_eq(&self, other: &dyn StaticValue) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
    fn dyn_hash(&self, mut state: &mut dyn Hasher) {
        std::any::TypeId::of::<T>().hash(&mut state);
        self.hash(&mut state);
    }
    fn clone_arc(&self) -> Arc<dyn StaticValue> {
        Arc::new(self.clone())
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<T>()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl fmt::Debug for dyn StaticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<static {}>", self.type_name())
    }
}

/// The three streams a nest flattens into, borrowed from the nest.
#[derive(Default)]
pub struct Flattener<'a> {
    /// Tensor leaves in order.
    pub tensors: SmallVec<[&'a Tensor; 4]>,
    /// Static leaves in order.
    pub statics: SmallVec<[&'a dyn StaticValue; 2]>,
    /// Structure tokens in order.
    pub structure: SmallVec<[u32; 4]>,
}

/// The three streams a nest is rebuilt from.
pub struct Unflattener {
    tensors: std::vec::IntoIter<Tensor>,
    statics: std::vec::IntoIter<Arc<dyn StaticValue>>,
    structure: std::vec::IntoIter<u32>,
}

impl Unflattener {
    /// Wraps owned streams.
    pub fn new(tensors: Vec<Tensor>, statics: Vec<Arc<dyn StaticValue>>, structure: Vec<u32>) -> Unflattener {
        Unflattener { tensors: tensors.into_iter(), statics: statics.into_iter(), structure: structure.into_iter() }
    }

    /// The next tensor leaf.
    pub fn tensor(&mut self) -> Tensor {
        self.tensors.next().expect("nest rebuilt from fewer tensors than it flattened to")
    }

    /// The next static leaf.
    pub fn static_value<T: Clone + 'static>(&mut self) -> T {
        let v = self.statics.next().expect("nest rebuilt from fewer static values than it flattened to");
        v.as_any().downcast_ref::<T>().expect("static leaf of another type").clone()
    }

    /// The next structure token.
    pub fn token(&mut self) -> u32 {
        self.structure.next().expect("nest rebuilt from fewer structure tokens than it flattened to")
    }
}

/// A type that can be a `Function`'s argument or result.
pub trait Nest: Sized + Send + Sync + 'static {
    /// Pushes this value's leaves and structure, depth first.
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>);
    /// Rebuilds a value from streams produced by `flatten` of the same shape.
    fn unflatten(src: &mut Unflattener) -> Self;

    /// Pushes the path of each tensor leaf below `path`, in flattening
    /// order, spelled as Module paths are: a struct field adds `.name`, a
    /// tuple element `.0`, a `Vec` or array element `[i]`; `Option` and
    /// `Box` add nothing. Export names graph inputs and outputs with them.
    /// The default (for hand-written impls) numbers the leaves `.0`, `.1`,
    /// ... (a single leaf keeps `path`).
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        let mut flat = Flattener::default();
        self.flatten(&mut flat);
        match flat.tensors.len() {
            1 => out.push(path.to_string()),
            n => out.extend((0..n).map(|i| nest_join_field(path, &i.to_string()))),
        }
    }
}

/// `path.field` (just `field` at the root, whose path is empty).
pub fn nest_join_field(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// The paths of `value`'s tensor leaves ([`Nest::leaf_paths`]) rooted at
/// `root`: a leaf at the root is `root` itself, tuple elements are
/// `root.0`, ..., `Vec` elements `root[0]`, ...; the fields of a struct at
/// the root keep their own names (`x`, `state.h`), which the user chose.
pub fn nest_paths<N: Nest>(value: &N, root: &str) -> Vec<String> {
    let mut paths = Vec::new();
    value.leaf_paths("", &mut paths);
    for p in &mut paths {
        if p.is_empty() {
            *p = root.to_string();
        } else if p.starts_with('[') {
            *p = format!("{root}{p}");
        } else if p.starts_with(|c: char| c.is_ascii_digit()) {
            *p = format!("{root}.{p}");
        }
    }
    paths
}

/// The flattened form of a signature: the type of every tensor leaf, the
/// static leaves and the structure tokens.
#[derive(Default)]
pub struct SpecFlattener {
    /// Types of the tensor leaves.
    pub tensors: Vec<TensorType>,
    /// Static leaves.
    pub statics: Vec<Arc<dyn StaticValue>>,
    /// Structure tokens.
    pub structure: Vec<u32>,
}

/// A nest of specs mirroring a nest of arguments: `TensorSpec` (or `Tensor`)
/// for each tensor, `Static<T>` for each static, the same containers.
pub trait SpecNest {
    /// Pushes the leaves' types, the statics and the structure.
    fn flatten_spec(&self, out: &mut SpecFlattener);
}

/// The dtype and shape of a tensor argument; `-1` in the shape accepts any size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// The type it stands for.
    pub ty: TensorType,
}

impl TensorSpec {
    /// A spec of `dtype` and `shape` (`-1`: any size).
    pub fn new(dtype: DType, shape: &[i64]) -> TensorSpec {
        TensorSpec { ty: TensorType::from_spec(dtype, shape) }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The dims, `None` where any size is accepted.
    pub fn dims(&self) -> &[Option<usize>] {
        &self.ty.dims
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ty.fmt(f)
    }
}

impl Nest for Tensor {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        out.tensors.push(self);
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        src.tensor()
    }
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        out.push(path.to_string());
    }
}

impl SpecNest for Tensor {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        out.tensors.push(self.tensor_type());
    }
}

impl SpecNest for TensorSpec {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        out.tensors.push(self.ty.clone());
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Nest for Static<T> {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        out.statics.push(&self.0);
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        Static(src.static_value::<T>())
    }
    fn leaf_paths(&self, _path: &str, _out: &mut Vec<String>) {}
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> SpecNest for Static<T> {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        out.statics.push(Arc::new(self.0.clone()));
    }
}

impl Nest for () {
    fn flatten<'a>(&'a self, _out: &mut Flattener<'a>) {}
    fn unflatten(_src: &mut Unflattener) -> Self {}
    fn leaf_paths(&self, _path: &str, _out: &mut Vec<String>) {}
}

impl SpecNest for () {
    fn flatten_spec(&self, _out: &mut SpecFlattener) {}
}

impl<T: Nest> Nest for Vec<T> {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        out.structure.push(self.len() as u32);
        for x in self {
            x.flatten(out);
        }
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        let n = src.token() as usize;
        (0..n).map(|_| T::unflatten(src)).collect()
    }
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        for (i, x) in self.iter().enumerate() {
            x.leaf_paths(&format!("{path}[{i}]"), out);
        }
    }
}

impl<T: SpecNest> SpecNest for Vec<T> {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        out.structure.push(self.len() as u32);
        for x in self {
            x.flatten_spec(out);
        }
    }
}

impl<T: SpecNest> SpecNest for [T] {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        out.structure.push(self.len() as u32);
        for x in self.iter() {
            x.flatten_spec(out);
        }
    }
}

impl<T: Nest, const N: usize> Nest for [T; N] {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        for x in self {
            x.flatten(out);
        }
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        std::array::from_fn(|_| T::unflatten(src))
    }
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        for (i, x) in self.iter().enumerate() {
            x.leaf_paths(&format!("{path}[{i}]"), out);
        }
    }
}

impl<T: SpecNest, const N: usize> SpecNest for [T; N] {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        for x in self {
            x.flatten_spec(out);
        }
    }
}

impl<T: Nest> Nest for Option<T> {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        match self {
            Some(x) => {
                out.structure.push(1);
                x.flatten(out);
            }
            None => out.structure.push(0),
        }
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        match src.token() {
            0 => None,
            _ => Some(T::unflatten(src)),
        }
    }
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        if let Some(x) = self {
            x.leaf_paths(path, out);
        }
    }
}

impl<T: SpecNest> SpecNest for Option<T> {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        match self {
            Some(x) => {
                out.structure.push(1);
                x.flatten_spec(out);
            }
            None => out.structure.push(0),
        }
    }
}

impl<T: Nest> Nest for Box<T> {
    fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
        (**self).flatten(out)
    }
    fn unflatten(src: &mut Unflattener) -> Self {
        Box::new(T::unflatten(src))
    }
    fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
        (**self).leaf_paths(path, out)
    }
}

impl<T: SpecNest + ?Sized> SpecNest for &T {
    fn flatten_spec(&self, out: &mut SpecFlattener) {
        (**self).flatten_spec(out)
    }
}

macro_rules! tuple_nest {
    ($($name:ident),+) => {
        impl<$($name: Nest),+> Nest for ($($name,)+) {
            #[allow(non_snake_case)]
            fn flatten<'a>(&'a self, out: &mut Flattener<'a>) {
                let ($($name,)+) = self;
                $($name.flatten(out);)+
            }
            fn unflatten(src: &mut Unflattener) -> Self {
                ($($name::unflatten(src),)+)
            }
            #[allow(non_snake_case)]
            fn leaf_paths(&self, path: &str, out: &mut Vec<String>) {
                let ($($name,)+) = self;
                let mut _i = 0usize;
                $(
                    $name.leaf_paths(&nest_join_field(path, &_i.to_string()), out);
                    _i += 1;
                )+
            }
        }
        impl<$($name: SpecNest),+> SpecNest for ($($name,)+) {
            #[allow(non_snake_case)]
            fn flatten_spec(&self, out: &mut SpecFlattener) {
                let ($($name,)+) = self;
                $($name.flatten_spec(out);)+
            }
        }
    };
}
tuple_nest!(A);
tuple_nest!(A, B);
tuple_nest!(A, B, C);
tuple_nest!(A, B, C, D);
tuple_nest!(A, B, C, D, E);
tuple_nest!(A, B, C, D, E, F);
tuple_nest!(A, B, C, D, E, F, G);
tuple_nest!(A, B, C, D, E, F, G, H);
