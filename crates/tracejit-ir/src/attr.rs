//! How an op's attribute values are keyed and compared: the [`Attr`] trait,
//! implemented once per attribute type. The op table (`op.rs`) lists each
//! variant's fields; `define_ops!` walks them through this trait to build
//! the op's [`crate::OpKey`] and its structural equality, so no list of the
//! variants is written for either, and a field of a new type is a compile
//! error until its type says how it is identified.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, RandomDist, ReduceOp, SliceSpec, SpatialOp, Storage, UnaryOp};

use crate::control::CancelToken;
use crate::graph::{FuncId, VarId};
use crate::{AssignKind, ExternalKernel, Graph, TensorType};

/// What an [`crate::OpKey`] is built from: words (every list preceded by
/// its length, so the encoding is unambiguous) and a constant's value,
/// compared in full.
#[derive(Default)]
pub(crate) struct KeyWriter {
    pub words: SmallVec<[u64; 6]>,
    pub constant: Option<Storage>,
}

impl KeyWriter {
    pub fn word(&mut self, w: u64) {
        self.words.push(w);
    }

    /// A list: its length, then its items' words.
    fn list<'a, T: Attr + 'a>(&mut self, items: impl ExactSizeIterator<Item = &'a T>) {
        self.word(items.len() as u64);
        for x in items {
            x.key(self);
        }
    }
}

/// An attribute type of the op table.
pub(crate) trait Attr {
    /// Appends the words that identify the value: equal words mean the
    /// same computation (floats by their bits; code by its address).
    fn key(&self, k: &mut KeyWriter);

    /// Structural equality, the text form's (see the `equality` module): a
    /// difference inside a nested graph is described in `diff`.
    fn same(&self, other: &Self, diff: &mut String) -> bool;
}

/// Attributes compared with `==` and keyed as one word.
macro_rules! word_attr {
    ($($t:ty),* $(,)?) => {$(
        impl Attr for $t {
            fn key(&self, k: &mut KeyWriter) {
                k.word(*self as u64);
            }
            fn same(&self, other: &Self, _: &mut String) -> bool {
                self == other
            }
        }
    )*};
}

word_attr!(usize, i64, bool, DType, UnaryOp, BinaryOp, ReduceOp, ArgReduceOp, AssignKind);

