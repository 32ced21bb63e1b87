//! Elementwise ONNX ops: arithmetic, comparisons and logic (numpy
//! broadcasting, as `Tensor`'s binary ops), the math functions, the
//! activations composed from primitives by their spec's formulas, `Where`,
//! `Clip`, `Cast` / `CastLike`, and the variadic `Sum` / `Mean` / `Max` /
//! `Min`.
//!
//! Compositions are chosen to be exact where the formula allows (PRelu as a
//! select, Clip as maximum/minimum, Mod with `fmod=1` from the remainder
//! with the divisor's sign); the others (`Tan` as sin/cos, `Asinh` ...) are
//! within a few ulps of the direct function, well inside the backend tests'
//! tolerance.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};

fn one(t: Tensor) -> OpResult {
    Ok(vec![t])
}

/// A float-only unary op: integers are refused with the op's name.
fn float_input<'a>(n: &'a Node) -> Result<&'a Tensor, String> {
    let x = n.input(0)?;
    if !x.dtype().is_float() {
        return Err(format!("{} takes a float tensor, got {}", n.op_type, x.dtype()));
    }
    Ok(x)
}

/// A rank-0 tensor of `like`'s dtype.
pub(crate) fn scalar_like(like: &Tensor, v: f64) -> Tensor {
    Tensor::full(&[], v, like.dtype())
}

macro_rules! unary {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            pub(crate) fn $name(n: &mut Node) -> OpResult {
                one(n.input(0)?.$method())
            }
        )*
    };
}

unary!(
    abs => abs, neg => neg, sign => sign, exp => exp, log => log, sqrt => sqrt, reciprocal => reciprocal,
    tanh => tanh, sigmoid => sigmoid, relu => relu, erf => erf, sin => sin, cos => cos, sinh => sinh,
    cosh => cosh, floor => floor, ceil => ceil, round => round, not => logical_not, is_nan => is_nan,
    softplus => softplus,
);

/// `Identity` (and inference-mode pass-throughs).
pub(crate) fn identity(n: &mut Node) -> OpResult {
    one(n.input(0)?.clone())
}

/// `Tan` as `sin / cos`.
pub(crate) fn tan(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one(x.sin() / x.cos())
}

/// `Atan`.
pub(crate) fn atan(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one(x.atan())
}

/// `Asin` as `atan(x / sqrt((1 - x)(1 + x)))`: ±pi/2 at ±1 (the quotient
/// is infinite there), NaN past them; the factors keep `1 - x²` exact
/// near ±1, where `1 - x·x` would cancel.
pub(crate) fn asin(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let d = ((x.neg() + 1.0) * (x.clone() + 1.0)).sqrt();
    one((x / d).atan())
}

/// `Acos` as `2 · atan(sqrt((1 - x) / (1 + x)))`: accurate near 1, where
/// `pi/2 - asin(x)` would cancel; pi at -1, NaN past ±1.
pub(crate) fn acos(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one(((x.neg() + 1.0) / (x.clone() + 1.0)).sqrt().atan() * 2.0)
}

/// `Asinh` as `sign(x) · ln(|x| + sqrt(x² + 1))` (odd, so no cancellation for negative x).
pub(crate) fn asinh(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let a = x.abs();
    one(x.sign() * (&a + (a.square() + 1.0).sqrt()).log())
}

/// `Acosh` as `ln(x + sqrt(x² - 1))`.
pub(crate) fn acosh(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one((x + (x.square() - 1.0).sqrt()).log())
}

/// `Atanh` as `(ln(1 + x) - ln(1 - x)) / 2` with `log1p` for accuracy near 0.
pub(crate) fn atanh(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one((x.log1p() - x.neg().log1p()) * 0.5)
}

