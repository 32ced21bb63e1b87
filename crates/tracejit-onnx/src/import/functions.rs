//! ONNX model-local functions (`ModelProto.functions`) inlined at import:
//! a node whose domain and op type name a local function is replaced by
//! the function's body, its formal inputs and outputs renamed to the
//! node's, its inner values given a unique prefix, and attributes that
//! refer to the function's (`ref_attr_name`) replaced by the node's value
//! or the function's default. This is how tracejit's own exporter writes
//! composites (`tracejit.nn.gelu` ...), so its files import as primitives.

use std::collections::HashMap;

use crate::pb::{AttributeProto, FunctionProto, NodeProto};
use crate::{Error, Result};

/// How deep functions may call functions (a cycle is an error, not a hang).
const MAX_DEPTH: usize = 16;

/// The local functions by (domain, name).
pub(crate) struct Library<'a> {
    functions: HashMap<(&'a str, &'a str), &'a FunctionProto>,
}

impl<'a> Library<'a> {
    pub fn new(functions: &'a [FunctionProto]) -> Library<'a> {
        Library { functions: functions.iter().map(|f| ((f.domain(), f.name()), f)).collect() }
    }

    /// `nodes` with every call of a local function replaced by its body.
    pub fn expand(&self, nodes: &[NodeProto]) -> Result<Vec<NodeProto>> {
        if self.functions.is_empty() {
            return Ok(nodes.to_vec());
        }
        let mut out = Vec::with_capacity(nodes.len());
        let mut counter = 0usize;
        for n in nodes {
            self.expand_node(n, 0, &mut counter, &mut out)?;
        }
        Ok(out)
    }

    fn expand_node(&self, n: &NodeProto, depth: usize, counter: &mut usize, out: &mut Vec<NodeProto>) -> Result<()> {
        let Some(f) = self.functions.get(&(n.domain(), n.op_type())) else {
            out.push(n.clone());
            return Ok(());
        };
        if depth >= MAX_DEPTH {
            return Err(Error::Malformed {
                what: format!("function {}.{}", f.domain(), f.name()),
                message: format!("local functions nest deeper than {MAX_DEPTH} (a cycle?)"),
            });
        }
        *counter += 1;
        let prefix = format!("{}__{}_{}__", f.name(), counter, depth);
        let mut rename: HashMap<&str, String> = HashMap::new();
        for (i, formal) in f.input.iter().enumerate() {
            rename.insert(formal, n.input.get(i).cloned().unwrap_or_default());
        }
        for (i, formal) in f.output.iter().enumerate() {
            rename.insert(formal, n.output.get(i).cloned().unwrap_or_default());
        }
        let actual: HashMap<&str, &AttributeProto> = n.attribute.iter().map(|a| (a.name(), a)).collect();
        let defaults: HashMap<&str, &AttributeProto> = f.attribute_proto.iter().map(|a| (a.name(), a)).collect();
        let name_of = |v: &str, rename: &HashMap<&str, String>| -> String {
            match (v, rename.get(v)) {
                ("", _) => String::new(),
                (_, Some(r)) => r.clone(),
                (v, None) => format!("{prefix}{v}"),
            }
        };
        for inner in &f.node {
            let mut m = inner.clone();
            m.input = inner.input.iter().map(|v| name_of(v, &rename)).collect();
            m.output = inner.output.iter().map(|v| name_of(v, &rename)).collect();
            m.name = Some(format!("{prefix}{}", inner.name()));
            m.attribute = Vec::with_capacity(inner.attribute.len());
            for a in &inner.attribute {
                match a.ref_attr_name.as_deref() {
                    None => m.attribute.push(a.clone()),
                    Some(r) => {
                        // An attribute neither given nor defaulted is left out (the op's own default).
                        if let Some(v) = actual.get(r).or_else(|| defaults.get(r)) {
                            let mut v = (*v).clone();
                            v.name = a.name.clone();
                            m.attribute.push(v);
                        }
                    }
                }
            }
            self.expand_node(&m, depth + 1, counter, out)?;
        }
        Ok(())
    }
}
