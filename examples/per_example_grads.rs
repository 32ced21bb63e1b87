//! Differentially private SGD (DP-SGD, Abadi et al. 2016) on the 8x8
//! handwritten digits, built on `tracejit::vmap_axes` over one example's
//! gradient: every step computes each example's gradient (one batched
//! graph, not a loop over the examples), clips it to norm `C`, sums the
//! clipped gradients, adds Gaussian noise of standard deviation `σ·C`
//! from a `tracejit::random::Generator`, and averages. The same MLP is
//! also trained by plain SGD; the example prints both test accuracies and
//! times per compiled step.
//!
//! ```sh
//! cargo run --release --example per_example_grads
//! cargo run --release --example per_example_grads -- --epochs 5 --sigma 0.5
//! ```

#[path = "digits/mod.rs"]
mod digits;

use std::time::Instant;

use anyhow::{bail, Context};
use digits::{permutation, Dataset, CLASSES, DATA, PIXELS};
use tracejit::prelude::*;
use tracejit::random::Generator;

const USAGE: &str = "\
per_example_grads: DP-SGD (per-example clipping + Gaussian noise) vs plain SGD on the digits MLP

options:
  --epochs N   passes over the training set (default 20)
  --batch N    examples per step (default 64)
  --lr X       learning rate of both (default 0.1)
  --clip C     per-example gradient norm bound (default 1.0)
  --sigma S    noise multiplier: noise std is S * C on the summed gradient (default 1.0)
  --seed N     seeds the weights, the split, the shuffles and the noise (default 0)
  --help       this text";

/// The command line.
pub struct Options {
    /// Passes over the training set.
    pub epochs: usize,
    /// Examples per step.
    pub batch: usize,
    /// Learning rate of both trainings.
    pub lr: f64,
    /// Per-example gradient norm bound.
    pub clip: f64,
    /// Noise multiplier.
    pub sigma: f64,
    /// Seeds everything.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options { epochs: 20, batch: 64, lr: 0.1, clip: 1.0, sigma: 1.0, seed: 0 }
    }
}

/// What a run measured.
pub struct Summary {
    /// DP-SGD's and SGD's test accuracy (0..1).
    pub accuracy: (f64, f64),
    /// Seconds per compiled step, DP-SGD and SGD.
    pub step_seconds: (f64, f64),
    /// How many times each step was traced.
    pub traces: (usize, usize),
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Options>> {
    let mut o = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => o.epochs = value("--epochs")?.parse().context("--epochs")?,
            "--batch" => o.batch = value("--batch")?.parse().context("--batch")?,
            "--lr" => o.lr = value("--lr")?.parse().context("--lr")?,
            "--clip" => o.clip = value("--clip")?.parse().context("--clip")?,
            "--sigma" => o.sigma = value("--sigma")?.parse().context("--sigma")?,
            "--seed" => o.seed = value("--seed")?.parse().context("--seed")?,
            "--help" | "-h" => return Ok(None),
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    if o.batch == 0 || o.clip <= 0.0 || o.sigma < 0.0 {
        bail!("--batch must be positive, --clip positive and --sigma non-negative");
    }
    Ok(Some(o))
}

/// The MLP 64 -> 128 -> 10 as plain tensors `[w1, b1, w2, b2]`, so one
/// example's gradient is a function of them (`vmap_axes` maps the
/// examples, not the parameters).
fn logits(p: &[Tensor], x: &Tensor) -> Tensor {
    let h = (x.matmul(&p[0]) + &p[1]).relu();
    h.matmul(&p[2]) + &p[3]
}

fn loss(p: &[Tensor], x: &Tensor, y: &Tensor) -> Tensor {
    let onehot = y.one_hot(CLASSES, DType::F32);
    tracejit::nn::softmax_cross_entropy_with_logits(&logits(p, x), &onehot).mean_all()
}

/// One example's gradient: `xs` is the four parameters, then an image
/// `[64]` and its label (a scalar).
fn example_grad(xs: Vec<Tensor>) -> Vec<Tensor> {
    let (p, x, y) = (&xs[..4], &xs[4], &xs[5]);
    let tape = GradientTape::new();
    p.iter().for_each(|q| tape.watch(q));
    let l = loss(p, &x.reshape(&[1, -1]), &y.reshape(&[1]));
    let refs: Vec<&Tensor> = p.iter().collect();
    tape.gradient(&l, &refs).expect("differentiable").into_iter().map(|g| g.expect("reaches the loss")).collect()
}

fn init(seed: u64) -> Vec<Variable> {
    let dense = |i: usize, o: usize, s: u64| {
        let w = Tensor::randn(&[i, o], seed * 1000 + s) * (2.0 / i as f64).sqrt();
        [Variable::new(w), Variable::new(Tensor::zeros(&[o], DType::F32))]
    };
    dense(PIXELS, 128, 0).into_iter().chain(dense(128, CLASSES, 1)).collect()
}

/// The DP-SGD step: per-example gradients, clipped, summed, noised,
/// averaged, applied. Returns the batch's mean loss.
fn dp_step(params: Vec<Variable>, noise: Generator, o: &Options) -> Function<(Tensor, Tensor), Tensor> {
    let (lr, clip, sigma) = (o.lr, o.clip, o.sigma);
    function(move |(x, y): (Tensor, Tensor)| {
        let p: Vec<Tensor> = params.iter().map(Variable::read).collect();
        let n = x.shape()[0] as f64;
        let in_axes = [None, None, None, None, Some(0), Some(0)];
        let args = p.iter().cloned().chain([x.clone(), y.clone()]).collect();
        let grads = tracejit::vmap_axes(example_grad, &in_axes, &[0; 4])(args);
        // Each example's norm over all parameters, [batch].
        let squares = grads.iter().map(|g| {
            let axes: Vec<i64> = (1..g.rank() as i64).collect();
            (g * g).sum(&axes, false)
        });
        let norms = squares.reduce(|a, b| a + b).expect("four parameters").sqrt();
        let scale = (norms.reciprocal() * clip).minimum(1.0);
        for ((v, g), q) in params.iter().zip(&grads).zip(&p) {
            let mut shape = vec![-1i64];
            shape.extend(std::iter::repeat_n(1, g.rank() - 1));
            let clipped = (g * scale.reshape(&shape)).sum(&[0], false);
            let noisy = clipped + noise.normal(q.shape(), DType::F32) * (sigma * clip);
            v.assign_sub(&(noisy * (lr / n)));
        }
        loss(&p, &x, &y)
    })
}

/// Plain SGD on the batch's mean loss.
fn sgd_step(params: Vec<Variable>, lr: f64) -> Function<(Tensor, Tensor), Tensor> {
    function(move |(x, y): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let p: Vec<Tensor> = params.iter().map(Variable::read).collect();
        p.iter().for_each(|q| tape.watch(q));
        let l = loss(&p, &x, &y);
        let refs: Vec<&Tensor> = p.iter().collect();
        for (v, g) in params.iter().zip(tape.gradient(&l, &refs).expect("differentiable")) {
            v.assign_sub(&(g.expect("reaches the loss") * lr));
        }
        l
    })
}

