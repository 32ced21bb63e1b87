//! The eager `Tensor` API as users see it: constructors, accessors,
//! operators with scalars on either side, and the errors of misuse.

use tracejit::prelude::*;

fn v32(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn constructors_and_accessors() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    assert_eq!(x.shape(), &[2, 2]);
    assert_eq!(x.dtype(), DType::F32);
    assert_eq!(x.rank(), 2);
    assert_eq!(x.len(), 4);
    let y = Tensor::from_array(ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[2, 2])));
    assert_eq!(v32(&y), vec![0.0; 4]);
    let a = Tensor::from_array(ndarray::array![[1i64, 2], [3, 4]]);
    assert_eq!(a.dtype(), DType::I64);
    assert_eq!(a.to_array::<i64>().unwrap()[[1, 0]], 3);
    assert_eq!(Tensor::scalar(1.5f32).shape(), &[] as &[usize]);
    assert_eq!(Tensor::zeros(&[2, 3], DType::F64).to_vec::<f64>().unwrap(), vec![0.0; 6]);
    assert_eq!(Tensor::ones(&[2], DType::I32).to_vec::<i32>().unwrap(), vec![1, 1]);
    assert_eq!(Tensor::full(&[2], 7.0, DType::I64).to_vec::<i64>().unwrap(), vec![7, 7]);
    assert_eq!(Tensor::arange(0.0, 5.0, 2.0, DType::I32).to_vec::<i32>().unwrap(), vec![0, 2, 4]);
    assert_eq!(Tensor::from_vec(vec![true, false], &[2]).to_vec::<bool>().unwrap(), vec![true, false]);
    let r1 = Tensor::randn(&[4, 4], 7);
    let r2 = Tensor::randn(&[4, 4], 7);
    assert_eq!(v32(&r1), v32(&r2));
    assert_ne!(v32(&r1), v32(&Tensor::randn(&[4, 4], 8)));
    let u = Tensor::rand_uniform(&[1000], -1.0, 2.0, 3);
    assert!(v32(&u).iter().all(|&x| (-1.0..2.0).contains(&x)));
    let e = Tensor::zeros(&[0, 3], DType::F32);
    assert!(e.is_empty());
    assert_eq!(e.sum(&[0], false).shape(), &[3]);
}

#[test]
fn reading_with_the_wrong_type_is_an_err_not_a_panic() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let e = x.to_vec::<f64>().unwrap_err().to_string();
    assert!(e.contains("f32") && e.contains("f64"), "{e}");
    assert!(x.to_array::<i32>().is_err());
}

#[test]
#[should_panic(expected = "from_vec")]
fn from_vec_with_the_wrong_length_panics() {
    let _ = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[2, 2]);
}

