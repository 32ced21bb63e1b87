//! The indexing, window and scan primitives (`scatter_add`,
//! `gather_elements`, `dynamic_slice`, `dynamic_update_slice`, `pad`,
//! `cumsum`, `top_k`) and `nn::embedding`: eager against the graph run by
//! the interpreter and by the JIT (which must have compiled the function),
//! on random inputs of odd sizes with NaN, with dims unknown in the trace;
//! gradients against central finite differences in f64; the errors.

use proptest::prelude::*;
use tracejit::prelude::*;

type Case = std::sync::Arc<dyn Fn(&[Tensor]) -> Vec<Tensor> + Send + Sync>;

/// Bit-equal (NaN equal to NaN).
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.storage().unwrap().bit_eq(b.storage().unwrap())
        || (a.dtype() == b.dtype()
            && a.shape() == b.shape()
            && a.cast(DType::F64)
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(b.cast(DType::F64).to_vec::<f64>().unwrap())
                .all(|(x, y)| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()))
}

/// Runs `case` eagerly, then traced with the JIT off and on (with `specs`,
/// `-1` for dims unknown in the trace), and compares every output.
fn check(case: Case, inputs: Vec<Tensor>, specs: Vec<TensorSpec>) -> Result<(), TestCaseError> {
    let eager = case(&inputs);
    for jit in [false, true] {
        let c = case.clone();
        let f = function(move |xs: Vec<Tensor>| c(&xs)).jit(jit).input_signature(specs.clone());
        let traced = f.call(inputs.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cf = &f.concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), if jit { "jit" } else { "interpreter" }, "{:?}", cf.jit_error());
        prop_assert_eq!(traced.len(), eager.len());
        for (e, t) in eager.iter().zip(&traced) {
            prop_assert!(same(e, t), "jit={}: eager {:?} vs traced {:?} on {:?}", jit, e, t, inputs);
        }
    }
    Ok(())
}

/// A tensor of `shape` with values from `seed` (a NaN among them when
/// `nan`), of `dtype`.
fn values(shape: &[usize], seed: u64, nan: bool, dtype: DType) -> Tensor {
    let mut v = Tensor::randn(shape, seed).to_vec::<f32>().unwrap();
    if nan && v.len() > 2 {
        v[1] = f32::NAN;
    }
    Tensor::from_vec(v, shape).cast(dtype)
}

fn spec(t: &Tensor, unknown: &[usize]) -> TensorSpec {
    let dims: Vec<i64> =
        t.shape().iter().enumerate().map(|(i, &d)| if unknown.contains(&i) { -1 } else { d as i64 }).collect();
    TensorSpec::new(t.dtype(), &dims)
}

fn ids(n: usize, len: usize, seed: u64) -> Vec<i64> {
    // In range, negative ones too (they count from the end).
    (0..n).map(|i| ((i as u64 * 7 + seed * 13) % (2 * len as u64)) as i64 - len as i64).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn scatter_add_and_gather_elements(rows in prop::sample::select(vec![1usize, 3, 5, 17]), cols in 1usize..6, k in 0usize..7, seed in 0u64..1000, f64_ in any::<bool>(), nan in any::<bool>()) {
        let dtype = if f64_ { DType::F64 } else { DType::F32 };
        let x = values(&[rows, cols], seed, nan, dtype);
        let idx = Tensor::from_vec(ids(k * cols, rows, seed), &[k, cols]);
        let upd = values(&[k, cols], seed + 1, false, dtype);
        let case: Case = std::sync::Arc::new(|xs: &[Tensor]| {
            vec![xs[0].scatter_add(0, &xs[1], &xs[2]), xs[0].gather_elements(0, &xs[1])]
        });
        let specs = vec![spec(&x, &[]), spec(&idx, &[0]), spec(&upd, &[0])];
        check(case, vec![x, idx, upd], specs)?;
    }

    #[test]
    fn dynamic_slices_pad_cumsum_top_k(n in prop::sample::select(vec![1usize, 3, 5, 17, 1023]), m in 1usize..5, start in -4i64..20, seed in 0u64..1000, nan in any::<bool>()) {
        let x = values(&[m, n], seed, nan, DType::F32);
        let size = (n / 2).max(1);
        let starts = Tensor::from_vec(vec![0i64, start], &[2]);
        let upd = values(&[m, size], seed + 3, false, DType::F32);
        let k = n.min(3);
        let case: Case = std::sync::Arc::new(move |xs: &[Tensor]| {
            let (values, indices) = xs[0].top_k(k);
            vec![
                xs[0].dynamic_slice(&xs[1], &[1, size]),
                xs[0].dynamic_update_slice(&xs[2], &xs[1]),
                xs[0].pad(&[(1, 0), (2, 3)], -1.5),
                xs[0].cumsum(-1),
                xs[0].cumsum(0),
                values,
                indices,
            ]
        });
        let specs = vec![spec(&x, &[0]), spec(&starts, &[]), spec(&upd, &[0])];
        check(case, vec![x, starts, upd], specs)?;
    }
}

