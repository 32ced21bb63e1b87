//! Shared by the export tests: run an exported file in tract (a real ONNX
//! runtime, pure Rust), expand ONNX local functions for it (tract does not
//! read them), compare with tracejit's own results, and save every case
//! for `scripts/run_onnxruntime.py` when `TRACEJIT_ONNX_CASES=<dir>` is set.

use std::collections::HashMap;

use tracejit_onnx::pb::{self, ModelProto, NodeProto};
use tracejit_tensor::{DType, Storage};
use tracejit_trace::{ConcreteFunction, Tensor};
use tract_onnx::prelude::{
    DatumType, Framework, InferenceFact, InferenceModelExt, IntoRunnable, Tensor as TractTensor, TractResult,
};

/// Runs ONNX `bytes` in tract on `inputs` (their shapes fix any symbolic dim).
pub fn run_tract(bytes: &[u8], inputs: &[Storage]) -> TractResult<Vec<Storage>> {
    let mut model = tract_onnx::onnx().model_for_read(&mut &bytes[..])?;
    for (i, s) in inputs.iter().enumerate() {
        model.set_input_fact(i, InferenceFact::dt_shape(datum_type(s.dtype()), s.shape()))?;
    }
    let plan = model.into_optimized()?.into_runnable()?;
    let values = inputs.iter().map(|s| to_tract(s).into()).collect();
    let outs = plan.run(values)?;
    outs.iter().map(|t| from_tract(t)).collect()
}

fn datum_type(d: DType) -> DatumType {
    match d {
        DType::F32 => DatumType::F32,
        DType::F64 => DatumType::F64,
        DType::I32 => DatumType::I32,
        DType::I64 => DatumType::I64,
        DType::Bool => DatumType::Bool,
        DType::I8 => DatumType::I8,
        DType::U8 => DatumType::U8,
        DType::I16 => DatumType::I16,
        DType::U16 => DatumType::U16,
        DType::U32 => DatumType::U32,
        DType::U64 => DatumType::U64,
        DType::BF16 | DType::F16 => panic!("these tests run tract on f32, f64, bool and the integers, not {d}"),
    }
}

fn to_tract(s: &Storage) -> TractTensor {
    let shape = s.shape();
    let t = match s {
        Storage::F32(_) => TractTensor::from_shape(shape, &s.to_vec::<f32>().unwrap()),
        Storage::F64(_) => TractTensor::from_shape(shape, &s.to_vec::<f64>().unwrap()),
        Storage::I32(_) => TractTensor::from_shape(shape, &s.to_vec::<i32>().unwrap()),
        Storage::I64(_) => TractTensor::from_shape(shape, &s.to_vec::<i64>().unwrap()),
        Storage::Bool(_) => TractTensor::from_shape(shape, &s.to_vec::<bool>().unwrap()),
        Storage::I8(_) => TractTensor::from_shape(shape, &s.to_vec::<i8>().unwrap()),
        Storage::U8(_) => TractTensor::from_shape(shape, &s.to_vec::<u8>().unwrap()),
        Storage::I16(_) => TractTensor::from_shape(shape, &s.to_vec::<i16>().unwrap()),
        Storage::U16(_) => TractTensor::from_shape(shape, &s.to_vec::<u16>().unwrap()),
        Storage::U32(_) => TractTensor::from_shape(shape, &s.to_vec::<u32>().unwrap()),
        Storage::U64(_) => TractTensor::from_shape(shape, &s.to_vec::<u64>().unwrap()),
        Storage::BF16(_) | Storage::F16(_) => {
            panic!("these tests feed tract f32, f64, i32, i64 and bool, not {}", s.dtype())
        }
    };
    t.expect("shape matches the data")
}

fn from_tract(t: &TractTensor) -> TractResult<Storage> {
    let shape = t.shape().to_vec();
    fn data<T: tract_onnx::prelude::Datum + Copy>(t: &TractTensor) -> TractResult<Vec<T>> {
        Ok(t.to_plain_array_view::<T>()?.iter().copied().collect())
    }
    let s = match t.datum_type() {
        DatumType::F32 => Storage::from_vec(data::<f32>(t)?, &shape),
        DatumType::F64 => Storage::from_vec(data::<f64>(t)?, &shape),
        DatumType::I32 => Storage::from_vec(data::<i32>(t)?, &shape),
        DatumType::I64 => Storage::from_vec(data::<i64>(t)?, &shape),
        DatumType::Bool => Storage::from_vec(data::<bool>(t)?, &shape),
        DatumType::I8 => Storage::from_vec(data::<i8>(t)?, &shape),
        DatumType::U8 => Storage::from_vec(data::<u8>(t)?, &shape),
        DatumType::I16 => Storage::from_vec(data::<i16>(t)?, &shape),
        DatumType::U16 => Storage::from_vec(data::<u16>(t)?, &shape),
        DatumType::U32 => Storage::from_vec(data::<u32>(t)?, &shape),
        DatumType::U64 => Storage::from_vec(data::<u64>(t)?, &shape),
        // tract computes some integer results (casts, shapes) as symbolic dims.
        DatumType::TDim => Storage::from_vec(data::<i64>(t.cast_to::<i64>()?.as_ref())?, &shape),
        other => return Err(tract_onnx::prelude::TractError::msg(format!("tract returned a {other:?} tensor"))),
    };
    Ok(s.expect("shape matches the data"))
}

