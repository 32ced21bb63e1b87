//! Shape kernels: the ops that move or re-view elements without computing on
//! them — numpy shape broadcasting, `reshape`, `transpose`, `broadcast_to`,
//! `concat`, `stack` and basic `slice`. `transpose` and `slice` return views
//! that share the input's buffer; `reshape` shares it when the input is in
//! standard layout.

use ndarray::{ArcArray, ArrayD, ArrayView, Axis, IxDyn, Slice};

use crate::{SliceSpec, Storage, StorageElement};

pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        // Align from the right; a missing dim is 1.
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// A row-major contiguous copy of `v` (which may be a broadcast view).
pub(crate) fn materialize<T: Clone>(v: ArrayView<'_, T, IxDyn>) -> ArrayD<T> {
    if v.is_standard_layout() {
        v.to_owned()
    } else {
        ArrayD::from_shape_vec(v.raw_dim(), row_major(v)).expect("length matches the shape")
    }
}

/// The elements of `v` in row-major order. `ArrayView::iter` over `IxDyn`
/// steps a dynamic index per element (about 25 ns each), which made a
/// reshape of a transposed 1 MiB view cost milliseconds; [`runs`] walks
/// the outer axes with a fixed-size counter and copies the innermost run
/// (the trailing axes that are contiguous together) as one slice.
pub(crate) fn row_major<T: Clone>(v: ArrayView<'_, T, IxDyn>) -> Vec<T> {
    if v.is_empty() || v.ndim() == 0 {
        return v.iter().cloned().collect();
    }
    let mut out = Vec::with_capacity(v.len());
    if let Some(t) = Transposed::of(&v) {
        let dst: *mut T = out.as_mut_ptr();
        // SAFETY: `t` writes each of the `v.len()` slots once (the
        // capacity), from `v`'s elements; the length is set after.
        unsafe {
            t.copy(v.as_ptr(), |i, x: &T| dst.add(i).write(x.clone()));
            out.set_len(v.len());
        }
        return out;
    }
    runs(&v, |run| match run {
        Run::Slice(s) => out.extend_from_slice(s),
        Run::Strided(start, len, stride) => {
            // SAFETY: `runs` hands out runs of `v`'s elements.
            out.extend((0..len).map(|j| unsafe { (*start.offset(j as isize * stride)).clone() }))
        }
    });
    out
}

