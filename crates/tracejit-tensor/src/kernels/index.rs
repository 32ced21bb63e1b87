//! Integer-index kernels: `gather` (pick slices of a tensor by index),
//! `one_hot` (indices to indicator rows) and `arange` (the evenly spaced
//! range, most often used to build indices).

use ndarray::{ArcArray, ArrayD, Axis, IxDyn};

use super::shape::materialize;
use crate::{DType, Element, Storage, StorageElement};

/// The indices of an i32/i64 tensor as i64, in row-major order.
pub(crate) fn index_values(name: &str, indices: &Storage) -> Vec<i64> {
    match indices {
        Storage::I32(a) => a.iter().map(|&i| i64::from(i)).collect(),
        Storage::I64(a) => a.iter().copied().collect(),
        other => panic!("{name}: indices must be i32 or i64, not {}", other.dtype()),
    }
}

pub(crate) fn gather(params: &Storage, indices: &Storage, axis: usize) -> Storage {
    let shape = params.shape();
    if axis >= shape.len() {
        panic!("gather: axis {axis} is out of range for shape {shape:?}");
    }
    let len = shape[axis];
    let picks: Vec<usize> = index_values("gather", indices)
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + len as i64 } else { i };
            if j < 0 || j >= len as i64 {
                panic!("gather: index {i} is out of range for axis {axis} of size {len}");
            }
            j as usize
        })
        .collect();
    let out_shape: Vec<usize> =
        shape[..axis].iter().chain(indices.shape()).chain(&shape[axis + 1..]).copied().collect();
    crate::with_array!(params, a => gather_t(a, axis, &picks, &out_shape))
}

fn gather_t<T: StorageElement>(a: &ArcArray<T, IxDyn>, axis: usize, picks: &[usize], out_shape: &[usize]) -> Storage {
    let selected = a.select(Axis(axis), picks);
    let standard = if selected.is_standard_layout() { selected } else { materialize(selected.view()) };
    Storage::from_array(standard.into_shape_with_order(IxDyn(out_shape)).expect("element count matches"))
}

pub(crate) fn one_hot(indices: &Storage, depth: usize, dtype: DType) -> Storage {
    let idx = index_values("one_hot", indices);
    let mut shape = indices.shape().to_vec();
    shape.push(depth);
    with_dtype!(dtype, T => {
        let (on, off) = (T::from_f64(1.0), T::from_f64(0.0));
        let mut data = vec![off; idx.len() * depth];
        for (row, &i) in idx.iter().enumerate() {
            if i >= 0 && (i as u64) < depth as u64 {
                data[row * depth + i as usize] = on;
            }
        }
        Storage::from_array(ArrayD::from_shape_vec(IxDyn(&shape), data).expect("sized above"))
    })
}