#[test]
fn scalars_on_either_side_take_the_tensor_dtype() {
    let x = Tensor::from_vec(vec![0.5f32, -1.0], &[2]);
    // Eager f32 tanh is the compiled recipe: within 4 ULP of libm's.
    let near = |got: Vec<f32>, want: [f32; 2]| {
        got.len() == 2 && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 4.0 * f32::EPSILON * w.abs())
    };
    let a = (&x * 0.5).tanh();
    assert!(near(v32(&a), [(0.25f32).tanh(), (-0.5f32).tanh()]), "{a:?}");
    let b = 0.5 * (2.0 * &x).tanh() + 1.0;
    assert_eq!(b.dtype(), DType::F32);
    assert!(near(v32(&b), [0.5 * 1f32.tanh() + 1.0, 0.5 * (-2f32).tanh() + 1.0]), "{b:?}");
    assert_eq!(v32(&(x.clone() * 3)), vec![1.5, -3.0]);
    assert_eq!(v32(&(2 * &x)), vec![1.0, -2.0]);
    assert_eq!(v32(&(1.0 - &x)), vec![0.5, 2.0]);
    assert_eq!(v32(&(&x / 2.0)), vec![0.25, -0.5]);
    assert_eq!(v32(&(&x - 1i64)), vec![-0.5, -2.0]);
    assert_eq!(v32(&(x.clone() + 1.0f32)), vec![1.5, 0.0]);
    assert_eq!(v32(&-&x), vec![-0.5, 1.0]);
    assert_eq!(v32(&(-x.clone())), vec![-0.5, 1.0]);
    let i = Tensor::from_vec(vec![7i32, -7], &[2]);
    assert_eq!((&i * 3).to_vec::<i32>().unwrap(), vec![21, -21]);
    assert_eq!((&i / 2).to_vec::<i32>().unwrap(), vec![3, -3]);
    assert_eq!((i.clone() / 0).to_vec::<i32>().unwrap(), vec![0, 0], "integer division by zero gives 0");
    assert_eq!((2.0 * &i).to_vec::<i32>().unwrap(), vec![14, -14], "an integral float fits an int tensor");
    let d = Tensor::from_vec(vec![1.0f64], &[1]);
    assert_eq!((&d * 0.1).to_vec::<f64>().unwrap(), vec![0.1]);
    // Tensor-tensor operators in every ownership combination.
    let y = Tensor::from_vec(vec![1.0f32, 1.0], &[2]);
    assert_eq!(v32(&(&x + &y)), v32(&(x.clone() + y.clone())));
    assert_eq!(v32(&(&x - y.clone())), v32(&(x.clone() - &y)));
    assert_eq!(v32(&x.maximum(0.0)), vec![0.5, 0.0]);
    assert_eq!(v32(&x.pow(2.0)), vec![0.25, 1.0]);
    assert_eq!(x.gt(0.0).to_vec::<bool>().unwrap(), vec![true, false]);
}

#[test]
#[should_panic(expected = "add: cannot broadcast [3, 4] with [5]")]
fn a_shape_mismatch_names_the_op_and_the_shapes() {
    let _ = Tensor::zeros(&[3, 4], DType::F32) + Tensor::zeros(&[5], DType::F32);
}

#[test]
#[should_panic(expected = "cast")]
fn no_implicit_promotion_between_tensors() {
    let _ = Tensor::zeros(&[2], DType::F32) * Tensor::zeros(&[2], DType::F64);
}

#[test]
#[should_panic(expected = "0.5 cannot be represented as i32")]
fn a_fractional_scalar_does_not_fit_an_int_tensor() {
    let _ = Tensor::zeros(&[2], DType::I32) * 0.5;
}

#[test]
#[should_panic(expected = "exp: expected a float tensor")]
fn transcendentals_need_floats() {
    let _ = Tensor::zeros(&[2], DType::I32).exp();
}

