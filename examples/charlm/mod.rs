//! The character-level language model that `examples/train_charlm.rs`
//! trains and `tests/api/train_charlm.rs` checks: a corpus (by default
//! *War and Peace*, public domain; FreeBSD's fortunes one option away —
//! see `examples/data/README.md`) split into training text and the last
//! 10% for validation, the GPT of [`model`], AdamW, a compiled training step
//! with dropout drawn from a [`Generator`] inside the step, a compiled
//! evaluation, and a sampler that generates a whole sample in one
//! compiled call.
//!
//! Reproducibility: weights come from `Tensor::randn` with seeds derived
//! from [`Config::seed`]; step `k` of epoch `e` reads windows whose starts
//! depend only on the seed, `e` and `k`; dropout's generator is part of
//! the checkpoint. A run resumed from the checkpoint of epoch `e`
//! continues as the uninterrupted run would have.
//!
//! Data-parallel ([`Trainer::data_parallel`]): each rank of an MPI world
//! trains on its rows of the same global batch, drawing its rows' part of
//! the whole batch's dropout masks, and `average_gradients` gives every
//! rank the whole batch's gradient; the step returns the whole batch's
//! loss (an all-reduce of the ranks' means). Nothing in the state depends
//! on the rank or the number of ranks, so a checkpoint written by rank 0
//! resumes on any number of ranks, and the curve is one process's up to
//! the order of the sums.

#![allow(dead_code, reason = "shared by the example and its test, which use different parts")]

pub mod model;

use std::ops::Range;
use std::path::Path;

use anyhow::{ensure, Context};
use tracejit::distributed::{self, ReduceOp, World};
use tracejit::optim::{Adam, LearningRate, Optimizer};
use tracejit::prelude::*;
use tracejit::random::Generator;

pub use model::{Gpt, Shape};

/// The default corpus: *War and Peace* (Project Gutenberg #2600, the Maude
/// translation), 3.2 MB.
pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/war_and_peace.txt");

/// The first corpus: `fortunes` from the FreeBSD fortune package, 2.1 MB
/// (a harder text; `--data` selects it).
pub const FORTUNES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/fortunes.txt");

/// Text as token ids over its own alphabet.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The distinct bytes, sorted: token `i` is `alphabet[i]`.
    pub alphabet: Vec<u8>,
    /// Training text (the first 90%).
    pub train: Vec<i64>,
    /// Validation text (the last 10%).
    pub valid: Vec<i64>,
}

impl Corpus {
    /// Reads `path` and holds out its last `valid_fraction` for validation.
    pub fn load(path: impl AsRef<Path>, valid_fraction: f64) -> anyhow::Result<Corpus> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Corpus::from_bytes(&bytes, valid_fraction))
    }

    /// `bytes` as a corpus; the last `valid_fraction` is validation text.
    pub fn from_bytes(bytes: &[u8], valid_fraction: f64) -> Corpus {
        let mut seen = [false; 256];
        for &b in bytes {
            seen[b as usize] = true;
        }
        let alphabet: Vec<u8> = (0..=255u8).filter(|&b| seen[b as usize]).collect();
        let mut index = [0i64; 256];
        for (i, &b) in alphabet.iter().enumerate() {
            index[b as usize] = i as i64;
        }
        let ids: Vec<i64> = bytes.iter().map(|&b| index[b as usize]).collect();
        let split = ids.len() - (ids.len() as f64 * valid_fraction).round() as usize;
        Corpus { alphabet, train: ids[..split].to_vec(), valid: ids[split..].to_vec() }
    }

    /// Token ids as text (ids outside the alphabet show as `?`).
    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter().map(|&i| self.alphabet.get(i as usize).map_or('?', |&b| b as char)).collect()
    }

    /// Text as token ids; an error names the first byte the corpus lacks.
    pub fn encode(&self, text: &str) -> anyhow::Result<Vec<i64>> {
        text.bytes()
            .map(|b| {
                self.alphabet
                    .binary_search(&b)
                    .map(|i| i as i64)
                    .map_err(|_| anyhow::anyhow!("the corpus has no character {:?}", b as char))
            })
            .collect()
    }
}

