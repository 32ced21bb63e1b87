//! W10 (`gpt_train_step`), W14 (ResNet-50 through the ONNX importer) and
//! W15 (`minilm.onnx` through the importer) shipped as artifacts, timed in
//! fresh processes: what a program that loads a saved function pays
//! before its first call, against tracing and compiling it, and against a
//! steady call. The figures of README's "Shipping compiled functions" come
//! from here.
//!
//! ```sh
//! cargo build --release -p tracejit-bench --bin artifact_timing
//! taskset -c 0 target/release/artifact_timing [--workload w10|w14|w15] [--runs N] [DIR]
//! ```
//! (DIR: default `target/artifact_timing`; W14/W15 need the model files of
//! `shared/peers/models/make_models.py`, see `onnx_models::models_dir`.)
//!
//! The driver runs this binary again as child processes, `--runs` times
//! each (the median is printed): `cold` traces and compiles W10 with an
//! empty compile cache and saves the artifact; `traced` traces it again
//! with that (now warm) cache; `load` loads the artifact with the warm
//! cache, and `load-nocache` with none (its kernels come from the file).
//! Every child checks that its result (W10's loss, the models' first
//! output) is the cold process's, bit for bit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use tracejit::{function, Tensor};
use tracejit_bench::onnx_models;
use tracejit_bench::transformer::{gpt_args, gpt_train_step};

/// Steady calls timed after the first (the median is reported).
const STEADY: usize = 5;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Minor page faults of this process so far (`/proc/self/stat`'s tenth
/// field; 0 where it cannot be read).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace().nth(7).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The workload's arguments flattened in signature order.
fn flat_args(workload: &str) -> Vec<Tensor> {
    match workload {
        "w14" => vec![onnx_models::images(1)],
        "w15" => {
            let (ids, mask, _) = tracejit_bench::minilm::inputs();
            vec![ids, mask]
        }
        _ => w10_args(),
    }
}

/// The model file behind an importer workload.
fn model_file(workload: &str) -> Option<&'static str> {
    match workload {
        "w14" => Some("resnet50.onnx"),
        "w15" => Some("minilm.onnx"),
        _ => None,
    }
}

/// W10's arguments flattened in signature order (tokens, parameters,
/// first moments, second moments, step).
fn w10_args() -> Vec<Tensor> {
    let (tok, p, m, v, step) = gpt_args();
    let mut flat = vec![tok];
    flat.extend(p);
    flat.extend(m);
    flat.extend(v);
    flat.push(step);
    flat
}

/// A digest of the results' bits (W10's last is its loss; a model's
/// first is its output), what every child must reproduce.
fn loss_bits(outs: &[Tensor]) -> anyhow::Result<u32> {
    let mut h = 0x811c_9dc5u32;
    for t in outs.iter().filter(|t| t.dtype() == tracejit::DType::F32) {
        for x in t.to_vec::<f32>()? {
            h = (h ^ x.to_bits()).wrapping_mul(0x0100_0193);
        }
    }
    Ok(h)
}

fn report(first: f64, steady: Vec<f64>, loss: u32) {
    let st = tracejit::config::compile_cache_stats();
    println!("FIRST {first:.3}");
    println!("STEADY {:.3}", median(steady));
    println!("LOSS {loss:08x}");
    println!("KERNELS hits={} misses={}", st.hits, st.misses);
}

/// Traces the workload (W14/W15: imports the model first, timed apart),
/// calls it, and (`save`) saves it as an artifact.
fn traced(workload: &str, save: Option<&Path>) -> anyhow::Result<()> {
    let (outs, first, steady, cf) = match model_file(workload) {
        Some(file) => {
            let (model, import_ms) = onnx_models::import(file).map_err(anyhow::Error::msg)?;
            println!("IMPORT {import_ms:.3}");
            let args = flat_args(workload);
            let started = Instant::now();
            let outs = model.run(&args)?;
            let first = ms(started);
            let steady = (0..STEADY)
                .map(|_| {
                    let t = Instant::now();
                    model.run(&args).map(|_| ms(t))
                })
                .collect::<Result<Vec<f64>, _>>()?;
            (outs, first, steady, model.function().concrete_functions().first().cloned())
        }
        None => {
            let f = function(gpt_train_step).name("gpt_train_step");
            let started = Instant::now();
            let outs = f.call(gpt_args())?;
            let first = ms(started);
            let steady = (0..STEADY)
                .map(|_| {
                    let t = Instant::now();
                    f.call(gpt_args()).map(|_| ms(t))
                })
                .collect::<Result<Vec<f64>, _>>()?;
            (outs, first, steady, f.concrete_functions().first().cloned())
        }
    };
    if let Some(path) = save {
        let cf = cf.context("no trace")?;
        let t = Instant::now();
        tracejit::artifact::save(&cf, path)?;
        println!("SAVE {:.3}", ms(t));
        println!("SIZE {}", std::fs::metadata(path)?.len());
        println!("ARTIFACT_KERNELS {}", cf.kernel_entries().len());
    }
    report(first, steady, loss_bits(&outs)?);
    Ok(())
}

