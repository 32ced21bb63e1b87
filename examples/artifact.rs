//! Ships compiled functions as files. Trains the digits MLP of
//! `examples/digits` (10 epochs), saves its training step and its forward
//! with `tracejit::artifact::save`, then runs this example again as a second
//! process (`serve FILE`) that loads the forward with no closure and no
//! tracing and classifies the held-out digits. Both processes keep their
//! kernels in one persistent compile cache
//! (`tracejit::config::set_compile_cache`); each prints its
//! `compile_cache_stats()`: the server compiles nothing.
//!
//! ```sh
//! cargo run --release --example artifact                                     # train, save, serve
//! cargo run --release --example artifact -- serve target/artifact/forward.tjx  # serve only
//! ```

mod digits;
#[path = "common/logging.rs"]
mod logging;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context};
use digits::{Config, Dataset, Trainer, DATA, PIXELS};
use tracejit::prelude::*;

const OUT: &str = "target/artifact";

fn print_cache_stats(who: &str) {
    let st = tracejit::config::compile_cache_stats();
    println!("{who}: {} kernels compiled, {} found (compile cache or artifact)", st.misses, st.hits);
}

/// Trains, saves both functions, and serves the forward in a child process.
fn train_and_save(out: &Path) -> anyhow::Result<()> {
    let config = Config { epochs: 10, ..Config::default() };
    let trainer = Trainer::new(config.clone(), &Dataset::load(DATA)?, true)?;
    trainer.state.assign_names(); // artifacts name variables by module path
    for _ in 0..config.epochs {
        trainer.run_epoch(|_| {})?;
    }
    let (_, accuracy) = trainer.evaluate(&trainer.test)?;
    println!("trained {} epochs: test accuracy {:.1}% (in this process)", config.epochs, 100.0 * accuracy);

    let step = trainer.compiled.as_ref().and_then(|f| f.concrete_functions().first().cloned()).context("no trace")?;
    tracejit::artifact::save(&step, out.join("step.tjx"))?;
    // The forward for any batch size: one trace with an unknown leading dim.
    let model = trainer.state.model.clone();
    let forward = function(move |x: Tensor| model.forward(&x)).name("digits_forward");
    let cf = forward.get_concrete_function(TensorSpec::new(DType::F32, &[-1, PIXELS as i64]))?;
    tracejit::artifact::save(&cf, out.join("forward.tjx"))?;
    println!("saved {} and {}", out.join("step.tjx").display(), out.join("forward.tjx").display());
    print_cache_stats("trainer");

    let status =
        std::process::Command::new(std::env::current_exe()?).arg("serve").arg(out.join("forward.tjx")).status()?;
    ensure!(status.success(), "the serving process failed: {status}");
    Ok(())
}

/// Loads the forward from `file` and classifies the held-out digits.
fn serve(file: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let forward = tracejit::artifact::load(file)?;
    let loaded = started.elapsed();
    let config = Config::default();
    let (_, test) = Dataset::load(DATA)?.split(config.test_fraction, config.seed);
    let (images, labels) = test.tensors();
    let started = Instant::now();
    let logits = forward.call(&[images])?.remove(0);
    let called = started.elapsed();
    let right = logits.argmax(-1, false).eq(&labels).cast(DType::F32).sum_all().to_scalar::<f32>()?;
    println!(
        "server: loaded `{}` in {:.1} ms ({} variables, run by the {}); first call {:.1} ms",
        forward.name(),
        loaded.as_secs_f64() * 1e3,
        forward.variables().len(),
        forward.executor_kind(),
        called.as_secs_f64() * 1e3
    );
    println!("server: test accuracy {:.1}% on {} digits", 100.0 * right / test.len() as f32, test.len());
    print_cache_stats("server");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    logging::init();
    let out = PathBuf::from(OUT);
    tracejit::config::set_compile_cache(Some(out.join("cache")));
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, file] if cmd == "serve" => serve(Path::new(file)),
        [] => {
            std::fs::create_dir_all(&out)?;
            train_and_save(&out)
        }
        _ => anyhow::bail!("usage: artifact [serve FILE]"),
    }
}
