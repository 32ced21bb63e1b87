//! Reductions over a run of adjacent axes of a contiguous array, folded in
//! place in the reference's order, without the copy `reduce` otherwise
//! makes.
//!
//! The reference folds each output's elements one after the other (its
//! documented accumulation order). Done one output at a time that is a
//! chain of dependent adds, one per 4 cycles, and the general path first
//! copies the input with the reduced axes moved last: a softmax's row max
//! over [1024, 1024] took 4.5 ms and a column sum 6.6 ms. Both shapes keep
//! the order here and still run many independent chains at once:
//!
//! - reduced axes last (a row reduction): sixteen rows fold side by side,
//!   each in its own accumulator (f32 sums and products in the lanes of
//!   AVX registers, [`super::fold_rows_f32`]); a row's max or min, which has the same
//!   value in any order, is found in vector lanes, and only the rows
//!   whose bits could depend on the order (a NaN, a zero extreme) fold
//!   again in order;
//! - kept axes after the reduced ones (a column reduction, the bias
//!   gradient's sum over the batch): each reduced row is combined into a
//!   vector of accumulators, element by element, which the compiler
//!   vectorizes.
//!
//! Every output sees its elements in the same order as the reference's
//! fold, so the bits are the same.

use super::fold_rows_f32::{self, Combine};
use super::num::Num;
use super::par;
use crate::ReduceOp;

/// Where a fold starts: the accumulator before a run's element `.1`, for
/// a run whose first element is `first` (`T::ZERO`/`T::ONE` before the
/// first element, or the first element itself for max and min, which have
/// no identity).
fn start<T: Copy>(identity: Option<T>, first: T) -> (T, usize) {
    match identity {
        Some(id) => (id, 0),
        None => (first, 1),
    }
}

/// The reduction `op` of a standard-layout array of `shape` (elements
/// `flat`) over the adjacent axes `axes`, one value per kept position in
/// row-major order; `None` when `axes` are not adjacent or the shapes are
/// empty (the general path handles those).
pub(super) fn reduce_adjacent<T: Num>(op: ReduceOp, flat: &[T], shape: &[usize], axes: &[usize]) -> Option<Vec<T>> {
    let (&first, &last) = (axes.first()?, axes.last()?);
    if last - first + 1 != axes.len() {
        return None;
    }
    let outer: usize = shape[..first].iter().product();
    let n: usize = shape[first..=last].iter().product();
    let inner: usize = shape[last + 1..].iter().product();
    if outer == 0 || n == 0 || inner == 0 {
        return None;
    }
    // Blocks of the outer axes are independent: large reductions fill
    // runs of them on the pool, each output folded in the same order.
    let per_part = (ROWS * inner).max(par::FLAT_CHUNK / n);
    let min_len = if flat.len() >= par::PAR_MIN { 0 } else { usize::MAX };
    // SAFETY: parts are whole blocks of `inner` outputs, and
    // `reduce_blocks` gives one value per output of its blocks, written by
    // the zip.
    Some(unsafe {
        par::collect(outer * inner, per_part.next_multiple_of(inner), min_len, &|start, part| {
            let blocks = &flat[start * n..(start + part.len()) * n];
            for (o, v) in part.iter_mut().zip(reduce_blocks(op, blocks, n, inner)) {
                o.write(v);
            }
        })
    })
}

/// [`reduce_adjacent`] of whole blocks of `n × inner` elements.
fn reduce_blocks<T: Num>(op: ReduceOp, flat: &[T], n: usize, inner: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(flat.len() / n);
    // f32 row sums and products: eight rows to a vector register, same bits.
    let simd = inner == 1
        && match op {
            ReduceOp::Sum | ReduceOp::Mean => fold_rows_f32::fold_rows(Combine::Add, 0.0, flat, n, &mut out),
            ReduceOp::Prod => fold_rows_f32::fold_rows(Combine::Mul, 1.0, flat, n, &mut out),
            ReduceOp::Max | ReduceOp::Min => false,
        };
    // One instance per op, so that the step is inlined and vectorized (a
    // function pointer would block both).
    match op {
        _ if simd => {}
        ReduceOp::Sum | ReduceOp::Mean => fold_all(Some(T::ZERO), T::plus, flat, n, inner, &mut out),
        ReduceOp::Prod => fold_all(Some(T::ONE), T::times, flat, n, inner, &mut out),
        ReduceOp::Max if inner == 1 => {
            out.extend(flat.chunks_exact(n).map(|row| extreme(row, |x, best| x > best, T::nan_max)))
        }
        ReduceOp::Min if inner == 1 => {
            out.extend(flat.chunks_exact(n).map(|row| extreme(row, |x, best| x < best, T::nan_min)))
        }
        ReduceOp::Max => fold_all(None, T::nan_max, flat, n, inner, &mut out),
        ReduceOp::Min => fold_all(None, T::nan_min, flat, n, inner, &mut out),
    }
    if op == ReduceOp::Mean {
        let count = T::from_f64(n as f64);
        out.iter_mut().for_each(|v| *v = v.divide(count));
    }
    out
}

