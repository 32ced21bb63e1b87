//! Helpers for the kernel unit tests: terse constructors and readers.

use crate::{Storage, StorageElement};

/// Builds a tensor from a flat row-major vector.
pub(crate) fn t<T: StorageElement>(data: Vec<T>, shape: &[usize]) -> Storage {
    Storage::from_vec(data, shape).expect("test data matches the shape")
}

/// Reads the elements back in row-major order.
pub(crate) fn v<T: StorageElement>(s: &Storage) -> Vec<T> {
    s.to_vec::<T>().expect("test reads the right dtype")
}

/// Asserts dtype, shape and row-major values, comparing floats bitwise except
/// that any NaN matches any NaN.
pub(crate) fn check_f64(s: &Storage, shape: &[usize], expected: &[f64]) {
    assert_eq!(s.shape(), shape, "shape");
    let got: Vec<f64> = s.to_standard().to_vec_f64();
    assert_eq!(got.len(), expected.len(), "length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g.is_nan() && e.is_nan()) || g == e, "element {i}: got {g}, expected {e} (all: {got:?})");
    }
}

trait ToVecF64 {
    fn to_vec_f64(&self) -> Vec<f64>;
}

impl ToVecF64 for Storage {
    fn to_vec_f64(&self) -> Vec<f64> {
        crate::with_array!(self, a => a.iter().map(|x| crate::Element::to_f64(*x)).collect())
    }
}
