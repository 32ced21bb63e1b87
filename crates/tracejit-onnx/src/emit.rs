//! From a prepared graph to a `ModelProto`: names, graph inputs and outputs
//! (unknown dims as symbolic dims), initializers for captured tensors and
//! variables, one ONNX local function per distinct composite body, and the
//! primitive lowerings of `ops.rs` for everything else.
//!
//! Every match over `Op` here lists each variant, so a new op is a compile
//! error until export handles it (or says why it cannot).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tracejit_ir::{FuncId, Graph, LibraryFunction, Node, NodeId, Op, TensorType, ValueId, VarId};

use crate::body::Body;
use crate::pb::tensor_shape_proto::{dimension, Dimension};
use crate::pb::{
    type_proto, FunctionProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::tensor_proto::{data_type, tensor_proto};
use crate::{prepare, Error, Result, OPSET};

/// Version of every composite domain (`tracejit.nn`) in `opset_import`.
pub(crate) const COMPOSITE_DOMAIN_VERSION: i64 = 1;

/// What the whole model accumulates while graphs and functions are emitted.
#[derive(Default)]
pub(crate) struct ModelState {
    /// Local functions, in the order they were first called.
    pub(crate) functions: Vec<FunctionProto>,
    /// The (domain, name, overload) of each composite body emitted, by body.
    pub(crate) emitted: HashMap<*const Graph, (String, String, Option<String>)>,
    /// Composite domains used (for `opset_import`).
    pub(crate) domains: BTreeSet<String>,
    /// Initializer names of variables, by variable id (user-given paths).
    pub(crate) variable_names: HashMap<u64, String>,
    /// Initializers already emitted for variables, by variable id.
    pub(crate) variables_done: HashMap<u64, String>,
}

/// Where a graph is emitted: the model's main graph, a branch or loop body
/// inside it, or a local function's body.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Captured tensors and variables become initializers.
    Main,
    /// A subgraph of the main graph (`If` branch, `Loop` body): constants
    /// are nodes, variables are the main graph's initializers (outer names
    /// are visible in subgraphs).
    Nested,
    /// Everything is a node (a function has no initializers and sees no
    /// outer names).
    Function,
}

/// The emitted nodes and initializers of one graph.
pub(crate) struct Emitted {
    pub(crate) body: Body,
}

/// Emits `g` as a graph or function body of its own, with these input and
/// output names.
pub(crate) fn emit_graph(
    g: &Graph,
    scope: Scope,
    input_names: &[String],
    output_names: &[String],
    state: &mut ModelState,
) -> Result<Emitted> {
    let mut body = Body::default();
    for n in input_names.iter().chain(output_names) {
        body.reserve(n);
    }
    if scope == Scope::Main {
        emit_variables(g, &mut body, state);
    }
    // A result computed by a node of this graph is written straight to its
    // output name; inputs, initializers and repeated results get an Identity.
    let mut preset: HashMap<ValueId, String> = HashMap::new();
    let mut needs_identity = Vec::new();
    for (i, &v) in g.outputs.iter().enumerate() {
        if is_computed(&g.node(v.node).op, scope) && !preset.contains_key(&v) {
            preset.insert(v, output_names[i].clone());
        } else {
            needs_identity.push(i);
        }
    }
    let outs = emit_into(g, scope, &mut body, input_names, preset, state)?;
    for i in needs_identity {
        body.to(&output_names[i], "Identity", &[&outs[i]], vec![]);
    }
    Ok(Emitted { body })
}

/// True when an output produced by `op` is written by a node of this graph
/// (so it can carry the graph output's name directly).
fn is_computed(op: &Op, scope: Scope) -> bool {
    match op {
        Op::Parameter { .. } | Op::ReadVariable { .. } => false,
        Op::Constant { .. } => scope != Scope::Main,
        // Every op that computes its outputs writes them with a node of this graph.
        _ => true,
    }
}

/// Emits the nodes of `g` into `body` with its parameters bound to the
/// names `params` (and values in `preset` written to the names given
/// there); returns the names of `g`'s outputs.
pub(crate) fn emit_into(
    g: &Graph,
    scope: Scope,
    body: &mut Body,
    params: &[String],
    preset: HashMap<ValueId, String>,
    state: &mut ModelState,
) -> Result<Vec<String>> {
    let mut names = preset;
    for (i, &p) in g.params.iter().enumerate() {
        names.insert(ValueId::new(p, 0), params[i].clone());
    }
    for (id, node) in g.nodes() {
        emit_node(g, id, node, scope, body, &mut names, state)?;
    }
    Ok(g.outputs.iter().map(|v| names[v].clone()).collect())
}