/// `IsInf` with `detect_positive` / `detect_negative`.
pub(crate) fn is_inf(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let inf = x.is_finite().logical_not().logical_and(x.is_nan().logical_not());
    let pos = n.attr_i("detect_positive", 1)? != 0;
    let neg = n.attr_i("detect_negative", 1)? != 0;
    let zero = scalar_like(x, 0.0);
    one(match (pos, neg) {
        (true, true) => inf,
        (true, false) => inf.logical_and(x.gt(&zero)),
        (false, true) => inf.logical_and(x.lt(&zero)),
        (false, false) => Tensor::zeros(x.shape(), DType::Bool),
    })
}

macro_rules! binary {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            pub(crate) fn $name(n: &mut Node) -> OpResult {
                let (a, b) = (n.input(0)?, n.input(1)?);
                same_dtype(n, a, b)?;
                one(a.$method(b))
            }
        )*
    };
}

binary!(
    add => add, sub => sub, mul => mul, equal => eq, less => lt, greater => gt, less_or_equal => le,
    greater_or_equal => ge, and => logical_and, or => logical_or, xor => ne, bitwise_and => bitwise_and,
    bitwise_or => bitwise_or, bitwise_xor => bitwise_xor,
);

fn same_dtype(n: &Node, a: &Tensor, b: &Tensor) -> Result<(), String> {
    if a.dtype() != b.dtype() {
        return Err(format!("{} operands have different dtypes ({} and {})", n.op_type, a.dtype(), b.dtype()));
    }
    Ok(())
}

/// `Div`: integers truncate toward zero, as ONNX's reference (C semantics).
pub(crate) fn div(n: &mut Node) -> OpResult {
    let (a, b) = (n.input(0)?, n.input(1)?);
    same_dtype(n, a, b)?;
    one(a.div(b))
}

/// `Pow`: the exponent may have another dtype (it is cast to the base's;
/// an integer base with a float exponent computes in f64 and truncates, as
/// numpy's cast of the result does).
pub(crate) fn pow(n: &mut Node) -> OpResult {
    let (a, b) = (n.input(0)?, n.input(1)?);
    if a.dtype().is_int() && b.dtype().is_float() {
        return one(a.cast(DType::F64).pow(b.cast(DType::F64)).cast(a.dtype()));
    }
    one(a.pow(b.cast(a.dtype())))
}

/// `Mod`: `fmod=0` is Python's remainder (the divisor's sign), `fmod=1`
/// C's `fmod` (the dividend's sign), derived from it: they differ by one
/// divisor exactly when the signs differ and the remainder is not zero.
pub(crate) fn modulo(n: &mut Node) -> OpResult {
    let (a, b) = (n.input(0)?, n.input(1)?);
    same_dtype(n, a, b)?;
    let r = a.rem(b);
    if n.attr_i("fmod", 0)? == 0 {
        if a.dtype().is_float() {
            return Err("Mod with fmod=0 is defined for integers only".into());
        }
        return one(r);
    }
    let zero = scalar_like(a, 0.0);
    let differ = r.ne(&zero).logical_and(r.lt(&zero).ne(a.lt(&zero)));
    let c = Tensor::select(&differ, &(&r - b), &r);
    // fmod(x, ±0) and fmod(±inf, y) are NaN for floats; `rem` gives NaN there too.
    one(c)
}

fn fold(n: &Node, f: impl Fn(&Tensor, &Tensor) -> Tensor) -> Result<Tensor, String> {
    let xs: Vec<&Tensor> = n.inputs.iter().flatten().collect();
    let (first, rest) = xs.split_first().ok_or_else(|| format!("{} needs at least one input", n.op_type))?;
    let mut acc = (*first).clone();
    for x in rest {
        same_dtype(n, &acc, x)?;
        acc = f(&acc, x);
    }
    Ok(acc)
}

/// Variadic `Max`.
pub(crate) fn max(n: &mut Node) -> OpResult {
    one(fold(n, |a, b| a.maximum(b))?)
}

