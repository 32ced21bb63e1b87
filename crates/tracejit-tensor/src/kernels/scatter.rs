//! Elementwise indexing along one axis: `scatter_add` (ONNX
//! ScatterElements with `reduction="add"`, `torch.scatter_add`) and its
//! adjoint `gather_elements` (ONNX GatherElements, `torch.gather`,
//! `np.take_along_axis`).
//!
//! Both walk the index tensor in row-major order; position `p` of the
//! indices names the element `p` with `p[axis]` replaced by the index
//! (negative indices count from the end; out of range panics, naming the
//! index). `scatter_add`'s indices broadcast against its updates (an
//! extension of ONNX's equal shapes: a `[n, 1]` column of ids adds whole
//! rows of `[n, d]` updates without repeating the ids), and the updates
//! are added in row-major order, so duplicates sum deterministically.

use ndarray::{ArrayD, IxDyn};

use super::index::index_values;
use super::shape::broadcast_shapes;
use crate::{Storage, StorageElement};

/// Row-major strides of `shape`, in elements.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The flat offset in `target` (of `target_strides`) of position `p`
/// (of `shape`, flat index `flat`) with `p[axis]` replaced by `idx`.
fn retarget(flat: usize, shape: &[usize], axis: usize, idx: usize, target_strides: &[usize]) -> usize {
    let mut rest = flat;
    let mut off = 0;
    for d in (0..shape.len()).rev() {
        let coord = rest % shape[d];
        rest /= shape[d];
        off += if d == axis { idx } else { coord } * target_strides[d];
    }
    off
}

/// An index along an axis of size `len`, negative counting from the end.
pub(super) fn resolve(name: &str, i: i64, len: usize, axis: usize) -> usize {
    let j = if i < 0 { i + len as i64 } else { i };
    if j < 0 || j >= len as i64 {
        panic!("{name}: index {i} is out of range for axis {axis} of size {len}");
    }
    j as usize
}

/// Checks that `inner` fits in `outer` on every axis but `axis` (and has
/// its rank).
fn check_fits(name: &str, what: &str, inner: &[usize], outer: &[usize], axis: usize) {
    if inner.len() != outer.len() || axis >= outer.len() {
        panic!("{name}: {what} of shape {inner:?} does not have the rank of {outer:?} (axis {axis})");
    }
    if let Some(d) = (0..outer.len()).find(|&d| d != axis && inner[d] > outer[d]) {
        panic!("{name}: {what} of shape {inner:?} is larger than {outer:?} on axis {d}");
    }
}

pub(crate) fn scatter_add(x: &Storage, indices: &Storage, updates: &Storage, axis: usize) -> Storage {
    let ushape = updates.shape().to_vec();
    check_fits("scatter_add", "updates", &ushape, x.shape(), axis);
    if broadcast_shapes(indices.shape(), &ushape).as_deref() != Some(&ushape[..]) {
        panic!("scatter_add: indices of shape {:?} do not broadcast to the updates' {ushape:?}", indices.shape());
    }
    if let Some(out) = scatter_rows(x, indices, updates, axis) {
        return out;
    }
    let idx = index_values("scatter_add", &super::shape::broadcast_to(indices, &ushape));
    let len = x.shape()[axis];
    let offsets: Vec<usize> = {
        let ts = strides(x.shape());
        idx.iter()
            .enumerate()
            .map(|(flat, &i)| retarget(flat, &ushape, axis, resolve("scatter_add", i, len, axis), &ts))
            .collect()
    };
    match (x, updates) {
        (Storage::F32(_), Storage::F32(_)) => add_at::<f32>(x, updates, &offsets, |a, b| a + b),
        (Storage::F64(_), Storage::F64(_)) => add_at::<f64>(x, updates, &offsets, |a, b| a + b),
        (Storage::I32(_), Storage::I32(_)) => add_at::<i32>(x, updates, &offsets, i32::wrapping_add),
        (Storage::I64(_), Storage::I64(_)) => add_at::<i64>(x, updates, &offsets, i64::wrapping_add),
        _ => panic!(
            "scatter_add: expected numeric x and updates of one dtype, got {} and {}",
            x.dtype(),
            updates.dtype()
        ),
    }
}

