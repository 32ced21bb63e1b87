//! `dropout` and `embedding`: the layers of a transformer that are not
//! products.
//!
//! Dropout is a composite (`tracejit.nn.dropout`) whose body is the plain
//! formula — a uniform draw of `x`'s shape from the generator's state,
//! `keep = u >= p`, `x * keep / (1 - p)` — and whose native kernel draws
//! the numbers in chunks while it writes the result, so no random tensor
//! is ever materialized (a compiled step's profile shows one kernel). Its
//! backward kernel is dropout again, of the cotangent, with the same state:
//! the same numbers, so the same mask, drawn again instead of kept.

use tracejit_kernels::philox::Stream;
use tracejit_kernels::{threads, Isa};
use tracejit_tensor::{DType, RandomDist, Storage};
use tracejit_trace::{Tensor, TensorSpec};

use crate::random::Generator;

/// The dropout body: `x * (u >= p) / (1 - p)` for `u` uniform in `[0, 1)`
/// drawn from `state` in `x`'s shape.
pub(crate) fn dropout_body(x: &Tensor, state: &Tensor, p: &Tensor) -> Tensor {
    let u = Tensor::random_like(RandomDist::Uniform { low: 0.0, high: 1.0 }, state, x, x.dtype());
    let keep = u.ge(p);
    let scale = (p * -1.0 + 1.0).reciprocal();
    let zero = Tensor::zeros(&[], x.dtype());
    Tensor::select(&keep, &(x * &scale), &zero)
}

/// `(x f32 or f64, state i64 [3], p of x's dtype, rank 0)`.
pub(crate) fn dropout_accepts(s: &[TensorSpec]) -> bool {
    s.len() == 3
        && matches!(s[0].dtype(), DType::F32 | DType::F64)
        && s[1].dtype() == DType::I64
        && s[1].dims() == [Some(3)]
        && s[2].dtype() == s[0].dtype()
        && s[2].dims().is_empty()
}

/// Elements a call needs before its chunks go to the pool (a dispatch
/// costs a few µs; a chunk of uniforms about 2).
const PARALLEL_LEN: usize = 16 * CHUNK;

/// Elements per chunk of uniforms: 16 KiB of f32, in L1 with the rows of x
/// and y being written.
const CHUNK: usize = 4096;

/// The native dropout: the body's arithmetic, element for element, with
/// the uniforms drawn chunk by chunk.
pub(crate) fn dropout_kernel(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    let x = inputs[0].to_standard();
    let stream = tracejit_tensor::kernels::philox_stream("dropout", &inputs[1]);
    let out = match (&x, &inputs[2]) {
        (Storage::F32(a), Storage::F32(p)) => {
            let p = *p.iter().next().expect("p is a scalar");
            let xs = a.as_slice().expect("standard layout");
            Storage::from_vec(drop_f32(xs, p, &stream, isa), x.shape())
        }
        (Storage::F64(a), Storage::F64(p)) => {
            let p = *p.iter().next().expect("p is a scalar");
            let xs = a.as_slice().expect("standard layout");
            Storage::from_vec(drop_f64(xs, p, &stream, isa), x.shape())
        }
        _ => panic!("dropout: the kernel takes f32 or f64 x and p of its dtype"),
    };
    vec![out.expect("the input's element count")]
}

fn drop_f32(xs: &[f32], p: f32, stream: &Stream, isa: Isa) -> Vec<f32> {
    drop_with(xs, p, 1.0 / (1.0 - p), &|at, u| stream.uniform_f32(at, u, isa))
}

fn drop_f64(xs: &[f64], p: f64, stream: &Stream, isa: Isa) -> Vec<f64> {
    drop_with(xs, p, 1.0 / (1.0 - p), &|at, u| stream.uniform_f64(at, u, isa))
}

/// `x` dropped at rate `p` (kept values times `scale`), chunk `c`'s
/// uniforms filled by `uniforms(c·CHUNK, ..)`: on the pool by parts of
/// whole chunks when large, so the same bits at any thread count.
fn drop_with<T>(xs: &[T], p: T, scale: T, uniforms: &(dyn Fn(u64, &mut [T]) + Sync)) -> Vec<T>
where
    T: Copy + Default + Send + Sync + PartialOrd + std::ops::Mul<Output = T>,
{
    let mut y = vec![T::default(); xs.len()];
    threads::for_each_part(&mut y, CHUNK, PARALLEL_LEN, &|start, part| {
        let mut u = vec![T::default(); CHUNK.min(part.len())];
        for (c, yc) in part.chunks_mut(CHUNK).enumerate() {
            let at = start + c * CHUNK;
            let u = &mut u[..yc.len()];
            uniforms(at as u64, u);
            for ((y, &x), &u) in yc.iter_mut().zip(&xs[at..]).zip(u.iter()) {
                *y = if u >= p { x * scale } else { T::default() };
            }
        }
    });
    y
}

/// The gradient of dropout: dropout of the cotangent with the same state
/// and rate (the same mask and scale); none for the state and the rate.
pub(crate) fn dropout_backward(inputs: &[Tensor], _outputs: &[Tensor], cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    let Some(g) = cts.first().cloned().flatten() else { return vec![None; 3] };
    let dx = crate::composites::DROPOUT.call(&[&g, &inputs[1], &inputs[2]], 0).swap_remove(0);
    vec![Some(dx), None, None]
}

