//! f32 and f64 products of strided matrices: the GEMM of the JIT's
//! executor and of the composite kernels, one implementation.
//!
//! A product is cut into output blocks fixed by its sizes
//! ([`crate::threads::run_gemm_blocks`]), each one single-threaded call of
//! the `gemm` crate's driver; f32 blocks pick the crate's 16-lane
//! (AVX-512F) or 8-lane (AVX2) micro-kernels by operand layout
//! ([`micro`]), or a batch of at most 8 rows through `[out, in]` weights
//! runs as dot products (`dots`); f64 blocks take the crate's own choice.
//! Results match a
//! plain triple loop within the usual `k·ε·Σ|aᵢbᵢ|` bound and keep their
//! bits for every thread count.

use ndarray::ArrayView2;

use crate::Isa;

#[cfg(target_arch = "x86_64")]
mod dots;
mod micro;
mod transpose;

/// The most rows (of `x` in `x · wᵀ`, the weights `w` stored `[out, in]`)
/// of an f32 product that runs as dot products (`dots`), whose sums round
/// otherwise than the other paths'.
pub const DOT_ROWS: usize = 8;

thread_local! {
    /// How many [`without_dot_products`] calls this thread is inside.
    static NO_DOTS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with no product on this thread taking the dot-product path
/// (every product rounds as it would with more than [`DOT_ROWS`] rows):
/// for a caller that cuts a product's rows into blocks and needs the
/// whole's bits, as the JIT runs a loop by blocks of its batch rows on
/// some thread counts and whole on others.
///
/// ```
/// let inside = tracejit_kernels::gemm::without_dot_products(|| 42);
/// assert_eq!(inside, 42);
/// ```
pub fn without_dot_products<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            NO_DOTS.with(|d| d.set(d.get() - 1));
        }
    }
    NO_DOTS.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    f()
}

/// Whether products on this thread may take the dot-product path.
fn dots_allowed() -> bool {
    NO_DOTS.with(|d| d.get() == 0)
}

/// The element types of [`product`]: f32 and f64.
pub trait GemmFloat: Copy + Default + Send + Sync + 'static {
    /// `C = A·B` (or `C += A·B` with `accumulate`) for strided row/column
    /// views (strides in elements) on the calling thread, with the
    /// micro-kernels `isa` allows. `whole` is `[m, n]` of the product this
    /// block is part of (the block's own `[m, n]` when it is the whole):
    /// layout choices depend on it, never on the block, so that results
    /// keep their bits whatever the thread count.
    ///
    /// # Safety
    /// Pointers and strides must describe valid `m×k`, `k×n` and `m×n`
    /// matrices, `c` not aliasing the others.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        isa: Isa,
        whole: [usize; 2],
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

macro_rules! gemm_float {
    ($t:ty, |$p:ident, $isa:ident| $run:expr) => {
        impl GemmFloat for $t {
            unsafe fn block(
                isa: Isa,
                whole: [usize; 2],
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
                let $isa = isa;
                // SAFETY: forwarded from the caller. gemm takes (column,
                // row) strides and computes dst = alpha·dst + beta·(lhs·rhs).
                let $p = micro::Product {
                    whole_m: whole[0],
                    whole_n: whole[1],
                    m,
                    n,
                    k,
                    dst: c,
                    dst_cs: csc,
                    dst_rs: rsc,
                    read_dst: accumulate,
                    lhs: a,
                    lhs_cs: csa,
                    lhs_rs: rsa,
                    rhs: b,
                    rhs_cs: csb,
                    rhs_rs: rsb,
                    alpha: if accumulate { 1.0 } else { 0.0 },
                    beta: 1.0,
                };
                // SAFETY: forwarded from the caller.
                unsafe { $run }
            }
        }
    };
}
// f32 chooses its kernels per product; f64 takes the crate's choice.
gemm_float!(f32, |p, isa| p.run(isa));
gemm_float!(f64, |p, isa| {
    let _ = isa;
    p.run_crate()
});

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

