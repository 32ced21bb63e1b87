//! `vmap` through control flow, random draws, variables, composites,
//! convolutions and under gradients: each against the per-example
//! reference, eagerly and compiled.

use proptest::prelude::*;
use tracejit::autodiff::grad;
use tracejit::prelude::*;
use tracejit::{cond, fori_loop, vmap, vmap_axes, while_loop};

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &Tensor, b: &Tensor, tol: f64) -> bool {
    a.shape() == b.shape()
        && vals(a)
            .iter()
            .zip(vals(b))
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs()))
}

fn example(x: &Tensor, i: usize) -> Tensor {
    x.slice_axis(0, i as i64, i as i64 + 1).squeeze(&[0])
}

/// `f` on each example of `x` (axis 0), stacked; `None` for zero examples.
fn stacked(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor) -> Option<Tensor> {
    let n = x.shape()[0];
    (n > 0).then(|| Tensor::stack(&(0..n).map(|i| f(&example(x, i))).collect::<Vec<_>>(), 0))
}

/// Checks `vmap(f)` eagerly and compiled (the JIT ran) against `stacked`.
fn check(f: impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static, x: &Tensor) -> Result<(), TestCaseError> {
    let eager = vmap(f.clone())(x);
    if let Some(want) = stacked(&f, x) {
        prop_assert!(close(&eager, &want, 1e-9), "eager {:?} vs {:?}", eager, want);
    } else {
        prop_assert_eq!(eager.shape()[0], 0);
    }
    let compiled = function(move |x: Tensor| vmap(f.clone())(&x));
    let traced = compiled.call(x.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(close(&traced, &eager, 1e-9), "compiled {:?} vs eager {:?}", traced, eager);
    let cf = &compiled.concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    Ok(())
}

/// A branch per example on its own values.
fn branchy(x: &Tensor) -> Tensor {
    cond(&x.sum_all().gt(0.0), || x * 2.0 + 1.0, || x.exp() - x)
}

/// A loop whose trip count depends on each example: halve until below 1.
fn halving(x: &Tensor) -> Tensor {
    let (v, n) = while_loop(
        |(v, _): &(Tensor, Tensor)| v.abs().max_all().gt(1.0),
        |(v, n): (Tensor, Tensor)| (&v * 0.5, &n + 1.0),
        (x.clone(), Tensor::scalar(0.0f64)),
    );
    &v + &n
}

/// A static trip count with a shared counter: the loop stays a fori_loop.
fn fori(x: &Tensor) -> Tensor {
    fori_loop(0, 3, |i, acc: Tensor| &acc * x + i.cast(DType::F64), x.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn control_flow_matches_each_example(n in prop::sample::select(vec![0usize, 1, 3, 5]), d in 1usize..4, seed in 0u64..1000) {
        let x = Tensor::randn(&[n, d], seed).cast(DType::F64) * 3.0;
        check(branchy, &x)?;
        check(halving, &x)?;
        check(fori, &x)?;
    }

    #[test]
    fn gradients_of_mapped_functions(n in prop::sample::select(vec![1usize, 3, 5]), seed in 0u64..1000) {
        // grad(vmap(f)): the batched ops are recorded on the tape.
        let x = Tensor::randn(&[n, 3], seed).cast(DType::F64);
        let w = Tensor::randn(&[3, 2], seed + 1).cast(DType::F64);
        let per = {
            let w = w.clone();
            move |v: &Tensor| v.reshape(&[1, 3]).matmul(&w).tanh().sum_all()
        };
        let total = {
            let per = per.clone();
            move |x: &Tensor| vmap(per.clone())(x).sum_all()
        };
        let g = grad(total)(&x);
        let want = stacked(&grad(per), &x).unwrap();
        prop_assert!(close(&g, &want, 1e-9), "{:?} vs {:?}", g, want);
        // Through a fori_loop under vmap(grad): its trip count stays static.
        let through_loop = |v: &Tensor| fori(v).sum_all();
        check(grad(through_loop), &x)?;
    }
}

#[test]
fn composites_batch_through_their_bodies() {
    let x = Tensor::randn(&[4, 5], 3).cast(DType::F64);
    let f = |v: &Tensor| tracejit::nn::log_softmax(&v.reshape(&[1, 5]), -1).squeeze(&[0]);
    let got = vmap(f)(&x);
    assert!(close(&got, &stacked(&f, &x).unwrap(), 1e-9));
    // Per-example gradients of a cross-entropy written with the composite.
    let loss = |v: &Tensor| -tracejit::nn::log_softmax(&v.reshape(&[1, 5]), -1).slice_axis(1, 2, 3).sum_all();
    let got = vmap(grad(loss))(&x);
    assert!(close(&got, &stacked(&grad(loss), &x).unwrap(), 1e-9));
    let compiled = function(move |x: Tensor| vmap(grad(loss))(&x));
    assert!(close(&compiled.call(x.clone()).unwrap(), &got, 1e-9));
}

#[test]
fn random_draws_follow_their_keys() {
    let seed = Tensor::from_vec(vec![7i64, 9], &[2]);
    let noisy = {
        let seed = seed.clone();
        move |v: &Tensor| v + tracejit::random::stateless_normal(&[3], &seed, DType::F64)
    };
    let x = Tensor::zeros(&[4, 3], DType::F64);
    // A shared key draws the same numbers for every example (as JAX),
    // eagerly and compiled (where the draw is a graph node).
    let want = stacked(&noisy, &x).unwrap();
    assert!(close(&vmap(noisy.clone())(&x), &want, 0.0));
    let f = function(move |(x, seed): (Tensor, Tensor)| {
        vmap(move |v: &Tensor| v + tracejit::random::stateless_normal(&[3], &seed, DType::F64))(&x)
    });
    assert!(close(&f.call((x.clone(), seed.clone())).unwrap(), &want, 0.0));
    // One key per example: each example's draw is the draw from its key.
    let keys = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[3, 2]);
    let draw = |k: &Tensor| tracejit::random::stateless_normal(&[2], k, DType::F64);
    let got = vmap(draw)(&keys);
    assert!(close(&got, &stacked(&draw, &keys).unwrap(), 0.0));
}

#[test]
fn variables_are_read_shared_and_a_write_is_an_error() {
    let w = Variable::new(Tensor::from_vec(vec![1.0f64, 2.0], &[2]));
    let scaled = {
        let w = w.clone();
        move |v: &Tensor| v * &w.read()
    };
    let x = Tensor::ones(&[3, 2], DType::F64);
    assert_eq!(vals(&vmap(scaled.clone())(&x)), [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    let f = function(move |x: Tensor| vmap(scaled.clone())(&x));
    assert_eq!(vals(&f.call(x.clone()).unwrap()), [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    w.assign(&Tensor::from_vec(vec![3.0f64, 4.0], &[2]));
    assert_eq!(vals(&f.call(x.clone()).unwrap()), [3.0, 4.0, 3.0, 4.0, 3.0, 4.0]);
    let writes = {
        let w = w.clone();
        move |v: &Tensor| {
            w.assign_add(v);
            v.clone()
        }
    };
    let err = std::panic::catch_unwind(|| vmap(writes)(&x)).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("vmap of `assign_add`") && msg.contains("a write of variable"), "{msg}");
    assert_eq!(vals(&w.read()), [3.0, 4.0], "the refused write did not happen");
}

#[test]
fn convolutions_fold_the_batch_into_the_images() {
    let x = Tensor::randn(&[3, 2, 1, 6, 6], 1).cast(DType::F64);
    let w = Tensor::randn(&[4, 1, 3, 3], 2).cast(DType::F64);
    let f = move |v: &Tensor| {
        let y = tracejit::nn::conv2d(v, &w, None, tracejit::nn::Conv2dOptions::default()).relu();
        tracejit::nn::max_pool2d(&y, [2, 2], [2, 2], [0, 0])
    };
    let got = vmap(f.clone())(&x);
    assert!(close(&got, &stacked(&f, &x).unwrap(), 1e-9));
}

#[test]
fn out_axes_and_shared_results() {
    let f = vmap_axes(|xs: Vec<Tensor>| vec![xs[0].clone(), xs[1].clone()], &[Some(0), None], &[1, 0]);
    let out = f(vec![Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]), Tensor::from_vec(vec![5.0f32], &[1])]);
    assert_eq!(vals(&out[0]), [1.0, 3.0, 2.0, 4.0]);
    assert_eq!((out[1].shape(), vals(&out[1])), (&[2usize, 1][..], vec![5.0, 5.0]));
}

/// A `Generator` draw inside `vmap` is one draw of the whole batch from the
/// generator's state (each example its own numbers, as PyTorch's
/// `randomness="different"`), and the generator advances once per call —
/// eagerly and compiled, where each call draws fresh numbers.
#[test]
fn generator_draws_differ_per_example_and_advance_once() {
    use tracejit::random::Generator;
    let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let x = Tensor::zeros(&[4, 3], DType::F32);
    let g = Generator::from_seed(5);
    let noisy = {
        let g = g.clone();
        move |v: &Tensor| v + g.normal_like(v)
    };
    let got = vmap(noisy)(&x);
    let reference = Generator::from_seed(5);
    assert_eq!(bits(&got), bits(&reference.normal(&[4, 3], DType::F32)));
    assert_ne!(bits(&example(&got, 0)), bits(&example(&got, 1)), "each example has numbers of its own");
    assert_eq!(g.state().value().to_vec::<i64>().unwrap(), reference.state().value().to_vec::<i64>().unwrap());
    // Compiled: one trace, fresh numbers on every call, the eager sequence.
    let f = {
        let g = Generator::from_seed(6);
        function(move |x: Tensor| {
            let g = g.clone();
            vmap(move |v: &Tensor| v + g.uniform_like(v, 0.0, 1.0))(&x)
        })
    };
    let reference = Generator::from_seed(6);
    for _ in 0..2 {
        let want = reference.uniform(&[4, 3], 0.0, 1.0, DType::F32);
        assert_eq!(bits(&f.call(x.clone()).unwrap()), bits(&want));
    }
    assert_eq!(f.tracing_count(), 1);
    // Dropout per example: the masks differ between examples.
    let gd = Generator::from_seed(9);
    let dropped = vmap(move |v: &Tensor| tracejit::nn::dropout(v, 0.5, &gd, true))(&Tensor::ones(&[2, 64], DType::F32));
    assert_ne!(bits(&example(&dropped, 0)), bits(&example(&dropped, 1)));
    // A stateless seed stays a JAX key: the same numbers for every example.
    let seed = Tensor::from_vec(vec![1i64, 2], &[2]);
    let shared = vmap(move |v: &Tensor| v + tracejit::random::stateless_normal(&[3], &seed, DType::F32))(&x);
    assert_eq!(bits(&example(&shared, 0)), bits(&example(&shared, 3)));
}

#[test]
fn only_a_generators_advance_is_written_inside_vmap() {
    // A write of a value the same for every example is still a write per
    // example: an error naming the variable, nothing written.
    let count = Variable::new(Tensor::zeros(&[], DType::F64)).with_name("count");
    let c = count.clone();
    let f = move |v: &Tensor| {
        c.assign_add(&Tensor::scalar(1.0f64));
        v * 2.0
    };
    let x = Tensor::ones(&[5, 2], DType::F64);
    let err = std::panic::catch_unwind(|| vmap(f.clone())(&x)).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("a write of variable `count`"), "{msg}");
    let compiled = function(move |x: Tensor| vmap(f.clone())(&x));
    let e = compiled.call(x.clone()).unwrap_err().to_string();
    assert!(e.contains("a write of variable `count`"), "{e}");
    assert_eq!(vals(&count.read()), [0.0]);
    // A generator over a state variable of the user's is marked by it.
    let state = Variable::new(Tensor::from_vec(vec![0i64, 0, 7], &[3]));
    let g = tracejit::random::Generator::from_state(state.clone());
    vmap(move |v: &Tensor| v + g.normal_like(v))(&x);
    assert_eq!(state.value().to_vec::<i64>().unwrap(), [0, 1, 7], "one advance for the whole batch");
}

mod convolution_weights {
    use super::*;
    use tracejit::nn::{conv2d, Conv2dOptions};

    /// A convolution's geometry: batch `b` of examples, each `n` images of
    /// `g·icg` channels, `g·ocg` filters; odd sizes, strides, dilations,
    /// padding, groups; `b` may be 0.
    #[derive(Clone, Debug)]
    struct Case {
        b: usize,
        n: usize,
        groups: usize,
        icg: usize,
        ocg: usize,
        hw: [usize; 2],
        k: [usize; 2],
        stride: usize,
        dilation: usize,
        pad: usize,
        seed: u64,
    }

    impl Case {
        fn opts(&self) -> Conv2dOptions {
            Conv2dOptions::default().stride(self.stride).dilation(self.dilation).padding(self.pad).groups(self.groups)
        }
        fn x(&self) -> Tensor {
            let shape = [self.b, self.n, self.groups * self.icg, self.hw[0], self.hw[1]];
            Tensor::randn(&shape, self.seed).cast(DType::F64)
        }
        fn w(&self) -> Tensor {
            let shape = [self.b, self.groups * self.ocg, self.icg, self.k[0], self.k[1]];
            Tensor::randn(&shape, self.seed + 1).cast(DType::F64)
        }
        fn bias(&self) -> Tensor {
            Tensor::randn(&[self.b, self.groups * self.ocg], self.seed + 2).cast(DType::F64)
        }
    }

    fn case() -> impl Strategy<Value = Case> {
        (0usize..4, 1usize..3, 1usize..3, 1usize..3, 1usize..3, (1usize..7, 1usize..7), (1usize..4, 1usize..4))
            .prop_flat_map(|t| (Just(t), 1usize..3, 1usize..3, 0usize..2, 0u64..1000))
            .prop_map(|((b, n, groups, icg, ocg, hw, k), stride, dilation, pad, seed)| Case {
                b,
                n,
                groups,
                icg,
                ocg,
                hw: [hw.0, hw.1],
                k: [k.0, k.1],
                stride,
                dilation,
                pad,
                seed,
            })
            .prop_filter("the dilated kernel fits", |c| (0..2).all(|a| c.hw[a] + 2 * c.pad > (c.k[a] - 1) * c.dilation))
    }

    /// `f(args of example i)` for each example, stacked (`None` for none).
    fn per_example(f: &dyn Fn(&[Tensor]) -> Tensor, args: &[Tensor], mapped: &[bool], b: usize) -> Option<Tensor> {
        let one = |i: usize| -> Vec<Tensor> {
            args.iter().zip(mapped).map(|(a, &m)| if m { example(a, i) } else { a.clone() }).collect()
        };
        (b > 0).then(|| Tensor::stack(&(0..b).map(|i| f(&one(i))).collect::<Vec<_>>(), 0))
    }

    fn check(what: &str, got: &Tensor, want: Option<Tensor>, b: usize) {
        match want {
            Some(w) => assert!(close(got, &w, 1e-10), "{what}: {:?} vs {:?}", vals(got), vals(&w)),
            None => assert_eq!(got.shape()[0], b, "{what}: an empty batch"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// `vmap` of `conv2d` over its weights (and bias, and images too),
        /// and per-example filter gradients by `vmap(grad)` (the issue:
        /// both panicked, "cannot fold the batch"), against each example's
        /// own convolution, eagerly and compiled.
        #[test]
        fn vmap_over_weights_and_per_example_filter_gradients(c in case()) {
            let opts = c.opts();
            let (x, w, bias) = (c.x(), c.w(), c.bias());
            let x0 = if c.b > 0 { example(&x, 0) } else { Tensor::zeros(&x.shape()[1..], DType::F64) };
            let conv = move |a: &[Tensor]| conv2d(&a[0], &a[1], Some(&a[2]), opts);
            // Weights and bias mapped, images shared; then everything mapped.
            for (mapped, images) in [([false, true, true], &x0), ([true, true, true], &x)] {
                let axes: Vec<Option<usize>> = mapped.iter().map(|&m| m.then_some(0)).collect();
                let args = vec![images.clone(), w.clone(), bias.clone()];
                let batched = vmap_axes(move |a: Vec<Tensor>| vec![conv(&a)], &axes, &[0]);
                let want = per_example(&conv, &args, &mapped, c.b);
                check(&format!("eager {mapped:?}"), &batched(args.clone())[0], want.clone(), c.b);
                let compiled = function(move |a: Vec<Tensor>| batched(a).remove(0));
                check(&format!("compiled {mapped:?}"), &compiled.call(args).unwrap(), want, c.b);
            }
            // Per-example gradients with respect to shared weights.
            let w0 = if c.b > 0 { example(&w, 0) } else { Tensor::zeros(&w.shape()[1..], DType::F64) };
            let loss = move |a: &[Tensor]| {
                let img = a[0].clone();
                grad(move |w: &Tensor| conv2d(&img, w, None, opts).sin().sum_all())(&a[1])
            };
            let batched = vmap_axes(move |a: Vec<Tensor>| vec![loss(&a)], &[Some(0), None], &[0]);
            let want = per_example(&loss, &[x.clone(), w0.clone()], &[true, false], c.b);
            check("eager filter gradients", &batched(vec![x.clone(), w0.clone()])[0], want.clone(), c.b);
            let compiled = function(move |a: Vec<Tensor>| batched(a).remove(0));
            check("compiled filter gradients", &compiled.call(vec![x, w0]).unwrap(), want, c.b);
        }
    }
}
