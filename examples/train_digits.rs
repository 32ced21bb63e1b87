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

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use digits::{Config, Dataset, EpochStats, Trainer, DATA};
use indicatif::{ProgressBar, ProgressStyle};

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
            "--help" | "-h" => return Ok(None),
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

#[path = "common/logging.rs"]
mod logging;

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
        if opts.eager { "eager" } else { "compiled" },
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

fn epoch_line(epoch: usize, epochs: usize, s: &EpochStats) -> String {
    format!(
        "epoch {epoch:>3}/{epochs}  train loss {:.4}  accuracy {:5.1}%  |  test loss {:.4}  accuracy {:5.1}%",
        s.train_loss,
        100.0 * s.train_accuracy,
        s.test_loss,
        100.0 * s.test_accuracy
    )
}

/// A bar on a terminal; hidden otherwise (the epoch lines still print).
fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Loss (left) and accuracy (right) per epoch, train and test, as SVG.
fn draw_curve(curve: &[EpochStats], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e:?}", path.display());
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(480);
    let epochs = curve.len().max(1) as f64;
    let at = |i: usize| (i + 1) as f64;
    // One polyline per series (plotters' LineSeries needs a feature the
    // workspace does not enable).
    let line = |f: &dyn Fn(&EpochStats) -> f64, color: RGBColor| {
        std::iter::once(PathElement::new(
            curve.iter().enumerate().map(|(i, s)| (at(i), f(s))).collect::<Vec<_>>(),
            color,
        ))
    };
    let blue = RGBColor(0x1f, 0x77, 0xb4);
    let orange = RGBColor(0xff, 0x7f, 0x0e);

    let max_loss = curve.iter().map(|s| s.train_loss.max(s.test_loss)).fold(0.1f32, f32::max) as f64 * 1.05;
    let mut chart = ChartBuilder::on(&left)
        .caption("loss (softmax cross-entropy)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..epochs, 0.0..max_loss)
        .map_err(err)?;
    chart.configure_mesh().x_desc("epoch").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(err)?;
    chart
        .draw_series(line(&|s| s.train_loss as f64, blue))
        .map_err(err)?
        .label("train")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue));
    chart
        .draw_series(line(&|s| s.test_loss as f64, orange))
        .map_err(err)?
        .label("test")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], orange));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(err)?;

    let min_acc = curve.iter().map(|s| s.train_accuracy.min(s.test_accuracy)).fold(1.0f32, f32::min) as f64;
    let low = (min_acc * 100.0 / 10.0).floor() * 10.0;
    let mut chart = ChartBuilder::on(&right)
        .caption("accuracy (%)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..epochs, low.min(90.0)..100.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("epoch").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(err)?;
    let pct = |v: f32| 100.0 * v as f64;
    chart
        .draw_series(line(&|s| pct(s.train_accuracy), blue))
        .map_err(err)?
        .label("train")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue));
    chart
        .draw_series(line(&|s| pct(s.test_accuracy), orange))
        .map_err(err)?
        .label("test")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], orange));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
