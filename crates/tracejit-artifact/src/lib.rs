//! Ahead-of-time artifacts: a [`ConcreteFunction`] saved as one checksummed
//! file and run in another process with no closure and no tracing.
//!
//! ```no_run
//! # fn demo(cf: &tracejit_trace::ConcreteFunction, x: tracejit_trace::Tensor) -> tracejit_artifact::Result<()> {
//! tracejit_artifact::save(cf, "step.tjx")?;            // in the program that traced it
//! let a = tracejit_artifact::load("step.tjx")?;        // in any other: no closure
//! let outs = a.call(&[x])?;                            // the flat tensor arguments, in signature order
//! for (path, v) in a.variables() { println!("{path}: {:?}", v.shape()); }
//! tracejit_artifact::save_artifact(&a, "step.tjx")?;   // with the variables' new values
//! # Ok(()) }
//! ```
//!
//! What a file holds (the format is `format.rs`'s and
//! `docs/artifact-format.md`'s): the signature (argument and result paths,
//! dtypes, dims with unknown ones), the optimized graph as its text (the
//! constants a closure captured are constants of that graph, written in
//! full), the variables' values (a safetensors file inside, keyed by each
//! variable's name, made unique with `#2`... when two share one; call
//! `Module::assign_names` before saving to get module paths), and the
//! compiled kernels as compile cache entries with their target. The static
//! arguments of the trace are part of its graph (their type names are
//! recorded).
//!
//! Loading checks the file whole (magic, format version, length, CRC-32)
//! before reading it, parses and verifies the graph, binds it to fresh
//! [`Variable`]s holding the saved values, and prepares it with the
//! artifact's kernels: when their target (CPU features, JIT options,
//! tracejit build) is this process's, no Cranelift runs; otherwise the
//! kernels are compiled for the host, which is logged (`info`). Code for
//! features the host lacks never runs.

mod format;
mod rebind;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracejit_ir::tensor::Storage;
use tracejit_ir::{Graph, TensorType};
use tracejit_trace::{ConcreteFunction, Tensor, Variable};

pub use format::FORMAT_VERSION;
use format::{DecodeError, Parts, Slot};

/// Why an artifact could not be saved, loaded or called.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the file failed.
    #[error("artifact {path}: cannot {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`read`, `write`).
        action: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file was written in another format version.
    #[error("artifact {path}: format version {found}, this tracejit reads version {expected}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The file's version.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The file is not an artifact, is truncated, was altered, or holds
    /// something malformed: the message says which.
    #[error("artifact {path}: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The function cannot be saved as an artifact.
    #[error("artifact of function `{function}`: {message}")]
    Unsupported {
        /// The function.
        function: String,
        /// Why.
        message: String,
    },
    /// A call's tensors do not fit the artifact's signature.
    #[error("artifact `{function}`: {message}")]
    Signature {
        /// The function the artifact was saved from.
        function: String,
        /// Which argument, what was expected and what was given.
        message: String,
    },
    /// Running the artifact failed.
    #[error("artifact `{function}`: error while running: {message}")]
    Run {
        /// The function the artifact was saved from.
        function: String,
        /// What failed.
        message: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tracejit_trace::Error {
    fn from(e: Error) -> tracejit_trace::Error {
        tracejit_trace::Error::Artifact { source: Arc::new(e) }
    }
}

/// A function loaded from an artifact: call it with its tensors.
pub struct Artifact {
    parts: Parts,
    graph: Arc<Graph>,
    variables: Vec<(String, Variable)>,
    executable: Option<tracejit_jit::Executable>,
}

impl std::fmt::Debug for Artifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Artifact")
            .field("name", &self.parts.name)
            .field("inputs", &self.input_paths())
            .field("variables", &self.variables.len())
            .finish()
    }
}

/// Saves `cf` as an artifact at `path` (written atomically: a temporary
/// file renamed over it).
pub fn save(cf: &ConcreteFunction, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let unsupported = |message: String| Error::Unsupported { function: cf.name().to_string(), message };
    if cf.implicit_input_count() > 0 {
        return Err(unsupported(format!(
            "it reads {} symbolic tensors of an enclosing trace; save the enclosing function instead",
            cf.implicit_input_count()
        )));
    }
    let graph = cf.optimized_graph();
    let inputs = cf
        .signature()
        .iter()
        .zip(cf.input_paths())
        .map(|(spec, p)| Slot { path: p.clone(), dtype: spec.ty.dtype, dims: spec.ty.dims.to_vec() })
        .collect();
    let outputs = graph
        .outputs
        .iter()
        .zip(cf.output_paths())
        .map(|(v, p)| {
            let t = graph.value_type(*v);
            Slot { path: p.clone(), dtype: t.dtype, dims: t.dims.to_vec() }
        })
        .collect();
    let (named, vars) = rebind::name_for_save(graph);
    let values: Vec<(String, Storage)> = vars.iter().map(|(p, v)| (p.clone(), v.read())).collect();
    let parts = Parts {
        identity: identity(),
        name: cf.name().to_string(),
        features: features(cf.target().unwrap_or_else(tracejit_jit::Target::host)),
        inputs,
        outputs,
        statics: cf.static_type_names().iter().map(|s| s.to_string()).collect(),
        variables: Vec::new(),
        graph: format!("{named:#}"),
        values: Vec::new(),
        kernels: cf.kernel_entries().iter().map(|k| k.to_vec()).collect(),
    };
    write(parts, &values, path)
}