/// Central differences of `f` at `x` (f64).
fn finite_differences(x: &Tensor, f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let h = 1e-6;
    let base = x.to_vec::<f64>().unwrap();
    (0..base.len())
        .map(|i| {
            let at = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                f(&Tensor::from_vec(v, x.shape()))
            };
            (at(h) - at(-h)) / (2.0 * h)
        })
        .collect()
}

/// The gradient of `loss(x)` by a tape, eagerly and traced, against finite
/// differences.
fn check_gradient(x: Tensor, loss: fn(&Tensor) -> Tensor) {
    let grad = move |x: &Tensor| {
        let tape = GradientTape::new();
        tape.watch(x);
        let y = loss(x);
        tape.gradient(&y, &[x]).unwrap().remove(0).unwrap()
    };
    let want = finite_differences(&x, &|x| loss(x).to_scalar::<f64>().unwrap());
    let eager = grad(&x).to_vec::<f64>().unwrap();
    let traced = function(move |x: Tensor| grad(&x)).call(x.clone()).unwrap().to_vec::<f64>().unwrap();
    for (got, name) in [(eager, "eager"), (traced, "traced")] {
        assert!(
            got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-6 * w.abs().max(1.0)),
            "{name}: {got:?} vs finite differences {want:?}"
        );
    }
}

#[test]
fn gradients_match_finite_differences() {
    let x = || Tensor::randn(&[4, 5], 3).cast(DType::F64);
    let w = || Tensor::randn(&[4, 5], 4).cast(DType::F64);
    check_gradient(x(), |x| {
        let idx = Tensor::from_vec(vec![1i64, 0, 3, 1, 1, 2, 0, 3, 2, 2], &[2, 5]);
        let upd = x.slice_axis(0, 0, 2) * 2.0;
        (x.scatter_add(0, &idx, &upd) * Tensor::randn(&[4, 5], 4).cast(DType::F64)).sum_all()
    });
    check_gradient(x(), |x| {
        let idx = Tensor::from_vec(vec![4i64, 0, -1, 2, 2, 3, 1, 0], &[4, 2]);
        (x.gather_elements(1, &idx).square()).sum_all()
    });
    check_gradient(x(), |x| (x.dynamic_slice(&Tensor::from_vec(vec![1i64, 9], &[2]), &[2, 3]).exp()).sum_all());
    check_gradient(x(), |x| {
        let upd = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[1, 3]) * x.slice_axis(0, 3, 4).slice_axis(1, 0, 3);
        (x.dynamic_update_slice(&upd, &Tensor::from_vec(vec![2i64, 1], &[2])).tanh()).sum_all()
    });
    check_gradient(x(), |x| (x.pad(&[(1, 2), (0, 1)], 0.5).square() * 0.5).sum_all());
    check_gradient(x(), |x| (x.cumsum(1) * Tensor::randn(&[4, 5], 5).cast(DType::F64)).sum_all());
    check_gradient(x(), |x| {
        let (v, _) = x.top_k(2);
        (v.square()).sum_all()
    });
    check_gradient(w(), |table| {
        let ids = Tensor::from_vec(vec![3i64, 0, 3, 3, -1], &[5]);
        tracejit::nn::embedding(table, &ids).square().sum_all()
    });
}

