//! `tracejit.nn.layer_norm_grad`, the backward of `layer_norm`: its native
//! kernel against the composite's primitive body (run by the interpreter)
//! on odd shapes, broadcast gamma and beta, NaN and Inf rows, and random
//! inputs; the gradients (and a gradient of the gradient) against central
//! finite differences in f64; traced gradients against eager ones; and the
//! selector choosing the kernel in a traced training step.

use proptest::prelude::*;
use tracejit_ir::tolerance::{self, Budget};
use tracejit_ir::Op;
use tracejit_nn::composite;
use tracejit_trace::{function, DType, Function, GradientTape, Tensor, TensorSpec};

const NAME: &str = "tracejit.nn.layer_norm_grad";
const EPS: f64 = 1e-5;

type Grads = (Tensor, Tensor, Tensor);

/// The composite's primitive body, by the interpreter: the caller's
/// selector is off (so the call is inlined) and the JIT is off. `eps` is
/// read eagerly and baked into a fresh function.
fn body(inputs: &[Tensor]) -> Vec<Tensor> {
    let eps = inputs[3].cast(DType::F64).to_vec::<f64>().unwrap()[0];
    let f = function(move |(x, g, b, dy): (Tensor, Tensor, Tensor, Tensor)| {
        tracejit_nn::layer_norm_grad(&x, &g, &b, eps, &dy)
    })
    .selector(false)
    .jit(false);
    let (dx, dg, db) = f.call((inputs[0].clone(), inputs[1].clone(), inputs[2].clone(), inputs[4].clone())).unwrap();
    vec![dx, dg, db]
}

fn specs_of(inputs: &[Tensor]) -> Vec<TensorSpec> {
    inputs.iter().map(|t| TensorSpec { ty: t.tensor_type() }).collect()
}

/// The registered native kernel, which must accept these inputs.
fn kernel(inputs: &[Tensor]) -> Vec<Tensor> {
    let k = composite::lookup(NAME, &specs_of(inputs))
        .unwrap_or_else(|| panic!("no kernel accepts {:?}", specs_of(inputs)));
    k(inputs)
}

/// `[x, gamma, beta, eps, dy]` of `dtype`: x and dy of `shape`, gamma and
/// beta of `param` (gamma around 1).
fn inputs(dtype: DType, shape: &[usize], param: &[usize], seed: u64) -> Vec<Tensor> {
    vec![
        Tensor::randn(shape, seed).cast(dtype) * 2.0 + 0.5,
        (Tensor::randn(param, seed + 1) * 0.5 + 1.0).cast(dtype),
        Tensor::randn(param, seed + 2).cast(dtype),
        Tensor::full(&[], EPS, dtype),
        Tensor::randn(shape, seed + 3).cast(dtype),
    ]
}

/// Kernel and body agree within a kernel's tolerance, with the same dtypes
/// and shapes (NaN where the body has NaN).
fn assert_agree(inputs: &[Tensor], what: &str) {
    let (want, got) = (body(inputs), kernel(inputs));
    assert_eq!(got.len(), 3);
    let scale = inputs.iter().map(|t| tolerance::magnitude(t.storage().unwrap())).fold(1.0, f64::max);
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g.tensor_type(), w.tensor_type(), "{what}: output {k}");
        let (w, g) = (w.storage().unwrap(), g.storage().unwrap());
        let n = inputs[0].shape().first().copied().unwrap_or(1).max(1) as f64;
        // dgamma and dbeta sum over the rows: the budget grows with them.
        let budget = Budget {
            eps: tolerance::KERNEL_BUDGET,
            scale: scale.max(tolerance::magnitude(w)) * n,
            unverifiable: false,
        };
        if let Some(d) = tolerance::compare(w, g, &budget) {
            panic!("{what}: output {k} differs from the body's: {d}");
        }
    }
}

#[test]
fn the_kernel_matches_the_body_on_odd_shapes() {
    for dtype in [DType::F32, DType::F64] {
        for (shape, param) in [
            (vec![0usize, 3], vec![3usize]),
            (vec![1, 1], vec![1]),
            (vec![3, 5], vec![5]),
            (vec![2, 1023], vec![1023]),
            (vec![130, 7], vec![7]),
            (vec![2, 3, 4], vec![4]),
            (vec![5], vec![5]),
            (vec![3, 0], vec![0]),
            // Broadcast gamma and beta.
            (vec![3, 5], vec![1]),
            (vec![3, 5], vec![1, 5]),
            (vec![2, 3, 4], vec![1, 1, 4]),
            (vec![3, 5], vec![]),
            (vec![0, 3], vec![1]),
        ] {
            let what = format!("{dtype} x {shape:?}, gamma {param:?}");
            assert_agree(&inputs(dtype, &shape, &param, shape.iter().sum::<usize>() as u64), &what);
        }
    }
}

