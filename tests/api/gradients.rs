//! GradientTape and value_and_grad: eager gradients against analytic ones
//! and finite differences, the same code traced inside a function, variables
//! watched automatically, persistence, unconnected and integer sources,
//! higher-order gradients, and thread isolation.

use tracejit::autodiff::value_and_grad;
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
}

fn x3() -> Tensor {
    Tensor::from_vec(vec![-1.5f64, 0.5, 2.0], &[3])
}

#[test]
fn eager_gradient_of_a_polynomial() {
    let x = x3();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = (&x * &x * &x + &x * 2.0).sum(&[0], false);
    let g = tape.gradient(&y, &[&x]).unwrap();
    let want: Vec<f64> = vals(&x).iter().map(|v| 3.0 * v * v + 2.0).collect();
    assert!(close(&vals(g[0].as_ref().unwrap()), &want, 1e-12));
}

#[test]
fn a_non_scalar_target_differentiates_its_sum() {
    let x = x3();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = x.exp();
    let g = tape.gradient(&y, std::slice::from_ref(&x)).unwrap();
    assert!(close(&vals(g[0].as_ref().unwrap()), &vals(&x.exp()), 1e-12));
}

#[test]
fn the_same_code_traced_in_a_function() {
    let grad = |x: &Tensor| {
        let tape = GradientTape::new();
        tape.watch(x);
        let y = (x.tanh() * x).sum(&[0], false);
        tape.gradient(&y, &[x]).unwrap().remove(0).unwrap()
    };
    let f = function(move |x: Tensor| grad(&x));
    let x = x3();
    let traced = f.call(x.clone()).unwrap();
    let eager = grad(&x);
    assert!(close(&vals(&traced), &vals(&eager), 1e-12));
    assert_eq!(f.tracing_count(), 1);
    // Forward and backward are one graph.
    let g = f.concrete_functions()[0].graph().to_string();
    assert!(g.contains("tanh") && g.contains("mul"), "{g}");
    f.call(Tensor::from_vec(vec![0.1f64, 0.2, 0.3], &[3])).unwrap();
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn trainable_variables_are_watched_and_match_finite_differences() {
    let w = Variable::new(Tensor::from_vec(vec![0.3f64, -0.2, 0.5, 0.1, -0.4, 0.2], &[3, 2]));
    let b = Variable::new(Tensor::from_vec(vec![0.05f64, -0.1], &[2]));
    let frozen = Variable::new(Tensor::from_vec(vec![1.0f64, 1.0], &[2])).with_trainable(false);
    let x = Tensor::from_vec(vec![1.0f64, 2.0, -1.0, 0.5, 0.0, 3.0, -2.0, 1.0], &[4, 2]);
    let loss = |w: &Tensor, b: &Tensor| {
        let h = (x.matmul(&w.transpose(&[1, 0])) + 0.0).tanh(); // [4, 3]
        let out = h.matmul(w) + b * frozen.read(); // [4, 2]
        (&out * &out).mean(&[0, 1], false)
    };
    let tape = GradientTape::new();
    let l = loss(&w.read(), &b.read());
    let g = tape.gradient(&l, &[w.clone(), b.clone(), frozen.clone()]).unwrap();
    assert!(g[2].is_none(), "a non-trainable variable is not watched");
    // Finite differences on every element of w and b.
    for (k, var) in [&w, &b].into_iter().enumerate() {
        let base = vals(&var.value());
        let got = vals(g[k].as_ref().unwrap());
        for i in 0..base.len() {
            let at = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let t = Tensor::from_vec(v, var.value().shape());
                let l = if k == 0 { loss(&t, &b.value()) } else { loss(&w.value(), &t) };
                vals(&l)[0]
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            assert!((got[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0), "var {k} elt {i}: {} vs {fd}", got[i]);
        }
    }
}

#[test]
fn a_tape_answers_once_unless_persistent() {
    let x = x3();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = x.square().sum(&[0], false);
    tape.gradient(&y, &[&x]).unwrap();
    let e = tape.gradient(&y, &[&x]).unwrap_err().to_string();
    assert!(e.contains("already computed a gradient") && e.contains("persistent"), "{e}");

    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = x.square().sum(&[0], false);
    let z = x.sin().sum(&[0], false);
    let gy = tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap();
    let gz = tape.gradient(&z, &[&x]).unwrap().remove(0).unwrap();
    assert!(close(&vals(&gy), &vals(&(&x * 2.0)), 1e-12));
    assert!(close(&vals(&gz), &vals(&x.cos()), 1e-12));
}

#[test]
fn unconnected_and_integer_sources() {
    let x = x3();
    let other = Tensor::from_vec(vec![1.0f64], &[1]);
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = x.exp().sum(&[0], false);
    let g = tape.gradient(&y, &[&x, &other]).unwrap();
    assert!(g[0].is_some() && g[1].is_none());
    let ints = Tensor::from_vec(vec![1i64, 2], &[2]);
    let e = tape.gradient(&y, &[&x, &ints]).unwrap_err().to_string();
    assert!(e.contains("source 1") && e.contains("i64"), "{e}");
    // value_and_grad gives dense zeros where unconnected.
    let used = Variable::new(Tensor::from_vec(vec![2.0f64], &[1]));
    let unused = Variable::new(Tensor::from_vec(vec![5.0f64, 6.0], &[2]));
    let (v, g) = value_and_grad(&[used.clone(), unused.clone()], || used.read().exp().sum_all()).unwrap();
    assert!(close(&vals(&v), &[2f64.exp()], 1e-12));
    assert!(close(&vals(&g[0]), &[2f64.exp()], 1e-12));
    assert_eq!(vals(&g[1]), vec![0.0, 0.0]);
}

#[test]
fn gradient_of_a_gradient() {
    let x = x3();
    let outer = GradientTape::new();
    outer.watch(&x);
    let inner = GradientTape::new();
    inner.watch(&x);
    let y = (&x * &x * &x).sum(&[0], false);
    let dy = inner.gradient(&y, &[&x]).unwrap().remove(0).unwrap(); // 3x²
    let d2y = outer.gradient(&dy, &[&x]).unwrap().remove(0).unwrap(); // 6x
    assert!(close(&vals(&d2y), &vals(&(&x * 6.0)), 1e-12));
}

#[test]
fn tapes_are_thread_local() {
    // Eight threads differentiate at once, each with its own tape.
    let handles: Vec<_> = (0..8)
        .map(|k| {
            std::thread::spawn(move || {
                let x = Tensor::from_vec(vec![k as f64, 1.0 + k as f64], &[2]);
                let tape = GradientTape::new();
                tape.watch(&x);
                let mut y = x.clone();
                for _ in 0..50 {
                    y = (&y * 1.01).sin();
                }
                let g = tape.gradient(&y.sum(&[0], false), &[&x]).unwrap().remove(0).unwrap();
                (k, vals(&g))
            })
        })
        .collect();
    let results: Vec<(usize, Vec<f64>)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Each thread's answer equals the same computation done here alone.
    for (k, g) in results {
        let x = Tensor::from_vec(vec![k as f64, 1.0 + k as f64], &[2]);
        let tape = GradientTape::new();
        tape.watch(&x);
        let mut y = x.clone();
        for _ in 0..50 {
            y = (&y * 1.01).sin();
        }
        let want = tape.gradient(&y.sum(&[0], false), &[&x]).unwrap().remove(0).unwrap();
        assert_eq!(g, vals(&want));
    }
    // A target made on another thread is an error.
    let y = std::thread::spawn(|| Tensor::from_vec(vec![1.0f64], &[1])).join().unwrap();
    let tape = GradientTape::new();
    let e = tape.gradient(&y, &[&y]).unwrap_err().to_string();
    assert!(e.contains("another thread"), "{e}");
}

#[test]
fn traced_variables_gradients_match_eager() {
    let w = Variable::new(Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]));
    let w2 = w.clone();
    let step = function(move |x: Tensor| {
        let (loss, g) = value_and_grad(std::slice::from_ref(&w2), || (w2.read() * &x).tanh().sum_all()).unwrap();
        (loss, g[0].clone())
    });
    let x = Tensor::from_vec(vec![1.0f32, 0.5, -0.25], &[3]);
    let (l, g) = step.call(x.clone()).unwrap();
    let (le, ge) = value_and_grad(std::slice::from_ref(&w), || (w.read() * &x).tanh().sum_all()).unwrap();
    let f = |t: &Tensor| t.to_vec::<f32>().unwrap();
    assert!(f(&l).iter().zip(f(&le)).all(|(a, b)| (a - b).abs() <= 1e-6));
    assert!(f(&g).iter().zip(f(&ge[0])).all(|(a, b)| (a - b).abs() <= 1e-6));
}