#[test]
fn an_embeddings_gradient_is_a_scatter_not_a_one_hot_product() {
    let table = Variable::new(Tensor::randn(&[50, 8], 1));
    let t = table.clone();
    let f = function(move |ids: Tensor| {
        let tape = GradientTape::new();
        let loss = tracejit::nn::embedding(&t.read(), &ids).square().sum_all();
        tape.gradient(&loss, &[&t]).unwrap().remove(0).unwrap()
    });
    let ids = Tensor::from_vec(vec![7i64, 7, 3], &[3]);
    let g = f.call(ids).unwrap();
    let cf = &f.concrete_functions()[0];
    let graph = cf.optimized_graph();
    let ops: Vec<&str> = graph.nodes().map(|(_, n)| n.op.name()).collect();
    assert!(ops.contains(&"scatter_add") && !ops.contains(&"one_hot") && !ops.contains(&"matmul"), "{graph}");
    // Row 7 read twice: its gradient is twice 2·w[7].
    let (gv, w) = (g.to_vec::<f32>().unwrap(), table.value().to_vec::<f32>().unwrap());
    for j in 0..8 {
        assert!((gv[7 * 8 + j] - 4.0 * w[7 * 8 + j]).abs() < 1e-5);
        assert_eq!(gv[8 + j], 0.0);
    }
}

#[test]
fn misuse_names_the_op_and_the_sizes() {
    let x = Tensor::zeros(&[3, 4], DType::F32);
    let e = function(|x: Tensor| x.dynamic_slice(&Tensor::from_vec(vec![0i64, 0], &[2]), &[4, 1]))
        .call(x.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("dynamic_slice") && e.contains("larger"), "{e}");
    let e = function(|x: Tensor| x.top_k(5).0).call(x.clone()).unwrap_err().to_string();
    assert!(e.contains("top_k") && e.contains("k = 5"), "{e}");
    // An index out of range at run time: an error from the call.
    let f = function(|(x, i): (Tensor, Tensor)| x.gather_elements(0, &i));
    let e = f.call((x, Tensor::from_vec(vec![5i64, 0, 0, 0], &[1, 4]))).unwrap_err().to_string();
    assert!(e.contains("index 5 is out of range"), "{e}");
}

/// `dynamic_update_slice` of a buffer that dies at the write runs in place
/// (the profile shows it); in a loop (a KV cache, the stacks of a loop's
/// gradient) the result is the eager one.
#[test]
fn a_dying_buffer_is_updated_in_place_and_loops_match_eager() {
    let f = function(|(x, row): (Tensor, Tensor)| {
        let buf = (&x * 2.0).exp();
        buf.dynamic_update_slice(&row, &Tensor::from_vec(vec![2i64, 1], &[2])) * 3.0
    });
    let (x, row) = (Tensor::randn(&[4, 3], 4), Tensor::randn(&[1, 2], 5));
    let got = f.call((x.clone(), row.clone())).unwrap();
    let want = (&x * 2.0).exp().dynamic_update_slice(&row, &Tensor::from_vec(vec![2i64, 1], &[2])) * 3.0;
    let close = |a: &Tensor, b: &Tensor| {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        a.len() == b.len() && a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()))
    };
    assert!(close(&got, &want), "{got} vs eager {want}");
    let cf = f.concrete_functions()[0].clone();
    let p = cf.profile(&[x, row], 2).unwrap().expect("the JIT runs it");
    let write = p.steps.iter().find(|s| s.what.starts_with("dynamic_update_slice")).expect("the write is a step");
    assert!(write.what.ends_with("(in place of input 0)"), "{p}");

    let body = |i: Tensor, (buf, h): (Tensor, Tensor)| {
        let h = (&h * 1.5).tanh() + i.cast(DType::F32) * 0.01;
        let at = Tensor::stack(&[i.clone(), Tensor::scalar(0i64)], 0);
        (buf.dynamic_update_slice(&h.reshape(&[1, 5]), &at), h)
    };
    let run = move |x: Tensor| fori_loop(0, 9, body, (Tensor::zeros(&[9, 5], DType::F32), x)).0;
    let x = Tensor::randn(&[5], 6);
    assert!(close(&function(run).call(x.clone()).unwrap(), &run(x)));
}