/// What a run trains, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Context length (W10: 128).
    pub context: usize,
    /// Model width (W10: 256).
    pub width: usize,
    /// Attention heads (W10: 4).
    pub heads: usize,
    /// Blocks (W10: 2).
    pub blocks: usize,
    /// Windows per step.
    pub batch: usize,
    /// Passes over the training text (each `train.len() / (batch * context)` steps).
    pub epochs: usize,
    /// AdamW's peak learning rate (linear warm-up, then cosine decay to 10%).
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// AdamW's second-moment decay.
    pub beta2: f64,
    /// AdamW's decoupled weight decay (on every parameter, as W10).
    pub weight_decay: f64,
    /// Dropout on the embeddings and residual branches while training.
    pub dropout: f64,
    /// Seeds the weights, the windows and dropout.
    pub seed: u64,
    /// Stop an epoch after this many steps (tests; `None`: the whole text).
    pub max_steps_per_epoch: Option<usize>,
    /// Products in bf16 with f32 accumulation (`Function::mixed_precision`)
    /// in the training and evaluation steps; weights and AdamW stay f32.
    /// By default where the CPU multiplies bf16 natively ([`native_bf16`]).
    pub bf16: bool,
}

/// Whether this CPU has AVX-512 BF16 (`vdpbf16ps`), where bf16 products
/// run at twice the f32 rate; elsewhere they run on a portable path no
/// faster than f32.
pub fn native_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

impl Default for Config {
    fn default() -> Config {
        Config {
            context: 128,
            width: 256,
            heads: 4,
            blocks: 2,
            batch: 16,
            epochs: 3,
            lr: 4e-3,
            warmup: 100,
            beta2: 0.999,
            weight_decay: 0.01,
            dropout: 0.05,
            seed: 0,
            max_steps_per_epoch: None,
            bf16: native_bf16(),
        }
    }
}

/// SplitMix64: window starts.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Everything a checkpoint holds.
#[derive(Module, Clone)]
pub struct TrainState {
    /// The language model.
    pub model: Gpt,
    /// AdamW; its slots are named after the model's paths.
    pub opt: Adam,
    /// Dropout's random stream (checkpointed, so a resumed run draws what
    /// the uninterrupted one would have).
    pub dropout: Generator,
    /// Epochs completed (i64 scalar).
    pub epoch: Variable,
    /// Per epoch: mean training loss and validation loss, in bits per
    /// character (f32 `[epochs, 2]`; rows not reached are zero).
    pub history: Variable,
}

/// One epoch's figures, in bits per character.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// Mean of the epoch's step losses (with dropout).
    pub train_bpc: f32,
    /// The validation text's loss after the epoch.
    pub valid_bpc: f32,
}

type StepFn = Function<Tensor, Tensor>;

/// A model being trained on a corpus.
pub struct Trainer {
    /// What is trained and checkpointed.
    pub state: TrainState,
    /// The settings.
    pub config: Config,
    /// The model's sizes.
    pub shape: Shape,
    /// The text.
    pub corpus: Corpus,
    /// The compiled step: tokens `[batch, context]` to the loss (nats).
    pub step: StepFn,
    /// The compiled evaluation: tokens `[n, t]` to the summed loss (nats).
    pub eval: StepFn,
    /// The MPI world this trainer shares each batch with (data-parallel),
    /// or `None` (the whole batch in this process).
    pub world: Option<World>,
}

/// Nats to bits.
pub fn bits(nats: f64) -> f64 {
    nats / std::f64::consts::LN_2
}

impl Trainer {
    /// A fresh model for `config` on `corpus`, with its compiled step.
    pub fn new(config: Config, corpus: Corpus) -> anyhow::Result<Trainer> {
        Trainer::build(config, corpus, None)
    }

    /// A trainer for this rank of `world`: its step trains on the rank's
    /// rows of each batch ([`Trainer::rows`]), averages the gradients over
    /// the ranks and returns the whole batch's loss; validation splits the
    /// windows between the ranks. Every rank must build the same trainer and
    /// make the same calls. In a world of one it trains exactly as
    /// [`Trainer::new`] (the collectives return their inputs).
    pub fn data_parallel(config: Config, corpus: Corpus, world: World) -> anyhow::Result<Trainer> {
        let n = world.size();
        ensure!(
            config.batch.is_multiple_of(n),
            "--batch {} does not split evenly between {n} ranks (each rank takes an equal share)",
            config.batch
        );
        // Each rank's dropout masks start `rows * context * width` elements
        // into the whole batch's; a Philox block holds 4 f32 uniforms.
        let share = config.batch / n * config.context * config.width;
        ensure!(
            n == 1 || share.is_multiple_of(4),
            "a rank's share of the batch ({} windows of {} x {}) must hold a multiple of 4 activations",
            config.batch / n,
            config.context,
            config.width
        );
        Trainer::build(config, corpus, Some(world))
    }