/// A small classifier: dense + relu, dense, softmax cross-entropy on
/// integer labels (W6's loss), through the `tracejit::nn` composites.
fn classifier_loss(x: &Tensor, labels: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor, b2: &Tensor) -> Tensor {
    use tracejit::nn::{dense, softmax_cross_entropy_with_logits, Activation};
    let h = dense(x, w1, b1, Activation::Relu);
    let logits = dense(&h, w2, b2, Activation::Linear);
    let onehot = labels.one_hot(3, logits.dtype());
    softmax_cross_entropy_with_logits(&logits, &onehot).mean(&[0], false)
}

fn params() -> Vec<Variable> {
    let t = |v: Vec<f64>, s: &[usize]| Variable::new(Tensor::from_vec(v, s));
    vec![
        t(vec![0.2, -0.5, 0.3, 0.8, -0.1, 0.4, 0.6, -0.3], &[2, 4]),
        t(vec![0.05, -0.02, 0.1, 0.0], &[4]),
        t(vec![0.3, -0.2, 0.1, 0.5, 0.4, -0.6, -0.3, 0.2, 0.7, 0.1, -0.4, 0.25], &[4, 3]),
        t(vec![0.01, 0.02, -0.03], &[3]),
    ]
}

#[test]
fn gradients_flow_through_composites_and_function_calls() {
    let x = Tensor::from_vec(vec![1.0f64, -0.5, 0.3, 2.0, -1.2, 0.7, 0.4, 0.4, 2.2, -0.3], &[5, 2]);
    let labels = Tensor::from_vec(vec![0i64, 2, 1, 1, 0], &[5]);
    let vars = params();
    let run = |vals: &[Tensor]| classifier_loss(&x, &labels, &vals[0], &vals[1], &vals[2], &vals[3]);
    let (loss, grads) = value_and_grad(&vars, || {
        let r: Vec<Tensor> = vars.iter().map(Variable::read).collect();
        run(&r)
    })
    .unwrap();
    // Finite differences, element by element.
    for (k, v) in vars.iter().enumerate() {
        let base = vals(&v.value());
        let got = vals(&grads[k]);
        for i in 0..base.len() {
            let at = |d: f64| {
                let mut r: Vec<Tensor> = vars.iter().map(Variable::value).collect();
                let mut p = base.clone();
                p[i] += d;
                r[k] = Tensor::from_vec(p, v.value().shape());
                vals(&run(&r))[0]
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            assert!((got[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0), "param {k} elt {i}: {} vs {fd}", got[i]);
        }
    }
    // The same step traced: one graph, the same loss and gradients.
    let (x2, l2, vars2) = (x.clone(), labels.clone(), vars.clone());
    let step = function(move |()| {
        let (loss, grads) = value_and_grad(&vars2, || {
            let r: Vec<Tensor> = vars2.iter().map(Variable::read).collect();
            classifier_loss(&x2, &l2, &r[0], &r[1], &r[2], &r[3])
        })
        .unwrap();
        (loss, grads)
    });
    let (tl, tg) = step.call(()).unwrap();
    assert!(close(&vals(&tl), &vals(&loss), 1e-12));
    for (a, b) in tg.iter().zip(&grads) {
        assert!(close(&vals(a), &vals(b), 1e-10));
    }
}

#[test]
fn a_function_called_under_a_tape_is_differentiated() {
    let inner = function(|x: Tensor| (x.sin() * &x).sum(&[0], false));
    let x = x3();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = inner.call(x.clone()).unwrap() * 2.0;
    let g = tape.gradient(&y, &[&x]).unwrap().remove(0).expect("the call is recorded");
    let want: Vec<f64> = vals(&x).iter().map(|v| 2.0 * (v.cos() * v + v.sin())).collect();
    assert!(close(&vals(&g), &want, 1e-12));
}

mod props {
    use proptest::prelude::*;
    use tracejit::prelude::*;

    /// A random program over x [rows, cols] and a bias [cols]: elementwise
    /// ops, broadcasting, a reduction and a matmul.
    fn program(x: &Tensor, b: &Tensor, picks: &[u8]) -> Tensor {
        let mut y = x.clone();
        for &k in picks {
            y = match k % 9 {
                0 => y.tanh(),
                1 => &y * b,
                2 => &y + b,
                3 => y.sigmoid(),
                4 => (&y * 0.5).exp(),
                5 => y.softplus(),
                6 => &y - y.mean(&[1], true),
                7 => y.maximum(b),
                _ => y.matmul(&y.transpose(&[1, 0])).matmul(&y) * 0.1,
            };
        }
        y.sum(&[0, 1], false)
    }

    fn grads(x: &Tensor, b: &Tensor, picks: &[u8]) -> Vec<Option<Tensor>> {
        let tape = GradientTape::new();
        tape.watch(x);
        tape.watch(b);
        let y = program(x, b, picks);
        tape.gradient(&y, &[x, b]).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Eager gradients equal the traced, optimized, JIT-compiled ones
        /// (f32, within a few ULP-scaled units), odd sizes included.
        #[test]
        fn eager_and_traced_gradients_agree(
            rows in prop::sample::select(vec![1usize, 3, 5]),
            cols in prop::sample::select(vec![1usize, 2, 7]),
            seed in 0u64..1000,
            picks in prop::collection::vec(0u8..9, 1..5),
        ) {
            let x = Tensor::randn(&[rows, cols], seed) * 0.5;
            let b = Tensor::randn(&[cols], seed + 1) * 0.5;
            let eager = grads(&x, &b, &picks);
            let p2 = picks.clone();
            let f = function(move |(x, b): (Tensor, Tensor)| grads(&x, &b, &p2));
            let traced = f.call((x, b)).unwrap();
            prop_assert_eq!(eager.iter().map(Option::is_some).collect::<Vec<_>>(), traced.iter().map(Option::is_some).collect::<Vec<_>>());
            for (e, t) in eager.iter().flatten().zip(traced.iter().flatten()) {
                let (e, t) = (e.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
                for (a, c) in e.iter().zip(&t) {
                    prop_assert!((a - c).abs() <= 1e-4 * a.abs().max(1.0), "{a} vs {c}");
                }
            }
        }
    }
}

#[test]
fn a_registered_backward_kernel_replaces_the_body_eagerly_and_traced() {
    // The registered gradient is 3x the true one, so it is visibly used.
    tracejit::composite::register_gradient(
        "tests.grad.cube",
        |xs: &[Tensor], _ys: &[Tensor], cts: &[Option<Tensor>]| vec![cts[0].as_ref().map(|g| g * xs[0].square() * 9.0)],
    );
    let cube = function(|x: Tensor| &x * &x * &x).implements("tests.grad.cube");
    let x = x3();
    let want: Vec<f64> = vals(&x).iter().map(|v| 9.0 * v * v).collect();
    let c2 = cube.clone();
    let eager = {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = c2.call(x.clone()).unwrap();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    };
    assert!(close(&vals(&eager), &want, 1e-12));
    let traced = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = cube.call(x.clone()).unwrap();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    })
    .call(x.clone())
    .unwrap();
    assert!(close(&vals(&traced), &want, 1e-12));
    assert!(tracejit::composite::unregister_gradient("tests.grad.cube"));
}

#[test]
fn the_readme_training_step_trains() {
    let w = Variable::new(Tensor::randn(&[3, 2], 0));
    let w2 = w.clone();
    let step = function(move |x: Tensor| {
        let tape = GradientTape::new();
        let loss = x.matmul(&w2.read()).tanh().square().mean(&[0, 1], false);
        let g = tape.gradient(&loss, std::slice::from_ref(&w2)).unwrap().remove(0).unwrap();
        w2.assign_sub(&(g * 0.1));
        loss
    });
    let x = Tensor::randn(&[4, 3], 1);
    let first = step.call(x.clone()).unwrap().to_vec::<f32>().unwrap()[0];
    let mut last = first;
    for _ in 0..20 {
        last = step.call(x.clone()).unwrap().to_vec::<f32>().unwrap()[0];
    }
    assert_eq!(step.tracing_count(), 1);
    assert!(last < first, "the loss falls: {first} -> {last}");
    let _ = w.value();
}

#[test]
fn functions_that_read_variables_are_differentiated_eagerly_and_traced() {
    // The Keras pattern: the model is a function reading its variables; the
    // tape (eager, or inside a traced train step) is outside it.
    let w = Variable::new(Tensor::from_vec(vec![0.5f64, -0.3, 0.8, 0.1], &[2, 2]));
    let b = Variable::new(Tensor::from_vec(vec![0.1f64, -0.2], &[2]));
    let (w1, b1) = (w.clone(), b.clone());
    let model = function(move |x: Tensor| (x.matmul(&w1.read()) + b1.read()).tanh());
    let x = Tensor::from_vec(vec![1.0f64, 2.0, -1.0, 0.5], &[2, 2]);
    let direct = |w: &Tensor, b: &Tensor| (x.matmul(w) + b).tanh().square().sum_all();
    // Reference: the same loss without the function.
    let tape = GradientTape::new();
    let want = tape.gradient(&direct(&w.read(), &b.read()), &[w.clone(), b.clone()]).unwrap();
    // Eager tape around the function call.
    let tape = GradientTape::new();
    let loss = model.call(x.clone()).unwrap().square().sum_all();
    let got = tape.gradient(&loss, &[w.clone(), b.clone()]).unwrap();
    for (g, h) in got.iter().zip(&want) {
        assert!(close(&vals(g.as_ref().expect("connected")), &vals(h.as_ref().unwrap()), 1e-12));
    }
    // A traced train step calling the model function.
    let (m2, w2, b2, x2) = (model.clone(), w.clone(), b.clone(), x.clone());
    let step = function(move |()| {
        let tape = GradientTape::new();
        let loss = m2.call(x2.clone()).unwrap().square().sum_all();
        tape.gradient(&loss, &[w2.clone(), b2.clone()]).unwrap().into_iter().map(Option::unwrap).collect::<Vec<_>>()
    });
    let traced = step.call(()).unwrap();
    for (g, h) in traced.iter().zip(&want) {
        assert!(close(&vals(g), &vals(h.as_ref().unwrap()), 1e-12));
    }
}

#[test]
fn eager_f32_composites_with_native_kernels_are_differentiated() {
    // f32 inputs select the registered native kernels eagerly; the tape
    // must still see the call. f64 inputs run the primitive bodies: the
    // reference for the gradients.
    let losses = |x: &Tensor| {
        let d = x.dtype();
        vec![
            ("gelu", tracejit::nn::gelu(x).sum_all()),
            ("softmax", (tracejit::nn::softmax(x, -1) * x).sum_all()),
            (
                "layer_norm",
                (tracejit::nn::layer_norm(x, &Tensor::ones(&[3], d), &Tensor::zeros(&[3], d), 1e-5) * x).sum_all(),
            ),
        ]
    };
    let data = vec![0.5f64, -1.0, 2.0, 0.1, 0.3, -0.7];
    let x64 = Tensor::from_vec(data.clone(), &[2, 3]);
    let x32 = x64.cast(DType::F32);
    let (t64, t32) = (GradientTape::persistent(), GradientTape::persistent());
    t64.watch(&x64);
    t32.watch(&x32);
    for ((name, y64), (_, y32)) in losses(&x64).into_iter().zip(losses(&x32)) {
        let want = vals(&t64.gradient(&y64, &[&x64]).unwrap()[0].clone().unwrap());
        let got = t32.gradient(&y32, &[&x32]).unwrap()[0].clone().map(|g| vals(&g.cast(DType::F64)));
        let got = got.unwrap_or_else(|| panic!("{name}: no gradient reached x"));
        assert!(close(&got, &want, 1e-4), "{name}: {got:?} vs {want:?}");
    }
}

fn ln_loss(x: &Tensor, g: &Tensor, b: &Tensor, up: &Tensor) -> Tensor {
    (tracejit::nn::layer_norm(x, g, b, 1e-5) * up).sum_all()
}

fn ln_grads(x: &Tensor, g: &Tensor, b: &Tensor, up: &Tensor) -> Vec<Tensor> {
    let tape = GradientTape::new();
    for t in [x, g, b] {
        tape.watch(t);
    }
    let y = ln_loss(x, g, b, up);
    tape.gradient(&y, &[x, g, b]).unwrap().into_iter().map(Option::unwrap).collect()
}

#[test]
fn the_layer_norm_backward_kernel_matches_finite_differences() {
    let x = Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 0.1, 0.3, -0.7, 1.5, 0.0, -0.2, 0.9, 0.4, -1.1], &[4, 3]);
    let up = Tensor::from_vec(vec![0.3f64, -0.8, 1.1, 0.2, 0.5, -0.4, 0.7, 0.6, -0.9, 0.1, 1.3, -0.2], &[4, 3]);
    for gshape in [vec![3usize], vec![1, 3]] {
        let gamma = Tensor::from_vec(vec![1.2f64, -0.7, 0.4], &gshape);
        let beta = Tensor::from_vec(vec![0.1f64, 0.2, -0.3], &gshape);
        let up2 = up.clone();
        let traced = function(move |(x, g, b): (Tensor, Tensor, Tensor)| ln_grads(&x, &g, &b, &up2));
        let eager = ln_grads(&x, &gamma, &beta, &up);
        let compiled = traced.call((x.clone(), gamma.clone(), beta.clone())).unwrap();
        let args = [x.clone(), gamma.clone(), beta.clone()];
        for k in 0..3 {
            let base = vals(&args[k]);
            for i in 0..base.len() {
                let at = |d: f64| {
                    let mut a = args.clone();
                    let mut p = base.clone();
                    p[i] += d;
                    a[k] = Tensor::from_vec(p, args[k].shape());
                    vals(&ln_loss(&a[0], &a[1], &a[2], &up))[0]
                };
                let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
                for (what, got) in [("eager", &eager[k]), ("traced", &compiled[k])] {
                    let got = vals(got)[i];
                    assert!((got - fd).abs() <= 1e-6 * fd.abs().max(1.0), "{what} arg {k} elt {i}: {got} vs {fd}");
                }
            }
        }
    }
}

