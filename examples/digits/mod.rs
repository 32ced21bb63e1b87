//! The handwritten-digits classifier that `examples/train_digits.rs` trains
//! and `tests/api/train_digits.rs` checks: the data set, a fixed-seed split and
//! shuffle, an MLP as a `#[derive(Module)]`, Adam, and one training step
//! that runs either compiled (`function`, one trace) or eagerly (the same
//! closure, called directly).
//!
//! Everything that decides a number lives here, so the example and its
//! test train the same model; the example adds the command line, the
//! progress bar and the SVG curve.
//!
//! Reproducibility: weights come from `Tensor::randn` with seeds derived
//! from [`Config::seed`], and epoch `e` visits the training set in an order
//! that depends only on the seed and `e`. A run resumed from the checkpoint
//! of epoch `e` therefore continues exactly as the uninterrupted run would
//! have.

#![allow(dead_code, reason = "shared by the example and its test, which use different parts")]

use std::path::Path;

use anyhow::{bail, ensure, Context};
use tracejit::optim::{Adam, LearningRate, Optimizer};
use tracejit::prelude::*;

/// The data set, converted once by `examples/data/make_digits.py`.
pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/digits.safetensors");

/// Pixels per image (8x8).
pub const PIXELS: usize = 64;

/// Digits 0..9.
pub const CLASSES: usize = 10;

/// What a run trains, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Hidden layer widths (the input has 64 pixels, the output 10 logits).
    pub hidden: Vec<usize>,
    /// Passes over the training set.
    pub epochs: usize,
    /// Examples per step; the last partial batch of an epoch is skipped
    /// (a different one every epoch), so every step has one shape and the
    /// compiled step is traced once.
    pub batch: usize,
    /// Adam's initial learning rate (cosine decay to 10% over the run).
    pub lr: f64,
    /// Seeds the weights, the split and the shuffles.
    pub seed: u64,
    /// Fraction of the data held out for testing.
    pub test_fraction: f64,
    /// Compiled steps run their products in bf16 with f32 accumulation
    /// (`Function::mixed_precision`); weights, gradients and Adam stay f32.
    pub bf16: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config { hidden: vec![128], epochs: 30, batch: 32, lr: 3e-3, seed: 0, test_fraction: 0.2, bf16: false }
    }
}

/// Images and labels, row-major.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// `len() * 64` pixels in [0, 1].
    pub images: Vec<f32>,
    /// The digit of each image.
    pub labels: Vec<i64>,
}

impl Dataset {
    /// Reads `images` (f32 `[n, 64]`) and `labels` (i64 `[n]`) from a
    /// safetensors file with `tracejit::checkpoint::read`.
    pub fn load(path: impl AsRef<Path>) -> anyhow::Result<Dataset> {
        let path = path.as_ref();
        let mut tensors = tracejit::checkpoint::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mut take = |key: &str, dtype: DType| -> anyhow::Result<Tensor> {
            let t = tensors.remove(key).with_context(|| format!("{}: no tensor `{key}`", path.display()))?;
            ensure!(t.dtype() == dtype, "{}: `{key}` is {}, expected {dtype}", path.display(), t.dtype());
            Ok(t)
        };
        let (images, labels) = (take("images", DType::F32)?, take("labels", DType::I64)?);
        let n = labels.shape().first().copied().unwrap_or(0);
        ensure!(
            images.shape() == [n, PIXELS] && labels.shape() == [n],
            "{}: images {:?} and labels {:?} do not form [n, {PIXELS}] and [n]",
            path.display(),
            images.shape(),
            labels.shape()
        );
        let data = Dataset { images: images.to_vec()?, labels: labels.to_vec()? };
        if let Some(bad) = data.labels.iter().find(|&&l| !(0..CLASSES as i64).contains(&l)) {
            bail!("{}: label {bad} is not a digit", path.display());
        }
        Ok(data)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The examples at `rows`, in that order.
    pub fn subset(&self, rows: &[usize]) -> Dataset {
        Dataset {
            images: rows.iter().flat_map(|&r| &self.images[r * PIXELS..(r + 1) * PIXELS]).copied().collect(),
            labels: rows.iter().map(|&r| self.labels[r]).collect(),
        }
    }

    /// Images `[n, 64]` (f32) and labels `[n]` (i64) as tensors.
    pub fn tensors(&self) -> (Tensor, Tensor) {
        (
            Tensor::from_vec(self.images.clone(), &[self.len(), PIXELS]),
            Tensor::from_vec(self.labels.clone(), &[self.len()]),
        )
    }

    /// Shuffles with `seed`, then holds out the first `test_fraction` of the
    /// examples (rounded) as the test set: `(train, test)`.
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let order = permutation(self.len(), seed);
        let n_test = (self.len() as f64 * test_fraction).round() as usize;
        (self.subset(&order[n_test..]), self.subset(&order[..n_test]))
    }
}