#[test]
fn the_kernel_passes_the_registry_check_over_unknown_dims() {
    // composite::check_kernel: sizes 0, 1, 3 and 5 for every -1, several seeds.
    for dtype in [DType::F32, DType::F64] {
        for param in [vec![-1i64], vec![1], vec![1, -1]] {
            let specs = [
                TensorSpec::new(dtype, &[-1, -1]),
                TensorSpec::new(dtype, &param),
                TensorSpec::new(dtype, &param),
                TensorSpec::new(dtype, &[]),
                TensorSpec::new(dtype, &[-1, -1]),
            ];
            composite::check_kernel(&specs, body, kernel).unwrap_or_else(|e| panic!("{dtype} gamma {param:?}: {e}"));
        }
    }
}

#[test]
fn nan_and_inf_rows_stay_in_their_rows() {
    for dtype in [DType::F32, DType::F64] {
        let mut x = vec![0.3f64, -1.0, 2.0, 0.5, 1.5, 0.2, -0.7, 0.9];
        x.extend([f64::NAN, 1.0, 2.0, 3.0, f64::INFINITY, 1.0, 2.0, 3.0, f64::NEG_INFINITY, 0.0, 0.0, 0.0]);
        let mut ins = inputs(dtype, &[5, 4], &[4], 7);
        ins[0] = Tensor::from_vec(x, &[5, 4]).cast(dtype);
        assert_agree(&ins, &format!("{dtype} NaN/Inf rows"));
        let got = kernel(&ins);
        let dx = got[0].cast(DType::F64).to_vec::<f64>().unwrap();
        assert!(dx[..8].iter().all(|v| v.is_finite()), "finite rows keep finite gradients: {dx:?}");
        assert!(dx[8..].iter().all(|v| v.is_nan()), "non-finite rows give NaN: {dx:?}");
        // dbeta does not depend on x; dgamma sums NaN rows in.
        assert!(got[2].cast(DType::F64).to_vec::<f64>().unwrap().iter().all(|v| v.is_finite()));
        assert!(got[1].cast(DType::F64).to_vec::<f64>().unwrap().iter().all(|v| v.is_nan()));
    }
}

fn ln_loss(x: &Tensor, g: &Tensor, b: &Tensor, up: &Tensor) -> f64 {
    (tracejit_nn::layer_norm(x, g, b, EPS) * up).sum_all().to_vec::<f64>().unwrap()[0]
}