/// Writes `a` back to `path` with its variables' current values (after
/// training steps, say).
pub fn save_artifact(a: &Artifact, path: impl AsRef<Path>) -> Result<()> {
    let values: Vec<(String, Storage)> = a.variables.iter().map(|(p, v)| (p.clone(), v.resource().read())).collect();
    let mut parts = a.parts.clone();
    parts.identity = identity();
    parts.features = features(a.executable.as_ref().map_or_else(tracejit_jit::Target::host, |e| e.target()));
    if let Some(exe) = &a.executable {
        parts.kernels = exe.kernel_entries().iter().map(|k| k.to_vec()).collect();
    }
    write(parts, &values, path.as_ref())
}

/// Reads the artifact at `path`: no closure, no tracing, and no compiling
/// when its kernels were compiled for this host.
pub fn load(path: impl AsRef<Path>) -> Result<Artifact> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.into(), action: "read", source })?;
    from_bytes(&bytes, path)
}

/// [`load`] from the file's bytes (`path` names it in errors).
pub fn load_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Artifact> {
    from_bytes(bytes, path.as_ref())
}

fn identity() -> String {
    format!("tracejit {}", env!("CARGO_PKG_VERSION"))
}

/// The CPU features `target`'s code may use: what the kernels beside them
/// were compiled for (a function traced with `Function::target` saves its
/// target's).
fn features(target: tracejit_jit::Target) -> String {
    target.isa.features().join(",")
}

fn write(mut parts: Parts, values: &[(String, Storage)], path: &Path) -> Result<()> {
    let corrupt = |message: String| Error::Corrupt { path: path.into(), message };
    parts.variables = values
        .iter()
        .map(|(p, v)| Slot { path: p.clone(), dtype: v.dtype(), dims: v.shape().iter().map(|&d| Some(d)).collect() })
        .collect();
    let tensors: BTreeMap<String, Tensor> = values.iter().map(|(p, v)| (p.clone(), Tensor::from(v.clone()))).collect();
    parts.values = tracejit_module::checkpoint::tensors_to_bytes(&tensors).map_err(|e| corrupt(e.to_string()))?;
    let bytes = format::encode(&parts);
    tracejit_module::atomic_file::write_atomically(path, &bytes).map_err(|e| Error::Io {
        path: path.into(),
        action: "write",
        source: e.source,
    })
}

fn from_bytes(bytes: &[u8], path: &Path) -> Result<Artifact> {
    let corrupt = |message: String| Error::Corrupt { path: path.into(), message };
    let parts = format::decode(bytes).map_err(|e| match e {
        DecodeError::Version(found) => Error::Version { path: path.into(), found, expected: FORMAT_VERSION },
        DecodeError::Format(m) => corrupt(m),
    })?;
    // The composites' native kernels, which `kernel` nodes name.
    tracejit_nn::composite::registered_kernels();
    let mut graph = Graph::parse_with_kernels(&parts.graph, &*tracejit_ir::registry::global())
        .map_err(|e| corrupt(format!("its graph does not parse: {e}")))?;
    let variables = restore_variables(&parts, &mut graph).map_err(corrupt)?;
    tracejit_ir::verify(&graph).map_err(|e| corrupt(format!("its graph does not verify: {e}")))?;
    let graph = Arc::new(graph);
    let executable = prepare(&parts, &graph).map_err(corrupt)?;
    Ok(Artifact { parts, graph, variables, executable })
}

/// Fresh variables holding the saved values, bound into `graph`.
fn restore_variables(parts: &Parts, graph: &mut Graph) -> Result<Vec<(String, Variable)>, String> {
    let values = tracejit_module::checkpoint::read_bytes(&parts.values).map_err(|e| format!("its variables: {e}"))?;
    let mut variables = Vec::with_capacity(parts.variables.len());
    for slot in &parts.variables {
        let value = values.get(&slot.path).ok_or_else(|| format!("no value for variable `{}`", slot.path))?;
        let declared: Vec<usize> = slot.dims.iter().map(|d| d.unwrap_or(usize::MAX)).collect();
        if value.dtype() != slot.dtype || value.shape() != declared {
            return Err(format!("variable `{}`: the header and the value disagree on its type", slot.path));
        }
        variables.push((slot.path.clone(), Variable::new(value.clone()).with_name(slot.path.clone())));
    }
    if values.len() != variables.len() {
        return Err(format!("{} values for {} variables", values.len(), variables.len()));
    }
    let by_path: HashMap<String, Variable> = variables.iter().cloned().collect();
    rebind::bind(graph, &by_path)?;
    Ok(variables)
}

