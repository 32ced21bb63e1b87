//! `autodiff::{grad, jvp, jacrev, jacfwd, hessian}` against central
//! differences on random f64 inputs (odd and empty sizes), eagerly and in
//! compiled functions, nested in each other.

use proptest::prelude::*;
use tracejit::autodiff::{grad, hessian, jacfwd, jacrev, jvp};
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// A vector function with products, broadcasting and a reduction: [n] -> [2, n].
fn vector_fn(x: &Tensor) -> Tensor {
    let a = (x * x).tanh() + x.sum_all() * 0.3;
    let b = x.sin() * x.exp().mean_all();
    Tensor::stack(&[a, b], 0)
}

fn scalar_fn(x: &Tensor) -> Tensor {
    (vector_fn(x) * vector_fn(x)).sum_all() + (x * x * x).sum_all() * 0.1
}

fn t(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()])
}

/// Central differences of `f` at `x` along each basis vector: `[out.., n]`
/// row-major as `Vec` of columns.
fn fd_columns(f: &dyn Fn(&Tensor) -> Tensor, x: &[f64]) -> Vec<Vec<f64>> {
    let h = 1e-6;
    (0..x.len())
        .map(|j| {
            let at = |d: f64| {
                let mut v = x.to_vec();
                v[j] += d;
                vals(&f(&t(&v)))
            };
            at(h).iter().zip(at(-h)).map(|(p, m)| (p - m) / (2.0 * h)).collect()
        })
        .collect()
}

/// `[out, n]` from columns.
fn transpose(cols: &[Vec<f64>]) -> Vec<f64> {
    let (n, m) = (cols.len(), cols.first().map_or(0, Vec::len));
    (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| cols[j][i]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn grad_jvp_and_jacobians_match_finite_differences(x in prop::collection::vec(-1.5f64..1.5, 1..6)) {
        let n = x.len();
        let xt = t(&x);
        let cols = fd_columns(&|x| scalar_fn(x).reshape(&[1]), &x);
        let g = vals(&grad(scalar_fn)(&xt));
        let fd_g: Vec<f64> = cols.iter().map(|c| c[0]).collect();
        prop_assert!(close(&g, &fd_g, 1e-5), "grad {g:?} vs {fd_g:?}");

        let jac_fd = transpose(&fd_columns(&vector_fn, &x));
        let jr = jacrev(vector_fn)(&xt);
        prop_assert_eq!(jr.shape(), &[2, n, n][..]);
        prop_assert!(close(&vals(&jr), &jac_fd, 1e-5), "jacrev {:?} vs {jac_fd:?}", vals(&jr));
        let jf = jacfwd(vector_fn)(&xt);
        prop_assert!(close(&vals(&jf), &vals(&jr), 1e-10), "jacfwd {:?} vs jacrev {:?}", vals(&jf), vals(&jr));

        // J·v for v = (1, 2, ..): the Jacobian's rows dotted with v.
        let v: Vec<f64> = (0..n).map(|i| i as f64 + 1.0).collect();
        let (y, jv) = jvp(vector_fn, &xt, &t(&v));
        prop_assert!(close(&vals(&y), &vals(&vector_fn(&xt)), 0.0));
        let want: Vec<f64> = jac_fd.chunks(n).map(|row| row.iter().zip(&v).map(|(a, b)| a * b).sum()).collect();
        prop_assert!(close(&vals(&jv), &want, 1e-5), "jvp {:?} vs {want:?}", vals(&jv));

        // The Hessian: central differences of the gradient, symmetric.
        let h = vals(&hessian(scalar_fn)(&xt));
        let fd_h = transpose(&fd_columns(&|x| grad(scalar_fn)(x), &x));
        prop_assert!(close(&h, &fd_h, 1e-4), "hessian {h:?} vs {fd_h:?}");
        for i in 0..n {
            for j in 0..n {
                prop_assert!((h[i * n + j] - h[j * n + i]).abs() < 1e-9);
            }
        }
    }
}

#[test]
fn transforms_inside_a_compiled_function_give_the_eager_values_in_one_trace() {
    let f = function(|x: Tensor| {
        let g = grad(scalar_fn)(&x);
        let (_, jv) = jvp(vector_fn, &x, &(Tensor::zeros_like(&x) + 1.0));
        let h = hessian(scalar_fn)(&x);
        vec![g, jv, h]
    });
    for x in [t(&[0.3, -0.7, 1.1]), t(&[0.5, 0.2, -0.4])] {
        let got = f.call(x.clone()).unwrap();
        assert!(close(&vals(&got[0]), &vals(&grad(scalar_fn)(&x)), 1e-12));
        assert!(close(&vals(&got[1]), &vals(&jvp(vector_fn, &x, &(Tensor::zeros_like(&x) + 1.0)).1), 1e-12));
        assert!(close(&vals(&got[2]), &vals(&hessian(scalar_fn)(&x)), 1e-12));
    }
    assert_eq!(f.tracing_count(), 1);
    assert!(f.concrete_functions()[0].schedule_stats().is_some(), "compiled");
}

#[test]
fn nested_grads_and_edge_cases() {
    // d³/dx³ of x⁴ is 24x.
    let d1 = grad(|x: &Tensor| (x * x * x * x).sum_all());
    let d2 = grad(move |x: &Tensor| d1(x).sum_all());
    let d3 = grad(move |x: &Tensor| d2(x).sum_all());
    assert!(close(&vals(&d3(&t(&[0.5, -2.0]))), &[12.0, -48.0], 1e-12));
    // A function that ignores its input: zeros of the input's shape.
    assert_eq!(vals(&grad(|x: &Tensor| x.sum_all() * 0.0 + 1.0)(&t(&[1.0, 2.0]))), [0.0, 0.0]);
    // Empty inputs: empty Jacobians of the right shape.
    let e = Tensor::zeros(&[0], DType::F64);
    assert_eq!(jacrev(|x: &Tensor| x * 2.0)(&e).shape(), &[0, 0]);
    assert_eq!(jacfwd(|x: &Tensor| x.sum_all().reshape(&[1]))(&e).shape(), &[1, 0]);
    // grad of a vector function is an error naming jacrev.
    let e = std::panic::catch_unwind(|| grad(|x: &Tensor| x * 2.0)(&t(&[1.0])))
        .expect_err("grad of a vector function panics");
    let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("scalar") && msg.contains("jacrev"), "{msg}");
}