/// Dropout (`tracejit.nn.dropout`): when `training`, each element of `x`
/// is zeroed with probability `p` and the others scaled by `1 / (1 - p)`,
/// the mask drawn from `g` (which advances: a compiled step drops other
/// elements on every call); the identity otherwise, or when `p` is 0. `p`
/// of 1 gives zeros. The composite's native kernel draws the mask while it
/// writes the result, so no random tensor is materialized.
///
/// ```
/// use tracejit_nn::random::Generator;
/// use tracejit_trace::{DType, Tensor};
///
/// let g = Generator::from_seed(0);
/// let x = Tensor::ones(&[1000], DType::F32);
/// let y = tracejit_nn::dropout(&x, 0.25, &g, true).to_vec::<f32>()?;
/// let kept = y.iter().filter(|&&v| v != 0.0).count();
/// assert!((650..850).contains(&kept) && y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
/// assert_eq!(tracejit_nn::dropout(&x, 0.25, &g, false).to_vec::<f32>()?, x.to_vec::<f32>()?);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// If `p` is not in `[0, 1]`, or `x` is not a float tensor.
#[track_caller]
pub fn dropout(x: &Tensor, p: f64, g: &Generator, training: bool) -> Tensor {
    assert!((0.0..=1.0).contains(&p), "dropout: the rate p must be in [0, 1], got {p}");
    assert!(x.dtype().is_float(), "dropout: x must be a float tensor, got {}", x.dtype());
    if !training || p == 0.0 {
        return x.clone();
    }
    if p == 1.0 {
        return x * 0.0;
    }
    let state = g.next_state();
    let rate = Tensor::full(&[], p, x.dtype());
    crate::composites::DROPOUT.call(&[x, &state, &rate], 0).swap_remove(0)
}

/// [`dropout`] of `x` as elements `offset..offset + len(x)` of a larger
/// tensor: the mask is that part of the mask [`dropout`] of the larger
/// tensor (row-major) would draw from `g`, and `g` advances as for one
/// draw. Each rank of a data-parallel step drops its rows of the global
/// batch exactly as one process dropping the whole batch would, so the
/// training curve does not depend on the number of ranks.
///
/// A draw's Philox blocks hold four f32 (two f64) uniforms, so `offset`
/// must be a multiple of 4 for f32 (2 for f64); it moves the state's low
/// counter word by `offset / 4` (`/ 2`), which never carries for a
/// generator made by [`Generator::from_seed`] (its low word is 0; draws
/// advance the high word).
///
/// ```
/// use tracejit_nn::random::Generator;
/// use tracejit_trace::{DType, Tensor};
///
/// let x = Tensor::ones(&[4, 6], DType::F32);
/// let whole = tracejit_nn::dropout(&x, 0.5, &Generator::from_seed(9), true).to_vec::<f32>()?;
/// let rows_2_3 = tracejit_nn::dropout_at(&x.slice_axis(0, 2, 4), 0.5, &Generator::from_seed(9), true, 12);
/// assert_eq!(rows_2_3.to_vec::<f32>()?, whole[12..]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Panics
/// As [`dropout`], and if `offset` is not a multiple of the uniforms per
/// block of `x`'s dtype.
#[track_caller]
pub fn dropout_at(x: &Tensor, p: f64, g: &Generator, training: bool, offset: u64) -> Tensor {
    assert!((0.0..=1.0).contains(&p), "dropout_at: the rate p must be in [0, 1], got {p}");
    assert!(x.dtype().is_float(), "dropout_at: x must be a float tensor, got {}", x.dtype());
    let per_block = if x.dtype() == DType::F64 { 2 } else { 4 };
    assert!(
        offset.is_multiple_of(per_block),
        "dropout_at: the offset must be a multiple of {per_block} for {} (uniforms per Philox block), got {offset}",
        x.dtype()
    );
    if !training || p == 0.0 {
        return x.clone();
    }
    if p == 1.0 {
        return x * 0.0;
    }
    let shift = Tensor::from_vec(vec![(offset / per_block) as i64, 0, 0], &[3]);
    let state = g.next_state() + shift;
    let rate = Tensor::full(&[], p, x.dtype());
    crate::composites::DROPOUT.call(&[x, &state, &rate], 0).swap_remove(0)
}

/// Rows of `table` (`[vocab, d]`) picked by integer `ids` (any shape):
/// `[..ids, d]`. Its gradient with respect to the table is a scatter-add
/// of the cotangent rows (duplicate ids summed), not a dense one-hot
/// product. A negative id counts from the end, as ONNX `Gather` and numpy
/// do (`-1` is the last row), so ids in `[-vocab, vocab)` are valid; an id
/// outside is an error naming it. Plain SGD on that gradient in
/// a compiled step subtracts the rows from the table's rows the ids name,
/// in place (the `sparse_update` passes; `ScheduleStats::sparse_updates`
/// counts it): the step costs the ids' rows, not the table. Adam and
/// momentum touch every row (their moments decay), so they stay dense.
///
/// ```
/// use tracejit_trace::{DType, Tensor};
///
/// let table = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[3, 2]);
/// let ids = Tensor::from_vec(vec![2i64, 0], &[2]);
/// assert_eq!(tracejit_nn::embedding(&table, &ids).to_vec::<f32>()?, [4.0, 5.0, 0.0, 1.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn embedding(table: &Tensor, ids: &Tensor) -> Tensor {
    assert!(table.rank() == 2, "embedding: the table must be [vocab, d], got rank {}", table.rank());
    table.gather(ids, 0)
}
