//! Which tests belong to the families the milestone leaves out (strings,
//! sequences and optionals, the `ai.onnx.ml` domain, the
//! `ai.onnx.preview.training` optimizers, float8/float4/int4/int2): they
//! are run by no one here and reported apart, so the pass rates count only
//! what the importer is asked to cover. Decided from the model's content
//! (domains, value types, element types anywhere in the graph), not from
//! test names.

use tracejit_onnx::pb::{self, type_proto, GraphProto, ModelProto, TypeProto};

/// A family the milestone excludes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Excluded {
    /// String tensors.
    Strings,
    /// Sequence and optional values (and their ops).
    SequencesOptionals,
    /// The `ai.onnx.ml` domain.
    Ml,
    /// `ai.onnx.preview.training` (Adagrad, Adam, Momentum, Gradient).
    Training,
    /// float8, float4, int4, uint4, int2, uint2, float6.
    SubByteFloat8,
}

impl Excluded {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Excluded::Strings => "strings",
            Excluded::SequencesOptionals => "sequences/optionals",
            Excluded::Ml => "ai.onnx.ml",
            Excluded::Training => "ai.onnx.preview.training",
            Excluded::SubByteFloat8 => "float8/float4/int4/int2",
        }
    }
}

const STRING: i32 = pb::tensor_proto::DataType::String as i32;

fn small_type(code: i32) -> bool {
    use pb::tensor_proto::DataType as D;
    [
        D::Float8e4m3fn,
        D::Float8e4m3fnuz,
        D::Float8e5m2,
        D::Float8e5m2fnuz,
        D::Uint4,
        D::Int4,
        D::Float4e2m1,
        D::Float8e8m0,
        D::Uint2,
        D::Int2,
        D::Float6e2m3,
        D::Float6e3m2,
    ]
    .iter()
    .any(|&d| d as i32 == code)
}

/// The excluded family `model` belongs to, if any.
pub fn classify(model: &ModelProto) -> Option<Excluded> {
    let mut found = Vec::new();
    for o in &model.opset_import {
        match o.domain() {
            "ai.onnx.ml" => found.push(Excluded::Ml),
            "ai.onnx.preview.training" => found.push(Excluded::Training),
            _ => {}
        }
    }
    if let Some(g) = &model.graph {
        scan_graph(g, &mut found);
    }
    // The most specific reason first: a domain, then types.
    found.sort();
    found.dedup();
    [Excluded::Ml, Excluded::Training, Excluded::SequencesOptionals, Excluded::Strings, Excluded::SubByteFloat8]
        .into_iter()
        .find(|e| found.contains(e))
}

fn scan_type(t: &TypeProto, found: &mut Vec<Excluded>) {
    match &t.value {
        Some(type_proto::Value::TensorType(t)) => scan_elem(t.elem_type.unwrap_or(0), found),
        Some(type_proto::Value::SequenceType(_)) | Some(type_proto::Value::OptionalType(_)) => {
            found.push(Excluded::SequencesOptionals)
        }
        Some(type_proto::Value::MapType(_)) => found.push(Excluded::Ml),
        _ => {}
    }
}

fn scan_elem(code: i32, found: &mut Vec<Excluded>) {
    if code == STRING {
        found.push(Excluded::Strings);
    } else if small_type(code) {
        found.push(Excluded::SubByteFloat8);
    }
}

fn scan_graph(g: &GraphProto, found: &mut Vec<Excluded>) {
    for v in g.input.iter().chain(&g.output).chain(&g.value_info) {
        if let Some(t) = &v.r#type {
            scan_type(t, found);
        }
    }
    for t in &g.initializer {
        scan_elem(t.data_type.unwrap_or(0), found);
    }
    for n in &g.node {
        match n.domain() {
            "ai.onnx.ml" => found.push(Excluded::Ml),
            "ai.onnx.preview.training" => found.push(Excluded::Training),
            _ => {}
        }
        let op = n.op_type();
        if op.starts_with("Sequence")
            || op.starts_with("Optional")
            || matches!(op, "SplitToSequence" | "ConcatFromSequence")
        {
            found.push(Excluded::SequencesOptionals);
        }
        if op.starts_with("String") || op == "RegexFullMatch" {
            found.push(Excluded::Strings);
        }
        for a in &n.attribute {
            if matches!(a.name(), "to" | "output_dtype" | "dtype") {
                if let Some(code) = a.i {
                    scan_elem(code as i32, found);
                }
            }
            if let Some(t) = &a.t {
                scan_elem(t.data_type.unwrap_or(0), found);
            }
            if let Some(tp) = &a.tp {
                scan_type(tp, found);
            }
            if let Some(sub) = &a.g {
                scan_graph(sub, found);
            }
            for sub in &a.graphs {
                scan_graph(sub, found);
            }
        }
    }
}
