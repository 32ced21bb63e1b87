//! `tracejit::autodiff::custom_gradient`: the clipped-gradient identity and a
//! stable log1pexp, eagerly, under tapes and `value_and_grad`, inside
//! functions (tape inside the function, tape around its call, interpreter
//! and JIT), in a loop body, higher order (second derivatives against
//! finite differences), several inputs, and the errors of a backward that
//! returns the wrong thing.

use tracejit::autodiff::{custom_gradient, custom_gradient_n, value_and_grad};
use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
}

fn clip() -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static {
    custom_gradient(|x: &Tensor| (x.clone(), |dy: &Tensor| dy.clamp(-1.0, 1.0)))
}

/// log(1 + e^x) whose gradient stays finite where e^x overflows.
fn log1pexp() -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static {
    custom_gradient(|x: &Tensor| {
        let e = x.exp();
        let y = (&e + 1.0).log();
        (y, move |dy: &Tensor| dy * (1.0 - 1.0 / (&e + 1.0)))
    })
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

fn xs() -> Tensor {
    Tensor::from_vec(vec![-2.0f64, -0.5, 0.25, 1.5, 3.0], &[5])
}

/// The gradient of `(f(x) * scale).sum()` by a tape around it.
fn tape_grad(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor, scale: f64) -> Vec<f64> {
    let tape = GradientTape::new();
    tape.watch(x);
    let y = (f(x) * scale).sum_all();
    vals(&tape.gradient(&y, &[x]).unwrap().remove(0).unwrap())
}

#[test]
fn eagerly_the_forward_is_the_closures_output() {
    let x = xs();
    assert_eq!(vals(&clip()(&x)), vals(&x));
    let want: Vec<f64> = vals(&x).iter().map(|v| (1.0 + v.exp()).ln()).collect();
    assert!(close(&vals(&log1pexp()(&x)), &want, 1e-12));
}

#[test]
fn a_tape_applies_the_rule_not_the_forwards_gradient() {
    let x = xs();
    assert_eq!(tape_grad(&clip(), &x, 10.0), vec![1.0; 5]);
    assert_eq!(tape_grad(&clip(), &x, -0.5), vec![-0.5; 5]);
    // The output is a new tensor for the tapes even when it is the input.
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = clip()(&x);
    let z = (&y * 3.0 + &x * 2.0).sum_all();
    assert_eq!(vals(&tape.gradient(&z, &[&x]).unwrap().remove(0).unwrap()), vec![3.0; 5]);
}

#[test]
fn the_stable_rule_matches_finite_differences_and_stays_finite() {
    let x = xs();
    let g = tape_grad(&log1pexp(), &x, 1.0);
    let f = log1pexp();
    let h = 1e-6;
    for (i, v) in vals(&x).into_iter().enumerate() {
        let at = |d: f64| {
            let mut p = vals(&x);
            p[i] = v + d;
            vals(&f(&Tensor::from_vec(p, &[5]))).iter().sum::<f64>()
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert!((g[i] - fd).abs() < 1e-6, "element {i}: rule {} vs finite difference {fd}", g[i]);
    }
    let big = Tensor::from_vec(vec![800.0f64, 1000.0], &[2]);
    assert_eq!(tape_grad(&log1pexp(), &big, 1.0), vec![1.0, 1.0]);
    // The plain formula's gradient is inf / inf there.
    let plain = |x: &Tensor| (x.exp() + 1.0).log();
    assert!(tape_grad(&plain, &big, 1.0).iter().all(|g| g.is_nan()));
}

#[test]
fn value_and_grad_sees_the_rule_through_a_variable() {
    let w = Variable::new(Tensor::from_vec(vec![0.5f32, -2.0, 4.0], &[3]));
    let clip = clip();
    let (loss, grads) = value_and_grad(std::slice::from_ref(&w), || (clip(&w.read()) * 4.0).sum_all()).unwrap();
    assert_eq!(loss.to_vec::<f32>().unwrap(), [10.0]);
    assert_eq!(grads[0].to_vec::<f32>().unwrap(), [1.0, 1.0, 1.0]);
}

#[test]
fn inside_a_function_with_the_tape_inside_jit_and_interpreter() {
    for jit in [true, false] {
        let (clip, soft) = (clip(), log1pexp());
        let f = function(move |x: Tensor| {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = (clip(&x) * 10.0 + soft(&x)).sum_all();
            tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
        })
        .jit(jit);
        let x = xs();
        let want: Vec<f64> = vals(&x).iter().map(|v| 1.0 + sigmoid(*v)).collect();
        assert!(close(&vals(&f.call(x.clone()).unwrap()), &want, 1e-12), "jit {jit}");
        f.call(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0], &[5])).unwrap();
        assert_eq!(f.tracing_count(), 1);
        let cf = &f.concrete_functions()[0];
        // The forward's call was inlined and fused like any other code.
        assert!(!cf.optimized_graph().to_string().contains("call"), "{}", cf.optimized_graph());
        if jit {
            assert!(cf.jit_error().is_none(), "{:?}", cf.jit_error());
        }
    }
}

