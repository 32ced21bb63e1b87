//! Runs an ONNX model file through tracejit's importer: prints its
//! signature (inputs, outputs, opset, Variables, static inputs), runs it on
//! the given serialized tensors or on random inputs, and prints the first
//! call's time (import + trace + compile + run), the steady-state time per
//! run and the JIT's profile.
//!
//! ```sh
//! cargo run --release --example onnx_run -- model.onnx                       # random inputs
//! cargo run --release --example onnx_run -- model.onnx input_0.pb input_1.pb --runs 50
//! cargo run --release --example onnx_run -- model.onnx --dim 8               # symbolic dims = 8
//! ```

use std::time::Instant;

use anyhow::{bail, Context};
use tracejit::onnx;
use tracejit::prelude::*;

struct Args {
    model: String,
    inputs: Vec<String>,
    runs: usize,
    dim: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args { model: String::new(), inputs: Vec::new(), runs: 20, dim: 1 };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => parsed.runs = args.next().context("--runs needs a number")?.parse().context("--runs")?,
            "--dim" => parsed.dim = args.next().context("--dim needs a number")?.parse().context("--dim")?,
            "-h" | "--help" => {
                println!("usage: onnx_run MODEL.onnx [INPUT.pb ...] [--runs N] [--dim D]");
                std::process::exit(0);
            }
            _ if parsed.model.is_empty() => parsed.model = a,
            _ => parsed.inputs.push(a),
        }
    }
    if parsed.model.is_empty() {
        bail!("usage: onnx_run MODEL.onnx [INPUT.pb ...] [--runs N] [--dim D]");
    }
    Ok(parsed)
}

/// A random input for a declaration: normal floats, small integers,
/// alternating bools; symbolic dims take `dim`.
fn random_input(info: &onnx::ValueInfo, dim: usize, seed: u64) -> Tensor {
    let shape: Vec<usize> = info.dims.iter().map(|d| d.unwrap_or(dim)).collect();
    let x = Tensor::randn(&shape, seed);
    match info.dtype {
        d if d.is_float() => x.cast(d),
        DType::Bool => x.gt(0.0),
        d => (x * 3.0).floor().abs().cast(d),
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let start = Instant::now();
    let model = onnx::import(&args.model)?;
    let imported = start.elapsed();
    println!("model '{}' (opset {}), imported in {imported:.2?}", model.name(), model.opset());
    for i in model.inputs() {
        println!("  input  {}: {} {:?}", i.name, i.dtype, i.dims);
    }
    for o in model.outputs() {
        println!("  output {}: {} {:?}", o.name, o.dtype, o.dims);
    }
    let vars = model.variables();
    let params: usize = vars.iter().map(|(_, v)| v.shape().iter().product::<usize>()).sum();
    println!("  {} variables ({params} values); static inputs: {:?}", vars.len(), model.static_inputs());

    let inputs: Vec<Tensor> = if args.inputs.is_empty() {
        model.inputs().iter().enumerate().map(|(i, info)| random_input(info, args.dim, i as u64)).collect()
    } else {
        args.inputs.iter().map(|p| onnx::load_tensor(p).with_context(|| p.clone())).collect::<anyhow::Result<_>>()?
    };
    let outs = model.run(&inputs)?;
    println!("first call (import + trace + compile + run): {:.2?}", start.elapsed());
    for (o, info) in outs.iter().zip(model.outputs()) {
        println!("  {}: {} {:?}", info.name, o.dtype(), o.shape());
    }
    let t = Instant::now();
    for _ in 0..args.runs {
        model.run(&inputs)?;
    }
    println!("steady state: {:.3?} per run over {} runs", t.elapsed() / args.runs.max(1) as u32, args.runs);

    let cf = model.function().concrete_functions().into_iter().next().context("the model was not traced")?;
    println!("executor: {}", cf.executor_kind());
    let dynamic: Vec<Tensor> = inputs
        .iter()
        .zip(model.inputs())
        .filter(|(_, info)| !model.static_inputs().contains(&info.name.as_str()))
        .map(|(t, _)| t.clone())
        .collect();
    if let Some(profile) = cf.profile(&dynamic, args.runs.max(1))? {
        println!("{profile}");
    }
    Ok(())
}
