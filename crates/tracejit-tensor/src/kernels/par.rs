//! Large elementwise results and reductions filled on the thread pool.
//!
//! An eager op (and the interpreter) on a [1024, 1024] array is bound by
//! memory, and one core does not saturate it: PyTorch's eager softmax runs
//! twice as fast on two threads. The kernels here cut their output into
//! parts of whole rows and fill each on a pool thread
//! ([`tracejit_kernels::threads::for_each_part`], which runs on the calling
//! thread at a count of 1 or inside `serial`). Every output element is
//! computed from its own inputs in the same order as on one thread, so the
//! bits do not depend on the thread count.

use std::mem::MaybeUninit;
use std::ops::Range;

use tracejit_kernels::threads::for_each_part;

/// Output elements from which an elementwise kernel splits its work: below
/// this (256 KiB of f32) waking a worker costs more than it saves.
pub const PAR_MIN: usize = 1 << 16;

/// Elements of a part's unit of work when the output is cut at any element
/// (a flat map): a page's worth of f32, so parts stay cache- and
/// page-aligned.
pub(super) const FLAT_CHUNK: usize = 4096;

/// A new vector of `len` elements, `fill(start, part)` writing every
/// element of `part`, which holds elements `start..start + part.len()`:
/// parts are runs of whole `chunk`s (the last may be short) and run on the
/// pool when there are at least `min_len` elements.
///
/// # Safety
/// `fill` must initialize every element of the part it is given (the
/// kernels write their part through one zip of exactly its length): the
/// vector's length is set to `len` after the parts are filled.
pub unsafe fn collect<R: Copy + Send>(
    len: usize,
    chunk: usize,
    min_len: usize,
    fill: &(dyn Fn(usize, &mut [MaybeUninit<R>]) + Sync),
) -> Vec<R> {
    // Huge pages when large (`pages`): a fresh mapping, faulted in once.
    let mut v: Vec<R> = tracejit_kernels::pages::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    for_each_part(spare, chunk.max(1), min_len, fill);
    // SAFETY: the parts cover `[0, len)` and `fill` writes every element of
    // its part (see above); `R: Copy` has no drop to skip if it panicked,
    // and then this line is never reached.
    unsafe { v.set_len(len) };
    v
}

/// `f` of each element of `x`, in a new vector (on the pool when large).
pub(super) fn map_flat<T: Copy + Sync, R: Copy + Send>(x: &[T], f: impl Fn(T) -> R + Sync) -> Vec<R> {
    if x.len() < PAR_MIN {
        return x.iter().map(|&v| f(v)).collect();
    }
    // SAFETY: the zip writes every element of the part (`src` is as long).
    unsafe {
        collect(x.len(), FLAT_CHUNK, PAR_MIN, &|start, part: &mut [MaybeUninit<R>]| {
            let src = &x[start..start + part.len()];
            for (o, &i) in part.iter_mut().zip(src) {
                o.write(f(i));
            }
        })
    }
}

/// `f` of each pair of `x` and `y` (same length), in a new vector (on the
/// pool when large).
pub(super) fn zip_flat<A: Copy + Sync, B: Copy + Sync, R: Copy + Send>(
    x: &[A],
    y: &[B],
    f: impl Fn(A, B) -> R + Sync,
) -> Vec<R> {
    assert_eq!(x.len(), y.len(), "zip_flat of slices of different lengths");
    if x.len() < PAR_MIN {
        return x.iter().zip(y).map(|(&a, &b)| f(a, b)).collect();
    }
    // SAFETY: the zip writes every element of the part (both inputs are
    // as long).
    unsafe {
        collect(x.len(), FLAT_CHUNK, PAR_MIN, &|start, part: &mut [MaybeUninit<R>]| {
            let end = start + part.len();
            for (o, (&a, &b)) in part.iter_mut().zip(x[start..end].iter().zip(&y[start..end])) {
                o.write(f(a, b));
            }
        })
    }
}

/// Fills the part of an output holding a range of first-axis indices.
pub(super) type FillIndices<'a, R> = dyn Fn(Range<usize>, &mut [MaybeUninit<R>]) + Sync + 'a;

