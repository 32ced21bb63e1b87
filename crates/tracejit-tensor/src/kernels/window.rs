//! Windows of a tensor: `dynamic_slice` and `dynamic_update_slice` (start
//! indices given as a tensor, clamped so the window stays in bounds, as
//! XLA's DynamicSlice and DynamicUpdateSlice do) and `pad` (a constant
//! border).

use ndarray::{ArcArray, ArrayD, IxDyn, Slice};

use super::index::index_values;
use crate::{Element, Storage, StorageElement};

/// The window's start on each axis: the given start clamped into
/// `[0, dim - size]` (XLA's rule: the window keeps its size and stays in
/// bounds, whatever the start).
fn clamped_starts(name: &str, starts: &Storage, dims: &[usize], sizes: &[usize]) -> Vec<usize> {
    let s = index_values(name, starts);
    if starts.rank() != 1 || s.len() != dims.len() {
        panic!(
            "{name}: starts must be a vector of {} indices (one per axis), got shape {:?}",
            dims.len(),
            starts.shape()
        );
    }
    dims.iter()
        .zip(sizes)
        .zip(&s)
        .enumerate()
        .map(|(axis, ((&d, &size), &start))| {
            if size > d {
                panic!("{name}: a window of {size} does not fit axis {axis} of size {d}");
            }
            start.clamp(0, (d - size) as i64) as usize
        })
        .collect()
}

pub(crate) fn dynamic_slice(x: &Storage, starts: &Storage, sizes: &[usize]) -> Storage {
    if sizes.len() != x.rank() {
        panic!("dynamic_slice: {} sizes for a tensor of shape {:?}", sizes.len(), x.shape());
    }
    let at = clamped_starts("dynamic_slice", starts, x.shape(), sizes);
    crate::with_array!(x, a => {
        let mut out = a.clone();
        out.slice_each_axis_inplace(|ax| {
            let (s, n) = (at[ax.axis.index()], sizes[ax.axis.index()]);
            Slice::from(s..s + n)
        });
        StorageElement::wrap(out)
    })
}

pub(crate) fn dynamic_update_slice(x: &Storage, update: &Storage, starts: &Storage) -> Storage {
    if update.rank() != x.rank() || update.dtype() != x.dtype() {
        panic!(
            "dynamic_update_slice: update {}{:?} does not match x {}{:?} in rank and dtype",
            update.dtype(),
            update.shape(),
            x.dtype(),
            x.shape()
        );
    }
    let at = clamped_starts("dynamic_update_slice", starts, x.shape(), update.shape());
    match (x, update) {
        (Storage::F32(a), Storage::F32(u)) => Storage::F32(write_window(a, u, &at)),
        (Storage::F64(a), Storage::F64(u)) => Storage::F64(write_window(a, u, &at)),
        (Storage::I32(a), Storage::I32(u)) => Storage::I32(write_window(a, u, &at)),
        (Storage::I64(a), Storage::I64(u)) => Storage::I64(write_window(a, u, &at)),
        (Storage::Bool(a), Storage::Bool(u)) => Storage::Bool(write_window(a, u, &at)),
        (Storage::BF16(a), Storage::BF16(u)) => Storage::BF16(write_window(a, u, &at)),
        (Storage::F16(a), Storage::F16(u)) => Storage::F16(write_window(a, u, &at)),
        _ => unreachable!("dtypes checked above"),
    }
}

/// A copy of `a` with the window at `at` replaced by `u`.
fn write_window<T: Clone>(a: &ArcArray<T, IxDyn>, u: &ArcArray<T, IxDyn>, at: &[usize]) -> ArcArray<T, IxDyn> {
    let mut out: ArrayD<T> = a.to_owned();
    let mut window = out.view_mut();
    window.slice_each_axis_inplace(|ax| {
        let i = ax.axis.index();
        Slice::from(at[i]..at[i] + u.shape()[i])
    });
    window.assign(u);
    out.into_shared()
}

pub(crate) fn pad(x: &Storage, pads: &[(usize, usize)], value: f64) -> Storage {
    if pads.len() != x.rank() {
        panic!("pad: {} (before, after) pairs for a tensor of shape {:?}", pads.len(), x.shape());
    }
    let shape: Vec<usize> = x.shape().iter().zip(pads).map(|(&d, &(lo, hi))| d + lo + hi).collect();
    match x {
        Storage::F32(_) => pad_rows::<f32>(x, pads, &shape, value),
        Storage::F64(_) => pad_rows::<f64>(x, pads, &shape, value),
        _ => pad_by_view(x, pads, &shape, value),
    }
}

/// `pad` through ndarray: the output's inner window assigned from `x`.
fn pad_by_view(x: &Storage, pads: &[(usize, usize)], shape: &[usize], value: f64) -> Storage {
    crate::with_array!(x, a => {
        let mut out = ArrayD::from_elem(IxDyn(shape), Element::from_f64(value));
        let mut inner = out.view_mut();
        inner.slice_each_axis_inplace(|ax| {
            let i = ax.axis.index();
            Slice::from(pads[i].0..pads[i].0 + a.shape()[i])
        });
        inner.assign(a);
        Storage::from_array(out)
    })
}

