//! `C += A · B` for the LSTM kernel, through the `gemm` crate: the GEMM the
//! JIT's executor uses, so the composite kernel is never slower than the
//! primitive body at the products (measured here at `[64, 256] x [256,
//! 1024]`: `gemm` about 1.0 ms, ndarray's `dot` about 1.24 ms, a hand-written
//! 6x16 AVX2 micro-kernel about 1.2 ms, on a loaded VM). Accumulating into
//! `C` lets the caller pre-fill it with the bias, which saves a pass.

use ndarray::ArrayView2;

/// `c += a · b` with `a [m, k]`, `b [k, n]` (any strides) and `c [m, n]`
/// row-major and contiguous: the JIT's own entry
/// ([`tracejit_jit::gemm_acc_f32`]), so blocks and threads are shared.
pub(super) fn gemm_acc(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: &mut [f32]) {
    tracejit_jit::gemm_acc_f32(a, b, c);
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
