//! Gradients of the convolutional layers against central finite
//! differences in f64 (strided, dilated, grouped, padded convolutions
//! with and without bias; pools; batch norm in training), eagerly and
//! through a Function traced with an unknown batch; batch norm's moving
//! statistics (assigned in training, read in inference, non-trainable,
//! checkpointed).

use tracejit::nn::{avg_pool2d, batch_norm, conv2d, max_pool2d, Conv2dOptions};
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, seed).cast(DType::F64)
}

/// Values spread at least 0.01 apart (a permutation of a grid), so that
/// finite differences of a max pool never cross a tie.
fn distinct(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * 0.01 - n as f64 * 0.005).collect();
    let mut s = seed | 1;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    Tensor::from_vec(v, shape)
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| (got[i] - want[i]).abs() > tol * want[i].abs().max(1.0)) {
        panic!("{what}: element {i} of {}: autodiff {} vs finite differences {}", got.len(), got[i], want[i]);
    }
}

fn finite_differences(x: &Tensor, h: f64, f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let xs = vals(x);
    let shape = x.shape().to_vec();
    (0..xs.len())
        .map(|i| {
            let at = |d: f64| {
                let mut v = xs.clone();
                v[i] += d;
                f(&Tensor::from_vec(v, &shape))
            };
            (at(h) - at(-h)) / (2.0 * h)
        })
        .collect()
}

type Loss = fn(&[Tensor]) -> Tensor;

/// `sum(y² / 2 + sin(y))`: a cotangent that differs per element.
fn weighted(y: &Tensor) -> Tensor {
    (y.square() * 0.5 + y.sin()).sum_all()
}

