//! `x -= scale · scatter_add(0, indices, updates)` in `x`'s own buffer,
//! touching only the blocks the indices name: a variable's sparse update
//! (plain SGD on an embedding's gradient), which would otherwise make a
//! zero table, scatter into it, scale it and subtract it from every row.
//!
//! The bits are those of that dense computation. Each named block's
//! updates are summed from zero in the updates' row-major order (as
//! `scatter_add` sums them), then multiplied by the scale and subtracted;
//! a block no index names would lose `scale · (+0) = +0`, which changes
//! nothing when the scale is finite with a clear sign bit (it is left
//! alone). Where that does not hold the kernel declines and the caller
//! runs the dense form.

use std::borrow::Cow;
use std::ops::{Add, Mul, Sub};

use super::index::index_values;
use super::scatter::{is_block_scatter, resolve};
use crate::{Storage, StorageElement};

/// Subtracts `scale · scatter_add(0, indices, updates)` (along `axis`)
/// from `x` in place (its buffer is copied first if something else holds
/// it). Returns false, with `x` unchanged, when the shapes are not an
/// embedding-style block scatter, the dtypes are not one of f32 / f64, the
/// scale is not a finite 0-d value with a clear sign bit, or `x` is not in
/// standard layout. Panics naming the index, before writing anything,
/// when an index is out of range.
pub fn scatter_sub_in_place(
    x: &mut Storage,
    indices: &Storage,
    updates: &Storage,
    axis: usize,
    scale: Option<&Storage>,
) -> bool {
    if !is_block_scatter(x.shape(), indices.shape(), updates.shape(), axis) {
        return false;
    }
    let xs = x.shape().to_vec();
    match (x, updates, scale) {
        (Storage::F32(a), Storage::F32(u), None) => sub_blocks(a, &xs, indices, u, axis, None, 0.0),
        (Storage::F32(a), Storage::F32(u), Some(Storage::F32(s))) if s.ndim() == 0 => {
            let s = s.iter().copied().next().unwrap_or(f32::NAN);
            (s.is_finite() && s.is_sign_positive()) && sub_blocks(a, &xs, indices, u, axis, Some(s), 0.0)
        }
        (Storage::F64(a), Storage::F64(u), None) => sub_blocks(a, &xs, indices, u, axis, None, 0.0),
        (Storage::F64(a), Storage::F64(u), Some(Storage::F64(s))) if s.ndim() == 0 => {
            let s = s.iter().copied().next().unwrap_or(f64::NAN);
            (s.is_finite() && s.is_sign_positive()) && sub_blocks(a, &xs, indices, u, axis, Some(s), 0.0)
        }
        _ => false,
    }
}