/// `model` with every call of a local function replaced by the function's
/// nodes (values renamed per call site), for runtimes that do not read
/// local functions. Recursive for nested calls.
pub fn expand_local_functions(model: &ModelProto) -> ModelProto {
    let functions: HashMap<(String, String, String), pb::FunctionProto> = model
        .functions
        .iter()
        .map(|f| ((f.domain().to_string(), f.name().to_string(), f.overload().to_string()), f.clone()))
        .collect();
    let mut out = model.clone();
    let graph = out.graph.as_mut().expect("a graph");
    let mut counter = 0usize;
    graph.node = expand(&graph.node, &functions, &mut counter);
    out.functions.clear();
    out.opset_import.retain(|o| o.domain().is_empty());
    out
}

fn expand(
    nodes: &[NodeProto],
    functions: &HashMap<(String, String, String), pb::FunctionProto>,
    counter: &mut usize,
) -> Vec<NodeProto> {
    let mut out = Vec::new();
    for n in nodes {
        let key = (n.domain().to_string(), n.op_type().to_string(), n.overload().to_string());
        let Some(f) = functions.get(&key) else {
            // Calls may also sit in subgraphs (If branches, Loop bodies).
            let mut n = n.clone();
            for a in &mut n.attribute {
                if let Some(g) = a.g.as_mut() {
                    g.node = expand(&g.node, functions, counter);
                }
            }
            out.push(n);
            continue;
        };
        *counter += 1;
        let site = *counter;
        let mut rename: HashMap<String, String> = HashMap::new();
        for (formal, actual) in f.input.iter().zip(&n.input) {
            rename.insert(formal.clone(), actual.clone());
        }
        for (formal, actual) in f.output.iter().zip(&n.output) {
            rename.insert(formal.clone(), actual.clone());
        }
        let body: Vec<NodeProto> = f
            .node
            .iter()
            .map(|inner| {
                let mut inner = inner.clone();
                let map = |name: &String, rename: &mut HashMap<String, String>| {
                    rename.entry(name.clone()).or_insert_with(|| format!("{name}__call{site}")).clone()
                };
                inner.input = inner.input.iter().map(|i| map(i, &mut rename)).collect();
                inner.output = inner.output.iter().map(|o| map(o, &mut rename)).collect();
                inner.name = Some(format!("{}__call{site}", inner.name()));
                inner
            })
            .collect();
        out.extend(expand(&body, functions, counter));
    }
    out
}

/// Asserts that tract's results equal tracejit's: same dtype and shape,
/// NaN where NaN, equal infinities, and finite floats within `tol`
/// relative (plus `tol` absolute); integers and bools exactly.
pub fn assert_close(what: &str, got: &[Storage], want: &[Storage], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {} results from the runtime, {} from tracejit", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.dtype(), w.dtype(), "{what}: result {i} dtype");
        assert_eq!(g.shape(), w.shape(), "{what}: result {i} shape");
        match w.dtype() {
            DType::F32 | DType::F64 => {
                let gv = g.to_standard();
                let wv = w.to_standard();
                let (gv, wv): (Vec<f64>, Vec<f64>) = match (gv, wv) {
                    (Storage::F32(a), Storage::F32(b)) => {
                        (a.iter().map(|&v| v as f64).collect(), b.iter().map(|&v| v as f64).collect())
                    }
                    (Storage::F64(a), Storage::F64(b)) => (a.iter().copied().collect(), b.iter().copied().collect()),
                    _ => unreachable!("dtypes checked above"),
                };
                for (k, (a, b)) in gv.iter().zip(&wv).enumerate() {
                    let ok = if b.is_nan() {
                        a.is_nan()
                    } else if b.is_infinite() {
                        a == b
                    } else {
                        (a - b).abs() <= tol * (1.0 + b.abs())
                    };
                    assert!(ok, "{what}: result {i} element {k}: runtime {a}, tracejit {b}");
                }
            }
            _ => {
                assert!(g.bit_eq(w), "{what}: result {i}: runtime {g:?}, tracejit {w:?}");
            }
        }
    }
}

/// Exports `cf`, runs it in tract on `inputs` (composites expanded), and
/// compares with `cf`'s own results. Also checks the file with composites
/// inlined by the exporter, and saves the case when asked to.
pub fn check(name: &str, cf: &ConcreteFunction, inputs: &[Tensor], tol: f64) {
    let want: Vec<Storage> = cf.call_flat(inputs).unwrap().iter().map(|t| t.storage().unwrap().clone()).collect();
    let storages: Vec<Storage> = inputs.iter().map(|t| t.storage().unwrap().clone()).collect();
    let model = tracejit_onnx::Exporter::new(cf).to_model().unwrap_or_else(|e| panic!("{name}: {e}"));
    let expanded = prost::Message::encode_to_vec(&expand_local_functions(&model));
    let got = run_tract(&expanded, &storages).unwrap_or_else(|e| panic!("{name}: tract: {e:?}"));
    assert_close(name, &got, &want, tol);
    let inlined = tracejit_onnx::Exporter::new(cf).inline_composites(true).to_bytes().unwrap();
    let got = run_tract(&inlined, &storages).unwrap_or_else(|e| panic!("{name} (inlined): tract: {e:?}"));
    assert_close(&format!("{name} (inlined)"), &got, &want, tol);
    save_case(name, cf, inputs);
}

/// With `TRACEJIT_ONNX_CASES=<dir>`, writes the case (model and data) to
/// `<dir>/<name>` for `scripts/run_onnxruntime.py`.
pub fn save_case(name: &str, cf: &ConcreteFunction, inputs: &[Tensor]) {
    if let Some(dir) = std::env::var_os("TRACEJIT_ONNX_CASES").filter(|d| !d.is_empty()) {
        let dir = std::path::Path::new(&dir).join(name);
        tracejit_onnx::Exporter::new(cf).save_test_case(inputs, &dir).unwrap();
    }
}
