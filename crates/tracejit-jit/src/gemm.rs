//! Matrix products for the executor: f32 and f64 through a fast GEMM, with
//! numpy broadcasting of batch axes and arbitrary (view) strides; integer
//! products through the reference kernel.
//!
//! Why the `gemm` crate: measured against `matrixmultiply` on the MLP
//! shapes (64×784×512, 64×512×512, 64×512×10) single-threaded, it was
//! faster on every one, by 1.8x on the thin 64×512×10 (the measurement and
//! its figures are in the git history of this file). Results match the
//! reference kernel (a blocked GEMM of its own) within the usual
//! `k·ε·Σ|aᵢbᵢ|` bound, not bit for bit. f32 products pick the crate's
//! 16-lane (AVX-512F) or 8-lane (AVX2) kernels per product, by operand
//! layout (`tracejit_kernels::gemm`); f64 products take the crate's own choice.

use ndarray::{ArcArray, Axis, IxDyn};
use tracejit_ir::tensor::{kernels, DType, Storage};
use tracejit_kernels::gemm::{product, GemmFloat};
use tracejit_kernels::{pages, Isa};

use crate::region::BufPool;

/// Element types the fast path handles: the kernels' [`GemmFloat`]s, as
/// storages.
trait GemmScalar: GemmFloat {
    /// The dtype of `Self`.
    const DTYPE: DType;
    /// The array inside `s`, if it holds `Self`.
    fn from_storage(s: Storage) -> Option<ArcArray<Self, IxDyn>>;
    /// Wraps an array.
    fn into_storage(a: ArcArray<Self, IxDyn>) -> Storage;
}

macro_rules! gemm_scalar {
    ($t:ty, $v:ident) => {
        impl GemmScalar for $t {
            const DTYPE: DType = DType::$v;
            fn from_storage(s: Storage) -> Option<ArcArray<Self, IxDyn>> {
                match s {
                    Storage::$v(a) => Some(a),
                    _ => None,
                }
            }
            fn into_storage(a: ArcArray<Self, IxDyn>) -> Storage {
                Storage::$v(a)
            }
        }
    };
}
gemm_scalar!(f32, F32);
gemm_scalar!(f64, F64);

/// Rows `rows` of the 2-D product `a · b` (both f32 or both f64) into
/// `out`, computed on the calling thread as one product of those rows
/// ([`crate::threads::serial`]); false (nothing written) for other
/// dtypes or ranks.
///
/// # Safety
/// `out` is the element pointer of a standard-layout `[m, n]` buffer of
/// the operands' dtype that aliases neither operand, and `rows` lies in
/// `0..m`; concurrent calls take disjoint rows.
pub(crate) unsafe fn product_rows(isa: Isa, a: &Storage, b: &Storage, out: i64, rows: std::ops::Range<usize>) -> bool {
    fn go<T: GemmScalar>(
        isa: Isa,
        x: &ArcArray<T, IxDyn>,
        y: &ArcArray<T, IxDyn>,
        out: i64,
        rows: std::ops::Range<usize>,
    ) -> bool {
        let (&[m, k], &[k2, n]) = (x.shape(), y.shape()) else { return false };
        if k != k2 || rows.end > m {
            return false;
        }
        if rows.is_empty() || k == 0 || n == 0 {
            // An empty sum is zero (the buffer may hold old values).
            for r in rows {
                // SAFETY: the caller's contract: row `r` of the output.
                unsafe { std::slice::from_raw_parts_mut((out as *mut T).add(r * n), n) }.fill(T::default());
            }
            return true;
        }
        let (sx, sy) = (x.strides(), y.strides());
        let r0 = rows.start as isize;
        // The rows are part of a product of at least 16 (`epilogue_rows`),
        // which never runs as dot products: a half of 8 rows through
        // `[out, in]` weights would (and round otherwise).
        // SAFETY: the caller's contract; the rows' part of `x` and of the
        // output lie inside their buffers.
        tracejit_kernels::gemm::without_dot_products(|| {
            crate::threads::serial(|| unsafe {
                product::<T>(
                    isa,
                    rows.len(),
                    k,
                    n,
                    x.as_ptr().offset(r0 * sx[0]),
                    sx[0],
                    sx[1],
                    y.as_ptr(),
                    sy[0],
                    sy[1],
                    (out as *mut T).add(rows.start * n),
                    n as isize,
                    1,
                    false,
                )
            })
        });
        true
    }
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => go(isa, x, y, out, rows),
        (Storage::F64(x), Storage::F64(y)) => go(isa, x, y, out, rows),
        _ => false,
    }
}

/// Matrix product of the last two axes (batch axes broadcast, numpy rules),
/// through a fast GEMM for f32/f64 and the reference kernel otherwise. Panics
/// like the reference kernel on operands it rejects. The output is a fresh
/// buffer; [`matmul_reusing`] writes into an old one.
pub fn matmul(a: &Storage, b: &Storage) -> Storage {
    matmul_with(tracejit_kernels::Isa::current(), a, b, &mut |_, _| None)
}

/// [`matmul`], writing into `reuse`'s buffer when nothing else holds it and
/// it has the result's dtype and element count (else into a fresh buffer).
/// For callers that run the same product again and again (the benchmark's
/// GEMM floor), so that no call takes fresh pages.
pub fn matmul_reusing(a: &Storage, b: &Storage, reuse: Option<Storage>) -> Storage {
    let mut reuse = reuse;
    matmul_with(tracejit_kernels::Isa::current(), a, b, &mut |dtype, shape| {
        let mut pool = BufPool::default();
        pool.give_if_unique(reuse.take()?);
        pool.take(dtype, shape)
    })
}

