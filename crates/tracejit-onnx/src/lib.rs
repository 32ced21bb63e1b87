//! tracejit-onnx (`tracejit::onnx`): export of a traced function to ONNX,
//! so a model built or trained with tracejit is served by existing engines
//! (ONNX Runtime, Triton Inference Server, tract) instead of a home-made
//! server; and import of ONNX models ([`import`](fn@import), [`import_bytes`],
//! [`load_tensor`]: see the [`import`](mod@import) module) as traced
//! functions whose initializers are Variables.
//!
//! Export:
//!
//! What a file holds:
//!
//! - the function's graph optimized up to, but not including, the
//!   implementation selector and fusion: primitives, never JIT regions;
//! - opset 17 of the default domain and IR version 10 (what current
//!   runtimes load; onnxruntime 1.31 reads IR versions up to 13);
//! - one graph input per tensor argument and one output per tensor result,
//!   in flattening order (depth first), named after the function's
//!   signature by their nest paths
//!   ([`ConcreteFunction::input_paths`](tracejit_trace::ConcreteFunction::input_paths)):
//!   `args` for a lone tensor argument, `args.0`, `args.1` for a tuple's
//!   elements, `args[2]` for a `Vec`'s, the field names of a
//!   `#[derive(Nest)]` struct (`x`, `state.h`); results likewise under
//!   `output` (`output`, `output.0`, `output.h`), prefixed `output.` where
//!   a path is also an input's. [`Exporter::input_names`] /
//!   [`Exporter::output_names`] override them. Dtypes f32, f64, i32, i64
//!   and bool;
//! - an unknown dim (`-1` in an input signature) is a symbolic dim:
//!   `batch` for a leading dim, `dim_<axis>` for another (`batch_1`, ...
//!   for a later input's, since equal names mean equal sizes), or as
//!   [`Exporter::dim_param`] names it, so one
//!   file serves every batch size; an output dim the shape rules tie to an
//!   input dim carries the same name (a runtime sees `batch` flow
//!   through), any other unknown output dim a fresh `<output>_dim<axis>`;
//! - captured tensors and variables as initializers holding their current
//!   values, a variable named by its name (a Module path with
//!   [`Exporter::variable_names`]);
//! - each composite (`implements("tracejit.nn.gelu")`) as an ONNX local
//!   function of domain `tracejit.nn` and name `gelu` holding its primitive
//!   body, called from the main graph: the file runs anywhere, and a runtime
//!   that knows the name may swap in its own kernel. A composite that runs
//!   as a native kernel in tracejit still exports its body.
//! - convolutions and pools as ONNX `Conv` (a fused relu as a `Relu`
//!   after it), `MaxPool` and `AveragePool` (`count_include_pad = 0`), and
//!   `tracejit.nn.batch_norm` (inference batch norm, constant epsilon) as
//!   one `BatchNormalization` node instead of a local function.
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
//! assert_eq!(graph.input[0].name(), "args");
//! assert_eq!(graph.output[0].name(), "output");
//! assert_eq!(model.ir_version(), 10);
//!
//! // The unknown batch dim flows from the input to the output.
//! use tracejit_onnx::pb::{tensor_shape_proto::dimension::Value, type_proto};
//! let first_dim = |v: &tracejit_onnx::pb::ValueInfoProto| match &v.r#type.as_ref().unwrap().value {
//!     Some(type_proto::Value::TensorType(t)) => t.shape.as_ref().unwrap().dim[0].value.clone(),
//!     _ => None,
//! };
//! assert_eq!(first_dim(&graph.input[0]), Some(Value::DimParam("batch".into())));
//! assert_eq!(first_dim(&graph.output[0]), Some(Value::DimParam("batch".into())));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod control;
mod dims;
mod emit;
mod error;
pub mod import;
mod ops;
pub mod pb;
mod prepare;
mod spatial;
mod tensor_proto;
mod windows;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use prost::Message;
use tracejit_trace::{ConcreteFunction, Tensor, Variable};

pub use error::{Error, Result};
pub use import::{import, import_bytes, load_tensor, load_tensor_bytes, Model, ValueInfo};

/// The opset of the default ONNX domain the files use.
pub const OPSET: i64 = 17;

/// The ONNX IR version the files declare.
pub const IR_VERSION: i64 = 10;

/// Exports `cf` with the default names and returns the serialized model.
pub fn to_bytes(cf: &ConcreteFunction) -> Result<Vec<u8>> {
    Exporter::new(cf).to_bytes()
}

/// Exports `cf` with the default names into the file `path`, atomically
/// (a temporary file renamed over it; on an error the file that was there
/// keeps its bytes). [`Exporter`] renames inputs, outputs, dims and
/// initializers.
///
/// ```
/// use tracejit_trace::{function, DType, Tensor, TensorSpec};
///
/// let f = function(|x: Tensor| (&x * 2.0).tanh());
/// let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 10]))?;
/// let path = std::env::temp_dir().join(format!("tracejit-doc-{}.onnx", std::process::id()));
/// tracejit_onnx::save(&cf, &path)?;
/// let model = tracejit_onnx::decode(&std::fs::read(&path)?)?;
/// assert_eq!(model.graph.unwrap().input[0].name(), "args");
/// std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    dim_params: HashMap<(String, usize), String>,
    inline_composites: bool,
}