pub(crate) fn arange(start: f64, stop: f64, step: f64, dtype: DType) -> Storage {
    if step == 0.0 {
        panic!("arange: step must not be 0");
    }
    if dtype == DType::Bool {
        panic!("arange: dtype bool is not accepted");
    }
    let count = ((stop - start) / step).ceil();
    if !count.is_finite() {
        panic!("arange: start {start}, stop {stop} and step {step} do not give a finite length");
    }
    let count = if count > 0.0 { count as usize } else { 0 };
    with_dtype!(dtype, T => {
        let data: Vec<T> = (0..count).map(|i| T::from_f64(start + i as f64 * step)).collect();
        Storage::from_array(ArrayD::from_shape_vec(IxDyn(&[count]), data).expect("sized above"))
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;

    fn iota(shape: &[usize]) -> Storage {
        let n: usize = shape.iter().product();
        t((0..n as i32).collect(), shape)
    }

    #[test]
    fn gather_axis0_and_axis1() {
        let p = iota(&[3, 2]); // [[0,1],[2,3],[4,5]]
        let r = gather(&p, &t(vec![2i64, 0, 2], &[3]), 0);
        assert_eq!(r.shape(), &[3, 2]);
        assert_eq!(v::<i32>(&r), vec![4, 5, 0, 1, 4, 5]);
        let r = gather(&p, &t(vec![1i32, 0, 0, 1], &[2, 2]), 1);
        assert_eq!(r.shape(), &[3, 2, 2]);
        assert_eq!(v::<i32>(&r), vec![1, 0, 0, 1, 3, 2, 2, 3, 5, 4, 4, 5]);
    }

    #[test]
    fn gather_negative_rank0_and_empty() {
        let p = t(vec![10.0f64, 20.0, 30.0, 40.0, 50.0], &[5]);
        let r = gather(&p, &t(vec![-1i32, -5, 0], &[3]), 0);
        check_f64(&r, &[3], &[50.0, 10.0, 10.0]);
        let r = gather(&p, &Storage::scalar(3i64), 0);
        check_f64(&r, &[], &[40.0]);
        let r = gather(&p, &t(Vec::<i64>::new(), &[0]), 0);
        assert_eq!(r.shape(), &[0]);
        let p2 = iota(&[2, 3, 4]);
        let r = gather(&p2, &Storage::scalar(1i32), 1);
        assert_eq!(r.shape(), &[2, 4]);
        assert_eq!(v::<i32>(&r), vec![4, 5, 6, 7, 16, 17, 18, 19]);
        let r = gather(&p2, &t(Vec::<i32>::new(), &[0, 2]), 2);
        assert_eq!(r.shape(), &[2, 3, 0, 2]);
        let e = Storage::full(&[0, 3], DType::F32, 0.0);
        let r = gather(&e, &t(vec![2i32, 0], &[2]), 1);
        assert_eq!(r.shape(), &[0, 2]);
    }

    #[test]
    fn gather_non_standard_params() {
        let p = crate::kernels::transpose(&iota(&[2, 3]), &[1, 0]); // [[0,3],[1,4],[2,5]]
        let r = gather(&p, &t(vec![2i64, 1], &[2]), 0);
        assert_eq!(v::<i32>(&r), vec![2, 5, 1, 4]);
    }

    #[test]
    #[should_panic(expected = "gather: index 7 is out of range for axis 0 of size 5")]
    fn gather_out_of_range() {
        gather(&iota(&[5]), &t(vec![1i64, 7], &[2]), 0);
    }

    #[test]
    #[should_panic(expected = "gather: index -6 is out of range for axis 0 of size 5")]
    fn gather_negative_out_of_range() {
        gather(&iota(&[5]), &t(vec![-6i32], &[1]), 0);
    }

    #[test]
    #[should_panic(expected = "gather: indices must be i32 or i64, not f32")]
    fn gather_float_indices() {
        gather(&iota(&[5]), &t(vec![1.0f32], &[1]), 0);
    }

    #[test]
    fn one_hot_values() {
        let r = one_hot(&t(vec![0i64, 2, -1, 3], &[4]), 3, DType::F32);
        assert_eq!(r.shape(), &[4, 3]);
        assert_eq!(v::<f32>(&r), vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let r = one_hot(&t(vec![1i32, 0], &[2, 1]), 2, DType::Bool);
        assert_eq!(r.shape(), &[2, 1, 2]);
        assert_eq!(v::<bool>(&r), vec![false, true, true, false]);
        let r = one_hot(&Storage::scalar(1i32), 2, DType::I64);
        assert_eq!((r.shape(), v::<i64>(&r)), (&[2usize][..], vec![0, 1]));
        let r = one_hot(&t(Vec::<i32>::new(), &[0]), 4, DType::F64);
        assert_eq!(r.shape(), &[0, 4]);
        let r = one_hot(&t(vec![0i32], &[1]), 0, DType::F64);
        assert_eq!(r.shape(), &[1, 0]);
    }

    #[test]
    fn arange_values() {
        check_f64(&arange(0.0, 5.0, 1.0, DType::I32), &[5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        check_f64(&arange(1.0, 2.0, 0.25, DType::F64), &[4], &[1.0, 1.25, 1.5, 1.75]);
        check_f64(&arange(5.0, 0.0, -2.0, DType::I64), &[3], &[5.0, 3.0, 1.0]);
        check_f64(&arange(0.0, 1.0, 0.3, DType::F32), &[4], &[0.0, 0.3f32 as f64, 0.6f32 as f64, 0.9f32 as f64]);
        assert_eq!(arange(0.0, 5.0, -1.0, DType::F32).shape(), &[0]);
        assert_eq!(arange(3.0, 3.0, 1.0, DType::F32).shape(), &[0]);
        // Values are computed in f64 and then converted (truncation for ints).
        check_f64(&arange(0.0, 2.0, 0.5, DType::I32), &[4], &[0.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    #[should_panic(expected = "arange: step must not be 0")]
    fn arange_zero_step() {
        arange(0.0, 1.0, 0.0, DType::F32);
    }

    #[test]
    #[should_panic(expected = "finite length")]
    fn arange_infinite() {
        arange(0.0, f64::INFINITY, 1.0, DType::F32);
    }
}