/// A way of asking a tape for gradients.
type Form<'a> = dyn Fn(&GradientTape, &Tensor) -> Vec<Option<Tensor>> + 'a;

/// Every source form DESIGN.md names works, borrowed or owned, slices,
/// arrays and vectors, and all give the same gradients.
#[test]
fn sources_by_reference_array_slice_or_vector_agree() {
    let x = x3();
    let w = Variable::new(Tensor::from_vec(vec![0.5f64, -1.5, 2.0], &[3]));
    let run = |f: &Form<'_>| {
        let tape = GradientTape::persistent();
        tape.watch(&x);
        let y = (&x * &x * w.read()).sum(&[0], false);
        f(&tape, &y).into_iter().map(|g| vals(&g.unwrap())).collect::<Vec<_>>()
    };
    let want = run(&|t, y| {
        let mut g = t.gradient(y, &[&x]).unwrap();
        g.extend(t.gradient(y, std::slice::from_ref(&w)).unwrap());
        g
    });
    let forms: [&Form<'_>; 4] = [
        &|t, y| {
            let mut g = t.gradient(y, &vec![&x]).unwrap();
            g.extend(t.gradient(y, &vec![&w]).unwrap());
            g
        },
        &|t, y| {
            let mut g = t.gradient(y, &[x.clone()][..]).unwrap();
            g.extend(t.gradient(y, &[&w]).unwrap());
            g
        },
        &|t, y| {
            let mut g = t.gradient(y, &vec![x.clone()]).unwrap();
            g.extend(t.gradient(y, &[&w][..]).unwrap());
            g
        },
        &|t, y| {
            let mut g = t.gradient(y, &[&x][..]).unwrap();
            g.extend(t.gradient(y, &vec![w.clone()]).unwrap());
            g
        },
    ];
    for (i, f) in forms.iter().enumerate() {
        assert_eq!(run(f), want, "form {i}");
    }
}