/// `jacfwd` runs the function once per call, as `jvp` and `jacrev` do: a
/// function with a random draw gets one draw (the generator advances
/// once) and a Jacobian built from that draw, equal to `jacrev`'s with a
/// generator of the same seed; eagerly and compiled.
#[test]
fn jacfwd_runs_the_functions_effects_once() {
    use tracejit::random::Generator;
    let noisy = |g: &Generator| {
        let g = g.clone();
        move |x: &Tensor| (x * g.normal_like(x)).tanh() + x.sum_all()
    };
    let x = Tensor::randn(&[5], 3).cast(DType::F64);
    let (gf, gr) = (Generator::from_seed(9), Generator::from_seed(9));
    let (jf, jr) = (jacfwd(noisy(&gf))(&x), jacrev(noisy(&gr))(&x));
    let advances = |g: &Generator| g.state().value().to_vec::<i64>().unwrap()[1];
    assert_eq!(advances(&gf), 1, "jacfwd drew once per column");
    assert_eq!(advances(&gr), 1);
    assert!(close(&vals(&jf), &vals(&jr), 1e-12), "{:?} vs {:?}", vals(&jf), vals(&jr));
    let (gf2, gr2) = (Generator::from_seed(9), Generator::from_seed(9));
    let (nf, nr) = (noisy(&gf2), noisy(&gr2));
    let cf = function(move |x: Tensor| jacfwd(nf.clone())(&x));
    let cr = function(move |x: Tensor| jacrev(nr.clone())(&x));
    for step in 1..=2 {
        let (a, b) = (cf.call(x.clone()).unwrap(), cr.call(x.clone()).unwrap());
        assert!(close(&vals(&a), &vals(&b), 1e-12), "compiled: {:?} vs {:?}", vals(&a), vals(&b));
        assert_eq!((advances(&gf2), advances(&gr2)), (step, step), "one draw per call");
    }
}
