//! Scalar arithmetic shared by the kernels: one trait for every numeric
//! element ([`Num`]: the binary ops and the reduction steps, with the integer
//! wrapping and division rules written once), one for the float-only math
//! ([`Float`]), one for the integer-only unary ops ([`Int`]), and [`Cast`], the
//! `as`-style conversion between any two element types.
//!
//! These are private helpers: the semantics they implement are documented on
//! the [`kernels`](super) module.

use crate::StorageElement;

/// The element-level arithmetic of the numeric dtypes (bf16 and f16 excepted:
/// they compute in f32). The narrow integers implement it natively in their
/// own width with wrapping, which equals computing in their
/// [`compute`](crate::DType::compute) dtype and wrapping the result back.
pub(crate) trait Num: StorageElement + PartialOrd {
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// `a + b`, wrapping for integers.
    fn plus(self, o: Self) -> Self;
    /// `a - b`, wrapping for integers.
    fn minus(self, o: Self) -> Self;
    /// `a * b`, wrapping for integers.
    fn times(self, o: Self) -> Self;
    /// IEEE division for floats; truncating, wrapping, `x / 0 = 0` for integers.
    fn divide(self, o: Self) -> Self;
    /// Python-style modulo: the result has the sign of the divisor.
    fn modulo(self, o: Self) -> Self;
    /// `a ** b` (see the module docs of `kernels` for integers).
    fn power(self, o: Self) -> Self;
    /// numpy `maximum`: NaN if either operand is NaN.
    fn nan_max(self, o: Self) -> Self;
    /// numpy `minimum`: NaN if either operand is NaN.
    fn nan_min(self, o: Self) -> Self;
    /// True for a float NaN; always false for integers.
    fn is_nan_value(self) -> bool;
}

