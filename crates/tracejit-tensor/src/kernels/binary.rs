//! Binary elementwise kernels and their relatives: `binary` (arithmetic,
//! comparisons, logical ops) with numpy broadcasting, the three-operand
//! `select`, the dtype conversion `cast`, and `clamp`. Every broadcasting op
//! goes through [`zip_map`], which broadcasts both operands to the common
//! shape and maps an element function over them.

use std::mem::MaybeUninit;

use ndarray::{ArcArray, ArrayD, Axis, IxDyn, Zip};

use super::num::{Cast, Num};
use super::par;
use super::shape::broadcast_shapes;
use crate::{BinaryOp, DType, Element, Storage, StorageElement};

/// Broadcasts `a` and `b` to their common shape and maps `f` over the pairs
/// (large results in parts on the pool, see [`super::par`]).
pub(crate) fn zip_map<A: Element, B: Element, R: Element>(
    name: &str,
    a: &ArcArray<A, IxDyn>,
    b: &ArcArray<B, IxDyn>,
    f: impl Fn(A, B) -> R + Sync,
) -> ArrayD<R> {
    // Same shape, both contiguous: a flat loop the compiler vectorizes.
    if a.shape() == b.shape() {
        if let (Some(x), Some(y)) = (a.as_slice(), b.as_slice()) {
            let v = par::zip_flat(x, y, f);
            return ArrayD::from_shape_vec(IxDyn(a.shape()), v).expect("same element count");
        }
    }
    let shape = broadcast_shapes(a.shape(), b.shape())
        .unwrap_or_else(|| panic!("{name}: shapes {:?} and {:?} cannot be broadcast together", a.shape(), b.shape()));
    let av = a.broadcast(IxDyn(&shape)).expect("broadcast shape checked");
    let bv = b.broadcast(IxDyn(&shape)).expect("broadcast shape checked");
    // Rows of any length: a `Zip` fallback for short rows was a third of
    // every instance's machine code (one per op and dtype) for no measured
    // gain. Rank 0 has the same shape on both sides and took the flat path.
    by_rows(&shape, av, bv, f)
}

/// One operand of a row of [`by_rows`]: its elements, or one value
/// broadcast along the row.
enum Row<'a, T> {
    Slice(&'a [T]),
    Splat(T),
}

impl<'a, T: Copy> Row<'a, T> {
    fn of(lane: &ndarray::ArrayView1<'a, T>) -> Option<Self> {
        if let Some(s) = lane.to_slice() {
            return Some(Row::Slice(s));
        }
        (lane.strides()[0] == 0).then(|| Row::Splat(lane[0]))
    }
}

/// [`zip_map`] of broadcast views, a row of the last axis at a time: a
/// row whose operands are contiguous or a broadcast scalar (a bias, a
/// softmax's row max) runs as a flat loop the compiler vectorizes, where
/// `Zip` stepped through a stride-0 operand element by element (a
/// [1024, 1024] minus [1024, 1] took 0.93 ms, twice a same-shape sub).
/// The results are in row-major order, the same values.
fn by_rows<A: Element, B: Element, R: Element>(
    shape: &[usize],
    av: ndarray::ArrayViewD<'_, A>,
    bv: ndarray::ArrayViewD<'_, B>,
    f: impl Fn(A, B) -> R + Sync,
) -> ArrayD<R> {
    let last = ndarray::Axis(shape.len() - 1);
    let out = par::collect_axis0(shape, &|range, part| {
        let (av, bv) = (
            av.slice_axis(Axis(0), ndarray::Slice::from(range.clone())),
            bv.slice_axis(Axis(0), ndarray::Slice::from(range)),
        );
        let rows = av.lanes(last).into_iter().zip(bv.lanes(last));
        for ((ra, rb), o) in rows.zip(part.chunks_mut(av.shape()[last.0])) {
            match (Row::of(&ra), Row::of(&rb)) {
                (Some(Row::Slice(x)), Some(Row::Slice(y))) => write(o, x.iter().zip(y).map(|(&x, &y)| f(x, y))),
                (Some(Row::Slice(x)), Some(Row::Splat(y))) => write(o, x.iter().map(|&x| f(x, y))),
                (Some(Row::Splat(x)), Some(Row::Slice(y))) => write(o, y.iter().map(|&y| f(x, y))),
                _ => write(o, ra.iter().zip(&rb).map(|(&x, &y)| f(x, y))),
            }
        }
    });
    ArrayD::from_shape_vec(IxDyn(shape), out).expect("one result per element")
}

