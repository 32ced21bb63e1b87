//! The convolutional digits classifier that `examples/train_cnn_digits.rs`
//! trains and `tests/api/train_cnn_digits.rs` checks: the digits of
//! `examples/digits` (same data set, split and shuffles) as `[1, 8, 8]`
//! images, a CNN as a `#[derive(Module)]` — two 3x3 convolutions with
//! batch norm and relu, a 2x2 max pool, a dense layer — Adam, and a
//! training step that runs compiled (`function`, one trace) or eagerly.
//!
//! Batch norm normalizes by the batch in the training step and by its
//! moving statistics when evaluating; the statistics are non-trainable
//! variables of the model, so the checkpoint holds them and a resumed or
//! exported model predicts as the trained one did.

#![allow(dead_code, reason = "shared by the example and its test, which use different parts")]

use std::path::Path;

use anyhow::{ensure, Context};
use tracejit::nn::{batch_norm, conv2d, max_pool2d, Conv2dOptions};
use tracejit::optim::{Adam, LearningRate, Optimizer};
use tracejit::prelude::*;

use super::digits::{permutation, Dataset, EpochStats, StepStats, CLASSES};

/// What a run trains, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Channels of the two convolutions.
    pub channels: [usize; 2],
    /// Passes over the training set.
    pub epochs: usize,
    /// Examples per step (the last partial batch of an epoch is skipped).
    pub batch: usize,
    /// Adam's initial learning rate (cosine decay to 10% over the run).
    pub lr: f64,
    /// Seeds the weights, the split and the shuffles.
    pub seed: u64,
    /// Fraction of the data held out for testing.
    pub test_fraction: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config { channels: [16, 32], epochs: 20, batch: 32, lr: 1e-2, seed: 0, test_fraction: 0.2 }
    }
}

/// Batch norm's momentum (TF's form: the old value's weight).
pub const MOMENTUM: f64 = 0.9;
/// Batch norm's epsilon.
pub const EPS: f64 = 1e-5;

/// A 3x3 convolution (padding 1, no bias: batch norm's beta is one),
/// batch norm and relu.
#[derive(Module, Clone)]
pub struct ConvBn {
    /// `[out, in, 3, 3]`.
    pub w: Variable,
    /// Batch norm's scale `[out]`.
    pub gamma: Variable,
    /// Batch norm's shift `[out]`.
    pub beta: Variable,
    /// Moving mean `[out]` (non-trainable).
    pub mean: Variable,
    /// Moving variance `[out]` (non-trainable).
    pub var: Variable,
}

impl ConvBn {
    fn new(inputs: usize, outputs: usize, seed: u64) -> ConvBn {
        let fan_in = (inputs * 9) as f64;
        let frozen = |t: Tensor| Variable::new(t).with_trainable(false);
        ConvBn {
            w: Variable::new(Tensor::randn(&[outputs, inputs, 3, 3], seed) * (2.0 / fan_in).sqrt()),
            gamma: Variable::new(Tensor::ones(&[outputs], DType::F32)),
            beta: Variable::new(Tensor::zeros(&[outputs], DType::F32)),
            mean: frozen(Tensor::zeros(&[outputs], DType::F32)),
            var: frozen(Tensor::ones(&[outputs], DType::F32)),
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let y = conv2d(x, &self.w.read(), None, Conv2dOptions::default().padding(1));
        batch_norm(&y, &self.gamma.read(), &self.beta.read(), &self.mean, &self.var, MOMENTUM, EPS, training).relu()
    }
}

/// The classifier: conv-bn-relu, conv-bn-relu, 2x2 max pool, dense.
#[derive(Module, Clone)]
pub struct Cnn {
    /// 1 -> channels[0].
    pub conv1: ConvBn,
    /// channels[0] -> channels[1].
    pub conv2: ConvBn,
    /// `[channels[1] · 16, 10]`.
    pub w: Variable,
    /// `[10]`.
    pub b: Variable,
}

impl Cnn {
    /// He-initialized from `seed`.
    pub fn new(channels: [usize; 2], seed: u64) -> Cnn {
        let flat = channels[1] * 16;
        Cnn {
            conv1: ConvBn::new(1, channels[0], seed * 1000),
            conv2: ConvBn::new(channels[0], channels[1], seed * 1000 + 1),
            w: Variable::new(Tensor::randn(&[flat, CLASSES], seed * 1000 + 2) * (1.0 / flat as f64).sqrt()),
            b: Variable::new(Tensor::zeros(&[CLASSES], DType::F32)),
        }
    }

    /// Logits `[n, 10]` of images `[n, 64]` (batch statistics when
    /// `training`, which also updates the moving ones).
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = x.reshape(&[-1, 1, 8, 8]);
        let h = self.conv2.forward(&self.conv1.forward(&x, training), training);
        let h = max_pool2d(&h, [2, 2], [2, 2], [0, 0]);
        let flat = self.w.shape()[0] as i64;
        h.reshape(&[-1, flat]).matmul(&self.w.read()) + self.b.read()
    }
}

/// Mean softmax cross-entropy and the count of right predictions.
pub fn loss_and_correct(logits: &Tensor, labels: &Tensor) -> (Tensor, Tensor) {
    super::digits::loss_and_correct(logits, labels)
}