/// Writes `v`'s elements in row-major order into `out` (exactly `v.len()`
/// long): what a reshape of a strided view copies, for callers that own
/// the destination (the JIT copies parts of one view on several threads).
///
/// # Panics
/// If `out`'s length is not `v.len()`.
pub fn write_row_major<T: Copy>(v: ArrayView<'_, T, IxDyn>, out: &mut [T]) {
    assert_eq!(out.len(), v.len(), "write_row_major: {} values for a view of {:?}", out.len(), v.shape());
    if v.is_empty() || v.ndim() == 0 {
        out.iter_mut().zip(v.iter()).for_each(|(o, x)| *o = *x);
        return;
    }
    if let Some(t) = Transposed::of(&v) {
        // SAFETY: `t`'s indices are below `v.len()`, its reads `v`'s.
        unsafe { t.copy(v.as_ptr(), |i, x: &T| out[i] = *x) };
        return;
    }
    let mut at = 0;
    runs(&v, |run| match run {
        Run::Slice(s) => {
            out[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        Run::Strided(start, len, stride) => {
            for (j, o) in out[at..at + len].iter_mut().enumerate() {
                // SAFETY: `runs` hands out runs of `v`'s elements.
                *o = unsafe { *start.offset(j as isize * stride) };
            }
            at += len;
        }
    });
}

/// A view that is a batch of transposed matrices once its size-1 axes
/// are dropped and its contiguous axes merged: element `(b, r, c)` of the
/// row-major result at `b·batch_stride + r + c·col_stride` (an NCHW value
/// seen channels last, or back). Copied in square tiles, so that reads
/// and writes both stay in a few cache lines: element by element, each
/// read of a channels-last view of a `[1, 3, 224, 224]` image fell on a
/// line of its own.
struct Transposed {
    batch: usize,
    batch_stride: isize,
    rows: usize,
    cols: usize,
    col_stride: isize,
}

impl Transposed {
    /// Tile side.
    const TILE: usize = 32;

    fn of<T>(v: &ArrayView<'_, T, IxDyn>) -> Option<Transposed> {
        // (size, stride) outermost first, size-1 axes dropped, and an axis
        // merged into the next when they are contiguous together.
        let mut axes: Vec<(usize, isize)> = Vec::new();
        for (&n, &s) in v.shape().iter().zip(v.strides()).filter(|(&n, _)| n > 1) {
            match axes.last_mut() {
                Some(last) if last.1 == n as isize * s => *last = (last.0 * n, s),
                _ => axes.push((n, s)),
            }
        }
        let (batch, batch_stride, rows, cols) = match axes[..] {
            [(r, 1), (c, cs)] if cs > 1 => (1, 0, r, (c, cs)),
            [(b, bs), (r, 1), (c, cs)] if cs > 1 => (b, bs, r, (c, cs)),
            _ => return None,
        };
        // Only worth it for matrices past a tile in both directions.
        (rows >= 4 && cols.0 >= 2 && rows * cols.0 >= 1024).then_some(Transposed {
            batch,
            batch_stride,
            rows,
            cols: cols.0,
            col_stride: cols.1,
        })
    }

    /// Calls `put(i, x)` for every element `x` of the view at `base`, `i`
    /// its row-major index, tile by tile.
    ///
    /// # Safety
    /// `base` is the view's first element and the view is the one `of`
    /// read.
    unsafe fn copy<T>(&self, base: *const T, mut put: impl FnMut(usize, &T)) {
        let (t, (rows, cols)) = (Self::TILE, (self.rows, self.cols));
        for b in 0..self.batch {
            for r0 in (0..rows).step_by(t) {
                for c0 in (0..cols).step_by(t) {
                    for c in c0..(c0 + t).min(cols) {
                        let col = b as isize * self.batch_stride + c as isize * self.col_stride;
                        for r in r0..(r0 + t).min(rows) {
                            // SAFETY: (b, r, c) is an element of the view.
                            put((b * rows + r) * cols + c, unsafe { &*base.offset(col + r as isize) });
                        }
                    }
                }
            }
        }
    }
}

/// One innermost run of a view: contiguous, or `len` values `stride`
/// apart from `start`.
enum Run<'a, T> {
    Slice(&'a [T]),
    Strided(*const T, usize, isize),
}

/// Calls `f` with `v`'s runs in row-major order: the trailing axes that
/// are contiguous together form one run, the outer axes are walked with a
/// counter. `v` is not empty and has rank ≥ 1.
fn runs<'a, T>(v: &ArrayView<'a, T, IxDyn>, mut f: impl FnMut(Run<'a, T>)) {
    let shape = v.shape().to_vec();
    let strides: Vec<isize> = v.strides().to_vec();
    // Fold trailing axes into one run while they are contiguous together.
    let mut inner = shape.len() - 1;
    let mut run = shape[inner];
    let run_stride = strides[inner];
    while inner > 0 && strides[inner - 1] == run as isize * run_stride {
        inner -= 1;
        run *= shape[inner];
    }
    let outer = &shape[..inner];
    let mut index = vec![0usize; inner];
    let base = v.as_ptr();
    loop {
        let offset: isize = index.iter().zip(&strides).map(|(&i, &s)| i as isize * s).sum();
        // SAFETY: every index stays below its axis length, so the offsets
        // (and the run's) address elements of `v`, which live for `'a`.
        unsafe {
            let start = base.offset(offset);
            if run_stride == 1 {
                f(Run::Slice(std::slice::from_raw_parts(start, run)));
            } else {
                f(Run::Strided(start, run, run_stride));
            }
        }
        // The next outer index, last axis fastest.
        let mut axis = inner;
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < outer[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

pub(crate) fn reshape(x: &Storage, shape: &[usize]) -> Storage {
    let n: usize = shape.iter().product();
    if n != x.len() {
        panic!("reshape: cannot reshape {:?} ({} elements) to {:?} ({} elements)", x.shape(), x.len(), shape, n);
    }
    crate::with_array!(x, a => reshape_t(a, shape))
}

fn reshape_t<T: StorageElement>(a: &ArcArray<T, IxDyn>, shape: &[usize]) -> Storage {
    let shared = if a.is_standard_layout() { a.clone() } else { materialize(a.view()).into_shared() };
    T::wrap(shared.into_shape_with_order(IxDyn(shape)).expect("standard layout and element count checked"))
}

pub(crate) fn transpose(x: &Storage, perm: &[usize]) -> Storage {
    let rank = x.rank();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        panic!("transpose: {:?} is not a permutation of the axes of shape {:?}", perm, x.shape());
    }
    crate::with_array!(x, a => StorageElement::wrap(a.clone().permuted_axes(IxDyn(perm))))
}

pub(crate) fn broadcast_to(x: &Storage, shape: &[usize]) -> Storage {
    crate::with_array!(x, a => {
        let view = a.broadcast(IxDyn(shape)).unwrap_or_else(|| {
            panic!("broadcast_to: cannot broadcast shape {:?} to {:?}", a.shape(), shape)
        });
        Storage::from_array(materialize(view))
    })
}

fn check_joinable(name: &str, xs: &[&Storage]) {
    let Some(first) = xs.first() else {
        panic!("{name}: needs at least one tensor");
    };
    if let Some(other) = xs.iter().find(|s| s.dtype() != first.dtype()) {
        panic!("{name}: tensors have different dtypes ({} and {})", first.dtype(), other.dtype());
    }
}

fn views<'a, T: StorageElement>(xs: &[&'a Storage]) -> Vec<ArrayView<'a, T, IxDyn>> {
    xs.iter().map(|s| s.array::<T>().expect("dtypes checked").view()).collect()
}

fn shapes(xs: &[&Storage]) -> Vec<Vec<usize>> {
    xs.iter().map(|s| s.shape().to_vec()).collect()
}

pub(crate) fn concat(xs: &[&Storage], axis: usize) -> Storage {
    check_joinable("concat", xs);
    let rank = xs[0].rank();
    let ok = axis < rank
        && xs.iter().all(|s| s.rank() == rank && (0..rank).all(|d| d == axis || s.shape()[d] == xs[0].shape()[d]));
    if !ok {
        panic!("concat: cannot concatenate shapes {:?} along axis {axis}", shapes(xs));
    }
    with_dtype!(xs[0].dtype(), T => Storage::from_array(concat_t(&views::<T>(xs), axis)))
}

/// The concatenation in row-major order, block by block: for each index of
/// the axes before `axis`, each input's contiguous run in turn.
/// `ndarray::concatenate` over `IxDyn` steps a dynamic index per element
/// (3 ms for W10's `[8, 128, 3 × 256]` gradient, 0.15 ms this way).
fn concat_t<T: Clone>(vs: &[ArrayView<'_, T, IxDyn>], axis: usize) -> ArrayD<T> {
    let mut shape = vs[0].shape().to_vec();
    shape[axis] = vs.iter().map(|v| v.shape()[axis]).sum();
    let outer: usize = shape[..axis].iter().product();
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    if total > 0 {
        let rows: Vec<std::borrow::Cow<'_, [T]>> = vs
            .iter()
            .map(|v| match v.as_slice() {
                Some(s) => std::borrow::Cow::Borrowed(s),
                None => std::borrow::Cow::Owned(row_major(v.view())),
            })
            .collect();
        for o in 0..outer {
            for r in &rows {
                let run = r.len() / outer;
                out.extend_from_slice(&r[o * run..(o + 1) * run]);
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).expect("the runs fill the shape")
}

pub(crate) fn stack(xs: &[&Storage], axis: usize) -> Storage {
    check_joinable("stack", xs);
    let ok = axis <= xs[0].rank() && xs.iter().all(|s| s.shape() == xs[0].shape());
    if !ok {
        panic!("stack: cannot stack shapes {:?} along new axis {axis}", shapes(xs));
    }
    with_dtype!(xs[0].dtype(), T => {
        let vs = views::<T>(xs);
        Storage::from_array(ndarray::stack(Axis(axis), &vs).expect("shapes checked"))
    })
}

/// The ndarray slice selecting what `spec` selects (numpy semantics) on an
/// axis of length `len`.
fn to_ndarray_slice(spec: &SliceSpec, len: usize) -> Slice {
    let (start, count, step) = spec.resolve(len);
    if count == 0 {
        return Slice::new(0, Some(0), 1);
    }
    let start = start as isize;
    let step = step as isize;
    let last = start + (count as isize - 1) * step;
    if step > 0 {
        Slice::new(start, Some(last + 1), step)
    } else {
        // ndarray walks [lo, hi) backwards from its end for a negative step.
        Slice::new(last, Some(start + 1), step)
    }
}

pub(crate) fn slice(x: &Storage, specs: &[SliceSpec]) -> Storage {
    if specs.len() > x.rank() {
        panic!("slice: {} slice specs for a tensor of shape {:?}", specs.len(), x.shape());
    }
    if specs.iter().any(|s| s.step == 0) {
        panic!("slice: step must not be 0");
    }
    crate::with_array!(x, a => {
        let mut out = a.clone();
        out.slice_each_axis_inplace(|ax| {
            let spec = specs.get(ax.axis.index()).unwrap_or(&SliceSpec::FULL);
            to_ndarray_slice(spec, ax.len)
        });
        StorageElement::wrap(out)
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;
    use crate::DType;
    use proptest::prelude::*;

    fn iota(shape: &[usize]) -> Storage {
        let n: usize = shape.iter().product();
        t((0..n as i32).collect(), shape)
    }

    #[test]
    fn broadcast_shape_rules() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[], &[]), Some(vec![]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[0], &[2]), None);
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 3]), None);
    }

    #[test]
    fn reshape_basic_and_non_standard() {
        let x = iota(&[2, 3]);
        let r = reshape(&x, &[3, 1, 2]);
        assert_eq!(r.shape(), &[3, 1, 2]);
        assert_eq!(v::<i32>(&r), vec![0, 1, 2, 3, 4, 5]);
        assert!(r.is_standard_layout());
        let xt = transpose(&x, &[1, 0]);
        assert!(!xt.is_standard_layout());
        let r = reshape(&xt, &[6]);
        assert_eq!(v::<i32>(&r), vec![0, 3, 1, 4, 2, 5]);
        // Rank 0 and empty.
        let s = reshape(&Storage::scalar(7i64), &[1, 1]);
        assert_eq!(v::<i64>(&s), vec![7]);
        let s = reshape(&t(vec![7i64], &[1, 1]), &[]);
        assert_eq!(s.shape(), &[] as &[usize]);
        let e = reshape(&Storage::full(&[0, 3], DType::F32, 0.0), &[3, 0, 5]);
        assert_eq!(e.shape(), &[3, 0, 5]);
    }

    #[test]
    #[should_panic(expected = "reshape: cannot reshape [2, 3] (6 elements) to [4] (4 elements)")]
    fn reshape_count_mismatch() {
        reshape(&iota(&[2, 3]), &[4]);
    }

    #[test]
    fn transpose_values() {
        let x = iota(&[2, 3, 4]);
        let r = transpose(&x, &[2, 0, 1]);
        assert_eq!(r.shape(), &[4, 2, 3]);
        assert_eq!(r.get_f64(&[3, 1, 2]), x.get_f64(&[1, 2, 3]));
        let s = transpose(&Storage::scalar(1.0f32), &[]);
        check_f64(&s, &[], &[1.0]);
    }

    #[test]
    #[should_panic(expected = "not a permutation")]
    fn transpose_bad_perm() {
        transpose(&iota(&[2, 3]), &[0, 0]);
    }

    #[test]
    fn broadcast_to_materializes() {
        let x = t(vec![1.0f32, 2.0], &[2, 1]);
        let r = broadcast_to(&x, &[3, 2, 2]);
        assert!(r.is_standard_layout());
        check_f64(&r, &[3, 2, 2], &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]);
        let r = broadcast_to(&Storage::scalar(true), &[2]);
        assert_eq!(v::<bool>(&r), vec![true, true]);
        let r = broadcast_to(&x, &[0, 2, 5]);
        assert_eq!(r.shape(), &[0, 2, 5]);
    }

    #[test]
    #[should_panic(expected = "broadcast_to: cannot broadcast shape [2] to [3]")]
    fn broadcast_to_incompatible() {
        broadcast_to(&iota(&[2]), &[3]);
    }

    #[test]
    fn concat_and_stack() {
        let a = iota(&[2, 2]);
        let b = t(vec![10, 11], &[2, 1]);
        let r = concat(&[&a, &b], 1);
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(v::<i32>(&r), vec![0, 1, 10, 2, 3, 11]);
        let e = Storage::full(&[0, 2], DType::I32, 0.0);
        let r = concat(&[&e, &a, &e], 0);
        assert_eq!(v::<i32>(&r), vec![0, 1, 2, 3]);
        let r = concat(&[&a], 0);
        assert_eq!(v::<i32>(&r), vec![0, 1, 2, 3]);
        let r = stack(&[&a, &a], 2);
        assert_eq!(r.shape(), &[2, 2, 2]);
        assert_eq!(v::<i32>(&r), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        let r = stack(&[&Storage::scalar(1.0f64), &Storage::scalar(2.0f64)], 0);
        check_f64(&r, &[2], &[1.0, 2.0]);
        let r = stack(&[&e, &e, &e], 1);
        assert_eq!(r.shape(), &[0, 3, 2]);
    }

    #[test]
    #[should_panic(expected = "concat: cannot concatenate shapes [[2, 2], [3, 1]] along axis 1")]
    fn concat_mismatch() {
        concat(&[&iota(&[2, 2]), &iota(&[3, 1])], 1);
    }

    #[test]
    #[should_panic(expected = "stack: needs at least one tensor")]
    fn stack_empty_list() {
        stack(&[], 0);
    }

    fn sl(start: Option<i64>, stop: Option<i64>, step: i64) -> SliceSpec {
        SliceSpec { start, stop, step }
    }

    #[test]
    fn slice_numpy_semantics() {
        let x = iota(&[6]);
        let cases: Vec<(SliceSpec, Vec<i32>)> = vec![
            (SliceSpec::FULL, vec![0, 1, 2, 3, 4, 5]),
            (sl(Some(1), Some(4), 1), vec![1, 2, 3]),
            (sl(None, None, 2), vec![0, 2, 4]),
            (sl(None, None, -1), vec![5, 4, 3, 2, 1, 0]),
            (sl(None, None, -2), vec![5, 3, 1]),
            (sl(Some(4), Some(1), -1), vec![4, 3, 2]),
            (sl(Some(-1), None, -3), vec![5, 2]),
            (sl(Some(-2), None, 1), vec![4, 5]),
            (sl(Some(1), Some(1), 1), vec![]),
            (sl(Some(1), Some(4), -1), vec![]),
            (sl(Some(100), None, -1), vec![5, 4, 3, 2, 1, 0]),
            (sl(Some(-100), Some(100), 4), vec![0, 4]),
            (sl(None, Some(-100), -1), vec![5, 4, 3, 2, 1, 0]),
        ];
        for (spec, expected) in cases {
            let r = slice(&x, &[spec]);
            assert_eq!(v::<i32>(&r), expected, "{spec:?}");
        }
    }

    #[test]
    fn slice_multi_axis_and_missing_specs() {
        let x = iota(&[3, 4]);
        let r = slice(&x, &[sl(None, None, -1), sl(Some(1), None, 2)]);
        assert_eq!(r.shape(), &[3, 2]);
        assert_eq!(v::<i32>(&r), vec![9, 11, 5, 7, 1, 3]);
        let r = slice(&x, &[sl(Some(1), Some(2), 1)]);
        assert_eq!(v::<i32>(&r), vec![4, 5, 6, 7]);
        let r = slice(&Storage::scalar(3i32), &[]);
        assert_eq!(v::<i32>(&r), vec![3]);
        let r = slice(&Storage::full(&[0, 2], DType::F32, 0.0), &[sl(None, None, -1)]);
        assert_eq!(r.shape(), &[0, 2]);
        // A slice of a reversed view stays correct after to_standard.
        let r2 = slice(&r, &[SliceSpec::FULL, sl(None, None, -1)]);
        assert!(r2.to_standard().is_standard_layout());
    }

    #[test]
    #[should_panic(expected = "slice: 2 slice specs for a tensor of shape [3]")]
    fn slice_too_many_specs() {
        slice(&iota(&[3]), &[SliceSpec::FULL, SliceSpec::FULL]);
    }

    fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..5, 0..5)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The block-wise concat equals ndarray's element-wise one, for
        /// inputs in any layout (transposed views), any axis, empty sizes.
        #[test]
        fn concat_matches_ndarray(
            shape in prop::collection::vec(0usize..4, 1..4),
            extra in prop::collection::vec(0usize..4, 1..4),
            axis_pick in 0usize..3,
            transposed in any::<bool>(),
        ) {
            let axis = axis_pick % shape.len();
            let parts: Vec<Storage> = extra.iter().enumerate().map(|(i, &n)| {
                let mut s = shape.clone();
                s[axis] = n;
                let x = crate::kernels::binary(crate::BinaryOp::Add, &iota(&s), &Storage::scalar(100 * i as i32));
                if transposed && s.len() > 1 {
                    // The same values from a transposed buffer.
                    let rev: Vec<usize> = (0..s.len()).rev().collect();
                    transpose(&transpose(&x, &rev).to_standard(), &rev)
                } else {
                    x
                }
            }).collect();
            let refs: Vec<&Storage> = parts.iter().collect();
            let got = concat(&refs, axis);
            let views: Vec<_> = parts.iter().map(|p| p.array::<i32>().unwrap().view()).collect();
            let want = Storage::from_array(ndarray::concatenate(Axis(axis), &views).unwrap());
            prop_assert!(got.is_standard_layout());
            prop_assert!(got.bit_eq(&want.to_standard()), "{:?} vs {:?}", got, want);
        }

        #[test]
        fn transpose_round_trip(shape in shape_strategy(), seed in any::<u64>()) {
            let x = iota(&shape);
            // A pseudo-random permutation from the seed.
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            let mut s = seed;
            for i in (1..perm.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                perm.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            let y = transpose(&x, &perm);
            let expected: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            prop_assert_eq!(y.shape(), &expected[..]);
            // Through a contiguous copy and back.
            let back = transpose(&y.to_standard(), &inv);
            prop_assert!(back.to_standard().bit_eq(&x));
        }

        #[test]
        fn reshape_round_trip(shape in shape_strategy(), flip in any::<bool>()) {
            let x = iota(&shape);
            let n = x.len();
            let src = if flip && shape.len() >= 2 { transpose(&x, &(0..shape.len()).rev().collect::<Vec<_>>()) } else { x.clone() };
            let flat = reshape(&src, &[n]);
            prop_assert_eq!(v::<i32>(&flat), v::<i32>(&src));
            let back = reshape(&flat, src.shape());
            prop_assert!(back.bit_eq(&src));
        }
    }
}

