//! W10 (`gpt_train_step`) shipped as an artifact, timed in fresh
//! processes: what a program that loads a saved step pays before its first
//! step, against tracing and compiling it, and against a steady step. The
//! figures of README's "Shipping compiled functions" come from here.
//!
//! ```sh
//! cargo build --release -p tracejit-bench --bin artifact_timing
//! taskset -c 0 target/release/artifact_timing [--runs N] [DIR]   # DIR: default target/artifact_timing
//! ```
//!
//! The driver runs this binary again as child processes, `--runs` times
//! each (the median is printed): `cold` traces and compiles W10 with an
//! empty compile cache and saves the artifact; `traced` traces it again
//! with that (now warm) cache; `load` loads the artifact with the warm
//! cache, and `load-nocache` with none (its kernels come from the file).
//! Every child checks that its loss is the cold process's, bit for bit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use tracejit::{function, Tensor};
use tracejit_bench::transformer::{gpt_args, gpt_train_step};

/// Steady calls timed after the first (the median is reported).
const STEADY: usize = 5;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// W10's arguments flattened in signature order (tokens, parameters,
/// first moments, second moments, step).
fn flat_args() -> Vec<Tensor> {
    let (tok, p, m, v, step) = gpt_args();
    let mut flat = vec![tok];
    flat.extend(p);
    flat.extend(m);
    flat.extend(v);
    flat.push(step);
    flat
}

/// The loss (W10's last result) as bits.
fn loss_bits(outs: &[Tensor]) -> anyhow::Result<u32> {
    Ok(outs.last().context("no results")?.to_scalar::<f32>()?.to_bits())
}

fn report(first: f64, steady: Vec<f64>, loss: u32) {
    let st = tracejit::config::compile_cache_stats();
    println!("FIRST {first:.3}");
    println!("STEADY {:.3}", median(steady));
    println!("LOSS {loss:08x}");
    println!("KERNELS hits={} misses={}", st.hits, st.misses);
}

/// Traces W10, calls it, and (`save`) saves it as an artifact.
fn traced(save: Option<&Path>) -> anyhow::Result<()> {
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
    if let Some(path) = save {
        let cf = f.concrete_functions().first().cloned().context("no trace")?;
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
fn load(path: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    let a = tracejit::artifact::load(path)?;
    println!("LOAD {:.3}", ms(t));
    ensure!(a.executor_kind() == "jit", "the artifact runs in the {}", a.executor_kind());
    let args = flat_args();
    let t = Instant::now();
    let outs = a.call(&args)?;
    let first = ms(t);
    let steady = (0..STEADY)
        .map(|_| {
            let t = Instant::now();
            a.call(&args).map(|_| ms(t))
        })
        .collect::<Result<Vec<f64>, _>>()?;
    report(first, steady, loss_bits(&outs)?);
    Ok(())
}

/// One child's figures, by tag.
fn child(mode: &str, file: &Path, cache: Option<&Path>) -> anyhow::Result<Vec<(String, String)>> {
    let mut c = Command::new(std::env::current_exe()?);
    c.args(["--child", mode]).arg(file);
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
fn drive(dir: &Path, runs: usize) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let file = dir.join("w10.tjx");
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
            last = child(mode, &file, cache_dir)?;
            firsts.push(field(&last, "FIRST").parse::<f64>()?);
            steadies.push(field(&last, "STEADY").parse::<f64>()?);
            if let Ok(l) = field(&last, "LOAD").parse::<f64>() {
                loads.push(l);
            }
        }
        let loss = field(&last, "LOSS").to_string();
        match &reference {
            None => reference = Some(loss),
            Some(r) if *r != loss => bail!("`{mode}` computed the loss {loss}, the cold process {r}"),
            Some(_) => {}
        }
        let load = if loads.is_empty() { String::new() } else { format!("load {:8.1} ms  ", median(loads)) };
        println!(
            "{mode:13} {load}first call {:8.1} ms  steady {:7.1} ms  kernels {}  ({what})",
            median(firsts),
            median(steadies),
            field(&last, "KERNELS"),
        );
        if mode == "cold" {
            println!(
                "{:13} save {} ms, {} bytes, {} kernels",
                "",
                field(&last, "SAVE"),
                field(&last, "SIZE"),
                field(&last, "ARTIFACT_KERNELS")
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--child", "cold", file] => traced(Some(Path::new(file))),
        ["--child", "traced", _] => traced(None),
        ["--child", "load" | "load-nocache", file] => load(Path::new(file)),
        ["--runs", n, ref rest @ ..] => {
            let dir = rest.first().map_or_else(|| PathBuf::from("target/artifact_timing"), PathBuf::from);
            drive(&dir, n.parse().context("--runs N")?)
        }
        [] => drive(Path::new("target/artifact_timing"), 3),
        [dir] if !dir.starts_with('-') => drive(Path::new(dir), 3),
        _ => bail!("usage: artifact_timing [--runs N] [DIR]"),
    }
}
