//! Unary elementwise kernels: one generic body for the float dtypes, one for
//! the integer dtypes and the bool case, each mapping an element function over
//! the array. The element math lives in [`super::num`].

use ndarray::{ArcArray, IxDyn};

use super::num::{Float, Int};
use super::par;
use crate::{Storage, UnaryOp};

pub(crate) fn unary(op: UnaryOp, x: &Storage) -> Storage {
    if op.result_dtype(x.dtype()).is_none() {
        panic!("{}: dtype {} is not accepted", op.name(), x.dtype());
    }
    match x {
        Storage::F32(a) => unary_float(op, a),
        Storage::F64(a) => unary_float(op, a),
        Storage::I32(a) => unary_int(op, a),
        Storage::I64(a) => unary_int(op, a),
        Storage::U64(a) => unary_int(op, a),
        Storage::I8(_) | Storage::U8(_) | Storage::I16(_) | Storage::U16(_) | Storage::U32(_) => {
            super::in_compute_1(x, |w| unary(op, w))
        }
        Storage::Bool(a) => {
            assert!(op == UnaryOp::LogicalNot, "result_dtype accepts only logical_not on bool, not {}", op.name());
            Storage::from_array(a.mapv(|b| !b))
        }
        Storage::BF16(_) | Storage::F16(_) => super::in_f32_1(x, |w| unary(op, w)),
    }
}

/// The element function of every float-to-float unary op, written once:
/// `$then!` receives the list `Variant => function` (each function a path
/// generic over the float type `T` in scope where it expands). The array
/// kernel below maps each over an array, `scalar.rs` applies it to one
/// element, so the two cannot drift apart. A new float unary op is one
/// line here (plus its `UnaryOp` variant and dtype rule).
macro_rules! float_unary_functions {
    ($then:ident! $args:tt) => {
        $then! { $args
            Neg => Float::neg,
            Abs => Float::abs,
            Sign => Float::sign,
            Exp => T::exp,
            Expm1 => T::expm1,
            Log => T::ln,
            Log1p => T::ln1p,
            Sqrt => T::sqrt,
            Rsqrt => T::rsqrt,
            Square => Float::square,
            Reciprocal => T::recip,
            Tanh => T::tanh,
            Sigmoid => T::sigmoid,
            Relu => Float::relu,
            Erf => T::erf,
            Sin => T::sin,
            Cos => T::cos,
            Sinh => T::sinh,
            Cosh => T::cosh,
            Atan => T::atan,
            Softplus => T::softplus,
            Floor => T::floor,
            Ceil => T::ceil,
            Round => T::round_even,
        }
    };
}
pub(super) use float_unary_functions;

/// `op` mapped over `$a` (the arms of [`float_unary_functions`]).
macro_rules! map_float_unary {
    (($op:expr, $a:expr) $($v:ident => $f:path,)*) => {
        match $op {
            IsNan => return Storage::from_array($a.mapv(T::is_nan_value)),
            IsFinite => return Storage::from_array($a.mapv(T::is_finite_value)),
            $($v => $a.mapv($f),)*
            LogicalNot => unreachable!("result_dtype rejects logical_not on floats"),
        }
    };
}

/// `op` mapped over the contiguous `$x` into a vector (in parts on the pool
/// when large, see [`super::par`]), the arms of [`float_unary_functions`].
macro_rules! map_float_unary_flat {
    (($op:expr, $x:expr, $shape:expr) $($v:ident => $f:path,)*) => {
        match $op {
            IsNan => Storage::from_vec(par::map_flat($x, T::is_nan_value), $shape),
            IsFinite => Storage::from_vec(par::map_flat($x, T::is_finite_value), $shape),
            $($v => Storage::from_vec(par::map_flat($x, $f), $shape),)*
            LogicalNot => unreachable!("result_dtype rejects logical_not on floats"),
        }
    };
}

fn unary_float<T: Float>(op: UnaryOp, a: &ArcArray<T, IxDyn>) -> Storage {
    use UnaryOp::*;
    // Each arm maps with its own function item, so the element function is
    // inlined and the loop vectorizes (a `fn` pointer would block both).
    if let Some(x) = a.as_slice() {
        return float_unary_functions!(map_float_unary_flat!(op, x, a.shape())).expect("one result per element");
    }
    let out = float_unary_functions!(map_float_unary!(op, a));
    Storage::from_array(out)
}

