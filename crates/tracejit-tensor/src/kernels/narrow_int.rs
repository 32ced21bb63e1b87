//! The narrow integers (i8, u8, i16, u16, u32) in the reference kernels.
//!
//! Their contract (see [`DType::compute`](crate::DType::compute)) is that an op on them equals the
//! op in the compute dtype (i32, or i64 for u32) with each result wrapped
//! back once, which is what the JIT and the IR rely on. The elementwise
//! kernels compute them exactly so ([`in_compute`]): the widening is exact
//! and every op of a narrow integer is its compute dtype's op modulo
//! 2^width, so one set of machine code serves all six integer widths
//! (the per-dtype copies were a fifth of this crate's build). The tests
//! check the result against a scalar reference in i128, for the edges and
//! for u64 (which has no wider compute dtype).

use super::cast;
use crate::{DType, Storage};

/// `f` computed with every narrow-integer input widened (exactly) to its
/// compute dtype, and every result of that compute dtype wrapped back to
/// the narrow dtype once. Results of other dtypes (a comparison's bool)
/// pass through.
pub(crate) fn in_compute(inputs: &[&Storage], f: impl FnOnce(&[&Storage]) -> Vec<Storage>) -> Vec<Storage> {
    widened(inputs, DType::is_narrow_int, DType::compute, f)
}

/// `f` on `inputs` with each input of a dtype `narrow` picks cast to
/// `wide` of it, and each result of the first such input's wide dtype cast
/// back to that narrow dtype; other inputs and results pass through. The
/// one widen-compute-narrow step of [`in_compute`] and of bf16/f16's
/// `in_f32`.
pub(crate) fn widened(
    inputs: &[&Storage],
    narrow: impl Fn(DType) -> bool,
    wide: impl Fn(DType) -> DType,
    f: impl FnOnce(&[&Storage]) -> Vec<Storage>,
) -> Vec<Storage> {
    let first = inputs.iter().map(|s| s.dtype()).find(|&d| narrow(d)).expect("an input of the narrow dtypes");
    let widened: Vec<Storage> =
        inputs.iter().map(|s| if narrow(s.dtype()) { cast(s, wide(s.dtype())) } else { (*s).clone() }).collect();
    let refs: Vec<&Storage> = widened.iter().collect();
    f(&refs).into_iter().map(|r| if r.dtype() == wide(first) { cast(&r, first) } else { r }).collect()
}

