//! The verifier: checks a graph's invariants (topological order, input
//! references in range, output types equal to inference, parameters in
//! order, library calls well typed). Runs after every pass in debug builds and
//! tests; a failure is a bug in tracejit, never a user error.
//!
//! Checked, in this order for each node in arena order:
//! - every data input names an earlier node and one of its outputs, and every
//!   control input an earlier node (so arena order is a topological order);
//! - a `Parameter { index }` node is `params[index]`, has no inputs and one
//!   output;
//! - the graphs the node holds ([`Op::subgraphs`]) verify in turn;
//! - any other node's stored output types are exactly what [`infer`] gives for
//!   its op and input types (which also checks that a `Call`'s function and a
//!   variable op's variable exist, and that a call's arguments fit the callee).
//!
//! Then `params[i]` must be a `Parameter { index: i }` node, every graph
//! output must name an existing value, and every library function's graph
//! must verify in turn.

use cranelift_entity::EntityRef;
use smallvec::SmallVec;

use crate::{infer, Graph, IrError, NodeId, Op, TensorType};

/// Checks `graph` (and, recursively, the graphs of its library).
pub fn verify(graph: &Graph) -> Result<(), IrError> {
    let fail = |node: NodeId, message: String| IrError::Verifier { graph: graph.name.clone(), node, message };
    let n = graph.len();

    for (id, node) in graph.nodes() {
        for (i, v) in node.inputs.iter().enumerate() {
            if v.node >= id {
                return Err(fail(id, format!("input {i} ({v}) does not refer to an earlier node")));
            }
            let produced = graph.node(v.node).outputs.len();
            if v.index as usize >= produced {
                return Err(fail(id, format!("input {i} ({v}) names output {} of a node with {produced}", v.index)));
            }
        }
        for c in &node.control_inputs {
            if *c >= id {
                return Err(fail(id, format!("control input {c} does not refer to an earlier node")));
            }
        }

        if let Op::Parameter { index } = node.op {
            if graph.params.get(index) != Some(&id) {
                return Err(fail(id, format!("parameter {index} is not listed as params[{index}]")));
            }
            if !node.inputs.is_empty() {
                return Err(fail(id, "a parameter has data inputs".into()));
            }
            if node.outputs.len() != 1 {
                return Err(fail(id, format!("a parameter has {} outputs instead of 1", node.outputs.len())));
            }
            continue;
        }

        // Nested code first: inference of the op reads its subgraphs' types.
        for sub in node.op.subgraphs() {
            verify(sub)?;
        }
        let input_types: SmallVec<[TensorType; 2]> = node.inputs.iter().map(|v| graph.value_type(*v).clone()).collect();
        let inferred = infer(&node.op, &input_types, Some(graph))
            .map_err(|e| fail(id, format!("shape inference rejects the node: {e}")))?;
        if inferred != node.outputs {
            return Err(fail(
                id,
                format!(
                    "{} declares output types {} but inference gives {}",
                    node.op.name(),
                    type_list(&node.outputs),
                    type_list(&inferred)
                ),
            ));
        }
    }

    for (i, &p) in graph.params.iter().enumerate() {
        if p.index() >= n {
            return Err(fail(p, format!("params[{i}] refers to a missing node")));
        }
        if !matches!(graph.node(p).op, Op::Parameter { index } if index == i) {
            return Err(fail(p, format!("params[{i}] is not a `Parameter {{ index: {i} }}` node")));
        }
    }

    for (i, v) in graph.outputs.iter().enumerate() {
        if v.node.index() >= n || v.index as usize >= graph.node(v.node).outputs.len() {
            return Err(fail(v.node, format!("graph output {i} ({v}) does not exist")));
        }
    }

    for (_, f) in graph.library.iter() {
        verify(&f.graph)?;
    }
    Ok(())
}

/// `(f32[2], i64[])`.
fn type_list(types: &[TensorType]) -> String {
    let items: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    format!("({})", items.join(", "))
}