/// One initializer per variable that `g` or any of its subgraphs reads,
/// holding its current value, named by the user's path or its own name.
fn emit_variables(g: &Graph, body: &mut Body, state: &mut ModelState) {
    for (_, node) in g.nodes() {
        if let Op::ReadVariable { var, .. } = node.op {
            let resource = &g.variables[var];
            let key = resource.id();
            if !state.variables_done.contains_key(&key) {
                let wanted = state.variable_names.get(&key).cloned().unwrap_or_else(|| resource.name());
                let name = body.fresh(&wanted);
                body.initializers.push(tensor_proto(&name, &resource.read()));
                state.variables_done.insert(key, name);
            }
        }
        for sub in node.op.subgraphs() {
            emit_variables(sub, body, state);
        }
    }
}

/// The name of output `v` of a node, fixed on first use.
fn name_of(names: &mut HashMap<ValueId, String>, body: &mut Body, g: &Graph, v: ValueId) -> String {
    if let Some(n) = names.get(&v) {
        return n.clone();
    }
    let base = match v.index {
        0 => format!("{}_{}", g.node(v.node).op.name(), v.node.as_u32()),
        i => format!("{}_{}_{i}", g.node(v.node).op.name(), v.node.as_u32()),
    };
    let n = body.fresh(&base);
    names.insert(v, n.clone());
    n
}

fn unsupported(g: &Graph, id: NodeId, node: &Node, reason: impl Into<String>) -> Error {
    Error::Unsupported {
        function: g.name.clone(),
        node: ValueId::from(id).to_string(),
        op: node.op.name().to_string(),
        at: node.location.map(|l| format!(", created at {}:{}", l.file(), l.line())).unwrap_or_default(),
        reason: reason.into(),
    }
}

/// A variable read: its readers use the variable's initializer by name.
fn read_variable(
    g: &Graph,
    id: NodeId,
    node: &Node,
    var: VarId,
    scope: Scope,
    names: &mut HashMap<ValueId, String>,
    state: &ModelState,
) -> Result<()> {
    if scope == Scope::Function {
        return Err(unsupported(g, id, node, "an ONNX function cannot read the model's initializers"));
    }
    let Some(name) = state.variables_done.get(&g.variables[var].id()).cloned() else {
        return Err(unsupported(g, id, node, "a variable missed by the initializer walk (a bug in the exporter)"));
    };
    // Readers (and a trailing Identity, if the value is a result)
    // use the initializer by name.
    names.insert(ValueId::new(id, 0), name);
    Ok(())
}

/// A composite call left in the export graph: BatchNormalization, or a
/// node of the composite's ONNX local function.
fn emit_call(
    g: &Graph,
    id: NodeId,
    node: &Node,
    func: FuncId,
    body: &mut Body,
    names: &mut HashMap<ValueId, String>,
    state: &mut ModelState,
) -> Result<()> {
    let out =
        |names: &mut HashMap<ValueId, String>, body: &mut Body, i: u32| name_of(names, body, g, ValueId::new(id, i));
    let callee = g.library.get(func);
    let Some(implements) = callee.implements() else {
        return Err(unsupported(g, id, node, "a call left after inlining (a bug in the exporter)"));
    };
    if let Some(eps) = crate::spatial::batch_norm_eps(g, node, implements) {
        let ins: Vec<String> = node.inputs[..5].iter().map(|&v| names[&v].clone()).collect();
        let o = out(names, body, 0);
        crate::spatial::batch_norm(body, &ins, eps, &o);
        return Ok(());
    }
    let (domain, name, overload) = composite_function(callee, implements, state)?;
    let inputs: Vec<String> = node.inputs.iter().map(|&v| names[&v].clone()).collect();
    let outputs: Vec<String> = (0..node.outputs.len() as u32).map(|i| out(names, body, i)).collect();
    let node_name = body.fresh(&format!("{name}_{}", id.as_u32()));
    body.nodes.push(NodeProto {
        input: inputs,
        output: outputs,
        name: Some(node_name),
        op_type: Some(name),
        domain: Some(domain),
        overload,
        ..NodeProto::default()
    });
    Ok(())
}

