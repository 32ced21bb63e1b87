//! The imported graph, checked and ready to evaluate: its nodes matched to
//! op handlers, its initializers split into Variables (float tensors) and
//! constants known at trace time (integer and bool tensors, and any
//! initializer an op reads as a static operand), and the walk that maps
//! each node onto `Tensor` ops in order.
//!
//! Everything that can be refused without input shapes is refused here,
//! at import: an op the table lacks or at an opset it does not cover, an
//! attribute the handler does not read or a value its op's check refuses,
//! another domain, a subgraph, a name read before anything defines it. What depends on shapes or on
//! known values is checked by the handlers while tracing, and reported as
//! [`Error::Node`] naming the node.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tracejit_trace::{Tensor, Variable};

use super::attention_chain::{self, Chain};
use super::functions::Library;
use super::node::Node;
use super::ops::{self, OpDef};
use super::tensor_data::storage_from_proto;
use crate::pb::{AttributeProto, FunctionProto, GraphProto};
use crate::{Error, Result};

/// One node, matched to its op's definition.
pub(crate) struct NodeSpec {
    /// The op type.
    pub op_type: String,
    /// The node's name, or its first output's name when it has none.
    pub name: String,
    /// Input names (`""` for an omitted optional input).
    pub inputs: Vec<String>,
    /// Output names (`""` for an unwanted optional output).
    pub outputs: Vec<String>,
    /// Attributes by name.
    pub attrs: HashMap<String, AttributeProto>,
    /// The op's row in the table.
    pub def: &'static OpDef,
    /// Names its subgraphs read from the enclosing scopes.
    pub captures: Vec<String>,
    /// Those of `captures` whose values the subgraphs need at trace time.
    pub static_captures: Vec<String>,
}

/// The prepared graph.
pub(crate) struct Program {
    /// The graph's name (the traced function's name, and in errors).
    pub name: String,
    /// The default domain's opset.
    pub opset: i64,
    /// Nodes in order (ONNX requires a topological order).
    pub nodes: Vec<NodeSpec>,
    /// Initializers known at trace time.
    pub constants: HashMap<String, Tensor>,
    /// Float initializers as Variables, in file order.
    pub variables: Vec<(String, Variable)>,
    /// The graph inputs that are not initializers, in order.
    pub inputs: Vec<String>,
    /// The graph outputs, in order.
    pub outputs: Vec<String>,
    /// Which of `inputs` must be known at trace time.
    pub static_inputs: Vec<bool>,
    /// For a subgraph: the names it reads from enclosing scopes.
    pub captures: Vec<String>,
    /// Those of `captures` it needs at trace time (a Reshape's shape ...).
    pub static_captures: Vec<String>,
    /// The opsets it was prepared under (its subgraphs are evaluated so).
    pub opsets: Opsets,
    /// Attention written out as nodes, by the index of its last node
    /// ([`attention_chain`]).
    pub attention: HashMap<usize, Chain>,
}

/// The default domain under its two spellings.
pub(crate) fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The opsets a model imports: the default domain's, and the others' by
/// domain (an op of another domain is checked against its version).
#[derive(Clone, Debug, Default)]
pub(crate) struct Opsets {
    /// The default domain's opset.
    pub default: i64,
    /// Other domains' versions.
    pub others: HashMap<String, i64>,
}

impl Program {
    /// Checks `graph` against the op table and prepares it (and, with it,
    /// the subgraphs its ops' attributes hold).
    pub fn new(graph: &GraphProto, opsets: &Opsets, functions: &[FunctionProto]) -> Result<Program> {
        Program::prepare(graph, opsets, functions, false)
    }

    /// A subgraph (an attribute's graph): like [`Program::new`], but names
    /// it reads and does not define are the enclosing scopes' (its
    /// `captures`, given to [`Program::evaluate_with`]).
    pub fn subgraph(graph: &GraphProto, opsets: &Opsets) -> Result<Program> {
        Program::prepare(graph, opsets, &[], true)
    }