/// The executable of `graph` with the artifact's kernels (compiled for
/// this host instead when they do not fit it, logged).
fn prepare(parts: &Parts, graph: &Graph) -> Result<Option<tracejit_jit::Executable>, String> {
    if parts.kernels.is_empty() && parts.features.is_empty() {
        return Ok(None);
    }
    let mut recompiled = Vec::new();
    for (i, k) in parts.kernels.iter().enumerate() {
        match tracejit_jit::compile_cache::preload_entry(k) {
            Ok(None) => {}
            Ok(Some(why)) => recompiled.push(why),
            Err(e) => return Err(format!("kernel {i}: {e}")),
        }
    }
    if let Some(why) = recompiled.first() {
        log::info!(
            "artifact `{}`: compiling {} of its {} kernels for this host: {why}",
            parts.name,
            recompiled.len(),
            parts.kernels.len()
        );
    }
    let opts = tracejit_jit::JitOptions::current();
    match tracejit_jit::Executable::from_optimized(graph, &opts, None) {
        Ok(exe) => {
            // A loaded artifact is typically served: what its first call
            // would do beyond a steady one (packing the convolutions'
            // filters, faulting in its buffers) is done here, in the load.
            let filters = exe.prepack_filters();
            let w = exe.warm_memory();
            log::debug!(
                "artifact `{}`: packed {filters} filters; warmed {} bytes of the heap, and {} bytes on each of {} workers",
                parts.name,
                w.caller,
                w.per_worker,
                w.workers
            );
            Ok(Some(exe))
        }
        Err(e) => {
            log::warn!("artifact `{}`: the JIT cannot prepare it ({e}); the interpreter runs it", parts.name);
            Ok(None)
        }
    }
}

impl Artifact {
    /// The name of the function it was saved from.
    pub fn name(&self) -> &str {
        &self.parts.name
    }

    /// The path of each tensor argument, in call order (as
    /// `ConcreteFunction::input_paths`).
    pub fn input_paths(&self) -> Vec<&str> {
        self.parts.inputs.iter().map(|s| s.path.as_str()).collect()
    }

    /// The accepted type of each tensor argument (unknown dims `None`).
    pub fn input_types(&self) -> Vec<TensorType> {
        self.parts
            .inputs
            .iter()
            .map(|s| TensorType { dtype: s.dtype, dims: s.dims.iter().copied().collect() })
            .collect()
    }

    /// The path of each result (as `ConcreteFunction::output_paths`).
    pub fn output_paths(&self) -> Vec<&str> {
        self.parts.outputs.iter().map(|s| s.path.as_str()).collect()
    }

    /// The graph it runs (the function's optimized graph, bound to
    /// [`Artifact::variables`]).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Which executor runs it: `"jit"` or `"interpreter"`.
    pub fn executor_kind(&self) -> &'static str {
        if self.executable.is_some() {
            "jit"
        } else {
            "interpreter"
        }
    }

    /// What its compiled code was built for and runs with: the target
    /// entered when it was loaded (`Target::enter`; the host's otherwise);
    /// `None` when the interpreter runs it.
    pub fn target(&self) -> Option<tracejit_jit::Target> {
        self.executable.as_ref().map(|e| e.target())
    }

    /// The variables it reads and writes, by path (as
    /// `Module::named_variables`); a stateful step updates them on every
    /// call, and [`save_artifact`] writes their values.
    pub fn variables(&self) -> Vec<(String, Variable)> {
        self.variables.clone()
    }

    /// Runs the function on its flat tensor arguments (signature order);
    /// returns its flat results.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let sig = |message: String| Error::Signature { function: self.parts.name.clone(), message };
        if inputs.len() != self.parts.inputs.len() {
            return Err(sig(format!("expected {} tensor arguments, got {}", self.parts.inputs.len(), inputs.len())));
        }
        let mut storages = Vec::with_capacity(inputs.len());
        for (slot, t) in self.parts.inputs.iter().zip(inputs) {
            let want = TensorType { dtype: slot.dtype, dims: slot.dims.iter().copied().collect() };
            let Ok(s) = t.storage() else {
                return Err(sig(format!("argument `{}` is symbolic: call an artifact with eager tensors", slot.path)));
            };
            if !want.accepts(s.dtype(), s.shape()) {
                return Err(sig(format!(
                    "argument `{}`: expected {want}, got {}",
                    slot.path,
                    TensorType::known(s.dtype(), s.shape())
                )));
            }
            storages.push(s.clone());
        }
        let run = || match &self.executable {
            Some(exe) => exe.run(&storages),
            None => tracejit_ir::interpret(&self.graph, &storages),
        };
        let failed = |message: String| Error::Run { function: self.parts.name.clone(), message };
        match tracejit_ir::catch_quietly(run) {
            Ok(Ok(outs)) => Ok(outs.into_iter().map(Tensor::from).collect()),
            Ok(Err(e)) => Err(failed(e.to_string())),
            Err(p) => Err(failed(tracejit_ir::panic_message(&*p))),
        }
    }
}