/// A new row-major array of `shape` (rank at least 1) in parts of whole
/// indices of its first axis: `fill(range, part)` writes the elements
/// whose first index lies in `range` (each part, on the pool when there
/// are at least [`PAR_MIN`] elements). An array of rank 1 is cut at any
/// element.
pub(super) fn collect_axis0<R: Copy + Send>(shape: &[usize], fill: &FillIndices<'_, R>) -> Vec<R> {
    let len: usize = shape.iter().product();
    if len == 0 {
        return Vec::new();
    }
    // Elements per index of the first axis (1 at rank 1).
    let per: usize = shape[1..].iter().product();
    // SAFETY: parts are whole first-axis indices (`per` elements each), and
    // `fill` writes every element of the indices it is given (its contract).
    unsafe { collect(len, per, PAR_MIN, &|start, part| fill(start / per..(start + part.len()) / per, part)) }
}

#[cfg(test)]
mod tests {
    //! The kernels that split their output give the same bits at one, two
    //! and three threads, and really split: on large odd shapes, with
    //! broadcasting, non-contiguous inputs and NaN/inf among the values.

    use proptest::prelude::*;
    use tracejit_kernels::threads::pool_dispatches;
    use tracejit_kernels::Target;

    use crate::kernels::{binary, reduce, select, unary};
    use crate::{BinaryOp, ReduceOp, Storage, UnaryOp};

    /// `f` at `threads` threads, and whether it split across the pool.
    fn on(threads: usize, f: &dyn Fn() -> Storage) -> (Storage, bool) {
        Target::host().with_threads(threads).enter(|| {
            let before = pool_dispatches();
            let out = f();
            (out, pool_dispatches() > before)
        })
    }

    /// Same bits at 1, 2 and 3 threads; split at 2 and 3 when `large`.
    fn agree(large: bool, f: &dyn Fn() -> Storage) -> Result<(), TestCaseError> {
        let (one, split) = on(1, f);
        prop_assert!(!split, "one thread never dispatches");
        for threads in [2, 3] {
            let (many, split) = on(threads, f);
            prop_assert!(one.bit_eq(&many), "{threads} threads changed the bits");
            prop_assert_eq!(split, large, "split at {} threads", threads);
        }
        Ok(())
    }

    /// Values with NaN, ±inf, ±0 and ties among them.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
                match h % 97 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => -0.0,
                    4 => 0.0,
                    _ => ((h >> 20) % 4001) as f32 / 100.0 - 20.0,
                }
            })
            .collect()
    }

    fn array(shape: &[usize], seed: u64) -> Storage {
        Storage::from_vec(values(shape.iter().product(), seed), shape).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn elementwise_and_reductions_split_without_changing_bits(
            rows in prop_oneof![1 => Just(1usize), 1 => 2usize..40, 3 => 250usize..700],
            cols in prop_oneof![1 => Just(1usize), 1 => 8usize..40, 3 => 250usize..700],
            seed in any::<u64>(),
            transpose in any::<bool>(),
        ) {
            let x = array(&[rows, cols], seed);
            let y = array(&[rows, cols], seed ^ 1);
            // A transposed view takes the strided paths; a row and a column
            // broadcast against the matrix.
            let x = if transpose { crate::kernels::transpose(&x, &[1, 0]) } else { x };
            let shape = x.shape().to_vec();
            let y = crate::kernels::reshape(&y, &shape);
            let row = array(&[1, shape[1]], seed ^ 2);
            let col = array(&[shape[0], 1], seed ^ 3);
            let large = rows * cols >= super::PAR_MIN;
            let contiguous_large = large && !transpose;
            agree(contiguous_large, &|| unary(UnaryOp::Exp, &x))?;
            agree(contiguous_large, &|| unary(UnaryOp::IsNan, &x))?;
            agree(large && (!transpose || shape[1] >= 8), &|| binary(BinaryOp::Sub, &x, &y))?;
            agree(large && shape[1] >= 8, &|| binary(BinaryOp::Div, &x, &col))?;
            agree(large && shape[1] >= 8, &|| binary(BinaryOp::Maximum, &row, &x))?;
            let cond = binary(BinaryOp::Gt, &x, &row);
            agree(large && shape[1] >= 8, &|| select(&cond, &x, &col))?;
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean, ReduceOp::Prod] {
                // Rows of a contiguous matrix split; a column reduction
                // (one block of outer axes) never does.
                let rows_split = contiguous_large && shape[0] > 8.max(super::FLAT_CHUNK / shape[1]);
                agree(rows_split, &|| reduce(op, &x, &[1], false))?;
                agree(false, &|| reduce(op, &x, &[0], true))?;
            }
        }
    }
}
