//! One ONNX node as an op handler sees it: its inputs as tensors (eager
//! when known at trace time, symbolic otherwise), its attributes with
//! typed accessors and defaults, and the model's opset.
//!
//! Handlers return `Err(message)` for what the node asks that tracejit
//! cannot do exactly; the graph walk adds the node's identity. Operands
//! that must be known while tracing (a Reshape's shape, Slice bounds, ...)
//! are read with [`Node::known_i64s`] and friends, which fail with a
//! message saying so when the value is symbolic.

use std::collections::HashMap;

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::pb::attribute_proto::AttributeType;
use crate::pb::AttributeProto;

/// A handler's result: the node's outputs in order (trailing optional
/// outputs may be left out), or what is wrong.
pub(crate) type OpResult = std::result::Result<Vec<Tensor>, String>;

/// The node being mapped.
pub(crate) struct Node<'a> {
    /// The op type (`Conv`).
    pub op_type: &'a str,
    /// The default domain's opset of the model.
    pub opset: i64,
    /// The inputs, `None` where the name is empty (an omitted optional input).
    pub inputs: Vec<Option<Tensor>>,
    /// How many outputs the node declares.
    pub num_outputs: usize,
    /// Which declared outputs have a non-empty name (are wanted).
    pub wanted: Vec<bool>,
    /// The attributes by name.
    pub attrs: &'a HashMap<String, AttributeProto>,
    /// The values its subgraphs read from the enclosing scopes, by name.
    pub captures: HashMap<String, Tensor>,
    /// The model's opsets (a subgraph is prepared under them).
    pub opsets: &'a super::program::Opsets,
}

impl Node<'_> {
    /// Input `i`, which the op requires.
    pub fn input(&self, i: usize) -> std::result::Result<&Tensor, String> {
        self.inputs.get(i).and_then(Option::as_ref).ok_or_else(|| format!("input {i} is required but missing"))
    }

    /// Input `i` if given.
    pub fn opt_input(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    /// Whether output `i` is wanted by the graph.
    pub fn wants(&self, i: usize) -> bool {
        self.wanted.get(i).copied().unwrap_or(false)
    }

    /// Input `i` as integers known at trace time (any integer dtype).
    pub fn known_i64s(&self, i: usize) -> std::result::Result<Vec<i64>, String> {
        let t = self.input(i)?;
        known_i64s(t).map_err(|e| format!("input {i}: {e}"))
    }

    /// Input `i` as numbers known at trace time (any numeric dtype).
    pub fn known_f64s(&self, i: usize) -> std::result::Result<Vec<f64>, String> {
        let t = self.input(i)?;
        if t.is_symbolic() {
            return Err(format!("input {i} must be known at trace time, but it is computed by the graph"));
        }
        if t.dtype() == DType::Bool {
            return Err(format!("input {i} is bool where numbers are expected"));
        }
        t.cast(DType::F64).to_vec::<f64>().map_err(|e| e.to_string())
    }

    /// Input `i` as one known number.
    pub fn known_scalar(&self, i: usize) -> std::result::Result<f64, String> {
        match self.known_f64s(i)?.as_slice() {
            [v] => Ok(*v),
            v => Err(format!("input {i} must hold one value, got {}", v.len())),
        }
    }

    fn attr(&self, name: &str, ty: AttributeType) -> std::result::Result<Option<&AttributeProto>, String> {
        match self.attrs.get(name) {
            None => Ok(None),
            Some(a) => {
                let declared = a.r#type.and_then(|t| AttributeType::try_from(t).ok());
                if declared.is_some_and(|d| d != ty && d != AttributeType::Undefined) {
                    return Err(format!("attribute '{name}' has type {declared:?}, expected {ty:?}"));
                }
                Ok(Some(a))
            }
        }
    }

    /// Whether the attribute is present.
    pub fn has_attr(&self, name: &str) -> bool {
        self.attrs.contains_key(name)
    }

    /// An integer attribute.
    pub fn attr_i(&self, name: &str, default: i64) -> std::result::Result<i64, String> {
        Ok(self.attr(name, AttributeType::Int)?.and_then(|a| a.i).unwrap_or(default))
    }

    /// A float attribute.
    pub fn attr_f(&self, name: &str, default: f32) -> std::result::Result<f32, String> {
        Ok(self.attr(name, AttributeType::Float)?.and_then(|a| a.f).unwrap_or(default))
    }

    /// A string attribute.
    pub fn attr_s(&self, name: &str, default: &str) -> std::result::Result<String, String> {
        match self.attr(name, AttributeType::String)?.and_then(|a| a.s.as_ref()) {
            Some(bytes) => String::from_utf8(bytes.clone()).map_err(|_| format!("attribute '{name}' is not UTF-8")),
            None => Ok(default.to_string()),
        }
    }

    /// An integer-list attribute, `None` when absent.
    pub fn attr_ints(&self, name: &str) -> std::result::Result<Option<Vec<i64>>, String> {
        Ok(self.attr(name, AttributeType::Ints)?.map(|a| a.ints.clone()))
    }

    /// A float-list attribute, `None` when absent.
    pub fn attr_floats(&self, name: &str) -> std::result::Result<Option<Vec<f32>>, String> {
        Ok(self.attr(name, AttributeType::Floats)?.map(|a| a.floats.clone()))
    }

    /// A tensor attribute, decoded.
    pub fn attr_tensor(&self, name: &str) -> std::result::Result<Option<Tensor>, String> {
        match self.attr(name, AttributeType::Tensor)?.and_then(|a| a.t.as_ref()) {
            None => Ok(None),
            Some(t) => super::tensor_data::storage_from_proto(t, &format!("attribute '{name}'"))
                .map(|s| Some(Tensor::from_raw_storage(s)))
                .map_err(|e| e.to_string()),
        }
    }

    /// The `to`-style dtype attribute (an ONNX type code) as a tracejit dtype.
    pub fn attr_dtype(&self, name: &str, default: DType) -> std::result::Result<DType, String> {
        match self.attr(name, AttributeType::Int)?.and_then(|a| a.i) {
            None => Ok(default),
            Some(code) => {
                let code = i32::try_from(code).map_err(|_| format!("attribute '{name}': bad type code {code}"))?;
                super::tensor_data::dtype_of(code, &format!("attribute '{name}'")).map_err(|e| e.to_string())
            }
        }
    }

    /// An axis attribute or operand normalized against `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> std::result::Result<usize, String> {
        normalize_axis(axis, rank)
    }
}

/// `axis` (negative counts from the end) as an index below `rank`.
pub(crate) fn normalize_axis(axis: i64, rank: usize) -> std::result::Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// A tensor's integer values, which must be known at trace time.
pub(crate) fn known_i64s(t: &Tensor) -> std::result::Result<Vec<i64>, String> {
    if t.is_symbolic() {
        return Err("must be known at trace time, but it is computed by the graph".into());
    }
    if !t.dtype().is_int() {
        return Err(format!("must be an integer tensor, got {}", t.dtype()));
    }
    t.cast(DType::I64).to_vec::<i64>().map_err(|e| e.to_string())
}