/// SplitMix64: a tiny, well-mixed generator; enough for shuffling.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias.
    fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next();
            if x < zone {
                return (x % n) as usize;
            }
        }
    }
}

/// `0..n` shuffled by Fisher-Yates with `seed`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

/// `y = x @ w + b`.
#[derive(Module, Clone)]
pub struct Dense {
    /// `[inputs, outputs]`.
    pub w: Variable,
    /// `[outputs]`.
    pub b: Variable,
}

/// Dense layers with relu between them; the last layer gives logits.
#[derive(Module, Clone)]
pub struct Mlp {
    /// Input to output.
    pub layers: Vec<Dense>,
}

impl Mlp {
    /// Layers between consecutive `sizes`, He-initialized from `seed`.
    pub fn new(sizes: &[usize], seed: u64) -> Mlp {
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, io)| Dense {
                w: Variable::new(Tensor::randn(&[io[0], io[1]], seed * 1000 + i as u64) * (2.0 / io[0] as f64).sqrt()),
                b: Variable::new(Tensor::zeros(&[io[1]], DType::F32)),
            })
            .collect();
        Mlp { layers }
    }

    /// Logits `[n, 10]` of images `[n, 64]`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = h.matmul(&layer.w.read()) + layer.b.read();
            if i + 1 < self.layers.len() {
                h = h.relu();
            }
        }
        h
    }
}

/// Mean softmax cross-entropy of `logits` against integer `labels`, and how
/// many predictions are right (an f32 scalar).
pub fn loss_and_correct(logits: &Tensor, labels: &Tensor) -> (Tensor, Tensor) {
    let onehot = labels.one_hot(CLASSES, logits.dtype());
    let loss = tracejit::nn::softmax_cross_entropy_with_logits(logits, &onehot).mean(&[0], false);
    let correct = logits.argmax(-1, false).eq(labels).cast(DType::F32).sum_all();
    (loss, correct)
}

/// Everything a checkpoint holds: the model, the optimizer (its moments and
/// step count), the epochs done, and the curve so far.
#[derive(Module, Clone)]
pub struct TrainState {
    /// The classifier.
    pub model: Mlp,
    /// Its optimizer; checkpoints name its slots after the model's paths
    /// (`opt.m.model.layers[0].w`).
    pub opt: Adam,
    /// Epochs completed (i64 scalar).
    pub epoch: Variable,
    /// Per epoch: train loss, train accuracy, test loss, test accuracy
    /// (f32 `[epochs, 4]`; rows not reached yet are zero).
    pub history: Variable,
}

impl TrainState {
    /// A fresh model and optimizer for `config`, with the optimizer's slots
    /// built up front (a checkpoint restores into it either way: slots not
    /// built yet take their values when the first step builds them).
    pub fn new(config: &Config, steps_per_epoch: usize) -> TrainState {
        let mut sizes = vec![PIXELS];
        sizes.extend(&config.hidden);
        sizes.push(CLASSES);
        let model = Mlp::new(&sizes, config.seed);
        let total_steps = (config.epochs * steps_per_epoch).max(1) as f64;
        let opt = Adam::new(LearningRate::CosineDecay { initial: config.lr, steps: total_steps, alpha: 0.1 });
        opt.build_for(&model);
        let frozen = |t: Tensor| Variable::new(t).with_trainable(false);
        TrainState {
            model,
            opt,
            epoch: frozen(Tensor::zeros(&[], DType::I64)),
            history: frozen(Tensor::zeros(&[config.epochs, 4], DType::F32)),
        }
    }

    /// Epochs completed.
    pub fn epochs_done(&self) -> anyhow::Result<usize> {
        Ok(self.epoch.value().to_scalar::<i64>()? as usize)
    }