/// The tape's gradients of `loss` against central differences, eagerly
/// and through a function traced with the first input's batch unknown.
fn check(name: &str, loss: Loss, inputs: &[Tensor]) {
    let tape = GradientTape::persistent();
    inputs.iter().for_each(|x| tape.watch(x));
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let eager: Vec<Tensor> =
        tape.gradient(&loss(inputs), refs.as_slice()).unwrap().into_iter().map(Option::unwrap).collect();
    let f = function(move |xs: Vec<Tensor>| {
        let tape = GradientTape::new();
        xs.iter().for_each(|x| tape.watch(x));
        let refs: Vec<&Tensor> = xs.iter().collect();
        tape.gradient(&loss(&xs), refs.as_slice()).unwrap().into_iter().map(Option::unwrap).collect::<Vec<_>>()
    });
    let specs: Vec<TensorSpec> = inputs
        .iter()
        .enumerate()
        .map(|(k, x)| {
            let mut dims: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
            if k == 0 {
                dims[0] = -1;
            }
            TensorSpec::new(x.dtype(), &dims)
        })
        .collect();
    let cf = f.get_concrete_function(specs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let traced = cf.call_flat(inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, x) in inputs.iter().enumerate() {
        let fd = finite_differences(x, 1e-5, &|xk| {
            let mut xs = inputs.to_vec();
            xs[k] = xk.clone();
            vals(&loss(&xs))[0]
        });
        assert_close(&format!("{name}: eager gradient {k}"), &vals(&eager[k]), &fd, 1e-6);
        assert_close(&format!("{name}: traced gradient {k}"), &vals(&traced[k]), &fd, 1e-6);
    }
}

#[test]
fn conv_gradients_match_finite_differences() {
    let cases: [(&str, Loss, [usize; 4], [usize; 4]); 6] = [
        (
            "plain",
            |xs| weighted(&conv2d(&xs[0], &xs[1], Some(&xs[2]), Conv2dOptions::default())),
            [2, 2, 4, 5],
            [3, 2, 3, 2],
        ),
        (
            "strided, padded",
            |xs| {
                weighted(&conv2d(
                    &xs[0],
                    &xs[1],
                    Some(&xs[2]),
                    Conv2dOptions::default().stride([2, 3]).pads([1, 0, 2, 1]),
                ))
            },
            [1, 2, 5, 7],
            [2, 2, 3, 3],
        ),
        (
            "dilated",
            |xs| weighted(&conv2d(&xs[0], &xs[1], Some(&xs[2]), Conv2dOptions::default().dilation([2, 1]).padding(1))),
            [3, 1, 5, 4],
            [2, 1, 2, 3],
        ),
        (
            "grouped",
            |xs| weighted(&conv2d(&xs[0], &xs[1], Some(&xs[2]), Conv2dOptions::default().groups(2).stride(2))),
            [1, 4, 5, 5],
            [6, 2, 2, 2],
        ),
        (
            "depthwise, same",
            |xs| weighted(&conv2d(&xs[0], &xs[1], Some(&xs[2]), Conv2dOptions::default().groups(3).padding_same())),
            [2, 3, 4, 3],
            [3, 1, 3, 2],
        ),
        (
            "one pixel",
            |xs| weighted(&conv2d(&xs[0], &xs[1], Some(&xs[2]), Conv2dOptions::default())),
            [1, 1, 1, 1],
            [1, 1, 1, 1],
        ),
    ];
    for (name, loss, x, w) in cases {
        let inputs = [randn(&x, 1), randn(&w, 2) * 0.5, randn(&[w[0]], 3)];
        check(name, loss, &inputs);
    }
    // Without a bias.
    check(
        "no bias",
        |xs| weighted(&conv2d(&xs[0], &xs[1], None, Conv2dOptions::default().padding(1))),
        &[randn(&[2, 2, 3, 3], 4), randn(&[2, 2, 3, 3], 5)],
    );
}

#[test]
fn pool_gradients_match_finite_differences() {
    check("max 2x2", |xs| weighted(&max_pool2d(&xs[0], [2, 2], [2, 2], [0, 0])), &[distinct(&[2, 2, 5, 4], 1)]);
    check(
        "max 3x3 overlapping, padded",
        |xs| weighted(&max_pool2d(&xs[0], [3, 2], [1, 2], [1, 1])),
        &[distinct(&[1, 3, 4, 5], 2)],
    );
    check("avg 3x3 padded", |xs| weighted(&avg_pool2d(&xs[0], [3, 3], [1, 1], [1, 1])), &[randn(&[2, 2, 4, 3], 3)]);
    check("avg strided", |xs| weighted(&avg_pool2d(&xs[0], [2, 3], [2, 1], [0, 1])), &[randn(&[1, 2, 5, 5], 4)]);
}

#[test]
fn batch_norm_gradients_match_finite_differences() {
    // Fresh moving statistics per call: the assignments are not
    // differentiated and do not change the result in training.
    let loss: Loss = |xs| {
        let c = xs[1].shape()[0];
        let mean = Variable::new(Tensor::zeros(&[c], DType::F64)).with_trainable(false);
        let var = Variable::new(Tensor::ones(&[c], DType::F64)).with_trainable(false);
        weighted(&batch_norm(&xs[0], &xs[1], &xs[2], &mean, &var, 0.9, 1e-3, true))
    };
    let f = |xs: &[Tensor]| vals(&loss(xs))[0];
    let inputs = [randn(&[3, 2, 2, 3], 1), randn(&[2], 2) * 0.5 + 1.0, randn(&[2], 3)];
    // Eagerly only: a traced function may create its variables on its
    // first trace only (the finite differences above run eagerly too).
    let tape = GradientTape::persistent();
    inputs.iter().for_each(|x| tape.watch(x));
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let grads = tape.gradient(&loss(&inputs), refs.as_slice()).unwrap();
    for (k, g) in grads.into_iter().enumerate() {
        let fd = finite_differences(&inputs[k], 1e-5, &|xk| {
            let mut xs = inputs.to_vec();
            xs[k] = xk.clone();
            f(&xs)
        });
        assert_close(&format!("batch_norm gradient {k}"), &vals(&g.unwrap()), &fd, 1e-6);
    }
}

#[test]
fn batch_norm_keeps_moving_statistics_and_infers_with_them() {
    let x = randn(&[4, 3, 2, 2], 7) * 2.0 + 1.0;
    let (gamma, beta) = (Tensor::ones(&[3], DType::F64), Tensor::zeros(&[3], DType::F64));
    let mean = Variable::new(Tensor::zeros(&[3], DType::F64)).with_trainable(false).with_name("bn/moving_mean");
    let var = Variable::new(Tensor::ones(&[3], DType::F64)).with_trainable(false).with_name("bn/moving_var");
    let (m2, v2, g2, b2) = (mean.clone(), var.clone(), gamma.clone(), beta.clone());
    let train = function(move |x: Tensor| batch_norm(&x, &g2, &b2, &m2, &v2, 0.9, 1e-5, true));
    let y = train.call(x.clone()).unwrap();
    // Training output: per channel, mean 0 and (biased) variance ~1.
    let yv = vals(&y);
    for c in 0..3 {
        let ch: Vec<f64> = (0..4).flat_map(|n| (0..4).map(move |p| (n * 3 + c) * 4 + p)).map(|i| yv[i]).collect();
        let m = ch.iter().sum::<f64>() / 16.0;
        let v = ch.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 16.0;
        assert!(m.abs() < 1e-12 && (v - 1.0).abs() < 1e-4, "channel {c}: mean {m}, var {v}");
    }
    // moving = 0.9 · old + 0.1 · batch (biased variance).
    let xv = vals(&x);
    let batch_mean: Vec<f64> = (0..3)
        .map(|c| (0..4).flat_map(|n| (0..4).map(move |p| (n * 3 + c) * 4 + p)).map(|i| xv[i]).sum::<f64>() / 16.0)
        .collect();
    let got = vals(&mean.value());
    for c in 0..3 {
        assert!((got[c] - 0.1 * batch_mean[c]).abs() < 1e-12, "{got:?} vs {batch_mean:?}");
    }
    train.call(x.clone()).unwrap();
    assert!((vals(&mean.value())[0] - 0.19 * batch_mean[0]).abs() < 1e-12, "a second step updates again");
    // Inference reads the moving values and assigns nothing.
    let before = vals(&var.value());
    let (m3, v3) = (mean.clone(), var.clone());
    let infer = function(move |x: Tensor| batch_norm(&x, &gamma, &beta, &m3, &v3, 0.9, 1e-5, false));
    let y = infer.call(x.clone()).unwrap();
    let (mv, vv) = (vals(&mean.value()), vals(&var.value()));
    assert_eq!(vv, before);
    let want = (xv[0] - mv[0]) / (vv[0] + 1e-5).sqrt();
    assert!((vals(&y)[0] - want).abs() < 1e-12);
    assert!(!mean.trainable() && !var.trainable());
}

/// An empty batch has no statistics: the moving mean and variance keep
/// their values (the issue: both became NaN), eagerly, traced with the
/// batch known and traced with it unknown (counted at run time), where a
/// non-empty batch through the same graph still updates them.
#[test]
fn an_empty_batch_leaves_the_moving_statistics_unchanged() {
    let (gamma, beta) = (Tensor::ones(&[3], DType::F64), Tensor::zeros(&[3], DType::F64));
    let stats = || {
        (
            Variable::new(Tensor::from_vec(vec![0.5f64, -1.0, 2.0], &[3])).with_trainable(false),
            Variable::new(Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3])).with_trainable(false),
        )
    };
    let empty = Tensor::zeros(&[0, 3, 2, 2], DType::F64);
    let (mean, var) = stats();
    let (m0, v0) = (vals(&mean.value()), vals(&var.value()));
    let y = batch_norm(&empty, &gamma, &beta, &mean, &var, 0.9, 1e-5, true);
    assert_eq!(y.shape(), &[0, 3, 2, 2]);
    assert_eq!((vals(&mean.value()), vals(&var.value())), (m0.clone(), v0.clone()), "eager");
    for spec in [&[0i64, 3, 2, 2][..], &[-1, 3, 2, 2]] {
        let (mean, var) = stats();
        let (g, b, m, v) = (gamma.clone(), beta.clone(), mean.clone(), var.clone());
        let f = function(move |x: Tensor| batch_norm(&x, &g, &b, &m, &v, 0.9, 1e-5, true))
            .input_signature(vec![TensorSpec::new(DType::F64, spec)]);
        f.call(empty.clone()).unwrap();
        assert_eq!((vals(&mean.value()), vals(&var.value())), (m0.clone(), v0.clone()), "traced {spec:?}");
        if spec[0] < 0 {
            f.call(randn(&[2, 3, 2, 2], 1)).unwrap();
            assert!(vals(&mean.value()).iter().zip(&m0).all(|(a, b)| a != b), "a real batch updates");
            assert!(vals(&mean.value()).iter().all(|a| a.is_finite()));
        }
    }
}