/// `pad` by rows: `x` in row-major order (one fast copy when it is a
/// strided view), each last-axis row copied into place in an output
/// filled with `value`. The gradient of a slice is this pad; ndarray's
/// element-wise assignment into a sliced view ran at 3 GB/s there.
fn pad_rows<T: StorageElement>(x: &Storage, pads: &[(usize, usize)], shape: &[usize], value: f64) -> Storage {
    let src: Vec<T> = x.to_vec::<T>().expect("dtype matched");
    let mut out = vec![T::from_f64(value); shape.iter().product()];
    let dims = x.shape();
    let rank = dims.len();
    let last = dims.last().copied().unwrap_or(1);
    if rank > 0 && last > 0 && !src.is_empty() {
        let mut ostrides = vec![1usize; rank];
        for k in (0..rank - 1).rev() {
            ostrides[k] = ostrides[k + 1] * shape[k + 1];
        }
        // The row's index over the leading axes, advanced like an odometer.
        let mut idx = vec![0usize; rank - 1];
        for row in src.chunks_exact(last) {
            let at: usize =
                idx.iter().enumerate().map(|(k, &i)| (i + pads[k].0) * ostrides[k]).sum::<usize>() + pads[rank - 1].0;
            out[at..at + last].copy_from_slice(row);
            for k in (0..rank - 1).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
    Storage::from_array(ArrayD::from_shape_vec(IxDyn(shape), out).expect("the padded element count"))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;

    #[test]
    fn dynamic_slices_clamp_their_starts_as_xla_does() {
        let x = t((0..12i32).collect(), &[3, 4]);
        let r = dynamic_slice(&x, &t(vec![1i64, 1], &[2]), &[2, 2]);
        assert_eq!(v::<i32>(&r), vec![5, 6, 9, 10]);
        // Past the end and negative: clamped into [0, dim - size].
        let r = dynamic_slice(&x, &t(vec![5i64, -3], &[2]), &[2, 3]);
        assert_eq!(v::<i32>(&r), vec![4, 5, 6, 8, 9, 10]);
        let r = dynamic_slice(&x, &t(vec![0i32, 2], &[2]), &[0, 2]);
        assert_eq!(r.shape(), &[0, 2]);
    }

    #[test]
    fn dynamic_update_slices_clamp_and_replace() {
        let x = t(vec![0.0f64; 6], &[2, 3]);
        let u = t(vec![1.0f64, 2.0], &[1, 2]);
        let r = dynamic_update_slice(&x, &u, &t(vec![1i64, 9], &[2]));
        assert_eq!(v::<f64>(&r), vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        // The input is untouched (copy on write).
        assert_eq!(v::<f64>(&x), vec![0.0; 6]);
    }

    #[test]
    fn pad_adds_a_constant_border() {
        let x = t(vec![1i64, 2, 3, 4], &[2, 2]);
        let r = pad(&x, &[(1, 0), (0, 2)], 7.0);
        assert_eq!(r.shape(), &[3, 4]);
        assert_eq!(v::<i64>(&r), vec![7, 7, 7, 7, 1, 2, 7, 7, 3, 4, 7, 7]);
        let r = pad(&t(Vec::<f32>::new(), &[0]), &[(2, 1)], 0.5);
        assert_eq!(v::<f32>(&r), vec![0.5, 0.5, 0.5]);
    }

    #[test]
    #[should_panic(expected = "a window of 4 does not fit axis 0 of size 3")]
    fn windows_larger_than_the_axis_panic() {
        dynamic_slice(&t(vec![0i32; 3], &[3]), &t(vec![0i64], &[1]), &[4]);
    }
    #[test]
    fn row_pads_match_the_view_path_on_strided_and_empty_inputs() {
        for (shape, pads) in [
            (vec![2, 3], vec![(1, 0), (2, 1)]),
            (vec![3, 1, 4], vec![(0, 2), (1, 1), (0, 3)]),
            (vec![0, 3], vec![(1, 1), (0, 2)]),
            (vec![4], vec![(3, 0)]),
            (vec![2, 0], vec![(0, 1), (1, 1)]),
        ] {
            let n: usize = shape.iter().product();
            let x = t((0..n).map(|i| i as f64 * 0.5 - 1.0).collect::<Vec<f64>>(), &shape);
            assert_eq!(v::<f64>(&pad(&x, &pads, 9.0)), v::<f64>(&pad_by_view(&x, &pads, &out(&shape, &pads), 9.0)));
            if shape.len() == 2 {
                // A transposed (strided) input.
                let xt = crate::kernels::transpose(&x, &[1, 0]);
                let pt = [pads[1], pads[0]];
                let want = pad_by_view(&xt, &pt, &out(xt.shape(), &pt), 9.0);
                assert_eq!(v::<f64>(&pad(&xt, &pt, 9.0)), v::<f64>(&want));
            }
        }
    }

    fn out(shape: &[usize], pads: &[(usize, usize)]) -> Vec<usize> {
        shape.iter().zip(pads).map(|(&d, &(lo, hi))| d + lo + hi).collect()
    }
}
