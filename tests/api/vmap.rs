//! `vmap` / `vmap_axes` against the reference (stacking the function's
//! result on each example) on random inputs of odd and empty batch sizes,
//! eagerly and in compiled functions, nested, composed with `grad` and
//! through `function`.

use proptest::prelude::*;
use tracejit::autodiff::grad;
use tracejit::prelude::*;
use tracejit::{vmap, vmap_axes};

fn vals(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

/// Equal up to rounding (the batched op may sum in another order), NaN
/// where the reference has NaN.
fn close(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && vals(a)
            .iter()
            .zip(vals(b))
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-9 * (1.0 + y.abs()))
}

/// Example `i` of `x` along `axis`.
fn example(x: &Tensor, axis: usize, i: usize) -> Tensor {
    x.slice_axis(axis as i64, i as i64, i as i64 + 1).squeeze(&[axis as i64])
}

/// The reference of `vmap_axes(f, in_axes, out_axes)`: `f` on each example,
/// results stacked at `out_axes`. With zero examples, `f` runs on a zero
/// example of each mapped argument only for the result's shape.
fn reference(
    f: &dyn Fn(Vec<Tensor>) -> Vec<Tensor>,
    xs: &[Tensor],
    in_axes: &[Option<usize>],
    out_axes: &[usize],
) -> Vec<Tensor> {
    let n = xs.iter().zip(in_axes).find_map(|(x, a)| a.map(|a| x.shape()[a])).unwrap();
    let per: Vec<Vec<Tensor>> = (0..n)
        .map(|i| {
            let args = xs.iter().zip(in_axes).map(|(x, a)| a.map_or_else(|| x.clone(), |a| example(x, a, i))).collect();
            f(args)
        })
        .collect();
    if n == 0 {
        let args = xs
            .iter()
            .zip(in_axes)
            .map(|(x, a)| match a {
                Some(a) => {
                    let mut s = x.shape().to_vec();
                    s.remove(*a);
                    Tensor::zeros(&s, x.dtype())
                }
                None => x.clone(),
            })
            .collect();
        return f(args)
            .iter()
            .zip(out_axes)
            .map(|(r, &o)| {
                let mut s = r.shape().to_vec();
                s.insert(o, 0);
                Tensor::zeros(&s, r.dtype())
            })
            .collect();
    }
    (0..out_axes.len())
        .map(|j| Tensor::stack(&per.iter().map(|r| r[j].clone()).collect::<Vec<_>>(), out_axes[j] as i64))
        .collect()
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, seed).cast(DType::F64)
}

/// Elementwise with broadcasting, reductions, products, shape ops.
fn mixed(xs: Vec<Tensor>) -> Vec<Tensor> {
    let (x, w) = (&xs[0], &xs[1]);
    let h = x.reshape(&[1, -1]).matmul(w).tanh(); // [1, 4]
    let s = (x * x).sum(&[0], true) + x.mean_all(); // [1]
    let y = (&h * &s + 1.0).transpose(&[1, 0]); // [4, 1]
    let z = Tensor::concat(&[y.clone(), y.exp()], 1).pad(&[(1, 0), (0, 1)], 0.5).cumsum(0);
    vec![z.slice_axis(0, 1, 4), x.max(&[0], false), w.matmul(&h.t()).squeeze(&[1])]
}