#[test]
fn shape_ops_and_reductions() {
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32).reshape(&[2, 3]);
    assert_eq!(x.shape(), &[2, 3]);
    assert_eq!(x.reshape(&[-1]).shape(), &[6]);
    assert_eq!(v32(&x.transpose(&[1, 0])), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(v32(&x.sum(&[1], false)), vec![3.0, 12.0]);
    assert_eq!(x.sum(&[-1], true).shape(), &[2, 1]);
    assert_eq!(v32(&x.max(&[0], false)), vec![3.0, 4.0, 5.0]);
    assert_eq!(v32(&x.mean_all()), vec![2.5]);
    assert_eq!(x.argmax(1, false).to_vec::<i64>().unwrap(), vec![2, 2]);
    assert_eq!(x.expand_dims(0).shape(), &[1, 2, 3]);
    assert_eq!(x.expand_dims(0).squeeze(&[]).shape(), &[2, 3]);
    assert_eq!(Tensor::concat(&[x.clone(), x.clone()], 0).shape(), &[4, 3]);
    assert_eq!(Tensor::stack(&[&x, &x], -1).shape(), &[2, 3, 2]);
    assert_eq!(
        v32(&x.slice(&[SliceSpec::FULL, SliceSpec { start: None, stop: None, step: -1 }])),
        vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]
    );
    let idx = Tensor::from_vec(vec![2i64, 0], &[2]);
    assert_eq!(v32(&x.gather(&idx, 1)), vec![2.0, 0.0, 5.0, 3.0]);
    assert_eq!(v32(&idx.one_hot(3, DType::F32)), vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    assert_eq!(x.broadcast_to(&[4, 2, 3]).shape(), &[4, 2, 3]);
    let m = x.matmul(&x.transpose(&[1, 0]));
    assert_eq!(v32(&m), vec![5.0, 14.0, 14.0, 50.0]);
    let c = x.gt(2.0);
    assert_eq!(v32(&Tensor::select(&c, &x, &(&x * 0.0))), vec![0.0, 0.0, 0.0, 3.0, 4.0, 5.0]);
    assert_eq!(x.cast(DType::I32).to_vec::<i32>().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(v32(&x.clamp(1.0, 3.0)), vec![1.0, 1.0, 2.0, 3.0, 3.0, 3.0]);
}

#[test]
#[should_panic(expected = "sum: axis 2 is out of range")]
fn an_axis_out_of_range_names_the_op() {
    let _ = Tensor::zeros(&[2, 3], DType::F32).sum(&[2], false);
}

#[test]
fn nan_and_inf_propagate_as_in_numpy() {
    let x = Tensor::from_vec(vec![f32::NAN, 1.0, f32::INFINITY, -f32::INFINITY], &[4]);
    let m = x.maximum(0.0);
    let v = v32(&m);
    assert!(v[0].is_nan());
    assert_eq!(&v[1..], &[1.0, f32::INFINITY, 0.0]);
    assert!(v32(&x.max_all())[0].is_nan());
    assert!(v32(&x.relu())[0].is_nan());
    assert_eq!(x.is_nan().to_vec::<bool>().unwrap(), vec![true, false, false, false]);
    assert_eq!(x.is_finite().to_vec::<bool>().unwrap(), vec![false, true, false, false]);
}

/// f32 `exp`, `tanh` and `sigmoid` run eagerly through the vector recipes
/// compiled code runs: a compiled function's bits, within the JIT's
/// documented error bounds (1, 4 and 2 ULP) of the f64 functions, on
/// values across the binades, the clamps and the special values; f64
/// keeps the exact library functions.
#[test]
fn eager_f32_transcendentals_take_the_compiled_recipes() {
    let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0517).collect();
    xs.extend([0.0, -0.0, 1e-30, -1e-8, 88.7, 89.5, -103.0, -110.0, 8.0, 8.1, -9.0, f32::INFINITY, f32::NEG_INFINITY]);
    xs.extend([f32::MIN_POSITIVE, 3.4e38, -3.4e38]);
    let x = Tensor::from_vec(xs.clone(), &[xs.len()]);
    let ulps = |a: f32, b: f32| {
        let key =
            |v: f32| if v.to_bits() >> 31 == 1 { -((v.to_bits() & 0x7fff_ffff) as i64) } else { v.to_bits() as i64 };
        (key(a) - key(b)).unsigned_abs()
    };
    type Pair = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64, u64);
    let cases: [Pair; 3] = [
        ("exp", |t| t.exp(), f64::exp, 1),
        ("tanh", |t| t.tanh(), f64::tanh, 4),
        ("sigmoid", |t| t.sigmoid(), |v| 1.0 / (1.0 + (-v).exp()), 2),
    ];
    for (name, op, exact, bound) in cases {
        let eager = v32(&op(&x));
        let f = function(move |x: Tensor| op(&x));
        let compiled = v32(&f.call(x.clone()).unwrap());
        assert_eq!(f.concrete_functions()[0].executor_kind(), "jit", "{name}: the JIT ran");
        for (i, (&e, &c)) in eager.iter().zip(&compiled).enumerate() {
            assert!(
                e.to_bits() == c.to_bits() || (e.is_nan() && c.is_nan()),
                "{name}({}): eager {e} vs compiled {c}",
                xs[i]
            );
            let want = exact(f64::from(xs[i])) as f32;
            assert!(ulps(e, want) <= bound, "{name}({}): {e} vs {want}", xs[i]);
        }
        let x64 = Tensor::from_vec(xs.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), &[xs.len()]);
        let got = op(&x64).to_vec::<f64>().unwrap();
        for (g, &v) in got.iter().zip(&xs) {
            let want = exact(f64::from(v));
            assert!(
                *g == want || (name == "sigmoid" && (g - want).abs() <= 2.0 * f64::EPSILON),
                "{name} f64({v}): {g} vs {want}"
            );
        }
    }
}

