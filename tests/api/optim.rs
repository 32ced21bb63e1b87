//! Optimizers: SGD (momentum, Nesterov, weight decay) and Adam (AdamW decay,
//! AMSGrad) against plain-Rust references, eager and traced steps alike,
//! all-or-nothing updates, slots as module state, and checkpoints that
//! continue bit for bit.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tracejit::autodiff::value_and_grad;
use tracejit::optim::{Adam, Optimizer, Sgd};
use tracejit::prelude::*;

fn vals(v: &Variable) -> Vec<f64> {
    v.value().to_vec::<f64>().unwrap()
}

/// loss = Σ (w · c)², gradient 2 c² w.
fn loss_and_grad(w: &Variable, c: &[f64]) -> Vec<Tensor> {
    let c = Tensor::from_vec(c.to_vec(), &[c.len()]);
    value_and_grad(std::slice::from_ref(w), || (w.read() * &c).square().sum_all()).unwrap().1
}

#[test]
fn sgd_matches_a_reference() {
    let c = [0.5, -1.0, 2.0];
    for (momentum, nesterov, wd) in [(0.0, false, 0.0), (0.9, false, 0.0), (0.9, true, 0.01), (0.0, false, 0.1)] {
        let w = Variable::new(Tensor::from_vec(vec![1.0f64, -2.0, 0.3], &[3]));
        let opt = Sgd::new(0.05).momentum(momentum).nesterov(nesterov).weight_decay(wd);
        let mut rw = vec![1.0f64, -2.0, 0.3];
        let mut vel = [0.0f64; 3];
        for _ in 0..4 {
            let g = loss_and_grad(&w, &c);
            opt.apply_gradients(&g, std::slice::from_ref(&w));
            for i in 0..3 {
                let gi = 2.0 * c[i] * c[i] * rw[i] + wd * rw[i];
                let upd = if momentum != 0.0 {
                    vel[i] = momentum * vel[i] + gi;
                    if nesterov {
                        gi + momentum * vel[i]
                    } else {
                        vel[i]
                    }
                } else {
                    gi
                };
                rw[i] -= 0.05 * upd;
            }
        }
        let got = vals(&w);
        assert!(
            got.iter().zip(&rw).all(|(a, b)| (a - b).abs() <= 1e-12),
            "{momentum} {nesterov} {wd}: {got:?} vs {rw:?}"
        );
        assert_eq!(opt.iterations().value().to_vec::<i64>().unwrap(), vec![4]);
    }
}

#[test]
fn adam_matches_a_reference() {
    let c = [0.5, -1.0, 2.0];
    for (amsgrad, wd) in [(false, 0.0), (true, 0.0), (false, 0.01)] {
        let w = Variable::new(Tensor::from_vec(vec![1.0f64, -2.0, 0.3], &[3]));
        let opt = Adam::new(0.1).betas(0.8, 0.99).epsilon(1e-8).weight_decay(wd).amsgrad(amsgrad);
        let mut rw = vec![1.0f64, -2.0, 0.3];
        let (mut m, mut v, mut vmax) = ([0.0f64; 3], [0.0f64; 3], [0.0f64; 3]);
        for t in 1..=5 {
            let g = loss_and_grad(&w, &c);
            opt.apply_gradients(&g, std::slice::from_ref(&w));
            for i in 0..3 {
                let gi = 2.0 * c[i] * c[i] * rw[i];
                m[i] = 0.8 * m[i] + 0.2 * gi;
                v[i] = 0.99 * v[i] + 0.01 * gi * gi;
                vmax[i] = vmax[i].max(v[i]);
                let used = if amsgrad { vmax[i] } else { v[i] };
                let mh = m[i] / (1.0 - 0.8f64.powi(t));
                let vh = used / (1.0 - 0.99f64.powi(t));
                rw[i] -= 0.1 * (mh / (vh.sqrt() + 1e-8) + wd * rw[i]);
            }
        }
        let got = vals(&w);
        assert!(got.iter().zip(&rw).all(|(a, b)| (a - b).abs() <= 1e-12), "{amsgrad} {wd}: {got:?} vs {rw:?}");
    }
}