#[cfg(test)]
mod row_major_tests {
    use ndarray::{ArrayD, Axis, IxDyn, Slice};
    use proptest::prelude::*;

    use super::{row_major, write_row_major};

    proptest! {
        /// Any permutation, step, reversal or broadcast of an array reads
        /// back in the order `iter` gives.
        #[test]
        fn row_major_is_iter_order(
            dims in prop::collection::vec(0usize..5, 0..5),
            perm_seed in 0usize..120,
            step in 1isize..3,
            flip: bool,
            broadcast: bool,
        ) {
            let n: usize = dims.iter().product();
            let a = ArrayD::from_shape_vec(IxDyn(&dims), (0..n as i64).collect()).unwrap();
            let mut v = a.view();
            let rank = dims.len();
            if rank > 0 {
                let mut perm: Vec<usize> = (0..rank).collect();
                let mut s = perm_seed;
                for i in (1..rank).rev() {
                    perm.swap(i, s % (i + 1));
                    s /= i + 1;
                }
                v = v.permuted_axes(IxDyn(&perm));
                let last = Axis(rank - 1);
                v.slice_axis_inplace(last, Slice::new(0, None, if flip { -step } else { step }));
            }
            let want: Vec<i64> = v.iter().copied().collect();
            prop_assert_eq!(row_major(v.view()), want.clone());
            let mut written = vec![-1i64; want.len()];
            write_row_major(v.view(), &mut written);
            prop_assert_eq!(written, want);
            if broadcast {
                let mut shape = vec![3usize];
                shape.extend(v.shape());
                let b = v.broadcast(IxDyn(&shape)).unwrap();
                let want: Vec<i64> = b.iter().copied().collect();
                prop_assert_eq!(row_major(b.clone()), want.clone());
                let mut written = vec![-1i64; want.len()];
                write_row_major(b, &mut written);
                prop_assert_eq!(written, want);
            }
        }
    }

