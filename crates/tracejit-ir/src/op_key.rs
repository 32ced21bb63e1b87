//! [`OpKey`]: an op with its attributes as a structured, hashed key, for
//! passes that look for identical ops (CSE) and for caches.
//!
//! Two ops have equal keys exactly when they compute the same function of
//! their inputs: same variant, same attributes (floats by their bits, so
//! `-0.0` and `0.0` differ), constants by value (dtype, shape and every
//! element's bits), and ops holding code (fused regions, kernels) by the
//! identity of that code. The encoding is an exhaustive `match`: a new
//! variant does not compile until it says what identifies it.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_tensor::{with_array, SliceSpec, Storage};

use crate::{Op, TensorType};

/// An op as a key: equal keys mean the same computation.
#[derive(Clone, Debug)]
pub struct OpKey {
    /// The variant's tag, then its attributes as words.
    words: SmallVec<[u64; 6]>,
    /// A constant's value, compared bitwise in full.
    constant: Option<Storage>,
    /// The address of the code a fused region or kernel runs.
    identity: usize,
    hash: u64,
}

impl OpKey {
    /// The key of `op`.
    pub fn new(op: &Op) -> OpKey {
        let mut w: SmallVec<[u64; 6]> = SmallVec::new();
        let mut constant = None;
        let mut identity = 0usize;
        let list = |w: &mut SmallVec<[u64; 6]>, xs: &mut dyn Iterator<Item = u64>| {
            let at = w.len();
            w.push(0);
            let mut n = 0;
            for x in xs {
                w.push(x);
                n += 1;
            }
            w[at] = n;
        };
        match op {
            Op::Parameter { index } => w.extend([0, *index as u64]),
            Op::Constant { value } => {
                w.push(1);
                w.push(value.dtype() as u64);
                list(&mut w, &mut value.shape().iter().map(|&d| d as u64));
                constant = Some(value.clone());
            }
            Op::Unary(u) => w.extend([2, *u as u64]),
            Op::Binary(b) => w.extend([3, *b as u64]),
            Op::Select => w.push(4),
            Op::Cast { to } => w.extend([5, *to as u64]),
            Op::Clamp { min, max } => w.extend([6, min.to_bits(), max.to_bits()]),
            Op::Reduce { op, axes, keepdims } => {
                w.extend([7, *op as u64, u64::from(*keepdims)]);
                list(&mut w, &mut axes.iter().map(|&a| a as u64));
            }
            Op::ArgReduce { op, axis, keepdims } => w.extend([8, *op as u64, *axis as u64, u64::from(*keepdims)]),
            Op::MatMul => w.push(9),
            Op::Reshape { shape } => {
                w.push(10);
                list(&mut w, &mut shape.iter().map(|&d| d as u64));
            }
            Op::Transpose { perm } => {
                w.push(11);
                list(&mut w, &mut perm.iter().map(|&a| a as u64));
            }
            Op::BroadcastTo { shape } => {
                w.push(12);
                list(&mut w, &mut shape.iter().map(|&d| d as u64));
            }
            Op::ExpandDims { axis } => w.extend([13, *axis as u64]),
            Op::Squeeze { axes } => {
                w.push(14);
                list(&mut w, &mut axes.iter().map(|&a| a as u64));
            }
            Op::Concat { axis } => w.extend([15, *axis as u64]),
            Op::Stack { axis } => w.extend([16, *axis as u64]),
            Op::Slice { specs } => {
                w.push(17);
                list(&mut w, &mut specs.iter().flat_map(slice_words));
            }
            Op::Gather { axis } => w.extend([18, *axis as u64]),
            Op::OneHot { depth, dtype } => w.extend([19, *depth as u64, *dtype as u64]),
            Op::Call { func } => w.extend([20, u64::from(func.as_u32())]),
            Op::Fused { body } => {
                w.push(21);
                identity = Arc::as_ptr(body) as usize;
            }
            // Both subgraphs by identity: the first in `identity`, the
            // second as a word.
            Op::Cond { branches } => {
                w.extend([25, Arc::as_ptr(&branches[1]) as usize as u64]);
                identity = Arc::as_ptr(&branches[0]) as usize;
            }
            Op::While { parts, trip_count, cancel } => {
                w.extend([26, Arc::as_ptr(&parts[1]) as usize as u64, trip_count.map_or(u64::MAX, |n| n as u64)]);
                // Loops stopped by different tokens are different loops.
                w.push(cancel.as_ref().map_or(0, |c| c as *const _ as usize as u64));
                identity = Arc::as_ptr(&parts[0]) as usize;
            }
            Op::Kernel { name, kernel, inputs, outputs } => {
                w.push(22);
                let mut h = std::collections::hash_map::DefaultHasher::new();
                name.hash(&mut h);
                w.push(h.finish());
                list(&mut w, &mut inputs.iter().flat_map(type_words));
                list(&mut w, &mut outputs.iter().flat_map(type_words));
                identity = Arc::as_ptr(kernel) as *const () as usize;
            }
            // A locked read never merges with an unlocked one: the update
            // must use the value read under the lock.
            Op::ReadVariable { var, locked } => w.extend([23, u64::from(var.as_u32()), u64::from(*locked)]),
            Op::AssignVariable { var, kind, locked } => {
                w.extend([24, u64::from(var.as_u32()), *kind as u64, u64::from(*locked)])
            }
            Op::GatherElements { axis } => w.extend([27, *axis as u64]),
            Op::ScatterAdd { axis } => w.extend([28, *axis as u64]),
            Op::DynamicSlice { sizes } => {
                w.push(29);
                list(&mut w, &mut sizes.iter().map(|&d| d as u64));
            }
            Op::DynamicUpdateSlice => w.push(30),
            Op::Pad { pads, value } => {
                w.extend([31, value.to_bits()]);
                list(&mut w, &mut pads.iter().flat_map(|&(lo, hi)| [lo as u64, hi as u64]));
            }
            Op::Cumsum { axis } => w.extend([32, *axis as u64]),
            Op::TopK { k } => w.extend([33, *k as u64]),
            Op::Spatial(sp) => {
                // The attributes' hash: the variant and every field (the
                // derive covers them all).
                let mut h = std::collections::hash_map::DefaultHasher::new();
                sp.hash(&mut h);
                w.extend([35, h.finish()]);
            }
            Op::Random { dist, dtype, shape } => {
                let (p, q) = dist.params();
                let kind = u64::from(matches!(dist, tracejit_tensor::RandomDist::Normal { .. }));
                w.extend([34, kind, p.to_bits(), q.to_bits(), *dtype as u64]);
                match shape {
                    Some(shape) => list(&mut w, &mut shape.iter().map(|&d| d as u64)),
                    None => w.push(u64::MAX),
                }
            }
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        w.hash(&mut h);
        identity.hash(&mut h);
        if let Some(value) = &constant {
            hash_elements(value, &mut h);
        }
        OpKey { words: w, constant, identity, hash: h.finish() }
    }
}

/// `start`, `stop` (each as present-flag and value) and `step`.
fn slice_words(s: &SliceSpec) -> [u64; 5] {
    [
        u64::from(s.start.is_some()),
        s.start.unwrap_or(0) as u64,
        u64::from(s.stop.is_some()),
        s.stop.unwrap_or(0) as u64,
        s.step as u64,
    ]
}

/// dtype, rank and each dim (`u64::MAX` where unknown).
fn type_words(t: &TensorType) -> SmallVec<[u64; 6]> {
    let mut w: SmallVec<[u64; 6]> = SmallVec::new();
    w.push(t.dtype as u64);
    w.push(t.dims.len() as u64);
    w.extend(t.dims.iter().map(|d| d.map_or(u64::MAX, |d| d as u64)));
    w
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
            && self.identity == other.identity
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
}