/// Everything a checkpoint holds: the model (with its batch norm
/// statistics), the optimizer, the epochs done and the curve so far.
#[derive(Module, Clone)]
pub struct TrainState {
    /// The classifier.
    pub model: Cnn,
    /// Its optimizer.
    pub opt: Adam,
    /// Epochs completed (i64 scalar).
    pub epoch: Variable,
    /// Per epoch: train loss, train accuracy, test loss, test accuracy.
    pub history: Variable,
}

impl TrainState {
    fn new(config: &Config, steps_per_epoch: usize) -> TrainState {
        let model = Cnn::new(config.channels, config.seed);
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

type StepFn = Box<dyn Fn(Tensor, Tensor) -> tracejit::Result<(Tensor, Tensor)> + Send + Sync>;

/// A CNN being trained on a split of the digits.
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
    /// The compiled training step, when the trainer compiles.
    pub compiled: Option<Function<(Tensor, Tensor), (Tensor, Tensor)>>,
}

impl Trainer {
    /// Splits `data` by `config` (as the MLP example does), builds a fresh
    /// state and a training step, compiled or eager.
    pub fn new(config: Config, data: &Dataset, compiled: bool) -> anyhow::Result<Trainer> {
        ensure!(config.batch > 1, "batch norm needs batches of at least 2");
        let (train, test) = data.split(config.test_fraction, config.seed);
        ensure!(train.len() >= config.batch, "{} training examples do not fill one batch", train.len());
        let state = TrainState::new(&config, train.len() / config.batch);
        let (model, opt) = (state.model.clone(), state.opt.clone());
        let vars = model.trainable_variables();
        let body = move |(x, labels): (Tensor, Tensor)| {
            let tape = GradientTape::new();
            let (loss, correct) = loss_and_correct(&model.forward(&x, true), &labels);
            let grads = tape.gradient(&loss, &vars).expect("f32 weights and a fresh tape");
            let grads: Vec<Tensor> = grads.into_iter().map(|g| g.expect("every weight reaches the loss")).collect();
            opt.apply_gradients(&grads, &vars);
            (loss, correct)
        };
        let model = state.model.clone();
        let eval_body = move |(x, labels): (Tensor, Tensor)| loss_and_correct(&model.forward(&x, false), &labels);
        let (step, eval, compiled): (StepFn, StepFn, _) = if compiled {
            let f = function(body).name("cnn_digits_train_step");
            let e = function(eval_body).name("cnn_digits_eval");
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

    /// Trains the next epoch, telling `on_step` every step's figures, then
    /// evaluates on the test set and records the epoch.
    pub fn run_epoch(&self, mut on_step: impl FnMut(StepStats)) -> anyhow::Result<EpochStats> {
        let epoch = self.state.epochs_done()?;
        ensure!(epoch < self.config.epochs, "all {} epochs are done", self.config.epochs);
        let order = permutation(self.train.len(), self.config.seed ^ (0x5eed_0000 + epoch as u64));
        let (mut loss_sum, mut correct_sum) = (0.0f64, 0.0f64);
        for rows in order.chunks_exact(self.config.batch) {
            let (x, labels) = self.train.subset(rows).tensors();
            let (loss, correct) = (self.step)(x, labels)?;
            let (loss, correct) = (loss.to_scalar::<f32>()?, correct.to_scalar::<f32>()?);
            ensure!(loss.is_finite(), "epoch {}: the loss is {loss}", epoch + 1);
            loss_sum += f64::from(loss);
            correct_sum += f64::from(correct);
            on_step(StepStats { loss, accuracy: correct / self.config.batch as f32 });
        }
        let steps = self.steps_per_epoch();
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

    /// Loss and accuracy on `data` with the moving statistics.
    pub fn evaluate(&self, data: &Dataset) -> anyhow::Result<(f32, f32)> {
        let (x, labels) = data.tensors();
        let (loss, correct) = (self.eval)(x, labels)?;
        Ok((loss.to_scalar::<f32>()?, correct.to_scalar::<f32>()? / data.len().max(1) as f32))
    }

    /// The inference function (logits of images `[n, 64]`, any `n`),
    /// traced for export.
    pub fn predictor(&self) -> anyhow::Result<std::sync::Arc<ConcreteFunction>> {
        let model = self.state.model.clone();
        let f = function(move |x: Tensor| model.forward(&x, false)).name("cnn_digits");
        Ok(f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, super::digits::PIXELS as i64]))?)
    }

    /// Saves the state atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        tracejit::checkpoint::save(&self.state, path).with_context(|| format!("saving {}", path.display()))
    }

    /// Restores the state saved by [`Trainer::save`] with the same model
    /// settings. As in `train_digits`, the number of epochs may grow (the
    /// curve is resized), but not below the epochs already done.
    pub fn restore(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        let saved = tracejit::checkpoint::read(path).with_context(|| format!("reading {}", path.display()))?;
        let done = saved.get("epoch").map(|e| e.to_scalar::<i64>()).transpose()?.unwrap_or(0) as usize;
        ensure!(
            done <= self.config.epochs,
            "{} holds {done} epochs, more than the {} asked for; pass --epochs {done} or more",
            path.display(),
            self.config.epochs
        );
        // The curve has the saved run's rows: restore it into a variable
        // of that shape (the clones share every other variable).
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