impl Attr for FuncId {
    fn key(&self, k: &mut KeyWriter) {
        k.word(u64::from(self.as_u32()));
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

impl Attr for VarId {
    fn key(&self, k: &mut KeyWriter) {
        k.word(u64::from(self.as_u32()));
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

/// By bits: `-0.0` and `0.0` differ, a NaN equals the same NaN.
impl Attr for f64 {
    fn key(&self, k: &mut KeyWriter) {
        k.word(self.to_bits());
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self.to_bits() == other.to_bits()
    }
}

impl Attr for SliceSpec {
    fn key(&self, k: &mut KeyWriter) {
        k.words.extend([
            u64::from(self.start.is_some()),
            self.start.unwrap_or(0) as u64,
            u64::from(self.stop.is_some()),
            self.stop.unwrap_or(0) as u64,
            self.step as u64,
        ]);
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

/// dtype, rank and each dim (`u64::MAX` where unknown).
impl Attr for TensorType {
    fn key(&self, k: &mut KeyWriter) {
        k.words.extend([self.dtype as u64, self.dims.len() as u64]);
        k.words.extend(self.dims.iter().map(|d| d.map_or(u64::MAX, |d| d as u64)));
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

/// The kind of distribution and both parameters' bits.
impl Attr for RandomDist {
    fn key(&self, k: &mut KeyWriter) {
        let (p, q) = self.params();
        k.words.extend([u64::from(matches!(self, RandomDist::Normal { .. })), p.to_bits(), q.to_bits()]);
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        let bits = |d: &RandomDist| {
            let (p, q) = d.params();
            (d.name(), p.to_bits(), q.to_bits())
        };
        bits(self) == bits(other)
    }
}

/// Keyed by the hash of every field (the derive covers them all); equality
/// compares the fields.
impl Attr for SpatialOp {
    fn key(&self, k: &mut KeyWriter) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        k.word(h.finish());
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

/// The bytes, eight to a word, after the length.
impl Attr for String {
    fn key(&self, k: &mut KeyWriter) {
        k.word(self.len() as u64);
        for chunk in self.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            k.word(u64::from_le_bytes(w));
        }
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self == other
    }
}

/// A constant: its dtype and shape as words, its elements compared in full
/// by [`crate::OpKey`]; structurally, bitwise.
impl Attr for Storage {
    fn key(&self, k: &mut KeyWriter) {
        k.word(self.dtype() as u64);
        k.list(self.shape().iter());
        k.constant = Some(self.clone());
    }
    fn same(&self, other: &Self, _: &mut String) -> bool {
        self.bit_eq(other)
    }
}

/// A nested graph: by identity in a key (two regions are one computation
/// only when they run the same body), recursively in structural equality.
impl Attr for Arc<Graph> {
    fn key(&self, k: &mut KeyWriter) {
        k.word(Arc::as_ptr(self) as usize as u64);
    }
    fn same(&self, other: &Self, diff: &mut String) -> bool {
        crate::equality::graph_diff(diff, self, other);
        diff.is_empty()
    }
}

/// A native kernel's code: by identity in a key; structurally every kernel
/// is alike (the text form names it, and its name is another field).
impl Attr for Arc<dyn ExternalKernel> {
    fn key(&self, k: &mut KeyWriter) {
        k.word(Arc::as_ptr(self) as *const () as usize as u64);
    }
    fn same(&self, _: &Self, _: &mut String) -> bool {
        true
    }
}

/// Loops stopped by different tokens are different loops; the text form
/// only says a token is there (a parsed graph gets a new one).
impl Attr for CancelToken {
    fn key(&self, k: &mut KeyWriter) {
        k.word(self.identity() as u64);
    }
    fn same(&self, _: &Self, _: &mut String) -> bool {
        true
    }
}

impl<A: Attr, B: Attr> Attr for (A, B) {
    fn key(&self, k: &mut KeyWriter) {
        self.0.key(k);
        self.1.key(k);
    }
    fn same(&self, other: &Self, diff: &mut String) -> bool {
        self.0.same(&other.0, diff) && self.1.same(&other.1, diff)
    }
}

impl<T: Attr> Attr for Vec<T> {
    fn key(&self, k: &mut KeyWriter) {
        k.list(self.iter());
    }
    fn same(&self, other: &Self, diff: &mut String) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a.same(b, diff))
    }
}

impl<T: Attr, const N: usize> Attr for [T; N] {
    fn key(&self, k: &mut KeyWriter) {
        for x in self {
            x.key(k);
        }
    }
    fn same(&self, other: &Self, diff: &mut String) -> bool {
        self.iter().zip(other).all(|(a, b)| a.same(b, diff))
    }
}

/// Presence, then the value.
impl<T: Attr> Attr for Option<T> {
    fn key(&self, k: &mut KeyWriter) {
        k.word(u64::from(self.is_some()));
        if let Some(x) = self {
            x.key(k);
        }
    }
    fn same(&self, other: &Self, diff: &mut String) -> bool {
        match (self, other) {
            (Some(a), Some(b)) => a.same(b, diff),
            (None, None) => true,
            (Some(_), None) | (None, Some(_)) => false,
        }
    }
}

/// A variant's fields as a tuple of references, in table order: what
/// `define_ops!` hands over, whatever the variant's arity.
pub(crate) trait AttrList {
    fn key(&self, k: &mut KeyWriter);
    fn same(&self, other: &Self, diff: &mut String) -> bool;
}

macro_rules! attr_list {
    ($($x:ident $i:tt),*) => {
        impl<$($x: Attr),*> AttrList for ($(&$x,)*) {
            #[allow(unused_variables)]
            fn key(&self, k: &mut KeyWriter) {
                $(self.$i.key(k);)*
            }
            #[allow(unused_variables)]
            fn same(&self, other: &Self, diff: &mut String) -> bool {
                true $(&& self.$i.same(other.$i, diff))*
            }
        }
    };
}

attr_list!();
attr_list!(A 0);
attr_list!(A 0, B 1);
attr_list!(A 0, B 1, C 2);
attr_list!(A 0, B 1, C 2, D 3);
