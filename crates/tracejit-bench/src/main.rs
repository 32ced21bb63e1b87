//! `tracejit-bench`: the workloads of shared/WORKLOADS.md eager and traced,
//! side by side, with the machine's floors. `cargo run --release -p
//! tracejit-bench -- --help` lists the options.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use tracejit_bench::floors::{
    measure_bandwidth, measure_gemm_mlp_forward, BANDWIDTH_BUFFER_FULL, BANDWIDTH_BUFFER_QUICK,
};
use tracejit_bench::peak::PeakAlloc;
use tracejit_bench::report::{json_lines, report_dir, table, write_reports, Results};
use tracejit_bench::workloads::{selected, Mode, LSTM_CELL_IMPL};
use tracejit_bench::{cli, profile_workload, run_workload, Budget, RunConfig, WorkloadSpec};

// Counts heap bytes so the report can give each mode's peak memory per call.
#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Progress on stderr: a bar on a terminal (advanced when a step ends),
/// plain lines otherwise (one when a step starts).
enum Progress {
    Bar { bar: ProgressBar, started: bool },
    Lines { done: u64, total: u64 },
}

impl Progress {
    fn new(total: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
                bar.set_style(style.progress_chars("=> "));
            }
            Progress::Bar { bar, started: false }
        } else {
            Progress::Lines { done: 0, total }
        }
    }

    fn step(&mut self, what: &str) {
        match self {
            Progress::Bar { bar, started } => {
                if *started {
                    bar.inc(1);
                }
                *started = true;
                bar.set_message(what.to_string());
            }
            Progress::Lines { done, total } => {
                *done += 1;
                eprintln!("tracejit-bench: [{done}/{total}] {what}");
            }
        }
    }

    fn finish(&self) {
        if let Progress::Bar { bar, .. } = self {
            bar.finish_and_clear();
        }
    }
}

/// `RUST_LOG` as given (default `warn`), with Cranelift kept at `warn`
/// unless it is named: at `info` it logs the IR of every kernel it
/// compiles (`log` targets are crate names).
fn init_logging() {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_string());
    let mut builder = env_logger::Builder::new();
    builder.parse_filters(&spec);
    if !spec.contains("cranelift") {
        builder.parse_filters("cranelift=warn");
    }
    builder.try_init().ok();
}

fn main() -> ExitCode {
    init_logging();
    let opts = match cli::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tracejit-bench: {e}");
            return ExitCode::from(2);
        }
    };
    if opts.help {
        println!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    // Before the floors: the GEMM floor runs through the JIT's GEMM, with
    // the same threads as the workloads.
    tracejit::config::set_num_threads(opts.threads);
    let budget = if opts.quick { Budget::QUICK } else { Budget::FULL };
    let specs = selected(opts.filter.as_deref());
    if specs.is_empty() {
        eprintln!("tracejit-bench: --filter {:?} matches no workload", opts.filter.unwrap_or_default());
        return ExitCode::from(2);
    }
    if opts.profile {
        return print_profiles(&specs, budget);
    }
    if opts.tract {
        return print_tract(&specs, opts.threads, budget);
    }
    let total = 2 + specs.iter().map(|s| s.modes.len() as u64).sum::<u64>();
    let mut progress = Progress::new(total);

    let buffer = if opts.quick { BANDWIDTH_BUFFER_QUICK } else { BANDWIDTH_BUFFER_FULL };
    progress.step(&format!("floor: memory bandwidth ({} MiB copy)", buffer >> 20));
    let bandwidth = measure_bandwidth(buffer, budget);
    progress.step("floor: GEMM of mlp_forward");
    let gemm = measure_gemm_mlp_forward(budget);

    let cfg = RunConfig { budget, threads: opts.threads, inject_wrong_result: opts.inject_wrong_result.clone() };
    let mut rows = Vec::new();
    for spec in &specs {
        let mut on_mode = |name: &str, mode: tracejit_bench::Mode| progress.step(&format!("{name} {}", mode.name()));
        rows.extend(run_workload(spec, &cfg, &mut on_mode));
    }
    progress.finish();

    let results = Results::new(rows, &specs, bandwidth, gemm, opts.quick, opts.threads);
    if opts.json {
        for line in json_lines(&results) {
            println!("{line}");
        }
    } else {
        print!("{}", table(&results));
        if specs.iter().any(|s| s.name == "lstm_cell") {
            println!("lstm_cell: {LSTM_CELL_IMPL}.");
        }
    }
    if !opts.no_report {
        match write_reports(&results, &report_dir()) {
            Ok(paths) => {
                let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                eprintln!("tracejit-bench: wrote {}", list.join(", "));
            }
            Err(e) => eprintln!("tracejit-bench: could not write the report: {e}"),
        }
    }
    if results.any_failed() {
        eprintln!("\ntracejit-bench: FAILED — a mode gave a wrong result or an error; no figure is reported for it:");
        for r in results.rows.iter().filter(|r| r.failed()) {
            if let tracejit_bench::Status::Failed(reason) = &r.status {
                eprintln!("  {} {} {}: {reason}", r.id, r.workload, r.mode.name());
            }
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `--profile`: each workload's JIT calls (traced-jit, and traced-jit-bf16
/// where it has that mode), step by step.
fn print_profiles(specs: &[WorkloadSpec], budget: Budget) -> ExitCode {
    let mut failed = false;
    for spec in specs {
        for &mode in spec.modes.iter().filter(|m| m.needs_jit() && **m != Mode::TracedJitNoSelect) {
            match profile_workload(spec, mode, budget) {
                Ok(p) => println!("{} {} ({}): {p}", spec.id, spec.name, mode.name()),
                Err(e) => {
                    failed = true;
                    eprintln!("tracejit-bench: {} {} ({}): no profile: {e}", spec.id, spec.name, mode.name());
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--tract`: tract's rows for the selected model workloads.
#[cfg(feature = "tract")]
fn print_tract(specs: &[WorkloadSpec], threads: usize, budget: Budget) -> ExitCode {
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    let mut failed = false;
    for row in tracejit_bench::tract_peer::rows(&names, threads, budget) {
        match row {
            Ok(r) => println!("{}", r.json()),
            Err(e) => {
                failed = true;
                eprintln!("tracejit-bench: tract: {e}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--tract` without the feature: how to get it.
#[cfg(not(feature = "tract"))]
fn print_tract(_: &[WorkloadSpec], _: usize, _: Budget) -> ExitCode {
    eprintln!("tracejit-bench: --tract needs the tract feature: cargo run --release -p tracejit-bench --features tract -- --tract --filter models");
    ExitCode::from(2)
}