/// Hyperparameters out of range are refused with a message naming the
/// value, as the optimizers' are (momentum 2 would grow the moving
/// averages without bound; a negative eps can divide by zero).
#[test]
fn batch_norm_refuses_bad_momentum_and_epsilon() {
    let x = randn(&[2, 3], 1);
    let (gamma, beta) = (Tensor::ones(&[3], DType::F64), Tensor::zeros(&[3], DType::F64));
    let mean = Variable::new(Tensor::zeros(&[3], DType::F64)).with_trainable(false);
    let var = Variable::new(Tensor::ones(&[3], DType::F64)).with_trainable(false);
    for (momentum, eps, what) in
        [(2.0, 1e-5, "momentum"), (-0.1, 1e-5, "momentum"), (0.9, -1e-5, "eps"), (0.9, f64::NAN, "eps")]
    {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batch_norm(&x, &gamma, &beta, &mean, &var, momentum, eps, true)
        }));
        let msg = match r {
            Ok(_) => panic!("momentum {momentum}, eps {eps} accepted"),
            Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
        };
        assert!(msg.contains("batch_norm") && msg.contains(what), "{msg}");
        let value = if what == "momentum" { momentum } else { eps };
        assert!(msg.contains(&value.to_string()), "{msg}");
    }
    assert_eq!(vals(&mean.value()), [0.0; 3], "nothing assigned");
}