/// Variadic `Min`.
pub(crate) fn min(n: &mut Node) -> OpResult {
    one(fold(n, |a, b| a.minimum(b))?)
}

/// Variadic `Sum`.
pub(crate) fn sum(n: &mut Node) -> OpResult {
    one(fold(n, |a, b| a + b)?)
}

/// Variadic `Mean`.
pub(crate) fn mean(n: &mut Node) -> OpResult {
    let count = n.inputs.iter().flatten().count() as f64;
    let s = fold(n, |a, b| a + b)?;
    one(&s / scalar_like(&s, count))
}

/// `Where(cond, a, b)`.
pub(crate) fn where_(n: &mut Node) -> OpResult {
    let (c, a, b) = (n.input(0)?, n.input(1)?, n.input(2)?);
    one(Tensor::select(c, a, b))
}

/// `Clip`: bounds from attributes (before opset 11) or optional inputs;
/// `max(min(x, hi), lo)` order per the spec (so `lo > hi` gives `hi`... the
/// reference applies `np.clip`, which gives `hi`), NaN propagating.
pub(crate) fn clip(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (lo, hi) = if n.opset < 11 {
        let lo = n.attr_f("min", f32::NEG_INFINITY)?;
        let hi = n.attr_f("max", f32::INFINITY)?;
        (Some(scalar_like(x, lo as f64)), Some(scalar_like(x, hi as f64)))
    } else {
        (n.opt_input(1).cloned(), n.opt_input(2).cloned())
    };
    let mut y = x.clone();
    if let Some(lo) = lo {
        y = y.maximum(lo.reshape(&[]));
    }
    if let Some(hi) = hi {
        y = y.minimum(hi.reshape(&[]));
    }
    one(y)
}

/// `Cast` among tracejit's dtypes.
pub(crate) fn cast(n: &mut Node) -> OpResult {
    let to = n.attr_dtype("to", DType::F32)?;
    if !n.has_attr("to") {
        return Err("Cast needs the attribute 'to'".into());
    }
    one(n.input(0)?.cast(to))
}

/// `CastLike`: to the dtype of the second input.
pub(crate) fn cast_like(n: &mut Node) -> OpResult {
    let to = n.input(1)?.dtype();
    one(n.input(0)?.cast(to))
}

/// `PRelu`: `x < 0 ? slope · x : x`, the slope broadcasting (exact). A
/// 1-D slope of the channel count that does not broadcast numpy's way is
/// per channel (axis 1), as PyTorch's exports before opset 7 mean it.
pub(crate) fn prelu(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let mut slope = n.input(1)?.clone();
    let trailing_fits = slope.rank() == 1 && x.shape().last().is_some_and(|&d| d == slope.len() || slope.len() == 1);
    if slope.rank() == 1 && !trailing_fits && x.rank() >= 2 && x.shape()[1] == slope.len() {
        let mut shape = vec![1i64; x.rank()];
        shape[1] = slope.len() as i64;
        slope = slope.reshape(&shape);
    }
    let slope = &slope;
    let zero = scalar_like(x, 0.0);
    one(Tensor::select(&x.lt(&zero), &(x * slope), x))
}

/// `LeakyRelu`.
pub(crate) fn leaky_relu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = n.attr_f("alpha", 0.01)? as f64;
    let zero = scalar_like(x, 0.0);
    one(Tensor::select(&x.lt(&zero), &(x * scalar_like(x, alpha)), x))
}

/// `Elu`.
pub(crate) fn elu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = n.attr_f("alpha", 1.0)? as f64;
    let zero = scalar_like(x, 0.0);
    one(Tensor::select(&x.lt(&zero), &(x.expm1() * scalar_like(x, alpha)), x))
}

/// `Celu`: `max(0, x) + min(0, alpha · (exp(x / alpha) - 1))`.
pub(crate) fn celu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = scalar_like(x, n.attr_f("alpha", 1.0)? as f64);
    let zero = scalar_like(x, 0.0);
    one(x.maximum(&zero) + ((x / &alpha).expm1() * &alpha).minimum(&zero))
}