/// Writes a row's values into its slots (as many values as slots).
#[inline(always)]
fn write<R>(slots: &mut [MaybeUninit<R>], values: impl Iterator<Item = R>) {
    for (o, v) in slots.iter_mut().zip(values) {
        o.write(v);
    }
}

pub(crate) fn binary(op: BinaryOp, a: &Storage, b: &Storage) -> Storage {
    if a.dtype() != b.dtype() {
        panic!("{}: operands have different dtypes ({} and {})", op.name(), a.dtype(), b.dtype());
    }
    if op.result_dtype(a.dtype()).is_none() {
        panic!("{}: dtype {} is not accepted", op.name(), a.dtype());
    }
    if op.kind() == crate::ops::BinaryKind::Bitwise && a.dtype() != crate::DType::Bool {
        return bitwise(op, a, b);
    }
    match (a, b) {
        (Storage::F32(x), Storage::F32(y)) => binary_num(op, x, y),
        (Storage::F64(x), Storage::F64(y)) => binary_num(op, x, y),
        (Storage::I32(x), Storage::I32(y)) => binary_num(op, x, y),
        (Storage::I64(x), Storage::I64(y)) => binary_num(op, x, y),
        (Storage::U64(x), Storage::U64(y)) => binary_num(op, x, y),
        (Storage::I8(_), Storage::I8(_))
        | (Storage::U8(_), Storage::U8(_))
        | (Storage::I16(_), Storage::I16(_))
        | (Storage::U16(_), Storage::U16(_))
        | (Storage::U32(_), Storage::U32(_)) => super::in_compute(&[a, b], |w| vec![binary(op, w[0], w[1])]).remove(0),
        (Storage::Bool(x), Storage::Bool(y)) => binary_bool(op, x, y),
        (Storage::BF16(_), Storage::BF16(_)) | (Storage::F16(_), Storage::F16(_)) => {
            super::in_f32(&[a, b], |w| vec![binary(op, w[0], w[1])]).remove(0)
        }
        _ => unreachable!("dtypes checked above"),
    }
}

/// The element function of every arithmetic binary op on numbers, written
/// once: `$then!` receives the list `Variant => function` (paths generic
/// over the number type `T` in scope where it expands). The array kernel
/// below and `scalar.rs` both expand it, so they cannot drift apart.
macro_rules! arithmetic_functions {
    ($then:ident! $args:tt) => {
        $then! { $args
            Add => T::plus,
            Sub => T::minus,
            Mul => T::times,
            Div => T::divide,
            Pow => T::power,
            Maximum => T::nan_max,
            Minimum => T::nan_min,
            Rem => T::modulo,
        }
    };
}
pub(super) use arithmetic_functions;

/// The arithmetic arms of [`binary_num`] (from [`arithmetic_functions`]),
/// then its comparisons.
macro_rules! zip_arithmetic {
    (($op:expr, $name:expr, $a:expr, $b:expr) $($v:ident => $f:path,)*) => {
        match $op {
            $($v => zip_map($name, $a, $b, $f),)*
            Eq => return Storage::from_array(zip_map($name, $a, $b, |x, y| x == y)),
            Ne => return Storage::from_array(zip_map($name, $a, $b, |x, y| x != y)),
            Lt => return Storage::from_array(zip_map($name, $a, $b, |x, y| x < y)),
            Le => return Storage::from_array(zip_map($name, $a, $b, |x, y| x <= y)),
            Gt => return Storage::from_array(zip_map($name, $a, $b, |x, y| x > y)),
            Ge => return Storage::from_array(zip_map($name, $a, $b, |x, y| x >= y)),
            LogicalAnd | LogicalOr => unreachable!("result_dtype rejects {} on numbers", $name),
            BitwiseAnd | BitwiseOr | BitwiseXor => unreachable!("{} is dispatched before", $name),
        }
    };
}

fn binary_num<T: Num>(op: BinaryOp, a: &ArcArray<T, IxDyn>, b: &ArcArray<T, IxDyn>) -> Storage {
    use BinaryOp::*;
    let name = op.name();
    // Each arm passes its own function item, so `zip_map` is instantiated per
    // op with the element function inlined (a `fn` pointer would block that).
    let out = arithmetic_functions!(zip_arithmetic!(op, name, a, b));
    Storage::from_array(out)
}