mod forward_mode {
    use super::*;
    use proptest::prelude::*;
    use tracejit::autodiff::{jacfwd, jacrev, jvp};

    /// A max pool's geometry: input `[n, c, h, w]`, window, stride, padding
    /// (below the window), the window fitting the padded input.
    fn pool_case() -> impl Strategy<Value = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], u64)> {
        (1usize..3, 1usize..4, 1usize..7, 1usize..7, 1usize..4, 1usize..4, 1usize..4, 1usize..4, 0u64..1000)
            .prop_flat_map(|(n, c, h, w, kh, kw, sh, sw, seed)| {
                (Just((n, c, h, w, kh, kw, sh, sw, seed)), 0..kh, 0..kw)
            })
            .prop_filter_map("the window fits", |((n, c, h, w, kh, kw, sh, sw, seed), ph, pw)| {
                (h + 2 * ph >= kh && w + 2 * pw >= kw).then_some(([n, c, h, w], [kh, kw], [sh, sw], [ph, pw], seed))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// `jvp` through a max pool (a first derivative: the tangent read at
        /// each window's maximum) against central differences on distinct
        /// values; `jacfwd` equals `jacrev` exactly on inputs with ties,
        /// -inf and NaN (both route to the first maximum, or the last NaN).
        #[test]
        fn jvp_and_jacfwd_through_a_max_pool((shape, k, s, p, seed) in pool_case()) {
            let pool = move |x: &Tensor| max_pool2d(x, k, s, p);
            let x = distinct(&shape, seed);
            let v = randn(&shape, seed + 1);
            let (y, y_dot) = jvp(pool, &x, &v);
            prop_assert_eq!(vals(&y), vals(&pool(&x)));
            // Values 0.01 apart and |h·v| < 0.005: no difference crosses a tie,
            // so the pool is linear along it and the quotient is exact up to
            // rounding of values of order n·0.005.
            let h = 1e-4;
            let fd: Vec<f64> = vals(&pool(&(&x + &(&v * h))))
                .iter()
                .zip(vals(&pool(&(&x - &(&v * h)))))
                .map(|(a, b)| (a - b) / (2.0 * h))
                .collect();
            assert_close("jvp through max_pool2d", &vals(&y_dot), &fd, 1e-7);
            let n: usize = shape.iter().product();
            let tricky: Vec<f64> = (0..n)
                .map(|i| match (i as u64 * 7 + seed) % 5 {
                    0 => f64::NAN,
                    1 => f64::NEG_INFINITY,
                    2 => 1.0,
                    _ => (i % 3) as f64,
                })
                .collect();
            let xt = Tensor::from_vec(tricky, &shape);
            let (jf, jr) = (jacfwd(pool)(&xt), jacrev(pool)(&xt));
            prop_assert_eq!(jf.shape(), jr.shape());
            prop_assert_eq!(vals(&jf), vals(&jr));
        }
    }

    /// Compiled: the same Jacobian as eagerly, one trace.
    #[test]
    fn jacfwd_through_a_max_pool_compiles() {
        let pool = |x: &Tensor| max_pool2d(x, [3, 2], [1, 2], [1, 1]);
        let x = distinct(&[1, 2, 4, 3], 5);
        let want = jacfwd(pool)(&x);
        let f = function(move |x: Tensor| jacfwd(pool)(&x));
        let got = f.call(x.clone()).unwrap();
        assert_eq!(vals(&got), vals(&want));
        assert_eq!(vals(&want), vals(&jacrev(pool)(&x)));
        assert_eq!(f.tracing_count(), 1);
    }
}
