//! Scans along one axis: `cumsum` (inclusive prefix sums, accumulated in
//! the element type in index order; integers wrap) and `top_k` (the `k`
//! largest entries of each row of the last axis, largest first).
//!
//! `top_k` orders NaN above every number (as `torch.topk` and
//! `jax.lax.top_k` do), and equal values by index, the lower first, so its
//! result is a function of the row alone.

use std::cmp::Ordering;

use ndarray::{ArrayD, Axis, IxDyn};

use crate::{Element, Storage, StorageElement};

pub(crate) fn cumsum(x: &Storage, axis: usize) -> Storage {
    if axis >= x.rank() {
        panic!("cumsum: axis {axis} is out of range for shape {:?}", x.shape());
    }
    match x {
        Storage::F32(a) => Storage::F32(scan(a, axis, |acc, v| acc + v)),
        Storage::F64(a) => Storage::F64(scan(a, axis, |acc, v| acc + v)),
        Storage::I32(a) => Storage::I32(scan(a, axis, i32::wrapping_add)),
        Storage::I64(a) => Storage::I64(scan(a, axis, i64::wrapping_add)),
        Storage::I8(a) => Storage::I8(scan(a, axis, i8::wrapping_add)),
        Storage::U8(a) => Storage::U8(scan(a, axis, u8::wrapping_add)),
        Storage::I16(a) => Storage::I16(scan(a, axis, i16::wrapping_add)),
        Storage::U16(a) => Storage::U16(scan(a, axis, u16::wrapping_add)),
        Storage::U32(a) => Storage::U32(scan(a, axis, u32::wrapping_add)),
        Storage::U64(a) => Storage::U64(scan(a, axis, u64::wrapping_add)),
        Storage::Bool(_) => panic!("cumsum: expected a numeric tensor, got bool (cast it first)"),
        Storage::BF16(_) | Storage::F16(_) => super::in_f32_1(x, |w| cumsum(w, axis)),
    }
}

/// Inclusive scan of `a` along `axis` with `add`.
fn scan<T: Copy>(a: &ndarray::ArcArray<T, IxDyn>, axis: usize, add: impl Fn(T, T) -> T) -> ndarray::ArcArray<T, IxDyn> {
    let mut out = a.to_owned();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let mut acc: Option<T> = None;
        for v in lane.iter_mut() {
            let next = match acc {
                Some(s) => add(s, *v),
                None => *v,
            };
            *v = next;
            acc = Some(next);
        }
    }
    out.into_shared()
}

/// NaN above every number, then the usual order.
fn descending<T: Element>(a: T, b: T) -> Ordering {
    let (x, y) = (a.to_f64(), b.to_f64());
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
    }
}

pub(crate) fn top_k(x: &Storage, k: usize) -> (Storage, Storage) {
    let shape = x.shape();
    let Some(&n) = shape.last() else { panic!("top_k: expected a tensor of rank >= 1, got a scalar") };
    if k > n {
        panic!("top_k: k = {k} is larger than the last axis of shape {shape:?}");
    }
    let mut out_shape = shape.to_vec();
    *out_shape.last_mut().expect("rank >= 1") = k;
    match x {
        Storage::F32(_) => top_k_t::<f32>(x, n, k, &out_shape),
        Storage::F64(_) => top_k_t::<f64>(x, n, k, &out_shape),
        Storage::I32(_) => top_k_t::<i32>(x, n, k, &out_shape),
        Storage::I64(_) => top_k_t::<i64>(x, n, k, &out_shape),
        Storage::I8(_) => top_k_t::<i8>(x, n, k, &out_shape),
        Storage::U8(_) => top_k_t::<u8>(x, n, k, &out_shape),
        Storage::I16(_) => top_k_t::<i16>(x, n, k, &out_shape),
        Storage::U16(_) => top_k_t::<u16>(x, n, k, &out_shape),
        Storage::U32(_) => top_k_t::<u32>(x, n, k, &out_shape),
        Storage::U64(_) => top_k_t::<u64>(x, n, k, &out_shape),
        Storage::Bool(_) => panic!("top_k: expected a numeric tensor, got bool (cast it first)"),
        // Widening is exact and monotone, so the order (and ties) are the 16-bit values'.
        Storage::BF16(_) | Storage::F16(_) => {
            let mut r = super::in_f32(&[x], |w| {
                let (v, i) = top_k(w[0], k);
                vec![v, i]
            });
            let i = r.remove(1);
            (r.remove(0), i)
        }
    }
}

fn top_k_t<T: StorageElement>(x: &Storage, n: usize, k: usize, out_shape: &[usize]) -> (Storage, Storage) {
    let data: Vec<T> = x.to_vec::<T>().expect("dtype matched");
    let rows = data.len().checked_div(n).unwrap_or(0);
    let mut values = Vec::with_capacity(rows * k);
    let mut indices = Vec::with_capacity(rows * k);
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for row in data.chunks_exact(n.max(1)).take(rows) {
        order.clear();
        order.extend(0..n);
        // Stable: equal values keep index order.
        order.sort_by(|&i, &j| descending(row[i], row[j]));
        for &i in &order[..k] {
            values.push(row[i]);
            indices.push(i as i64);
        }
    }
    let values = ArrayD::from_shape_vec(IxDyn(out_shape), values).expect("rows * k values");
    let indices = ArrayD::from_shape_vec(IxDyn(out_shape), indices).expect("rows * k indices");
    (Storage::from_array(values), Storage::from_array(indices))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;

    #[test]
    fn cumsum_along_each_axis() {
        let x = t(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]);
        assert_eq!(v::<i32>(&cumsum(&x, 1)), vec![1, 3, 6, 4, 9, 15]);
        assert_eq!(v::<i32>(&cumsum(&x, 0)), vec![1, 2, 3, 5, 7, 9]);
        let f = t(vec![1.0f32, f32::NAN, 1.0], &[3]);
        let r = v::<f32>(&cumsum(&f, 0));
        assert!(r[0] == 1.0 && r[1].is_nan() && r[2].is_nan());
        assert_eq!(cumsum(&t(Vec::<f64>::new(), &[0, 2]), 0).shape(), &[0, 2]);
    }

    #[test]
    fn top_k_orders_nan_first_and_ties_by_index() {
        let x = t(vec![1.0f64, 3.0, 3.0, f64::NAN, -1.0, 2.0, 2.0, 0.0], &[2, 4]);
        let (vals, idx) = top_k(&x, 2);
        let vals = v::<f64>(&vals);
        assert!(vals[0].is_nan() && vals[1] == 3.0 && vals[2] == 2.0 && vals[3] == 2.0);
        assert_eq!(v::<i64>(&idx), vec![3, 1, 1, 2]);
        let (vals, idx) = top_k(&t(vec![5i32, 7], &[2]), 0);
        assert_eq!((vals.shape(), idx.shape()), (&[0usize][..], &[0usize][..]));
    }
}