fn emit_node(
    g: &Graph,
    id: NodeId,
    node: &Node,
    scope: Scope,
    body: &mut Body,
    names: &mut HashMap<ValueId, String>,
    state: &mut ModelState,
) -> Result<()> {
    let out =
        |names: &mut HashMap<ValueId, String>, body: &mut Body, i: u32| name_of(names, body, g, ValueId::new(id, i));
    match &node.op {
        Op::Parameter { .. } => {}
        Op::Constant { value } => {
            let name = out(names, body, 0);
            match scope {
                Scope::Main => body.initializers.push(tensor_proto(&name, value)),
                Scope::Nested | Scope::Function => body.constant_to(&name, value),
            }
        }
        Op::ReadVariable { var, .. } => read_variable(g, id, node, *var, scope, names, state)?,
        Op::AssignVariable { var, .. } => {
            return Err(unsupported(
                g,
                id,
                node,
                format!(
                    "it assigns variable `{}`: ONNX graphs are pure functions of their inputs. Export a \
                     function that returns the new value instead",
                    g.variables[*var].name()
                ),
            ));
        }
        Op::Call { func } => emit_call(g, id, node, *func, body, names, state)?,
        Op::Fused { .. } => {
            return Err(unsupported(g, id, node, "a fused region in the export graph (a bug in the exporter)"));
        }
        Op::Cond { branches } => {
            let ins: Vec<String> = node.inputs.iter().map(|&v| names[&v].clone()).collect();
            let outs: Vec<String> = (0..node.outputs.len() as u32).map(|i| out(names, body, i)).collect();
            crate::control::emit_if(branches, &ins, &outs, scope, body, state)?;
        }
        // A cancel token has no ONNX form: the exported loop cannot be
        // stopped from outside (its maximum_iterations, a counter in the
        // condition, is exported).
        Op::While { parts, trip_count, .. } => {
            let ins: Vec<String> = node.inputs.iter().map(|&v| names[&v].clone()).collect();
            let outs: Vec<String> = (0..node.outputs.len() as u32).map(|i| out(names, body, i)).collect();
            crate::control::emit_loop(parts, *trip_count, &ins, &outs, scope, body, state)?;
        }
        Op::Spatial(sp) => {
            let ins: Vec<String> = node.inputs.iter().map(|&v| names[&v].clone()).collect();
            if node.outputs.len() != 1 {
                return Err(unsupported(g, id, node, format!("`{}` is a gradient op (not exported)", sp.name())));
            }
            let o = out(names, body, 0);
            crate::spatial::emit(body, sp, &ins, &o).map_err(|reason| unsupported(g, id, node, reason))?;
        }
        Op::TopK { k } => {
            let x = names[&node.inputs[0]].clone();
            let (values, indices) = (out(names, body, 0), out(names, body, 1));
            crate::windows::top_k(body, &x, *k, [&values, &indices]);
        }
        // `tracejit::distributed`'s collectives (their names start with
        // `tracejit_distributed::NODE_PREFIX`): a model file runs in one
        // process, and leaving one out would change what the graph computes.
        Op::Kernel { name, .. } if name.starts_with("tracejit.distributed.") => {
            return Err(unsupported(
                g,
                id,
                node,
                format!(
                    "`{name}` is a collective of tracejit::distributed, which ONNX cannot express; export the \
                     function without it (the per-rank computation) and combine the ranks' results outside"
                ),
            ));
        }
        // `tracejit::debug::print` and `callback`: an action with no
        // result, which ONNX cannot express; the model leaves it out.
        Op::Kernel { .. } if node.outputs.is_empty() => {}
        // `checkpoint`'s barrier only orders the recomputation after the
        // cotangent exists; its value is its first input's.
        Op::Kernel { name, .. } if name == tracejit_trace::REMAT_BARRIER => {
            let (x, o) = (names[&node.inputs[0]].clone(), out(names, body, 0));
            body.to(&o, "Identity", &[&x], vec![]);
        }
        Op::Kernel { name, .. } => {
            return Err(unsupported(
                g,
                id,
                node,
                format!(
                    "the composite `{name}` reached this graph as a native kernel without its body (a function \
                     called from this one chose it when it was optimized); call the composite directly in the \
                     exported function, or trace the inner function with the selector off"
                ),
            ));
        }
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::Clamp { .. }
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::MatMul
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::BroadcastTo { .. }
        | Op::ExpandDims { .. }
        | Op::Squeeze { .. }
        | Op::Concat { .. }
        | Op::Stack { .. }
        | Op::Slice { .. }
        | Op::Gather { .. }
        | Op::OneHot { .. }
        | Op::GatherElements { .. }
        | Op::ScatterAdd { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::Pad { .. }
        | Op::Cumsum { .. }
        | Op::Random { .. } => {
            let ins: Vec<String> = node.inputs.iter().map(|&v| names[&v].clone()).collect();
            let in_types: Vec<TensorType> = node.inputs.iter().map(|&v| g.value_type(v).clone()).collect();
            let o = out(names, body, 0);
            crate::ops::lower(body, &node.op, &ins, &in_types, &node.outputs[0], &o)
                .map_err(|reason| unsupported(g, id, node, reason))?;
        }
    }
    Ok(())
}

/// Splits `org.semantic.opname` into the ONNX domain `org.semantic` and the
/// op type `opname`.
pub(crate) fn split_name(implements: &str) -> (String, String) {
    match implements.rsplit_once('.') {
        Some((domain, name)) => (domain.to_string(), name.to_string()),
        None => ("tracejit".to_string(), implements.to_string()),
    }
}

/// The local function of composite `f` (emitting it on first use): its
/// domain, op type and overload. Two different bodies for one name (say,
/// traced for f32 and for f64) are overloads of one ONNX op (IR 10).
fn composite_function(
    f: &LibraryFunction,
    implements: &str,
    state: &mut ModelState,
) -> Result<(String, String, Option<String>)> {
    let key = Arc::as_ptr(&f.graph);
    if let Some(done) = state.emitted.get(&key) {
        return Ok(done.clone());
    }
    let (domain, name) = split_name(implements);
    let siblings = state.emitted.values().filter(|(d, n, _)| *d == domain && *n == name).count();
    let overload = (siblings > 0).then(|| format!("v{siblings}"));
    let body = prepare::composite_body(f)?;
    let inputs: Vec<String> = (0..body.params.len()).map(|i| format!("input_{i}")).collect();
    let outputs: Vec<String> = (0..body.outputs.len()).map(|i| format!("output_{i}")).collect();
    let emitted = emit_graph(&body, Scope::Function, &inputs, &outputs, state)?;
    let mut opset_import = vec![opset("", OPSET)];
    let mut nested: BTreeSet<String> = BTreeSet::new();
    for n in &emitted.body.nodes {
        if let Some(d) = n.domain.as_ref().filter(|d| !d.is_empty()) {
            nested.insert(d.clone());
        }
    }
    opset_import.extend(nested.into_iter().map(|d| opset(&d, COMPOSITE_DOMAIN_VERSION)));
    state.functions.push(FunctionProto {
        name: Some(name.clone()),
        domain: Some(domain.clone()),
        overload: overload.clone(),
        input: inputs,
        output: outputs,
        node: emitted.body.nodes,
        opset_import,
        doc_string: Some(format!("tracejit composite `{implements}` (the primitive body of `{}`)", f.name)),
        ..FunctionProto::default()
    });
    state.domains.insert(domain.clone());
    let done = (domain, name, overload);
    state.emitted.insert(key, done.clone());
    Ok(done)
}

/// An `opset_import` entry.
pub(crate) fn opset(domain: &str, version: i64) -> OperatorSetIdProto {
    OperatorSetIdProto { domain: Some(domain.to_string()), version: Some(version) }
}

/// A graph input or output's `ValueInfoProto`; unknown dims become the
/// symbolic dims `dim_names` gives (`None`: left unnamed).
pub(crate) fn value_info(name: &str, ty: &TensorType, dim_names: impl Fn(usize) -> Option<String>) -> ValueInfoProto {
    let dim = ty
        .dims
        .iter()
        .enumerate()
        .map(|(axis, d)| Dimension {
            value: match d {
                Some(n) => Some(dimension::Value::DimValue(*n as i64)),
                None => dim_names(axis).map(dimension::Value::DimParam),
            },
            ..Dimension::default()
        })
        .collect();
    let tensor = type_proto::Tensor { elem_type: Some(data_type(ty.dtype)), shape: Some(TensorShapeProto { dim }) };
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(tensor)), ..TypeProto::default() }),
        ..ValueInfoProto::default()
    }
}
