//! ONNX import: [`import`] / [`import_bytes`] read a model file into a
//! [`Model`] whose graph is mapped onto `Tensor` ops and `tracejit::nn`
//! functions and traced by `tracejit::function` (named after the graph)
//! once per input signature, so the IR passes, fusion and the JIT apply as
//! to any traced closure; [`load_tensor`] reads ONNX's serialized test
//! tensors.
//!
//! How the mapping works:
//!
//! - **Shapes are concrete per signature.** `Shape` and `Size` give eager
//!   tensors, and any node whose inputs are all known is computed eagerly
//!   while tracing and stays a constant of the trace. Operands an op needs
//!   at trace time (Reshape's shape, Slice's bounds, Squeeze/Unsqueeze
//!   axes, Pad's pads, Expand's shape, Tile's repeats, TopK's k,
//!   ConstantOfShape, Range, OneHot's depth, Reduce axes, ...) are read as
//!   known values. A graph *input* that feeds one (directly or through
//!   other nodes) is a *static* input: its value is part of the trace's
//!   cache key ([`Model::static_inputs`]), so a new value retraces.
//! - **Initializers.** Float initializers become [`Variable`]s named as in
//!   the file ([`Model::variables`]): they can be read, assigned,
//!   fine-tuned under a `GradientTape` and exported again. Integer and bool
//!   initializers (shapes, indices) are constants known at trace time, and
//!   so is any float initializer an op reads as a static operand.
//! - **Local functions** (`ModelProto.functions`, as tracejit's exporter
//!   writes composites) are inlined: their bodies are mapped like any node.
//! - **Subgraphs** (`If`'s branches, `Loop`'s and `Scan`'s bodies,
//!   `FlexAttention`'s modifiers) are prepared at import like the main
//!   graph; names they read and do not define are the enclosing graph's
//!   values, captured (and static when the subgraph needs them so).
//! - **Opsets.** The default domain's opset from `opset_import` selects
//!   each op's semantics (attributes that moved to inputs, changed
//!   defaults); opsets 1 to [`MAX_OPSET`] are read. Of other domains only
//!   `ai.onnx.preview` version 1 (`FlexAttention`) is.
//! - **Errors.** An op, attribute, dtype, domain or opset the importer
//!   lacks is refused at import ([`Error::UnsupportedOp`] names the op
//!   type, node, domain and opset, and the reason: the primitive or dtype
//!   it needs); a malformed file is [`Error::Malformed`], never a panic;
//!   at `run`, an input contradicting the declared dtype or a fixed dim is
//!   [`Error::Input`] naming it.
//!
//! ```
//! use tracejit_trace::{function, DType, Tensor, TensorSpec};
//!
//! // A model exported by tracejit itself, imported back.
//! let f = function(|x: Tensor| (&x * 2.0).relu().sum(&[1], false));
//! let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 3]))?;
//! let model = tracejit_onnx::import_bytes(&tracejit_onnx::to_bytes(&cf)?)?;
//! assert_eq!(model.inputs()[0].dims, [None, Some(3)]);
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5, 0.5, -1.0], &[2, 3]);
//! let y = model.run(&[x])?;
//! assert_eq!(y[0].to_vec::<f32>()?, [8.0, 2.0]);
//! assert_eq!(model.function().tracing_count(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Variable`]: tracejit_trace::Variable
//! [`Error::UnsupportedOp`]: crate::Error::UnsupportedOp
//! [`Error::Malformed`]: crate::Error::Malformed
//! [`Error::Input`]: crate::Error::Input

mod attention_chain;
mod functions;
mod model;
mod node;
mod ops;
mod program;
mod tensor_data;

use std::path::Path;

use prost::Message;

pub use model::{KnownInputs, Model, ModelFunction, ValueInfo};
pub use ops::supported_ops;
pub use tensor_data::{load_tensor, load_tensor_bytes};

use crate::pb::ModelProto;
use crate::{Error, Result};
use program::{is_default_domain, Opsets, Program};

/// The newest default-domain opset the importer reads (onnx 1.22's).
pub const MAX_OPSET: i64 = 27;

/// Imports the ONNX model file at `path`.
///
/// ```no_run
/// let model = tracejit_onnx::import("resnet50.onnx")?;
/// for i in model.inputs() {
///     println!("{}: {} {:?}", i.name, i.dtype, i.dims);
/// }
/// # Ok::<(), tracejit_onnx::Error>(())
/// ```
pub fn import(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    import_bytes(&bytes)
}

/// Imports a serialized ONNX `ModelProto`.
pub fn import_bytes(bytes: &[u8]) -> Result<Model> {
    let proto =
        ModelProto::decode(bytes).map_err(|e| Error::Malformed { what: "model".into(), message: e.to_string() })?;
    import_proto(&proto)
}

/// Imports a decoded `ModelProto`.
pub fn import_proto(proto: &ModelProto) -> Result<Model> {
    let opset = default_opset(proto)?;
    let graph = proto
        .graph
        .as_ref()
        .ok_or_else(|| Error::Malformed { what: "model".into(), message: "it has no graph".into() })?;
    let others = proto
        .opset_import
        .iter()
        .filter(|o| !is_default_domain(o.domain()))
        .map(|o| (o.domain().to_string(), o.version()))
        .collect();
    let program = Program::new(graph, &Opsets { default: opset, others }, &proto.functions)?;
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let inputs = graph
        .input
        .iter()
        .filter(|v| !initializers.contains(v.name()))
        .map(|v| ValueInfo::from_proto(v, "graph input"))
        .collect::<Result<Vec<_>>>()?;
    let outputs = graph.output.iter().map(|v| ValueInfo::from_proto(v, "graph output")).collect::<Result<Vec<_>>>()?;
    Ok(Model::new(program, inputs, outputs))
}

/// The default domain's opset version, checked against the supported range.
fn default_opset(proto: &ModelProto) -> Result<i64> {
    let entry = proto.opset_import.iter().find(|o| is_default_domain(o.domain()));
    let Some(version) = entry.map(|o| o.version()) else {
        return Err(Error::Opset {
            domain: "ai.onnx".into(),
            version: 0,
            reason: "the model imports no opset of the default domain".into(),
        });
    };
    if !(1..=MAX_OPSET).contains(&version) {
        return Err(Error::Opset {
            domain: "ai.onnx".into(),
            version,
            reason: format!("the importer reads opsets 1 to {MAX_OPSET}"),
        });
    }
    Ok(version)
}