/// `scatter_add` where each index moves a whole block: the indices are 1
/// on every axis but `axis` (where they match the updates), and `x` and
/// the updates agree off `axis` — an embedding's or a gather's gradient.
/// Block `j` of the updates is added to block `indices[j]` of `x`, in the
/// updates' row-major order, so the sums are the general path's bits.
/// `None` where the shapes are not of that kind or the dtype is not float.
fn scatter_rows(x: &Storage, indices: &Storage, updates: &Storage, axis: usize) -> Option<Storage> {
    let us = updates.shape();
    // Empty updates check no index, as the general path.
    if !is_block_scatter(x.shape(), indices.shape(), us, axis) || us.contains(&0) {
        return None;
    }
    match (x, updates) {
        (Storage::F32(_), Storage::F32(_)) => Some(add_blocks::<f32>(x, indices, updates, axis)),
        (Storage::F64(_), Storage::F64(_)) => Some(add_blocks::<f64>(x, indices, updates, axis)),
        _ => None,
    }
}

/// True when a scatter of `us`-shaped updates at `is`-shaped indices into
/// `xs` moves whole blocks: the indices are 1 on every axis but `axis`
/// (where they match the updates), and `x` and the updates agree off it.
pub(super) fn is_block_scatter(xs: &[usize], is: &[usize], us: &[usize], axis: usize) -> bool {
    let Some(&m) = us.get(axis) else { return false };
    is.len() == us.len()
        && xs.len() == us.len()
        && is.iter().enumerate().all(|(k, &d)| if k == axis { d == m } else { d == 1 })
        && xs.iter().zip(us).enumerate().all(|(k, (a, b))| k == axis || a == b)
}

fn add_blocks<T: StorageElement + std::ops::Add<Output = T>>(
    x: &Storage,
    indices: &Storage,
    updates: &Storage,
    axis: usize,
) -> Storage {
    let (xs, us) = (x.shape(), updates.shape());
    let (m, len) = (us[axis], xs[axis]);
    let outer: usize = us[..axis].iter().product();
    let inner: usize = us[axis + 1..].iter().product();
    let idx: Vec<usize> =
        index_values("scatter_add", indices).iter().map(|&i| resolve("scatter_add", i, len, axis)).collect();
    let mut out: Vec<T> = x.to_vec::<T>().expect("dtype checked");
    let upd: Vec<T> = updates.to_vec::<T>().expect("dtype checked");
    if inner > 0 {
        for o in 0..outer {
            for (j, &i) in idx.iter().enumerate() {
                let src = &upd[(o * m + j) * inner..][..inner];
                let dst = &mut out[(o * len + i) * inner..][..inner];
                for (d, &u) in dst.iter_mut().zip(src) {
                    *d = *d + u;
                }
            }
        }
    }
    Storage::from_array(ArrayD::from_shape_vec(IxDyn(xs), out).expect("x's element count"))
}

/// A copy of `x` with `updates[k]` added at flat offset `offsets[k]`, in
/// order.
fn add_at<T: StorageElement>(x: &Storage, updates: &Storage, offsets: &[usize], add: impl Fn(T, T) -> T) -> Storage {
    let mut out: Vec<T> = x.to_vec::<T>().expect("dtype checked");
    let upd: Vec<T> = updates.to_vec::<T>().expect("dtype checked");
    for (&o, &u) in offsets.iter().zip(&upd) {
        out[o] = add(out[o], u);
    }
    Storage::from_array(ArrayD::from_shape_vec(IxDyn(x.shape()), out).expect("x's element count"))
}