/// Mapped and shared operands of a product both ways, a batched GEMM.
fn products(xs: Vec<Tensor>) -> Vec<Tensor> {
    let (a, b) = (&xs[0], &xs[1]);
    vec![a.matmul(b), b.t().matmul(&a.t()), a.matmul(&a.t())]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    #[test]
    fn vmap_matches_stacked_examples(n in prop::sample::select(vec![0usize, 1, 3, 5]), d in 1usize..5, seed in 0u64..1000, nan in any::<bool>()) {
        let mut x = vals(&randn(&[n, d], seed));
        if nan && !x.is_empty() {
            x[0] = f64::NAN;
        }
        let x = Tensor::from_vec(x, &[n, d]);
        let w = randn(&[d, 4], seed + 1);
        let in_axes = [Some(0), None];
        let want = reference(&mixed, &[x.clone(), w.clone()], &in_axes, &[0, 0, 0]);
        let got = vmap_axes(mixed, &in_axes, &[0, 0, 0])(vec![x.clone(), w.clone()]);
        for (g, r) in got.iter().zip(&want) {
            prop_assert!(close(g, r), "eager: {:?} vs {:?}", g, r);
        }
        // The same inside a compiled function: one trace, the JIT ran.
        for jit in [false, true] {
            let f = function(move |xs: Vec<Tensor>| vmap_axes(mixed, &[Some(0), None], &[0, 0, 0])(xs)).jit(jit);
            let traced = f.call(vec![x.clone(), w.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let cf = &f.concrete_functions()[0];
            prop_assert_eq!(cf.executor_kind(), if jit { "jit" } else { "interpreter" }, "{:?}", cf.jit_error());
            for (g, r) in traced.iter().zip(&want) {
                prop_assert!(close(g, r), "jit={}: {:?} vs {:?}", jit, g, r);
            }
        }
    }

    #[test]
    fn products_batch_both_ways(n in prop::sample::select(vec![0usize, 1, 3, 5]), m in 1usize..4, seed in 0u64..1000) {
        let a = randn(&[n, m, 3], seed);
        let b = randn(&[3, 2], seed + 1);
        for (xs, in_axes) in [(vec![a.clone(), b.clone()], [Some(0), None])] {
            let want = reference(&products, &xs, &in_axes, &[0, 0, 0]);
            let got = vmap_axes(products, &in_axes, &[0, 0, 0])(xs.clone());
            for (g, r) in got.iter().zip(&want) {
                prop_assert!(close(g, r), "{:?} vs {:?}", g, r);
            }
        }
        // Both mapped, the batch in axis 2 of the second and out at axis 1.
        let bs = randn(&[3, 2, n], seed + 2);
        let pair = |xs: Vec<Tensor>| vec![xs[0].matmul(&xs[1])];
        let want = reference(&pair, &[a.clone(), bs.clone()], &[Some(0), Some(2)], &[1]);
        let got = vmap_axes(pair, &[Some(0), Some(2)], &[1])(vec![a, bs]);
        prop_assert!(close(&got[0], &want[0]), "{:?} vs {:?}", got[0], want[0]);
    }

    #[test]
    fn per_example_gradients_match_grad_of_each(n in prop::sample::select(vec![1usize, 3, 5]), d in 1usize..5, seed in 0u64..1000) {
        let xs = randn(&[n, d], seed);
        let w = randn(&[d, 3], seed + 1);
        let loss = move |x: &Tensor| (x.reshape(&[1, -1]).matmul(&w).tanh() * 2.0).sum_all() + (x * x * x).sum_all();
        let per_example = vmap(grad(loss.clone()))(&xs);
        let want = reference(&|a: Vec<Tensor>| vec![grad(loss.clone())(&a[0])], std::slice::from_ref(&xs), &[Some(0)], &[0]);
        prop_assert!(close(&per_example, &want[0]), "{:?} vs {:?}", per_example, want[0]);
        // Compiled: one trace of forward, backward and batching.
        let f = function(move |x: Tensor| vmap(grad(loss.clone()))(&x));
        let traced = f.call(xs.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(close(&traced, &want[0]));
        prop_assert_eq!(f.concrete_functions()[0].executor_kind(), "jit");
    }

    #[test]
    fn indexing_ops_batch(n in prop::sample::select(vec![0usize, 1, 3, 5]), seed in 0u64..1000) {
        let x = randn(&[n, 5, 2], seed);
        let ids: Vec<i64> = (0..n * 3).map(|i| ((i as u64 * 7 + seed) % 5) as i64 - 2).collect();
        let idx = Tensor::from_vec(ids, &[n, 3]);
        let starts: Vec<i64> = (0..n * 2).map(|i| ((i as u64 + seed) % 4) as i64).collect();
        let starts = Tensor::from_vec(starts, &[n, 2]);
        let table = randn(&[5, 2], seed + 3);
        let f = move |xs: Vec<Tensor>| {
            let (x, idx, starts) = (&xs[0], &xs[1], &xs[2]);
            let shared_starts = Tensor::from_vec(vec![1i64, 0], &[2]);
            vec![
                x.gather(idx, 0),                          // both mapped
                table.gather(idx, 0),                      // shared params
                x.gather(&Tensor::from_vec(vec![4i64, 0], &[2]), 0), // shared indices
                x.dynamic_slice(starts, &[2, 1]),          // mapped starts
                x.dynamic_slice(&shared_starts, &[3, 2]),
                x.scatter_add(0, &idx.slice_axis(0, 0, 2).reshape(&[2, 1]).abs(), &x.slice_axis(0, 0, 2)),
                idx.one_hot(5, DType::F64),
                x.top_k(1).0,
            ]
        };
        let in_axes = [Some(0), Some(0), Some(0)];
        let outs = [0; 8];
        let args = vec![x, idx, starts];
        let want = reference(&f, &args, &in_axes, &outs);
        let got = vmap_axes(f.clone(), &in_axes, &outs)(args.clone());
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            prop_assert!(close(g, r), "output {}: {:?} vs {:?}", i, g, r);
        }
        let compiled = function(move |xs: Vec<Tensor>| vmap_axes(f.clone(), &in_axes, &outs)(xs));
        let traced = compiled.call(args).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (g, r) in traced.iter().zip(&want) {
            prop_assert!(close(g, r), "compiled: {:?} vs {:?}", g, r);
        }
    }
}

#[test]
fn nested_vmap_maps_two_axes() {
    let x = randn(&[3, 4, 2], 1);
    let w = randn(&[2, 2], 2);
    let inner = {
        let w = w.clone();
        move |v: &Tensor| v.reshape(&[1, 2]).matmul(&w).sum_all()
    };
    let twice = vmap(vmap(inner.clone()));
    let got = twice(&x);
    let want: Vec<Tensor> = (0..3)
        .map(|i| Tensor::stack(&(0..4).map(|j| inner(&example(&example(&x, 0, i), 0, j))).collect::<Vec<_>>(), 0))
        .collect();
    assert!(close(&got, &Tensor::stack(&want, 0)));
    let f = function(move |x: Tensor| vmap(vmap(inner.clone()))(&x));
    assert!(close(&f.call(x).unwrap(), &got));
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn function_inside_vmap_is_batched_through_its_graph() {
    let inner = function(|x: Tensor| (&x * &x).sum_all() + 1.0);
    let per = vmap(move |x: &Tensor| inner.call(x.clone()).unwrap());
    let x = randn(&[5, 3], 3);
    let want: Vec<f64> = (0..5).map(|i| vals(&(example(&x, 0, i) * example(&x, 0, i)).sum_all())[0] + 1.0).collect();
    let got = vals(&per(&x));
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?} vs {want:?}");
}

#[test]
fn compiled_functions_with_composites_batch_inside_vmap() {
    // The callee's optimized graph holds native kernels (no batch axis);
    // vmap batches the graph as traced, composites through their bodies.
    let inner = function(|x: Tensor| tracejit::nn::softmax(&x.reshape(&[1, -1]), -1).squeeze(&[0]));
    let x = Tensor::randn(&[4, 5], 9); // f32: the softmax kernel accepts it
    let want = Tensor::stack(&(0..4).map(|i| inner.call(example(&x, 0, i)).unwrap()).collect::<Vec<_>>(), 0);
    let optimized = inner.concrete_functions()[0].optimized_graph().to_string();
    assert!(optimized.contains("kernel"), "the callee runs the native kernel: {optimized}");
    let per = vmap(move |v: &Tensor| inner.call(v.clone()).unwrap());
    assert!(close_tol(&per(&x), &want, 1e-6));
}

#[test]
fn the_batched_graph_has_one_product_whatever_the_batch() {
    // One matmul node for 2 or 64 examples: a batched GEMM, not a loop.
    for n in [2usize, 64] {
        let w = randn(&[3, 4], 5);
        let f = function(move |x: Tensor| {
            let w = w.clone();
            vmap(move |v: &Tensor| v.reshape(&[1, 3]).matmul(&w))(&x)
        });
        f.call(randn(&[n, 3], 6)).unwrap();
        let text = f.concrete_functions()[0].graph().to_string();
        assert_eq!(text.matches("matmul").count(), 1, "{text}");
    }
}

#[test]
fn misuse_names_what_is_wrong() {
    let f = vmap_axes(|xs: Vec<Tensor>| vec![&xs[0] + &xs[1]], &[Some(0), Some(0)], &[0]);
    let err = std::panic::catch_unwind(|| f(vec![randn(&[3, 2], 1), randn(&[4, 2], 2)])).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("argument 0 has 3 examples, argument 1 has 4"), "{msg}");
    let err = std::panic::catch_unwind(|| vmap(|x: &Tensor| x.clone())(&Tensor::scalar(1.0f32))).unwrap_err();
    let msg = tracejit::ir::panic_message(&*err);
    assert!(msg.contains("in_axes[0] = 0 is out of range"), "{msg}");
    let g = vmap_axes(|xs: Vec<Tensor>| xs, &[Some(0)], &[0, 0]);
    let err = std::panic::catch_unwind(|| g(vec![randn(&[2], 1)])).unwrap_err();
    assert!(tracejit::ir::panic_message(&*err).contains("expected 2 results (one per out_axes entry)"));
    // Inside a function the panic is the call's Err.
    let h = function(|x: Tensor| vmap_axes(|xs: Vec<Tensor>| xs, &[Some(3)], &[0])(vec![x]).remove(0));
    let err = h.call(randn(&[2, 2], 1)).unwrap_err().to_string();
    assert!(err.contains("in_axes[0] = 3 is out of range"), "{err}");
}

#[test]
fn by_value_closures_and_unknown_batch_dims() {
    let double = vmap(|x: Tensor| (&x * 2.0).sum(&[0], false));
    let x = randn(&[4, 3], 8);
    let want = (&x * 2.0).sum(&[1], false);
    assert!(close(&double(&x), &want));
    // The batch axis unknown in the trace (-1 in the signature).
    let f = function(move |x: Tensor| {
        vmap(|v: Tensor| v.reshape(&[3, 1]).matmul(&v.reshape(&[1, 3])).sum(&[1], false))(&x)
    })
    .input_signature(vec![TensorSpec::new(DType::F64, &[-1, 3])]);
    for n in [0usize, 1, 5] {
        let x = randn(&[n, 3], n as u64);
        let got = f.call(x.clone()).unwrap();
        let want = reference(
            &|a: Vec<Tensor>| vec![a[0].reshape(&[3, 1]).matmul(&a[0].reshape(&[1, 3])).sum(&[1], false)],
            &[x],
            &[Some(0)],
            &[0],
        );
        assert!(close(&got, &want[0]), "{got:?} vs {:?}", want[0]);
    }
    assert_eq!(f.tracing_count(), 1);
    // Unmapped values meeting mapped ones (a concat, a shared result) with
    // the batch size unknown in the trace: broadcast through the batch.
    let g = function(|xs: Vec<Tensor>| {
        vmap_axes(
            |v: Vec<Tensor>| vec![Tensor::concat(&[v[0].clone(), v[1].clone()], 0), v[1].clone()],
            &[Some(0), None],
            &[0, 1],
        )(xs)
    })
    .input_signature(vec![TensorSpec::new(DType::F64, &[-1, 3]), TensorSpec::new(DType::F64, &[2])]);
    for n in [0usize, 1, 5] {
        let args = vec![randn(&[n, 3], n as u64), randn(&[2], 7)];
        let got = g.call(args.clone()).unwrap();
        let want = reference(
            &|v: Vec<Tensor>| vec![Tensor::concat(&[v[0].clone(), v[1].clone()], 0), v[1].clone()],
            &args,
            &[Some(0), None],
            &[0, 1],
        );
        assert!(close(&got[0], &want[0]) && close(&got[1], &want[1]), "{got:?} vs {want:?}");
    }
    assert_eq!(g.tracing_count(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    /// The sum of squares of an outer product under vmap is factored
    /// (`||a||² ||b||²`), so the `[batch, m, n]` products are never built.
    #[test]
    fn norms_of_outer_products_are_factored(n in prop::sample::select(vec![0usize, 1, 3, 5]), m in 1usize..5, seed in 0u64..1000, nan in any::<bool>()) {
        let mut a = vals(&randn(&[n, m], seed));
        if nan && !a.is_empty() {
            a[0] = f64::NAN;
        }
        let a = Tensor::from_vec(a, &[n, m]);
        let b = randn(&[n, 4], seed + 1);
        fn outer(xs: &[Tensor]) -> Tensor {
            xs[0].reshape(&[-1, 1]).matmul(&xs[1].reshape(&[1, -1]))
        }
        let by_mul = |xs: Vec<Tensor>| {
            let g = outer(&xs);
            vec![(&g * &g).sum_all()]
        };
        let by_square = |xs: Vec<Tensor>| vec![outer(&xs).square().sum(&[0, 1], false).sqrt()];
        let in_axes = [Some(0), Some(0)];
        for norm in [by_mul as fn(Vec<Tensor>) -> Vec<Tensor>, by_square] {
            let want = reference(&norm, &[a.clone(), b.clone()], &in_axes, &[0]);
            let f = function(move |xs: Vec<Tensor>| vmap_axes(norm, &in_axes, &[0])(xs));
            let got = f.call(vec![a.clone(), b.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(close_tol(&got[0], &want[0], 1e-12), "{:?} vs {:?}", got[0], want[0]);
            let text = f.concrete_functions()[0].graph().to_string();
            prop_assert!(!text.contains("matmul"), "{}", text);
        }
    }
}

fn close_tol(a: &Tensor, b: &Tensor, tol: f64) -> bool {
    a.shape() == b.shape()
        && vals(a)
            .iter()
            .zip(vals(b))
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs()))
}
