//! Runs one workload in each of its modes: the eager reference first, then
//! every traced mode on a fresh `Function` (first-call latency), verified
//! against the eager result on the first and on a cached call, then timed.

use tracejit::Tensor;

use crate::measure::{measure, time_once, Budget, Timing};
use crate::peak::measure_peak;
use crate::verify::{check_tensors, Agreement, OutputValues, Tolerance};
use crate::workloads::{Body, Mode, Runnable, WorkloadSpec};

/// How a mode's run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// Verified and timed.
    Measured {
        /// Per-call timing.
        timing: Timing,
        /// Trace + optimize + compile + first run on a fresh Function, µs
        /// (`None` for eager).
        first_call_us: Option<f64>,
        /// Distance from the eager result.
        agreement: Agreement,
        /// The executor that ran it (`None` for eager).
        executor: Option<&'static str>,
        /// What one call runs, when the JIT ran it.
        schedule: Option<tracejit::ScheduleStats>,
        /// How far the heap rose during one steady call, in bytes
        /// (intermediates and outputs; `None` without the counting allocator).
        peak_bytes: Option<usize>,
    },
    /// The machinery for this mode does not exist yet.
    NotAvailable(String),
    /// A wrong result or an error: the run fails.
    Failed(String),
}

/// One line of the results: a workload in one mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `W1`..`W10`.
    pub id: &'static str,
    /// The workload's name (`gelu`).
    pub workload: &'static str,
    /// The mode.
    pub mode: Mode,
    /// The JIT's thread count during the run (`--threads`).
    pub threads: usize,
    /// The outcome.
    pub status: Status,
}

impl Row {
    /// The timing, when the mode was measured.
    pub fn timing(&self) -> Option<&Timing> {
        match &self.status {
            Status::Measured { timing, .. } => Some(timing),
            _ => None,
        }
    }

    /// First-call latency in µs, when measured.
    pub fn first_call_us(&self) -> Option<f64> {
        match &self.status {
            Status::Measured { first_call_us, .. } => *first_call_us,
            _ => None,
        }
    }

    /// What one call of a JIT-run mode executes.
    pub fn schedule(&self) -> Option<&tracejit::ScheduleStats> {
        match &self.status {
            Status::Measured { schedule, .. } => schedule.as_ref(),
            _ => None,
        }
    }

    /// Peak heap bytes of one steady call, when measured.
    pub fn peak_bytes(&self) -> Option<usize> {
        match &self.status {
            Status::Measured { peak_bytes, .. } => *peak_bytes,
            _ => None,
        }
    }

    /// Threads the mode's kernels may use: the count, in every mode (the
    /// JIT's kernels; eager products and convolutions; and, eagerly and in
    /// the interpreter, elementwise ops and reductions of 65,536 elements
    /// or more split across the pool). Kept in the JSON for the readers of earlier runs,
    /// when eager ops ran on one.
    pub fn threads_used(&self) -> usize {
        self.threads
    }

    /// True when the run must fail.
    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Failed(_))
    }
}

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Timing budget per measurement.
    pub budget: Budget,
    /// The JIT's thread count (`--threads`; the caller sets it with
    /// `tracejit::config::set_num_threads`).
    pub threads: usize,
    /// For testing the harness itself: the workload whose traced results get
    /// one element perturbed, which must make the run fail.
    pub inject_wrong_result: Option<String>,
}

fn row(spec: &WorkloadSpec, mode: Mode, cfg: &RunConfig, status: Status) -> Row {
    Row { id: spec.id, workload: spec.name, mode, threads: cfg.threads, status }
}

/// Runs every mode of `spec` (building its inputs first); `progress` is told
/// which mode starts.
pub fn run_workload(spec: &WorkloadSpec, cfg: &RunConfig, progress: &mut dyn FnMut(&str, Mode)) -> Vec<Row> {
    match (spec.build)() {
        Body::Unavailable(reason) => spec
            .modes
            .iter()
            .map(|&m| {
                progress(spec.name, m);
                row(spec, m, cfg, Status::NotAvailable(reason.clone()))
            })
            .collect(),
        Body::Runnable(case) => run_case(spec, &*case, spec.tolerance, cfg, progress),
    }
}

/// Runs every mode of `spec` on an already built case. A failed eager
/// reference fails every mode.
pub fn run_case(
    spec: &WorkloadSpec,
    case: &dyn Runnable,
    tol: Tolerance,
    cfg: &RunConfig,
    progress: &mut dyn FnMut(&str, Mode),
) -> Vec<Row> {
    let reference = case.eager_call().and_then(|outs| OutputValues::from_tensors(&outs));
    let reference = match reference {
        Ok(r) => r,
        Err(e) => {
            return spec
                .modes
                .iter()
                .map(|&m| {
                    progress(spec.name, m);
                    row(spec, m, cfg, Status::Failed(format!("eager reference: {e}")))
                })
                .collect()
        }
    };
    spec.modes
        .iter()
        .map(|&mode| {
            progress(spec.name, mode);
            let status = if mode.is_traced() {
                let inject = cfg.inject_wrong_result.as_deref() == Some(spec.name);
                let tol = if mode.is_low_precision() { spec.low_precision } else { tol };
                run_traced(case, mode, &reference, tol, cfg.budget, inject)
            } else {
                run_eager(case, &reference, tol, cfg.budget)
            };
            row(spec, mode, cfg, status)
        })
        .collect()
}

