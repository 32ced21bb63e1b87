//! Reduction kernels: `reduce` (sum, mean, max, min, prod over a set of axes)
//! and `arg_reduce` (argmax, argmin along one axis). `reduce` moves the kept
//! axes to the front, takes a row-major copy if the result is not already
//! contiguous, and folds each row of reduced elements sequentially, which is
//! the documented accumulation order of the reference. Adjacent reduced
//! axes of a contiguous input fold in place in the same order (`fold.rs`).

use ndarray::{ArcArray, ArrayView1, Axis, IxDyn, Zip};

use super::num::Num;
use crate::{ArgReduceOp, ReduceOp, Storage};

fn check_axes(name: &str, shape: &[usize], axes: &[usize]) {
    let in_range = axes.iter().all(|&a| a < shape.len());
    let sorted_unique = axes.windows(2).all(|w| w[0] < w[1]);
    if !in_range || !sorted_unique {
        panic!("{name}: axes {axes:?} must be sorted, unique and within the rank of shape {shape:?}");
    }
}

pub(crate) fn reduce(op: ReduceOp, x: &Storage, axes: &[usize], keepdims: bool) -> Storage {
    let name = op.name();
    if op.result_dtype(x.dtype()).is_none() {
        panic!("{name}: dtype {} is not accepted", x.dtype());
    }
    check_axes(name, x.shape(), axes);
    if matches!(op, ReduceOp::Max | ReduceOp::Min) {
        if let Some(&axis) = axes.iter().find(|&&a| x.shape()[a] == 0) {
            panic!("{name}: cannot reduce an empty axis (axis {axis} of shape {:?}) — there is no identity", x.shape());
        }
    }
    match x {
        Storage::F32(a) => reduce_t(op, a, axes, keepdims),
        Storage::F64(a) => reduce_t(op, a, axes, keepdims),
        Storage::I32(a) => reduce_t(op, a, axes, keepdims),
        Storage::I64(a) => reduce_t(op, a, axes, keepdims),
        Storage::I8(a) => reduce_t(op, a, axes, keepdims),
        Storage::U8(a) => reduce_t(op, a, axes, keepdims),
        Storage::I16(a) => reduce_t(op, a, axes, keepdims),
        Storage::U16(a) => reduce_t(op, a, axes, keepdims),
        Storage::U32(a) => reduce_t(op, a, axes, keepdims),
        Storage::U64(a) => reduce_t(op, a, axes, keepdims),
        Storage::Bool(_) => unreachable!("result_dtype rejects bool"),
        // Sums accumulate in f32 and round once, as XLA on CPU does.
        Storage::BF16(_) | Storage::F16(_) => super::in_f32_1(x, |w| reduce(op, w, axes, keepdims)),
    }
}

fn reduce_t<T: Num>(op: ReduceOp, a: &ArcArray<T, IxDyn>, axes: &[usize], keepdims: bool) -> Storage {
    if axes.is_empty() {
        return T::wrap(a.clone());
    }
    let shape = a.shape();
    let out_shape: Vec<usize> = if keepdims {
        (0..shape.len()).map(|d| if axes.contains(&d) { 1 } else { shape[d] }).collect()
    } else {
        (0..shape.len()).filter(|d| !axes.contains(d)).map(|d| shape[d]).collect()
    };
    let adjacent = a.as_slice().and_then(|flat| super::fold::reduce_adjacent(op, flat, shape, axes));
    let out = adjacent.unwrap_or_else(|| reduce_by_copy(op, a, axes));
    Storage::from_vec(out, &out_shape).expect("one value per output element")
}