/// [`in_compute`] for a kernel of one input and one output.
pub(crate) fn in_compute_1(x: &Storage, f: impl FnOnce(&Storage) -> Storage) -> Storage {
    in_compute(&[x], |w| vec![f(w[0])]).remove(0)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::kernels::{binary, cast, matmul, reduce, unary};
    use crate::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};

    /// A comparison and a unary op of the i128 reference.
    type Compare = fn(&i128, &i128) -> bool;
    type Scalar = fn(i128) -> i128;

    const NARROW: [DType; 5] = [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32];

    /// `vals` (i64s in `dtype`'s range) as a 1-D tensor of `dtype`.
    fn of(dtype: DType, vals: &[i64]) -> Storage {
        cast(&Storage::from_vec(vals.to_vec(), &[vals.len()]).unwrap(), dtype)
    }

    /// The values of an integer tensor as i128 (exact for every dtype).
    fn ints(s: &Storage) -> Vec<i128> {
        match s.dtype() {
            DType::U64 => s.to_vec::<u64>().unwrap().into_iter().map(i128::from).collect(),
            _ => cast(s, DType::I64).to_vec::<i64>().unwrap().into_iter().map(i128::from).collect(),
        }
    }

    /// `v` wrapped into `dtype`'s range (two's complement).
    fn wrap(dtype: DType, v: i128) -> i128 {
        let (lo, hi) = dtype.int_range().unwrap();
        let m = hi - lo + 1;
        (v - lo).rem_euclid(m) + lo
    }

    #[test]
    fn arithmetic_wraps_at_the_edges() {
        let add = |d, a, b| ints(&binary(BinaryOp::Add, &of(d, &[a]), &of(d, &[b])))[0];
        let sub = |d, a, b| ints(&binary(BinaryOp::Sub, &of(d, &[a]), &of(d, &[b])))[0];
        assert_eq!(add(DType::I8, 127, 1), -128);
        assert_eq!(sub(DType::U8, 0, 1), 255);
        assert_eq!(add(DType::I16, 32767, 1), -32768);
        assert_eq!(sub(DType::U16, 0, 1), 65535);
        assert_eq!(add(DType::U32, u32::MAX as i64, 2), 1);
        assert_eq!(ints(&binary(BinaryOp::Div, &of(DType::I8, &[-128]), &of(DType::I8, &[-1])))[0], -128);
        assert_eq!(ints(&unary(UnaryOp::Neg, &of(DType::I8, &[-128])))[0], -128);
        assert_eq!(ints(&unary(UnaryOp::Abs, &of(DType::I8, &[-128])))[0], -128);
        assert_eq!(ints(&unary(UnaryOp::Neg, &of(DType::U8, &[1])))[0], 255);
        assert_eq!(ints(&unary(UnaryOp::Sign, &of(DType::U8, &[0, 7])))[..], [0, 1]);
        let big = Storage::from_vec(vec![u64::MAX, 1 << 63], &[2]).unwrap();
        let one = Storage::from_vec(vec![1u64, 1 << 63], &[2]).unwrap();
        assert_eq!(binary(BinaryOp::Add, &big, &one).to_vec::<u64>().unwrap(), [0, 0]);
        // Unsigned order, not i64's.
        assert_eq!(binary(BinaryOp::Gt, &big, &one).to_vec::<bool>().unwrap(), [true, false]);
        assert_eq!(binary(BinaryOp::Maximum, &big, &one).to_vec::<u64>().unwrap(), [u64::MAX, 1 << 63]);
        assert_eq!(binary(BinaryOp::Div, &big, &one).to_vec::<u64>().unwrap(), [u64::MAX, 1]);
        // Sums wrap too.
        let s = reduce(ReduceOp::Sum, &of(DType::U8, &[200, 100]), &[0], false);
        assert_eq!((s.dtype(), ints(&s)[0]), (DType::U8, 44));
    }

    /// What tracejit's `cast` does at the edges, documented by example:
    /// float to integer truncates toward zero and saturates, NaN becomes
    /// 0; integer to integer keeps the low bits (wraps); integer to float
    /// rounds to nearest.
    #[test]
    fn casts_saturate_from_floats_and_wrap_between_integers() {
        let f = Storage::from_vec(
            vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 300.7, -3.9, 127.5, -128.5, 65535.9],
            &[8],
        )
        .unwrap();
        assert_eq!(ints(&cast(&f, DType::I8)), [0, 127, -128, 127, -3, 127, -128, 127]);
        assert_eq!(ints(&cast(&f, DType::U8)), [0, 255, 0, 255, 0, 127, 0, 255]);
        assert_eq!(ints(&cast(&f, DType::U16)), [0, 65535, 0, 300, 0, 127, 0, 65535]);
        assert_eq!(ints(&cast(&f, DType::U64)), [0, u64::MAX as i128, 0, 300, 0, 127, 0, 65535]);
        let i = Storage::from_vec(vec![300i32, -1, -129, 65536], &[4]).unwrap();
        assert_eq!(ints(&cast(&i, DType::U8)), [44, 255, 127, 0]);
        assert_eq!(ints(&cast(&i, DType::I8)), [44, -1, 127, 0]);
        assert_eq!(ints(&cast(&i, DType::U32)), [300, u32::MAX as i128, (u32::MAX - 128) as i128, 65536]);
        assert_eq!(ints(&cast(&i, DType::U64)), [300, u64::MAX as i128, (u64::MAX - 128) as i128, 65536]);
        let u = Storage::from_vec(vec![u64::MAX], &[1]).unwrap();
        assert_eq!(cast(&u, DType::F32).to_vec::<f32>().unwrap(), [1.8446744e19]);
        assert_eq!(cast(&u, DType::I64).to_vec::<i64>().unwrap(), [-1]);
        assert_eq!(cast(&of(DType::I8, &[-5]), DType::F64).to_vec::<f64>().unwrap(), [-5.0]);
        assert_eq!(cast(&of(DType::U8, &[0, 2]), DType::Bool).to_vec::<bool>().unwrap(), [false, true]);
    }

    fn values(dtype: DType, n: usize) -> impl Strategy<Value = Vec<i64>> {
        let (lo, hi) = dtype.int_range().unwrap();
        let (lo, hi) = (lo as i64, hi as i64);
        // Edge values often, so that wrapping is exercised.
        prop::collection::vec(prop_oneof![6 => lo..=hi, 1 => Just(lo), 1 => Just(hi), 1 => Just(0), 1 => Just(1)], n)
    }

    fn dtype_and_pair() -> impl Strategy<Value = (DType, Vec<i64>, Vec<i64>)> {
        (prop::sample::select(NARROW.to_vec()), 0usize..24)
            .prop_flat_map(|(d, n)| (Just(d), values(d, n), values(d, n)))
    }

    /// `x^e` wrapped into `d`, by squaring (each step wrapped, so exact
    /// modulo 2^width); a negative exponent gives the real result truncated
    /// toward zero: 1 for base 1, +-1 for base -1, 0 otherwise.
    fn pow_ref(d: DType, x: i128, e: i128) -> i128 {
        if e < 0 {
            return match x {
                1 => 1,
                -1 => wrap(d, if e % 2 == 0 { 1 } else { -1 }),
                _ => 0,
            };
        }
        let (mut acc, mut base, mut e) = (wrap(d, 1), x, e);
        while e > 0 {
            if e & 1 == 1 {
                acc = wrap(d, acc * base);
            }
            base = wrap(d, base * base);
            e >>= 1;
        }
        acc
    }

    /// An arithmetic binary op of `d` on one pair, in i128 (the operands
    /// lie within 2^32, so no product overflows): wrapping add, sub and
    /// mul, division truncating toward zero with `x / 0 == 0`, Python's
    /// modulo with `x % 0 == 0`, max and min.
    fn binary_ref(op: BinaryOp, d: DType, x: i128, y: i128) -> i128 {
        use BinaryOp::*;
        match op {
            Add => wrap(d, x + y),
            Sub => wrap(d, x - y),
            Mul => wrap(d, x * y),
            Div if y == 0 => 0,
            Div => wrap(d, x / y),
            Rem if y == 0 => 0,
            Rem => {
                let r = x % y;
                if r != 0 && (r < 0) != (y < 0) {
                    r + y
                } else {
                    r
                }
            }
            Maximum => x.max(y),
            Minimum => x.min(y),
            Pow => pow_ref(d, x, y),
            // Two's complement in i128 keeps the narrow value's bits.
            BitwiseAnd => wrap(d, x & y),
            BitwiseOr => wrap(d, x | y),
            BitwiseXor => wrap(d, x ^ y),
            _ => unreachable!("not arithmetic: {}", op.name()),
        }
    }

    proptest! {
        /// Every elementwise op and reduction on a narrow integer against a
        /// scalar reference in i128 wrapped to the dtype: the contract
        /// (the op in the compute dtype, wrapped back once) the JIT's and
        /// the IR's lowering rests on.
        #[test]
        fn ops_match_an_i128_reference((d, xs, ys) in dtype_and_pair()) {
            let (a, b) = (of(d, &xs), of(d, &ys));
            let (xi, yi): (Vec<i128>, Vec<i128>) = (xs.iter().map(|&v| v.into()).collect(), ys.iter().map(|&v| v.into()).collect());
            use BinaryOp::*;
            for op in [Add, Sub, Mul, Div, Rem, Maximum, Minimum, Pow, BitwiseAnd, BitwiseOr, BitwiseXor] {
                let got = binary(op, &a, &b);
                prop_assert_eq!(got.dtype(), d);
                let want: Vec<i128> = xi.iter().zip(&yi).map(|(&x, &y)| binary_ref(op, d, x, y)).collect();
                prop_assert_eq!(ints(&got), want, "{} on {}: {:?} {:?}", op.name(), d, &xs, &ys);
            }
            let cmp: [(BinaryOp, Compare); 6] =
                [(Eq, i128::eq), (Ne, i128::ne), (Lt, i128::lt), (Le, i128::le), (Gt, i128::gt), (Ge, i128::ge)];
            for (op, f) in cmp {
                let want: Vec<bool> = xi.iter().zip(&yi).map(|(x, y)| f(x, y)).collect();
                prop_assert_eq!(binary(op, &a, &b).to_vec::<bool>().unwrap(), want, "{} on {}", op.name(), d);
            }
            let unary_ref: [(UnaryOp, Scalar); 5] = [
                (UnaryOp::Neg, |x| -x),
                (UnaryOp::Abs, i128::abs),
                (UnaryOp::Sign, i128::signum),
                (UnaryOp::Square, |x| x * x),
                (UnaryOp::Relu, |x| x.max(0)),
            ];
            for (op, f) in unary_ref {
                let got = unary(op, &a);
                prop_assert_eq!(got.dtype(), d);
                let want: Vec<i128> = xi.iter().map(|&x| wrap(d, f(x))).collect();
                prop_assert_eq!(ints(&got), want, "{} on {}", op.name(), d);
            }
            let sum = reduce(ReduceOp::Sum, &a, &[0], false);
            prop_assert_eq!(ints(&sum), vec![wrap(d, xi.iter().sum())]);
            let prod = reduce(ReduceOp::Prod, &a, &[0], false);
            prop_assert_eq!(ints(&prod), vec![xi.iter().fold(wrap(d, 1), |p, &x| wrap(d, p * x))]);
            if !xs.is_empty() {
                prop_assert_eq!(ints(&reduce(ReduceOp::Max, &a, &[0], true)), vec![*xi.iter().max().unwrap()]);
                prop_assert_eq!(ints(&reduce(ReduceOp::Min, &a, &[0], true)), vec![*xi.iter().min().unwrap()]);
            }
            // A product of [1, n] by [n, 1]: the wrapped dot product.
            let n = xs.len();
            let m = matmul(&crate::kernels::reshape(&a, &[1, n]), &crate::kernels::reshape(&b, &[n, 1]));
            let dot: i128 = xi.iter().zip(&yi).map(|(&x, &y)| x * y).sum();
            prop_assert_eq!(ints(&m), vec![wrap(d, dot)]);
        }

        /// u64 against a scalar reference in i128 (it has no wider compute
        /// dtype): wrapping add, sub and mul, unsigned div, rem, order.
        #[test]
        fn u64_matches_an_i128_reference(xs in prop::collection::vec(any::<u64>(), 1..16), ys in prop::collection::vec(any::<u64>(), 1..16)) {
            let n = xs.len().min(ys.len());
            let (xs, ys) = (&xs[..n], &ys[..n]);
            let a = Storage::from_vec(xs.to_vec(), &[n]).unwrap();
            let b = Storage::from_vec(ys.to_vec(), &[n]).unwrap();
            let m = 1i128 << 64;
            let check = |op: BinaryOp, f: &dyn Fn(i128, i128) -> i128| -> Result<(), TestCaseError> {
                let got = ints(&binary(op, &a, &b));
                let want: Vec<i128> = xs.iter().zip(ys).map(|(&x, &y)| f(i128::from(x), i128::from(y)).rem_euclid(m)).collect();
                prop_assert_eq!(got, want, "{}", op.name());
                Ok(())
            };
            check(BinaryOp::Add, &|x, y| x + y)?;
            check(BinaryOp::Sub, &|x, y| x - y)?;
            // The full product needs 128 bits unsigned.
            check(BinaryOp::Mul, &|x, y| ((x as u128 * y as u128) % (1u128 << 64)) as i128)?;
            check(BinaryOp::Div, &|x, y| if y == 0 { 0 } else { x / y })?;
            check(BinaryOp::Rem, &|x, y| if y == 0 { 0 } else { x % y })?;
            check(BinaryOp::Maximum, &|x, y| x.max(y))?;
            check(BinaryOp::Minimum, &|x, y| x.min(y))?;
            let lt = binary(BinaryOp::Lt, &a, &b).to_vec::<bool>().unwrap();
            prop_assert_eq!(lt, xs.iter().zip(ys).map(|(x, y)| x < y).collect::<Vec<_>>());
        }
    }
}