pub(crate) fn gather_elements(x: &Storage, indices: &Storage, axis: usize) -> Storage {
    let ishape = indices.shape().to_vec();
    check_fits("gather_elements", "indices", &ishape, x.shape(), axis);
    let idx = index_values("gather_elements", indices);
    let len = x.shape()[axis];
    let ts = strides(x.shape());
    let offsets: Vec<usize> = idx
        .iter()
        .enumerate()
        .map(|(flat, &i)| retarget(flat, &ishape, axis, resolve("gather_elements", i, len, axis), &ts))
        .collect();
    crate::with_array!(x, a => {
        let flat: Vec<_> = a.iter().copied().collect();
        let data: Vec<_> = offsets.iter().map(|&o| flat[o]).collect();
        Storage::from_array(ArrayD::from_shape_vec(IxDyn(&ishape), data).expect("the indices' element count"))
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;

    #[test]
    fn scatter_add_sums_duplicates_and_broadcasts_row_ids() {
        // ONNX's example: data 0s [3, 3], updates added along axis 0.
        let x = t(vec![0.0f32; 9], &[3, 3]);
        let idx = t(vec![1i64, 0, 2, 0, 2, 1], &[2, 3]);
        let upd = t(vec![1.0f32, 1.1, 1.2, 2.0, 2.1, 2.2], &[2, 3]);
        let r = scatter_add(&x, &idx, &upd, 0);
        assert_eq!(v::<f32>(&r), vec![2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2]);
        // Duplicated row ids as a [n, 1] column: whole rows summed.
        let table = t(vec![0i64; 6], &[3, 2]);
        let ids = t(vec![2i64, 0, 2, -1], &[4, 1]);
        let rows = t(vec![1i64, 2, 3, 4, 5, 6, 7, 8], &[4, 2]);
        let r = scatter_add(&table, &ids, &rows, 0);
        assert_eq!(v::<i64>(&r), vec![3, 4, 0, 0, 13, 16]);
    }

    #[test]
    fn gather_elements_is_take_along_axis() {
        let x = t(vec![1i32, 2, 3, 4], &[2, 2]);
        let r = gather_elements(&x, &t(vec![0i64, 0, 1, 0], &[2, 2]), 1);
        assert_eq!(v::<i32>(&r), vec![1, 1, 4, 3]);
        let r = gather_elements(&x, &t(vec![1i64, -2], &[1, 2]), 0);
        assert_eq!((r.shape(), v::<i32>(&r)), (&[1usize, 2][..], vec![3, 2]));
        let r = gather_elements(&x, &t(Vec::<i64>::new(), &[0, 2]), 0);
        assert_eq!(r.shape(), &[0, 2]);
    }

    #[test]
    #[should_panic(expected = "index 3 is out of range for axis 0 of size 3")]
    fn out_of_range_indices_panic_with_the_index() {
        scatter_add(&t(vec![0.0f64; 3], &[3]), &t(vec![3i64], &[1]), &t(vec![1.0f64], &[1]), 0);
    }
    #[test]
    fn block_scatters_match_the_elementwise_path() {
        // Embedding-like: x [6, 3], updates [k, 3] with duplicate and
        // negative indices; also a middle axis.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as i64
        };
        for (xs, us, axis) in
            [(vec![6, 3], vec![9, 3], 0), (vec![2, 5, 4], vec![2, 7, 4], 1), (vec![4, 1], vec![3, 1], 0)]
        {
            let n: usize = us.iter().product();
            let x: Vec<f64> = (0..xs.iter().product::<usize>()).map(|_| (next() % 100) as f64 / 7.0).collect();
            let u: Vec<f64> = (0..n).map(|_| (next() % 100) as f64 / 3.0).collect();
            let len = xs[axis] as i64;
            let ids: Vec<i64> = (0..us[axis]).map(|_| next() % (2 * len) - len).collect();
            let mut ishape = vec![1; us.len()];
            ishape[axis] = us[axis];
            let (x, u, i) = (t(x, &xs), t(u, &us), t(ids, &ishape));
            let fast = scatter_add(&x, &i, &u, axis);
            let full = super::super::shape::broadcast_to(&i, &us);
            let slow = scatter_add(&x, &full, &u, axis);
            assert_eq!(v::<f64>(&fast), v::<f64>(&slow), "{xs:?} {us:?} axis {axis}");
        }
    }
}