/// The general path: the input copied with the reduced axes moved last,
/// each output folded from its row.
fn reduce_by_copy<T: Num>(op: ReduceOp, a: &ArcArray<T, IxDyn>, axes: &[usize]) -> Vec<T> {
    let shape = a.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let n_red: usize = axes.iter().map(|&d| shape[d]).product();
    let moved = a.view().permuted_axes(IxDyn(&perm));
    let contiguous = if moved.is_standard_layout() { None } else { Some(super::shape::row_major(moved.view())) };
    let flat = match &contiguous {
        Some(v) => v.as_slice(),
        None => moved.as_slice().expect("standard layout is contiguous"),
    };
    let n_out: usize = kept.iter().map(|&d| shape[d]).product();
    let fold: fn(&[T]) -> T = match op {
        ReduceOp::Sum => |r| r.iter().fold(T::ZERO, |acc, &x| acc.plus(x)),
        ReduceOp::Prod => |r| r.iter().fold(T::ONE, |acc, &x| acc.times(x)),
        ReduceOp::Max => |r| r[1..].iter().fold(r[0], |acc, &x| acc.nan_max(x)),
        ReduceOp::Min => |r| r[1..].iter().fold(r[0], |acc, &x| acc.nan_min(x)),
        ReduceOp::Mean => |r| {
            let sum = r.iter().fold(T::ZERO, |acc, &x| acc.plus(x));
            sum.divide(T::from_f64(r.len() as f64))
        },
    };
    (0..n_out).map(|i| fold(&flat[i * n_red..(i + 1) * n_red])).collect()
}

pub(crate) fn arg_reduce(op: ArgReduceOp, x: &Storage, axis: usize, keepdims: bool) -> Storage {
    let name = op.name();
    if axis >= x.rank() {
        panic!("{name}: axis {axis} is out of range for shape {:?}", x.shape());
    }
    if x.shape()[axis] == 0 {
        panic!("{name}: cannot reduce an empty axis (axis {axis} of shape {:?})", x.shape());
    }
    let out = crate::with_array!(x, a => {
        Zip::from(a.lanes(Axis(axis))).map_collect(|lane| best_index(op, lane))
    });
    let out = if keepdims { out.insert_axis(Axis(axis)) } else { out };
    Storage::from_array(out)
}