impl<'a> Exporter<'a> {
    /// An export of `cf` with the default names.
    pub fn new(cf: &'a ConcreteFunction) -> Exporter<'a> {
        Exporter {
            cf,
            input_names: None,
            output_names: None,
            variable_names: HashMap::new(),
            dim_params: HashMap::new(),
            inline_composites: false,
        }
    }

    /// Names the graph inputs, one per tensor argument in flattening order
    /// (instead of their nest paths).
    pub fn input_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.input_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Names the graph outputs, one per tensor result in flattening order
    /// (instead of their nest paths).
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

    /// Names the unknown dim `axis` of the graph input `input` (by its
    /// exported name) `name`, say `n_points`, instead of `batch` / `dim_<axis>`.
    /// Outputs whose dim equals it carry the same name; two inputs given
    /// one name are declared the same size.
    pub fn dim_param(mut self, input: impl Into<String>, axis: usize, name: impl Into<String>) -> Self {
        self.dim_params.insert((input.into(), axis), name.into());
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
        let (default_inputs, default_outputs) = default_names(cf);
        let inputs = names(&function, "input names", default_inputs, &self.input_names)?;
        let outputs = names(&function, "output names", default_outputs, &self.output_names)?;
        if let Some(clash) = inputs.iter().find(|n| outputs.contains(n)) {
            return Err(Error::Function {
                function,
                message: format!("`{clash}` names both an input and an output; ONNX names must be unique"),
            });
        }
        let mut state = emit::ModelState { variable_names: self.variable_names.clone(), ..Default::default() };
        let emitted = emit::emit_graph(&g, emit::Scope::Main, &inputs, &outputs, &mut state)?;
        let param_dims = self.input_dim_names(&g, &inputs);
        let output_dims = dims::output_dims(&g, &param_dims);
        let input_info = g
            .param_types()
            .iter()
            .zip(&inputs)
            .zip(&param_dims)
            .map(|((ty, name), syms)| emit::value_info(name, ty, |axis| syms[axis].clone()))
            .collect();
        let output_info = g
            .output_types()
            .iter()
            .zip(&outputs)
            .zip(&output_dims)
            .map(|((ty, name), syms)| {
                emit::value_info(name, ty, |axis| {
                    Some(syms.get(axis).cloned().flatten().unwrap_or_else(|| format!("{name}_dim{axis}")))
                })
            })
            .collect();
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

    /// Writes the serialized model to `path` atomically, as checkpoints are
    /// written (`tracejit_module::atomic_file`): on an error the file that was
    /// at `path` keeps its bytes and no temporary file is left.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let bytes = self.to_bytes()?;
        // Atomically, as checkpoints: an error (a full disk) leaves the
        // file that was at `path` as it was, never a truncated model.
        tracejit_module::atomic_file::write_atomically(path.as_ref(), &bytes).map_err(|e| Error::Io {
            path: e.path,
            source: std::io::Error::new(e.source.kind(), format!("{}: {}", e.action, e.source)),
        })
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

/// The names graph inputs and outputs get unless the user gives others:
/// their nest paths ([`ConcreteFunction::input_paths`]), made unique. An
/// output path equal to an input's (a struct passed in and returned, such
/// as an RNN's `state.h`) is prefixed `output.`; any other repeat (only a
/// hand-written `Nest` impl makes one) gets a `_1`, `_2`... suffix.
fn default_names(cf: &ConcreteFunction) -> (Vec<String>, Vec<String>) {
    let mut taken = HashSet::new();
    let mut unique = |want: String| -> String {
        let mut name = want.clone();
        let mut i = 0;
        while !taken.insert(name.clone()) {
            i += 1;
            name = format!("{want}_{i}");
        }
        name
    };
    let inputs: Vec<String> = cf.input_paths().iter().map(|p| unique(p.clone())).collect();
    let outputs = cf
        .output_paths()
        .iter()
        .map(|p| unique(if inputs.contains(p) { format!("output.{p}") } else { p.clone() }))
        .collect();
    (inputs, outputs)
}

/// The user's names, checked for count and uniqueness, or the defaults.
fn names(
    function: &str,
    what: &'static str,
    defaults: Vec<String>,
    given: &Option<Vec<String>>,
) -> Result<Vec<String>> {
    let count = defaults.len();
    let Some(given) = given else {
        return Ok(defaults);
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

impl Exporter<'_> {
    /// The symbolic name of each unknown input dim: the user's
    /// ([`Exporter::dim_param`]), else `batch` for a leading dim and
    /// `dim_<axis>` for another, with `_1`, `_2`, ... added when an earlier
    /// input took the name. Equal names mean equal sizes to ONNX, so no two
    /// inputs share a default name.
    fn input_dim_names(&self, g: &tracejit_ir::Graph, inputs: &[String]) -> Vec<Vec<Option<String>>> {
        let mut used: std::collections::HashSet<String> = self.dim_params.values().cloned().collect();
        let mut fresh = |base: String| {
            let mut name = base.clone();
            let mut k = 1;
            while !used.insert(name.clone()) {
                name = format!("{base}_{k}");
                k += 1;
            }
            name
        };
        g.param_types()
            .iter()
            .zip(inputs)
            .map(|(ty, input)| {
                (0..ty.rank())
                    .map(|axis| {
                        ty.dims[axis].is_none().then(|| match self.dim_params.get(&(input.clone(), axis)) {
                            Some(name) => name.clone(),
                            None if axis == 0 => fresh("batch".to_string()),
                            None => fresh(format!("dim_{axis}")),
                        })
                    })
                    .collect()
            })
            .collect()
    }
}