#[test]
fn a_traced_step_equals_eager_steps() {
    let c = [0.5f64, -1.0, 2.0];
    let make = || (Variable::new(Tensor::from_vec(vec![1.0f64, -2.0, 0.3], &[3])), Adam::new(0.1).amsgrad(true));
    let (we, oe) = make();
    let (wt, ot) = make();
    let (w2, o2) = (wt.clone(), ot.clone());
    let step = function(move |x: Tensor| {
        let (loss, g) = value_and_grad(std::slice::from_ref(&w2), || (w2.read() * &x).square().sum_all()).unwrap();
        o2.apply_gradients(&g, std::slice::from_ref(&w2));
        loss
    });
    let x = Tensor::from_vec(c.to_vec(), &[3]);
    for _ in 0..5 {
        step.call(x.clone()).unwrap();
        let g = loss_and_grad(&we, &c);
        oe.apply_gradients(&g, std::slice::from_ref(&we));
    }
    assert_eq!(step.tracing_count(), 1, "slots are created on the first trace only");
    assert!(vals(&wt).iter().zip(vals(&we)).all(|(a, b)| (a - b).abs() <= 1e-12));
    assert_eq!(ot.iterations().value().to_vec::<i64>().unwrap(), vec![5]);
}

#[test]
fn a_bad_update_changes_nothing_and_names_the_variable() {
    let a = Variable::new(Tensor::from_vec(vec![1.0f64, 2.0], &[2])).with_name("a");
    let b = Variable::new(Tensor::from_vec(vec![3.0f64], &[1])).with_name("b");
    let frozen = Variable::new(Tensor::from_vec(vec![3.0f64], &[1])).with_name("frozen").with_trainable(false);
    let opt = Sgd::new(0.1).momentum(0.5);
    let ok = Tensor::from_vec(vec![1.0f64, 1.0], &[2]);
    let cases: Vec<(Vec<Tensor>, Vec<Variable>, &str)> = vec![
        (vec![ok.clone()], vec![a.clone(), b.clone()], "1 gradients for 2 variables"),
        (vec![ok.clone(), ok.clone()], vec![a.clone(), b.clone()], "variable `b` is f64[2]"),
        (vec![ok.clone(), Tensor::from_vec(vec![1.0f32], &[1])], vec![a.clone(), b.clone()], "variable `b` is f32[1]"),
        (
            vec![ok.clone(), Tensor::from_vec(vec![1.0f64], &[1])],
            vec![a.clone(), frozen.clone()],
            "`frozen` is not trainable",
        ),
    ];
    for (grads, vars, msg) in cases {
        let before = (vals(&a), vals(&b));
        let e = catch_unwind(AssertUnwindSafe(|| opt.apply_gradients(&grads, &vars))).unwrap_err();
        let e = tracejit::ir::panic_message(&*e);
        assert!(e.contains(msg), "{e}");
        assert_eq!((vals(&a), vals(&b)), before, "nothing changed");
    }
    assert_eq!(opt.iterations().value().to_vec::<i64>().unwrap(), vec![0]);
}

#[derive(Module)]
struct Layer {
    w: Variable,
    b: Variable,
}

#[derive(Module)]
struct Model {
    layers: Vec<Layer>,
}

#[derive(Module)]
struct TrainState {
    model: Model,
    opt: Adam,
}

fn model() -> Model {
    let layer = |seed: u64| Layer {
        w: Variable::new(Tensor::randn(&[2, 2], seed).cast(DType::F64)),
        b: Variable::new(Tensor::zeros(&[2], DType::F64)),
    };
    Model { layers: vec![layer(1), layer(2)] }
}

fn train(state: &TrainState, steps: usize) {
    let vars = state.model.trainable_variables();
    let x = Tensor::from_vec(vec![1.0f64, -0.5, 0.25, 2.0], &[2, 2]);
    for _ in 0..steps {
        let (_, g) = value_and_grad(&vars, || {
            let mut h = x.clone();
            for l in &state.model.layers {
                h = (h.matmul(&l.w.read()) + l.b.read()).tanh();
            }
            h.square().mean(&[0, 1], false)
        })
        .unwrap();
        state.opt.apply_gradients(&g, &vars);
    }
}