/// `C = A·B` (or `C += A·B` with `accumulate`) for strided views (strides
/// in elements, negative allowed), cut into output blocks over the thread
/// pool ([`crate::threads::run_gemm_blocks`]; on one thread, or inside
/// [`crate::threads::serial`], on the calling thread).
///
/// # Safety
/// Pointers and strides must describe valid `m×k`, `k×n` and `m×n`
/// matrices, `c` not aliasing the others.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product<T: GemmFloat>(
    isa: Isa,
    m: usize,
    k: usize,
    n: usize,
    a: *const T,
    rsa: isize,
    csa: isize,
    b: *const T,
    rsb: isize,
    csb: isize,
    c: *mut T,
    rsc: isize,
    csc: isize,
    accumulate: bool,
) {
    let (a, b, c) = (SendPtr(a as *mut T), SendPtr(b as *mut T), SendPtr(c));
    crate::threads::run_gemm_blocks(m, n, k, &|rows, cols| {
        let (r0, c0) = (rows.start as isize, cols.start as isize);
        // SAFETY: forwarded from the caller; the block's rows of `a`,
        // columns of `b` and part of `c` lie inside the matrices, and
        // blocks write disjoint parts of `c`.
        unsafe {
            T::block(
                isa,
                [m, n],
                rows.len(),
                k,
                cols.len(),
                a.get().offset(r0 * rsa),
                rsa,
                csa,
                b.get().offset(c0 * csb),
                rsb,
                csb,
                c.get().offset(r0 * rsc + c0 * csc),
                rsc,
                csc,
                accumulate,
            )
        }
    })
}

/// `c += a · b` with `a [m, k]` and `b [k, n]` views (any strides, negative
/// too) and `c [m, n]` row-major and contiguous: the JIT's GEMM with its
/// blocks and threads, for kernels that pre-fill `c` (a bias) and
/// accumulate into it.
///
/// ```
/// use ndarray::array;
/// use tracejit_kernels::Isa;
///
/// let (a, b) = (array![[1.0f32, 2.0]], array![[3.0f32], [4.0]]);
/// let mut c = [10.0f32];
/// tracejit_kernels::gemm::gemm_acc_f32(a.view(), b.view(), &mut c, Isa::native());
/// assert_eq!(c, [21.0]);
/// ```
///
/// # Panics
/// If the inner dims differ or `c` does not hold `m · n` values.
pub fn gemm_acc_f32(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: &mut [f32], isa: Isa) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(k == k2 && c.len() == m * n, "gemm_acc_f32: shapes [{m}, {k}] x [{k2}, {n}] into {}", c.len());
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (sa, sb) = (a.strides(), b.strides());
    // SAFETY: the views describe m×k and k×n matrices with these strides;
    // `c` is a unique, contiguous m×n buffer that aliases neither.
    unsafe {
        product::<f32>(
            isa,
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

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    use crate::Isa;

    #[test]
    fn accumulates_the_product_for_any_strides() {
        for &(m, k, n) in &[(1, 1, 1), (7, 5, 17), (13, 33, 40), (64, 64, 48), (5, 0, 9), (0, 3, 2)] {
            let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 13) as f32 * 0.25 - 1.5);
            let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 17 + j * 3) % 11) as f32 * 0.5 - 2.0);
            let mut c = vec![1.0f32; m * n];
            super::gemm_acc_f32(a.view(), b.view(), &mut c, Isa::native());
            let want = a.dot(&b) + 1.0;
            for (got, want) in c.iter().zip(want.iter()) {
                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{k}x{n}: {got} vs {want}");
            }
        }
        // A transposed and a reversed operand.
        let a = Array2::from_shape_fn((6, 4), |(i, j)| (i * 4 + j) as f32);
        let b = Array2::from_shape_fn((5, 6), |(i, j)| (i as f32) - (j as f32) * 0.5);
        let (at, br) = (a.t(), b.slice(s![..;-1, ..]));
        let mut c = vec![0.0f32; 4 * 5];
        super::gemm_acc_f32(at, br.t(), &mut c, Isa::native());
        let want = at.dot(&br.t());
        assert!(c.iter().zip(want.iter()).all(|(g, w)| (g - w).abs() < 1e-4), "{c:?} vs {want:?}");
    }
}
