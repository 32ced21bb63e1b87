//! `sparse_update`: a variable's update `assign(w, w - x)` whose `x` is a
//! scatter of rows into zeros (an embedding's gradient, `scatter_add(0,
//! ids, rows)`), or that scatter times a scalar (plain SGD's `lr · g`),
//! becomes `assign_sub(w, x)`. The value is the same bit for bit: `w` is
//! the variable's value when the assignment runs (the graph assigns the
//! variable nowhere else), and `w - x` is what `assign_sub` computes. What
//! changes is the shape of the update: the JIT's `sparse_updates` schedule
//! pass recognizes `assign_sub` of a (scaled) scatter into zeros and
//! subtracts the rows from the variable's buffer in place, touching only
//! the rows the ids name, instead of making a zero table, a scaled copy of
//! it and a new table the size of the variable (TF's `ResourceScatterSub`
//! for `IndexedSlices` gradients, PyTorch's sparse embedding gradients).
//!
//! When: `x` has the variable's shape and is read only by the subtraction,
//! which is read only by the assignment; the scatter's base is a constant
//! of `+0.0`s (or a broadcast of one); the scale, if any, is a scalar; and
//! the graph (with its branches, loops and calls) writes the variable only
//! in this assignment. Dense updates (Adam, momentum, weight decay) do not
//! match and keep `assign(w - ..)`, which writes the new value into the
//! old buffer in one fused region.

use tracejit_tensor::BinaryOp;

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult};
use crate::{AssignKind, Graph, NodeId, Op, ValueId, VarId};

/// The sparse-update pass (`sparse_update`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SparseUpdate;

impl Pass for SparseUpdate {
    fn name(&self) -> &'static str {
        "sparse_update"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let nested = run_in_subgraphs(self, g, cx);
        let found: Vec<(NodeId, ValueId)> =
            g.nodes().filter_map(|(id, _)| Some((id, sparse_operand(g, id)?))).collect();
        for &(id, x) in &found {
            let node = g.node_mut(id);
            let Op::AssignVariable { var, locked, .. } = node.op else { continue };
            node.op = Op::AssignVariable { var, kind: AssignKind::Sub, locked };
            node.inputs[0] = x;
        }
        let what = if found.len() == 1 { "update subtracts a scatter" } else { "updates subtract a scatter" };
        nested.and(PassResult::count(found.len(), what))
    }
}

/// For `assign(w, w - x)` at `id` with `x` a (scaled) scatter into zeros:
/// `x`.
fn sparse_operand(g: &Graph, id: NodeId) -> Option<ValueId> {
    let node = g.node(id);
    let Op::AssignVariable { var, kind: AssignKind::Assign, .. } = node.op else { return None };
    let v = node.inputs[0];
    let sub = g.node(v.node);
    if !matches!(sub.op, Op::Binary(BinaryOp::Sub)) || !read_only_by(g, v, id) {
        return None;
    }
    let (w, x) = (sub.inputs[0], sub.inputs[1]);
    let reads_var = matches!(g.node(w.node).op, Op::ReadVariable { var: r, .. } if r == var);
    if !reads_var || g.value_type(x) != g.value_type(v) || !read_only_by(g, x, v.node) || !only_writer(g, var, id) {
        return None;
    }
    is_scaled_scatter(g, x).then_some(x)
}

/// True when `x` is `scatter_add(zeros, ..)`, or that times a scalar, the
/// scatter read by nothing else.
fn is_scaled_scatter(g: &Graph, x: ValueId) -> bool {
    let node = g.node(x.node);
    let scatter = if let Op::Binary(BinaryOp::Mul) = node.op {
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let scatter = if g.value_type(b).rank() == 0 { a } else { b };
        let scale = if scatter == a { b } else { a };
        if g.value_type(scale).rank() != 0 || !read_only_by(g, scatter, x.node) {
            return false;
        }
        scatter
    } else {
        x
    };
    let s = g.node(scatter.node);
    matches!(s.op, Op::ScatterAdd { .. }) && is_positive_zeros(g, s.inputs[0])
}