/// `Selu`.
pub(crate) fn selu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = n.attr_f("alpha", 1.673_263_2)? as f64;
    let gamma = scalar_like(x, n.attr_f("gamma", 1.050_701)? as f64);
    let zero = scalar_like(x, 0.0);
    let neg = x.exp() * scalar_like(x, alpha) - scalar_like(x, alpha);
    one(Tensor::select(&x.gt(&zero), x, &neg) * gamma)
}

/// `ThresholdedRelu`: `x > alpha ? x : 0`.
pub(crate) fn thresholded_relu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = scalar_like(x, n.attr_f("alpha", 1.0)? as f64);
    one(Tensor::select(&x.gt(&alpha), x, &scalar_like(x, 0.0)))
}

/// `HardSigmoid`: `max(0, min(1, alpha · x + beta))`.
pub(crate) fn hard_sigmoid(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = scalar_like(x, n.attr_f("alpha", 0.2)? as f64);
    let beta = scalar_like(x, n.attr_f("beta", 0.5)? as f64);
    one((x * alpha + beta).minimum(scalar_like(x, 1.0)).maximum(scalar_like(x, 0.0)))
}

/// `HardSwish`: `x · max(0, min(1, x / 6 + 1/2))`.
pub(crate) fn hard_swish(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let hs =
        (x * scalar_like(x, 1.0 / 6.0) + scalar_like(x, 0.5)).minimum(scalar_like(x, 1.0)).maximum(scalar_like(x, 0.0));
    one(x * hs)
}

/// `Softsign`: `x / (1 + |x|)`.
pub(crate) fn softsign(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one(x / (x.abs() + scalar_like(x, 1.0)))
}

/// `Mish`: `x · tanh(softplus(x))`.
pub(crate) fn mish(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    one(x * x.softplus().tanh())
}

/// `Swish` (opset 24): `x · sigmoid(alpha · x)`.
pub(crate) fn swish(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let alpha = scalar_like(x, n.attr_f("alpha", 1.0)? as f64);
    one(x * (x * alpha).sigmoid())
}

/// `Gelu` (opset 20): exact (`erf`) or the tanh approximation.
pub(crate) fn gelu(n: &mut Node) -> OpResult {
    let x = float_input(n)?;
    let half = scalar_like(x, 0.5);
    let one_ = scalar_like(x, 1.0);
    match n.attr_s("approximate", "none")?.as_str() {
        "none" => one(x * &half * ((x * scalar_like(x, std::f64::consts::FRAC_1_SQRT_2)).erf() + one_)),
        "tanh" => {
            let c = scalar_like(x, (2.0 / std::f64::consts::PI).sqrt());
            let inner = (x + x.pow(scalar_like(x, 3.0)) * scalar_like(x, 0.044715)) * c;
            one(x * half * (inner.tanh() + one_))
        }
        other => Err(format!("approximate='{other}' is not 'none' or 'tanh'")),
    }
}

/// `Shrink`: `x < -lambd ? x + bias : x > lambd ? x - bias : 0`.
pub(crate) fn shrink(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let lambd = n.attr_f("lambd", 0.5)? as f64;
    let bias = n.attr_f("bias", 0.0)? as f64;
    let (xf, back) = if x.dtype().is_float() { (x.clone(), None) } else { (x.cast(DType::F64), Some(x.dtype())) };
    let l = scalar_like(&xf, lambd);
    let b = scalar_like(&xf, bias);
    let zero = scalar_like(&xf, 0.0);
    let y = Tensor::select(&xf.lt(l.neg()), &(&xf + &b), &Tensor::select(&xf.gt(&l), &(&xf - &b), &zero));
    one(match back {
        Some(d) => y.cast(d),
        None => y,
    })
}