    fn prepare(graph: &GraphProto, opsets: &Opsets, functions: &[FunctionProto], nested: bool) -> Result<Program> {
        let opset = opsets.default;
        let name = match graph.name() {
            "" => "onnx_model".to_string(),
            n => n.to_string(),
        };
        let initializer_names: HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
        if let Some(s) = graph.sparse_initializer.first() {
            let n = s.values.as_ref().map(|v| v.name()).unwrap_or("");
            return Err(Error::Malformed {
                what: format!("sparse initializer '{n}'"),
                message: "sparse initializers are not supported".into(),
            });
        }
        let inputs: Vec<String> = graph
            .input
            .iter()
            .map(|i| i.name().to_string())
            .filter(|n| !initializer_names.contains(n.as_str()))
            .collect();
        let flat = Library::new(functions).expand(&graph.node)?;
        let nodes = flat.iter().map(|n| prepare_node(n, opsets)).collect::<Result<Vec<_>>>()?;
        let captures = check_names(graph, &inputs, &nodes, nested)?;
        let needed = trace_time_values(&nodes);
        let (constants, variables) = split_initializers(graph, &needed)?;
        let static_inputs = inputs.iter().map(|n| needed.contains(n)).collect();
        let outputs: Vec<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
        let attention = attention_chain::find(&nodes, &outputs, opset);
        let opsets = opsets.clone();
        let static_captures = captures.iter().filter(|c| needed.contains(*c)).cloned().collect();
        Ok(Program {
            name,
            opset,
            nodes,
            constants,
            variables,
            inputs,
            outputs,
            static_inputs,
            captures,
            static_captures,
            opsets,
            attention,
        })
    }

    /// Runs the graph on `inputs` (in the order of [`Program::inputs`]):
    /// eagerly where every operand is eager, recording nodes where one is
    /// symbolic. Returns the graph's outputs.
    pub fn evaluate(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.evaluate_with(inputs, &HashMap::new())
    }

    /// [`Program::evaluate`] for a subgraph, its captures read from `outer`.
    pub fn evaluate_with(&self, inputs: Vec<Tensor>, outer: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
        let mut env: HashMap<&str, Tensor> = HashMap::with_capacity(self.nodes.len() * 2);
        for name in &self.captures {
            let t = outer.get(name).ok_or_else(|| Error::Malformed {
                what: format!("graph '{}'", self.name),
                message: format!("it reads '{name}' from an enclosing graph, which does not give it"),
            })?;
            env.insert(name, t.clone());
        }
        for (k, v) in &self.constants {
            env.insert(k, v.clone());
        }
        // Variables are read where first used, so an unused one adds no read.
        let vars: HashMap<&str, &Variable> = self.variables.iter().map(|(n, v)| (n.as_str(), v)).collect();
        for (name, t) in self.inputs.iter().zip(inputs) {
            env.insert(name, t);
        }
        for (index, spec) in self.nodes.iter().enumerate() {
            if let Some(chain) = self.attention.get(&index) {
                // A panic of a tensor op the checks did not foresee falls
                // back to the nodes as written (what it recorded is dead).
                let fused = catch_unwind(AssertUnwindSafe(|| chain.run(&mut |n| self.lookup(&mut env, &vars, n))));
                if let Ok(Some(t)) = fused.unwrap_or(Ok(None)) {
                    env.insert(&spec.outputs[0], t);
                    continue;
                }
            }
            let mut args = Vec::with_capacity(spec.inputs.len());
            for name in &spec.inputs {
                args.push(match name.as_str() {
                    "" => None,
                    n => Some(self.lookup(&mut env, &vars, n)?),
                });
            }
            let mut captured = HashMap::with_capacity(spec.captures.len());
            for name in &spec.captures {
                captured.insert(name.clone(), self.lookup(&mut env, &vars, name)?);
            }
            let outs = self.run_node(spec, args, captured)?;
            for (name, t) in spec.outputs.iter().zip(outs) {
                if !name.is_empty() {
                    env.insert(name, t);
                }
            }
        }
        self.outputs.iter().map(|n| self.lookup(&mut env, &vars, n)).collect()
    }

