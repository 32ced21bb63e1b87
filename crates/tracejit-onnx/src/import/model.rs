//! The imported model: its signature ([`ValueInfo`] per graph input and
//! output), its initializers as Variables, and `run`, which checks the
//! inputs against the signature and calls the traced function behind it.
//!
//! The function takes the graph's *dynamic* inputs as tensors and its
//! *static* inputs (those an op reads at trace time, such as a Reshape's
//! shape fed as a graph input) as a [`KnownInputs`] value in its cache
//! key: a call with other static values traces again (never reuses a
//! trace made for other values, never bakes a value in silently).

use std::sync::Arc;

use tracejit_tensor::DType;
use tracejit_trace::{ConcreteFunction, Function, Static, Tensor, TensorSpec, Variable};

use super::program::Program;
use super::tensor_data::{from_raw, to_raw};
use crate::pb::{type_proto, ValueInfoProto};
use crate::{Error, Result};

/// A graph input's or output's declared name, element type and dims
/// (`None` for a symbolic or unknown dim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueInfo {
    /// The name in the graph.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The dims; `None` where the file gives a symbolic name (`batch`) or
    /// nothing. Empty for a scalar, and when the file declares no shape at
    /// all (then [`ValueInfo::rank_known`] is false).
    pub dims: Vec<Option<usize>>,
    /// Whether the file declares the rank.
    pub rank_known: bool,
}

impl ValueInfo {
    pub(crate) fn from_proto(v: &ValueInfoProto, what: &str) -> Result<ValueInfo> {
        let name = v.name().to_string();
        let what = format!("{what} '{name}'");
        let tensor = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => t,
            Some(other) => {
                let kind = match other {
                    type_proto::Value::SequenceType(_) => "sequence",
                    type_proto::Value::MapType(_) => "map",
                    type_proto::Value::OptionalType(_) => "optional",
                    type_proto::Value::SparseTensorType(_) => "sparse tensor",
                    _ => "non-tensor",
                };
                return Err(Error::UnsupportedDType { what, dtype: kind.into() });
            }
            None => return Err(Error::Malformed { what, message: "no type is declared".into() }),
        };
        let dtype = super::tensor_data::dtype_of(tensor.elem_type.unwrap_or(0), &what)?;
        let (dims, rank_known) = match &tensor.shape {
            None => (Vec::new(), false),
            Some(s) => {
                use crate::pb::tensor_shape_proto::dimension::Value;
                let dims = s
                    .dim
                    .iter()
                    .map(|d| match d.value {
                        Some(Value::DimValue(v)) if v >= 0 => Some(v as usize),
                        _ => None,
                    })
                    .collect();
                (dims, true)
            }
        };
        Ok(ValueInfo { name, dtype, dims, rank_known })
    }

    /// What is wrong with `t` as a value of this declaration, if anything.
    fn mismatch(&self, t: &Tensor) -> Option<String> {
        if t.dtype() != self.dtype {
            return Some(format!("expected dtype {}, got {}", self.dtype, t.dtype()));
        }
        if !self.rank_known {
            return None;
        }
        let dims = t.dims();
        if dims.len() != self.dims.len() {
            return Some(format!(
                "expected rank {} ({}), got shape {:?}",
                self.dims.len(),
                self.dims_text(),
                t.shape()
            ));
        }
        for (a, (want, got)) in self.dims.iter().zip(&dims).enumerate() {
            if let (Some(w), Some(g)) = (want, got) {
                if w != g {
                    return Some(format!("dim {a} must be {w} ({}), got shape {:?}", self.dims_text(), t.shape()));
                }
            }
        }
        None
    }

    fn dims_text(&self) -> String {
        let d: Vec<String> = self.dims.iter().map(|d| d.map_or("?".into(), |v| v.to_string())).collect();
        format!("[{}]", d.join(", "))
    }
}

/// One static input's value, in a form that hashes and compares by value
/// (dtype, shape and little-endian bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KnownInput {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// The values of a model's static inputs: part of the traced function's
/// cache key, so each distinct value gets its own trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KnownInputs(Vec<KnownInput>);

/// The function behind a [`Model`]: the dynamic inputs as tensors and the
/// static ones as a cache-key value, returning the graph's outputs.
pub type ModelFunction = Function<(Vec<Tensor>, Static<KnownInputs>), Vec<Tensor>>;

thread_local! {
    /// The structured error of a node that failed while this thread traced
    /// a model (the trace itself only sees a panic's message).
    static NODE_ERROR: std::cell::RefCell<Option<Error>> = const { std::cell::RefCell::new(None) };
}

