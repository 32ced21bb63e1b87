//! Norms of outer products without the products ("ghost clipping", as
//! Opacus does for per-example gradient norms): the sum of squares of
//! `m = a @ b` with an inner dim of 1 is `sum(a²) · sum(b²)` over the
//! matrix axes, because `m[i, j]² = a[i]² · b[j]²`. A weight's
//! per-example gradient is such a product (`xᵀ @ dz`, one row each), so
//! a per-example gradient norm computed inside `vmap` never builds the
//! `[batch, in, out]` gradients: the walker recognizes
//! `reduce_sum(square(matmul(a, b)))` whose product and square have no
//! other reader and emits the factored form in its place.

use std::collections::{HashMap, HashSet};

use tracejit_tensor::{BinaryOp, ReduceOp, UnaryOp};

use crate::{Graph, NodeId, Op, ValueId};

/// A recognized sum of squares: the reduction, and the product's operands.
pub(super) struct Ghost {
    /// The product's operands (per example).
    pub a: ValueId,
    pub b: ValueId,
}

/// The ghost reductions of `graph` (by reduction node) and the nodes
/// they make unnecessary (the product and its square), which the walker
/// does not emit.
pub(super) fn plan(graph: &Graph) -> (HashMap<NodeId, Ghost>, HashSet<NodeId>) {
    let mut readers: HashMap<ValueId, usize> = HashMap::new();
    for (_, n) in graph.nodes() {
        for v in &n.inputs {
            *readers.entry(*v).or_default() += 1;
        }
    }
    for v in &graph.outputs {
        *readers.entry(*v).or_default() += 2;
    }
    let only_reader = |v: ValueId, count: usize| readers.get(&v).copied() == Some(count);
    let mut ghosts = HashMap::new();
    let mut skipped = HashSet::new();
    for (id, n) in graph.nodes() {
        let Op::Reduce { op: ReduceOp::Sum, axes, .. } = &n.op else { continue };
        let sq = n.inputs[0];
        let sq_node = graph.node(sq.node);
        // square(m) or m * m, read by this reduction alone.
        let squares = matches!(sq_node.op, Op::Unary(UnaryOp::Square));
        let self_product = matches!(sq_node.op, Op::Binary(BinaryOp::Mul)) && sq_node.inputs[0] == sq_node.inputs[1];
        if !squares && !self_product {
            continue;
        }
        let (m, reads) = (sq_node.inputs[0], if squares { 1 } else { 2 });
        let m_node = graph.node(m.node);
        if !matches!(m_node.op, Op::MatMul) || !only_reader(sq, 1) || !only_reader(m, reads) {
            continue;
        }
        let (a, b) = (m_node.inputs[0], m_node.inputs[1]);
        let (ta, rank) = (graph.value_type(a), graph.value_type(m).rank());
        let summed_matrix = axes.contains(&(rank - 2)) && axes.contains(&(rank - 1));
        if ta.dims[ta.rank() - 1] != Some(1) || !summed_matrix || !ta.dtype.is_float() {
            continue;
        }
        ghosts.insert(id, Ghost { a, b });
        skipped.insert(sq.node);
        skipped.insert(m.node);
    }
    (ghosts, skipped)
}