    proptest! {
        /// Views large enough for the tiled copy of batched transposes
        /// (an NCHW value seen channels last and back, any permutation of
        /// four axes, size-1 axes, a broadcast batch) read back in the
        /// order `iter` gives.
        #[test]
        fn tiled_transposes_are_iter_order(
            dims in prop::collection::vec(1usize..40, 4),
            perm_seed in 0usize..24,
            broadcast: bool,
        ) {
            let n: usize = dims.iter().product();
            let a = ArrayD::from_shape_vec(IxDyn(&dims), (0..n as i64).collect()).unwrap();
            let mut perm: Vec<usize> = (0..4).collect();
            let mut s = perm_seed;
            for i in (1..4).rev() {
                perm.swap(i, s % (i + 1));
                s /= i + 1;
            }
            let v = a.view().permuted_axes(IxDyn(&perm));
            let v = if broadcast {
                let mut shape = vec![2usize];
                shape.extend(v.shape());
                v.broadcast(IxDyn(&shape)).unwrap().into_dyn()
            } else {
                v
            };
            let want: Vec<i64> = v.iter().copied().collect();
            prop_assert_eq!(row_major(v.clone()), want.clone());
            let mut written = vec![-1i64; want.len()];
            write_row_major(v, &mut written);
            prop_assert_eq!(written, want);
        }
    }
}