/// Eager f32 products run the executor's GEMM: the compiled function's
/// bits, for plain, odd, batched and transposed operands, and within the
/// `k·ε·Σ|aᵢbᵢ|` bound of the f64 product.
/// `got` (the f32 product `a · b`) within the GEMM's rounding bound
/// `(k+2)·ε·Σ|ab|` of the f64 product, element by element.
fn assert_within_gemm_bound(a: &Tensor, b: &Tensor, got: &[f32], case: usize) {
    let (a64, b64) = (a.cast(DType::F64), b.cast(DType::F64));
    let exact = a64.matmul(&b64).to_vec::<f64>().unwrap();
    let mag = a64.abs().matmul(&b64.abs()).to_vec::<f64>().unwrap();
    let k = a.shape()[a.rank() - 1] as f64;
    for (j, ((&g, &w), &m)) in got.iter().zip(&exact).zip(&mag).enumerate() {
        let bound = (k + 2.0) * f64::from(f32::EPSILON) * m;
        assert!((f64::from(g) - w).abs() <= bound, "case {case} element {j}: {g} vs {w} (bound {bound})");
    }
}

/// `op`'s f32 result at `threads` threads (under `target`), and how many
/// times the call entered the pool.
fn at_threads(target: tracejit::Target, threads: usize, op: &dyn Fn() -> Tensor) -> (Vec<f32>, u64) {
    target.with_threads(threads).enter(|| {
        let before = tracejit::config::pool_dispatches();
        let out = v32(&op());
        (out, tracejit::config::pool_dispatches() - before)
    })
}

#[test]
fn eager_products_take_the_compiled_gemm() {
    let gen = |shape: &[usize], seed: u64| Tensor::randn(shape, seed);
    let cases: [(Tensor, Tensor); 4] = [
        (gen(&[37, 129], 1), gen(&[129, 61], 2)),
        (gen(&[3, 17, 33], 3), gen(&[33, 20], 4)),
        (gen(&[300, 40], 5), gen(&[70, 40], 6).transpose(&[1, 0])),
        (gen(&[2, 5, 8], 7), gen(&[2, 8, 9], 8)),
    ];
    for (i, (a, b)) in cases.into_iter().enumerate() {
        let eager = a.matmul(&b);
        let f = function(|(a, b): (Tensor, Tensor)| a.matmul(&b));
        let compiled = f.call((a.clone(), b.clone())).unwrap();
        assert_eq!(f.concrete_functions()[0].executor_kind(), "jit", "case {i}: the JIT ran");
        let (e, c) = (v32(&eager), v32(&compiled));
        assert!(e.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()), "case {i}: eager and compiled differ");
        assert_within_gemm_bound(&a, &b, &e, i);
    }
}