/// [`matmul`] with the f32/f64 output buffer from `take(dtype, shape)` when
/// it offers one (the executor's buffer pool: a steady-state call allocates
/// no intermediate). An offered buffer must be unique; its contents are
/// overwritten.
pub(crate) fn matmul_with(
    isa: Isa,
    a: &Storage,
    b: &Storage,
    take: &mut dyn FnMut(DType, &[usize]) -> Option<Storage>,
) -> Storage {
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => batched(isa, x, y, take).unwrap_or_else(|| kernels::matmul(a, b)),
        (Storage::F64(x), Storage::F64(y)) => batched(isa, x, y, take).unwrap_or_else(|| kernels::matmul(a, b)),
        _ => kernels::matmul(a, b),
    }
}

/// The product, or `None` when the shapes are invalid (the reference kernel
/// then reports the error).
fn batched<T: GemmScalar>(
    isa: Isa,
    a: &ArcArray<T, IxDyn>,
    b: &ArcArray<T, IxDyn>,
    take: &mut dyn FnMut(DType, &[usize]) -> Option<Storage>,
) -> Option<Storage> {
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() < 2 || sb.len() < 2 {
        return None;
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return None;
    }
    let batch = kernels::broadcast_shapes(&sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
    let full = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    let av = a.broadcast(IxDyn(&full([m, k])))?;
    let bv = b.broadcast(IxDyn(&full([k, n])))?;
    let out_shape = full([m, n]);
    let mut out: ArcArray<T, IxDyn> = match take(T::DTYPE, &out_shape).and_then(T::from_storage) {
        Some(buf) if crate::region::same_shape(buf.shape(), &out_shape) && buf.is_standard_layout() => buf,
        // Zeros from `calloc`, huge pages when large (`pages`): the
        // product writes every element, so a fresh mapping is faulted in
        // once, by the product.
        _ => ArcArray::from_shape_vec(IxDyn(&out_shape), pages::zeros(out_shape.iter().product()))
            .expect("a vector of the shape's element count"),
    };
    if m == 0 || n == 0 || k == 0 {
        // A reused buffer holds old values; an empty sum is zero.
        out.fill(T::default());
        return Some(T::into_storage(out));
    }
    if sb.len() == 2 && sa.len() > 2 && a.is_standard_layout() && count_rows(sa) > 0 {
        // A stack of matrices times one matrix (a sequence's input
        // projection): one GEMM of all the rows, which runs far faster
        // than a small GEMM per matrix.
        let rows = count_rows(sa);
        let (sb0, sb1) = (b.strides()[0], b.strides()[1]);
        // SAFETY: `a` is contiguous, `rows×k` with row stride k; `b` is a
        // `k×n` view with its own strides; `out` is a fresh or unique
        // standard-layout `rows×n` buffer.
        unsafe {
            product::<T>(
                isa,
                rows,
                k,
                n,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                sb0,
                sb1,
                out.as_mut_ptr(),
                n as isize,
                1,
                false,
            )
        };
        return Some(T::into_storage(out));
    }
    let count: usize = batch.iter().product();
    // Each matrix's operands: their first elements (as addresses, shared
    // with pool threads) and the strides every one of them has. The output
    // is standard layout: matrix `i` starts `i·m·n` elements in, from one
    // pointer taken once.
    let mut firsts: Vec<[usize; 2]> = Vec::with_capacity(count);
    let mut strides = [0isize; 4];
    let mut idx = vec![0usize; batch.len()];
    for _ in 0..count {
        let mut pa = av.view();
        let mut pb = bv.view();
        for &i in &idx {
            pa = pa.index_axis_move(Axis(0), i);
            pb = pb.index_axis_move(Axis(0), i);
        }
        let (sa, sb) = (pa.strides(), pb.strides());
        strides = [sa[0], sa[1], sb[0], sb[1]];
        firsts.push([pa.as_ptr() as usize, pb.as_ptr() as usize]);
        for d in (0..batch.len()).rev() {
            idx[d] += 1;
            if idx[d] < batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let [rsa, csa, rsb, csb] = strides;
    let c = out.as_mut_ptr() as usize;
    let one = |i: usize| {
        let [pa, pb] = firsts[i];
        // SAFETY: the addresses and strides describe the m×k and k×n
        // matrices of the views above; `out` is a unique standard-layout
        // [.., m, n] buffer that aliases neither operand, matrix `i` its
        // `i·m·n..(i+1)·m·n` elements, so matrices write disjoint parts.
        unsafe {
            product::<T>(
                isa,
                m,
                k,
                n,
                pa as *const T,
                rsa,
                csa,
                pb as *const T,
                rsb,
                csb,
                (c as *mut T).add(i * m * n),
                n as isize,
                1,
                false,
            )
        }
    };
    // Products too small to split themselves (a per-example gradient's
    // outer products, [784, 1] by [1, 512]) split the batch instead when
    // together they are large: whole matrices per thread, each computed
    // by the one call it gets on one thread, so the bits do not change.
    let work = m.saturating_mul(k).saturating_mul(n);
    let threshold = crate::threads::gemm_threshold();
    let pool = if count > 1 && work < threshold && work.saturating_mul(count) >= threshold {
        crate::threads::pool()
    } else {
        None
    };
    match pool {
        Some(pool) => {
            let parts = pool.threads().min(count);
            let per = count.div_ceil(parts);
            pool.run(parts, &|t| {
                let mine = (t * per).min(count)..((t + 1) * per).min(count);
                crate::threads::serial(|| mine.for_each(&one));
            });
        }
        None => (0..count).for_each(one),
    }
    Some(T::into_storage(out))
}

/// The rows of a stack of matrices of shape `shape` (every axis but the
/// last).
fn count_rows(shape: &[usize]) -> usize {
    shape[..shape.len() - 1].iter().product()
}
