//! `plan_regions`: the IR's fusion pass with this JIT's acceptance rule
//! ([`crate::supports`]), over a graph and every subgraph it holds, for
//! graphs that have not been through the IR's pipeline.

use std::sync::Arc;

use tracejit_ir::passes::{Fusion, Pass, PassContext};
use tracejit_ir::Graph;

/// `graph` with its fusible nodes planned into regions this JIT compiles,
/// in it and in the branches and loop bodies it holds (the IR's `fusion`
/// pass with [`crate::supports`] as its acceptance rule). The pipeline of
/// a traced function runs the same pass, so its graphs skip this.
///
/// ```
/// use tracejit_ir::tensor::{DType, UnaryOp};
/// use tracejit_ir::{Graph, Op, TensorType, ValueId};
///
/// let mut g = Graph::new("f");
/// let x = g.add_param(TensorType::known(DType::F32, &[8]));
/// let e = ValueId::new(g.add_node(Op::Unary(UnaryOp::Exp), &[x], &[], None).unwrap(), 0);
/// let t = ValueId::new(g.add_node(Op::Unary(UnaryOp::Tanh), &[e], &[], None).unwrap(), 0);
/// g.outputs.push(t);
/// let planned = tracejit_jit::codegen::plan_regions(&g);
/// assert!(planned.nodes().any(|(_, n)| matches!(n.op, Op::Fused { .. })));
/// ```
pub fn plan_regions(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    let cx = PassContext::new(graph.name.clone()).with_region_acceptor(Arc::new(crate::supports));
    Fusion::default().run(&mut g, &cx);
    g
}
