//! The copies the reference kernels make on the calling thread, split over
//! the JIT's threads when large: a reshape of a strided view (W10's
//! attention outputs and gradients, `[b, h, t, d]` seen as `[b, t, h·d]`)
//! and a concatenation of contiguous inputs (its q/k/v gradients joined).
//! They were ~1.3 ms of W10's bf16 step at two threads with the second
//! core idle.
//!
//! Each part copies its own range of the output; a copy's values do not
//! depend on who copies them, so the result is the reference's.

use ndarray::{Axis, Slice};
use tracejit_ir::tensor::{kernels, DType, Storage};

use crate::region::BufPool;

/// Least values a copy has before it is split: a dispatch costs a few µs,
/// copying 128 Ki values about 40.
const PARALLEL_VALUES: usize = 1 << 17;

/// An f32 output of `shape`: a pooled buffer when one fits, else a new one.
fn output(shape: &[usize], pool: &mut BufPool) -> ndarray::ArcArray<f32, ndarray::IxDyn> {
    match pool.take(DType::F32, shape) {
        Some(Storage::F32(buf)) if buf.is_standard_layout() && crate::region::same_shape(buf.shape(), shape) => buf,
        _ => ndarray::ArcArray::zeros(ndarray::IxDyn(shape)),
    }
}

/// `reshape(x, shape)` when `x` is a large strided f32 view and there is a
/// pool: its values copied in row-major order, in parts along its first
/// axis longer than 1; `None` where the reference kernel runs.
pub(super) fn reshape(x: &Storage, shape: &[i64], pool: &mut BufPool) -> Option<Storage> {
    let Storage::F32(a) = x else { return None };
    if a.len() < PARALLEL_VALUES || a.is_standard_layout() {
        return None;
    }
    let known: usize = shape.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
    let dims: Vec<usize> = shape.iter().map(|&d| if d < 0 { a.len() / known.max(1) } else { d as usize }).collect();
    if dims.iter().product::<usize>() != a.len() {
        return None; // the reference kernel reports it
    }
    let axis = a.shape().iter().position(|&d| d > 1)?;
    crate::threads::pool()?;
    // Axes before `axis` are 1 long: a range of it is a range of the output.
    let inner = a.len() / a.shape()[axis];
    let mut out = output(&dims, pool);
    let values = out.as_slice_mut().expect("standard layout");
    crate::threads::for_each_part(values, inner, PARALLEL_VALUES, &|start, part| {
        let r0 = start / inner;
        let rows = a.slice_axis(Axis(axis), Slice::from(r0..r0 + part.len() / inner));
        kernels::write_row_major(rows, part);
    });
    Some(Storage::F32(out))
}

/// `concat(xs, axis)` when the inputs are large contiguous f32 arrays and
/// there is a pool: in parts over the indices before `axis`, each taking
/// every input's run for its indices in turn; `None` where the reference
/// kernel runs.
pub(super) fn concat(xs: &[&Storage], axis: usize, pool: &mut BufPool) -> Option<Storage> {
    let mut slices = Vec::with_capacity(xs.len());
    for x in xs {
        match x {
            Storage::F32(a) => slices.push(a.as_slice()?),
            _ => return None,
        }
    }
    let first = xs.first()?.shape();
    let rank = first.len();
    let joinable = axis < rank
        && xs.iter().all(|x| x.shape().len() == rank && (0..rank).all(|d| d == axis || x.shape()[d] == first[d]));
    let total: usize = slices.iter().map(|s| s.len()).sum();
    if !joinable || total < PARALLEL_VALUES {
        return None;
    }
    let outer: usize = first[..axis].iter().product();
    if outer < 2 || crate::threads::pool().is_none() {
        return None;
    }
    let mut dims = first.to_vec();
    dims[axis] = xs.iter().map(|x| x.shape()[axis]).sum();
    let row = total / outer;
    let mut out = output(&dims, pool);
    let values = out.as_slice_mut().expect("standard layout");
    // Outer index `o` is values `[o, o + 1) · row` of the output.
    crate::threads::for_each_part(values, row, PARALLEL_VALUES, &|start, dst| {
        let o0 = start / row;
        let mut at = 0;
        for o in o0..o0 + dst.len() / row {
            for s in &slices {
                let run = s.len() / outer;
                dst[at..at + run].copy_from_slice(&s[o * run..(o + 1) * run]);
                at += run;
            }
        }
    });
    Some(Storage::F32(out))
}