    fn build(config: Config, corpus: Corpus, world: Option<World>) -> anyhow::Result<Trainer> {
        ensure!(config.batch > 0 && config.context >= 2, "batch and context must be positive (context at least 2)");
        ensure!(config.heads > 0 && config.width.is_multiple_of(config.heads), "the width must divide into the heads");
        ensure!(
            corpus.train.len() > config.batch * config.context && corpus.valid.len() >= config.context,
            "the corpus is too short for one batch"
        );
        let shape = Shape {
            vocab: corpus.alphabet.len(),
            context: config.context,
            width: config.width,
            heads: config.heads,
            blocks: config.blocks,
        };
        let model = Gpt::new(&shape, config.seed);
        let steps_per_epoch = steps_per_epoch(&config, &corpus);
        let total = (config.epochs * steps_per_epoch).max(config.warmup + 1) as f64;
        let schedule = LearningRate::Warmup {
            steps: config.warmup as f64,
            then: Box::new(LearningRate::CosineDecay { initial: config.lr, steps: total, alpha: 0.1 }),
        };
        let opt = Adam::new(schedule).betas(0.9, config.beta2).weight_decay(config.weight_decay);
        opt.build_for(&model);
        let frozen = |t: Tensor| Variable::new(t).with_trainable(false);
        let state = TrainState {
            model,
            opt,
            dropout: Generator::from_seed(config.seed ^ 0xd20f),
            epoch: frozen(Tensor::zeros(&[], DType::I64)),
            history: frozen(Tensor::zeros(&[config.epochs, 2], DType::F32)),
        };
        let (m, opt, g, p) = (state.model.clone(), state.opt.clone(), state.dropout.clone(), config.dropout);
        let vars = m.trainable_variables();
        let precision = if config.bf16 { DType::BF16 } else { DType::F32 };
        let first_row = world.map_or(0, |w| w.rank() * config.batch / w.size());
        let parallel = world.is_some();
        let step = function(move |tokens: Tensor| {
            let tape = GradientTape::new();
            let loss = m.loss(&tokens, &shape, Some((&g, p, first_row)));
            let grads = tape.gradient(&loss, &vars).expect("f32 weights on a fresh tape");
            let grads: Vec<Tensor> = grads
                .into_iter()
                .zip(&vars)
                .map(|(g, v)| g.unwrap_or_else(|| panic!("`{}` does not reach the loss", v.name())))
                .collect();
            if !parallel {
                opt.apply_gradients(&grads, &vars);
                return loss;
            }
            // The mean over ranks of their means is the whole batch's mean
            // (equal shares).
            opt.apply_gradients(&distributed::average_gradients(&grads), &vars);
            distributed::all_reduce(&loss, ReduceOp::Mean)
        })
        .name("charlm_train_step")
        .mixed_precision(precision);
        let m = state.model.clone();
        let eval = function(move |tokens: Tensor| {
            let n = tokens.dims()[0].expect("a known batch") as f64;
            m.loss(&tokens, &shape, None) * n
        })
        .name("charlm_eval")
        .mixed_precision(precision);
        Ok(Trainer { state, config, shape, corpus, step, eval, world })
    }