    /// The metrics of the epochs completed.
    pub fn curve(&self) -> anyhow::Result<Vec<EpochStats>> {
        let h = self.history.value().to_vec::<f32>()?;
        Ok(h.chunks(4)
            .take(self.epochs_done()?)
            .map(|r| EpochStats { train_loss: r[0], train_accuracy: r[1], test_loss: r[2], test_accuracy: r[3] })
            .collect())
    }
}

/// One epoch's figures (accuracies as fractions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// Mean of the epoch's step losses (each before its update).
    pub train_loss: f32,
    /// Accuracy over the epoch's batches (each before its update).
    pub train_accuracy: f32,
    /// Loss on the held-out set after the epoch.
    pub test_loss: f32,
    /// Accuracy on the held-out set after the epoch.
    pub test_accuracy: f32,
}

/// One step's result: the batch loss and accuracy before the update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Mean cross-entropy of the batch.
    pub loss: f32,
    /// Fraction of the batch classified right.
    pub accuracy: f32,
}

type StepFn = Box<dyn Fn(Tensor, Tensor) -> tracejit::Result<(Tensor, Tensor)> + Send + Sync>;

/// Forward, loss, backward and the Adam update; returns the loss and the
/// number of right predictions, both from before the update.
fn train_step(model: &Mlp, opt: &Adam, vars: &[Variable], x: &Tensor, labels: &Tensor) -> (Tensor, Tensor) {
    let tape = GradientTape::new();
    let logits = model.forward(x);
    let (loss, correct) = loss_and_correct(&logits, labels);
    let grads = tape.gradient(&loss, vars).expect("the weights are f32 and the tape is fresh");
    let grads: Vec<Tensor> = grads
        .into_iter()
        .zip(vars)
        .map(|(g, v)| g.unwrap_or_else(|| panic!("variable `{}` does not reach the loss", v.name())))
        .collect();
    opt.apply_gradients(&grads, vars);
    (loss, correct)
}

/// A model being trained on a split of the digits.
pub struct Trainer {
    /// What is trained and checkpointed.
    pub state: TrainState,
    /// The settings.
    pub config: Config,
    /// The training examples.
    pub train: Dataset,
    /// The held-out examples.
    pub test: Dataset,
    step: StepFn,
    eval: StepFn,
    /// The compiled training step, when the trainer compiles (for its trace
    /// count and schedule).
    pub compiled: Option<Function<(Tensor, Tensor), (Tensor, Tensor)>>,
}

impl Trainer {
    /// Splits `data` by `config`, builds a fresh [`TrainState`], and a
    /// training step that is compiled (`compiled`) or runs eagerly.
    pub fn new(config: Config, data: &Dataset, compiled: bool) -> anyhow::Result<Trainer> {
        ensure!(config.batch > 0, "the batch size must be at least 1");
        ensure!((0.0..1.0).contains(&config.test_fraction), "the test fraction must be in [0, 1)");
        let (train, test) = data.split(config.test_fraction, config.seed);
        ensure!(
            train.len() >= config.batch,
            "{} training examples do not fill one batch of {}",
            train.len(),
            config.batch
        );
        let state = TrainState::new(&config, train.len() / config.batch);
        let (model, opt) = (state.model.clone(), state.opt.clone());
        let vars = model.trainable_variables();
        let body = move |(x, labels): (Tensor, Tensor)| train_step(&model, &opt, &vars, &x, &labels);
        let model = state.model.clone();
        let eval_body = move |(x, labels): (Tensor, Tensor)| loss_and_correct(&model.forward(&x), &labels);
        let (step, eval, compiled): (StepFn, StepFn, _) = if compiled {
            let precision = if config.bf16 { DType::BF16 } else { DType::F32 };
            let f = function(body).name("digits_train_step").mixed_precision(precision);
            let e = function(eval_body).name("digits_eval").mixed_precision(precision);
            let g = f.clone();
            (Box::new(move |x, y| g.call((x, y))), Box::new(move |x, y| e.call((x, y))), Some(f))
        } else {
            (Box::new(move |x, y| Ok(body((x, y)))), Box::new(move |x, y| Ok(eval_body((x, y)))), None)
        };
        Ok(Trainer { state, config, train, test, step, eval, compiled })
    }