/// Folds `flat`, blocks of `n` rows of `inner` elements, into `out`.
fn fold_all<T: Num>(
    identity: Option<T>,
    step: impl Fn(T, T) -> T + Copy,
    flat: &[T],
    n: usize,
    inner: usize,
    out: &mut Vec<T>,
) {
    if inner == 1 {
        fold_rows(identity, step, flat, n, out);
    } else {
        for block in flat.chunks_exact(n * inner) {
            fold_columns(identity, step, block, inner, out);
        }
    }
}

/// Lanes of [`extreme`]'s vector of partial results.
const LANES: usize = 16;

/// A row's max (`beats`: `>`) or min (`<`) with the bits of the
/// reference's sequential fold (`step`: `nan_max` / `nan_min`), found
/// with [`LANES`] partial results the compiler vectorizes.
///
/// The extreme value does not depend on the order; the reference's bits
/// do only where equal values differ in bits or a NaN decides: it keeps
/// the first of tied `-0.0` and `+0.0`, and the first NaN. So a row whose
/// extreme is zero or that holds a NaN (which `beats` never picks) is
/// folded again sequentially, and every other row's extreme is the one
/// value the sequential fold returns.
fn extreme<T: Num>(row: &[T], beats: impl Fn(T, T) -> bool, step: impl Fn(T, T) -> T) -> T {
    let sequential = || row[1..].iter().fold(row[0], |a, &x| step(a, x));
    let mut best = [row[0]; LANES];
    let mut nan = false;
    let mut pieces = row.chunks_exact(LANES);
    for piece in &mut pieces {
        for (b, &x) in best.iter_mut().zip(piece) {
            nan |= x.is_nan_value();
            *b = std::hint::select_unpredictable(beats(x, *b), x, *b);
        }
    }
    for &x in pieces.remainder() {
        nan |= x.is_nan_value();
        best[0] = std::hint::select_unpredictable(beats(x, best[0]), x, best[0]);
    }
    let found = best[1..].iter().fold(best[0], |a, &x| if beats(x, a) { x } else { a });
    if nan || found == T::ZERO {
        return sequential();
    }
    found
}

/// Rows the row fold runs side by side: enough independent chains to hide
/// an add's latency behind the loads (16 summed a [1024, 1024] f32 array's
/// rows in 456 µs on the Xeon, 8 in 510).
const ROWS: usize = 16;

/// Folds each `n`-element row of `flat` into one value, appended to `out`.
fn fold_rows<T: Num>(identity: Option<T>, step: impl Fn(T, T) -> T, flat: &[T], n: usize, out: &mut Vec<T>) {
    let mut groups = flat.chunks_exact(ROWS * n);
    for group in &mut groups {
        let rows: [&[T]; ROWS] = std::array::from_fn(|i| &group[i * n..(i + 1) * n]);
        let mut acc: [T; ROWS] = std::array::from_fn(|i| start(identity, rows[i][0]).0);
        let from = start(identity, rows[0][0]).1;
        for k in from..n {
            for (a, row) in acc.iter_mut().zip(&rows) {
                *a = step(*a, row[k]);
            }
        }
        out.extend(acc);
    }
    for row in groups.remainder().chunks_exact(n) {
        let (acc, from) = start(identity, row[0]);
        out.push(row[from..].iter().fold(acc, |a, &x| step(a, x)));
    }
}

/// Folds the `n` rows of `block` (each `inner` wide) element by element:
/// output `j` is the fold of `block[j], block[inner + j], ...`, in that
/// order; the `inner` values are appended to `out`.
fn fold_columns<T: Num>(identity: Option<T>, step: impl Fn(T, T) -> T, block: &[T], inner: usize, out: &mut Vec<T>) {
    let begin = out.len();
    let mut rows = block.chunks_exact(inner);
    match identity {
        Some(id) => out.resize(begin + inner, id),
        None => out.extend_from_slice(rows.next().expect("a block holds at least one row")),
    }
    let acc = &mut out[begin..];
    for row in rows {
        for (a, &x) in acc.iter_mut().zip(row) {
            *a = step(*a, x);
        }
    }
}