/// A bitwise op on integers: the wide ones directly, the narrow ones in
/// their compute dtype (sign- or zero-extended, so the low bits are the
/// narrow result).
fn bitwise(op: BinaryOp, a: &Storage, b: &Storage) -> Storage {
    fn on<T: Element + std::ops::BitAnd<Output = T> + std::ops::BitOr<Output = T> + std::ops::BitXor<Output = T>>(
        op: BinaryOp,
        a: &ArcArray<T, IxDyn>,
        b: &ArcArray<T, IxDyn>,
    ) -> ArrayD<T> {
        match op {
            BinaryOp::BitwiseAnd => zip_map(op.name(), a, b, |x, y| x & y),
            BinaryOp::BitwiseOr => zip_map(op.name(), a, b, |x, y| x | y),
            _ => zip_map(op.name(), a, b, |x, y| x ^ y),
        }
    }
    match (a, b) {
        (Storage::I32(x), Storage::I32(y)) => Storage::from_array(on(op, x, y)),
        (Storage::I64(x), Storage::I64(y)) => Storage::from_array(on(op, x, y)),
        (Storage::U64(x), Storage::U64(y)) => Storage::from_array(on(op, x, y)),
        _ => super::in_compute(&[a, b], |w| vec![binary(op, w[0], w[1])]).remove(0),
    }
}

fn binary_bool(op: BinaryOp, a: &ArcArray<bool, IxDyn>, b: &ArcArray<bool, IxDyn>) -> Storage {
    use BinaryOp::*;
    let f: fn(bool, bool) -> bool = match op {
        Eq => |x, y| x == y,
        Ne => |x, y| x != y,
        LogicalAnd | BitwiseAnd => |x, y| x && y,
        LogicalOr | BitwiseOr => |x, y| x || y,
        BitwiseXor => |x, y| x != y,
        Add | Sub | Mul | Div | Pow | Maximum | Minimum | Rem | Lt | Le | Gt | Ge => {
            unreachable!("result_dtype rejects {} on bool", op.name())
        }
    };
    Storage::from_array(zip_map(op.name(), a, b, f))
}

pub(crate) fn select(cond: &Storage, a: &Storage, b: &Storage) -> Storage {
    let Storage::Bool(c) = cond else {
        panic!("select: the condition must be bool, not {}", cond.dtype());
    };
    same_dtype!("select", a, b, |x, y| select_t(c, x, y))
}

fn select_t<T: StorageElement>(c: &ArcArray<bool, IxDyn>, a: &ArcArray<T, IxDyn>, b: &ArcArray<T, IxDyn>) -> Storage {
    let incompatible = || -> ! {
        panic!("select: shapes {:?}, {:?} and {:?} cannot be broadcast together", c.shape(), a.shape(), b.shape())
    };
    let ab = broadcast_shapes(a.shape(), b.shape()).unwrap_or_else(|| incompatible());
    let shape = broadcast_shapes(c.shape(), &ab).unwrap_or_else(|| incompatible());
    let cv = c.broadcast(IxDyn(&shape)).expect("checked");
    let av = a.broadcast(IxDyn(&shape)).expect("checked");
    let bv = b.broadcast(IxDyn(&shape)).expect("checked");
    if shape.last().is_some_and(|&n| n >= 8) {
        return Storage::from_array(select_by_rows(&shape, cv, av, bv));
    }
    let out = Zip::from(cv).and(av).and(bv).map_collect(|&c, &x, &y| std::hint::select_unpredictable(c, x, y));
    Storage::from_array(out)
}

