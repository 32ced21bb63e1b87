//! Every op, traced and run as a graph, against the same op run eagerly, on
//! random shapes (including 0 and 1 sized dims and rank 0), broadcasting and
//! NaN/Inf values. Through the interpreter, traced results must be bitwise
//! identical to eager ones (both run the reference kernels, so any difference
//! is a tracing bug; eager f32/f64 products run the executor's GEMM, and
//! are held to the JIT's bound); through the JIT too, except for what the JIT documents:
//! NaN payloads, float sums and products in another order (bounded by
//! `n·ε·Σ|x|`), and its transcendental approximations (tested for their ULP
//! bounds in tracejit-jit).

use std::sync::Arc;

use proptest::prelude::*;
use tracejit::prelude::*;
use tracejit::tensor::{BinaryOp, Exactness, ReduceOp, UnaryOp};

type OpFn = Arc<dyn Fn(&[Tensor]) -> Tensor + Send + Sync>;

/// How closely a traced result must match the eager one.
#[derive(Clone, Copy)]
enum Tol {
    /// Same bits, except that any NaN matches any NaN (the JIT does not keep
    /// NaN payloads, which IEEE leaves unspecified anyway).
    Exact,
    /// Float sums in another order: within `n·ε·Σ|x|`, given as an absolute
    /// bound per element by the caller.
    Sum(f64),
}

fn same_values(a: &tracejit::tensor::Storage, b: &tracejit::tensor::Storage, tol: Tol) -> bool {
    use tracejit::tensor::Storage as S;
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    let close = |x: f64, y: f64, same_bits: bool| match tol {
        Tol::Exact => x.is_nan() && y.is_nan() || same_bits,
        Tol::Sum(bound) => x.is_nan() && y.is_nan() || x == y || (x - y).abs() <= bound,
    };
    match (a, b) {
        (S::F32(x), S::F32(y)) => {
            x.iter().zip(y.iter()).all(|(&p, &q)| close(p as f64, q as f64, p.to_bits() == q.to_bits()))
        }
        (S::F64(x), S::F64(y)) => x.iter().zip(y.iter()).all(|(&p, &q)| close(p, q, p.to_bits() == q.to_bits())),
        _ => a.bit_eq(b),
    }
}

/// Runs `op` eagerly and traced (with the JIT off and on) and compares.
fn check(op: OpFn, inputs: Vec<Tensor>) -> Result<(), TestCaseError> {
    check_with(op, inputs, Tol::Exact)
}

fn check_with(op: OpFn, inputs: Vec<Tensor>, jit_tol: Tol) -> Result<(), TestCaseError> {
    check_tols(op, inputs, Tol::Exact, jit_tol)
}

/// [`check_with`] with a tolerance for the interpreter too: for ops whose
/// eager form runs the compiled kernels (f32/f64 products run the
/// executor's GEMM eagerly, the interpreter the reference kernel).
fn check_tols(op: OpFn, inputs: Vec<Tensor>, interp_tol: Tol, jit_tol: Tol) -> Result<(), TestCaseError> {
    let eager = op(&inputs);
    for jit in [false, true] {
        let op2 = op.clone();
        let f = function(move |xs: Vec<Tensor>| op2(&xs)).jit(jit);
        let traced = f.call(inputs.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The JIT really ran: a graph it could not prepare would fall back
        // to the interpreter and compare the interpreter with eager again.
        let cf = &f.concrete_functions()[0];
        let kind = if jit { "jit" } else { "interpreter" };
        prop_assert_eq!(cf.executor_kind(), kind, "{:?}", cf.jit_error());
        prop_assert_eq!(f.cache_stats().jit_failures, 0);
        let (a, b) = (eager.storage().unwrap(), traced.storage().unwrap());
        let tol = if jit { jit_tol } else { interp_tol };
        prop_assert!(
            same_values(a, b, tol),
            "jit={jit}: eager {:?} vs traced {:?} for inputs {:?}",
            eager,
            traced,
            inputs
        );
    }
    Ok(())
}

/// Position of an f32 on the ordered integer line: adjacent floats differ by
/// one, across zero and into the subnormals too.
fn ordered(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN - b } else { b })
}