/// The update on `x`'s elements (`xs` its shape).
fn sub_blocks<T>(
    x: &mut ndarray::ArcArray<T, ndarray::IxDyn>,
    xs: &[usize],
    indices: &Storage,
    updates: &ndarray::ArcArray<T, ndarray::IxDyn>,
    axis: usize,
    scale: Option<T>,
    zero: T,
) -> bool
where
    T: StorageElement + Add<Output = T> + Sub<Output = T> + Mul<Output = T>,
{
    let us = updates.shape();
    let (m, len) = (us[axis], xs[axis]);
    let outer: usize = us[..axis].iter().product();
    let inner: usize = us[axis + 1..].iter().product();
    // Every index is checked before anything is written.
    let idx: Vec<usize> =
        index_values("scatter_add", indices).iter().map(|&i| resolve("scatter_add", i, len, axis)).collect();
    if x.as_slice().is_none() {
        return false;
    }
    let Some(dst) = x.as_slice_mut() else { return false };
    let upd: Cow<'_, [T]> = match updates.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(updates.iter().copied().collect()),
    };
    // Each distinct target block gets one accumulator, in first-use order.
    let mut slot = vec![usize::MAX; len];
    let mut targets = Vec::new();
    let which: Vec<usize> = idx
        .iter()
        .map(|&i| {
            if slot[i] == usize::MAX {
                slot[i] = targets.len();
                targets.push(i);
            }
            slot[i]
        })
        .collect();
    let mut acc = vec![zero; targets.len() * inner];
    for o in 0..outer {
        acc.fill(zero);
        for (j, &k) in which.iter().enumerate() {
            let src = &upd[(o * m + j) * inner..][..inner];
            for (a, &u) in acc[k * inner..][..inner].iter_mut().zip(src) {
                *a = *a + u;
            }
        }
        for (k, &i) in targets.iter().enumerate() {
            let sums = &acc[k * inner..][..inner];
            let row = &mut dst[(o * len + i) * inner..][..inner];
            match scale {
                Some(s) => row.iter_mut().zip(sums).for_each(|(d, &a)| *d = *d - a * s),
                None => row.iter_mut().zip(sums).for_each(|(d, &a)| *d = *d - a),
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;
    use crate::kernels::{binary, scatter_add};
    use crate::BinaryOp;

    /// The dense form: `x - scale · scatter_add(0, ..)`.
    fn dense(x: &Storage, i: &Storage, u: &Storage, axis: usize, scale: Option<&Storage>) -> Storage {
        let zeros = t(vec![0.0f32; x.len()], x.shape());
        let s = scatter_add(&zeros, i, u, axis);
        let s = scale.map_or(s.clone(), |c| binary(BinaryOp::Mul, &s, c));
        binary(BinaryOp::Sub, x, &s)
    }

    #[test]
    fn matches_the_dense_update_bit_for_bit_with_duplicates() {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) % 2001) as f32 / 97.0 - 10.0
        };
        for (xs, us, axis) in
            [(vec![7, 3], vec![11, 3], 0), (vec![2, 5, 4], vec![2, 6, 4], 1), (vec![5, 1], vec![0, 1], 0)]
        {
            let x: Vec<f32> = (0..xs.iter().product::<usize>()).map(|_| next()).collect();
            let mut x = t(x, &xs);
            // -0.0 in the table stays -0.0 where no id points.
            if let Storage::F32(a) = &mut x {
                a.as_slice_mut().unwrap()[xs.iter().product::<usize>() - 1] = -0.0;
            }
            let original: Vec<u32> = v::<f32>(&x).iter().map(|f| f.to_bits()).collect();
            let u: Vec<f32> = (0..us.iter().product::<usize>()).map(|_| next()).collect();
            let len = xs[axis] as i64;
            let ids: Vec<i64> = (0..us[axis]).map(|k| [0, 2, -2, 0, 1][k % 5] % len).collect();
            let mut ishape = vec![1; us.len()];
            ishape[axis] = us[axis];
            let (u, i) = (t(u, &us), t(ids, &ishape));
            for scale in [None, Some(t(vec![0.37f32], &[])), Some(t(vec![0.0f32], &[]))] {
                let want = dense(&x, &i, &u, axis, scale.as_ref());
                let mut got = x.clone();
                assert!(scatter_sub_in_place(&mut got, &i, &u, axis, scale.as_ref()));
                let bits = |s: &Storage| v::<f32>(s).iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{xs:?} {us:?} {scale:?}");
                // `got` shared `x`'s buffer: it was copied, `x` is untouched.
                assert_eq!(bits(&x), original);
            }
        }
    }

    #[test]
    fn declines_what_the_dense_form_must_do() {
        let x = t(vec![1.0f32; 6], &[3, 2]);
        let (i, u) = (t(vec![1i64], &[1, 1]), t(vec![1.0f32, 2.0], &[1, 2]));
        for scale in [-0.5f32, -0.0, f32::NAN, f32::INFINITY] {
            let mut y = x.clone();
            assert!(!scatter_sub_in_place(&mut y, &i, &u, 0, Some(&t(vec![scale], &[]))));
            assert_eq!(v::<f32>(&y), v::<f32>(&x));
        }
        // Elementwise indices, integer tables, mixed dtypes.
        let mut y = x.clone();
        assert!(!scatter_sub_in_place(&mut y, &t(vec![1i64, 0], &[1, 2]), &u, 0, None));
        let mut ints = t(vec![1i64; 6], &[3, 2]);
        assert!(!scatter_sub_in_place(&mut ints, &i, &t(vec![1i64, 2], &[1, 2]), 0, None));
        assert!(!scatter_sub_in_place(&mut y, &i, &t(vec![1.0f64, 2.0], &[1, 2]), 0, None));
    }

    #[test]
    #[should_panic(expected = "index 3 is out of range for axis 0 of size 3")]
    fn a_bad_index_panics_before_writing() {
        let mut x = t(vec![1.0f32; 6], &[3, 2]);
        scatter_sub_in_place(&mut x, &t(vec![0i64, 3], &[2, 1]), &t(vec![1.0f32; 4], &[2, 2]), 0, None);
    }

    #[test]
    fn writes_into_the_buffer_it_owns() {
        let mut x = t(vec![1.0f32; 6], &[3, 2]);
        let before = crate::with_array!(&x, a => a.as_ptr() as usize);
        assert!(scatter_sub_in_place(&mut x, &t(vec![2i64], &[1, 1]), &t(vec![1.0f32, 2.0], &[1, 2]), 0, None));
        assert_eq!(crate::with_array!(&x, a => a.as_ptr() as usize), before);
        assert_eq!(v::<f32>(&x), [1.0, 1.0, 1.0, 1.0, 0.0, -1.0]);
    }
}
