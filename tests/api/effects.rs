//! Every transform runs a function's effects exactly once per call: a
//! function that reads a Variable, draws from a Generator and runs a batch
//! norm in training (two moving averages assigned) leaves, after one call
//! of `grad`, `jvp`, `jacfwd`, `jacrev`, `vmap` or a `checkpoint`ed block
//! under a tape, the state one plain call leaves, and its values equal the
//! plain function's (the primal, gradients by a tape, Jacobians by the
//! other mode), eagerly and compiled.

use proptest::prelude::*;
use tracejit::autodiff::{grad, jacfwd, jacrev, jvp};
use tracejit::nn::batch_norm;
use tracejit::prelude::*;
use tracejit::random::Generator;

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// The state a call touches, fresh from `seed` each time.
#[derive(Clone)]
struct Model {
    w: Variable,
    g: Generator,
    mean: Variable,
    var: Variable,
}

impl Model {
    fn new(d: usize, seed: u64) -> Model {
        Model {
            w: Variable::new(Tensor::randn(&[d, d], seed).cast(DType::F64) * 0.5),
            g: Generator::from_seed(seed),
            mean: Variable::new(Tensor::zeros(&[d], DType::F64)).with_trainable(false),
            var: Variable::new(Tensor::ones(&[d], DType::F64)).with_trainable(false),
        }
    }

    /// `[n, d] -> [n, d]`: a read, a draw, a batch norm (training
    /// assigns its moving averages; inference, under vmap, reads them).
    fn f(&self, training: bool) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static {
        let m = self.clone();
        move |x: &Tensor| {
            let d = m.w.shape()[0];
            let h = x.matmul(&m.w.read()).tanh();
            let (gamma, beta) = (Tensor::ones(&[d], DType::F64), Tensor::zeros(&[d], DType::F64));
            let h = batch_norm(&h, &gamma, &beta, &m.mean, &m.var, 0.9, 1e-3, training);
            &h * (m.g.normal_like(&h) * 0.1 + 1.0)
        }
    }

    fn state(&self) -> Vec<f64> {
        let mut s = vals(&self.mean.value());
        s.extend(vals(&self.var.value()));
        s.extend(self.g.state().value().to_vec::<i64>().unwrap().iter().map(|&c| c as f64));
        s
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn every_transform_runs_effects_once_per_call(n in 2usize..4, d in 1usize..4, seed in 0u64..1000) {
        let x = Tensor::randn(&[n, d], seed + 3).cast(DType::F64);
        let v = Tensor::randn(&[n, d], seed + 4).cast(DType::F64);
        // The plain call: its value, its gradient by a tape, the state it leaves.
        let plain = Model::new(d, seed);
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = plain.f(true)(&x);
        let want_grad = tape.gradient(&y.sum_all(), &[&x]).unwrap().remove(0).unwrap();
        let want_state = plain.state();
        let once = |m: &Model, what: &str| -> Result<(), TestCaseError> {
            prop_assert_eq!(m.state(), want_state.clone(), "{}: the state after one call", what);
            Ok(())
        };
        for compiled in [false, true] {
            let run = |f: Box<dyn Fn(&Tensor) -> Tensor + Send + Sync>| -> Tensor {
                if compiled {
                    let f = std::sync::Arc::new(f);
                    let g = function(move |x: Tensor| f(&x));
                    g.call(x.clone()).unwrap()
                } else {
                    f(&x)
                }
            };
            let tag = if compiled { "compiled" } else { "eager" };
            let m = Model::new(d, seed);
            let fm = m.f(true);
            let g = run(Box::new(move |x: &Tensor| grad({ let fm = fm.clone(); move |x: &Tensor| fm(x).sum_all() })(x)));
            prop_assert!(close(&vals(&g), &vals(&want_grad), 1e-10), "{} grad", tag);
            once(&m, &format!("{tag} grad"))?;
            let m = Model::new(d, seed);
            let fm = m.f(true);
            let vv = v.clone();
            let yy = run(Box::new(move |x: &Tensor| jvp(&fm, x, &vv).0));
            prop_assert!(close(&vals(&yy), &vals(&y), 1e-10), "{} jvp's primal", tag);
            once(&m, &format!("{tag} jvp"))?;
            let (mf, mr) = (Model::new(d, seed), Model::new(d, seed));
            let (ff, fr) = (mf.f(true), mr.f(true));
            let jf = run(Box::new(move |x: &Tensor| jacfwd(ff.clone())(x)));
            let jr = run(Box::new(move |x: &Tensor| jacrev(fr.clone())(x)));
            prop_assert!(close(&vals(&jf), &vals(&jr), 1e-9), "{} jacfwd vs jacrev", tag);
            once(&mf, &format!("{tag} jacfwd"))?;
            once(&mr, &format!("{tag} jacrev"))?;
            let m = Model::new(d, seed);
            let fm = m.f(true);
            let g = run(Box::new(move |x: &Tensor| {
                let tape = GradientTape::new();
                tape.watch(x);
                let y = tracejit::autodiff::checkpoint(fm.clone())(x);
                tape.gradient(&y.sum_all(), &[x]).unwrap().remove(0).unwrap()
            }));
            prop_assert!(close(&vals(&g), &vals(&want_grad), 1e-10), "{} checkpoint", tag);
            once(&m, &format!("{tag} checkpoint"))?;
            // vmap: batch norm reads (inference); the generator advances once.
            let (mv, mp) = (Model::new(d, seed), Model::new(d, seed));
            let fv = mv.f(false);
            let xs = x.reshape(&[n as i64, 1, d as i64]);
            let got = if compiled {
                function(move |xs: Tensor| tracejit::vmap(fv.clone())(&xs)).call(xs.clone()).unwrap()
            } else {
                tracejit::vmap(fv)(&xs)
            };
            let want = mp.f(false)(&x).reshape(&[n as i64, 1, d as i64]);
            prop_assert!(close(&vals(&got), &vals(&want), 1e-10), "{} vmap", tag);
            prop_assert_eq!(mv.state(), mp.state(), "{} vmap: the state after one call", tag);
        }
    }
}
