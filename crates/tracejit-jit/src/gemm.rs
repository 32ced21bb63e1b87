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
//! layout ([`micro`]); f64 products take the crate's own choice.

use ndarray::{ArcArray, ArrayView2, Axis, IxDyn};
use tracejit_ir::tensor::{kernels, DType, Storage};

use crate::region::BufPool;

pub(crate) mod micro;
mod transpose;

/// Element types the fast path handles.
trait GemmScalar: Copy + Default + 'static {
    /// The dtype of `Self`.
    const DTYPE: DType;
    /// The array inside `s`, if it holds `Self`.
    fn from_storage(s: Storage) -> Option<ArcArray<Self, IxDyn>>;
    /// Wraps an array.
    fn into_storage(a: ArcArray<Self, IxDyn>) -> Storage;
    /// `C = A·B` (or `C += A·B` with `accumulate`) for strided row/column
    /// views (strides in elements).
    ///
    /// # Safety
    /// Pointers and strides must describe valid `m×k`, `k×n` and `m×n`
    /// matrices, `c` not aliasing the others.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        c: *mut Self,
        rsc: isize,
        csc: isize,
        accumulate: bool,
    );
}

macro_rules! gemm_scalar {
    ($t:ty, $v:ident, $run:ident) => {
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
            unsafe fn product(
                m: usize,
                k: usize,
                n: usize,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                c: *mut Self,
                rsc: isize,
                csc: isize,
                accumulate: bool,
            ) {
                let (a, b, c) = (SendPtr(a as *mut Self), SendPtr(b as *mut Self), SendPtr(c));
                crate::threads::run_gemm_blocks(m, n, k, &|rows, cols| {
                    let (r0, c0) = (rows.start as isize, cols.start as isize);
                    // SAFETY: forwarded from the caller; the block's rows of
                    // `a`, columns of `b` and part of `c` lie inside the
                    // matrices, and blocks write disjoint parts of `c`. gemm
                    // takes (column, row) strides and computes
                    // dst = alpha·dst + beta·(lhs·rhs).
                    unsafe {
                        micro::Product {
                            m: rows.len(),
                            n: cols.len(),
                            k,
                            dst: c.get().offset(r0 * rsc + c0 * csc),
                            dst_cs: csc,
                            dst_rs: rsc,
                            read_dst: accumulate,
                            lhs: a.get().offset(r0 * rsa),
                            lhs_cs: csa,
                            lhs_rs: rsa,
                            rhs: b.get().offset(c0 * csb),
                            rhs_cs: csb,
                            rhs_rs: rsb,
                            alpha: if accumulate { 1.0 } else { 0.0 },
                            beta: 1.0,
                        }
                        .$run()
                    }
                })
            }
        }
    };
}
/// A pointer shared with the pool's workers (the caller waits for them).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: the pointee outlives the call that waits for the blocks, and
// blocks write disjoint parts of the output.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above; workers only read `a`, `b` and write their own block.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> *mut T {
        self.0
    }
}

// f32 chooses its kernels per product; f64 takes the crate's choice.
gemm_scalar!(f32, F32, run);
gemm_scalar!(f64, F64, run_crate);

/// `c += a · b` with `a [m, k]` and `b [k, n]` views (any strides, negative
/// too) and
/// `c [m, n]` row-major and contiguous: the GEMM of [`matmul`], with its
/// blocks and threads ([`crate::threads::run_gemm_blocks`]), for kernels
/// that pre-fill `c` (a bias) and accumulate into it.
///
/// ```
/// use ndarray::array;
///
/// let (a, b) = (array![[1.0f32, 2.0]], array![[3.0f32], [4.0]]);
/// let mut c = [10.0f32];
/// tracejit_jit::gemm_acc_f32(a.view(), b.view(), &mut c);
/// assert_eq!(c, [21.0]);
/// ```
///
/// # Panics
/// If the inner dims differ or `c` does not hold `m · n` values.
pub fn gemm_acc_f32(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: &mut [f32]) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(k == k2 && c.len() == m * n, "gemm_acc_f32: shapes [{m}, {k}] x [{k2}, {n}] into {}", c.len());
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (sa, sb) = (a.strides(), b.strides());
    // SAFETY: the views describe m×k and k×n matrices with these strides;
    // `c` is a unique, contiguous m×n buffer that aliases neither.
    unsafe {
        <f32 as GemmScalar>::product(
            m,
            k,
            n,
            a.as_ptr(),
            sa[0],
            sa[1],
            b.as_ptr(),
            sb[0],
            sb[1],
            c.as_mut_ptr(),
            n as isize,
            1,
            true,
        )
    }
}