/// Eager elementwise ops and reductions on large arrays split across the
/// pool at two threads, with one thread's bits: the recipes' exp, tanh and
/// sigmoid, a softmax written out (row max and sum, broadcast sub and
/// div), and a select.
#[test]
fn large_eager_ops_split_across_threads_with_the_same_bits() {
    use tracejit::Target;
    let x = Tensor::randn(&[301, 517], 3);
    let ops: [(&str, &dyn Fn() -> Tensor); 5] = [
        ("exp", &|| x.exp()),
        ("tanh", &|| x.tanh()),
        ("sigmoid", &|| x.sigmoid()),
        ("softmax", &|| {
            let e = (&x - &x.max(&[1], true)).exp();
            &e / &e.sum(&[1], true)
        }),
        ("select", &|| Tensor::select(&x.gt(x.mean(&[0], true)), &x, &x.neg())),
    ];
    for (name, op) in ops {
        let ((one, serial), (two, split)) = (at_threads(Target::host(), 1, op), at_threads(Target::host(), 2, op));
        assert_eq!(serial, 0, "{name}: one thread stays on the caller");
        assert!(split > 0, "{name}: two threads split the work");
        assert!(one.iter().zip(&two).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: the bits changed");
    }
}

/// A batch of products each too small to split (per-example outer
/// products) splits the batch across threads when together they are
/// large: the same bits as on one thread, within the GEMM's rounding bound
/// of the f64 product, a broadcast batch axis included.
#[test]
fn a_batch_of_small_products_splits_across_threads_with_the_same_bits() {
    use tracejit::Target;
    let cases = [
        (Tensor::randn(&[24, 33, 1], 11), Tensor::randn(&[24, 1, 65], 12)),
        (Tensor::randn(&[1, 33, 7], 13), Tensor::randn(&[3, 8, 7, 65], 14)),
    ];
    for (i, (a, b)) in cases.iter().enumerate() {
        // Each product has 2,145 or 15,015 multiply-adds, the batch 51,480
        // or more: at this threshold the products cannot split, the batch can.
        let (target, op) = (Target::host().with_gemm_threshold(20_000), &|| a.matmul(b));
        let ((one, serial), (two, split)) = (at_threads(target, 1, op), at_threads(target, 2, op));
        assert_eq!(serial, 0, "case {i}: one thread stays on the caller");
        assert!(split > 0, "case {i}: two threads split the batch");
        assert!(one.iter().zip(&two).all(|(x, y)| x.to_bits() == y.to_bits()), "case {i}: the bits changed");
        assert_within_gemm_bound(a, b, &two, i);
    }
}

/// Results of 32 MiB or more (what glibc maps fresh for every call) are
/// asked huge pages for before they are written, and keep their values: a
/// batched outer product of 33.8 MB eager and compiled (same bits, within
/// the rounding bound), and the exp of it.
#[test]
fn results_past_the_huge_page_threshold_are_advised_and_exact() {
    let (a, b) = (Tensor::randn(&[64, 400, 1], 21), Tensor::randn(&[64, 1, 330], 22));
    let before = tracejit::config::huge_page_buffers();
    let eager = a.matmul(&b);
    let exp = eager.exp();
    let advised = tracejit::config::huge_page_buffers() - before;
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let off = std::env::var("TRACEJIT_HUGE_PAGES").is_ok_and(|v| v == "0");
    if cfg!(target_os = "linux") && !off && (thp.contains("[always]") || thp.contains("[madvise]")) {
        // The product's buffer and the exp's.
        assert_eq!(advised, 2, "huge pages asked for the two results");
    }
    let e = v32(&eager);
    assert_within_gemm_bound(&a, &b, &e, 0);
    for (j, (&x, &y)) in e.iter().zip(&v32(&exp)).enumerate().step_by(997) {
        let want = f64::from(x).exp();
        assert!((f64::from(y) - want).abs() <= 2.0 * f64::from(f32::EPSILON) * want, "exp element {j}: {y} vs {want}");
    }
    let f = function(|(a, b): (Tensor, Tensor)| a.matmul(&b));
    let compiled = v32(&f.call((a.clone(), b.clone())).unwrap());
    assert_eq!(f.concrete_functions()[0].executor_kind(), "jit", "the JIT ran");
    assert!(e.iter().zip(&compiled).all(|(x, y)| x.to_bits() == y.to_bits()), "eager and compiled differ");
}
