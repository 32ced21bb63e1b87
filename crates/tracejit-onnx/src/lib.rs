//! tracejit-onnx (`tracejit::onnx`): export of a traced function to ONNX,
//! so a model built or trained with tracejit is served by existing engines
//! (ONNX Runtime, Triton Inference Server, tract) instead of a home-made
//! server.
//!
//! What a file holds:
//!
//! - the function's graph optimized up to, but not including, the
//!   implementation selector and fusion: primitives, never JIT regions;
//! - opset 17 of the default domain and IR version 10 (what current
//!   runtimes load; onnxruntime 1.31 reads IR versions up to 13);
//! - one graph input per tensor argument and one output per tensor result,
//!   in flattening order (depth first), named `input_<i>` / `output_<i>` or
//!   as [`Exporter::input_names`] / [`Exporter::output_names`] say; dtypes
//!   f32, f64, i32, i64 and bool; an unknown dim (`-1` in an input
//!   signature) is the symbolic dim `<input>_dim<axis>`, so one file serves
//!   every batch size;
//! - captured tensors and variables as initializers holding their current
//!   values, a variable named by its name (a Module path with
//!   [`Exporter::variable_names`]);
//! - each composite (`implements("tracejit.nn.gelu")`) as an ONNX local
//!   function of domain `tracejit.nn` and name `gelu` holding its primitive
//!   body, called from the main graph: the file runs anywhere, and a runtime
//!   that knows the name may swap in its own kernel. A composite that runs
//!   as a native kernel in tracejit still exports its body.
//!
//! Every primitive op maps (see the table in `ops.rs` for those that need a
//! few ONNX nodes to agree with the reference kernels); `cond` becomes an
//! ONNX `If` and `while` (`while_loop`, `fori_loop`) an ONNX `Loop`. What ONNX cannot
//! express — a variable assignment, a native kernel whose body is not at
//! hand — is an [`Error`] naming the node and the user's source line; no
//! file is written then.
//!
//! ```
//! use tracejit_trace::{function, DType, Tensor, TensorSpec};
//!
//! let f = function(|x: Tensor| (&x * 2.0).relu().sum(&[1], false));
//! let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 3]))?;
//! let bytes = tracejit_onnx::to_bytes(&cf)?;
//! let model = tracejit_onnx::decode(&bytes)?;
//! let graph = model.graph.as_ref().unwrap();
//! assert_eq!(graph.input[0].name(), "input_0");
//! assert_eq!(graph.output[0].name(), "output_0");
//! assert_eq!(model.ir_version(), 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod control;
mod emit;
mod error;
mod ops;
pub mod pb;
mod prepare;
mod tensor_proto;

use std::collections::HashMap;
use std::path::Path;

use prost::Message;
use tracejit_trace::{ConcreteFunction, Tensor, Variable};

pub use error::{Error, Result};

/// The opset of the default ONNX domain the files use.
pub const OPSET: i64 = 17;

/// The ONNX IR version the files declare.
pub const IR_VERSION: i64 = 10;

/// Exports `cf` with the default names and returns the serialized model.
pub fn to_bytes(cf: &ConcreteFunction) -> Result<Vec<u8>> {
    Exporter::new(cf).to_bytes()
}

/// Exports `cf` with the default names into the file `path`.
pub fn save(cf: &ConcreteFunction, path: impl AsRef<Path>) -> Result<()> {
    Exporter::new(cf).save(path)
}

/// Parses a serialized model (to inspect what was exported).
pub fn decode(bytes: &[u8]) -> std::result::Result<pb::ModelProto, prost::DecodeError> {
    pb::ModelProto::decode(bytes)
}

/// An export with options: names of inputs, outputs and variables, and
/// whether composites stay ONNX local functions.
///
/// ```
/// use tracejit_trace::{function, DType, Tensor, TensorSpec, Variable};
///
/// let w = Variable::new(Tensor::ones(&[3, 2], DType::F32));
/// let w2 = w.clone();
/// let f = function(move |x: Tensor| x.matmul(&w2.read()));
/// let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 3]))?;
/// let model = tracejit_onnx::Exporter::new(&cf)
///     .input_names(["features"])
///     .output_names(["scores"])
///     .variable_names([("dense.w".to_string(), w)])
///     .to_model()?;
/// let graph = model.graph.unwrap();
/// assert_eq!(graph.initializer[0].name(), "dense.w");
/// assert_eq!(graph.input[0].name(), "features");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Exporter<'a> {
    cf: &'a ConcreteFunction,
    input_names: Option<Vec<String>>,
    output_names: Option<Vec<String>>,
    variable_names: HashMap<u64, String>,
    inline_composites: bool,
}