/// Trains with `step` for the epochs; returns seconds per step (the first
/// call, which traces and compiles, left out).
fn train(step: &Function<(Tensor, Tensor), Tensor>, train: &Dataset, o: &Options, label: &str) -> anyhow::Result<f64> {
    let (mut steps, mut seconds) = (0usize, 0.0f64);
    for epoch in 0..o.epochs {
        let order = permutation(train.len(), o.seed * 7919 + epoch as u64);
        let mut total = 0.0f32;
        // Whole batches only: one compiled signature.
        for rows in order.chunks_exact(o.batch) {
            let (x, y) = train.subset(rows).tensors();
            let started = Instant::now();
            total += step.call((x, y))?.to_scalar::<f32>()?;
            if step.tracing_count() > 0 && (steps > 0 || epoch > 0) {
                seconds += started.elapsed().as_secs_f64();
            }
            steps += 1;
        }
        let batches = (train.len() / o.batch).max(1);
        if epoch + 1 == o.epochs || (epoch + 1) % 5 == 0 {
            println!("{label}: epoch {}/{}  mean loss {:.4}", epoch + 1, o.epochs, total / batches as f32);
        }
    }
    Ok(seconds / (steps.max(2) - 1) as f64)
}

fn accuracy(params: &[Variable], data: &Dataset) -> anyhow::Result<f64> {
    let (x, y) = data.tensors();
    let p: Vec<Tensor> = params.iter().map(Variable::read).collect();
    let right = logits(&p, &x).argmax(-1, false).eq(&y).cast(DType::F32).sum_all().to_scalar::<f32>()?;
    Ok(f64::from(right) / data.len() as f64)
}

/// Trains the MLP by DP-SGD and by SGD from the same initial weights.
pub fn run(o: &Options) -> anyhow::Result<Summary> {
    let (train_set, test_set) = Dataset::load(DATA)?.split(0.2, o.seed);
    println!(
        "digits: {} training, {} test examples; MLP 64 -> 128 -> 10; batch {}, lr {}, clip {}, noise multiplier {}",
        train_set.len(),
        test_set.len(),
        o.batch,
        o.lr,
        o.clip,
        o.sigma
    );
    let dp_params = init(o.seed);
    let dp = dp_step(dp_params.clone(), Generator::from_seed(o.seed + 1), o);
    let dp_time = train(&dp, &train_set, o, "DP-SGD")?;
    let sgd_params = init(o.seed);
    let sgd = sgd_step(sgd_params.clone(), o.lr);
    let sgd_time = train(&sgd, &train_set, o, "SGD")?;
    Ok(Summary {
        accuracy: (accuracy(&dp_params, &test_set)?, accuracy(&sgd_params, &test_set)?),
        step_seconds: (dp_time, sgd_time),
        traces: (dp.tracing_count(), sgd.tracing_count()),
    })
}

#[allow(dead_code, reason = "the test binary that includes this file calls `run`, not `main`")]
fn main() -> anyhow::Result<()> {
    let Some(o) = parse_args(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    let s = run(&o)?;
    let (dp, sgd) = s.step_seconds;
    println!("time per step: DP-SGD {:.1} µs, SGD {:.1} µs ({:.1}x)", dp * 1e6, sgd * 1e6, dp / sgd);
    println!("compiled: DP-SGD traced {} time(s), SGD {}", s.traces.0, s.traces.1);
    println!("test accuracy: DP-SGD {:.1}%, SGD {:.1}%", 100.0 * s.accuracy.0, 100.0 * s.accuracy.1);
    Ok(())
}