#[test]
fn slots_are_module_state_and_checkpoints_continue_bit_for_bit() {
    let state = TrainState { model: model(), opt: Adam::new(0.05) };
    state.opt.build_for(&state.model);
    let paths: Vec<String> = state.named_variables().into_iter().map(|(p, _)| p).collect();
    for p in ["opt.iterations", "opt.m.model.layers[0].w", "opt.v.model.layers[1].b"] {
        assert!(paths.contains(&p.to_string()), "{p} in {paths:?}");
    }
    // A clone shares the slots.
    let shared = state.opt.clone();
    assert_eq!(shared.named_variables().len(), state.opt.named_variables().len());

    train(&state, 3);
    let dir = std::env::temp_dir().join(format!("tracejit-optim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.safetensors");
    tracejit::checkpoint::save(&state, &file).unwrap();
    train(&state, 2);
    let after: Vec<Vec<f64>> = state.model.variables().iter().map(vals).collect();

    let restored = TrainState { model: model(), opt: Adam::new(0.05) };
    restored.opt.build_for(&restored.model);
    tracejit::checkpoint::restore(&restored, &file).unwrap();
    assert_eq!(restored.opt.iterations().value().to_vec::<i64>().unwrap(), vec![3]);
    train(&restored, 2);
    let again: Vec<Vec<f64>> = restored.model.variables().iter().map(vals).collect();
    assert_eq!(after, again, "a restored optimizer continues bit for bit");
    std::fs::remove_dir_all(&dir).ok();

    fn send_sync<T: Send + Sync>() {}
    send_sync::<Adam>();
    send_sync::<Sgd>();
}

/// Slots created by `apply_gradients` (no `build_for`) were named by a
/// process-wide variable number (`opt.m.variable_26`), so a checkpoint of a
/// `TrainState` did not restore into another one built the same way
/// (`Mismatch { missing: ["opt.m.variable_26"], unexpected:
/// ["opt.m.variable_15"] }`). Slots are now named by their variable's path
/// in the tree saved, and restore into an optimizer that has not built them.
#[test]
fn slots_restore_into_a_fresh_state_without_build_for() {
    let dir = std::env::temp_dir().join(format!("tracejit-optim-fresh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.safetensors");
    let state = TrainState { model: model(), opt: Adam::new(0.05) };
    // Variables made in between, so the two states' variable numbers differ.
    let _others: Vec<Variable> = (0..7).map(|_| Variable::new(Tensor::scalar(0.0f32))).collect();
    train(&state, 3);
    let paths: Vec<String> = state.named_variables().into_iter().map(|(p, _)| p).collect();
    for p in ["opt.m.model.layers[0].w", "opt.v.model.layers[1].b"] {
        assert!(paths.contains(&p.to_string()), "{p} in {paths:?}");
    }
    tracejit::checkpoint::save(&state, &file).unwrap();
    train(&state, 2);
    let after: Vec<Vec<f64>> = state.model.variables().iter().map(vals).collect();

    // Built the same way and stepped once: the slots exist, named alike.
    let stepped = TrainState { model: model(), opt: Adam::new(0.05) };
    train(&stepped, 1);
    tracejit::checkpoint::restore(&stepped, &file).unwrap();
    train(&stepped, 2);
    assert_eq!(stepped.model.variables().iter().map(vals).collect::<Vec<_>>(), after);

    // Fresh, no slots yet: they take the restored values when built.
    let fresh = TrainState { model: model(), opt: Adam::new(0.05) };
    tracejit::checkpoint::restore(&fresh, &file).unwrap();
    assert_eq!(fresh.opt.iterations().value().to_vec::<i64>().unwrap(), vec![3]);
    train(&fresh, 2);
    assert_eq!(fresh.model.variables().iter().map(vals).collect::<Vec<_>>(), after, "continues bit for bit");

    // A slot whose shape does not fit its variable is a mismatch, not kept.
    let other = TrainState {
        model: Model {
            layers: vec![
                Layer {
                    w: Variable::new(Tensor::zeros(&[3, 3], DType::F64)),
                    b: Variable::new(Tensor::zeros(&[2], DType::F64)),
                },
                model().layers.remove(1),
            ],
        },
        opt: Adam::new(0.05),
    };
    let err = tracejit::checkpoint::restore(&other, &file).unwrap_err().to_string();
    assert!(err.contains("opt.m.model.layers[0].w"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn learning_rate_schedules() {
    use tracejit::optim::LearningRate;
    let at = |lr: &LearningRate, t: f64| lr.at(&Tensor::scalar(t), DType::F64).to_vec::<f64>().unwrap()[0];
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
    let exp = LearningRate::ExponentialDecay { initial: 0.1, rate: 0.5, steps: 10.0, staircase: false };
    assert!(close(at(&exp, 0.0), 0.1) && close(at(&exp, 10.0), 0.05) && close(at(&exp, 5.0), 0.1 * 0.5f64.powf(0.5)));
    let stair = LearningRate::ExponentialDecay { initial: 0.1, rate: 0.5, steps: 10.0, staircase: true };
    assert!(close(at(&stair, 9.0), 0.1) && close(at(&stair, 19.0), 0.05));
    let cos = LearningRate::CosineDecay { initial: 1.0, steps: 100.0, alpha: 0.1 };
    assert!(close(at(&cos, 0.0), 1.0) && close(at(&cos, 50.0), 0.55) && close(at(&cos, 100.0), 0.1));
    assert!(close(at(&cos, 500.0), 0.1), "held after the decay");
    let warm = LearningRate::Warmup { steps: 4.0, then: Box::new(cos.clone()) };
    assert!(close(at(&warm, 0.0), 0.25) && close(at(&warm, 3.0), 1.0) && close(at(&warm, 54.0), 0.55));

    // Inside a traced step the schedule follows the step count without
    // retracing; the weights match an eager loop with the same rates.
    let c = [0.5f64, -1.0, 2.0];
    let sched = LearningRate::ExponentialDecay { initial: 0.1, rate: 0.5, steps: 2.0, staircase: false };
    let w = Variable::new(Tensor::from_vec(vec![1.0f64, -2.0, 0.3], &[3]));
    let opt = Sgd::new(sched.clone());
    let (w2, o2) = (w.clone(), opt.clone());
    let step = function(move |x: Tensor| {
        let (_, g) = value_and_grad(std::slice::from_ref(&w2), || (w2.read() * &x).square().sum_all()).unwrap();
        o2.apply_gradients(&g, std::slice::from_ref(&w2));
    });
    let mut rw = vec![1.0f64, -2.0, 0.3];
    for t in 0..5 {
        step.call(Tensor::from_vec(c.to_vec(), &[3])).unwrap();
        let lr = 0.1 * 0.5f64.powf(t as f64 / 2.0);
        for i in 0..3 {
            rw[i] -= lr * 2.0 * c[i] * c[i] * rw[i];
        }
    }
    assert_eq!(step.tracing_count(), 1);
    assert!(vals(&w).iter().zip(&rw).all(|(a, b)| (a - b).abs() <= 1e-12), "{:?} vs {rw:?}", vals(&w));
}

/// The message of the panic `f` raises (`None`: it did not panic).
fn panic_message(f: impl FnOnce()) -> Option<String> {
    let err = catch_unwind(AssertUnwindSafe(f)).err()?;
    Some(
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

#[test]
fn hyperparameters_out_of_range_are_refused_at_construction() {
    use tracejit::optim::LearningRate;
    type Case = (&'static str, Box<dyn FnOnce()>);
    let cases: Vec<Case> = vec![
        ("beta1 must be in [0, 1), got 1", Box::new(|| drop(Adam::new(1e-3).betas(1.0, 0.999)))),
        ("beta2 must be in [0, 1), got 1", Box::new(|| drop(Adam::new(1e-3).betas(0.9, 1.0)))),
        ("beta1 must be in [0, 1), got -0.1", Box::new(|| drop(Adam::new(1e-3).betas(-0.1, 0.999)))),
        ("beta2 must be in [0, 1), got NaN", Box::new(|| drop(Adam::new(1e-3).betas(0.9, f64::NAN)))),
        ("Adam: the learning rate must be finite and at least 0, got NaN", Box::new(|| drop(Adam::new(f64::NAN)))),
        ("Adam: the learning rate must be finite and at least 0, got inf", Box::new(|| drop(Adam::new(f64::INFINITY)))),
        ("Sgd: the learning rate must be finite and at least 0, got -0.1", Box::new(|| drop(Sgd::new(-0.1)))),
        ("epsilon must be finite and at least 0, got -1", Box::new(|| drop(Adam::new(1e-3).epsilon(-1.0)))),
        ("momentum must be finite and at least 0, got NaN", Box::new(|| drop(Sgd::new(0.1).momentum(f64::NAN)))),
        ("weight_decay must be finite and at least 0, got -0.5", Box::new(|| drop(Sgd::new(0.1).weight_decay(-0.5)))),
        (
            "CosineDecay's steps must be finite and above 0, got 0",
            Box::new(|| drop(Sgd::new(LearningRate::CosineDecay { initial: 0.1, steps: 0.0, alpha: 0.0 }))),
        ),
    ];
    for (want, f) in cases {
        let got = panic_message(f).unwrap_or_else(|| panic!("accepted; want a panic saying {want:?}"));
        assert!(got.contains(want), "{got:?} does not say {want:?}");
    }
    // The edges that are fine: β = 0, a rate of 0.
    let w = Variable::new(Tensor::from_vec(vec![1.0f64, -2.0], &[2]));
    Adam::new(0.0)
        .betas(0.0, 0.0)
        .apply_gradients(&[Tensor::from_vec(vec![1.0f64, 1.0], &[2])], std::slice::from_ref(&w));
    assert!(vals(&w).iter().all(|v| v.is_finite()));
}

/// Runs `step` 1,000 times on each of 8 threads at once.
fn hammer(step: impl Fn() + Sync) {
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| (0..1000).for_each(|_| step()));
        }
    });
}

/// 8 threads x 1,000 `Sgd(lr=1)` steps of gradient 1 on one shared
/// variable left it at -1000 or -2140 instead of -8000 while
/// `iterations()` said 8000 (failure 1 of issue #28): each variable's
/// update is now atomic, eagerly and compiled.
#[test]
fn concurrent_sgd_steps_lose_no_update() {
    for compiled in [false, true] {
        let w = Variable::new(Tensor::scalar(0.0f64));
        let opt = Sgd::new(1.0);
        let (w2, o2) = (w.clone(), opt.clone());
        let step = function(move |g: Tensor| o2.apply_gradients(&[g], std::slice::from_ref(&w2)));
        let one = Tensor::scalar(1.0f64);
        hammer(|| {
            if compiled {
                step.call(one.clone()).unwrap();
            } else {
                opt.apply_gradients(std::slice::from_ref(&one), std::slice::from_ref(&w));
            }
        });
        assert_eq!(w.value().to_vec::<f64>().unwrap(), vec![-8000.0], "compiled: {compiled}");
        assert_eq!(opt.iterations().value().to_vec::<i64>().unwrap(), vec![8000]);
    }
}

/// Adam's moments after N steps of a constant gradient 1 are the same
/// whatever the order of the steps, if no step is lost or torn.
#[test]
fn concurrent_adam_steps_keep_the_slots_consistent() {
    let (b1, b2) = (0.9999, 0.99995);
    let (mut m_ref, mut v_ref) = (0.0f64, 0.0f64);
    for _ in 0..8000 {
        m_ref = m_ref * b1 + 1.0 * (1.0 - b1);
        v_ref = v_ref * b2 + 1.0 * (1.0 - b2);
    }
    for compiled in [false, true] {
        let w = Variable::new(Tensor::zeros(&[4], DType::F64));
        let opt = Adam::new(1e-3).betas(b1, b2);
        opt.build(std::slice::from_ref(&w));
        let (w2, o2) = (w.clone(), opt.clone());
        let step = function(move |g: Tensor| o2.apply_gradients(&[g], std::slice::from_ref(&w2)));
        let one = Tensor::ones(&[4], DType::F64);
        hammer(|| {
            if compiled {
                step.call(one.clone()).unwrap();
            } else {
                opt.apply_gradients(std::slice::from_ref(&one), std::slice::from_ref(&w));
            }
        });
        assert_eq!(opt.iterations().value().to_vec::<i64>().unwrap(), vec![8000], "compiled: {compiled}");
        let slots: Vec<(String, Variable)> = opt.named_variables();
        let slot =
            |name: &str| slots.iter().find(|(p, _)| p.starts_with(name)).unwrap().1.value().to_vec::<f64>().unwrap();
        for (got, want) in [(slot("m."), m_ref), (slot("v."), v_ref)] {
            assert!(got.iter().all(|x| (x - want).abs() <= 1e-12), "compiled: {compiled}: {got:?} vs {want}");
        }
        assert!(w.value().to_vec::<f64>().unwrap().iter().all(|x| x.is_finite() && *x < -1.0));
    }
}
