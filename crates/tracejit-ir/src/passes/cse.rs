//! `cse`: common subexpression elimination. Two nodes with the same op and
//! attributes, the same inputs and the same control inputs compute the same
//! values, so the later one is replaced by the earlier.
//!
//! The structural key of a node is its op with attributes (constants by
//! value: dtype, shape and every element's bits, so `0.0` and `-0.0` differ
//! and NaNs with the same bits are equal; fused regions and kernels by
//! identity), plus its inputs *after* earlier merges, so chains collapse in
//! one pass. Nodes with side effects (variable reads and writes, calls of
//! functions that have them) and parameters are never merged: two reads of a
//! variable may see different values.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_tensor::{with_array, Storage};

use crate::passes::{has_side_effects, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, Op, ValueId};

/// The common subexpression elimination pass (`cse`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

/// A constant compared by value, bitwise.
struct ConstKey {
    value: Storage,
    hash: u64,
}

impl ConstKey {
    /// Hashes dtype, shape and up to 256 evenly spaced elements' bits;
    /// equality compares every element.
    fn new(value: &Storage) -> ConstKey {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (value.dtype() as u8).hash(&mut h);
        value.shape().hash(&mut h);
        let n = value.len();
        let step = (n / 256).max(1);
        with_array!(value, a => {
            for x in a.iter().step_by(step) {
                bits(x).hash(&mut h);
            }
        });
        ConstKey { value: value.clone(), hash: h.finish() }
    }
}

/// The bits of an element, for hashing.
fn bits<T: tracejit_tensor::Element>(x: &T) -> u64 {
    let v = x.to_f64();
    v.to_bits()
}

impl PartialEq for ConstKey {
    fn eq(&self, other: &ConstKey) -> bool {
        self.hash == other.hash && self.value.bit_eq(&other.value)
    }
}
impl Eq for ConstKey {}
impl Hash for ConstKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
    }
}

/// The op part of a node's structural key.
#[derive(PartialEq, Eq, Hash)]
enum OpKey {
    /// Attributes as their `Debug` text: exact for every plain op (floats
    /// print distinctly, `-0.0` included; NaN bounds are rejected by
    /// inference).
    Text(String),
    /// A constant, by value.
    Constant(ConstKey),
    /// A fused region or kernel, by the identity of its body or code.
    Identity(usize, String),
}

fn op_key(op: &Op) -> OpKey {
    match op {
        Op::Constant { value } => OpKey::Constant(ConstKey::new(value)),
        Op::Fused { body } => OpKey::Identity(Arc::as_ptr(body) as usize, String::new()),
        Op::Kernel { name, kernel, inputs, outputs } => {
            OpKey::Identity(Arc::as_ptr(kernel) as *const () as usize, format!("{name} {inputs:?} {outputs:?}"))
        }
        op => OpKey::Text(format!("{op:?}")),
    }
}

#[derive(PartialEq, Eq, Hash)]
struct Key {
    op: OpKey,
    inputs: SmallVec<[ValueId; 2]>,
    control: SmallVec<[NodeId; 1]>,
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let mut rw = Rewriter::new(g);
        let mut seen: HashMap<Key, NodeId> = HashMap::new();
        let mut merged = 0usize;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            if has_side_effects(g, &node.op) {
                rw.copy(id);
                continue;
            }
            let key = Key { op: op_key(&node.op), inputs: rw.inputs(id), control: rw.control(id) };
            match seen.get(&key) {
                Some(&earlier) => {
                    let outs: Vec<ValueId> = (0..node.outputs.len()).map(|i| ValueId::new(earlier, i as u32)).collect();
                    rw.alias(id, &outs);
                    merged += 1;
                }
                None => {
                    let new = rw.copy(id);
                    seen.insert(key, new);
                }
            }
        }
        if merged == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(merged, if merged == 1 { "node merged" } else { "nodes merged" })
    }
}