/// An imported ONNX model: call [`Model::run`]; everything tracejit does to
/// a function (the passes, the JIT, `profile`, `mixed_precision`,
/// `quantize::dynamic`, export) applies to [`Model::function`].
pub struct Model {
    program: Arc<Program>,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    function: ModelFunction,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.program.name)
            .field("opset", &self.program.opset)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("nodes", &self.program.nodes.len())
            .finish()
    }
}

impl Model {
    pub(crate) fn new(program: Program, inputs: Vec<ValueInfo>, outputs: Vec<ValueInfo>) -> Model {
        let program = Arc::new(program);
        let p = program.clone();
        let function = tracejit_trace::function(move |(dynamic, known): (Vec<Tensor>, Static<KnownInputs>)| {
            let inputs = merge(&p, dynamic, &known);
            match p.evaluate(inputs) {
                Ok(outs) => outs,
                Err(e) => {
                    let message = e.to_string();
                    NODE_ERROR.with(|slot| *slot.borrow_mut() = Some(e));
                    panic!("{message}")
                }
            }
        })
        .name(program.name.clone());
        Model { program, inputs, outputs, function }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.program.name
    }

    /// The default ONNX domain's opset the model declares.
    pub fn opset(&self) -> i64 {
        self.program.opset
    }

    /// The graph's inputs, initializers excluded, in order.
    pub fn inputs(&self) -> &[ValueInfo] {
        &self.inputs
    }

    /// The graph's outputs, in order.
    pub fn outputs(&self) -> &[ValueInfo] {
        &self.outputs
    }

    /// The float initializers as Variables, by their names in the file
    /// (integer and bool initializers, and any an op reads as a static
    /// operand, are constants of the trace instead). Assigning a Variable
    /// changes what later runs compute, without a retrace.
    pub fn variables(&self) -> Vec<(String, Variable)> {
        self.program.variables.clone()
    }

    /// The traced function behind the model.
    pub fn function(&self) -> &ModelFunction {
        &self.function
    }

    /// The model traced and compiled for inputs of these dtypes and dims
    /// (in [`Model::inputs`] order; `-1` in a [`TensorSpec`] for a dim left
    /// unknown, such as the batch), without running it: what
    /// `tracejit::artifact::save` ships, so a program serves the model from
    /// the artifact with neither the ONNX file nor the importer.
    ///
    /// ```
    /// use tracejit_trace::{function, DType, Tensor, TensorSpec};
    ///
    /// let f = function(|x: Tensor| x.relu() * 3.0);
    /// let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[2, 3]))?;
    /// let model = tracejit_onnx::import_bytes(&tracejit_onnx::to_bytes(&cf)?)?;
    /// let traced = model.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 3])])?;
    /// assert_eq!(traced.signature()[0].dims(), [None, Some(3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Input`] when the specs contradict the declared inputs (count,
    /// dtype, a fixed dim) or the model has static inputs (their values,
    /// not only their types, fix the trace: run it, then take
    /// `function().concrete_functions()`); [`Error::Node`] or
    /// [`Error::Run`] when tracing fails.
    pub fn concrete_function(&self, specs: &[TensorSpec]) -> Result<Arc<ConcreteFunction>> {
        if let Some(name) = self.static_inputs().first() {
            let index = self.inputs.iter().position(|v| v.name == *name).unwrap_or(0);
            return Err(self.input_error(
                index,
                "this input is read at trace time, so a trace needs its value: run the model on it, then take function().concrete_functions()",
            ));
        }
        if specs.len() != self.inputs.len() {
            return Err(self.input_error(
                specs.len().min(self.inputs.len().saturating_sub(1)),
                &format!("{} specs given for {} inputs", specs.len(), self.inputs.len()),
            ));
        }
        for (i, (spec, info)) in specs.iter().zip(&self.inputs).enumerate() {
            let fixed_clash = info.rank_known
                && (spec.dims().len() != info.dims.len()
                    || spec.dims().iter().zip(&info.dims).any(|(s, d)| matches!((s, d), (Some(a), Some(b)) if a != b)));
            if spec.dtype() != info.dtype || fixed_clash {
                return Err(self.input_error(
                    i,
                    &format!(
                        "the spec {:?} {:?} contradicts the declared {} {}",
                        spec.dtype(),
                        spec.dims(),
                        info.dtype.name(),
                        info.dims_text()
                    ),
                ));
            }
        }
        NODE_ERROR.with(|slot| slot.borrow_mut().take());
        self.function.get_concrete_function((specs.to_vec(), Static(KnownInputs::default()))).map_err(|source| {
            NODE_ERROR
                .with(|slot| slot.borrow_mut().take())
                .unwrap_or(Error::Run { model: self.program.name.clone(), source })
        })
    }