#[test]
fn the_gradient_of_a_product_is_the_product_of_the_others_even_at_zeros() {
    let grad = |x: &Tensor| {
        let tape = GradientTape::new();
        tape.watch(x);
        let y = x.prod(&[1], false).sum_all();
        tape.gradient(&y, &[x]).unwrap().remove(0).unwrap()
    };
    let traced = function(move |x: Tensor| grad(&x));
    // Rows: no zero, one zero, two zeros, three zeros, a zero elsewhere.
    let x =
        Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 0.0, 2.0, 3.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 4.0, 0.0, -2.0], &[5, 3]);
    let want = [6.0, 3.0, 2.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -8.0, 0.0];
    assert_eq!(vals(&grad(&x)), want, "eager");
    assert_eq!(vals(&traced.call(x.clone()).unwrap()), want, "traced");
    // Over every axis, f32 too.
    let x = Tensor::from_vec(vec![0.0f32, 2.0, 3.0], &[3]);
    let g = {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = x.prod_all();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    };
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![6.0, 0.0, 0.0]);
}

/// A weight shared by a batch of matrices (`[b, m, k] @ [k, n]`, as every
/// dense layer on a sequence): its gradient is one product over all rows
/// (reshaped), checked against central differences, eagerly and in a
/// function whose batch dim is unknown.
#[test]
fn a_shared_weights_gradient_over_a_batch_of_matrices_matches_finite_differences() {
    let x = Tensor::randn(&[3, 4, 5], 11).cast(DType::F64);
    let w = Tensor::randn(&[5, 2], 12).cast(DType::F64);
    let loss = |x: &Tensor, w: &Tensor| (x.matmul(w).tanh() * x.matmul(w)).sum_all();
    let grads = move |x: Tensor, w: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        tape.watch(&w);
        let y = loss(&x, &w);
        let g = tape.gradient(&y, &[&x, &w]).unwrap();
        (g[0].clone().unwrap(), g[1].clone().unwrap())
    };
    let (gx, gw) = grads(x.clone(), w.clone());
    let h = 1e-6;
    let wv = vals(&w);
    let fd: Vec<f64> = (0..wv.len())
        .map(|i| {
            let bump = |d: f64| {
                let mut v = wv.clone();
                v[i] += d;
                vals(&loss(&x, &Tensor::from_vec(v, &[5, 2])))[0]
            };
            (bump(h) - bump(-h)) / (2.0 * h)
        })
        .collect();
    assert!(close(&vals(&gw), &fd, 1e-6), "{:?} vs {fd:?}", vals(&gw));
    let f = function(move |(x, w): (Tensor, Tensor)| {
        let (gx, gw) = grads(x, w);
        vec![gx, gw]
    })
    .input_signature(vec![TensorSpec::new(DType::F64, &[-1, 4, 5]), TensorSpec::new(DType::F64, &[5, 2])]);
    let traced = f.call((x, w)).unwrap();
    assert!(close(&vals(&traced[0]), &vals(&gx), 1e-12));
    assert!(close(&vals(&traced[1]), &vals(&gw), 1e-12));
}