    /// Full batches per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.train.len() / self.config.batch
    }

    /// The order epoch `epoch` visits the training set in.
    pub fn epoch_order(&self, epoch: usize) -> Vec<usize> {
        permutation(self.train.len(), self.config.seed ^ (0x5eed_0000 + epoch as u64))
    }

    /// Trains one epoch (the next one), telling `on_step` every step's
    /// figures; then evaluates on the test set and records the epoch in
    /// the state.
    pub fn run_epoch(&self, mut on_step: impl FnMut(StepStats)) -> anyhow::Result<EpochStats> {
        let epoch = self.state.epochs_done()?;
        ensure!(epoch < self.config.epochs, "all {} epochs are done", self.config.epochs);
        let order = self.epoch_order(epoch);
        let (mut loss_sum, mut correct_sum) = (0.0f64, 0.0f64);
        let steps = self.steps_per_epoch();
        for rows in order.chunks_exact(self.config.batch) {
            let (x, labels) = self.train.subset(rows).tensors();
            let (loss, correct) = (self.step)(x, labels)?;
            let (loss, correct) = (loss.to_scalar::<f32>()?, correct.to_scalar::<f32>()?);
            ensure!(loss.is_finite(), "epoch {}: the loss is {loss}", epoch + 1);
            loss_sum += f64::from(loss);
            correct_sum += f64::from(correct);
            on_step(StepStats { loss, accuracy: correct / self.config.batch as f32 });
        }
        let (test_loss, test_accuracy) = self.evaluate(&self.test)?;
        let stats = EpochStats {
            train_loss: (loss_sum / steps as f64) as f32,
            train_accuracy: (correct_sum / (steps * self.config.batch) as f64) as f32,
            test_loss,
            test_accuracy,
        };
        let mut history = self.state.history.value().to_vec::<f32>()?;
        history[epoch * 4..epoch * 4 + 4].copy_from_slice(&[
            stats.train_loss,
            stats.train_accuracy,
            stats.test_loss,
            stats.test_accuracy,
        ]);
        self.state.history.assign(&Tensor::from_vec(history, &[self.config.epochs, 4]));
        self.state.epoch.assign(&Tensor::scalar(epoch as i64 + 1));
        Ok(stats)
    }

    /// Loss and accuracy of the model on `data`, in one call.
    pub fn evaluate(&self, data: &Dataset) -> anyhow::Result<(f32, f32)> {
        if data.is_empty() {
            return Ok((f32::NAN, f32::NAN));
        }
        let (x, labels) = data.tensors();
        let (loss, correct) = (self.eval)(x, labels)?;
        Ok((loss.to_scalar::<f32>()?, correct.to_scalar::<f32>()? / data.len() as f32))
    }

    /// Saves the state (model, optimizer, epoch, curve) atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        tracejit::checkpoint::save(&self.state, path).with_context(|| format!("saving {}", path.display()))
    }

    /// Restores the state saved by [`Trainer::save`] for the same model
    /// settings. The number of epochs may differ (`--epochs 35` extends a
    /// finished 30-epoch run): the curve is resized to this run's epochs,
    /// which must cover the epochs already done.
    pub fn restore(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        // The curve's rows are the epochs the run was started with: restore
        // it into a variable of the saved shape (the clones share every
        // other variable), then copy its rows over.
        let saved = tracejit::checkpoint::read(path).with_context(|| format!("reading {}", path.display()))?;
        let done = saved.get("epoch").map(|e| e.to_scalar::<i64>()).transpose()?.unwrap_or(0) as usize;
        ensure!(
            done <= self.config.epochs,
            "{} holds {done} epochs, more than the {} asked for; pass --epochs {done} or more",
            path.display(),
            self.config.epochs
        );
        let rows = saved.get("history").map_or(self.config.epochs, |h| h.shape()[0]);
        let staged = TrainState {
            model: self.state.model.clone(),
            opt: self.state.opt.clone(),
            epoch: self.state.epoch.clone(),
            history: Variable::new(Tensor::zeros(&[rows, 4], DType::F32)).with_trainable(false),
        };
        tracejit::checkpoint::restore(&staged, path).with_context(|| {
            format!("restoring {} (a checkpoint resumes only with the settings it was made with)", path.display())
        })?;
        let mut curve = staged.history.value().to_vec::<f32>()?;
        curve.resize(self.config.epochs * 4, 0.0);
        self.state.history.assign(&Tensor::from_vec(curve, &[self.config.epochs, 4]));
        Ok(())
    }
}
