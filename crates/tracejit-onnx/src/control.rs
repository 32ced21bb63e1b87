//! Control flow: a `cond` node becomes an ONNX `If`, a `while` node an
//! ONNX `Loop`. Subgraphs read outer values by name (ONNX's lexical
//! scoping), so a branch's parameters and a loop's captured inputs are the
//! enclosing graph's names; subgraph names carry the holding node's name as
//! a prefix so they never shadow outer ones.
//!
//! `while` has a condition graph and a body graph over `(carried...,
//! captured...)`; ONNX's `Loop` tests a condition produced by its body. So
//! the condition is emitted twice: once before the loop for the first test,
//! and at the end of the body for the next one. A static trip count
//! (`fori_loop`) also becomes `Loop`'s `M` input.

use std::collections::HashMap;
use std::sync::Arc;

use tracejit_ir::{Graph, TensorType};
use tracejit_tensor::DType;

use crate::body::Body;
use crate::emit::{emit_into, value_info, ModelState, Scope};
use crate::pb::attribute_proto::AttributeType;
use crate::pb::{AttributeProto, GraphProto, NodeProto, ValueInfoProto};
use crate::tensor_proto::scalar;
use crate::Result;

/// The scope of a subgraph of a graph emitted in `scope`.
fn inner(scope: Scope) -> Scope {
    match scope {
        Scope::Main | Scope::Nested => Scope::Nested,
        Scope::Function => Scope::Function,
    }
}

/// A graph-valued attribute.
fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..AttributeProto::default()
    }
}

/// Copies each of `results` to a fresh output name of `sub` and returns
/// the outputs' value infos.
fn outputs(sub: &mut Body, results: &[String], types: &[TensorType], base: &str) -> Vec<ValueInfoProto> {
    results
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (r, ty))| {
            let o = sub.fresh(&format!("{base}_{i}"));
            sub.to(&o, "Identity", &[r], vec![]);
            value_info(&o, ty, |_| None)
        })
        .collect()
}

/// Emits `cond` as `If(pred)` writing `outs`; `ins` is `(pred, operands...)`.
pub(crate) fn emit_if(
    branches: &[Arc<Graph>; 2],
    ins: &[String],
    outs: &[String],
    scope: Scope,
    body: &mut Body,
    state: &mut ModelState,
) -> Result<()> {
    let node_name = body.fresh("If");
    let mut attrs = Vec::new();
    for (branch, label) in branches.iter().zip(["then_branch", "else_branch"]) {
        let mut sub = Body::with_prefix(format!("{node_name}/{label}/"));
        let results = emit_into(branch, inner(scope), &mut sub, &ins[1..], HashMap::new(), state)?;
        let output = outputs(&mut sub, &results, &branch.output_types(), "out");
        let g =
            GraphProto { name: Some(format!("{node_name}_{label}")), node: sub.nodes, output, ..GraphProto::default() };
        attrs.push(attr_graph(label, g));
    }
    body.nodes.push(NodeProto {
        input: vec![ins[0].clone()],
        output: outs.to_vec(),
        name: Some(node_name),
        op_type: Some("If".into()),
        attribute: attrs,
        ..NodeProto::default()
    });
    Ok(())
}

/// Emits `while` as `Loop` writing `outs`; `ins` is `(carried...,
/// captured...)`.
pub(crate) fn emit_loop(
    parts: &[Arc<Graph>; 2],
    trip_count: Option<usize>,
    ins: &[String],
    outs: &[String],
    scope: Scope,
    body: &mut Body,
    state: &mut ModelState,
) -> Result<()> {
    let [cond, step] = parts;
    let carried = step.outputs.len();
    let captured = &ins[carried..];
    let node_name = body.fresh("Loop");
    let first = emit_into(cond, scope, body, ins, HashMap::new(), state)?;

    let mut sub = Body::with_prefix(format!("{node_name}/body/"));
    let iter = sub.fresh("iter");
    let cond_in = sub.fresh("cond_in");
    let state_in: Vec<String> = (0..carried).map(|i| sub.fresh(&format!("state_{i}"))).collect();
    let params: Vec<String> = state_in.iter().chain(captured).cloned().collect();
    let next = emit_into(step, inner(scope), &mut sub, &params, HashMap::new(), state)?;
    let params: Vec<String> = next.iter().chain(captured).cloned().collect();
    let again = emit_into(cond, inner(scope), &mut sub, &params, HashMap::new(), state)?;
    let mut output = outputs(&mut sub, &again, &cond.output_types(), "cond_out");
    output.extend(outputs(&mut sub, &next, &step.output_types(), "state_out"));
    let scalar_of = |dtype| TensorType::known(dtype, &[]);
    let mut input = vec![value_info(&iter, &scalar_of(DType::I64), |_| None)];
    input.push(value_info(&cond_in, &scalar_of(DType::Bool), |_| None));
    let carried_types = step.param_types();
    input.extend(state_in.iter().zip(&carried_types).map(|(n, ty)| value_info(n, ty, |_| None)));
    let g =
        GraphProto { name: Some(format!("{node_name}_body")), node: sub.nodes, input, output, ..GraphProto::default() };

    let max_trips = match trip_count {
        Some(n) => body.constant(&scalar(DType::I64, n as f64)),
        None => String::new(),
    };
    let mut inputs = vec![max_trips, first[0].clone()];
    inputs.extend(ins[..carried].iter().cloned());
    body.nodes.push(NodeProto {
        input: inputs,
        output: outs.to_vec(),
        name: Some(node_name),
        op_type: Some("Loop".into()),
        attribute: vec![attr_graph("body", g)],
        ..NodeProto::default()
    });
    Ok(())
}
