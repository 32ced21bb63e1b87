//! `autodiff::checkpoint` / `checkpoint_with`: the same values and
//! gradients as the plain block (inputs and captured weights), eagerly,
//! under tapes and compiled, for both policies; in a compiled step the
//! recomputation is not merged back into the forward.

use proptest::prelude::*;
use tracejit::autodiff::{checkpoint, checkpoint_with, grad, CheckpointPolicy};
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && vals(a)
            .iter()
            .zip(vals(b))
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-10 * (1.0 + y.abs()))
}

/// A block with products, elementwise ops and a reduction, capturing `w`.
fn block(w: Tensor) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static {
    move |x: &Tensor| {
        let h = x.matmul(&w).tanh();
        (&h * &h + x.sum(&[1], true)).matmul(&w.t()).sin()
    }
}

/// `sum(block(block(x)))`'s gradients with respect to x and w through a tape,
/// with the blocks wrapped by `wrap`.
fn grads(x: &Tensor, w: &Tensor, wrap: Option<CheckpointPolicy>) -> Vec<Tensor> {
    let tape = GradientTape::new();
    tape.watch(x);
    tape.watch(w);
    let b = block(w.clone());
    let y = match wrap {
        Some(p) => {
            let c = checkpoint_with(b, p);
            c(&c(x))
        }
        None => b(&b(x)),
    };
    let loss = (&y * &y).sum_all();
    let mut out = vec![loss.clone()];
    out.extend(tape.gradient(&loss, &[x, w]).unwrap().into_iter().map(Option::unwrap));
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn checkpointed_gradients_equal_the_plain_ones(n in prop::sample::select(vec![0usize, 1, 3, 5]), d in 1usize..5, seed in 0u64..1000, nan in any::<bool>()) {
        let mut xv = vals(&Tensor::randn(&[n, d], seed).cast(DType::F64));
        if nan && !xv.is_empty() {
            xv[0] = f64::NAN;
        }
        let x = Tensor::from_vec(xv, &[n, d]);
        let w = Tensor::randn(&[d, d], seed + 1).cast(DType::F64) * 0.5;
        let want = grads(&x, &w, None);
        for policy in [CheckpointPolicy::NothingSaveable, CheckpointPolicy::DotsSaveable] {
            let eager = grads(&x, &w, Some(policy));
            for (g, r) in eager.iter().zip(&want) {
                prop_assert!(close(g, r), "eager {:?}: {:?} vs {:?}", policy, g, r);
            }
            let f = function(move |(x, w): (Tensor, Tensor)| grads(&x, &w, Some(policy)));
            let compiled = f.call((x.clone(), w.clone())).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(f.concrete_functions()[0].executor_kind(), "jit");
            for (g, r) in compiled.iter().zip(&want) {
                prop_assert!(close(g, r), "compiled {:?}: {:?} vs {:?}", policy, g, r);
            }
        }
    }
}

#[test]
fn the_one_argument_form_composes_with_grad_and_vmap() {
    let x = Tensor::randn(&[4, 3], 1).cast(DType::F64);
    let f = |v: &Tensor| (v * v).exp().sum_all();
    let block = checkpoint(|v: &Tensor| (v * v).exp());
    let plain = grad(f)(&x);
    let remat = grad(move |v: &Tensor| block(v).sum_all())(&x);
    assert!(close(&plain, &remat));
    // Without a tape it is the block itself.
    let b = checkpoint(|v: &Tensor| v * 2.0);
    assert_eq!(vals(&b(&x)), vals(&(&x * 2.0)));
    let per = tracejit::vmap(grad(move |v: &Tensor| checkpoint(|u: &Tensor| u.sin() * u)(v).sum_all()));
    let want = x.cos() * &x + x.sin();
    assert!(close(&per(&x), &want));
}