/// The float-only element math.
pub(crate) trait Float: Num {
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn sign(self) -> Self;
    fn exp(self) -> Self;
    fn expm1(self) -> Self;
    fn ln(self) -> Self;
    fn ln1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn rsqrt(self) -> Self;
    fn square(self) -> Self;
    fn recip(self) -> Self;
    fn tanh(self) -> Self;
    fn sigmoid(self) -> Self;
    fn relu(self) -> Self;
    fn erf(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn sinh(self) -> Self;
    fn cosh(self) -> Self;
    fn atan(self) -> Self;
    fn softplus(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_even(self) -> Self;
    fn is_finite_value(self) -> bool;
}

/// The integer-only unary ops (all wrapping).
pub(crate) trait Int: Num {
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn sign(self) -> Self;
    fn square(self) -> Self;
    fn relu(self) -> Self;
}

macro_rules! impl_float {
    ($t:ident, $erf:path) => {
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn plus(self, o: Self) -> Self {
                self + o
            }
            #[inline]
            fn minus(self, o: Self) -> Self {
                self - o
            }
            #[inline]
            fn times(self, o: Self) -> Self {
                self * o
            }
            #[inline]
            fn divide(self, o: Self) -> Self {
                self / o
            }
            #[inline]
            fn modulo(self, o: Self) -> Self {
                // numpy's npy_divmod: fmod, then move a non-zero remainder to
                // the divisor's side; a zero remainder takes the divisor's sign.
                let r = self % o;
                if r != 0.0 {
                    if (r < 0.0) != (o < 0.0) {
                        r + o
                    } else {
                        r
                    }
                } else {
                    <$t>::copysign(0.0, o)
                }
            }
            #[inline]
            fn power(self, o: Self) -> Self {
                self.powf(o)
            }
            #[inline]
            fn nan_max(self, o: Self) -> Self {
                // A conditional move: which operand wins is data, not a
                // pattern a branch predictor learns.
                std::hint::select_unpredictable(self.is_nan() || self >= o, self, o)
            }
            #[inline]
            fn nan_min(self, o: Self) -> Self {
                std::hint::select_unpredictable(self.is_nan() || self <= o, self, o)
            }
            #[inline]
            fn is_nan_value(self) -> bool {
                self.is_nan()
            }
        }

        impl Float for $t {
            #[inline]
            fn neg(self) -> Self {
                -self
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn sign(self) -> Self {
                if self.is_nan() {
                    self
                } else if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn expm1(self) -> Self {
                <$t>::exp_m1(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn ln1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn rsqrt(self) -> Self {
                1.0 / <$t>::sqrt(self)
            }
            #[inline]
            fn square(self) -> Self {
                self * self
            }
            #[inline]
            fn recip(self) -> Self {
                1.0 / self
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn sigmoid(self) -> Self {
                // Never exponentiate a large positive number: for x < 0 use
                // e^x / (1 + e^x). NaN takes the second branch and stays NaN.
                if self < 0.0 {
                    let e = <$t>::exp(self);
                    e / (1.0 + e)
                } else {
                    1.0 / (1.0 + <$t>::exp(-self))
                }
            }
            #[inline]
            fn relu(self) -> Self {
                if self.is_nan() || self > 0.0 {
                    self
                } else {
                    0.0
                }
            }
            #[inline]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline]
            fn sinh(self) -> Self {
                <$t>::sinh(self)
            }
            #[inline]
            fn cosh(self) -> Self {
                <$t>::cosh(self)
            }
            #[inline]
            fn atan(self) -> Self {
                <$t>::atan(self)
            }
            #[inline]
            fn softplus(self) -> Self {
                // max(x, 0) + ln(1 + e^-|x|): e^-|x| never overflows, and for
                // large |x| the second term vanishes instead of giving inf - inf.
                // NaN stays NaN through the second term.
                let m = if self > 0.0 { self } else { 0.0 };
                m + <$t>::ln_1p(<$t>::exp(-<$t>::abs(self)))
            }
            #[inline]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline]
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            #[inline]
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            #[inline]
            fn is_finite_value(self) -> bool {
                self.is_finite()
            }
        }
    };
}
impl_float!(f32, libm::erff);
impl_float!(f64, libm::erf);

/// `base ** exp` by squaring with wrapping products (`mul`): an integer
/// power that wraps as its products do, for every integer type.
#[inline]
fn wrapping_power<T: Copy>(mut base: T, mut exp: u64, one: T, mul: fn(T, T) -> T) -> T {
    let mut acc = one;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = mul(acc, base);
        }
        exp >>= 1;
        if exp > 0 {
            base = mul(base, base);
        }
    }
    acc
}

macro_rules! impl_int {
    ($t:ident) => {
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline]
            fn plus(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline]
            fn minus(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline]
            fn times(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline]
            fn divide(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline]
            fn modulo(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(o);
                // |r| < |o| and the signs differ, so this cannot overflow.
                if r != 0 && ((r < 0) != (o < 0)) {
                    r + o
                } else {
                    r
                }
            }
            #[inline]
            fn power(self, o: Self) -> Self {
                if o < 0 {
                    // The real result truncated toward zero.
                    return match self {
                        1 => 1,
                        -1 if o % 2 == 0 => 1,
                        -1 => -1,
                        _ => 0,
                    };
                }
                wrapping_power(self, o as u64, 1, <$t>::wrapping_mul)
            }
            #[inline]
            fn nan_max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline]
            fn nan_min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline]
            fn is_nan_value(self) -> bool {
                false
            }
        }

        impl Int for $t {
            #[inline]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline]
            fn abs(self) -> Self {
                self.wrapping_abs()
            }
            #[inline]
            fn sign(self) -> Self {
                self.signum()
            }
            #[inline]
            fn square(self) -> Self {
                self.wrapping_mul(self)
            }
            #[inline]
            fn relu(self) -> Self {
                Ord::max(self, 0)
            }
        }
    };
}
impl_int!(i32);
impl_int!(i64);
impl_int!(i8);
impl_int!(i16);

// The unsigned integers: the same rules where a sign cannot arise (no
// negative exponent, remainder and divisor are never of opposite signs).
macro_rules! impl_uint {
    ($t:ident) => {
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline]
            fn plus(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline]
            fn minus(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline]
            fn times(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline]
            fn divide(self, o: Self) -> Self {
                self.checked_div(o).unwrap_or(0)
            }
            #[inline]
            fn modulo(self, o: Self) -> Self {
                self.checked_rem(o).unwrap_or(0)
            }
            #[inline]
            fn power(self, o: Self) -> Self {
                wrapping_power(self, o as u64, 1, <$t>::wrapping_mul)
            }
            #[inline]
            fn nan_max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline]
            fn nan_min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline]
            fn is_nan_value(self) -> bool {
                false
            }
        }

        impl Int for $t {
            #[inline]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline]
            fn abs(self) -> Self {
                self
            }
            #[inline]
            fn sign(self) -> Self {
                Self::from(self != 0)
            }
            #[inline]
            fn square(self) -> Self {
                self.wrapping_mul(self)
            }
            #[inline]
            fn relu(self) -> Self {
                self
            }
        }
    };
}
impl_uint!(u8);
impl_uint!(u16);
impl_uint!(u32);
impl_uint!(u64);