    fn lookup<'a>(
        &self,
        env: &mut HashMap<&'a str, Tensor>,
        vars: &HashMap<&'a str, &Variable>,
        name: &'a str,
    ) -> Result<Tensor> {
        if let Some(t) = env.get(name) {
            return Ok(t.clone());
        }
        match vars.get(name) {
            Some(v) => {
                let t = v.read();
                env.insert(name, t.clone());
                Ok(t)
            }
            // `check_names` proved every name defined before use; a node
            // that declared an output and did not produce it lands here.
            None => Err(Error::Malformed {
                what: format!("graph '{}'", self.name),
                message: format!("value '{name}' is read but no node produced it"),
            }),
        }
    }

    /// Runs one node's handler, turning its error or a panic of a tensor
    /// op (a type error) into an [`Error::Node`] naming the node.
    fn run_node(
        &self,
        spec: &NodeSpec,
        inputs: Vec<Option<Tensor>>,
        captures: HashMap<String, Tensor>,
    ) -> Result<Vec<Tensor>> {
        let mut node = Node {
            captures,
            opsets: &self.opsets,
            op_type: &spec.op_type,
            opset: self.opset,
            inputs,
            num_outputs: spec.outputs.len(),
            wanted: spec.outputs.iter().map(|n| !n.is_empty()).collect(),
            attrs: &spec.attrs,
        };
        let result = catch_unwind(AssertUnwindSafe(|| (spec.def.handler)(&mut node)));
        let message = match result {
            Ok(Ok(outs)) => {
                let missing = spec.outputs.iter().enumerate().find(|(i, n)| !n.is_empty() && *i >= outs.len());
                match missing {
                    None => return Ok(outs),
                    Some((i, n)) => format!("output {i} ('{n}') is not produced by the importer"),
                }
            }
            Ok(Err(message)) => message,
            Err(payload) => panic_message(payload.as_ref()),
        };
        Err(Error::Node {
            model: self.name.clone(),
            node: spec.name.clone(),
            op_type: spec.op_type.clone(),
            opset: self.opset,
            message,
        })
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a tensor op panicked".to_string()
    }
}

fn prepare_node(n: &crate::pb::NodeProto, opsets: &Opsets) -> Result<NodeSpec> {
    let op_type = n.op_type().to_string();
    let name = match (n.name(), n.output.first()) {
        ("", Some(o)) => o.clone(),
        (name, _) => name.to_string(),
    };
    let domain = n.domain();
    let default = is_default_domain(domain);
    let opset = if default { opsets.default } else { opsets.others.get(domain).copied().unwrap_or(0) };
    let refuse = |reason: String| Error::UnsupportedOp {
        op_type: op_type.clone(),
        node: name.clone(),
        domain: if domain.is_empty() { "ai.onnx".into() } else { domain.to_string() },
        opset,
        reason,
    };
    let def = match ops::lookup(if default { "" } else { domain }, &op_type) {
        Some(def) => def,
        None if default => return Err(refuse("not implemented by the importer".into())),
        None => {
            return Err(refuse(format!("domain '{domain}' is not supported (only the default ONNX domain is)")));
        }
    };
    if let Some(reason) = def.refuse {
        return Err(refuse(reason.to_string()));
    }
    if !default && opset != def.domain_version {
        return Err(refuse(format!("the importer reads {domain} version {}", def.domain_version)));
    }
    let mut attrs = HashMap::with_capacity(n.attribute.len());
    let mut captures: Vec<String> = Vec::new();
    let mut static_captures: Vec<String> = Vec::new();
    for a in &n.attribute {
        let an = a.name();
        if a.ref_attr_name.is_some() {
            return Err(refuse(format!("attribute '{an}' refers to a function attribute")));
        }
        if let (Some(g), true) = (&a.g, def.subgraphs.contains(&an)) {
            // Checked now, so what the subgraph lacks is refused at import.
            let sub = Program::subgraph(g, opsets).map_err(|e| refuse(format!("attribute '{an}': {e}")))?;
            captures.extend(sub.captures.into_iter().filter(|c| !captures.contains(c)).collect::<Vec<_>>());
            static_captures.extend(sub.static_captures);
        } else if a.g.is_some() || !a.graphs.is_empty() {
            return Err(refuse(format!("attribute '{an}' holds a subgraph (control flow comes in a later stage)")));
        }
        if !def.attrs.contains(&an) {
            return Err(refuse(format!("attribute '{an}' is not supported")));
        }
        attrs.insert(an.to_string(), a.clone());
    }
    if let Some(check) = def.check {
        let node = Node {
            op_type: &op_type,
            opset,
            inputs: Vec::new(),
            num_outputs: n.output.len(),
            wanted: Vec::new(),
            attrs: &attrs,
            captures: HashMap::new(),
            opsets,
        };
        check(&node).map_err(refuse)?;
    }
    Ok(NodeSpec {
        op_type,
        name,
        inputs: n.input.clone(),
        outputs: n.output.clone(),
        attrs,
        def,
        captures,
        static_captures,
    })
}

