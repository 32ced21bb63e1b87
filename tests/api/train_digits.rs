//! `examples/train_digits.rs` in short: the same model, data and training
//! step (the example's `digits` module), trained for a few epochs. The loss
//! falls and the held-out accuracy beats 90%; eager and compiled steps give
//! the same losses; a run resumed from a checkpoint continues exactly as
//! the uninterrupted run.

#[path = "../../examples/digits/mod.rs"]
pub(crate) mod digits;

use digits::{Config, Dataset, StepStats, Trainer, DATA};
use tracejit::optim::Optimizer;
use tracejit::prelude::*;

/// The example's model and optimizer, for a few epochs.
fn short(epochs: usize) -> Config {
    Config { epochs, ..Config::default() }
}

fn data() -> Dataset {
    Dataset::load(DATA).expect("examples/data/digits.safetensors loads")
}

fn weights(t: &Trainer) -> Vec<Vec<f32>> {
    t.state.variables().iter().filter(|v| v.dtype() == DType::F32).map(|v| v.value().to_vec().unwrap()).collect()
}

/// Runs the trainer's remaining epochs; returns every step's figures.
fn train(t: &Trainer) -> Vec<StepStats> {
    let mut steps = Vec::new();
    while t.state.epochs_done().unwrap() < t.config.epochs {
        t.run_epoch(|s| steps.push(s)).unwrap();
    }
    steps
}