/// ULP bounds of an approximated f32 function against the correctly
/// rounded result: `(recipe, reference)`. The recipe's are the ones
/// `tracejit-jit` documents and its ULP sweep enforces (exp 1, log 4,
/// tanh 4, sigmoid 2, erf 6); the interpreter's come from the reference
/// functions, measured against f64 on every seventh f32: glibc's `expf` and
/// `logf` 1, `tanhf` 2, libm's `erff` 1 (allowed 2), and the reference
/// sigmoid `e / (1 + e)` with `e = expf(±x)` 2 (allowed 3: expf's ULP plus
/// two roundings of half an ULP).
fn ulp_bounds(op: UnaryOp) -> (i64, i64) {
    match op {
        UnaryOp::Exp => (1, 1),
        UnaryOp::Log => (4, 1),
        UnaryOp::Tanh => (4, 2),
        UnaryOp::Sigmoid => (2, 3),
        UnaryOp::Erf => (6, 2),
        other => panic!("{} is not approximated", other.name()),
    }
}

/// Each f32 result within `bound` ULP of the reference; NaN where it is NaN,
/// and infinities exactly.
fn within_ulps(got: &Tensor, reference: &[f32], bound: i64) -> Result<(), String> {
    let got = got.to_vec::<f32>().map_err(|e| e.to_string())?;
    for (i, (&y, &r)) in got.iter().zip(reference).enumerate() {
        let ok = if r.is_nan() || y.is_nan() {
            r.is_nan() && y.is_nan()
        } else if r.is_infinite() || y.is_infinite() {
            r == y
        } else {
            (ordered(y) - ordered(r)).abs() <= bound
        };
        if !ok {
            return Err(format!("element {i}: {y:e} against {r:e}, more than {bound} ULP apart"));
        }
    }
    Ok(())
}

/// An approximated f32 op: eager, the interpreter and the JIT each within
/// their ULP bound of the op computed in f64 and rounded once (eager takes
/// the recipe for exp, tanh and sigmoid, the reference functions for the
/// rest).
fn check_approximate(op: OpFn, which: UnaryOp, x: Tensor) -> Result<(), TestCaseError> {
    let reference: Vec<f32> = op(&[x.cast(DType::F64)]).cast(DType::F32).to_vec::<f32>().unwrap();
    let (recipe, libm) = ulp_bounds(which);
    let eager_recipe = matches!(which, UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid);
    let eager = op(std::slice::from_ref(&x));
    within_ulps(&eager, &reference, if eager_recipe { recipe } else { libm })
        .map_err(|e| TestCaseError::fail(format!("eager {}: {e}", which.name())))?;
    for jit in [false, true] {
        let op2 = op.clone();
        let f = function(move |xs: Vec<Tensor>| op2(&xs)).jit(jit);
        let traced = f.call(vec![x.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cf = &f.concrete_functions()[0];
        let kind = if jit { "jit" } else { "interpreter" };
        prop_assert_eq!(cf.executor_kind(), kind, "{:?}", cf.jit_error());
        within_ulps(&traced, &reference, if jit { recipe } else { libm })
            .map_err(|e| TestCaseError::fail(format!("{kind} {}: {e}", which.name())))?;
    }
    Ok(())
}

fn values(n: usize, dtype: DType, seed: u64) -> Tensor {
    let special = [f64::NAN, f64::INFINITY, -f64::INFINITY, -0.0, 0.0, 1.0, -1.0, 0.5];
    let raw: Vec<f64> = (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
            if h.is_multiple_of(7) {
                special[(h as usize / 7) % special.len()]
            } else {
                ((h >> 11) % 2001) as f64 / 100.0 - 10.0
            }
        })
        .collect();
    match dtype {
        DType::F32 => Tensor::from_vec(raw.iter().map(|&v| v as f32).collect(), &[n]),
        DType::F64 => Tensor::from_vec(raw, &[n]),
        DType::I32 => Tensor::from_vec(raw.iter().map(|&v| if v.is_finite() { v as i32 } else { 3 }).collect(), &[n]),
        DType::I64 => Tensor::from_vec(raw.iter().map(|&v| if v.is_finite() { v as i64 } else { -3 }).collect(), &[n]),
        DType::Bool => Tensor::from_vec(raw.iter().map(|&v| v > 0.0).collect(), &[n]),
        DType::BF16 | DType::F16 => Tensor::from_vec(raw, &[n]).cast(dtype),
        // The other integers like i64, wrapped into the dtype (u8's -3 is 253).
        _ => {
            Tensor::from_vec(raw.iter().map(|&v| if v.is_finite() { v as i64 } else { -3 }).collect(), &[n]).cast(dtype)
        }
    }
}

fn tensor(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n = shape.iter().product();
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    values(n, dtype, seed).reshape(&dims)
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..6, Just(17)], 0..4)
}