impl<'a> Exporter<'a> {
    /// An export of `cf` with the default names.
    pub fn new(cf: &'a ConcreteFunction) -> Exporter<'a> {
        Exporter { cf, input_names: None, output_names: None, variable_names: HashMap::new(), inline_composites: false }
    }

    /// Names the graph inputs, one per tensor argument in flattening order.
    pub fn input_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.input_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Names the graph outputs, one per tensor result in flattening order.
    pub fn output_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.output_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Names the initializers of these variables (`module.named_variables()`
    /// gives Module paths such as `layers[0].w`); other variables keep their
    /// own names.
    pub fn variable_names(mut self, named: impl IntoIterator<Item = (String, Variable)>) -> Self {
        self.variable_names.extend(named.into_iter().map(|(path, v)| (v.id(), path)));
        self
    }

    /// Inlines composites instead of exporting them as ONNX local functions
    /// (for runtimes that do not read local functions).
    pub fn inline_composites(mut self, inline: bool) -> Self {
        self.inline_composites = inline;
        self
    }

    /// The model as protobuf messages.
    pub fn to_model(&self) -> Result<pb::ModelProto> {
        let cf = self.cf;
        let function = cf.name().to_string();
        let g = prepare::main_graph(cf, self.inline_composites)?;
        let inputs = names(&function, "input names", "input", g.params.len(), &self.input_names)?;
        let outputs = names(&function, "output names", "output", g.outputs.len(), &self.output_names)?;
        let mut state = emit::ModelState { variable_names: self.variable_names.clone(), ..Default::default() };
        let emitted = emit::emit_graph(&g, emit::Scope::Main, &inputs, &outputs, &mut state)?;
        let input_info = g
            .param_types()
            .iter()
            .zip(&inputs)
            .map(|(ty, name)| emit::value_info(name, ty, |axis| Some(format!("{name}_dim{axis}"))))
            .collect();
        let output_info =
            g.output_types().iter().zip(&outputs).map(|(ty, name)| emit::value_info(name, ty, |_| None)).collect();
        let graph = pb::GraphProto {
            name: Some(function.clone()),
            node: emitted.body.nodes,
            initializer: emitted.body.initializers,
            input: input_info,
            output: output_info,
            doc_string: Some(format!("tracejit function `{function}`, traced for {}", signature(cf))),
            ..pb::GraphProto::default()
        };
        let mut opset_import = vec![emit::opset("", OPSET)];
        opset_import.extend(state.domains.iter().map(|d| emit::opset(d, emit::COMPOSITE_DOMAIN_VERSION)));
        Ok(pb::ModelProto {
            ir_version: Some(IR_VERSION),
            opset_import,
            producer_name: Some("tracejit".into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            graph: Some(graph),
            functions: state.functions,
            ..pb::ModelProto::default()
        })
    }

    /// The serialized model.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.to_model()?.encode_to_vec())
    }

    /// Writes the serialized model to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let bytes = self.to_bytes()?;
        let path = path.as_ref();
        std::fs::write(path, bytes).map_err(|source| Error::Io { path: path.to_path_buf(), source })
    }

    /// Writes an ONNX backend test case into `dir`: `model.onnx`, and
    /// `test_data_set_0/input_<i>.pb` / `output_<i>.pb` holding `inputs`
    /// and what tracejit computes for them (serialized `TensorProto`s).
    /// `scripts/run_onnxruntime.py` runs such directories in onnxruntime.
    pub fn save_test_case(&self, inputs: &[Tensor], dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let function = self.cf.name().to_string();
        let outputs = self
            .cf
            .call_flat(inputs)
            .map_err(|e| Error::Function { function: function.clone(), message: format!("running it: {e}") })?;
        let data = dir.join("test_data_set_0");
        std::fs::create_dir_all(&data).map_err(|source| Error::Io { path: data.clone(), source })?;
        self.save(dir.join("model.onnx"))?;
        let model = self.to_model()?;
        let graph = model.graph.unwrap_or_default();
        let write = |kind: &str, i: usize, name: &str, t: &Tensor| -> Result<()> {
            let storage = t.storage().map_err(|e| Error::Function {
                function: function.clone(),
                message: format!("{kind} {i} is not an eager tensor: {e}"),
            })?;
            let path = data.join(format!("{kind}_{i}.pb"));
            let bytes = tensor_proto::tensor_proto(name, storage).encode_to_vec();
            std::fs::write(&path, bytes).map_err(|source| Error::Io { path, source })
        };
        for (i, (t, info)) in inputs.iter().zip(&graph.input).enumerate() {
            write("input", i, info.name(), t)?;
        }
        for (i, (t, info)) in outputs.iter().zip(&graph.output).enumerate() {
            write("output", i, info.name(), t)?;
        }
        Ok(())
    }
}

/// The user's names, checked for count and uniqueness, or `<prefix>_<i>`.
fn names(
    function: &str,
    what: &'static str,
    prefix: &str,
    count: usize,
    given: &Option<Vec<String>>,
) -> Result<Vec<String>> {
    let Some(given) = given else {
        return Ok((0..count).map(|i| format!("{prefix}_{i}")).collect());
    };
    if given.len() != count {
        return Err(Error::Names { function: function.to_string(), what, expected: count, got: given.len() });
    }
    for (i, n) in given.iter().enumerate() {
        if n.is_empty() || given[..i].contains(n) {
            return Err(Error::Function {
                function: function.to_string(),
                message: format!("{what}: `{n}` is empty or given twice; ONNX names must be unique"),
            });
        }
    }
    Ok(given.clone())
}

fn signature(cf: &ConcreteFunction) -> String {
    let specs: Vec<String> = cf.signature().iter().map(|s| s.to_string()).collect();
    format!("({})", specs.join(", "))
}