#[test]
fn a_tape_around_a_compiled_call_applies_the_rule() {
    let (clip, soft) = (clip(), log1pexp());
    let f = function(move |x: Tensor| clip(&x) * 10.0 + soft(&x));
    let x = xs();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = f.call(x.clone()).unwrap().sum_all();
    let g = vals(&tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap());
    let want: Vec<f64> = vals(&x).iter().map(|v| 1.0 + sigmoid(*v)).collect();
    assert!(close(&g, &want, 1e-12), "{g:?}");
}

#[test]
fn input_signatures_with_unknown_dims() {
    let clip = clip();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = (clip(&x) * 3.0).sum_all();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    })
    .input_signature(vec![TensorSpec::new(DType::F32, &[-1])]);
    for n in [2, 7] {
        let g = f.call(Tensor::ones(&[n], DType::F32)).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0; n]);
    }
    assert_eq!(f.tracing_count(), 1);
}

/// The second derivative of log1pexp is sigmoid'(x) = s (1 - s): the
/// backward closure is recorded by the outer tape, through the forward's
/// `e^x` it captured.
fn second_derivative(x: &Tensor, soft: &dyn Fn(&Tensor) -> Tensor) -> Tensor {
    let outer = GradientTape::new();
    outer.watch(x);
    let inner = GradientTape::new();
    inner.watch(x);
    let y = soft(x).sum_all();
    let g = inner.gradient(&y, &[x]).unwrap().remove(0).unwrap();
    drop(inner);
    outer.gradient(&g.sum_all(), &[x]).unwrap().remove(0).unwrap()
}

#[test]
fn higher_order_gradients_differentiate_the_backward() {
    let x = xs();
    let soft = log1pexp();
    let h2 = vals(&second_derivative(&x, &soft));
    // Finite differences of the first derivative (the rule itself).
    let eps = 1e-5;
    let first = |v: f64| tape_grad(&soft, &Tensor::from_vec(vec![v], &[1]), 1.0)[0];
    for (i, v) in vals(&x).into_iter().enumerate() {
        let fd = (first(v + eps) - first(v - eps)) / (2.0 * eps);
        assert!((h2[i] - fd).abs() < 1e-6, "element {i}: {} vs {fd}", h2[i]);
        let s = sigmoid(v);
        assert!((h2[i] - s * (1.0 - s)).abs() < 1e-12);
    }
    // The same inside a traced function.
    let soft2 = soft.clone();
    let f = function(move |x: Tensor| second_derivative(&x, &soft2));
    assert!(close(&vals(&f.call(x.clone()).unwrap()), &h2, 1e-12));
    // The clip's backward does not depend on x: no second derivative.
    let outer = GradientTape::new();
    outer.watch(&x);
    let inner = GradientTape::new();
    inner.watch(&x);
    let y = clip()(&x).sum_all();
    let g = inner.gradient(&y, &[&x]).unwrap().remove(0).unwrap();
    assert!(outer.gradient(&g.sum_all(), &[&x]).unwrap()[0].is_none());
}

#[test]
fn in_a_loop_body_under_a_tape_in_the_function() {
    let soft = log1pexp();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let s = soft.clone();
        let y = fori_loop(0, 2, move |_i, h: Tensor| s(&h) * 0.5, x.clone()).sum_all();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    });
    let x = xs();
    let g = vals(&f.call(x.clone()).unwrap());
    // d/dx of 0.5 * sp(0.5 * sp(x)) = 0.25 * s(0.5 sp(x)) * s(x).
    let sp = |v: f64| (1.0 + v.exp()).ln();
    let want: Vec<f64> = vals(&x).iter().map(|&v| 0.25 * sigmoid(0.5 * sp(v)) * sigmoid(v)).collect();
    assert!(close(&g, &want, 1e-12), "{g:?} vs {want:?}");
}