/// Two shapes that broadcast: the second is derived from the first by
/// dropping leading dims and setting some dims to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape_strategy()
        .prop_flat_map(|a| {
            let n = a.len();
            (Just(a), 0..=n, prop::collection::vec(any::<bool>(), n))
        })
        .prop_map(|(a, drop, ones)| {
            let b: Vec<usize> = a.iter().zip(&ones).skip(drop).map(|(&d, &one)| if one { 1 } else { d }).collect();
            (a, b)
        })
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn unary_ops(shape in shape_strategy(), dtype in dtype_strategy(), seed in any::<u64>(), which in 0..UnaryOp::ALL.len()) {
        let op = UnaryOp::ALL[which];
        prop_assume!(op.result_dtype(dtype).is_some());
        let f: OpFn = Arc::new(move |xs: &[Tensor]| match op {
            UnaryOp::Neg => xs[0].neg(),
            UnaryOp::Abs => xs[0].abs(),
            UnaryOp::Sign => xs[0].sign(),
            UnaryOp::Exp => xs[0].exp(),
            UnaryOp::Expm1 => xs[0].expm1(),
            UnaryOp::Log => xs[0].log(),
            UnaryOp::Log1p => xs[0].log1p(),
            UnaryOp::Sqrt => xs[0].sqrt(),
            UnaryOp::Rsqrt => xs[0].rsqrt(),
            UnaryOp::Square => xs[0].square(),
            UnaryOp::Reciprocal => xs[0].reciprocal(),
            UnaryOp::Tanh => xs[0].tanh(),
            UnaryOp::Sigmoid => xs[0].sigmoid(),
            UnaryOp::Relu => xs[0].relu(),
            UnaryOp::Erf => xs[0].erf(),
            UnaryOp::Sin => xs[0].sin(),
            UnaryOp::Cos => xs[0].cos(),
            UnaryOp::Sinh => xs[0].sinh(),
            UnaryOp::Cosh => xs[0].cosh(),
            UnaryOp::Atan => xs[0].atan(),
            UnaryOp::Softplus => xs[0].softplus(),
            UnaryOp::Floor => xs[0].floor(),
            UnaryOp::Ceil => xs[0].ceil(),
            UnaryOp::Round => xs[0].round(),
            UnaryOp::LogicalNot => xs[0].logical_not(),
            UnaryOp::IsNan => xs[0].is_nan(),
            UnaryOp::IsFinite => xs[0].is_finite(),
        });
        // Transcendentals may be approximated in f32 (by the JIT, and by
        // eager exp/tanh/sigmoid, which run the JIT's vector recipes):
        // each executor is held to its documented ULP bound against the f64
        // result rounded once; every other dtype runs the reference
        // functions everywhere, bit for bit.
        if op.exactness() == Exactness::ApproxF32 && dtype == DType::F32 {
            check_approximate(f, op, tensor(&shape, dtype, seed))?;
        } else if op.exactness() == Exactness::ApproxF32 {
            let x = tensor(&shape, dtype, seed);
            let eager = f(std::slice::from_ref(&x));
            let f2 = f.clone();
            let traced = function(move |xs: Vec<Tensor>| f2(&xs)).jit(false).call(vec![x]).unwrap();
            prop_assert!(same_values(eager.storage().unwrap(), traced.storage().unwrap(), Tol::Exact));
        } else {
            check(f, vec![tensor(&shape, dtype, seed)])?;
        }
    }

    #[test]
    fn binary_ops((a, b) in broadcast_pair(), dtype in dtype_strategy(), seed in any::<u64>(), which in 0..BinaryOp::ALL.len(), swap in any::<bool>()) {
        let op = BinaryOp::ALL[which];
        prop_assume!(op.result_dtype(dtype).is_some());
        let (a, b) = if swap { (b, a) } else { (a, b) };
        let f: OpFn = Arc::new(move |xs: &[Tensor]| {
            let (x, y) = (&xs[0], &xs[1]);
            match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                BinaryOp::Pow => x.pow(y),
                BinaryOp::Maximum => x.maximum(y),
                BinaryOp::Minimum => x.minimum(y),
                BinaryOp::Rem => x.rem(y),
                BinaryOp::Eq => x.eq(y),
                BinaryOp::Ne => x.ne(y),
                BinaryOp::Lt => x.lt(y),
                BinaryOp::Le => x.le(y),
                BinaryOp::Gt => x.gt(y),
                BinaryOp::Ge => x.ge(y),
                BinaryOp::LogicalAnd => x.logical_and(y),
                BinaryOp::LogicalOr => x.logical_or(y),
                BinaryOp::BitwiseAnd => x.bitwise_and(y),
                BinaryOp::BitwiseOr => x.bitwise_or(y),
                BinaryOp::BitwiseXor => x.bitwise_xor(y),
            }
        });
        check(f, vec![tensor(&a, dtype, seed), tensor(&b, dtype, seed ^ 1)])?;
    }

    #[test]
    fn select_cast_clamp((a, b) in broadcast_pair(), dtype in dtype_strategy(), to in dtype_strategy(), seed in any::<u64>()) {
        let sel: OpFn = Arc::new(|xs: &[Tensor]| Tensor::select(&xs[0], &xs[1], &xs[2]));
        check(sel, vec![tensor(&b, DType::Bool, seed), tensor(&a, dtype, seed ^ 2), tensor(&b, dtype, seed ^ 3)])?;
        let cast: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].cast(to));
        check(cast, vec![tensor(&a, dtype, seed)])?;
        if dtype.is_numeric() {
            let clamp: OpFn = Arc::new(|xs: &[Tensor]| xs[0].clamp(-2.0, 3.0));
            check(clamp, vec![tensor(&a, dtype, seed)])?;
        }
    }

    #[test]
    fn reductions(shape in shape_strategy(), dtype in dtype_strategy(), seed in any::<u64>(), which in 0..ReduceOp::ALL.len(), mask in any::<u8>(), keepdims in any::<bool>()) {
        let op = ReduceOp::ALL[which];
        prop_assume!(op.result_dtype(dtype).is_some());
        let axes: Vec<i64> = (0..shape.len() as i64).filter(|i| mask & (1 << i) != 0).collect();
        let empty_axis = axes.iter().any(|&a| shape[a as usize] == 0);
        prop_assume!(!(empty_axis && matches!(op, ReduceOp::Max | ReduceOp::Min)));
        let f: OpFn = Arc::new(move |xs: &[Tensor]| match op {
            ReduceOp::Sum => xs[0].sum(&axes, keepdims),
            ReduceOp::Mean => xs[0].mean(&axes, keepdims),
            ReduceOp::Max => xs[0].max(&axes, keepdims),
            ReduceOp::Min => xs[0].min(&axes, keepdims),
            ReduceOp::Prod => xs[0].prod(&axes, keepdims),
        });
        let x = tensor(&shape, dtype, seed);
        // The JIT may sum floats in another order: bound the difference by
        // n·ε·Σ|x| over the whole input (a loose but sound bound).
        let tol = if dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
            // Over finite entries: a row holding NaN or Inf gives the same
            // non-finite result in any order.
            let abs_sum: f64 =
                x.cast(DType::F64).to_vec::<f64>().unwrap().into_iter().filter(|v| v.is_finite()).map(f64::abs).sum();
            let eps = if dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
            let n = x.len().max(1) as f64;
            Tol::Sum(n * eps * abs_sum)
        } else {
            Tol::Exact
        };
        // Prod in another order can differ by more than a sum bound; products
        // stay exact only in the interpreter.
        let skip_jit_prod = dtype.is_float() && op == ReduceOp::Prod;
        if skip_jit_prod {
            let eager = f(std::slice::from_ref(&x));
            let f2 = f.clone();
            let traced = function(move |xs: Vec<Tensor>| f2(&xs)).jit(false).call(vec![x.clone()]).unwrap();
            prop_assert!(same_values(eager.storage().unwrap(), traced.storage().unwrap(), Tol::Exact));
        } else {
            check_with(f, vec![x.clone()], tol)?;
        }
        if !shape.is_empty() && shape.iter().all(|&d| d > 0) && dtype.is_numeric() {
            let axis = (mask as usize % shape.len()) as i64;
            let am: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].argmax(axis, keepdims));
            check(am, vec![tensor(&shape, dtype, seed)])?;
            let an: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].argmin(axis, keepdims));
            check(an, vec![tensor(&shape, dtype, seed)])?;
        }
    }

    #[test]
    fn shape_ops(shape in shape_strategy(), dtype in dtype_strategy(), seed in any::<u64>(), k in any::<u8>()) {
        let x = tensor(&shape, dtype, seed);
        let rank = shape.len();
        let reshape: OpFn = Arc::new(|xs: &[Tensor]| xs[0].reshape(&[-1]));
        check(reshape, vec![x.clone()])?;
        let mut perm: Vec<i64> = (0..rank as i64).collect();
        perm.rotate_left(if rank > 0 { k as usize % rank } else { 0 });
        let tr: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].transpose(&perm));
        check(tr, vec![x.clone()])?;
        let ed: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].expand_dims((k as usize % (rank + 1)) as i64).squeeze(&[]));
        check(ed, vec![x.clone()])?;
        let bc: OpFn = Arc::new(|xs: &[Tensor]| {
            let mut target = vec![2];
            target.extend_from_slice(xs[0].shape());
            xs[0].broadcast_to(&target)
        });
        check(bc, vec![x.clone()])?;
        if rank > 0 {
            let axis = (k as usize % rank) as i64;
            let cat: OpFn = Arc::new(move |xs: &[Tensor]| Tensor::concat(&[&xs[0], &xs[1]], axis));
            check(cat, vec![x.clone(), tensor(&shape, dtype, seed ^ 9)])?;
            let st: OpFn = Arc::new(move |xs: &[Tensor]| Tensor::stack(&[&xs[0], &xs[1]], axis));
            check(st, vec![x.clone(), tensor(&shape, dtype, seed ^ 9)])?;
            let step = if k % 2 == 0 { 2 } else { -1 };
            let sl: OpFn = Arc::new(move |xs: &[Tensor]| {
                let mut specs = vec![SliceSpec::FULL; xs[0].rank()];
                specs[axis as usize] = SliceSpec { start: Some(1), stop: None, step };
                xs[0].slice(&specs)
            });
            check(sl, vec![x.clone()])?;
            let n = shape[axis as usize];
            if n > 0 {
                let idx = Tensor::from_vec(vec![0i64, (n - 1) as i64, -1], &[3]);
                let ga: OpFn = Arc::new(move |xs: &[Tensor]| xs[0].gather(&xs[1], axis));
                check(ga, vec![x.clone(), idx])?;
            }
        }
        let oh: OpFn = Arc::new(|xs: &[Tensor]| xs[0].one_hot(4, DType::F32));
        check(oh, vec![tensor(&shape, DType::I64, seed).clamp(-1.0, 4.0)])?;
    }

    #[test]
    fn matmul(m in 0usize..5, k in 0usize..5, n in 0usize..5, batch in prop::option::of(1usize..3), seed in any::<u64>(), dtype in prop::sample::select(vec![DType::F32, DType::F64, DType::I32, DType::I64])) {
        let (sa, sb) = match batch {
            Some(b) => (vec![b, m, k], vec![k, n]),
            None => (vec![m, k], vec![k, n]),
        };
        let f: OpFn = Arc::new(|xs: &[Tensor]| xs[0].matmul(&xs[1]));
        let (a, b) = (tensor(&sa, dtype, seed), tensor(&sb, dtype, seed ^ 5));
        // A GEMM sums the k products in its own order (and may use FMA):
        // bound the difference by k·ε·max|a|·max|b|·k over finite entries.
        let tol = if dtype.is_float() {
            let finite_max = |t: &Tensor| {
                t.cast(DType::F64).to_vec::<f64>().unwrap().into_iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()))
            };
            let eps = if dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
            Tol::Sum(2.0 * (k * k) as f64 * eps * finite_max(&a) * finite_max(&b))
        } else {
            Tol::Exact
        };
        // Eager products run the executor's GEMM, the interpreter the
        // reference kernel: the same bound for both.
        check_tols(f, vec![a, b], tol, tol)?;
    }
}
