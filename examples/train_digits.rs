//! Trains an MLP classifier on real data: the handwritten digits that
//! scikit-learn ships (1,797 8x8 images, 10 classes; the UCI "Optical
//! Recognition of Handwritten Digits" data, CC BY 4.0 — see
//! `examples/data/README.md`).
//!
//! A `#[derive(Module)]` MLP (64 -> 128 -> 10), Adam with a cosine-decayed
//! learning rate, and a training step compiled with `function`: forward,
//! loss, backward (a `GradientTape` inside the closure) and the update are
//! one graph, traced once. 20% of the data is held out (fixed-seed
//! shuffle); a progress bar shows the loss and accuracy; after every epoch
//! the model, the optimizer and the curve so far are checkpointed; at the
//! end the loss/accuracy curve is drawn as SVG, and the last line printed is
//! the test accuracy.
//!
//! ```sh
//! cargo run --release --example train_digits                 # train from scratch
//! cargo run --release --example train_digits -- --resume     # continue from the checkpoint
//! cargo run --release --example train_digits -- --help       # every option
//! ```

mod digits;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use digits::{Config, Dataset, Trainer, DATA};
use report::{draw_curve, epoch_line, progress_bar};

const USAGE: &str = "\
train_digits: an MLP on scikit-learn's handwritten digits, trained by tracejit

options:
  --epochs N        passes over the training set (default 30)
  --batch N         examples per step (default 32)
  --lr X            Adam's initial learning rate, cosine-decayed to 10% (default 0.003)
  --hidden N[,N..]  hidden layer widths (default 128)
  --seed N          seeds the weights, the split and the shuffles (default 0)
  --out DIR         where the checkpoint and the SVG curve go (default target/train_digits)
  --resume          continue from DIR/checkpoint.safetensors if it exists
  --eager           run the training step eagerly instead of compiled (for debugging)
  --bf16            products in bf16 with f32 accumulation (mixed precision; weights stay f32)
  --help            this text";

/// The command line.
struct Options {
    config: Config,
    out: PathBuf,
    resume: bool,
    eager: bool,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Options>> {
    let mut o = Options { config: Config::default(), out: "target/train_digits".into(), resume: false, eager: false };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => o.config.epochs = value("--epochs")?.parse().context("--epochs")?,
            "--batch" => o.config.batch = value("--batch")?.parse().context("--batch")?,
            "--lr" => o.config.lr = value("--lr")?.parse().context("--lr")?,
            "--seed" => o.config.seed = value("--seed")?.parse().context("--seed")?,
            "--hidden" => {
                o.config.hidden =
                    value("--hidden")?.split(',').map(str::parse).collect::<Result<_, _>>().context("--hidden")?
            }
            "--out" => o.out = value("--out")?.into(),
            "--resume" => o.resume = true,
            "--eager" => o.eager = true,
            "--bf16" => o.config.bf16 = true,
            "--help" | "-h" => return Ok(None),
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

#[path = "common/logging.rs"]
mod logging;
#[path = "common/report.rs"]
mod report;

fn main() -> anyhow::Result<()> {
    logging::init();
    let Some(opts) = parse_args(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    let data = Dataset::load(DATA)?;
    let trainer = Trainer::new(opts.config.clone(), &data, !opts.eager)?;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let checkpoint = opts.out.join("checkpoint.safetensors");
    println!(
        "digits: {} training and {} test examples; MLP 64 -> {:?} -> 10, {} parameters; {} steps of {} per epoch ({})",
        trainer.train.len(),
        trainer.test.len(),
        opts.config.hidden,
        tracejit::Module::summary(&trainer.state.model).total_parameters,
        trainer.steps_per_epoch(),
        opts.config.batch,
        match (opts.eager, opts.config.bf16) {
            (true, _) => "eager",
            (false, true) => "compiled, bf16 products",
            (false, false) => "compiled",
        },
    );
    if opts.resume && checkpoint.exists() {
        trainer.restore(&checkpoint)?;
        println!("resumed from {} after epoch {}", checkpoint.display(), trainer.state.epochs_done()?);
    } else if opts.resume {
        println!("no checkpoint at {}: starting from scratch", checkpoint.display());
    }

    let epochs = opts.config.epochs;
    let steps = trainer.steps_per_epoch();
    let done = trainer.state.epochs_done()?;
    let bar = progress_bar(((epochs - done) * steps) as u64);
    let started = Instant::now();
    for epoch in done..epochs {
        let (mut loss, mut right, mut n) = (0.0f32, 0.0f32, 0.0f32);
        let stats = trainer.run_epoch(|s| {
            (loss, right, n) = (loss + s.loss, right + s.accuracy, n + 1.0);
            bar.set_message(format!(
                "epoch {}/{epochs}  loss {:.4}  accuracy {:.1}%",
                epoch + 1,
                loss / n,
                100.0 * right / n
            ));
            bar.inc(1);
        })?;
        trainer.save(&checkpoint)?;
        bar.suspend(|| println!("{}", epoch_line(epoch + 1, epochs, &stats)));
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    // Nothing is traced when a resumed run has no epoch left.
    if let Some((f, cf)) = trainer.compiled.as_ref().and_then(|f| Some((f, f.concrete_functions().first()?.clone()))) {
        let kernels = cf.schedule_stats().map(|s| s.to_string()).unwrap_or_else(|| "the interpreter".into());
        println!("compiled step: traced {} time(s); one step runs {kernels}", f.tracing_count());
    }
    println!("trained {} epoch(s) in {seconds:.2} s; checkpoint {}", epochs - done, checkpoint.display());

    let svg = opts.out.join("curve.svg");
    draw_curve(&trainer.state.curve()?, &svg)?;
    println!("curve: {}", svg.display());
    let (_, accuracy) = trainer.evaluate(&trainer.test)?;
    println!("test accuracy: {:.1}%", 100.0 * accuracy);
    Ok(())
}