#[test]
fn several_inputs_and_outputs() {
    // (x * y, x + y) with a rule that treats y as a constant.
    let f = custom_gradient_n(|v: &[Tensor]| {
        let (x, y) = (v[0].clone(), v[1].clone());
        let outs = vec![&x * &y, &x + &y];
        (outs, move |dys: &[Tensor]| vec![&dys[0] * &y + &dys[1], Tensor::zeros_like(&y)])
    });
    let (x, y) = (Tensor::from_vec(vec![2.0f64, -1.0], &[2]), Tensor::from_vec(vec![3.0f64, 5.0], &[2]));
    let out = f(&[x.clone(), y.clone()]);
    assert_eq!((vals(&out[0]), vals(&out[1])), (vec![6.0, -5.0], vec![5.0, 4.0]));
    // Only the first output is used: the second's cotangent is zeros.
    let tape = GradientTape::new();
    tape.watch(&x);
    tape.watch(&y);
    let z = f(&[x.clone(), y.clone()]).remove(0).sum_all();
    let g = tape.gradient(&z, &[&x, &y]).unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![3.0, 5.0]);
    assert_eq!(vals(g[1].as_ref().unwrap()), vec![0.0, 0.0]);
    // Traced, with the tape inside.
    let f2 = f.clone();
    let traced = function(move |(x, y): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let o = f2(&[x.clone(), y.clone()]);
        let z = (&o[0] + &o[1]).sum_all();
        tape.gradient(&z, &[&x]).unwrap().remove(0).unwrap()
    });
    assert_eq!(vals(&traced.call((x, y)).unwrap()), vec![4.0, 6.0]);
}

#[test]
fn a_backward_returning_the_wrong_thing_is_an_error_naming_its_definition() {
    let x = xs();
    let too_many = custom_gradient_n(|v: &[Tensor]| (v.to_vec(), |d: &[Tensor]| vec![d[0].clone(), d[0].clone()]));
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = too_many(std::slice::from_ref(&x)).remove(0).sum_all();
    let e = tape.gradient(&y, &[&x]).unwrap_err().to_string();
    assert!(e.contains("returned 2 gradient(s) for 1 input(s)") && e.contains(file!()), "{e}");

    let wrong_shape = custom_gradient(|x: &Tensor| (x.clone(), |dy: &Tensor| dy.sum_all()));
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = wrong_shape(&x).sum_all();
    let e = tape.gradient(&y, &[&x]).unwrap_err().to_string();
    assert!(e.contains("gradient 0 is f64[]") && e.contains("input 0 is f64[5]") && e.contains(file!()), "{e}");
}

#[test]
fn a_conditional_differentiated_from_outside_refuses_by_name() {
    let clip = clip();
    let f = function(move |x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let c = clip.clone();
        let y = cond(&x.sum_all().gt(0.0), || c(&x) * 2.0, || x.clone()).sum_all();
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    });
    let e = f.call(xs()).unwrap_err().to_string();
    assert!(e.contains("custom gradient") && e.contains("cond"), "{e}");
}

/// A tape computes cotangents only along paths to the sources asked for:
/// with `c` and `w` watched and only `w`'s gradient asked, the backward of
/// `x = f(c)` never runs (eagerly it would be wasted work, as `x · w`'s
/// product for an input no one asked about); asked for `c` too, it runs
/// once and both gradients are right.
#[test]
fn a_gradient_runs_no_backward_off_the_paths_to_its_sources() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let double = custom_gradient(move |x: &Tensor| {
        let counted = counted.clone();
        (x * 2.0, move |dy: &Tensor| {
            counted.fetch_add(1, Ordering::SeqCst);
            dy * 2.0
        })
    });
    let c = xs();
    let w = Tensor::from_vec(vec![1.0f64, -1.0, 0.5, 2.0, -3.0], &[5]);
    let tape = GradientTape::persistent();
    tape.watch(&c);
    tape.watch(&w);
    let y = (double(&c) * &w).sum_all();
    let gw = tape.gradient(&y, &[&w]).unwrap().remove(0).unwrap();
    assert_eq!(vals(&gw), vals(&c).iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    assert_eq!(calls.load(Ordering::SeqCst), 0, "x = f(c) was differentiated for a gradient of w alone");
    let g = tape.gradient(&y, &[&c, &w]).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(vals(g[0].as_ref().unwrap()), vals(&w).iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    assert_eq!(vals(g[1].as_ref().unwrap()), vals(&gw));
}
