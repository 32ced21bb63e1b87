//! `examples/train_charlm.rs` in short: the example's `charlm` module on
//! its corpus with a small model and a few steps. The loss falls; the
//! compiled step is traced once and runs compiled (its schedule exists);
//! a run resumed from a checkpoint continues exactly as the uninterrupted
//! one (the dropout generator is part of the state); the sampler returns
//! tokens of the corpus from one compiled call, the same ones for the same
//! generator state, and slides its window when the sample outgrows the
//! context.

#[path = "../../examples/charlm/mod.rs"]
mod charlm;

use charlm::{Config, Corpus, Trainer, DATA, FORTUNES};
use tracejit::prelude::*;

fn small(epochs: usize, steps: usize) -> Config {
    Config {
        context: 16,
        width: 32,
        heads: 2,
        blocks: 2,
        batch: 4,
        epochs,
        lr: 3e-3,
        warmup: 5,
        beta2: 0.999,
        weight_decay: 0.01,
        dropout: 0.1,
        seed: 3,
        max_steps_per_epoch: Some(steps),
        bf16: false,
    }
}

fn corpus() -> Corpus {
    Corpus::load(DATA, 0.1).expect("examples/data/war_and_peace.txt loads")
}

fn losses(t: &Trainer) -> Vec<f32> {
    let mut all = Vec::new();
    while t.epochs_done().unwrap() < t.config.epochs {
        t.run_epoch(|l| all.push(l)).unwrap();
    }
    all
}

#[test]
fn the_corpus_splits_its_last_tenth_and_round_trips() {
    let c = corpus();
    assert_eq!(c.train.len() + c.valid.len(), 3_202_742);
    assert_eq!(c.valid.len(), 320_274);
    assert_eq!(c.alphabet.len(), 80);
    assert_eq!(c.decode(&c.train[..13]), "War and Peace");
    let ids = c.encode("\n\"Well, Prince").unwrap();
    assert_eq!(c.decode(&ids), "\n\"Well, Prince");
    let err = c.encode("%").unwrap_err().to_string();
    assert!(err.contains("no character '%'"), "{err}");
}

#[test]
fn the_fortunes_still_load_as_the_other_corpus() {
    let c = Corpus::load(FORTUNES, 0.1).unwrap();
    assert_eq!((c.train.len() + c.valid.len(), c.valid.len(), c.alphabet.len()), (2_167_537, 216_754, 99));
    assert_eq!(c.decode(&c.encode("%\nHello").unwrap()), "%\nHello");
    let err = c.encode("é").unwrap_err().to_string();
    assert!(err.contains("no character"), "{err}");
}

