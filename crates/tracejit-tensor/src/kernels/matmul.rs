//! The matrix product kernel: `[..., m, k] x [..., k, n]` with numpy
//! broadcasting of the batch dims. Each batch entry is a 2-D product written
//! into its slot of the output: ndarray's GEMM (matrixmultiply) for floats, a
//! plain triple loop with wrapping arithmetic for integers.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArcArray, ArrayD, ArrayView, ArrayView2, ArrayViewMut2, Axis, Dimension, Ix2, IxDyn, LinalgScalar};

use super::num::Num;
use super::shape::broadcast_shapes;
use crate::Storage;

pub(crate) fn matmul(a: &Storage, b: &Storage) -> Storage {
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => Storage::from_array(batched(x, y, gemm_float)),
        (Storage::F64(x), Storage::F64(y)) => Storage::from_array(batched(x, y, gemm_float)),
        (Storage::I32(x), Storage::I32(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::I64(x), Storage::I64(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::I8(x), Storage::I8(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::U8(x), Storage::U8(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::I16(x), Storage::I16(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::U16(x), Storage::U16(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::U32(x), Storage::U32(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::U64(x), Storage::U64(y)) => Storage::from_array(batched(x, y, gemm_int)),
        (Storage::Bool(_), Storage::Bool(_)) => panic!("matmul: dtype bool is not accepted"),
        _ => panic!("matmul: operands have different dtypes ({} and {})", a.dtype(), b.dtype()),
    }
}

/// Splits the shapes into (batch shape, m, k, n), or panics.
fn plan(a: &[usize], b: &[usize]) -> (Vec<usize>, usize, usize, usize) {
    if a.len() < 2 || b.len() < 2 {
        panic!("matmul: both operands need rank >= 2, got shapes {a:?} and {b:?}");
    }
    let (ab, am) = a.split_at(a.len() - 2);
    let (bb, bm) = b.split_at(b.len() - 2);
    let (m, k, k2, n) = (am[0], am[1], bm[0], bm[1]);
    if k != k2 {
        panic!("matmul: inner dimensions differ ({k} and {k2}) in shapes {a:?} and {b:?}");
    }
    let batch = broadcast_shapes(ab, bb)
        .unwrap_or_else(|| panic!("matmul: batch dimensions of shapes {a:?} and {b:?} cannot be broadcast together"));
    (batch, m, k, n)
}

/// Runs `kernel` (C = A B, C pre-zeroed) for every batch entry.
fn batched<T: Num>(
    a: &ArcArray<T, IxDyn>,
    b: &ArcArray<T, IxDyn>,
    kernel: fn(ArrayView2<'_, T>, ArrayView2<'_, T>, ArrayViewMut2<'_, T>),
) -> ArrayD<T> {
    let (batch, m, k, n) = plan(a.shape(), b.shape());
    let full = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    let av = a.broadcast(IxDyn(&full([m, k]))).expect("batch dims checked");
    let bv = b.broadcast(IxDyn(&full([k, n]))).expect("batch dims checked");
    let n_batch: usize = batch.iter().product();
    // Zeros from `calloc`, huge pages when large: the kernel's writes
    // fault a fresh mapping in once.
    let zeros = vec![T::ZERO; n_batch * m * n];
    tracejit_kernels::pages::advise(&zeros);
    let mut out = ndarray::Array3::from_shape_vec((n_batch, m, n), zeros).expect("the element count of the shape");
    for (i, idx) in ndarray::indices(IxDyn(&batch)).into_iter().enumerate() {
        kernel(pick(&av, idx.slice()), pick(&bv, idx.slice()), out.index_axis_mut(Axis(0), i));
    }
    out.into_shape_with_order(IxDyn(&full([m, n]))).expect("fresh standard array")
}

/// The matrix at batch index `idx` of a `[batch..., r, c]` view.
fn pick<'a, T>(v: &ArrayView<'a, T, IxDyn>, idx: &[usize]) -> ArrayView2<'a, T> {
    let mut v = v.clone();
    for &j in idx {
        v = v.index_axis_move(Axis(0), j);
    }
    v.into_dimensionality::<Ix2>().expect("two axes remain")
}

fn gemm_float<T: Num + LinalgScalar>(a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, mut c: ArrayViewMut2<'_, T>) {
    general_mat_mul(T::ONE, &a, &b, T::ZERO, &mut c);
}

fn gemm_int<T: Num>(a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, mut c: ArrayViewMut2<'_, T>) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::ZERO;
            for p in 0..k {
                acc = acc.plus(a[(i, p)].times(b[(p, j)]));
            }
            c[(i, j)] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;
    use crate::DType;

    /// Naive f64 reference for one 2-D product in row-major data.
    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn two_by_two() {
        let a = t(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
        let b = t(vec![5.0f32, 6.0, 7.0, 8.0], &[2, 2]);
        check_f64(&matmul(&a, &b), &[2, 2], &[19.0, 22.0, 43.0, 50.0]);
        let ai = t(vec![1i64, 2, 3, 4, 5, 6], &[2, 3]);
        let bi = t(vec![1i64, 0, 0, 1, 1, 1], &[3, 2]);
        assert_eq!(v::<i64>(&matmul(&ai, &bi)), vec![4, 5, 10, 11]);
    }

    #[test]
    fn int_wraps() {
        let a = t(vec![i32::MAX, 1], &[1, 2]);
        let b = t(vec![2i32, 2], &[2, 1]);
        assert_eq!(v::<i32>(&matmul(&a, &b)), vec![0]);
    }

    #[test]
    fn batch_broadcasting() {
        // a: [2, 1, 2, 3], b: [3, 3, 2] -> [2, 3, 2, 2]
        let ad: Vec<f64> = (0..12).map(|x| x as f64).collect();
        let bd: Vec<f64> = (0..18).map(|x| (x as f64) * 0.5 - 3.0).collect();
        let a = t(ad.clone(), &[2, 1, 2, 3]);
        let b = t(bd.clone(), &[3, 3, 2]);
        let r = matmul(&a, &b);
        assert_eq!(r.shape(), &[2, 3, 2, 2]);
        let mut expected = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                expected.extend(naive(&ad[i * 6..i * 6 + 6], &bd[j * 6..j * 6 + 6], 2, 3, 2));
            }
        }
        check_f64(&r, &[2, 3, 2, 2], &expected);
        // The same through the int path.
        let ai = crate::kernels::cast(&a, DType::I64);
        let bi = crate::kernels::cast(&b, DType::I64);
        let bif = crate::kernels::cast(&bi, DType::F64);
        let rf = matmul(&a, &bif);
        let ri = matmul(&ai, &bi);
        assert_eq!(v::<i64>(&ri), v::<f64>(&rf).iter().map(|&x| x as i64).collect::<Vec<_>>());
    }

    #[test]
    fn non_standard_operands() {
        let a = t((0..6).map(|x| x as f32).collect(), &[3, 2]);
        let at = crate::kernels::transpose(&a, &[1, 0]); // [2, 3]
        let r = matmul(&at, &a); // [2, 2] = A^T A
        check_f64(&r, &[2, 2], &[20.0, 26.0, 26.0, 35.0]);
        let rev = crate::kernels::slice(
            &a,
            &[crate::SliceSpec { start: None, stop: None, step: -1 }, crate::SliceSpec::FULL],
        );
        let r = matmul(&at, &rev);
        check_f64(&r, &[2, 2], &[4.0, 10.0, 10.0, 19.0]);
    }

    #[test]
    fn zero_sizes() {
        for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
            let a = Storage::full(&[2, 0], dt, 0.0);
            let b = Storage::full(&[0, 3], dt, 0.0);
            check_f64(&matmul(&a, &b), &[2, 3], &[0.0; 6]);
            let a = Storage::full(&[0, 4], dt, 1.0);
            let b = Storage::full(&[4, 3], dt, 1.0);
            assert_eq!(matmul(&a, &b).shape(), &[0, 3]);
            let a = Storage::full(&[0, 2, 4], dt, 1.0);
            let b = Storage::full(&[4, 3], dt, 1.0);
            assert_eq!(matmul(&a, &b).shape(), &[0, 2, 3]);
        }
    }

    #[test]
    #[should_panic(expected = "matmul: inner dimensions differ (3 and 2)")]
    fn inner_mismatch() {
        matmul(&Storage::full(&[2, 3], DType::F32, 0.0), &Storage::full(&[2, 2], DType::F32, 0.0));
    }

    #[test]
    #[should_panic(expected = "matmul: both operands need rank >= 2")]
    fn rank_one_rejected() {
        matmul(&Storage::full(&[3], DType::F32, 0.0), &Storage::full(&[3, 1], DType::F32, 0.0));
    }

    #[test]
    #[should_panic(expected = "matmul: dtype bool is not accepted")]
    fn bool_rejected() {
        matmul(&Storage::full(&[1, 1], DType::Bool, 0.0), &Storage::full(&[1, 1], DType::Bool, 0.0));
    }
}