    /// Steps per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        steps_per_epoch(&self.config, &self.corpus)
    }

    /// The rows of each batch this trainer trains on: all of them, or this
    /// rank's share.
    pub fn rows(&self) -> Range<usize> {
        let b = self.config.batch;
        self.world.map_or(0..b, |w| w.rank() * b / w.size()..(w.rank() + 1) * b / w.size())
    }

    /// Tokens `[batch, context]` of step `k` of epoch `e`: windows at
    /// starts drawn from the seed, `e` and `k`.
    pub fn batch(&self, epoch: usize, k: usize) -> Tensor {
        self.batch_rows(epoch, k, 0..self.config.batch)
    }

    /// Rows `rows` of [`Trainer::batch`] (a row depends on the seed, the
    /// epoch, the step and its index in the whole batch only).
    pub fn batch_rows(&self, epoch: usize, k: usize, rows: Range<usize>) -> Tensor {
        let (b, t) = (self.config.batch, self.config.context);
        let span = (self.corpus.train.len() - t) as u64;
        let mut ids = Vec::with_capacity(rows.len() * t);
        let n = rows.len();
        for row in rows {
            let key = self.config.seed.wrapping_mul(0x1000_0000_01b3) ^ ((epoch as u64) << 40) ^ ((k * b + row) as u64);
            let start = (splitmix(key) % (span + 1)) as usize;
            ids.extend_from_slice(&self.corpus.train[start..start + t]);
        }
        Tensor::from_vec(ids, &[n, t])
    }

    /// Trains the next epoch, telling `on_step` each step's loss (nats);
    /// evaluates and records the epoch in the state.
    pub fn run_epoch(&self, mut on_step: impl FnMut(f32)) -> anyhow::Result<EpochStats> {
        let epoch = self.state.epoch.value().to_scalar::<i64>()? as usize;
        ensure!(epoch < self.config.epochs, "all {} epochs are done", self.config.epochs);
        let steps = self.steps_per_epoch();
        let mut sum = 0.0f64;
        for k in 0..steps {
            let loss = self.step.call(self.batch_rows(epoch, k, self.rows()))?.to_scalar::<f32>()?;
            ensure!(loss.is_finite(), "epoch {}, step {k}: the loss is {loss}", epoch + 1);
            sum += f64::from(loss);
            on_step(loss);
        }
        let stats =
            EpochStats { train_bpc: bits(sum / steps.max(1) as f64) as f32, valid_bpc: self.validation_bpc()? as f32 };
        let mut history = self.state.history.value().to_vec::<f32>()?;
        history[epoch * 2..epoch * 2 + 2].copy_from_slice(&[stats.train_bpc, stats.valid_bpc]);
        self.state.history.assign(&Tensor::from_vec(history, &[self.config.epochs, 2]));
        self.state.epoch.assign(&Tensor::scalar(epoch as i64 + 1));
        Ok(stats)
    }

    /// Bits per character of the validation text: windows of `context`
    /// characters overlapping by one, so every character after the first
    /// is predicted once, from up to `context - 1` before it. Data-parallel
    /// ranks take every `size`-th group of windows and add their sums.
    pub fn validation_bpc(&self) -> anyhow::Result<f64> {
        let (rank, size) = self.world.map_or((0, 1), |w| (w.rank(), w.size()));
        let (t, text) = (self.config.context, &self.corpus.valid);
        let windows: Vec<&[i64]> =
            (0..text.len().saturating_sub(1)).step_by(t - 1).map(|s| &text[s..(s + t).min(text.len())]).collect();
        let (full, tail): (Vec<_>, Vec<_>) = windows.into_iter().partition(|w| w.len() == t);
        let (mut nats, mut count) = (0.0f64, 0usize);
        // Batches of 32 full windows, then the rest, then the short tail:
        // at most three traces of the evaluation.
        for group in full.chunks(32).chain(tail.chunks(1)).skip(rank).step_by(size) {
            let len = group[0].len();
            if len < 2 {
                continue;
            }
            let ids: Vec<i64> = group.iter().flat_map(|w| w.iter().copied()).collect();
            let sum = self.eval.call(Tensor::from_vec(ids, &[group.len(), len]))?.to_scalar::<f32>()?;
            nats += f64::from(sum) * (len - 1) as f64;
            count += group.len() * (len - 1);
        }
        if self.world.is_some() {
            let sums = Tensor::from_vec(vec![nats, count as f64], &[2]);
            let all = distributed::try_all_reduce(&sums, ReduceOp::Sum)?.to_vec::<f64>()?;
            (nats, count) = (all[0], all[1] as usize);
        }
        Ok(bits(nats / count.max(1) as f64))
    }

    /// Saves the state atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        tracejit::checkpoint::save(&self.state, path).with_context(|| format!("saving {}", path.display()))
    }

    /// Restores a state saved with the same settings.
    pub fn restore(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let path = path.as_ref();
        tracejit::checkpoint::restore(&self.state, path).with_context(|| {
            format!("restoring {} (a checkpoint resumes only with the settings it was made with)", path.display())
        })
    }

    /// Epochs completed.
    pub fn epochs_done(&self) -> anyhow::Result<usize> {
        Ok(self.state.epoch.value().to_scalar::<i64>()? as usize)
    }

    /// The figures of the epochs completed.
    pub fn curve(&self) -> anyhow::Result<Vec<EpochStats>> {
        let h = self.state.history.value().to_vec::<f32>()?;
        Ok(h.chunks(2).take(self.epochs_done()?).map(|r| EpochStats { train_bpc: r[0], valid_bpc: r[1] }).collect())
    }
}