/// Rows `rows` of the 2-D product `a · b` (both f32 or both f64) into
/// `out`, computed on the calling thread as one product of those rows
/// ([`crate::threads::serial`]); false (nothing written) for other
/// dtypes or ranks.
///
/// # Safety
/// `out` is the element pointer of a standard-layout `[m, n]` buffer of
/// the operands' dtype that aliases neither operand, and `rows` lies in
/// `0..m`; concurrent calls take disjoint rows.
pub(crate) unsafe fn product_rows(a: &Storage, b: &Storage, out: i64, rows: std::ops::Range<usize>) -> bool {
    fn go<T: GemmScalar>(
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
        // SAFETY: the caller's contract; the rows' part of `x` and of the
        // output lie inside their buffers.
        crate::threads::serial(|| unsafe {
            T::product(
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
        });
        true
    }
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => go(x, y, out, rows),
        (Storage::F64(x), Storage::F64(y)) => go(x, y, out, rows),
        _ => false,
    }
}

/// Matrix product of the last two axes (batch axes broadcast, numpy rules),
/// through a fast GEMM for f32/f64 and the reference kernel otherwise. Panics
/// like the reference kernel on operands it rejects. The output is a fresh
/// buffer; [`matmul_reusing`] writes into an old one.
pub fn matmul(a: &Storage, b: &Storage) -> Storage {
    matmul_with(a, b, &mut |_, _| None)
}

/// [`matmul`], writing into `reuse`'s buffer when nothing else holds it and
/// it has the result's dtype and element count (else into a fresh buffer).
/// For callers that run the same product again and again (the benchmark's
/// GEMM floor), so that no call takes fresh pages.
pub fn matmul_reusing(a: &Storage, b: &Storage, reuse: Option<Storage>) -> Storage {
    let mut reuse = reuse;
    matmul_with(a, b, &mut |dtype, shape| {
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
    a: &Storage,
    b: &Storage,
    take: &mut dyn FnMut(DType, &[usize]) -> Option<Storage>,
) -> Storage {
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => batched(x, y, take).unwrap_or_else(|| kernels::matmul(a, b)),
        (Storage::F64(x), Storage::F64(y)) => batched(x, y, take).unwrap_or_else(|| kernels::matmul(a, b)),
        _ => kernels::matmul(a, b),
    }
}

/// The product, or `None` when the shapes are invalid (the reference kernel
/// then reports the error).
fn batched<T: GemmScalar>(
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
        _ => ArcArray::default(IxDyn(&out_shape)),
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
            T::product(
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
    let nb = batch.len();
    let count: usize = batch.iter().product();
    let mut idx = vec![0usize; nb];
    for _ in 0..count {
        let mut pa = av.view();
        let mut pb = bv.view();
        let mut pc = out.view_mut();
        for &i in &idx {
            pa = pa.index_axis_move(Axis(0), i);
            pb = pb.index_axis_move(Axis(0), i);
            pc = pc.index_axis_move(Axis(0), i);
        }
        let (sa, sb, sc) = (pa.strides(), pb.strides(), pc.strides());
        let (rsa, csa, rsb, csb, rsc, csc) = (sa[0], sa[1], sb[0], sb[1], sc[0], sc[1]);
        // SAFETY: the views describe m×k, k×n and m×n matrices with these
        // strides; the output is unique to this call and does not alias.
        unsafe { T::product(m, k, n, pa.as_ptr(), rsa, csa, pb.as_ptr(), rsb, csb, pc.as_mut_ptr(), rsc, csc, false) };
        for d in (0..nb).rev() {
            idx[d] += 1;
            if idx[d] < batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some(T::into_storage(out))
}

/// The rows of a stack of matrices of shape `shape` (every axis but the
/// last).
fn count_rows(shape: &[usize]) -> usize {
    shape[..shape.len() - 1].iter().product()
}