/// True for a constant whose elements are all `+0.0`, or a broadcast of
/// one (what a gradient's `zeros_like` leaves after constant folding).
fn is_positive_zeros(g: &Graph, v: ValueId) -> bool {
    let node = g.node(v.node);
    if let Op::BroadcastTo { .. } = node.op {
        return is_positive_zeros(g, node.inputs[0]);
    }
    matches!(&node.op, Op::Constant { value } if value.is_all_positive_zeros())
}

/// True when the only reader of `v` is node `reader` (once), and `v` is
/// no graph output.
fn read_only_by(g: &Graph, v: ValueId, reader: NodeId) -> bool {
    let uses: usize = g.nodes().map(|(_, n)| n.inputs.iter().filter(|&&i| i == v).count()).sum();
    uses == 1 && g.node(reader).inputs.contains(&v) && !g.outputs.contains(&v)
}

/// True when node `id` is the graph's only write of `var`, and no call,
/// branch or loop writes anything (their own variable tables are not
/// matched against this graph's).
fn only_writer(g: &Graph, var: VarId, id: NodeId) -> bool {
    g.nodes().all(|(n, node)| match &node.op {
        Op::AssignVariable { var: w, .. } => n == id || *w != var,
        Op::Call { .. } | Op::Cond { .. } | Op::While { .. } | Op::Kernel { .. } => {
            !node.op.effects(&g.library).writes()
        }
        Op::Parameter { .. }
        | Op::Constant { .. }
        | crate::primitive_ops!()
        | Op::Fused { .. }
        | Op::ReadVariable { .. } => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{passes::Dce, verify};

    const SGD: &str = r#"
variable var0 "table": f32[5, 2]
graph "sgd"(%0: i64[3, 1], %1: f32[3, 2]) -> () {
  %2 = read_variable[var=var0 "table"] : f32[5, 2]
  %3 = constant f32[5, 2] [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  %4 = scatter_add[axis=0] %3, %0, %1 : f32[5, 2]
  %5 = constant f32[] 0.1
  %6 = mul %4, %5 : f32[5, 2]
  %7 = sub %2, %6 : f32[5, 2]
  assign_variable[var=var0 "table", kind=assign] %7
}
"#;

    fn run(text: &str) -> (Graph, PassResult) {
        let mut g = Graph::parse(text).expect("parses");
        let cx = PassContext::new("t");
        let r = SparseUpdate.run(&mut g, &cx);
        Dce.run(&mut g, &cx);
        verify(&g).expect("verifies");
        (g, r)
    }

    fn ops(g: &Graph) -> Vec<&'static str> {
        g.nodes().map(|(_, n)| n.op.name()).collect()
    }

    #[test]
    fn sgd_on_a_scatter_subtracts_it_and_a_second_run_changes_nothing() {
        let (g, r) = run(SGD);
        assert!(r.changed, "{g}");
        assert!(!ops(&g).contains(&"sub"), "{g}");
        let printed = g.to_string();
        assert!(printed.contains("kind=assign_sub] %"), "{printed}");
        let mut again = g.clone();
        assert!(!SparseUpdate.run(&mut again, &PassContext::new("t")).changed);
    }

    #[test]
    fn dense_or_shared_or_twice_written_updates_are_left_alone() {
        // A non-zero base, a second reader of the product, another write of
        // the variable, a negative zero: each keeps `assign(w - ..)`.
        let cases = [
            SGD.replace(
                "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
                "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]",
            ),
            SGD.replace(
                "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
                "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.0]",
            ),
            SGD.replace("-> ()", "-> (%6)"),
            SGD.replace(
                "kind=assign] %7",
                "kind=assign] %7\n  assign_variable[var=var0 \"table\", kind=assign_add] %6",
            ),
        ];
        for text in cases {
            let (g, r) = run(&text);
            assert!(!r.changed, "{g}");
        }
    }
}
