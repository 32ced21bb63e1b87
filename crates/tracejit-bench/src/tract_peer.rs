//! tract (the pure-Rust ONNX runtime) on W14, W14b and W15 `minilm_onnx`,
//! in the harness's process, on the same files and inputs as
//! [`crate::onnx_models`] (`--tract`; built with the `tract` feature, off
//! by default: tract's release build costs several CPU-minutes that the
//! other workloads do not need).
//!
//! Per workload: the first call (load, `into_optimized`, `into_runnable`
//! and a run, as tracejit's first call counts import, trace, compile and
//! run), then the median over the budget, and the largest difference from
//! tracejit's output on the same inputs (relative to its largest value).
//! Threads: tract's matrix products run on a rayon pool of `--threads`
//! threads (`tract_linalg::multithread`), one thread by default.

use std::time::Instant;

use tract_linalg::multithread::{multithread_tract_scope, Executor};
use tract_onnx::prelude::{
    DatumType, Framework, InferenceFact, InferenceModelExt, IntoRunnable, Tensor as TractTensor, TractResult,
};

use crate::measure::{measure, Budget};
use crate::onnx_models::{images, import, models_dir, W14B_BATCH};

/// One workload's figures in tract.
#[derive(Clone, Debug)]
pub struct TractRow {
    /// `W14`, `W14b`, `W15`.
    pub id: &'static str,
    /// The harness's workload name.
    pub workload: &'static str,
    /// Threads of tract's pool.
    pub threads: usize,
    /// Load + optimize + first run, µs.
    pub first_call_us: f64,
    /// Median per call, µs.
    pub median_us: f64,
    /// Fastest call, µs.
    pub min_us: f64,
    /// max |tract - tracejit| / max |tracejit| over the output.
    pub rel_diff_vs_tracejit: f64,
    /// tracejit's import of the same file, ms. Its first call in the table
    /// leaves the import out; adding this gives import, trace, compile and
    /// run, the span of tract's and ONNX Runtime's first call.
    pub tracejit_import_ms: f64,
}

impl TractRow {
    /// The row as one JSON line (`bench_peers.py`'s keys where they exist).
    pub fn json(&self) -> String {
        serde_json::json!({
            "system": "tract",
            "id": self.id,
            "workload": self.workload,
            "threads": self.threads,
            "first_call_us": self.first_call_us,
            "median_us": self.median_us,
            "min_us": self.min_us,
            "rel_diff_vs_tracejit": self.rel_diff_vs_tracejit,
            "tracejit_import_ms": self.tracejit_import_ms,
        })
        .to_string()
    }
}

fn to_tract(t: &tracejit::Tensor) -> TractResult<TractTensor> {
    match t.dtype() {
        tracejit::DType::F32 => TractTensor::from_shape(t.shape(), &t.to_vec::<f32>().expect("eager")),
        tracejit::DType::I64 => TractTensor::from_shape(t.shape(), &t.to_vec::<i64>().expect("eager")),
        d => panic!("the model workloads feed f32 and i64, not {d}"),
    }
}

/// Runs `file` on `inputs` in tract and compares with tracejit's run.
fn run(
    id: &'static str,
    workload: &'static str,
    file: &str,
    inputs: &[tracejit::Tensor],
    threads: usize,
    budget: Budget,
) -> Result<TractRow, String> {
    let (model, tracejit_import_ms) = import(file)?;
    let want = model.run(inputs).map_err(|e| format!("tracejit: {e}"))?.remove(0).to_vec::<f32>().expect("eager");
    let path = models_dir().join(file);
    let values: Vec<TractTensor> =
        inputs.iter().map(to_tract).collect::<TractResult<_>>().map_err(|e| e.to_string())?;
    let go = || -> TractResult<(f64, Vec<f32>, _)> {
        let t0 = Instant::now();
        let mut m = tract_onnx::onnx().model_for_path(&path)?;
        for (i, v) in values.iter().enumerate() {
            let dt = if v.datum_type() == DatumType::F32 { DatumType::F32 } else { DatumType::I64 };
            m.set_input_fact(i, InferenceFact::dt_shape(dt, v.shape()))?;
        }
        let plan = m.into_optimized()?.into_runnable()?;
        let out = plan.run(values.iter().map(|v| v.clone().into()).collect())?;
        let first = t0.elapsed().as_secs_f64() * 1e6;
        let got: Vec<f32> = out[0].to_plain_array_view::<f32>()?.iter().copied().collect();
        Ok((first, got, plan))
    };
    let pool = if threads > 1 { Executor::multithread(threads) } else { Executor::SingleThread };
    multithread_tract_scope(pool, || {
        let (first_call_us, got, plan) = go().map_err(|e| format!("tract: {e:#}"))?;
        if got.len() != want.len() {
            return Err(format!("tract gave {} values, tracejit {}", got.len(), want.len()));
        }
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
        let diff = got.iter().zip(&want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let timing = measure(budget, || {
            plan.run(values.iter().map(|v| v.clone().into()).collect()).map(|_| ()).map_err(|e| format!("tract: {e}"))
        })?;
        Ok(TractRow {
            id,
            workload,
            threads,
            first_call_us,
            median_us: timing.median_us,
            min_us: timing.min_us,
            rel_diff_vs_tracejit: f64::from(diff / scale),
            tracejit_import_ms,
        })
    })
}

/// tract's rows for the model workloads among `names` (harness names).
pub fn rows(names: &[&str], threads: usize, budget: Budget) -> Vec<Result<TractRow, String>> {
    let mut out = Vec::new();
    for &name in names {
        out.push(match name {
            "resnet50" => run("W14", "resnet50", "resnet50.onnx", &[images(1)], threads, budget),
            "resnet50_b8" => run("W14b", "resnet50_b8", "resnet50.onnx", &[images(W14B_BATCH)], threads, budget),
            "minilm_onnx" => {
                let (ids, mask, _) = crate::minilm::inputs();
                run("W15", "minilm_onnx", "minilm.onnx", &[ids, mask], threads, budget)
            }
            _ => continue,
        });
    }
    out
}