#[test]
fn the_data_set_is_the_digits() {
    let d = data();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.images.len(), 1797 * 64);
    assert!(d.images.iter().all(|p| (0.0..=1.0).contains(p) && (p * 16.0).fract() == 0.0), "pixels are counts / 16");
    let mut per_class = [0usize; 10];
    d.labels.iter().for_each(|&l| per_class[l as usize] += 1);
    assert!(per_class.iter().all(|&n| (170..=185).contains(&n)), "about 180 of each digit: {per_class:?}");

    // The split is a partition: 20% held out, nothing in both halves.
    let (train, test) = d.split(0.2, 7);
    assert_eq!((train.len(), test.len()), (1438, 359));
    let order = digits::permutation(1797, 7);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1797).collect::<Vec<_>>(), "a permutation");
    assert_ne!(order[..20], sorted[..20], "and a shuffle");
    assert_eq!(digits::permutation(1797, 7), order, "the same for the same seed");
    assert_eq!(test.labels, order[..359].iter().map(|&i| d.labels[i]).collect::<Vec<_>>());
    for n in [0, 1, 3, 5] {
        let mut p = digits::permutation(n, 1);
        p.sort_unstable();
        assert_eq!(p, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn a_short_run_learns_the_digits() {
    let t = Trainer::new(short(3), &data(), true).unwrap();
    let steps = train(&t);
    let curve = t.state.curve().unwrap();
    assert_eq!((steps.len(), curve.len()), (3 * 44, 3));
    let first: f32 = steps[..10].iter().map(|s| s.loss).sum::<f32>() / 10.0;
    let last: f32 = steps[steps.len() - 10..].iter().map(|s| s.loss).sum::<f32>() / 10.0;
    assert!(last < 0.5 * first, "the loss falls: {first} -> {last}");
    assert!(curve.windows(2).all(|w| w[1].train_loss < w[0].train_loss), "every epoch: {curve:?}");
    assert!(curve[2].test_loss < curve[0].test_loss, "{curve:?}");
    let (_, accuracy) = t.evaluate(&t.test).unwrap();
    assert!(accuracy > 0.9, "held-out accuracy {accuracy}");
    assert_eq!(accuracy, curve[2].test_accuracy);
    assert_eq!(t.compiled.as_ref().unwrap().tracing_count(), 1, "one trace for every step");
}

#[test]
fn eager_and_compiled_steps_give_the_same_losses() {
    let d = data();
    let eager = Trainer::new(short(2), &d, false).unwrap();
    let compiled = Trainer::new(short(2), &d, true).unwrap();
    assert!(eager.compiled.is_none());
    assert_eq!(weights(&eager), weights(&compiled), "the same initial weights");
    let (e, c) = (train(&eager), train(&compiled));
    assert_eq!(e.len(), c.len());
    for (i, (a, b)) in e.iter().zip(&c).enumerate() {
        // f32, with the JIT's exp/log approximations and another GEMM's
        // summation order, compounded over the steps (2.4e-7 at worst in
        // one run on an AVX-512 machine; the bound leaves room for others).
        assert!((a.loss - b.loss).abs() <= 1e-4 * a.loss.max(1.0), "step {i}: eager {a:?}, compiled {b:?}");
    }
    let (ce, cc) = (eager.state.curve().unwrap(), compiled.state.curve().unwrap());
    for (a, b) in ce.iter().zip(&cc) {
        assert!((a.test_loss - b.test_loss).abs() <= 1e-4, "{a:?} vs {b:?}");
        assert!((a.test_accuracy - b.test_accuracy).abs() <= 2.0 / 359.0, "{a:?} vs {b:?}");
    }
}

#[test]
fn a_resumed_run_continues_exactly() {
    let d = data();
    let dir = std::env::temp_dir().join(format!("tracejit-train-digits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("checkpoint.safetensors");

    let whole = Trainer::new(short(2), &d, true).unwrap();
    let whole_steps = train(&whole);

    let first = Trainer::new(short(2), &d, true).unwrap();
    first.run_epoch(|_| {}).unwrap();
    first.save(&file).unwrap();
    let resumed = Trainer::new(short(2), &d, true).unwrap();
    resumed.restore(&file).unwrap();
    assert_eq!(resumed.state.epochs_done().unwrap(), 1);
    assert_eq!(resumed.state.opt.iterations().value().to_scalar::<i64>().unwrap(), 44);
    let rest = train(&resumed);
    assert_eq!(rest, whole_steps[44..], "the second epoch's steps, bit for bit");
    assert_eq!(weights(&resumed), weights(&whole));
    assert_eq!(resumed.state.curve().unwrap(), whole.state.curve().unwrap());

    // A checkpoint of another model is refused, naming what differs, and
    // changes nothing.
    let other = Trainer::new(Config { hidden: vec![32], ..short(2) }, &d, true).unwrap();
    let before = weights(&other);
    let err = format!("{:#}", other.restore(&file).unwrap_err());
    assert!(err.contains("layers[0].w") && err.contains("nothing was restored"), "{err}");
    assert_eq!(weights(&other), before);

    // A finished run extends with more epochs (`--resume --epochs 3`); fewer
    // epochs than are done is refused by name.
    let longer = Trainer::new(short(3), &d, true).unwrap();
    whole.save(&file).unwrap();
    longer.restore(&file).unwrap();
    assert_eq!(longer.state.epochs_done().unwrap(), 2);
    assert_eq!(longer.state.curve().unwrap(), whole.state.curve().unwrap());
    let third = longer.run_epoch(|_| {}).unwrap();
    assert_eq!(longer.state.curve().unwrap()[2], third);
    let shorter = Trainer::new(short(1), &d, true).unwrap();
    let err = format!("{:#}", shorter.restore(&file).unwrap_err());
    assert!(err.contains("holds 2 epochs, more than the 1 asked for"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_settings_and_files_are_errors() {
    let d = data();
    let err = |c: Config| Trainer::new(c, &d, true).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(Config { batch: 0, ..short(1) }).contains("batch size"));
    assert!(err(Config { batch: 5000, ..short(1) }).contains("do not fill one batch of 5000"));
    assert!(err(Config { test_fraction: 1.0, ..short(1) }).contains("test fraction"));
    let missing = format!("{:#}", Dataset::load("no/such/digits.safetensors").unwrap_err());
    assert!(missing.contains("no/such/digits.safetensors"), "{missing}");

    // A file with the wrong tensors names the one it lacks.
    let dir = std::env::temp_dir().join(format!("tracejit-digits-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    #[derive(Module)]
    struct Wrong {
        images: Variable,
    }
    let file = dir.join("wrong.safetensors");
    tracejit::checkpoint::save(&Wrong { images: Variable::new(Tensor::zeros(&[2, 64], DType::F32)) }, &file).unwrap();
    let e = format!("{:#}", Dataset::load(&file).unwrap_err());
    assert!(e.contains("no tensor `labels`"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The training loop of the README's "Training" section.
#[test]
fn the_readme_training_loop_trains() {
    use tracejit::optim::Adam;

    #[derive(Module, Clone)]
    struct Dense {
        w: Variable,
        b: Variable,
    }
    #[derive(Module, Clone)]
    struct Mlp {
        layers: Vec<Dense>,
    }
    impl Mlp {
        fn forward(&self, x: &Tensor) -> Tensor {
            let [hidden, out] = &self.layers[..] else { unreachable!() };
            let h = (x.matmul(&hidden.w.read()) + hidden.b.read()).relu();
            h.matmul(&out.w.read()) + out.b.read()
        }
    }
    #[derive(Module)]
    struct TrainState {
        model: Mlp,
        opt: Adam,
    }

    let dir = std::env::temp_dir().join(format!("tracejit-readme-digits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = tracejit::checkpoint::read(DATA).unwrap();
    let order = Tensor::from_vec((0..1797i64).map(|i| i * 1000 % 1797).collect(), &[1797]);
    let (images, labels) = (&data["images"].gather(&order, 0), &data["labels"].gather(&order, 0));
    let dense = |i: usize, o: usize, seed| Dense {
        w: Variable::new(Tensor::randn(&[i, o], seed) * (2.0 / i as f64).sqrt()),
        b: Variable::new(Tensor::zeros(&[o], DType::F32)),
    };
    let state = TrainState { model: Mlp { layers: vec![dense(64, 128, 1), dense(128, 10, 2)] }, opt: Adam::new(3e-3) };
    state.opt.build_for(&state.model);

    let (model, opt) = (state.model.clone(), state.opt.clone());
    let vars = model.trainable_variables();
    let step = function(move |(x, y): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let logits = model.forward(&x);
        let loss =
            tracejit::nn::softmax_cross_entropy_with_logits(&logits, &y.one_hot(10, DType::F32)).mean(&[0], false);
        let grads: Vec<Tensor> = tape.gradient(&loss, &vars).unwrap().into_iter().map(Option::unwrap).collect();
        opt.apply_gradients(&grads, &vars);
        loss
    });

    let mut losses = Vec::new();
    for _epoch in 0..20 {
        for start in (0..1440).step_by(32) {
            let batch = |t: &Tensor| t.slice_axis(0, start, start + 32);
            losses.push(step.call((batch(images), batch(labels))).unwrap().to_scalar::<f32>().unwrap());
        }
        tracejit::checkpoint::save(&state, dir.join("digits.safetensors")).unwrap();
    }
    let test = |t: &Tensor| t.slice_axis(0, 1440, 1797);
    let right = state.model.forward(&test(images)).argmax(-1, false).eq(test(labels));
    let accuracy = right.cast(DType::F32).mean_all().to_scalar::<f32>().unwrap();
    assert!(accuracy > 0.9, "test accuracy {accuracy}");
    assert!(
        losses[losses.len() - 1] < 0.5 * losses[0],
        "the loss falls: {} -> {}",
        losses[0],
        losses[losses.len() - 1]
    );
    assert_eq!(step.tracing_count(), 1);
    let saved = tracejit::checkpoint::read(dir.join("digits.safetensors")).unwrap();
    assert!(
        saved.contains_key("opt.m.model.layers[0].w") && saved.contains_key("model.layers[1].b"),
        "{:?}",
        saved.keys()
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--bf16`: the products run on the bf16 GEMM, the weights stay f32, and
/// the held-out accuracy is the f32 run's within half a point.
#[test]
fn bf16_mixed_precision_trains_as_well() {
    let d = data();
    let accuracy = |bf16: bool| {
        let t = Trainer::new(Config { bf16, ..short(30) }, &d, true).unwrap();
        train(&t);
        let f = t.compiled.as_ref().unwrap().concrete_functions()[0].clone();
        assert_eq!(f.schedule_stats().unwrap().bf16_gemms, if bf16 { 5 } else { 0 });
        assert!(t.state.variables().iter().all(|v| v.dtype() != DType::BF16));
        t.evaluate(&t.test).unwrap().1
    };
    let (full, mixed) = (accuracy(false), accuracy(true));
    assert!(mixed >= full - 0.005, "bf16 {mixed} vs f32 {full}");
}
