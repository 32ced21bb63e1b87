//! The GEMM path against the reference kernel (within the usual rounding
//! bound of a blocked sum, not bit for bit): any shapes (0, 1, 3, 5, 17,
//! batch axes that broadcast), f32 and f64, transposed views, and output
//! buffers that are reused while dirty (NaN-filled), as the executor's pool
//! reuses them.

use crate::common;

use common::*;
use proptest::prelude::*;
use tracejit_ir::tensor::{kernels, DType, Storage, UnaryOp};

/// A buffer of `n` elements full of NaN, shaped `[n]`, that nothing else holds.
fn dirty(dtype: DType, n: usize) -> Storage {
    match dtype {
        DType::F32 => Storage::from_vec(vec![f32::NAN; n], &[n]).unwrap(),
        _ => Storage::from_vec(vec![f64::NAN; n], &[n]).unwrap(),
    }
}

fn ptr(s: &Storage) -> usize {
    match s {
        Storage::F32(a) => a.as_ptr() as usize,
        Storage::F64(a) => a.as_ptr() as usize,
        _ => 0,
    }
}

fn dims() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![0usize, 1, 3, 5, 17])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn reused_dirty_buffers_give_the_reference_product(
        m in dims(), k in dims(), n in dims(),
        batch in prop::sample::select(vec![vec![], vec![2], vec![3, 1]]),
        f64_ in any::<bool>(), seed in 0u64..1000, transpose_b in any::<bool>(),
    ) {
        let dtype = if f64_ { DType::F64 } else { DType::F32 };
        let mut sa = batch.clone();
        sa.extend([m, k]);
        // The second operand broadcasts over the batch axes.
        let a = data(dtype, &sa, seed, false);
        let b = if transpose_b {
            let bt = data(dtype, &[n, k], seed + 1, false);
            kernels::transpose(&bt, &[1, 0])
        } else {
            data(dtype, &[k, n], seed + 1, false)
        };
        let want = kernels::matmul(&a, &b);
        // Blocked sums round differently from the reference's order: both
        // must be within k·ε·Σ|aᵢbᵢ| (twice that, to be safe) of the exact
        // product, computed in f64 from the same operands.
        let (a64, b64) = (kernels::cast(&a, DType::F64), kernels::cast(&b, DType::F64));
        let exact = kernels::matmul(&a64, &b64);
        let mag = kernels::matmul(&kernels::unary(UnaryOp::Abs, &a64), &kernels::unary(UnaryOp::Abs, &b64));
        let eps = if f64_ { f64::EPSILON } else { f64::from(f32::EPSILON) };
        let within = |got: &Storage| -> Result<(), TestCaseError> {
            let got = kernels::cast(got, DType::F64);
            prop_assert_eq!(got.shape(), exact.shape());
            let (g, e, m) = (got.to_vec::<f64>().unwrap(), exact.to_vec::<f64>().unwrap(), mag.to_vec::<f64>().unwrap());
            for i in 0..g.len() {
                let bound = 2.0 * (k as f64 + 1.0) * eps * m[i] + 1e-30;
                prop_assert!((g[i] - e[i]).abs() <= bound, "element {}: {} vs exact {} (bound {})", i, g[i], e[i], bound);
            }
            Ok(())
        };
        within(&want)?;
        let fresh = tracejit_jit::matmul(&a, &b);
        within(&fresh)?;
        let out_len = want.len();
        let buf = dirty(dtype, out_len);
        let p = ptr(&buf);
        let got = tracejit_jit::matmul_reusing(&a, &b, Some(buf));
        within(&got)?;
        if out_len > 0 {
            prop_assert_eq!(ptr(&got), p, "the unique buffer of the right size was not reused");
        }
        // A buffer someone else still holds is never written.
        let held = dirty(dtype, out_len);
        let keep = held.clone();
        let got = tracejit_jit::matmul_reusing(&a, &b, Some(held));
        within(&got)?;
        let still_nan = match &keep {
            Storage::F32(x) => x.iter().all(|v| v.is_nan()),
            Storage::F64(x) => x.iter().all(|v| v.is_nan()),
            _ => true,
        };
        prop_assert!(still_nan, "a shared buffer was overwritten");
    }
}