fn unary_int<T: Int>(op: UnaryOp, a: &ArcArray<T, IxDyn>) -> Storage {
    use UnaryOp::*;
    let out = match op {
        IsNan => return Storage::from_array(a.mapv(|_| false)),
        IsFinite => return Storage::from_array(a.mapv(|_| true)),
        Floor | Ceil | Round => return T::wrap(a.clone()),
        Neg => a.mapv(Int::neg),
        Abs => a.mapv(Int::abs),
        Sign => a.mapv(Int::sign),
        Square => a.mapv(Int::square),
        Relu => a.mapv(Int::relu),
        Exp | Expm1 | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Tanh | Sigmoid | Erf | Sin | Cos | Sinh | Cosh
        | Atan | Softplus | LogicalNot => unreachable!("result_dtype rejects {} on integers", op.name()),
    };
    // Each arm maps with its own function item, so the element function is
    // inlined and the loop vectorizes (a `fn` pointer would block both).
    Storage::from_array(out)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;
    use crate::DType;

    const NAN: f64 = f64::NAN;
    const INF: f64 = f64::INFINITY;

    fn run64(op: UnaryOp, xs: &[f64]) -> Vec<f64> {
        v::<f64>(&unary(op, &t(xs.to_vec(), &[xs.len()])))
    }

    fn same(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x.is_nan() && y.is_nan()) || x == y)
    }

    #[test]
    fn float_ops_hand_values() {
        use UnaryOp::*;
        let xs = [-2.0, -0.0, 0.0, 0.5, 4.0];
        assert!(same(&run64(Neg, &xs), &[2.0, 0.0, -0.0, -0.5, -4.0]));
        assert!(same(&run64(Abs, &xs), &[2.0, 0.0, 0.0, 0.5, 4.0]));
        assert!(same(&run64(Sign, &xs), &[-1.0, 0.0, 0.0, 1.0, 1.0]));
        assert!(same(&run64(Square, &xs), &[4.0, 0.0, 0.0, 0.25, 16.0]));
        assert!(same(&run64(Relu, &xs), &[0.0, 0.0, 0.0, 0.5, 4.0]));
        assert!(same(&run64(Sqrt, &[4.0, 0.25, -1.0]), &[2.0, 0.5, NAN]));
        assert!(same(&run64(Rsqrt, &[4.0, 0.0]), &[0.5, INF]));
        assert!(same(&run64(Reciprocal, &[4.0, -0.0]), &[0.25, -INF]));
        assert!(same(&run64(Exp, &[0.0, -INF]), &[1.0, 0.0]));
        assert!(same(&run64(Expm1, &[0.0]), &[0.0]));
        assert!(same(&run64(Log, &[1.0, 0.0, -1.0]), &[0.0, -INF, NAN]));
        assert!(same(&run64(Log1p, &[0.0, -1.0]), &[0.0, -INF]));
        assert!(same(&run64(Tanh, &[0.0, INF, -INF]), &[0.0, 1.0, -1.0]));
        assert!(same(&run64(Sin, &[0.0]), &[0.0]));
        assert!(same(&run64(Cos, &[0.0]), &[1.0]));
        assert!(same(&run64(Sinh, &[0.0, -0.0, INF, -INF, NAN]), &[0.0, -0.0, INF, -INF, NAN]));
        assert!(same(&run64(Cosh, &[0.0, INF, -INF, NAN]), &[1.0, INF, INF, NAN]));
        let half_pi = std::f64::consts::FRAC_PI_2;
        assert!(same(&run64(Atan, &[0.0, -0.0, INF, -INF, NAN]), &[0.0, -0.0, half_pi, -half_pi, NAN]));
        assert!(same(&run64(Softplus, &[-INF, INF, NAN, 1000.0, -1000.0]), &[0.0, INF, NAN, 1000.0, 0.0]));
        let sp = run64(Softplus, &[0.0, 2.0, -2.0]);
        assert!((sp[0] - 2f64.ln()).abs() < 1e-16);
        assert!((sp[1] - (1.0 + 2f64.exp()).ln()).abs() < 1e-14);
        assert!((sp[2] - (1.0 + (-2f64).exp()).ln()).abs() < 1e-15);
        assert!(same(&run64(Erf, &[0.0, INF, -INF]), &[0.0, 1.0, -1.0]));
        let e1 = run64(Erf, &[1.0])[0];
        assert!((e1 - 0.842_700_792_949_714_9).abs() < 1e-15);
        assert!(same(&run64(Floor, &[-1.5, 1.5]), &[-2.0, 1.0]));
        assert!(same(&run64(Ceil, &[-1.5, 1.5]), &[-1.0, 2.0]));
        assert!(same(&run64(Round, &[0.5, 1.5, 2.5, -0.5, -1.5, 2.6]), &[0.0, 2.0, 2.0, -0.0, -2.0, 3.0]));
    }

    #[test]
    fn sigmoid_is_stable() {
        let s = run64(UnaryOp::Sigmoid, &[0.0, -1000.0, 1000.0, INF, -INF, NAN]);
        assert!(same(&s, &[0.5, 0.0, 1.0, 1.0, 0.0, NAN]));
        let s = run64(UnaryOp::Sigmoid, &[2.0, -2.0]);
        assert!((s[0] - 1.0 / (1.0 + (-2.0f64).exp())).abs() < 1e-16);
        assert!((s[0] + s[1] - 1.0).abs() < 1e-15);
        // f32 too.
        let s32 = v::<f32>(&unary(UnaryOp::Sigmoid, &t(vec![-100.0f32, 100.0], &[2])));
        assert!(s32[0] > 0.0 && s32[0] < 1e-40 && s32[1] == 1.0);
    }

    #[test]
    fn nan_and_inf_behaviour() {
        use UnaryOp::*;
        assert!(run64(Sign, &[NAN])[0].is_nan());
        assert!(run64(Relu, &[NAN])[0].is_nan());
        assert!(run64(Abs, &[NAN])[0].is_nan());
        assert_eq!(run64(Relu, &[INF, -INF]), vec![INF, 0.0]);
        assert_eq!(run64(Sign, &[INF, -INF]), vec![1.0, -1.0]);
        let x = t(vec![NAN, INF, -INF, 1.0], &[4]);
        assert_eq!(v::<bool>(&unary(IsNan, &x)), vec![true, false, false, false]);
        assert_eq!(v::<bool>(&unary(IsFinite, &x)), vec![false, false, false, true]);
        let x32 = t(vec![f32::NAN, 2.0], &[2]);
        assert_eq!(v::<bool>(&unary(IsNan, &x32)), vec![true, false]);
    }

    #[test]
    fn relu_of_negative_zero_is_zero() {
        let r = run64(UnaryOp::Relu, &[-0.0]);
        assert_eq!(r[0], 0.0);
    }

    #[test]
    fn int_ops_wrap() {
        use UnaryOp::*;
        let x = t(vec![i32::MIN, -3, 0, 5, i32::MAX], &[5]);
        assert_eq!(v::<i32>(&unary(Neg, &x)), vec![i32::MIN, 3, 0, -5, -i32::MAX]);
        assert_eq!(v::<i32>(&unary(Abs, &x)), vec![i32::MIN, 3, 0, 5, i32::MAX]);
        assert_eq!(v::<i32>(&unary(Sign, &x)), vec![-1, -1, 0, 1, 1]);
        assert_eq!(v::<i32>(&unary(Square, &x)), vec![0, 9, 0, 25, 1]);
        assert_eq!(v::<i32>(&unary(Relu, &x)), vec![0, 0, 0, 5, i32::MAX]);
        for op in [Floor, Ceil, Round] {
            assert_eq!(v::<i32>(&unary(op, &x)), v::<i32>(&x));
        }
        assert_eq!(v::<bool>(&unary(IsNan, &x)), vec![false; 5]);
        assert_eq!(v::<bool>(&unary(IsFinite, &x)), vec![true; 5]);
        let y = t(vec![i64::MIN, 7], &[2]);
        assert_eq!(v::<i64>(&unary(Square, &y)), vec![0, 49]);
        assert_eq!(v::<i64>(&unary(Neg, &y)), vec![i64::MIN, -7]);
    }

    #[test]
    fn logical_not() {
        let b = t(vec![true, false], &[2]);
        assert_eq!(v::<bool>(&unary(UnaryOp::LogicalNot, &b)), vec![false, true]);
    }

    #[test]
    fn output_dtypes_follow_result_dtype() {
        for op in UnaryOp::ALL {
            for dt in DType::ALL {
                if let Some(out) = op.result_dtype(dt) {
                    let x = Storage::full(&[2, 3], dt, 1.0);
                    let r = unary(op, &x);
                    assert_eq!(r.dtype(), out, "{} on {}", op.name(), dt);
                    assert_eq!(r.shape(), &[2, 3]);
                }
            }
        }
    }

    #[test]
    fn empty_and_rank0() {
        for op in UnaryOp::ALL {
            for dt in DType::ALL {
                if op.result_dtype(dt).is_some() {
                    let e = Storage::full(&[3, 0], dt, 0.0);
                    assert_eq!(unary(op, &e).shape(), &[3, 0]);
                }
            }
        }
        let s = unary(UnaryOp::Exp, &Storage::scalar(0.0f32));
        check_f64(&s, &[], &[1.0]);
    }

    #[test]
    fn non_standard_input() {
        let x = t((0..6).map(|i| i as f64).collect(), &[2, 3]);
        let xt = crate::kernels::transpose(&x, &[1, 0]);
        let r = unary(UnaryOp::Neg, &xt);
        check_f64(&r, &[3, 2], &[-0.0, -3.0, -1.0, -4.0, -2.0, -5.0]);
    }

    #[test]
    #[should_panic(expected = "exp: dtype i32 is not accepted")]
    fn rejects_int_exp() {
        unary(UnaryOp::Exp, &t(vec![1i32], &[1]));
    }
}