/// `as`-style conversion from one element type to each of the thirteen
/// (float to integer truncates toward zero and saturates, NaN to 0; integer
/// to integer keeps the low bits, i.e. wraps); to
/// the 16-bit floats it rounds to nearest even once, straight from the
/// source value (NaN stays NaN, f16 overflows to ±Inf, subnormals kept).
pub(crate) trait Cast: StorageElement {
    fn cast_f32(self) -> f32;
    fn cast_f64(self) -> f64;
    fn cast_i32(self) -> i32;
    fn cast_i64(self) -> i64;
    fn cast_bool(self) -> bool;
    fn cast_i8(self) -> i8;
    fn cast_u8(self) -> u8;
    fn cast_i16(self) -> i16;
    fn cast_u16(self) -> u16;
    fn cast_u32(self) -> u32;
    fn cast_u64(self) -> u64;
    fn cast_bf16(self) -> half::bf16 {
        crate::Element::from_f64(self.cast_f64())
    }
    fn cast_f16(self) -> half::f16 {
        crate::Element::from_f64(self.cast_f64())
    }
}

macro_rules! impl_cast {
    ($t:ident, $zero:expr) => {
        impl Cast for $t {
            #[inline]
            fn cast_f32(self) -> f32 {
                self as f32
            }
            #[inline]
            fn cast_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn cast_i32(self) -> i32 {
                self as i32
            }
            #[inline]
            fn cast_i64(self) -> i64 {
                self as i64
            }
            #[inline]
            #[allow(clippy::float_cmp)]
            fn cast_bool(self) -> bool {
                // NaN != 0, so NaN is true.
                self != $zero
            }
            narrow_casts!(|x: $t| x);
        }
    };
}

// The six narrow-integer casts, each `as` from the value `$conv` makes of
// `self` (the value itself, or a 16-bit float widened to f32).
macro_rules! narrow_casts {
    (|$x:ident: $t:ty| $conv:expr) => {
        #[inline]
        fn cast_i8(self) -> i8 {
            let $x = self;
            $conv as i8
        }
        #[inline]
        fn cast_u8(self) -> u8 {
            let $x = self;
            $conv as u8
        }
        #[inline]
        fn cast_i16(self) -> i16 {
            let $x = self;
            $conv as i16
        }
        #[inline]
        fn cast_u16(self) -> u16 {
            let $x = self;
            $conv as u16
        }
        #[inline]
        fn cast_u32(self) -> u32 {
            let $x = self;
            $conv as u32
        }
        #[inline]
        fn cast_u64(self) -> u64 {
            let $x = self;
            $conv as u64
        }
    };
}
impl_cast!(f32, 0.0);
impl_cast!(f64, 0.0);

// The 16-bit floats widen exactly to f32 and convert from there (to each
// other through the trait's exact-widening default, like every type).
macro_rules! impl_half_cast {
    ($t:ty) => {
        impl Cast for $t {
            #[inline]
            fn cast_f32(self) -> f32 {
                self.to_f32()
            }
            #[inline]
            fn cast_f64(self) -> f64 {
                self.to_f64()
            }
            #[inline]
            fn cast_i32(self) -> i32 {
                self.to_f32() as i32
            }
            #[inline]
            fn cast_i64(self) -> i64 {
                self.to_f32() as i64
            }
            #[inline]
            fn cast_bool(self) -> bool {
                self.to_f32() != 0.0
            }
            narrow_casts!(|x: $t| x.to_f32());
        }
    };
}
impl_half_cast!(half::bf16);
impl_half_cast!(half::f16);
impl_cast!(i32, 0);
impl_cast!(i64, 0);
impl_cast!(i8, 0);
impl_cast!(u8, 0);
impl_cast!(i16, 0);
impl_cast!(u16, 0);
impl_cast!(u32, 0);
impl_cast!(u64, 0);