/// Loads the artifact and calls it: no closure, no tracing.
fn load(workload: &str, path: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    let a = tracejit::artifact::load(path)?;
    println!("LOAD {:.3}", ms(t));
    ensure!(a.executor_kind() == "jit", "the artifact runs in the {}", a.executor_kind());
    let args = flat_args(workload);
    let faults = minor_faults();
    let t = Instant::now();
    let outs = a.call(&args)?;
    let first = ms(t);
    let first_faults = minor_faults() - faults;
    let faults = minor_faults();
    let steady = (0..STEADY)
        .map(|_| {
            let t = Instant::now();
            a.call(&args).map(|_| ms(t))
        })
        .collect::<Result<Vec<f64>, _>>()?;
    println!("FAULTS {first_faults} {}", (minor_faults() - faults) / STEADY as u64);
    report(first, steady, loss_bits(&outs)?);
    Ok(())
}

/// One child's figures, by tag.
fn child(workload: &str, mode: &str, file: &Path, cache: Option<&Path>) -> anyhow::Result<Vec<(String, String)>> {
    let mut c = Command::new(std::env::current_exe()?);
    c.args(["--child", workload, mode]).arg(file);
    match cache {
        Some(dir) => c.env("TRACEJIT_COMPILE_CACHE", dir),
        None => c.env_remove("TRACEJIT_COMPILE_CACHE"),
    };
    let out = c.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "child `{mode}` failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    Ok(stdout.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn field<'a>(fields: &'a [(String, String)], tag: &str) -> &'a str {
    fields.iter().find(|(k, _)| k == tag).map_or("-", |(_, v)| v.as_str())
}

/// Runs every child `runs` times and prints the medians.
fn drive(workload: &str, dir: &Path, runs: usize) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!("{workload}.tjx"));
    let cache = dir.join("cache");
    let modes: [(&str, &str, Option<&Path>); 4] = [
        ("cold", "trace + compile (empty compile cache), first call", Some(&cache)),
        ("traced", "trace, kernels from the warm compile cache, first call", Some(&cache)),
        ("load", "artifact, warm compile cache", Some(&cache)),
        ("load-nocache", "artifact, no compile cache", None),
    ];
    let mut reference = None;
    for (mode, what, cache_dir) in modes {
        let mut firsts = Vec::new();
        let mut steadies = Vec::new();
        let mut loads = Vec::new();
        let mut last = Vec::new();
        for _ in 0..runs {
            if mode == "cold" {
                let _ = std::fs::remove_dir_all(&cache);
            }
            last = child(workload, mode, &file, cache_dir)?;
            firsts.push(field(&last, "FIRST").parse::<f64>()?);
            steadies.push(field(&last, "STEADY").parse::<f64>()?);
            if let Ok(l) = field(&last, "LOAD").parse::<f64>() {
                loads.push(l);
            }
        }
        let loss = field(&last, "LOSS").to_string();
        match &reference {
            None => reference = Some(loss),
            Some(r) if *r != loss => bail!("`{mode}` computed the result digest {loss}, the cold process {r}"),
            Some(_) => {}
        }
        let load = if loads.is_empty() { String::new() } else { format!("load {:8.1} ms  ", median(loads)) };
        println!(
            "{mode:13} {load}first call {:8.1} ms  steady {:7.1} ms  kernels {}  ({what})",
            median(firsts),
            median(steadies),
            field(&last, "KERNELS"),
        );
        if let Some((first, steady)) = field(&last, "FAULTS").split_once(' ') {
            // Fresh pages: what the first call pays beyond a steady one
            // (each minor fault maps and zeroes 4 KiB).
            println!("{:13} page faults: first call {first}, steady call {steady}", "");
        }
        if mode == "cold" {
            println!(
                "{:13} save {} ms, {} bytes, {} kernels; import {} ms",
                "",
                field(&last, "SAVE"),
                field(&last, "SIZE"),
                field(&last, "ARTIFACT_KERNELS"),
                field(&last, "IMPORT"),
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let ["--child", workload, mode, file] = &args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        return match *mode {
            "cold" => traced(workload, Some(Path::new(file))),
            "traced" => traced(workload, None),
            "load" | "load-nocache" => load(workload, Path::new(file)),
            _ => bail!("unknown child mode {mode}"),
        };
    }
    let mut take = |flag: &str| -> Option<String> {
        let at = args.iter().position(|a| a == flag)?;
        let value = args.get(at + 1).cloned();
        args.drain(at..(at + 2).min(args.len()));
        value
    };
    let workload = take("--workload").unwrap_or_else(|| "w10".into());
    let runs = take("--runs").map_or(Ok(3), |n| n.parse()).context("--runs N")?;
    ensure!(matches!(workload.as_str(), "w10" | "w14" | "w15"), "--workload is w10, w14 or w15");
    match &args[..] {
        [] => drive(&workload, &Path::new("target/artifact_timing").join(&workload), runs),
        [dir] if !dir.starts_with('-') => drive(&workload, &PathBuf::from(dir), runs),
        _ => bail!("usage: artifact_timing [--workload w10|w14|w15] [--runs N] [DIR]"),
    }
}