    /// Names of the inputs whose values are part of the trace key (an op
    /// reads them at trace time): a new value traces again.
    pub fn static_inputs(&self) -> Vec<&str> {
        self.program
            .inputs
            .iter()
            .zip(&self.program.static_inputs)
            .filter(|(_, s)| **s)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// Runs the model on `inputs` (in [`Model::inputs`] order): traces and
    /// compiles it on the first call of each input signature, then runs
    /// the compiled function. Returns the outputs in [`Model::outputs`]
    /// order.
    ///
    /// # Errors
    /// [`Error::Input`] naming the input when the count, a dtype or a fixed
    /// dim contradicts the declaration; [`Error::Node`] naming the node
    /// when one cannot be mapped for these shapes; [`Error::Run`] for a
    /// failure of tracing or running.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        let mut dynamic = Vec::new();
        let mut known = Vec::new();
        for (i, (t, is_static)) in inputs.iter().zip(&self.program.static_inputs).enumerate() {
            if !*is_static {
                dynamic.push(t.clone());
                continue;
            }
            let storage = t.storage().map_err(|_| {
                self.input_error(
                    i,
                    "this input is read at trace time (it fixes a shape or an operand), so it must be an eager tensor",
                )
            })?;
            known.push(KnownInput {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                bytes: to_raw(&storage.to_standard()),
            });
        }
        NODE_ERROR.with(|slot| slot.borrow_mut().take());
        self.function.call((dynamic, Static(KnownInputs(known)))).map_err(|source| {
            NODE_ERROR
                .with(|slot| slot.borrow_mut().take())
                .unwrap_or(Error::Run { model: self.program.name.clone(), source })
        })
    }

    /// The graph's ops applied to `inputs` (in [`Model::inputs`] order,
    /// checked as [`Model::run`] checks them) where they are: eagerly on
    /// eager tensors, recorded into the enclosing trace inside a
    /// `tracejit::function`. So an imported model composes into a larger
    /// function (a training step, a pipeline with pre- and
    /// post-processing) and is traced with it. Static inputs must be eager
    /// (their values fix shapes).
    ///
    /// ```
    /// use tracejit_trace::{function, DType, Tensor, TensorSpec};
    ///
    /// let f = function(|x: Tensor| x.relu() * 3.0);
    /// let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[2]))?;
    /// let model = std::sync::Arc::new(tracejit_onnx::import_bytes(&tracejit_onnx::to_bytes(&cf)?)?);
    /// let m = model.clone();
    /// let g = function(move |x: Tensor| m.evaluate(&[x.exp()]).expect("the model maps").remove(0).sum(&[0], false));
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2]);
    /// let y = g.call(x.clone())?.to_vec::<f32>()?[0];
    /// assert!((y - 3.0 * (1.0 + 1f32.exp())).abs() < 1e-5);
    /// assert_eq!(model.evaluate(&[x])?[0].to_vec::<f32>()?, [0.0, 3.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Model::run`]: [`Error::Input`] for inputs contradicting the
    /// declarations, [`Error::Node`] for a node that cannot be mapped.
    pub fn evaluate(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        self.program.evaluate(inputs.to_vec())
    }

    fn input_error(&self, index: usize, message: &str) -> Error {
        Error::Input {
            model: self.program.name.clone(),
            index,
            input: self.inputs.get(index).map(|v| v.name.clone()).unwrap_or_default(),
            message: message.to_string(),
        }
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|v| v.name.as_str()).collect();
            return Err(Error::Input {
                model: self.program.name.clone(),
                index: inputs.len().min(self.inputs.len()),
                input: String::new(),
                message: format!("expected {} inputs ({names:?}), got {}", self.inputs.len(), inputs.len()),
            });
        }
        for (i, (t, info)) in inputs.iter().zip(&self.inputs).enumerate() {
            if let Some(m) = info.mismatch(t) {
                return Err(self.input_error(i, &m));
            }
        }
        Ok(())
    }
}

/// The graph's inputs in order: the dynamic ones as given, the static ones
/// rebuilt (eager) from the key.
fn merge(p: &Program, dynamic: Vec<Tensor>, known: &KnownInputs) -> Vec<Tensor> {
    let mut dynamic = dynamic.into_iter();
    let mut known = known.0.iter();
    p.static_inputs
        .iter()
        .map(|&is_static| {
            if is_static {
                let k = known.next().expect("one known value per static input");
                let s = from_raw(&k.bytes, k.dtype, &k.shape).expect("bytes made by to_raw");
                Tensor::from_raw_storage(s)
            } else {
                dynamic.next().expect("one tensor per dynamic input")
            }
        })
        .collect()
}