fn steps_per_epoch(config: &Config, corpus: &Corpus) -> usize {
    let whole = corpus.train.len() / (config.batch * config.context);
    config.max_steps_per_epoch.map_or(whole, |m| m.min(whole)).max(1)
}

/// A compiled sampler: `(prompt [1, p] i64, temperature f32 scalar)` to
/// `length` new token ids, generated in one call.
///
/// One `fori_loop` over the positions: each trip runs the model on one
/// token against per-block key/value caches `[1, H, context, dh]`
/// (written with `dynamic_update_slice`), divides the logits by the
/// temperature and draws the next token with `Generator::categorical`.
/// When the context is full, a `cond` re-reads the last half of it as a
/// fresh prefix (positions restart at 0) and sampling goes on.
pub fn sampler(model: &Gpt, shape: Shape, g: &Generator, length: usize) -> Function<(Tensor, Tensor), Tensor> {
    let (model, g) = (model.clone(), g.clone());
    function(move |(prompt, temperature): (Tensor, Tensor)| sample(&model, &shape, &g, &prompt, &temperature, length))
        .name("charlm_sample")
}

/// The caches, the window of tokens at positions `0..=at` (and one more),
/// and `at` after reading `keep` (`[1, m]`, `1 <= m <= context`) as a
/// prefix: its first `m - 1` tokens fill the caches; its last is next.
fn prefill(model: &Gpt, s: &Shape, keep: &Tensor) -> (Vec<(Tensor, Tensor)>, Tensor, Tensor) {
    let m = keep.dims()[1].expect("a known prefix length");
    let empty = Tensor::zeros(&[1, s.heads, s.context, s.head_width()], DType::F32);
    let origin = Tensor::from_vec(vec![0i64; 4], &[4]);
    let caches = if m > 1 {
        let (_, kv) = model.forward(&keep.slice_axis(1, 0, m as i64 - 1), s, None);
        kv.iter()
            .map(|(k, v)| (empty.dynamic_update_slice(k, &origin), empty.dynamic_update_slice(v, &origin)))
            .collect()
    } else {
        vec![(empty.clone(), empty); s.blocks]
    };
    let window = Tensor::zeros(&[1, s.context + 1], DType::I64)
        .dynamic_update_slice(keep, &Tensor::from_vec(vec![0i64, 0], &[2]));
    (caches, window, Tensor::scalar(m as i64 - 1))
}

type SampleState = (Vec<(Tensor, Tensor)>, Tensor, Tensor, Tensor, Tensor);

/// What [`sampler`] compiles, callable eagerly too.
pub fn sample(model: &Gpt, s: &Shape, g: &Generator, prompt: &Tensor, temperature: &Tensor, length: usize) -> Tensor {
    let p = prompt.dims()[1].expect("a known prompt length");
    assert!((1..=s.context).contains(&p), "the prompt must have 1 to {} characters, got {p}", s.context);
    let (caches, window, at) = prefill(model, s, prompt);
    let token = prompt.slice_axis(1, p as i64 - 1, p as i64);
    let init: SampleState = (caches, window, at, token, Tensor::zeros(&[length], DType::I64));
    let half = s.context / 2;
    let (.., out) = tracejit::fori_loop(
        0,
        length as i64,
        |i, (caches, window, at, token, out): SampleState| {
            let full = at.ge(s.context as i64);
            let keep = window.slice_axis(1, (s.context + 1 - half) as i64, s.context as i64 + 1);
            let (caches, window, at) =
                tracejit::cond(&full, || prefill(model, s, &keep), || (caches.clone(), window.clone(), at.clone()));
            let (logits, caches) = model.step(&token, &at, &caches, s);
            let next = g.categorical(&(logits / temperature), 1);
            let out = out.dynamic_update_slice(&next.reshape(&[1]), &i.reshape(&[1]));
            let at = at.add(1i64);
            let window = window.dynamic_update_slice(&next, &Tensor::stack(&[&Tensor::scalar(0i64), &at], 0));
            (caches, window, at, next, out)
        },
        init,
    );
    out
}
