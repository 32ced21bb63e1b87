//! [`OpKey`]: an op with its attributes as a structured, hashed key, for
//! passes that look for identical ops (CSE) and for caches.
//!
//! Two ops have equal keys exactly when they compute the same function of
//! their inputs: same variant, same attributes (floats by their bits, so
//! `-0.0` and `0.0` differ), constants by value (dtype, shape and every
//! element's bits), and ops holding code (fused regions, kernels) by the
//! identity of that code. The encoding comes from the op table (`op.rs`):
//! the variant's tag, then each field through its type's
//! [`crate::attr::Attr`], so a new op needs no line here.

use smallvec::SmallVec;
use std::hash::{Hash, Hasher};
use tracejit_tensor::{with_array, Storage};

use crate::attr::KeyWriter;
use crate::Op;

/// An op as a key: equal keys mean the same computation.
#[derive(Clone, Debug)]
pub struct OpKey {
    /// The variant's tag, then its attributes as words.
    words: SmallVec<[u64; 6]>,
    /// A constant's value, compared bitwise in full.
    constant: Option<Storage>,
    hash: u64,
}

impl OpKey {
    /// The key of `op`: its tag and its attributes' words, as the op
    /// table declares them ([`crate::attr::Attr`] says how each attribute
    /// type is identified).
    pub fn new(op: &Op) -> OpKey {
        let mut k = KeyWriter::default();
        op.write_key(&mut k);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        k.words.hash(&mut h);
        if let Some(value) = &k.constant {
            hash_elements(value, &mut h);
        }
        OpKey { words: k.words, constant: k.constant, hash: h.finish() }
    }
}

/// Hashes up to 256 evenly spaced elements' bits; equality compares all.
fn hash_elements(value: &Storage, h: &mut impl Hasher) {
    let step = (value.len() / 256).max(1);
    with_array!(value, a => {
        for x in a.iter().step_by(step) {
            tracejit_tensor::Element::to_f64(*x).to_bits().hash(h);
        }
    });
}

impl PartialEq for OpKey {
    fn eq(&self, other: &OpKey) -> bool {
        self.hash == other.hash
            && self.words == other.words
            && match (&self.constant, &other.constant) {
                (Some(a), Some(b)) => a.bit_eq(b),
                (None, None) => true,
                (Some(_), None) | (None, Some(_)) => false,
            }
    }
}

impl Eq for OpKey {}

impl Hash for OpKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracejit_tensor::{BinaryOp, ReduceOp, UnaryOp};

    fn key(op: Op) -> OpKey {
        OpKey::new(&op)
    }

    #[test]
    fn equal_ops_have_equal_keys_and_different_ones_differ() {
        assert_eq!(key(Op::Unary(UnaryOp::Exp)), key(Op::Unary(UnaryOp::Exp)));
        assert_ne!(key(Op::Unary(UnaryOp::Exp)), key(Op::Unary(UnaryOp::Log)));
        assert_ne!(key(Op::Unary(UnaryOp::Neg)), key(Op::Binary(BinaryOp::Add)));
        let r = |axes: Vec<usize>, keepdims| Op::Reduce { op: ReduceOp::Sum, axes, keepdims };
        assert_eq!(key(r(vec![0, 1], false)), key(r(vec![0, 1], false)));
        assert_ne!(key(r(vec![0, 1], false)), key(r(vec![0, 1], true)));
        assert_ne!(key(r(vec![0], false)), key(r(vec![0, 1], false)));
        // A list's length is part of the key: [1] + [] and [] + [1] differ.
        assert_ne!(key(Op::Reshape { shape: vec![1] }), key(Op::Reshape { shape: vec![] }));
        assert_ne!(key(Op::Clamp { min: 0.0, max: 1.0 }), key(Op::Clamp { min: -0.0, max: 1.0 }));
    }

    #[test]
    fn constants_compare_by_bits() {
        let c = |v: Vec<f32>| Op::Constant { value: Storage::from_vec(v.clone(), &[v.len()]).unwrap() };
        assert_eq!(key(c(vec![1.0, f32::NAN])), key(c(vec![1.0, f32::NAN])));
        assert_ne!(key(c(vec![0.0])), key(c(vec![-0.0])));
        assert_ne!(key(c(vec![1.0, 2.0])), key(c(vec![1.0, 3.0])));
        let i = Op::Constant { value: Storage::from_vec(vec![1i32], &[1]).unwrap() };
        assert_ne!(key(c(vec![1.0])), key(i));
    }

    #[test]
    fn the_table_gives_every_variant_its_own_tag() {
        let mut tags: Vec<u64> = Op::VARIANTS.iter().map(|&(_, t)| t).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), Op::VARIANTS.len(), "two rows of the op table share a tag: {:?}", Op::VARIANTS);
        assert!(Op::VARIANTS.iter().any(|&(v, _)| v == "AssignVariable"));
        assert_eq!(Op::MatMul.tag(), Op::VARIANTS.iter().find(|&&(v, _)| v == "MatMul").unwrap().1);
    }

    /// The ops a key tells apart and structural equality agrees on: one op
    /// per attribute kind (words, lists, floats, options, pairs, constants).
    fn samples() -> Vec<Op> {
        use tracejit_tensor::{DType, RandomDist, SliceSpec};
        let slice = |start| SliceSpec { start, stop: Some(3), step: 1 };
        vec![
            Op::MatMul,
            Op::Select,
            Op::Parameter { index: 0 },
            Op::Parameter { index: 1 },
            Op::Cast { to: DType::F32 },
            Op::Cast { to: DType::F64 },
            Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdims: false },
            Op::Reduce { op: ReduceOp::Max, axes: vec![0, 1], keepdims: false },
            Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: false },
            Op::Slice { specs: vec![slice(None)] },
            Op::Slice { specs: vec![slice(Some(0))] },
            Op::Pad { pads: vec![(1, 0)], value: 0.0 },
            Op::Pad { pads: vec![(0, 1)], value: 0.0 },
            Op::Pad { pads: vec![(1, 0)], value: -0.0 },
            Op::Random { dist: RandomDist::Uniform { low: 0.0, high: 1.0 }, dtype: DType::F32, shape: None },
            Op::Random { dist: RandomDist::Normal { mean: 0.0, stddev: 1.0 }, dtype: DType::F32, shape: None },
            Op::Random { dist: RandomDist::Uniform { low: 0.0, high: 1.0 }, dtype: DType::F32, shape: Some(vec![]) },
            Op::Constant { value: Storage::from_vec(vec![1.0f32, 2.0], &[2]).unwrap() },
            Op::Constant { value: Storage::from_vec(vec![1.0f32, 2.0], &[2, 1]).unwrap() },
            Op::Gather { axis: 0 },
            Op::Concat { axis: 0 },
        ]
    }

    #[test]
    fn keys_and_structural_equality_agree_on_attributes() {
        let ops = samples();
        for (i, a) in ops.iter().enumerate() {
            for (j, b) in ops.iter().enumerate() {
                let mut diff = String::new();
                let same = a.same_as(b, &mut diff);
                assert_eq!(same, i == j, "{a:?} vs {b:?}: structurally {same}");
                assert_eq!(key(a.clone()) == key(b.clone()), i == j, "{a:?} vs {b:?}: keys");
            }
        }
    }
}