#[test]
fn the_gradients_match_finite_differences_in_f64() {
    for (shape, param) in [
        (vec![3usize, 5], vec![5usize]),
        (vec![1, 1], vec![1]),
        (vec![2, 7], vec![1]),
        (vec![2, 4], vec![1, 4]),
        (vec![2, 2, 3], vec![3]),
    ] {
        let ins = inputs(DType::F64, &shape, &param, 11);
        let (x, gamma, beta, up) = (&ins[0], &ins[1], &ins[2], &ins[4]);
        let got = kernel(&ins);
        let args = [x.clone(), gamma.clone(), beta.clone()];
        for k in 0..3 {
            assert_eq!(got[k].shape(), args[k].shape());
            let base = args[k].to_vec::<f64>().unwrap();
            let grad = got[k].to_vec::<f64>().unwrap();
            for i in 0..base.len() {
                let at = |d: f64| {
                    let mut a = args.clone();
                    let mut p = base.clone();
                    p[i] += d;
                    a[k] = Tensor::from_vec(p, args[k].shape());
                    ln_loss(&a[0], &a[1], &a[2], up)
                };
                let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
                assert!(
                    (grad[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                    "x {shape:?} gamma {param:?}: input {k} element {i}: {} vs {fd}",
                    grad[i]
                );
            }
        }
    }
}

/// The gradients of `sum(layer_norm(x, gamma, beta) * up)` by a tape.
fn tape_grads((x, gamma, beta, up): (Tensor, Tensor, Tensor, Tensor)) -> Grads {
    let tape = GradientTape::new();
    for t in [&x, &gamma, &beta] {
        tape.watch(t);
    }
    let y = (tracejit_nn::layer_norm(&x, &gamma, &beta, EPS) * &up).sum_all();
    let g = tape.gradient(&y, &[&x, &gamma, &beta]).unwrap();
    let mut it = g.into_iter().map(|g| g.expect("connected"));
    let mut next = || it.next().unwrap();
    (next(), next(), next())
}

fn kernels_in(f: &Function<(Tensor, Tensor, Tensor, Tensor), Grads>) -> Vec<String> {
    let cf = f.concrete_functions()[0].clone();
    cf.optimized_graph()
        .nodes()
        .filter_map(|(_, n)| match &n.op {
            Op::Kernel { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn traced_gradients_equal_eager_and_the_selector_picks_the_kernel() {
    for dtype in [DType::F32, DType::F64] {
        for (shape, param) in [(vec![4usize, 6], vec![6usize]), (vec![3, 1023], vec![1]), (vec![1, 1], vec![1, 1])] {
            let ins = inputs(dtype, &shape, &param, 21);
            let args = (ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[4].clone());
            let eager = tape_grads(args.clone());
            let step = function(tape_grads);
            let traced = step.call(args).unwrap();
            let ins3 = [&ins[0], &ins[1], &ins[2]];
            for (k, (e, t)) in
                [&eager.0, &eager.1, &eager.2].into_iter().zip([&traced.0, &traced.1, &traced.2]).enumerate()
            {
                assert_eq!(e.tensor_type(), t.tensor_type());
                let scale = tolerance::magnitude(ins3[k].storage().unwrap()).max(shape[0] as f64 * 8.0);
                let budget = Budget { eps: tolerance::KERNEL_BUDGET, scale, unverifiable: false };
                if let Some(d) = tolerance::compare(e.storage().unwrap(), t.storage().unwrap(), &budget) {
                    panic!("{dtype} {shape:?}: traced gradient {k} differs from eager: {d}");
                }
            }
            let names = kernels_in(&step);
            assert!(names.iter().any(|n| n == NAME), "{dtype} {shape:?}: kernels {names:?}");
            let st = step.concrete_functions()[0].schedule_stats().expect("the JIT runs it");
            // Only the gradients are returned: the forward is dead, and the
            // whole step is the backward kernel.
            assert_eq!((st.native_kernels, st.kernels()), (1, 1), "{dtype} {shape:?}: {st}");
        }
    }
}

#[test]
fn unknown_dims_in_the_signature_select_the_kernel_and_match_eager() {
    let sig = |d: &[i64]| TensorSpec::new(DType::F32, d);
    let step = function(tape_grads).input_signature(vec![sig(&[-1, 5]), sig(&[5]), sig(&[5]), sig(&[-1, 5])]);
    for rows in [0usize, 1, 3] {
        let ins = inputs(DType::F32, &[rows, 5], &[5], 31 + rows as u64);
        let args = (ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[4].clone());
        let eager = tape_grads(args.clone());
        let traced = step.call(args).unwrap();
        for (e, t) in [(&eager.0, &traced.0), (&eager.1, &traced.1), (&eager.2, &traced.2)] {
            let budget = Budget { eps: tolerance::KERNEL_BUDGET, scale: 16.0, unverifiable: false };
            assert_eq!(e.shape(), t.shape());
            assert!(tolerance::compare(e.storage().unwrap(), t.storage().unwrap(), &budget).is_none(), "{rows} rows");
        }
    }
    assert_eq!(step.tracing_count(), 1);
    assert!(kernels_in(&step).iter().any(|n| n == NAME));
}

#[test]
fn the_selector_turned_off_inlines_the_body() {
    let ins = inputs(DType::F32, &[4, 6], &[6], 41);
    let args = (ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[4].clone());
    let step = function(tape_grads).selector(false);
    step.call(args).unwrap();
    assert!(kernels_in(&step).is_empty());
}

/// A gradient of the gradient: under an outer tape, the inner tape's
/// backward runs `layer_norm_grad` as a recorded call, differentiated
/// through its body.
#[test]
fn second_order_gradients_match_finite_differences() {
    let ins = inputs(DType::F64, &[2, 4], &[4], 51);
    let (x, gamma, beta, up) = (ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[4].clone());
    let w = Tensor::randn(&[2, 4], 52).cast(DType::F64);
    let h = |x: &Tensor| {
        let inner = GradientTape::new();
        inner.watch(x);
        let y = (tracejit_nn::layer_norm(x, &gamma, &beta, EPS) * &up).sum_all();
        let dx = inner.gradient(&y, &[x]).unwrap()[0].clone().unwrap();
        (dx * &w).sum_all()
    };
    let outer = GradientTape::new();
    outer.watch(&x);
    let got = outer.gradient(&h(&x), &[&x]).unwrap()[0].clone().expect("connected").to_vec::<f64>().unwrap();
    drop(outer);
    let base = x.to_vec::<f64>().unwrap();
    for i in 0..base.len() {
        let at = |d: f64| {
            let mut p = base.clone();
            p[i] += d;
            h(&Tensor::from_vec(p, x.shape())).to_vec::<f64>().unwrap()[0]
        };
        let fd = (at(1e-5) - at(-1e-5)) / 2e-5;
        assert!((got[i] - fd).abs() <= 1e-5 * fd.abs().max(1.0), "element {i}: {} vs {fd}", got[i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_agree_with_the_body(
        rows in 0usize..6,
        cols in prop::sample::select(vec![1usize, 2, 3, 5, 8, 9, 17, 64, 1023]),
        broadcast in 0usize..3,
        f64s in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let dtype = if f64s { DType::F64 } else { DType::F32 };
        let param = match broadcast { 0 => vec![cols], 1 => vec![1], _ => vec![1, cols] };
        assert_agree(&inputs(dtype, &[rows, cols], &param, seed), &format!("{dtype} [{rows}, {cols}] gamma {param:?}"));
    }
}
