//! `C += A · B` for the LSTM kernel, through the `gemm` crate: the GEMM the
//! JIT's executor uses, so the composite kernel is never slower than the
//! primitive body at the products (measured here at `[64, 256] x [256,
//! 1024]`: `gemm` about 1.0 ms, ndarray's `dot` about 1.24 ms, a hand-written
//! 6x16 AVX2 micro-kernel about 1.2 ms, on a loaded VM). Accumulating into
//! `C` lets the caller pre-fill it with the bias, which saves a pass.

use ndarray::ArrayView2;

/// `c += a · b` with `a [m, k]`, `b [k, n]` (any strides) and `c [m, n]`
/// row-major and contiguous.
pub(super) fn gemm_acc(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: &mut [f32]) {
    let (m, k) = a.dim();
    let n = b.ncols();
    assert!(b.nrows() == k && c.len() == m * n, "gemm_acc: shapes [{m}, {k}] x {:?} into {}", b.dim(), c.len());
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (a_rs, a_cs) = (a.strides()[0], a.strides()[1]);
    let (b_rs, b_cs) = (b.strides()[0], b.strides()[1]);
    let (a_ptr, b_ptr, c_ptr) =
        (Shared(a.as_ptr() as *mut f32), Shared(b.as_ptr() as *mut f32), Shared(c.as_mut_ptr()));
    // Large products split across the JIT's pool in blocks fixed by the
    // sizes (same bits for any thread count).
    tracejit_jit::threads::run_gemm_blocks(m, n, k, &|rows, cols| {
        let (r0, c0) = (rows.start as isize, cols.start as isize);
        // SAFETY: `a` and `b` are live ndarray views whose pointers and
        // element strides address exactly their `m x k` and `k x n`
        // elements; `c` holds `m * n` elements, row-major (column stride 1,
        // row stride n); the block's rows/columns lie inside them and
        // blocks write disjoint parts of `c`. `gemm` computes `dst = alpha *
        // dst + beta * lhs * rhs` (read_dst: true, both factors 1).
        unsafe {
            gemm::gemm(
                rows.len(),
                cols.len(),
                k,
                c_ptr.get().offset(r0 * n as isize + c0),
                1,
                n as isize,
                true,
                a_ptr.get().offset(r0 * a_rs),
                a_cs,
                a_rs,
                b_ptr.get().offset(c0 * b_cs),
                b_cs,
                b_rs,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
}

/// A pointer shared with the pool's workers, which the caller waits for.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: the buffers outlive `run_gemm_blocks`, which waits for every
// block; blocks read `a`/`b` and write disjoint parts of `c`.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer (a method, so closures capture the whole wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    #[test]
    fn accumulates_the_product_for_any_strides() {
        for &(m, k, n) in &[(1, 1, 1), (7, 5, 17), (13, 33, 40), (64, 64, 48), (5, 0, 9), (0, 3, 2)] {
            let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 13) as f32 * 0.25 - 1.5);
            let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 17 + j * 3) % 11) as f32 * 0.5 - 2.0);
            let mut c = vec![1.0f32; m * n];
            super::gemm_acc(a.view(), b.view(), &mut c);
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
        super::gemm_acc(at, br.t(), &mut c);
        let want = at.dot(&br.t());
        assert!(c.iter().zip(want.iter()).all(|(g, w)| (g - w).abs() < 1e-4), "{c:?} vs {want:?}");
    }
}