#[test]
fn the_compiled_backward_recomputes_the_block() {
    // The block's tanh appears twice in the compiled step (forward and
    // recomputation) and the barrier keeps them apart; without checkpoint
    // once. With DotsSaveable the products are not recomputed.
    let count = |policy: Option<CheckpointPolicy>, what: &str| {
        let f = function(move |(x, w): (Tensor, Tensor)| grads(&x, &w, policy));
        f.call((Tensor::randn(&[4, 3], 1).cast(DType::F64), Tensor::randn(&[3, 3], 2).cast(DType::F64))).unwrap();
        f.concrete_functions()[0].optimized_graph().to_string().matches(what).count()
    };
    let plain = count(None, "tanh");
    let remat = count(Some(CheckpointPolicy::NothingSaveable), "tanh");
    assert!(remat > plain, "tanh: {plain} plain, {remat} checkpointed");
    let products_plain = count(None, "matmul");
    let products_remat = count(Some(CheckpointPolicy::NothingSaveable), "matmul");
    let products_saved = count(Some(CheckpointPolicy::DotsSaveable), "matmul");
    assert!(products_remat > products_plain, "{products_plain} vs {products_remat}");
    assert_eq!(products_saved, products_plain, "dots_saveable recomputes no product");
}

/// Second derivatives through a checkpointed block — `grad(grad)`, a
/// Hessian and a Hessian-vector product (forward over reverse) — equal the
/// plain block's, eagerly and compiled (the recomputation's barrier is
/// differentiated as the identity it is).
#[test]
fn higher_order_gradients_go_through_a_checkpoint() {
    use tracejit::autodiff::{hessian, jvp};
    let x = Tensor::randn(&[5], 3).cast(DType::F64);
    let plain = |v: &Tensor| (v * v).sin().exp().sum_all();
    let remat = move |v: &Tensor| checkpoint(|u: &Tensor| (u * u).sin().exp())(v).sum_all();
    let second = |f: fn(&Tensor) -> Tensor| move |v: &Tensor| grad(move |u: &Tensor| grad(f)(u).sum_all())(v);
    assert!(close(&second(plain)(&x), &second(remat)(&x)));
    assert!(close(&hessian(plain)(&x), &hessian(remat)(&x)));
    let dir = Tensor::randn(&[5], 4).cast(DType::F64);
    let hvp = |f: fn(&Tensor) -> Tensor, x: &Tensor, d: &Tensor| jvp(move |u: &Tensor| grad(f)(u), x, d).1;
    assert!(close(&hvp(plain, &x, &dir), &hvp(remat, &x, &dir)));
    // Compiled: one trace each, the same numbers, the barrier in the graph.
    let want = hessian(plain)(&x);
    let f = function(move |x: Tensor| hessian(remat)(&x));
    let got = f.call(x.clone()).unwrap();
    assert!(close(&got, &want), "{got:?} vs {want:?}");
    let listing = f.concrete_functions()[0].graph().to_string();
    assert!(listing.contains(tracejit::autodiff::REMAT_BARRIER), "{listing}");
    assert!(f.concrete_functions()[0].schedule_stats().is_some(), "the JIT ran");
    let g = function(move |(x, d): (Tensor, Tensor)| hvp(remat, &x, &d));
    assert!(close(&g.call((x.clone(), dir.clone())).unwrap(), &hvp(plain, &x, &dir)));
}

// ---- blocks with state: Variables, random draws, batch norm ---------------

use tracejit::nn::{batch_norm, dropout};
use tracejit::random::Generator;

/// A model whose block has every kind of state: a trainable weight read
/// inside the block, draws from a generator (dropout and a normal) and a
/// batch norm in training (moving averages assigned).
#[derive(Clone)]
struct Stateful {
    w: Variable,
    g: Generator,
    mean: Variable,
    var: Variable,
}

impl Stateful {
    fn new(d: usize, seed: u64) -> Stateful {
        Stateful {
            w: Variable::new(Tensor::randn(&[d, d], seed).cast(DType::F64) * 0.5),
            g: Generator::from_seed(seed),
            mean: Variable::new(Tensor::zeros(&[d], DType::F64)).with_trainable(false),
            var: Variable::new(Tensor::ones(&[d], DType::F64)).with_trainable(false),
        }
    }

    fn block(&self) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static {
        let m = self.clone();
        move |x: &Tensor| {
            let d = m.w.shape()[0];
            let h = x.matmul(&m.w.read()).tanh();
            let (gamma, beta) = (Tensor::ones(&[d], DType::F64), Tensor::zeros(&[d], DType::F64));
            let h = batch_norm(&h, &gamma, &beta, &m.mean, &m.var, 0.9, 1e-5, true);
            let h = dropout(&h, 0.5, &m.g, true);
            &h * (m.g.normal_like(&h) + 1.0) + x
        }
    }

    /// The state after a step: moving mean and variance, generator state.
    fn state(&self) -> Vec<Tensor> {
        vec![self.mean.value(), self.var.value(), self.g.state().value().cast(DType::F64)]
    }
}