#[test]
fn a_short_run_lowers_the_loss_compiled() {
    let t = Trainer::new(small(1, 60), corpus()).unwrap();
    let l = losses(&t);
    let first: f32 = l[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = l[l.len() - 10..].iter().sum::<f32>() / 10.0;
    // ln(80) = 4.4 nats at random; 60 small steps reach well under it.
    assert!(last < first - 0.5, "the loss did not fall: {first} -> {last}");
    assert_eq!(t.step.tracing_count(), 1);
    let cf = t.step.concrete_functions()[0].clone();
    assert!(cf.schedule_stats().is_some(), "the step ran compiled");
    let curve = t.curve().unwrap();
    assert_eq!(curve.len(), 1);
    assert!(curve[0].valid_bpc.is_finite() && curve[0].valid_bpc < (t.shape.vocab as f32).log2(), "{curve:?}");
}

#[test]
fn a_short_bf16_run_lowers_the_loss_on_the_bf16_gemm() {
    let t = Trainer::new(Config { bf16: true, ..small(1, 60) }, corpus()).unwrap();
    let l = losses(&t);
    let first: f32 = l[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = l[l.len() - 10..].iter().sum::<f32>() / 10.0;
    assert!(last < first - 0.5, "the loss did not fall: {first} -> {last}");
    let stats = t.step.concrete_functions()[0].schedule_stats().unwrap();
    assert!(stats.bf16_gemms > 0 && stats.bf16_gemms == stats.gemms, "{stats}");
    assert!(t.state.model.trainable_variables().iter().all(|v| v.dtype() == DType::F32));
}

#[test]
fn data_parallel_alone_trains_exactly_as_one_process() {
    // `--data-parallel` outside `mpiexec`: a world of one, whose collectives
    // return their inputs, so the same bits step for step (the 2-rank run
    // is tests/distributed_charlm.rs, under mpiexec).
    let world = tracejit::distributed::init().unwrap();
    assert_eq!(world.size(), 1);
    let one = Trainer::new(small(1, 8), corpus()).unwrap();
    let dp = Trainer::data_parallel(small(1, 8), corpus(), world).unwrap();
    assert_eq!(dp.rows(), 0..4);
    let (a, b) = (losses(&one), losses(&dp));
    assert_eq!(a.iter().map(|l| l.to_bits()).collect::<Vec<_>>(), b.iter().map(|l| l.to_bits()).collect::<Vec<_>>());
    assert_eq!(one.curve().unwrap(), dp.curve().unwrap());
    let graph = dp.step.concrete_functions()[0].optimized_graph().to_string();
    assert!(graph.contains("tracejit.distributed.start_bucket"), "the step averages its gradients:\n{graph}");
}

#[test]
fn a_resumed_run_continues_as_the_uninterrupted_one() {
    let dir = std::env::temp_dir().join(format!("tracejit-charlm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("checkpoint.safetensors");
    let whole = Trainer::new(small(2, 6), corpus()).unwrap();
    let all = losses(&whole);

    let first = Trainer::new(small(2, 6), corpus()).unwrap();
    first.run_epoch(|_| {}).unwrap();
    first.save(&path).unwrap();
    let resumed = Trainer::new(small(2, 6), corpus()).unwrap();
    resumed.restore(&path).unwrap();
    let mut rest = Vec::new();
    resumed.run_epoch(|l| rest.push(l)).unwrap();
    assert_eq!(rest, all[6..], "dropout, windows and AdamW continue exactly");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_sampler_generates_in_one_compiled_call_and_slides_its_window() {
    let t = Trainer::new(small(1, 20), corpus()).unwrap();
    losses(&t);
    // 40 tokens on a context of 16: the window slides twice.
    let sampler = charlm::sampler(&t.state.model, t.shape, &t.state.dropout, 40);
    let prompt = Tensor::from_vec(t.corpus.encode("\nAn").unwrap(), &[1, 3]);
    let before = t.state.dropout.state().value().to_vec::<i64>().unwrap();
    let a = sampler.call((prompt.clone(), Tensor::scalar(0.8f32))).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(a.len(), 40);
    assert!(a.iter().all(|&i| (0..t.shape.vocab as i64).contains(&i)), "{a:?}");
    assert_eq!(sampler.tracing_count(), 1);
    assert!(sampler.concrete_functions()[0].schedule_stats().is_some(), "the sampler ran compiled");
    // The generator advanced; from its old state the same sample comes back.
    assert_ne!(t.state.dropout.state().value().to_vec::<i64>().unwrap(), before);
    t.state.dropout.state().assign(&Tensor::from_vec(before, &[before_len()]));
    let b = sampler.call((prompt, Tensor::scalar(0.8f32))).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(a, b);
    assert_eq!(sampler.tracing_count(), 1);
}

/// The generator's state length (counter and key).
fn before_len() -> usize {
    tracejit::random::Generator::from_seed(0).state().value().shape()[0]
}

#[test]
fn the_sampler_gives_the_same_tokens_eagerly_and_compiled() {
    // The sampler's closure run eagerly and compiled agree on the same
    // generator state.
    let t = Trainer::new(small(1, 10), corpus()).unwrap();
    losses(&t);
    let g = tracejit::random::Generator::from_seed(11);
    let sampler = charlm::sampler(&t.state.model, t.shape, &g, 20);
    let prompt = Tensor::from_vec(t.corpus.encode(".\n").unwrap(), &[1, 2]);
    let state = g.state().value();
    let compiled = sampler.call((prompt.clone(), Tensor::scalar(0.5f32))).unwrap().to_vec::<i64>().unwrap();
    g.state().assign(&state);
    let eager = charlm::sample(&t.state.model, &t.shape, &g, &prompt, &Tensor::scalar(0.5f32), 20);
    let eager = eager.to_vec::<i64>().unwrap();
    assert_eq!(compiled, eager);
}
