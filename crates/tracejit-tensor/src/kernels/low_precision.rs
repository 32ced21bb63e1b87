//! bf16 and f16 in the reference kernels: storage dtypes whose arithmetic
//! widens to f32 (exactly), computes there and rounds each result back once,
//! to nearest even, as JAX and XLA do on CPU. One wrapper does it for every
//! float kernel, so no kernel has a 16-bit code path of its own.

use crate::{DType, Storage};

/// Runs a float kernel on bf16/f16 inputs the way JAX on CPU does: each
/// 16-bit input widened (exactly) to f32, `f` computed in f32, and every
/// f32 result rounded back to the inputs' dtype once (to nearest even).
/// Results of other dtypes (bool predicates, i64 indices) pass through.
pub(crate) fn in_f32(inputs: &[&Storage], f: impl FnOnce(&[&Storage]) -> Vec<Storage>) -> Vec<Storage> {
    super::widened(inputs, DType::is_low_precision, |_| DType::F32, f)
}

/// [`in_f32`] for a kernel of one input and one output.
pub(crate) fn in_f32_1(x: &Storage, f: impl FnOnce(&Storage) -> Storage) -> Storage {
    in_f32(&[x], |w| vec![f(w[0])]).remove(0)
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use proptest::prelude::*;

    use crate::kernels::{binary, cast, matmul, matmul_acc, reduce, unary};
    use crate::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};

    fn bf(v: &[f32]) -> Storage {
        cast(&Storage::from_vec(v.to_vec(), &[v.len()]).unwrap(), DType::BF16)
    }

    #[test]
    fn casts_round_to_nearest_even_once() {
        let one = 1.0f64;
        // Ties go to the even neighbour: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
        let x = Storage::from_vec(
            vec![one + 2f64.powi(-8), one + 3.0 * 2f64.powi(-8), one + 2f64.powi(-8) + 2f64.powi(-30)],
            &[3],
        );
        let r = cast(&x.unwrap(), DType::BF16).to_vec::<bf16>().unwrap();
        // The third is just above the tie: straight from f64 it rounds up,
        // where rounding through f32 first would have made a tie and gone down.
        assert_eq!(r, [bf16::from_f32(1.0), bf16::from_f32(1.015625), bf16::from_f32(1.0078125)]);
    }

    #[test]
    fn specials_survive_and_f16_overflows_to_inf() {
        let x =
            Storage::from_vec(vec![f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-40, 7.0e4, 65504.0, 1e-7, -0.0], &[8])
                .unwrap();
        let b = cast(&x, DType::BF16).to_vec::<bf16>().unwrap();
        assert!(b[0].is_nan());
        assert_eq!(b[1], bf16::INFINITY);
        assert_eq!(b[2], bf16::NEG_INFINITY);
        // bf16 has f32's exponent range: f32 subnormals stay (rounded), not flushed.
        assert!(b[3].to_f32() > 0.0 && b[3].to_f32() < f32::MIN_POSITIVE);
        let h = cast(&x, DType::F16).to_vec::<f16>().unwrap();
        assert!(h[0].is_nan());
        assert_eq!(h[4], f16::INFINITY, "70000 overflows f16");
        assert_eq!(h[5].to_f32(), 65504.0, "f16's largest finite value stays");
        assert!(h[6].to_f32() > 0.0 && h[6].to_f32() < 6.1e-5, "1e-7 is an f16 subnormal, kept");
        assert!(h[7].is_sign_negative() && h[7].to_f32() == 0.0);
        // Back to f32 is exact.
        let back = cast(&cast(&x, DType::F16), DType::F32).to_vec::<f32>().unwrap();
        assert_eq!(back[5], 65504.0);
    }

    #[test]
    fn sums_accumulate_in_f32_and_round_once() {
        // 300 ones summed in bf16 would stall at 256 (256 + 1 rounds to 256).
        let x = bf(&[1.0; 300]);
        let s = reduce(ReduceOp::Sum, &x, &[0], false);
        assert_eq!(s.dtype(), DType::BF16);
        assert_eq!(s.to_vec::<bf16>().unwrap(), [bf16::from_f32(300.0)]);
    }

    #[test]
    fn matmul_acc_keeps_the_f32_sums() {
        let a = cast(&Storage::from_vec(vec![1.0f32, 1.0 / 512.0, 3.0, 0.5], &[2, 2]).unwrap(), DType::BF16);
        let b = cast(&Storage::from_vec(vec![1.0f32, 0.0, 1.0, 1.0], &[2, 2]).unwrap(), DType::BF16);
        let acc = matmul_acc(&a, &b, DType::F32);
        assert_eq!(acc.dtype(), DType::F32);
        // Row 0: 1 + 1/512 = 1.001953125 exactly in f32; rounded to bf16 it would be 1.
        assert_eq!(acc.to_vec::<f32>().unwrap(), [1.0 + 1.0 / 512.0, 1.0 / 512.0, 3.5, 0.5]);
        let rounded = matmul(&a, &b);
        assert_eq!(rounded.dtype(), DType::BF16);
        assert_eq!(rounded.to_vec::<bf16>().unwrap()[0], bf16::from_f32(1.0));
    }

    #[test]
    #[should_panic(expected = "cannot accumulate f32 operands in bf16")]
    fn matmul_acc_rejects_a_narrow_accumulator() {
        let a = Storage::from_vec(vec![1.0f32], &[1, 1]).unwrap();
        matmul_acc(&a, &a, DType::BF16);
    }

    fn finite_or_special() -> impl Strategy<Value = f32> {
        prop_oneof![8 => -1e4f32..1e4, 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => Just(0.0f32)]
    }

    proptest! {
        /// Every op on bf16 and f16 is the f32 op on the widened inputs,
        /// rounded once: the reference JAX's CPU backend follows.
        #[test]
        fn arithmetic_is_f32_rounded_once(xs in prop::collection::vec(finite_or_special(), 0..40), seed in 0u32..1000) {
            let n = xs.len();
            let ys: Vec<f32> = xs.iter().enumerate().map(|(i, v)| v * 0.37 + (i as u32 + seed) as f32).collect();
            for low in [DType::BF16, DType::F16] {
                let a = cast(&Storage::from_vec(xs.clone(), &[n]).unwrap(), low);
                let b = cast(&Storage::from_vec(ys.clone(), &[n]).unwrap(), low);
                let (wa, wb) = (cast(&a, DType::F32), cast(&b, DType::F32));
                for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum] {
                    let got = binary(op, &a, &b);
                    prop_assert_eq!(got.dtype(), low);
                    prop_assert!(got.bit_eq(&cast(&binary(op, &wa, &wb), low)), "{} in {}", op.name(), low);
                }
                for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Neg, UnaryOp::Sqrt] {
                    let got = unary(op, &a);
                    prop_assert!(got.bit_eq(&cast(&unary(op, &wa), low)), "{} in {}", op.name(), low);
                }
                let pred = unary(UnaryOp::IsNan, &a);
                prop_assert_eq!(pred.dtype(), DType::Bool);
            }
        }
    }
}