/// `[loss, d loss/dx, d loss/dw]` of `sum(block(x)^2)` through a tape, the
/// block checkpointed or not.
fn stateful_grads(m: &Stateful, x: &Tensor, remat: bool) -> Vec<Tensor> {
    let tape = GradientTape::persistent();
    tape.watch(x);
    let y = if remat { checkpoint(m.block())(x) } else { m.block()(x) };
    let loss = (&y * &y).sum_all();
    let dx = tape.gradient(&loss, &[x]).unwrap().remove(0).expect("x reaches the loss");
    let dw = tape.gradient(&loss, std::slice::from_ref(&m.w)).unwrap().remove(0).expect("w is read inside the block");
    vec![loss, dx, dw]
}

fn assert_all_close(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(close(g, w), "{what}, item {i}: {:?} vs {:?}", vals(g), vals(w));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// Gradients of Variables read inside the block, the forward's random
    /// draws replayed by the recomputation, state written once: a
    /// checkpointed block is indistinguishable from the plain one, eagerly
    /// and compiled, step after step.
    #[test]
    fn a_checkpointed_block_with_state_equals_the_plain_one(n in prop::sample::select(vec![1usize, 2, 5]), d in 1usize..5, seed in 0u64..1000) {
        let x = Tensor::randn(&[n, d], seed + 7).cast(DType::F64);
        let (plain, remat) = (Stateful::new(d, seed), Stateful::new(d, seed));
        for step in 0..2 {
            let want = stateful_grads(&plain, &x, false);
            let got = stateful_grads(&remat, &x, true);
            assert_all_close(&got, &want, &format!("eager step {step}"));
            assert_all_close(&remat.state(), &plain.state(), &format!("eager state after step {step}"));
        }
        let (plain, remat) = (Stateful::new(d, seed), Stateful::new(d, seed));
        let compile = |m: &Stateful, wrap: bool| {
            let m = m.clone();
            function(move |x: Tensor| stateful_grads(&m, &x, wrap))
        };
        let (fp, fr) = (compile(&plain, false), compile(&remat, true));
        for step in 0..2 {
            let want = fp.call(x.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let got = fr.call(x.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            assert_all_close(&got, &want, &format!("compiled step {step}"));
            assert_all_close(&remat.state(), &plain.state(), &format!("compiled state after step {step}"));
        }
        prop_assert_eq!(fr.concrete_functions()[0].executor_kind(), "jit");
        prop_assert_eq!(fr.tracing_count(), 1);
    }
}

/// `value_and_grad` and a tape over Variables (not tensors) see the reads
/// inside a checkpointed block: the zeros and `None`.
#[test]
fn variables_read_in_a_checkpoint_get_their_gradients() {
    let w = Variable::new(Tensor::from_vec(vec![0.5f64, -1.5, 2.0], &[3]));
    let x = Tensor::from_vec(vec![1.0f64, 2.0, -3.0], &[3]);
    let wc = w.clone();
    let block = checkpoint(move |x: &Tensor| (x * wc.read()).sin());
    let (_, g) = tracejit::autodiff::value_and_grad(std::slice::from_ref(&w), || block(&x).sum_all()).unwrap();
    let want = (&x * w.value()).cos() * &x;
    assert!(close(&g[0], &want), "{:?} vs {:?}", vals(&g[0]), vals(&want));
    let tape = GradientTape::new();
    let loss = block(&x).sum_all();
    let g = tape.gradient(&loss, std::slice::from_ref(&w)).unwrap().remove(0).expect("a gradient, not None");
    assert!(close(&g, &want));
}

/// The recomputation replays the forward's dropout mask: the gradient of
/// `sum(dropout(x))` is the mask the forward applied, scaled.
#[test]
fn the_recomputation_replays_the_dropout_mask() {
    let g = Generator::from_seed(3);
    let x = Tensor::ones(&[256], DType::F64);
    let tape = GradientTape::new();
    tape.watch(&x);
    let gc = g.clone();
    let y = checkpoint(move |x: &Tensor| dropout(x, 0.5, &gc, true))(&x);
    let dx = tape.gradient(&y.sum_all(), &[&x]).unwrap().remove(0).unwrap();
    assert_eq!(vals(&dx), vals(&y), "the backward's mask differs from the forward's");
    assert_eq!(g.state().value().to_vec::<i64>().unwrap()[1], 1, "one draw, one advance");
}