impl Cast for bool {
    #[inline]
    fn cast_f32(self) -> f32 {
        u8::from(self) as f32
    }
    #[inline]
    fn cast_f64(self) -> f64 {
        u8::from(self) as f64
    }
    #[inline]
    fn cast_i32(self) -> i32 {
        i32::from(self)
    }
    #[inline]
    fn cast_i64(self) -> i64 {
        i64::from(self)
    }
    #[inline]
    fn cast_bool(self) -> bool {
        self
    }
    narrow_casts!(|x: bool| u8::from(x));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_pow_rules() {
        assert_eq!(3i32.power(4), 81);
        assert_eq!(2i32.power(0), 1);
        assert_eq!(0i32.power(0), 1);
        assert_eq!(0i32.power(5), 0);
        assert_eq!((-2i32).power(3), -8);
        assert_eq!(2i32.power(31), i32::MIN); // wraps
        assert_eq!(2i32.power(32), 0); // wraps
        assert_eq!(3i64.power(40), 3i64.wrapping_pow(40));
        assert_eq!(200u8.power(2), 64); // 40000 mod 256
        assert_eq!((-3i8).power(5), 13); // -243 mod 256
        assert_eq!(3u64.power(1000), 3u64.wrapping_pow(1000));
        assert_eq!(7i32.power(-1), 0);
        assert_eq!(0i32.power(-1), 0);
        assert_eq!(1i32.power(-5), 1);
        assert_eq!((-1i32).power(-3), -1);
        assert_eq!((-1i64).power(-4), 1);
        assert_eq!(i32::MIN.power(i32::MIN), 0);
    }

    #[test]
    fn int_div_rem_rules() {
        assert_eq!(7i32.divide(2), 3);
        assert_eq!((-7i32).divide(2), -3);
        assert_eq!(7i32.divide(-2), -3);
        assert_eq!(5i32.divide(0), 0);
        assert_eq!(i32::MIN.divide(-1), i32::MIN);
        assert_eq!(7i32.modulo(3), 1);
        assert_eq!((-7i32).modulo(3), 2);
        assert_eq!(7i32.modulo(-3), -2);
        assert_eq!((-7i32).modulo(-3), -1);
        assert_eq!((-6i32).modulo(3), 0);
        assert_eq!(5i64.modulo(0), 0);
        assert_eq!(i64::MIN.modulo(-1), 0);
        assert_eq!(i32::MIN.modulo(i32::MAX), i32::MAX - 1);
    }

    #[test]
    fn float_rem_rules() {
        assert_eq!(7.0f64.modulo(3.0), 1.0);
        assert_eq!((-7.0f64).modulo(3.0), 2.0);
        assert_eq!(7.0f64.modulo(-3.0), -2.0);
        assert_eq!((-7.5f32).modulo(-2.0), -1.5);
        let z = 6.0f64.modulo(-3.0);
        assert!(z == 0.0 && z.is_sign_negative());
        let z = (-6.0f64).modulo(3.0);
        assert!(z == 0.0 && z.is_sign_positive());
        assert!(1.0f64.modulo(0.0).is_nan());
        assert!(f64::INFINITY.modulo(2.0).is_nan());
        assert_eq!(5.0f64.modulo(f64::INFINITY), 5.0);
        assert_eq!((-5.0f64).modulo(f64::INFINITY), f64::INFINITY);
        assert!(f64::NAN.modulo(2.0).is_nan());
    }

    #[test]
    fn float_maximum_minimum() {
        assert!(f32::NAN.nan_max(1.0).is_nan());
        assert!(1.0f32.nan_max(f32::NAN).is_nan());
        assert!(f32::NAN.nan_min(1.0).is_nan());
        assert!(1.0f32.nan_min(f32::NAN).is_nan());
        assert_eq!(2.0f32.nan_max(1.0), 2.0);
        assert_eq!(2.0f32.nan_min(1.0), 1.0);
        assert_eq!(f64::NEG_INFINITY.nan_max(-1.0), -1.0);
    }

    #[test]
    fn casts() {
        assert_eq!(f32::NAN.cast_i32(), 0);
        assert_eq!(1e20f32.cast_i32(), i32::MAX);
        assert_eq!((-1e20f64).cast_i64(), i64::MIN);
        assert_eq!((-2.9f64).cast_i32(), -2);
        assert!(f64::NAN.cast_bool());
        assert!(!(-0.0f32).cast_bool());
        assert!(true.cast_f32() == 1.0 && false.cast_i64() == 0);
        assert_eq!(i64::MAX.cast_i32(), -1);
    }
}