/// [`select_t`] a row of the last axis at a time, as [`by_rows`]: a
/// contiguous condition choosing between contiguous rows or a broadcast
/// value (relu's gradient, `where(x > 0, g, 0)`) runs as a flat loop,
/// where `Zip` took 270 µs for [64, 512] against a scalar.
fn select_by_rows<T: StorageElement>(
    shape: &[usize],
    cv: ndarray::ArrayViewD<'_, bool>,
    av: ndarray::ArrayViewD<'_, T>,
    bv: ndarray::ArrayViewD<'_, T>,
) -> ArrayD<T> {
    let last = ndarray::Axis(shape.len() - 1);
    let out = par::collect_axis0(shape, &|range, part| {
        let cut = |r: &std::ops::Range<usize>| ndarray::Slice::from(r.clone());
        let (cv, av, bv) = (
            cv.slice_axis(Axis(0), cut(&range)),
            av.slice_axis(Axis(0), cut(&range)),
            bv.slice_axis(Axis(0), cut(&range)),
        );
        let rows = cv.lanes(last).into_iter().zip(av.lanes(last)).zip(bv.lanes(last));
        for (((rc, ra), rb), o) in rows.zip(part.chunks_mut(cv.shape()[last.0])) {
            // A condition like `x > 0` is random to the branch predictor: a
            // branch per element mispredicted half the time (120 µs for
            // [64, 512]); a conditional move does not.
            let pick = |c: bool, x: T, y: T| std::hint::select_unpredictable(c, x, y);
            match (rc.to_slice(), Row::of(&ra), Row::of(&rb)) {
                (Some(c), Some(Row::Slice(x)), Some(Row::Slice(y))) => {
                    write(o, c.iter().zip(x).zip(y).map(|((&c, &x), &y)| pick(c, x, y)))
                }
                (Some(c), Some(Row::Slice(x)), Some(Row::Splat(y))) => {
                    write(o, c.iter().zip(x).map(|(&c, &x)| pick(c, x, y)))
                }
                (Some(c), Some(Row::Splat(x)), Some(Row::Slice(y))) => {
                    write(o, c.iter().zip(y).map(|(&c, &y)| pick(c, x, y)))
                }
                _ => write(o, rc.iter().zip(&ra).zip(&rb).map(|((&c, &x), &y)| pick(c, x, y))),
            }
        }
    });
    ArrayD::from_shape_vec(IxDyn(shape), out).expect("one result per element")
}

pub(crate) fn cast(x: &Storage, to: DType) -> Storage {
    if x.dtype() == to {
        return x.clone();
    }
    crate::with_array!(x, a => cast_t(a, to))
}

fn cast_t<T: Cast>(a: &ArcArray<T, IxDyn>, to: DType) -> Storage {
    // Each of the 13 x 13 conversions is one flat loop over the elements in
    // row-major order (a view copied to that order first): ndarray's `mapv`
    // over an arbitrary layout, instantiated per pair, was a sixth of this
    // crate's machine code.
    let standard = a.as_standard_layout();
    let x = standard.as_slice().expect("standard layout is contiguous");
    let shape = a.shape();
    macro_rules! flat {
        ($f:path) => {
            Storage::from_vec(par::map_flat(x, $f), shape).expect("one result per element")
        };
    }
    match to {
        DType::F32 => flat!(T::cast_f32),
        DType::F64 => flat!(T::cast_f64),
        DType::I32 => flat!(T::cast_i32),
        DType::I64 => flat!(T::cast_i64),
        DType::Bool => flat!(T::cast_bool),
        DType::BF16 => flat!(T::cast_bf16),
        DType::F16 => flat!(T::cast_f16),
        DType::I8 => flat!(T::cast_i8),
        DType::U8 => flat!(T::cast_u8),
        DType::I16 => flat!(T::cast_i16),
        DType::U16 => flat!(T::cast_u16),
        DType::U32 => flat!(T::cast_u32),
        DType::U64 => flat!(T::cast_u64),
    }
}

pub(crate) fn clamp(x: &Storage, min: f64, max: f64) -> Storage {
    match x {
        Storage::F32(a) => clamp_t(a, min, max),
        Storage::F64(a) => clamp_t(a, min, max),
        Storage::I32(a) => clamp_t(a, min, max),
        Storage::I64(a) => clamp_t(a, min, max),
        Storage::I8(a) => clamp_t(a, min, max),
        Storage::U8(a) => clamp_t(a, min, max),
        Storage::I16(a) => clamp_t(a, min, max),
        Storage::U16(a) => clamp_t(a, min, max),
        Storage::U32(a) => clamp_t(a, min, max),
        Storage::U64(a) => clamp_t(a, min, max),
        Storage::Bool(_) => panic!("clamp: dtype bool is not accepted"),
        Storage::BF16(_) | Storage::F16(_) => super::in_f32_1(x, |w| clamp(w, min, max)),
    }
}

