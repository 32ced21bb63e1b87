//! Every primitive op, exported and run in tract, against tracejit's own
//! results on random inputs (proptest): every dtype each op accepts, odd
//! sizes (0, 1, 3, 5), NaN and infinities for the float ops.

use crate::common;

use proptest::prelude::*;
use tracejit_tensor::{BinaryKind, BinaryOp, DType, ReduceOp, SliceSpec, UnaryOp};
use tracejit_trace::{function, Tensor, TensorSpec};

macro_rules! unary_dispatch {
    ($($(#[$doc:meta])* $op:ident $name:ident: $kind:ident, $cost:ident, $exact:ident;)*) => {
        fn apply_unary(op: UnaryOp, x: &Tensor) -> Tensor {
            match op {
                $(UnaryOp::$op => x.$name(),)*
            }
        }
    };
}
tracejit_tensor::for_each_unary_op!(unary_dispatch);

macro_rules! binary_dispatch {
    ($($(#[$doc:meta])* $op:ident $name:ident: $kind:ident, $cost:ident;)*) => {
        fn apply_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Tensor {
            match op {
                $(BinaryOp::$op => a.$name(b),)*
            }
        }
    };
}
tracejit_tensor::for_each_binary_op!(binary_dispatch);

macro_rules! reduce_dispatch {
    ($($(#[$doc:meta])* $op:ident $name:ident, $all:ident: $kind:ident;)*) => {
        fn apply_reduce(op: ReduceOp, x: &Tensor, axes: &[i64], keepdims: bool) -> Tensor {
            match op {
                $(ReduceOp::$op => x.$name(axes, keepdims),)*
            }
        }
    };
}
tracejit_tensor::for_each_reduce_op!(reduce_dispatch);

const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];

/// Shapes of rank 0 to 2 with dims among 0, 1, 3 and 5.
fn shapes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop::sample::select(vec![0usize, 1, 3, 5]), 0..=2)
}

/// Raw values: mostly in [-4, 4], sometimes NaN or an infinity.
fn raw_values() -> impl Strategy<Value = Vec<f64>> {
    let v = prop_oneof![
        12 => -4.0f64..4.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ];
    prop::collection::vec(v, 25)
}

/// A tensor of `dtype` and `shape` from `raw` (repeated as needed): floats
/// as they are (`specials`: keep NaN/inf, else replace them by 0.5),
/// integers rounded into [-4, 4], bools by sign.
fn tensor(dtype: DType, shape: &[usize], raw: &[f64], specials: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> =
        (0..n).map(|i| raw[i % raw.len()]).map(|v| if !specials && !v.is_finite() { 0.5 } else { v }).collect();
    let int = |v: f64| if v.is_finite() { v.round() } else { 3.0 };
    match dtype {
        DType::F32 => Tensor::from_vec(vals.iter().map(|&v| v as f32).collect(), shape),
        DType::F64 => Tensor::from_vec(vals, shape),
        DType::I32 => Tensor::from_vec(vals.iter().map(|&v| int(v) as i32).collect(), shape),
        DType::I64 => Tensor::from_vec(vals.iter().map(|&v| int(v) as i64).collect(), shape),
        DType::Bool => Tensor::from_vec(vals.iter().map(|&v| v > 0.0).collect(), shape),
        DType::BF16 | DType::F16 => Tensor::from_vec(vals, shape).cast(dtype),
        // The other integers like i64, then wrapped into the dtype.
        _ => Tensor::from_vec(vals.iter().map(|&v| int(v) as i64).collect(), shape).cast(dtype),
    }
}

fn spec(t: &Tensor) -> TensorSpec {
    TensorSpec::new(t.dtype(), &t.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
}

/// A one-argument closure of a case table.
type Unary = fn(Tensor) -> Tensor;

/// What tract 0.23 cannot run of a correct file.
enum Gap {
    /// It has no kernel for the op and dtype (the test runs the file in
    /// onnxruntime only, through the saved case).
    NoKernel,
    /// Its kernel turns NaN into a number (tract checks finite inputs only).
    Nan,
}

fn tract_gap(op: UnaryOp, dtype: DType) -> Option<Gap> {
    match (op, dtype) {
        // tract rewrites Mul(x, x) into its Square op, which has no i64 kernel.
        (UnaryOp::Square, DType::I64) => Some(Gap::NoKernel),
        (UnaryOp::Sigmoid | UnaryOp::Round, DType::F64) => Some(Gap::NoKernel),
        (UnaryOp::Tanh | UnaryOp::Sigmoid, DType::F32) => Some(Gap::Nan),
        (UnaryOp::Relu, DType::F32 | DType::F64) => Some(Gap::Nan),
        _ => None,
    }
}

/// Tolerance of float results against tracejit's (the JIT approximates
/// f32 transcendentals within a few ULP; runtimes have their own).
const TOL: f64 = 2e-5;

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn unary_ops(shape in shapes(), raw in raw_values()) {
        for op in UnaryOp::ALL {
            for dtype in DTYPES.into_iter().filter(|&d| op.result_dtype(d).is_some()) {
                let x = tensor(dtype, &shape, &raw, true);
                let cf = function(move |x: Tensor| apply_unary(op, &x)).name(op.name())
                    .get_concrete_function(spec(&x)).unwrap();
                let name = format!("unary_{}_{}", op.name(), dtype);
                match tract_gap(op, dtype) {
                    // onnxruntime runs the saved case (scripts/run_onnxruntime.py).
                    Some(Gap::NoKernel) => common::save_case(&name, &cf, &[x]),
                    Some(Gap::Nan) => {
                        common::save_case(&name, &cf, &[x]);
                        let finite = tensor(dtype, &shape, &raw, false);
                        common::check(&format!("{name}_finite"), &cf, &[finite], TOL);
                    }
                    None => common::check(&name, &cf, &[x], TOL),
                }
            }
        }
    }

    #[test]
    fn binary_ops(shape in shapes(), raw_a in raw_values(), raw_b in raw_values(), broadcast in any::<bool>()) {
        for op in BinaryOp::ALL {
            for dtype in DTYPES.into_iter().filter(|&d| op.result_dtype(d).is_some()) {
                let a = tensor(dtype, &shape, &raw_a, true);
                // The other operand: the same shape, or the last axis only (broadcast).
                let b_shape = if broadcast { shape.last().map(|&d| vec![d]).unwrap_or_default() } else { shape.clone() };
                let b = tensor(dtype, &b_shape, &raw_b, true);
                // Integer powers stay small and non-negative, so they do not overflow.
                let b = if op == BinaryOp::Pow && dtype.is_int() { b.abs().clamp(0.0, 3.0) } else { b };
                let cf = function(move |(a, b): (Tensor, Tensor)| apply_binary(op, &a, &b)).name(op.name())
                    .get_concrete_function((spec(&a), spec(&b))).unwrap();
                if op.kind() == BinaryKind::Bitwise && dtype.is_int() {
                    // Opset 17 has no integer bitwise ops: refused, named.
                    let e = tracejit_onnx::Exporter::new(&cf).to_model().unwrap_err().to_string();
                    prop_assert!(e.contains(op.name()) && e.contains("opset 18"), "{e}");
                    continue;
                }
                common::check(&format!("binary_{}_{}", op.name(), dtype), &cf, &[a, b], TOL);
            }
        }
    }

    #[test]
    fn select_cast_and_clamp(shape in shapes(), raw in raw_values(), lo in -3.0f64..0.0, hi in 0.0f64..3.0) {
        for dtype in DTYPES {
            let cond = tensor(DType::Bool, &shape, &raw, true);
            let a = tensor(dtype, &shape, &raw, true);
            let b = tensor(dtype, &shape, &raw.iter().rev().copied().collect::<Vec<_>>(), true);
            let cf = function(|(c, a, b): (Tensor, Tensor, Tensor)| Tensor::select(&c, &a, &b))
                .get_concrete_function((spec(&cond), spec(&a), spec(&b))).unwrap();
            common::check(&format!("select_{dtype}"), &cf, &[cond, a, b], 0.0);
            for to in DTYPES {
                // Casting NaN or an infinity to an integer is undefined in ONNX.
                let x = tensor(dtype, &shape, &raw, !to.is_int());
                let cf = function(move |x: Tensor| x.cast(to)).get_concrete_function(spec(&x)).unwrap();
                common::check(&format!("cast_{dtype}_to_{to}"), &cf, &[x], 0.0);
            }
            if dtype.is_numeric() {
                let x = tensor(dtype, &shape, &raw, true);
                let cf = function(move |x: Tensor| x.clamp(lo, hi)).get_concrete_function(spec(&x)).unwrap();
                common::check(&format!("clamp_{dtype}"), &cf, &[x], 0.0);
            }
        }
    }

    #[test]
    fn reductions(rows in prop::sample::select(vec![1usize, 3, 5]), cols in prop::sample::select(vec![1usize, 3, 5]),
                  raw in raw_values(), keepdims in any::<bool>()) {
        for op in ReduceOp::ALL {
            for dtype in DTYPES.into_iter().filter(|&d| op.result_dtype(d).is_some()) {
                // A product of 25 integers in [-4, 4] can overflow i32, and
                // tract (the oracle) panics on that in a debug build: halved,
                // |product| <= 2^25.
                let raw: Vec<f64> = if op == ReduceOp::Prod && dtype == DType::I32 {
                    raw.iter().map(|v| v / 2.0).collect()
                } else {
                    raw.clone()
                };
                for axes in [vec![], vec![0], vec![1], vec![-1], vec![0, 1]] {
                    // NaN propagation through reductions is runtime-specific.
                    let x = tensor(dtype, &[rows, cols], &raw, false);
                    let ax = axes.clone();
                    let cf = function(move |x: Tensor| apply_reduce(op, &x, &ax, keepdims))
                        .get_concrete_function(spec(&x)).unwrap();
                    common::check(&format!("reduce_{}_{dtype}_{axes:?}", op.name()), &cf, &[x], 1e-5);
                }
            }
        }
        for dtype in DTYPES.into_iter().filter(|d| d.is_numeric()) {
            let x = tensor(dtype, &[rows, cols], &raw, false);
            for axis in [0i64, 1, -1] {
                let cf = function(move |x: Tensor| Tensor::stack(&[x.argmax(axis, keepdims), x.argmin(axis, keepdims)], 0))
                    .get_concrete_function(spec(&x)).unwrap();
                common::check(&format!("argmax_argmin_{dtype}_{axis}"), &cf, std::slice::from_ref(&x), 0.0);
            }
        }
    }

    #[test]
    fn shape_ops(d0 in prop::sample::select(vec![0usize, 1, 3, 5]), d1 in prop::sample::select(vec![1usize, 3, 5]),
                 raw in raw_values(), start in -6i64..6, stop in -6i64..6, step in prop::sample::select(vec![-2i64, -1, 1, 2])) {
        for dtype in DTYPES {
            let x = tensor(dtype, &[d0, d1], &raw, true);
            let cases: Vec<(&str, Unary)> = vec![
                ("reshape", |x| x.reshape(&[-1])),
                ("reshape3", |x| { let n = x.shape()[1] as i64; x.reshape(&[1, -1, n]) }),
                ("transpose", |x| x.transpose(&[1, 0])),
                ("broadcast_to", |x| { let s = x.shape().to_vec(); x.broadcast_to(&[2, s[0], s[1]]) }),
                ("expand_dims", |x| x.expand_dims(1)),
                ("expand_dims_last", |x| x.expand_dims(-1)),
                ("squeeze", |x| x.expand_dims(0).squeeze(&[0])),
                ("concat", |x| Tensor::concat(&[x.clone(), x], 1)),
                ("concat0", |x| Tensor::concat(&[x.clone(), x.clone(), x], 0)),
                ("stack", |x| Tensor::stack(&[x.clone(), x], 1)),
            ];
            for (name, f) in cases {
                let cf = function(f).get_concrete_function(spec(&x)).unwrap();
                common::check(&format!("{name}_{dtype}_{d0}x{d1}"), &cf, std::slice::from_ref(&x), 0.0);
            }
            let specs = [SliceSpec { start: Some(start), stop: Some(stop), step },
                         SliceSpec { start: None, stop: None, step }];
            let cf = function(move |x: Tensor| x.slice(&specs)).get_concrete_function(spec(&x)).unwrap();
            common::check(&format!("slice_{dtype}_{start}:{stop}:{step}"), &cf, std::slice::from_ref(&x), 0.0);
            let half = SliceSpec { start: None, stop: Some(stop), step: 1 };
            let cf = function(move |x: Tensor| x.slice(&[SliceSpec::FULL, half])).get_concrete_function(spec(&x)).unwrap();
            common::check(&format!("slice_open_{dtype}_{stop}"), &cf, std::slice::from_ref(&x), 0.0);
        }
    }

    #[test]
    fn gather_and_one_hot(d1 in prop::sample::select(vec![1usize, 3, 5]), picks in prop::collection::vec(-7i64..7, 0..6),
                          raw in raw_values()) {
        for dtype in DTYPES {
            let params = tensor(dtype, &[3, d1], &raw, true);
            let valid: Vec<i64> = picks.iter().map(|&i| i.rem_euclid(2 * d1 as i64) - d1 as i64).collect();
            for idx_dtype in [DType::I32, DType::I64] {
                let idx = Tensor::from_vec(valid.clone(), &[valid.len()]).cast(idx_dtype);
                let cf = function(|(p, i): (Tensor, Tensor)| p.gather(&i, 1))
                    .get_concrete_function((spec(&params), spec(&idx))).unwrap();
                common::check(&format!("gather_{dtype}_{idx_dtype}"), &cf, &[params.clone(), idx], 0.0);
                // Out-of-range and negative indices give rows of zeros.
                let idx = Tensor::from_vec(picks.clone(), &[picks.len()]).cast(idx_dtype);
                let cf = function(move |i: Tensor| i.one_hot(4, dtype)).get_concrete_function(spec(&idx)).unwrap();
                common::check(&format!("one_hot_{idx_dtype}_to_{dtype}"), &cf, &[idx], 0.0);
            }
        }
    }

    #[test]
    fn matmul_with_batch_dims(m in prop::sample::select(vec![1usize, 3, 5]), k in prop::sample::select(vec![1usize, 3, 5]),
                              n in prop::sample::select(vec![1usize, 3]), raw in raw_values()) {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
            for (sa, sb) in [(vec![m, k], vec![k, n]), (vec![2, m, k], vec![k, n]), (vec![m, k], vec![3, k, n]),
                             (vec![2, 1, m, k], vec![3, k, n])] {
                let a = tensor(dtype, &sa, &raw, false);
                let b = tensor(dtype, &sb, &raw[3..], false);
                let cf = function(|(a, b): (Tensor, Tensor)| a.matmul(&b))
                    .get_concrete_function((spec(&a), spec(&b))).unwrap();
                let name = format!("matmul_{dtype}_{sa:?}_{sb:?}");
                if dtype == DType::I64 {
                    // tract 0.23 has no i64 matrix product (it panics);
                    // onnxruntime runs these through the saved cases.
                    let model = tracejit_onnx::Exporter::new(&cf).to_model().unwrap();
                    prop_assert!(model.graph.unwrap().node.iter().any(|n| n.op_type() == "MatMul"));
                    common::save_case(&name, &cf, &[a, b]);
                } else {
                    common::check(&name, &cf, &[a, b], 1e-5);
                }
            }
        }
    }
}

/// f64 `erf` has no ONNX kernel anywhere; its lowering (Cody's rational
/// approximations) keeps f64 precision, where a detour through f32 lost
/// about 1e-7 relative. 1023 points spanning every branch, zeros, tiny
/// values, both infinities and NaN.
#[test]
fn erf_f64_keeps_f64_precision() {
    let mut vals: Vec<f64> = (0..1000).map(|i| -7.0 + 14.0 * i as f64 / 999.0).collect();
    vals.extend([0.0, -0.0, 1e-300, -1e-12, 0.46875, -0.46875, 4.0, -4.0, 4.0000001, 26.0, -30.0, 1e200]);
    vals.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.5, 1.0, 2.0, 3.0, 5.0, 6.0, -0.3, 0.1]);
    assert_eq!(vals.len(), 1023);
    let x = Tensor::from_vec(vals, &[1023]);
    let cf = function(|x: Tensor| x.erf()).name("erf_f64").get_concrete_function(spec(&x)).unwrap();
    common::check("erf_f64_precise", &cf, &[x], 1e-15);
}