/// Every name a node reads (its subgraphs' captures included) is a graph
/// input, an initializer or an earlier node's output, and every graph
/// output is defined. In a subgraph (`nested`) the other names read are
/// the enclosing scopes': they are returned, in order of first use.
fn check_names(graph: &GraphProto, inputs: &[String], nodes: &[NodeSpec], nested: bool) -> Result<Vec<String>> {
    let mut defined: HashSet<&str> = inputs.iter().map(String::as_str).collect();
    defined.extend(graph.initializer.iter().map(|t| t.name()));
    let malformed = |message: String| Error::Malformed { what: "model".into(), message };
    let mut free: Vec<String> = Vec::new();
    for n in nodes {
        for i in n.inputs.iter().chain(&n.captures).filter(|i| !i.is_empty()) {
            if defined.contains(i.as_str()) {
                continue;
            }
            if !nested {
                return Err(malformed(format!(
                    "node '{}' ({}) reads '{i}', which no graph input, initializer or earlier node defines",
                    n.name, n.op_type
                )));
            }
            if !free.contains(i) {
                free.push(i.clone());
            }
        }
        defined.extend(n.outputs.iter().filter(|o| !o.is_empty()).map(String::as_str));
    }
    for o in &graph.output {
        if defined.contains(o.name()) || free.iter().any(|f| f == o.name()) {
            continue;
        }
        if !nested {
            return Err(malformed(format!("graph output '{}' is not defined by any node or input", o.name())));
        }
        // A subgraph may pass an enclosing value straight through.
        free.push(o.name().to_string());
    }
    Ok(free)
}

/// The values that must be known at trace time: the static operands of
/// every op (a Reshape's shape, Slice bounds, ...), what subgraphs need
/// so from the enclosing scope, and, transitively, every input (and
/// capture) of a node that computes one — except through `Shape` and
/// `Size`, which read only the (per-signature) shape. One reverse pass
/// suffices since nodes are in topological order.
fn trace_time_values(nodes: &[NodeSpec]) -> HashSet<String> {
    let mut needed: HashSet<String> = HashSet::new();
    for n in nodes.iter().rev() {
        for &p in n.def.statics {
            if let Some(name) = n.inputs.get(p).filter(|s| !s.is_empty()) {
                needed.insert(name.clone());
            }
        }
        // What a subgraph needs from the enclosing scope at trace time.
        needed.extend(n.static_captures.iter().cloned());
        if !n.def.shape_only && n.outputs.iter().any(|o| needed.contains(o)) {
            needed.extend(n.inputs.iter().filter(|i| !i.is_empty()).cloned());
            needed.extend(n.captures.iter().cloned());
        }
    }
    needed
}

type Initializers = (HashMap<String, Tensor>, Vec<(String, Variable)>);

/// Float initializers become Variables (trainable, named as in the file),
/// unless an op needs their value at trace time; the others are constants.
fn split_initializers(graph: &GraphProto, needed: &HashSet<String>) -> Result<Initializers> {
    let mut constants = HashMap::new();
    let mut variables = Vec::new();
    for t in &graph.initializer {
        let name = t.name().to_string();
        let storage = storage_from_proto(t, &format!("initializer '{name}'"))?;
        let tensor = Tensor::from_raw_storage(storage);
        if tensor.dtype().is_float() && !needed.contains(&name) {
            variables.push((name.clone(), Variable::new(tensor).with_name(name)));
        } else {
            constants.insert(name, tensor);
        }
    }
    Ok((constants, variables))
}