/// The index of the first extreme value, or of the first NaN if there is one.
fn best_index<T: PartialOrd + Copy>(op: ArgReduceOp, lane: ArrayView1<'_, T>) -> i64 {
    let mut best: Option<(usize, T)> = None;
    for (i, &x) in lane.iter().enumerate() {
        // Only NaN is unordered with itself.
        if x.partial_cmp(&x).is_none() {
            return i as i64;
        }
        let better = match best {
            None => true,
            Some((_, b)) => match op {
                ArgReduceOp::ArgMax => x > b,
                ArgReduceOp::ArgMin => x < b,
            },
        };
        if better {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;
    use crate::DType;
    use proptest::prelude::*;

    const NAN: f64 = f64::NAN;

    fn x23() -> Storage {
        t(vec![1.0f64, 5.0, 3.0, -4.0, 2.0, 6.0], &[2, 3])
    }

    #[test]
    fn hand_values() {
        let x = x23();
        check_f64(&reduce(ReduceOp::Sum, &x, &[0], false), &[3], &[-3.0, 7.0, 9.0]);
        check_f64(&reduce(ReduceOp::Sum, &x, &[1], true), &[2, 1], &[9.0, 4.0]);
        check_f64(&reduce(ReduceOp::Sum, &x, &[0, 1], false), &[], &[13.0]);
        check_f64(&reduce(ReduceOp::Sum, &x, &[0, 1], true), &[1, 1], &[13.0]);
        check_f64(&reduce(ReduceOp::Mean, &x, &[1], false), &[2], &[3.0, 4.0 / 3.0]);
        check_f64(&reduce(ReduceOp::Max, &x, &[1], false), &[2], &[5.0, 6.0]);
        check_f64(&reduce(ReduceOp::Min, &x, &[0], false), &[3], &[-4.0, 2.0, 3.0]);
        check_f64(&reduce(ReduceOp::Prod, &x, &[1], false), &[2], &[15.0, -48.0]);
        let i = t(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]);
        assert_eq!(v::<i32>(&reduce(ReduceOp::Sum, &i, &[1], false)), vec![6, 15]);
        assert_eq!(v::<i32>(&reduce(ReduceOp::Max, &i, &[0], false)), vec![4, 5, 6]);
        assert_eq!(v::<i32>(&reduce(ReduceOp::Prod, &i, &[0, 1], false)), vec![720]);
    }

    #[test]
    fn ints_wrap() {
        let i = t(vec![i32::MAX, 1], &[2]);
        assert_eq!(v::<i32>(&reduce(ReduceOp::Sum, &i, &[0], false)), vec![i32::MIN]);
        let i = t(vec![1i64 << 40, 1 << 40], &[2]);
        assert_eq!(v::<i64>(&reduce(ReduceOp::Prod, &i, &[0], false)), vec![0]);
    }

    #[test]
    fn empty_axes_is_identity() {
        let x = x23();
        for op in ReduceOp::ALL {
            assert!(reduce(op, &x, &[], false).bit_eq(&x));
            assert!(reduce(op, &x, &[], true).bit_eq(&x));
        }
        let s = Storage::scalar(2.5f32);
        assert!(reduce(ReduceOp::Sum, &s, &[], false).bit_eq(&s));
    }

    #[test]
    fn empty_inputs() {
        let e = Storage::full(&[2, 0], DType::F32, 0.0);
        check_f64(&reduce(ReduceOp::Sum, &e, &[1], false), &[2], &[0.0, 0.0]);
        check_f64(&reduce(ReduceOp::Prod, &e, &[1], true), &[2, 1], &[1.0, 1.0]);
        check_f64(&reduce(ReduceOp::Mean, &e, &[1], false), &[2], &[NAN, NAN]);
        check_f64(&reduce(ReduceOp::Sum, &e, &[0, 1], false), &[], &[0.0]);
        // Reducing a non-empty axis of an empty tensor.
        assert_eq!(reduce(ReduceOp::Max, &e, &[0], false).shape(), &[0]);
        assert_eq!(reduce(ReduceOp::Sum, &e, &[0], true).shape(), &[1, 0]);
        let ei = Storage::full(&[0], DType::I64, 0.0);
        assert_eq!(v::<i64>(&reduce(ReduceOp::Prod, &ei, &[0], false)), vec![1]);
    }

    #[test]
    #[should_panic(expected = "max: cannot reduce an empty axis (axis 1 of shape [2, 0]) — there is no identity")]
    fn max_of_empty_axis_panics() {
        reduce(ReduceOp::Max, &Storage::full(&[2, 0], DType::F32, 0.0), &[1], false);
    }

    #[test]
    #[should_panic(expected = "min: cannot reduce an empty axis (axis 0 of shape [0, 0])")]
    fn min_of_empty_axis_panics_even_for_empty_result() {
        reduce(ReduceOp::Min, &Storage::full(&[0, 0], DType::I32, 0.0), &[0], false);
    }

    #[test]
    #[should_panic(expected = "mean: dtype i32 is not accepted")]
    fn mean_of_ints_rejected() {
        reduce(ReduceOp::Mean, &t(vec![1i32], &[1]), &[0], false);
    }

    #[test]
    #[should_panic(expected = "must be sorted, unique")]
    fn unsorted_axes_rejected() {
        reduce(ReduceOp::Sum, &x23(), &[1, 0], false);
    }

    #[test]
    fn nan_propagates() {
        let x = t(vec![1.0, NAN, 3.0, 4.0], &[2, 2]);
        check_f64(&reduce(ReduceOp::Max, &x, &[1], false), &[2], &[NAN, 4.0]);
        check_f64(&reduce(ReduceOp::Min, &x, &[0], false), &[2], &[1.0, NAN]);
        check_f64(&reduce(ReduceOp::Sum, &x, &[0, 1], false), &[], &[NAN]);
        let inf = t(vec![f64::INFINITY, -f64::INFINITY], &[2]);
        check_f64(&reduce(ReduceOp::Sum, &inf, &[0], false), &[], &[NAN]);
        check_f64(&reduce(ReduceOp::Max, &inf, &[0], false), &[], &[f64::INFINITY]);
    }

    #[test]
    fn sequential_accumulation_order() {
        // 1e8 + 1 + ... in f32: sequential order loses every 1.
        let mut data = vec![1.0e8f32];
        data.extend(std::iter::repeat_n(1.0f32, 8));
        let r = reduce(ReduceOp::Sum, &t(data, &[9]), &[0], false);
        assert_eq!(v::<f32>(&r), vec![1.0e8]);
    }

    #[test]
    fn non_standard_input() {
        let x = crate::kernels::transpose(&x23(), &[1, 0]); // [[1,-4],[5,2],[3,6]]
        check_f64(&reduce(ReduceOp::Sum, &x, &[1], false), &[3], &[-3.0, 7.0, 9.0]);
        check_f64(&reduce(ReduceOp::Max, &x, &[0], false), &[2], &[5.0, 6.0]);
    }

    #[test]
    fn argmax_argmin() {
        let x = t(vec![1.0, 5.0, 5.0, -4.0, 2.0, -4.0], &[2, 3]);
        let r = arg_reduce(ArgReduceOp::ArgMax, &x, 1, false);
        assert_eq!((r.dtype(), v::<i64>(&r)), (DType::I64, vec![1, 1]));
        let r = arg_reduce(ArgReduceOp::ArgMin, &x, 1, true);
        assert_eq!(r.shape(), &[2, 1]);
        assert_eq!(v::<i64>(&r), vec![0, 0]);
        let r = arg_reduce(ArgReduceOp::ArgMax, &x, 0, false);
        assert_eq!(v::<i64>(&r), vec![0, 0, 0]);
        let r = arg_reduce(ArgReduceOp::ArgMin, &x, 0, true);
        assert_eq!((r.shape(), v::<i64>(&r)), (&[1usize, 3][..], vec![1, 1, 1]));
        let r = arg_reduce(ArgReduceOp::ArgMax, &t(vec![3i32, 9, 9], &[3]), 0, false);
        assert_eq!((r.shape(), v::<i64>(&r)), (&[] as &[usize], vec![1]));
        let r = arg_reduce(ArgReduceOp::ArgMax, &t(vec![false, true, true], &[3]), 0, false);
        assert_eq!(v::<i64>(&r), vec![1]);
        let e = Storage::full(&[0, 3], DType::F32, 0.0);
        assert_eq!(arg_reduce(ArgReduceOp::ArgMax, &e, 1, false).shape(), &[0]);
    }

    #[test]
    fn argmax_with_nan_returns_first_nan() {
        let x = t(vec![1.0, NAN, 7.0, NAN, f64::INFINITY, 0.0], &[6]);
        assert_eq!(v::<i64>(&arg_reduce(ArgReduceOp::ArgMax, &x, 0, false)), vec![1]);
        assert_eq!(v::<i64>(&arg_reduce(ArgReduceOp::ArgMin, &x, 0, false)), vec![1]);
    }

    #[test]
    #[should_panic(expected = "argmax: cannot reduce an empty axis (axis 1 of shape [2, 0])")]
    fn argmax_empty_axis_panics() {
        arg_reduce(ArgReduceOp::ArgMax, &Storage::full(&[2, 0], DType::F32, 0.0), 1, false);
    }

    // ---- property: reductions against naive loops ----

    /// Naive reduction by walking every input element and accumulating into
    /// its output slot (row-major order, so the float order is the same).
    fn naive(op: ReduceOp, data: &[i64], shape: &[usize], axes: &[usize]) -> (Vec<usize>, Vec<i64>) {
        let out_shape: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).map(|d| shape[d]).collect();
        let n_out: usize = out_shape.iter().product();
        let mut acc: Vec<Option<i64>> = vec![None; n_out];
        for (lin, &x) in data.iter().enumerate() {
            let mut rem = lin;
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = rem % shape[d];
                rem /= shape[d];
            }
            let o = (0..shape.len()).filter(|d| !axes.contains(d)).fold(0, |a, d| a * shape[d] + idx[d]);
            acc[o] = Some(match (acc[o], op) {
                (None, _) => x,
                (Some(a), ReduceOp::Sum) => a.wrapping_add(x),
                (Some(a), ReduceOp::Prod) => a.wrapping_mul(x),
                (Some(a), ReduceOp::Max) => a.max(x),
                (Some(a), ReduceOp::Min) => a.min(x),
                (Some(_), ReduceOp::Mean) => unreachable!(),
            });
        }
        let empty = match op {
            ReduceOp::Prod => 1,
            _ => 0,
        };
        (out_shape, acc.into_iter().map(|a| a.unwrap_or(empty)).collect())
    }

    fn case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, u64)> {
        prop::collection::vec(0usize..5, 0..5).prop_flat_map(|shape| {
            let rank = shape.len();
            (Just(shape), prop::collection::vec(any::<bool>(), rank), any::<u64>()).prop_map(|(shape, pick, seed)| {
                let axes = (0..shape.len()).filter(|&d| pick[d]).collect();
                (shape, axes, seed)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn reductions_match_naive((shape, axes, seed) in case(), keepdims in any::<bool>()) {
            let n: usize = shape.iter().product();
            let data: Vec<i64> = (0..n as u64)
                .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 7) as i64 - 3)
                .collect();
            let x = t(data.clone(), &shape);
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let empty_axis = axes.iter().any(|&a| shape[a] == 0);
                if empty_axis && matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    continue;
                }
                let r = reduce(op, &x, &axes, keepdims);
                let (out_shape, expected) = naive(op, &data, &shape, &axes);
                let expected_shape: Vec<usize> = if keepdims {
                    (0..shape.len()).map(|d| if axes.contains(&d) { 1 } else { shape[d] }).collect()
                } else {
                    out_shape
                };
                prop_assert_eq!(r.shape(), &expected_shape[..]);
                prop_assert_eq!(v::<i64>(&r), expected.clone());
                if op == ReduceOp::Prod {
                    continue; // The int product wraps; f64 would not.
                }
                // The float path agrees on these small integers (exact in f64).
                let xf = crate::kernels::cast(&x, DType::F64);
                let rf = reduce(op, &xf, &axes, keepdims);
                prop_assert_eq!(v::<f64>(&rf), expected.iter().map(|&e| e as f64).collect::<Vec<_>>());
            }
        }
    }

    /// Floats for the in-place folds: rounding in every sum, and NaN, ±Inf
    /// and -0.0 sprinkled in, so that a changed order or max/min rule shows.
    fn floats(n: usize, seed: u64) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                match h % 61 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => -0.0,
                    _ => (h % 20011) as f32 * 1.37e-3 - 13.0,
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(160))]
        /// The in-place folds of adjacent axes give the general path's bits
        /// (same order per output), for rows in groups of eight and their
        /// remainder, columns of any width, and every op.
        #[test]
        fn in_place_folds_give_the_copying_paths_bits(
            shape in prop::collection::vec(prop_oneof![3 => 1usize..12, 1 => 16usize..40], 1..4),
            first in 0usize..4,
            len in 1usize..4,
            seed in any::<u64>(),
        ) {
            let rank = shape.len();
            let first = first % rank;
            let axes: Vec<usize> = (first..(first + len).min(rank)).collect();
            let n: usize = shape.iter().product();
            let x = t(floats(n, seed), &shape);
            let Storage::F32(a) = &x else { unreachable!() };
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let fast = v::<f32>(&reduce(op, &x, &axes, false));
                let general = reduce_by_copy(op, a, &axes);
                prop_assert_eq!(fast.len(), general.len());
                for (i, (f, g)) in fast.iter().zip(&general).enumerate() {
                    prop_assert!(f.to_bits() == g.to_bits() || (f.is_nan() && g.is_nan()),
                        "{:?} over {:?} of {:?}: output {} is {} in place, {} by copy", op, axes, shape, i, f, g);
                }
            }
        }
    }

    /// A row's max and min found in vector lanes keep the sequential fold's
    /// bits where the order shows: the first of tied -0.0 and +0.0, and
    /// the first NaN (payload and sign), in rows longer than the lanes.
    #[test]
    fn lane_extremes_keep_the_first_zero_and_nan() {
        let quiet = f32::from_bits(0x7fc0_0001);
        let other = f32::from_bits(0xffc0_0002);
        let row = |head: &[f32]| {
            let mut r = head.to_vec();
            r.resize(37, -5.0);
            r
        };
        let rows = [
            row(&[-1.0, -0.0, 0.0, -2.0]),
            row(&[-3.0, 0.0, -0.0]),
            row(&[2.0, other, 7.0, quiet]),
            row(&[1.0, 3.0, 3.0, -0.5]),
        ];
        let flat: Vec<f32> = rows.concat();
        let x = t(flat.clone(), &[4, 37]);
        let Storage::F32(a) = &x else { unreachable!() };
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let fast = v::<f32>(&reduce(op, &x, &[1], false));
            let general = reduce_by_copy(op, a, &[1]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&general), "{op:?}");
        }
        let max = v::<f32>(&reduce(ReduceOp::Max, &x, &[1], false));
        assert_eq!(max[0].to_bits(), (-0.0f32).to_bits());
        assert_eq!(max[1].to_bits(), 0.0f32.to_bits());
        assert_eq!(max[2].to_bits(), other.to_bits());
        assert_eq!(max[3], 3.0);
    }
}
