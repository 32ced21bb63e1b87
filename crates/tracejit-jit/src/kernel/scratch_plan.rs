//! Scheduling before emission: which values of a kernel live in scratch
//! buffers (row values a later pass reads, column accumulators) and which
//! f32 transcendentals are staged through the vector chunk functions.

use std::collections::HashMap;

use tracejit_ir::tensor::{DType, Exactness, UnaryOp};

use cranelift_entity::{entity_impl, EntityRef};

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp};
use crate::options::JitOptions;

/// A scratch buffer of a kernel (`scratch1`): `Schedule::scratch_slots`
/// of them, each `n` (or `chunk`) 8-byte elements, in the launcher's
/// scratch block.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ScratchId(u32);
entity_impl!(ScratchId, "scratch");

/// Which values are kept in scratch buffers, decided before emission.
#[derive(Clone, Debug, Default)]
pub(crate) struct Schedule {
    /// Number of scratch buffers of `n` 8-byte elements the launcher allocates.
    pub scratch_slots: usize,
    /// Row regions: node -> scratch slot, for values computed in one pass and
    /// read in a later one.
    pub(super) materialized: HashMap<LNodeId, ScratchId>,
    /// Row regions: the pass (1-based) each materialized node is stored in.
    pub(super) stored_in: HashMap<LNodeId, u32>,
    /// Column regions: reduce node -> accumulator slot.
    pub(super) acc: HashMap<LNodeId, ScratchId>,
    /// f32 `exp`/`tanh`/`sigmoid` nodes computed by a vector chunk
    /// function ([`crate::chunks`]) instead of in-line, in node order.
    pub staged: Vec<Staged>,
    /// Elements per chunk of a staged kernel (scratch buffers hold one
    /// chunk, not a row); 0 when nothing is staged.
    pub chunk: usize,
}

/// A node computed by a chunk function: its argument is stored into
/// scratch buffer `scratch`, which the function turns into the node's values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged {
    pub(crate) node: LNodeId,
    pub(crate) op: UnaryOp,
    /// Row regions: the pass that first needs the node (1-based; `passes + 1`
    /// is the final pass). Elementwise regions: 1.
    pub(crate) pass: u32,
    pub(crate) scratch: ScratchId,
}

impl Schedule {
    /// A new scratch buffer.
    fn new_scratch(&mut self) -> ScratchId {
        self.scratch_slots += 1;
        ScratchId::new(self.scratch_slots - 1)
    }
}

/// The f32 nodes of `an` that a chunk function can compute, if staging is on
/// and the kernel runs 32-bit lanes.
pub(super) fn stageable(an: &Analysis, opts: &JitOptions) -> Vec<(LNodeId, UnaryOp)> {
    if lane_bits(an) != Some(32) || !opts.stage {
        return Vec::new();
    }
    an.nodes
        .iter()
        .filter_map(|(i, n)| {
            let LOp::Unary(op) = n.op else { return None };
            (n.dtype == DType::F32 && n.varying && crate::chunks::chunk_fn(op, opts).is_some()).then_some((i, op))
        })
        .collect()
}

/// Elements per chunk of a staged kernel: the arguments and results of the
/// chunk functions stay in L1.
pub(super) const STAGE_CHUNK: usize = 512;

/// Plans scratch buffers for `an` (and which nodes are staged, when
/// `opts.stage`).
pub(crate) fn schedule(an: &Analysis, opts: &JitOptions) -> Schedule {
    let mut s = Schedule::default();
    match an.kind {
        KernelKind::Elementwise => {
            for (node, op) in stageable(an, opts) {
                let scratch = s.new_scratch();
                s.staged.push(Staged { node, op, pass: 1, scratch });
            }
            if !s.staged.is_empty() {
                s.chunk = STAGE_CHUNK;
            }
        }
        KernelKind::Column => {
            for (i, n) in an.nodes.iter() {
                if matches!(n.op, LOp::Reduce(_)) {
                    let k = s.new_scratch();
                    s.acc.insert(i, k);
                }
            }
        }
        KernelKind::Row => {
            let mut computed_in: HashMap<LNodeId, u32> = HashMap::new();
            for p in 1..=an.passes + 1 {
                let roots = pass_roots(an, p);
                let mut stack = roots;
                while let Some(v) = stack.pop() {
                    let node = &an.nodes[v];
                    if !node.varying {
                        continue;
                    }
                    match computed_in.get(&v) {
                        Some(&q) if q == p => continue,
                        Some(&q) => {
                            if !matches!(node.op, LOp::Load(_)) && !s.materialized.contains_key(&v) {
                                let k = s.new_scratch();
                                s.materialized.insert(v, k);
                                s.stored_in.insert(v, q);
                            }
                            continue;
                        }
                        None => {}
                    }
                    computed_in.insert(v, p);
                    stack.extend(node.inputs.iter().copied());
                }
            }
            // A staged node shares the scratch buffer it is materialized in
            // (if a later pass reads it), else gets one of its own.
            for (node, op) in stageable(an, opts) {
                let Some(&pass) = computed_in.get(&node) else { continue };
                let scratch = match s.materialized.get(&node) {
                    Some(&k) => k,
                    None => s.new_scratch(),
                };
                s.staged.push(Staged { node, op, pass, scratch });
            }
        }
    }
    s
}

/// Row regions: the nodes pass `p` must evaluate per element (reduction
/// inputs of stage `p`; the varying outputs in the final pass).
pub(super) fn pass_roots(an: &Analysis, p: u32) -> Vec<LNodeId> {
    if p <= an.passes {
        an.nodes.values().filter(|n| matches!(n.op, LOp::Reduce(_)) && n.stage == p).map(|n| n.inputs[0]).collect()
    } else {
        an.outputs.iter().filter(|o| !o.kept).map(|o| o.node).collect()
    }
}

/// The vector lane width of a program, or `None` when it mixes widths.
pub(super) fn lane_bits(an: &Analysis) -> Option<u32> {
    let mut bits: Option<u32> = None;
    for t in an.nodes.values().map(|n| n.dtype).chain(an.loads.values().map(|l| l.dtype)) {
        let b = match t {
            DType::Bool => continue,
            DType::F32 | DType::I32 | DType::I8 | DType::U8 | DType::I16 | DType::U16 => 32,
            DType::F64 | DType::I64 | DType::U32 => 64,
            DType::BF16 | DType::F16 | DType::U64 => {
                unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
            }
        };
        match bits {
            None => bits = Some(b),
            Some(x) if x == b => {}
            Some(_) => return None,
        }
    }
    Some(bits.unwrap_or(32))
}

pub(super) fn is_heavy(an: &Analysis) -> bool {
    an.nodes.values().any(|n| matches!(n.op, LOp::Unary(u) if u.exactness() == Exactness::ApproxF32))
}
