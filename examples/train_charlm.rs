//! Trains a character-level GPT on real text: Tolstoy's *War and Peace* in
//! the Maude translation (3.2 MB, public domain — see
//! `examples/data/README.md`) by default, or any text file (`--data`;
//! FreeBSD's fortunes ship beside it), the last 10% held out for
//! validation.
//!
//! The model is W10's (two pre-norm blocks of width 256 with 4 heads and
//! causal attention, learned positions over 128 characters, an LM head
//! without bias) with dropout 0.05, trained by AdamW with warm-up and
//! cosine decay. The training step — forward, loss, backward, update, and
//! dropout's random numbers drawn from a `Generator` inside it — is one
//! compiled function, traced once. A progress bar shows the loss and the
//! tokens per second; each epoch is checkpointed (model, optimizer,
//! generator, curve) and `--resume` continues; the curve is drawn as SVG.
//! At the end one compiled call generates a 300-character sample (a
//! `fori_loop` over positions with a KV cache), and the last line is the
//! validation loss in bits per character.
//!
//! ```sh
//! cargo run --release --example train_charlm                 # train from scratch
//! cargo run --release --example train_charlm -- --resume     # continue from the checkpoint
//! cargo run --release --example train_charlm -- --help       # every option
//! ```
//!
//! `--data-parallel` trains over MPI (build with `--features mpi`; run
//! under `mpiexec -n N`): each rank takes `1/N` of every batch, the
//! gradients are averaged between the ranks inside the compiled step, the
//! loss shown is the whole batch's, and rank 0 alone writes the checkpoint
//! and the curve. The checkpoint holds nothing about ranks, so `--resume`
//! continues it on any number of them (the batches depend on the step
//! only); outside `mpiexec` the same command trains as without the flag.
//!
//! ```sh
//! cargo build --release --features mpi --example train_charlm
//! TRACEJIT_NUM_THREADS=1 mpiexec -n 2 target/release/examples/train_charlm --data-parallel
//! ```

mod charlm;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use charlm::{Config, Corpus, EpochStats, Trainer, DATA};
use indicatif::{ProgressBar, ProgressStyle};
use tracejit::distributed::{self, World};
use tracejit::prelude::*;

const USAGE: &str = "\
train_charlm: a character-level GPT on War and Peace (or any text), trained by tracejit

options:
  --epochs N        passes over the training text (default 3)
  --batch N         windows of 128 characters per step (default 16)
  --lr X            AdamW's peak learning rate (default 0.004)
  --beta2 X         AdamW's second-moment decay (default 0.999)
  --weight-decay X  AdamW's decoupled weight decay (default 0.01)
  --warmup N        steps of linear warm-up (default 100)
  --dropout P       dropout rate while training (default 0.05)
  --steps N         stop each epoch after N steps (default: the whole text)
  --seed N          seeds the weights, the windows and dropout (default 0)
  --prompt TEXT     the sample's start (default: a new line)
  --temperature X   the sample's temperature (default 0.8)
  --data FILE       the text to train on, last 10% held out (default: examples/data/war_and_peace.txt;
                    examples/data/fortunes.txt with --prompt % is the other corpus shipped)
  --out DIR         where the checkpoint and the SVG curve go (default target/train_charlm)
  --resume          continue from DIR/checkpoint.safetensors if it exists
  --stop-after N    stop after epoch N of --epochs (continue later with --resume)
  --bf16            products in bf16 with f32 accumulation (mixed precision; weights stay f32);
                    the default where the CPU has AVX-512 BF16
  --f32             every product in f32
  --data-parallel   one rank of `mpiexec -n N` (a build with --features mpi): each rank trains on
                    1/N of every batch (N must divide --batch); rank 0 writes the checkpoint and the
                    curve, which resume on any number of ranks; alone, the same as without the flag
  --help            this text";

