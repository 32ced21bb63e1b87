//! `Body`: the nodes (and, for the main graph, initializers) being written
//! for one ONNX graph or function, with fresh value names and attribute
//! helpers. Lowerings in `ops.rs` write through it.
//!
//! Constants that a lowering needs (axes, shapes, the `1` of `log(1 + x)`)
//! are `Constant` nodes in both graphs and functions, so a lowering reads
//! the same wherever it lands; captured tensors and variables are
//! initializers of the main graph (see `emit.rs`).

use std::collections::HashSet;

use tracejit_tensor::{DType, Storage};

use crate::pb::attribute_proto::AttributeType;
use crate::pb::{AttributeProto, NodeProto, TensorProto};
use crate::tensor_proto::{i64s, scalar, tensor_proto};

/// The nodes of one graph or function under construction.
#[derive(Default)]
pub(crate) struct Body {
    /// Nodes in execution order.
    pub(crate) nodes: Vec<NodeProto>,
    /// Initializers (main graph only).
    pub(crate) initializers: Vec<TensorProto>,
    used: HashSet<String>,
    /// Starts every fresh name: empty for a graph of its own, the holding
    /// node's name for a subgraph, so its names never shadow outer ones.
    prefix: String,
}

impl Body {
    /// An empty body whose fresh names start with `prefix`.
    pub(crate) fn with_prefix(prefix: String) -> Body {
        Body { prefix, ..Body::default() }
    }

    /// Reserves `name` (an input, output or initializer name).
    pub(crate) fn reserve(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// A name starting with `base` that no value of this body has yet.
    pub(crate) fn fresh(&mut self, base: &str) -> String {
        let base = format!("{}{base}", self.prefix);
        let mut name = base.clone();
        let mut k = 1usize;
        while self.used.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(name.clone());
        name
    }

    /// Appends a node of the standard domain writing `outputs`.
    pub(crate) fn node_to(&mut self, outputs: &[&str], op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) {
        let name = self.fresh(&format!("{op_type}_{}", self.nodes.len()));
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: Some(name),
            op_type: Some(op_type.to_string()),
            attribute: attrs,
            ..NodeProto::default()
        });
    }

    /// Appends a node writing `out`.
    pub(crate) fn to(&mut self, out: &str, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) {
        self.node_to(&[out], op_type, inputs, attrs);
    }

    /// Appends a node writing a fresh value, and returns that value's name.
    pub(crate) fn op(&mut self, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh(&format!("{}_{}", op_type.to_ascii_lowercase(), self.nodes.len()));
        self.to(&out, op_type, inputs, attrs);
        out
    }

    /// A `Constant` node holding `value`; returns its output's name.
    pub(crate) fn constant(&mut self, value: &Storage) -> String {
        let out = self.fresh(&format!("const_{}", self.nodes.len()));
        self.constant_to(&out, value);
        out
    }

    /// A `Constant` node writing `value` to `out`.
    pub(crate) fn constant_to(&mut self, out: &str, value: &Storage) {
        let attr = AttributeProto {
            name: Some("value".into()),
            r#type: Some(AttributeType::Tensor as i32),
            t: Some(tensor_proto(out, value)),
            ..AttributeProto::default()
        };
        self.to(out, "Constant", &[], vec![attr]);
    }

    /// A 1-D i64 constant.
    pub(crate) fn ints(&mut self, values: &[i64]) -> String {
        self.constant(&i64s(values))
    }

    /// A rank-0 constant of `dtype`.
    pub(crate) fn scalar(&mut self, dtype: DType, value: f64) -> String {
        self.constant(&scalar(dtype, value))
    }
}

/// An integer attribute.
pub(crate) fn attr_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..AttributeProto::default()
    }
}

/// A float attribute.
pub(crate) fn attr_float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(value),
        ..AttributeProto::default()
    }
}

/// An integer-list attribute.
pub(crate) fn attr_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: values.to_vec(),
        ..AttributeProto::default()
    }
}