fn run_eager(case: &dyn Runnable, reference: &[OutputValues], tol: Tolerance, budget: Budget) -> Status {
    // The closure must be deterministic for the reference to mean anything.
    let again = match case.eager_call() {
        Ok(o) => o,
        Err(e) => return Status::Failed(e),
    };
    let agreement = match check_tensors(reference, &again, tol) {
        Ok(a) => a,
        Err(m) => return Status::Failed(format!("eager is not deterministic: {m}")),
    };
    let ((), peak_bytes) = measure_peak(|| case.eager_call_discard());
    let timing = measure(budget, || {
        case.eager_call_discard();
        Ok::<(), String>(())
    });
    match timing {
        Ok(timing) => {
            Status::Measured { timing, first_call_us: None, agreement, executor: None, schedule: None, peak_bytes }
        }
        Err(e) => Status::Failed(e),
    }
}

fn run_traced(
    case: &dyn Runnable,
    mode: Mode,
    reference: &[OutputValues],
    tol: Tolerance,
    budget: Budget,
    inject_wrong_result: bool,
) -> Status {
    // The heap before the function exists: a traced mode's peak counts
    // what the function keeps between calls (its buffer pool, its code).
    let base = crate::peak::live_heap();
    let mut runner = match case.traced(mode) {
        Ok(r) => r,
        Err(reason) => return Status::NotAvailable(reason),
    };
    // First call on a fresh Function: trace + optimize + compile + run.
    let (first_call_us, first) = time_once(|| runner.call());
    let mut first = match first {
        Ok(o) => o,
        Err(e) => return Status::Failed(format!("first call: {e}")),
    };
    if inject_wrong_result {
        first = perturb(&first);
    }
    let executor = runner.executor_kind();
    if mode.needs_jit() && executor != Some("jit") {
        return Status::NotAvailable(format!(
            "JIT executor not available (executor_kind() is {})",
            executor.map(|k| format!("\"{k}\"")).unwrap_or_else(|| "unknown".to_string())
        ));
    }
    let mut agreement = match check_tensors(reference, &first, tol) {
        Ok(a) => a,
        Err(m) => return Status::Failed(format!("wrong result on the first call: {m}")),
    };
    // A second call goes through the cache: check that path too.
    let second = match runner.call() {
        Ok(o) => o,
        Err(e) => return Status::Failed(format!("second call: {e}")),
    };
    match check_tensors(reference, &second, tol) {
        Ok(a) => {
            agreement.max_abs_err = agreement.max_abs_err.max(a.max_abs_err);
            agreement.max_rel_err = agreement.max_rel_err.max(a.max_rel_err);
            agreement.max_scaled_err = agreement.max_scaled_err.max(a.max_scaled_err);
            agreement.min_row_cosine = agreement.min_row_cosine.min(a.min_row_cosine);
        }
        Err(m) => return Status::Failed(format!("wrong result on a cached call: {m}")),
    }
    if runner.tracing_count() != 1 {
        return Status::Failed(format!("traced {} times for one signature", runner.tracing_count()));
    }
    drop((first, second));
    let timing = match measure(budget, || runner.call_discard()) {
        Ok(timing) => timing,
        Err(e) => return Status::Failed(e),
    };
    // A steady call, after the timed ones.
    let (steady, peak_bytes) = crate::peak::measure_peak_above(base, || runner.call_discard());
    if let Err(e) = steady {
        return Status::Failed(format!("a call after the timed ones: {e}"));
    }
    Status::Measured {
        timing,
        first_call_us: Some(first_call_us),
        agreement,
        executor,
        schedule: runner.schedule_stats(),
        peak_bytes,
    }
}

/// Where one call of `spec` in JIT mode `mode` (traced-jit, or
/// traced-jit-bf16 where the workload has it) spends its time
/// (`--profile`): the function is traced and called twice, then profiled
/// over as many calls as fit in `budget` (at least 3). `Err` says why
/// there is no profile.
pub fn profile_workload(spec: &WorkloadSpec, mode: Mode, budget: Budget) -> Result<tracejit::Profile, String> {
    let case = match (spec.build)() {
        Body::Unavailable(reason) => return Err(reason),
        Body::Runnable(case) => case,
    };
    let mut runner = case.traced(mode)?;
    runner.call()?;
    let (once_us, second) = time_once(|| runner.call());
    second?;
    let runs = ((budget.measure.as_secs_f64() * 1e6 / once_us.max(1.0)) as usize).max(3);
    runner.profile(runs).unwrap_or_else(|| Err("the JIT executor does not run it".to_string()))
}

/// The same tensors with the first element of the first output moved by 1%
/// (plus 1e-3): a deliberately wrong result.
pub fn perturb(outs: &[Tensor]) -> Vec<Tensor> {
    let mut outs = outs.to_vec();
    if let Some(t) = outs.first_mut() {
        if let Ok(mut v) = t.to_vec::<f32>() {
            if let Some(x) = v.first_mut() {
                *x += x.abs() * 0.01 + 1e-3;
            }
            *t = Tensor::from_vec(v, t.shape());
        }
    }
    outs
}