fn clamp_t<T: Num>(a: &ArcArray<T, IxDyn>, min: f64, max: f64) -> Storage {
    let lo = T::from_f64(min);
    let hi = T::from_f64(max);
    Storage::from_array(a.mapv(|v| v.nan_max(lo).nan_min(hi)))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_f64, t, v};
    use super::*;
    use proptest::prelude::*;

    const NAN: f64 = f64::NAN;
    const INF: f64 = f64::INFINITY;

    fn bin64(op: BinaryOp, a: &[f64], b: &[f64]) -> Vec<f64> {
        v::<f64>(&binary(op, &t(a.to_vec(), &[a.len()]), &t(b.to_vec(), &[b.len()])))
    }

    fn bin32(op: BinaryOp, a: &[i32], b: &[i32]) -> Vec<i32> {
        v::<i32>(&binary(op, &t(a.to_vec(), &[a.len()]), &t(b.to_vec(), &[b.len()])))
    }

    fn cmp64(op: BinaryOp, a: &[f64], b: &[f64]) -> Vec<bool> {
        v::<bool>(&binary(op, &t(a.to_vec(), &[a.len()]), &t(b.to_vec(), &[b.len()])))
    }

    #[test]
    fn float_arithmetic() {
        use BinaryOp::*;
        assert_eq!(bin64(Add, &[1.0, 2.0], &[0.5, -3.0]), vec![1.5, -1.0]);
        assert_eq!(bin64(Sub, &[1.0, 2.0], &[0.5, -3.0]), vec![0.5, 5.0]);
        assert_eq!(bin64(Mul, &[1.5, 2.0], &[2.0, -3.0]), vec![3.0, -6.0]);
        assert_eq!(bin64(Div, &[1.0, -1.0, 0.0, 3.0], &[0.0, 0.0, 2.0, 2.0])[..2], [INF, -INF]);
        assert!(bin64(Div, &[0.0], &[0.0])[0].is_nan());
        assert_eq!(bin64(Pow, &[2.0, 4.0, NAN, 2.0], &[10.0, 0.5, 0.0, -1.0]), vec![1024.0, 2.0, 1.0, 0.5]);
        assert_eq!(
            bin64(Rem, &[7.0, -7.0, 7.0, -7.0, 5.5], &[3.0, 3.0, -3.0, -3.0, 2.0]),
            vec![1.0, 2.0, -2.0, -1.0, 1.5]
        );
        assert!(bin64(Rem, &[1.0], &[0.0])[0].is_nan());
        let r32 = v::<f32>(&binary(Rem, &t(vec![-1.0f32], &[1]), &t(vec![3.0f32], &[1])));
        assert_eq!(r32, vec![2.0]);
    }

    #[test]
    fn maximum_minimum_propagate_nan() {
        use BinaryOp::*;
        let mx = bin64(Maximum, &[NAN, 1.0, 1.0, -INF], &[1.0, NAN, 2.0, -1.0]);
        assert!(mx[0].is_nan() && mx[1].is_nan());
        assert_eq!(mx[2..], [2.0, -1.0]);
        let mn = bin64(Minimum, &[NAN, 1.0, 1.0, INF], &[1.0, NAN, 2.0, 3.0]);
        assert!(mn[0].is_nan() && mn[1].is_nan());
        assert_eq!(mn[2..], [1.0, 3.0]);
        assert_eq!(bin32(Maximum, &[1, -5], &[0, -2]), vec![1, -2]);
        assert_eq!(bin32(Minimum, &[1, -5], &[0, -2]), vec![0, -5]);
    }

    #[test]
    fn comparisons_ieee() {
        use BinaryOp::*;
        let a = [1.0, NAN, 2.0, NAN];
        let b = [1.0, 1.0, 3.0, NAN];
        assert_eq!(cmp64(Eq, &a, &b), vec![true, false, false, false]);
        assert_eq!(cmp64(Ne, &a, &b), vec![false, true, true, true]);
        assert_eq!(cmp64(Lt, &a, &b), vec![false, false, true, false]);
        assert_eq!(cmp64(Le, &a, &b), vec![true, false, true, false]);
        assert_eq!(cmp64(Gt, &a, &b), vec![false, false, false, false]);
        assert_eq!(cmp64(Ge, &a, &b), vec![true, false, false, false]);
        let r = binary(Lt, &t(vec![1i64, 5], &[2]), &t(vec![2i64], &[1]));
        assert_eq!(v::<bool>(&r), vec![true, false]);
    }

    #[test]
    fn bool_ops() {
        use BinaryOp::*;
        let a = t(vec![true, true, false, false], &[4]);
        let b = t(vec![true, false, true, false], &[4]);
        assert_eq!(v::<bool>(&binary(LogicalAnd, &a, &b)), vec![true, false, false, false]);
        assert_eq!(v::<bool>(&binary(LogicalOr, &a, &b)), vec![true, true, true, false]);
        assert_eq!(v::<bool>(&binary(Eq, &a, &b)), vec![true, false, false, true]);
        assert_eq!(v::<bool>(&binary(Ne, &a, &b)), vec![false, true, true, false]);
    }

    #[test]
    fn bitwise_ops_on_every_integer_width_and_bool() {
        use BinaryOp::*;
        assert_eq!(bin32(BitwiseAnd, &[0b1100, -1, i32::MIN], &[0b1010, 7, -1]), vec![0b1000, 7, i32::MIN]);
        assert_eq!(bin32(BitwiseOr, &[0b1100, -8, 0], &[0b1010, 7, 0]), vec![0b1110, -1, 0]);
        assert_eq!(bin32(BitwiseXor, &[0b1100, -1, 5], &[0b1010, 0, 5]), vec![0b0110, -1, 0]);
        // Narrow integers compute widened: the low bits are the result.
        let (a, b) = (t(vec![0xF0u8, 0x0F, 0xAA], &[3]), t(vec![0x3Cu8, 0xFF, 0x55], &[3]));
        assert_eq!(v::<u8>(&binary(BitwiseAnd, &a, &b)), vec![0x30, 0x0F, 0x00]);
        assert_eq!(v::<u8>(&binary(BitwiseOr, &a, &b)), vec![0xFC, 0xFF, 0xFF]);
        assert_eq!(v::<u8>(&binary(BitwiseXor, &a, &b)), vec![0xCC, 0xF0, 0xFF]);
        let (a, b) = (t(vec![-128i8, -1, 127], &[3]), t(vec![-1i8, 0x0F, -128], &[3]));
        assert_eq!(v::<i8>(&binary(BitwiseXor, &a, &b)), vec![127, -16, -1]);
        let r = binary(BitwiseAnd, &t(vec![u64::MAX, 6], &[2]), &t(vec![1u64 << 63], &[1]));
        assert_eq!(v::<u64>(&r), vec![1 << 63, 0]);
        let (a, b) = (t(vec![true, true, false, false], &[4]), t(vec![true, false, true, false], &[4]));
        assert_eq!(v::<bool>(&binary(BitwiseAnd, &a, &b)), vec![true, false, false, false]);
        assert_eq!(v::<bool>(&binary(BitwiseOr, &a, &b)), vec![true, true, true, false]);
        assert_eq!(v::<bool>(&binary(BitwiseXor, &a, &b)), vec![false, true, true, false]);
        assert!(BitwiseAnd.result_dtype(crate::DType::F32).is_none());
    }

    #[test]
    fn int_arithmetic_wraps() {
        use BinaryOp::*;
        assert_eq!(bin32(Add, &[i32::MAX], &[1]), vec![i32::MIN]);
        assert_eq!(bin32(Sub, &[i32::MIN], &[1]), vec![i32::MAX]);
        assert_eq!(bin32(Mul, &[i32::MAX], &[2]), vec![-2]);
    }

    #[test]
    fn int_div_rem_by_zero_and_signs() {
        use BinaryOp::*;
        let a = [7, -7, 7, -7, 5, i32::MIN, 0];
        let b = [2, 2, -2, -2, 0, -1, 3];
        assert_eq!(bin32(Div, &a, &b), vec![3, -3, -3, 3, 0, i32::MIN, 0]);
        assert_eq!(bin32(Rem, &a, &b), vec![1, 1, -1, -1, 0, 0, 0]);
        let a = [-7, 7, -6, 1];
        let b = [3, -3, 3, -5];
        assert_eq!(bin32(Rem, &a, &b), vec![2, -2, 0, -4]);
        let r = binary(Div, &t(vec![-9i64, 9], &[2]), &t(vec![4i64, 0], &[2]));
        assert_eq!(v::<i64>(&r), vec![-2, 0]);
    }

    #[test]
    fn int_pow() {
        let r = bin32(BinaryOp::Pow, &[2, -3, 0, 5, 1, -1, -1, 2, 0], &[10, 3, 0, -1, -7, -2, -3, 31, 2]);
        assert_eq!(r, vec![1024, -27, 1, 0, 1, 1, -1, i32::MIN, 0]);
        let r = binary(BinaryOp::Pow, &t(vec![3i64], &[1]), &t(vec![39i64], &[1]));
        assert_eq!(v::<i64>(&r), vec![4_052_555_153_018_976_267]);
    }

    #[test]
    fn broadcasting_size1_and_rank0() {
        let a = t(vec![1.0f32, 2.0, 3.0], &[3, 1]);
        let b = t(vec![10.0f32, 20.0], &[1, 2]);
        let r = binary(BinaryOp::Add, &a, &b);
        check_f64(&r, &[3, 2], &[11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
        let s = Storage::scalar(2.0f32);
        let r = binary(BinaryOp::Mul, &s, &a);
        check_f64(&r, &[3, 1], &[2.0, 4.0, 6.0]);
        let r = binary(BinaryOp::Sub, &s, &Storage::scalar(0.5f32));
        check_f64(&r, &[], &[1.5]);
        // Empty broadcast against size 1.
        let e = Storage::full(&[0, 1], DType::I32, 0.0);
        let one = t(vec![1i32, 2, 3], &[3]);
        let r = binary(BinaryOp::Add, &e, &one);
        assert_eq!(r.shape(), &[0, 3]);
        let r = binary(BinaryOp::Lt, &e, &one);
        assert_eq!((r.dtype(), r.shape()), (DType::Bool, &[0usize, 3][..]));
    }

    #[test]
    #[should_panic(expected = "add: shapes [2] and [3] cannot be broadcast together")]
    fn incompatible_shapes_panic() {
        binary(BinaryOp::Add, &t(vec![1.0f32, 2.0], &[2]), &t(vec![1.0f32; 3], &[3]));
    }

    #[test]
    #[should_panic(expected = "different dtypes")]
    fn mixed_dtypes_panic() {
        binary(BinaryOp::Add, &t(vec![1.0f32], &[1]), &t(vec![1.0f64], &[1]));
    }

    #[test]
    fn select_broadcasts_all_three() {
        let c = t(vec![true, false], &[2, 1]);
        let a = t(vec![1i64, 2, 3], &[3]);
        let b = Storage::scalar(-1i64);
        let r = select(&c, &a, &b);
        check_f64(&r, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
        let r = select(&Storage::scalar(true), &Storage::scalar(1.0f32), &Storage::scalar(2.0f32));
        check_f64(&r, &[], &[1.0]);
        let r = select(&Storage::full(&[0, 1], DType::Bool, 0.0), &a, &b);
        assert_eq!(r.shape(), &[0, 3]);
    }

    #[test]
    fn cast_rules() {
        let x = t(vec![1.9f32, -1.9, f32::NAN, 1e20, -1e20, 0.0, -0.0], &[7]);
        assert_eq!(v::<i32>(&cast(&x, DType::I32)), vec![1, -1, 0, i32::MAX, i32::MIN, 0, 0]);
        assert_eq!(v::<bool>(&cast(&x, DType::Bool)), vec![true, true, true, true, true, false, false]);
        let b = t(vec![true, false], &[2]);
        assert_eq!(v::<f64>(&cast(&b, DType::F64)), vec![1.0, 0.0]);
        assert_eq!(v::<i64>(&cast(&b, DType::I64)), vec![1, 0]);
        let i = t(vec![3i64, 0, -2, 1 << 40], &[4]);
        assert_eq!(v::<bool>(&cast(&i, DType::Bool)), vec![true, false, true, true]);
        assert_eq!(v::<i32>(&cast(&i, DType::I32)), vec![3, 0, -2, 0]);
        assert_eq!(v::<f32>(&cast(&i, DType::F32)), vec![3.0, 0.0, -2.0, (1u64 << 40) as f32]);
        let d = t(vec![0.1f64, 1e300], &[2]);
        assert_eq!(v::<f32>(&cast(&d, DType::F32)), vec![0.1f32, f32::INFINITY]);
        // Identity cast and empty tensors.
        assert!(cast(&d, DType::F64).bit_eq(&d));
        assert_eq!(cast(&Storage::full(&[2, 0], DType::F32, 0.0), DType::I64).shape(), &[2, 0]);
    }

    #[test]
    fn clamp_rules() {
        let x = t(vec![-5.0f64, 0.5, 5.0, NAN, INF], &[5]);
        check_f64(&clamp(&x, -1.0, 1.0), &[5], &[-1.0, 0.5, 1.0, NAN, 1.0]);
        let i = t(vec![-5i32, 3, 9], &[3]);
        assert_eq!(v::<i32>(&clamp(&i, -1.5, 4.9)), vec![-1, 3, 4]);
        assert_eq!(v::<i32>(&clamp(&i, f64::NEG_INFINITY, 1e30)), vec![-5, 3, 9]);
        let r = clamp(&Storage::scalar(3.0f32), 0.0, 1.0);
        check_f64(&r, &[], &[1.0]);
    }

    // ---- property: broadcasting against a naive index mapping ----

    fn naive_broadcast_add(a: &[i64], sa: &[usize], b: &[i64], sb: &[usize]) -> (Vec<usize>, Vec<i64>) {
        let rank = sa.len().max(sb.len());
        let pad = |s: &[usize]| {
            let mut p = vec![1; rank - s.len()];
            p.extend_from_slice(s);
            p
        };
        let (pa, pb) = (pad(sa), pad(sb));
        let out: Vec<usize> = (0..rank).map(|i| if pa[i] == 1 { pb[i] } else { pa[i] }).collect();
        let n: usize = out.iter().product();
        let flat = |idx: &[usize], s: &[usize]| {
            idx.iter().zip(s).fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
        };
        let mut vals = Vec::with_capacity(n);
        for lin in 0..n {
            let mut idx = vec![0; rank];
            let mut r = lin;
            for ax in (0..rank).rev() {
                idx[ax] = r % out[ax];
                r /= out[ax];
            }
            vals.push(a[flat(&idx, &pa)] * 1000 + b[flat(&idx, &pb)]);
        }
        (out, vals)
    }

    fn compatible_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        prop::collection::vec((prop_oneof![0usize..4, 8usize..12], 0u8..3, 0u8..3), 0..4).prop_flat_map(|dims| {
            let mut a = Vec::new();
            let mut b = Vec::new();
            for (d, ka, kb) in dims {
                // Each side keeps the dim or replaces it by 1.
                a.push(if ka == 0 { 1 } else { d });
                b.push(if kb == 0 { 1 } else { d });
            }
            (0..=a.len(), 0..=b.len()).prop_map(move |(da, db)| (a[da..].to_vec(), b[db..].to_vec()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn broadcasting_matches_naive((sa, sb) in compatible_shapes()) {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let a: Vec<i64> = (0..na as i64).collect();
            let b: Vec<i64> = (0..nb as i64).map(|x| x + 1).collect();
            let sa_ = t(a.clone(), &sa);
            let sb_ = t(b.clone(), &sb);
            let thousand = Storage::scalar(1000i64);
            let r = binary(BinaryOp::Add, &binary(BinaryOp::Mul, &sa_, &thousand), &sb_);
            let (shape, vals) = naive_broadcast_add(&a, &sa, &b, &sb);
            prop_assert_eq!(r.shape(), &shape[..]);
            prop_assert_eq!(v::<i64>(&r.to_standard()), vals.clone());
            // A transposed operand (rows neither contiguous nor broadcast)
            // gives the same values.
            let perm: Vec<usize> = (0..sa.len()).rev().collect();
            let at = crate::kernels::transpose(&crate::kernels::transpose(&sa_, &perm).to_standard(), &perm);
            let rt = binary(BinaryOp::Add, &binary(BinaryOp::Mul, &at, &thousand), &sb_);
            prop_assert_eq!(v::<i64>(&rt.to_standard()), vals);
            // select(c, x, y) against c·x + (1 - c)·y (arithmetic checked
            // above), with y broadcast from `sb` or a scalar.
            let i = |x: i64| Storage::scalar(x);
            let cond = binary(BinaryOp::Eq, &binary(BinaryOp::Rem, &sa_, &i(2)), &i(0));
            let ci = cast(&cond, DType::I64);
            let x = binary(BinaryOp::Mul, &sa_, &thousand);
            for y in [sb_.clone(), i(-7)] {
                let expected = binary(BinaryOp::Add, &binary(BinaryOp::Mul, &ci, &x),
                    &binary(BinaryOp::Mul, &binary(BinaryOp::Sub, &i(1), &ci), &y));
                let got = select(&cond, &x, &y);
                prop_assert_eq!(got.shape(), expected.shape());
                prop_assert_eq!(v::<i64>(&got.to_standard()), v::<i64>(&expected.to_standard()));
                let flipped = select(&binary(BinaryOp::Eq, &cond, &Storage::scalar(false)), &y, &x);
                prop_assert_eq!(v::<i64>(&flipped.to_standard()), v::<i64>(&expected.to_standard()));
            }
            prop_assert_eq!(broadcast_shapes(&sa, &sb), Some(shape));
        }
    }
}