/// The command line.
struct Options {
    config: Config,
    out: PathBuf,
    data: PathBuf,
    resume: bool,
    data_parallel: bool,
    stop_after: Option<usize>,
    prompt: String,
    temperature: f32,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        config: Config::default(),
        out: "target/train_charlm".into(),
        data: DATA.into(),
        resume: false,
        data_parallel: false,
        stop_after: None,
        prompt: "\n".into(),
        temperature: 0.8,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => o.config.epochs = value("--epochs")?.parse().context("--epochs")?,
            "--batch" => o.config.batch = value("--batch")?.parse().context("--batch")?,
            "--lr" => o.config.lr = value("--lr")?.parse().context("--lr")?,
            "--beta2" => o.config.beta2 = value("--beta2")?.parse().context("--beta2")?,
            "--weight-decay" => o.config.weight_decay = value("--weight-decay")?.parse().context("--weight-decay")?,
            "--warmup" => o.config.warmup = value("--warmup")?.parse().context("--warmup")?,
            "--dropout" => o.config.dropout = value("--dropout")?.parse().context("--dropout")?,
            "--steps" => o.config.max_steps_per_epoch = Some(value("--steps")?.parse().context("--steps")?),
            "--seed" => o.config.seed = value("--seed")?.parse().context("--seed")?,
            "--prompt" => o.prompt = value("--prompt")?,
            "--temperature" => o.temperature = value("--temperature")?.parse().context("--temperature")?,
            "--out" => o.out = value("--out")?.into(),
            "--data" => o.data = value("--data")?.into(),
            "--resume" => o.resume = true,
            "--data-parallel" => o.data_parallel = true,
            "--stop-after" => o.stop_after = Some(value("--stop-after")?.parse().context("--stop-after")?),
            "--bf16" => o.config.bf16 = true,
            "--f32" => o.config.bf16 = false,
            "--help" | "-h" => return Ok(None),
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

#[path = "common/logging.rs"]
mod logging;

/// Where lines go: a data-parallel run's rank 0 prints the run's lines, and
/// every line (and every rank's error) starts with its rank.
struct Log {
    /// `[rank 1/4] ` when data-parallel, empty otherwise.
    tag: String,
    /// Whether this process prints the run's lines.
    root: bool,
}

impl Log {
    fn say(&self, line: impl std::fmt::Display) {
        if self.root {
            println!("{}{line}", self.tag);
        }
    }
}

fn main() -> ExitCode {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let world = match opts.data_parallel.then(distributed::init).transpose() {
        Ok(world) => world,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log = Log {
        tag: world.map_or(String::new(), |w| format!("[rank {}/{}] ", w.rank(), w.size())),
        root: world.is_none_or(|w| w.is_root()),
    };
    logging::init_tagged(&log.tag);
    match run(&opts, world, &log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}error: {e:#}", log.tag);
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options, world: Option<World>, log: &Log) -> anyhow::Result<()> {
    let corpus = Corpus::load(&opts.data, 0.1)?;
    let prompt = corpus.encode(&opts.prompt).context("--prompt must be made of the text's characters")?;
    // Checked before training, not after it: the sampler needs 1 to
    // `context` characters to start from.
    let context = opts.config.context;
    ensure!(
        (1..=context).contains(&prompt.len()),
        "--prompt must have 1 to {context} characters, got {}",
        prompt.len()
    );
    ensure!(
        opts.temperature.is_finite() && opts.temperature > 0.0,
        "--temperature must be above 0, got {}",
        opts.temperature
    );
    let trainer = match world {
        Some(w) => Trainer::data_parallel(opts.config.clone(), corpus, w)?,
        None => Trainer::new(opts.config.clone(), corpus)?,
    };
    if log.root {
        std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    }
    let checkpoint = opts.out.join("checkpoint.safetensors");
    let c = &opts.config;
    log.say(format_args!(
        "{}: {} training and {} validation characters, {} distinct; GPT {} blocks x {} wide, {} heads, \
         context {}, {} parameters; {} steps of {} x {} characters per epoch; products in {}",
        opts.data.file_stem().map_or("the text".into(), |s| s.to_string_lossy()),
        trainer.corpus.train.len(),
        trainer.corpus.valid.len(),
        trainer.shape.vocab,
        c.blocks,
        c.width,
        c.heads,
        c.context,
        tracejit::Module::summary(&trainer.state.model).total_parameters,
        trainer.steps_per_epoch(),
        c.batch,
        c.context,
        if c.bf16 { "bf16 (f32 accumulation; --f32 for f32)" } else { "f32" },
    ));
    if let Some(w) = world {
        // Every rank says which rows it trains on: the one line a rank
        // other than 0 prints when all goes well.
        let rows = trainer.rows();
        println!("{}data-parallel: rows {}..{} of every batch of {}", log.tag, rows.start, rows.end, c.batch);
        if w.size() > 1 && w.is_root() {
            log.say(format_args!("{} ranks; the losses shown are the whole batch's", w.size()));
        }
    }
    // Every rank reads the checkpoint (on a file system they all see).
    if opts.resume && checkpoint.exists() {
        trainer.restore(&checkpoint)?;
        log.say(format_args!("resumed from {} after epoch {}", checkpoint.display(), trainer.epochs_done()?));
    } else if opts.resume {
        log.say(format_args!("no checkpoint at {}: starting from scratch", checkpoint.display()));
    }

    let started = Instant::now();
    let done = trainer.epochs_done()?;
    let last = opts.stop_after.map_or(c.epochs, |n| n.min(c.epochs));
    train(&trainer, last, &checkpoint, log)?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(cf) = trainer.step.concrete_functions().first() {
        let kernels = cf.schedule_stats().map(|s| s.to_string()).unwrap_or_else(|| "the interpreter".into());
        log.say(format_args!(
            "compiled step: traced {} time(s); one step runs {kernels}",
            trainer.step.tracing_count()
        ));
    }
    log.say(format_args!(
        "trained {} epoch(s) in {seconds:.1} s; checkpoint {}",
        last.saturating_sub(done),
        checkpoint.display()
    ));
    if log.root {
        let svg = opts.out.join("curve.svg");
        draw_curve(&trainer.curve()?, &svg)?;
        log.say(format_args!("curve: {}", svg.display()));
        let sample = charlm::sampler(&trainer.state.model, trainer.shape, &trainer.state.dropout, 300);
        let started = Instant::now();
        let prompt_len = prompt.len();
        let ids = sample.call((Tensor::from_vec(prompt, &[1, prompt_len]), Tensor::scalar(opts.temperature)))?;
        let text = trainer.corpus.decode(&ids.to_vec::<i64>()?);
        log.say(format_args!(
            "sample (300 characters at temperature {}, one compiled call, {:.2} s with its compile):\n{}{text}\n",
            opts.temperature,
            started.elapsed().as_secs_f64(),
            opts.prompt
        ));
    }
    // Every rank: data-parallel validation splits the text between them.
    let bpc = trainer.validation_bpc()?;
    log.say(format_args!("validation bits per character: {bpc:.2}"));
    Ok(())
}

/// The epochs up to `last`, each checkpointed (by rank 0 when
/// data-parallel; `checkpoint::save` writes a temporary file and renames
/// it).
fn train(trainer: &Trainer, last: usize, checkpoint: &Path, log: &Log) -> anyhow::Result<()> {
    let c = &trainer.config;
    let (epochs, steps, done) = (c.epochs, trainer.steps_per_epoch(), trainer.epochs_done()?);
    let bar = if log.root { progress_bar((last.saturating_sub(done) * steps) as u64) } else { ProgressBar::hidden() };
    let tokens_per_step = (c.batch * c.context) as f64;
    for epoch in done..last {
        let (mut sum, mut n) = (0.0f64, 0usize);
        let epoch_start = Instant::now();
        let stats = trainer.run_epoch(|loss| {
            (sum, n) = (sum + f64::from(loss), n + 1);
            let rate = n as f64 * tokens_per_step / epoch_start.elapsed().as_secs_f64();
            bar.set_message(format!(
                "{}epoch {}/{epochs}  loss {:.3} bpc  {:.0} tokens/s",
                log.tag,
                epoch + 1,
                charlm::bits(sum / n as f64),
                rate
            ));
            bar.inc(1);
        })?;
        if log.root {
            trainer.save(checkpoint)?;
        }
        let rate = (steps as f64 * tokens_per_step) / epoch_start.elapsed().as_secs_f64();
        bar.suspend(|| {
            log.say(format_args!("{}  ({rate:.0} tokens/s with evaluation)", epoch_line(epoch + 1, epochs, &stats)))
        });
    }
    bar.finish_and_clear();
    Ok(())
}

fn epoch_line(epoch: usize, epochs: usize, s: &EpochStats) -> String {
    format!("epoch {epoch:>2}/{epochs}  train {:.3} bpc  |  validation {:.3} bpc", s.train_bpc, s.valid_bpc)
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

/// Training and validation bits per character per epoch, as SVG.
fn draw_curve(curve: &[EpochStats], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e:?}", path.display());
    let root = SVGBackend::new(path, (640, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let epochs = curve.len().max(1) as f64;
    let top = curve.iter().map(|s| s.train_bpc.max(s.valid_bpc)).fold(1.0f32, f32::max) as f64 * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("bits per character", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.5..epochs + 0.5, 0.0..top)
        .map_err(err)?;
    chart.configure_mesh().x_desc("epoch").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(err)?;
    let blue = RGBColor(0x1f, 0x77, 0xb4);
    let orange = RGBColor(0xff, 0x7f, 0x0e);
    for (name, color, f) in [
        ("train", blue, (|s: &EpochStats| s.train_bpc) as fn(&EpochStats) -> f32),
        ("validation", orange, |s: &EpochStats| s.valid_bpc),
    ] {
        let points: Vec<(f64, f64)> = curve.iter().enumerate().map(|(i, s)| ((i + 1) as f64, f(s) as f64)).collect();
        chart
            .draw_series(std::iter::once(PathElement::new(points.clone(), color)))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
