//! The reference semantics of single elements, for code outside this crate
//! that must compute exactly what the kernels compute (the JIT's per-element
//! helpers call these instead of restating the rules, so the two cannot
//! drift apart).

use super::num::{Float, Num};

/// Python-style float remainder (the result has the divisor's sign), as `rem`.
pub fn rem_f32(a: f32, b: f32) -> f32 {
    Num::modulo(a, b)
}

/// Python-style float remainder (the result has the divisor's sign), as `rem`.
pub fn rem_f64(a: f64, b: f64) -> f64 {
    Num::modulo(a, b)
}

/// Integer power with wrapping and truncated negative exponents, as `pow`.
pub fn pow_i32(a: i32, b: i32) -> i32 {
    Num::power(a, b)
}

/// Integer power with wrapping and truncated negative exponents, as `pow`.
pub fn pow_i64(a: i64, b: i64) -> i64 {
    Num::power(a, b)
}

/// The logistic function computed as the reference does (stable for large |x|).
pub fn sigmoid_f32(x: f32) -> f32 {
    Float::sigmoid(x)
}

/// The logistic function computed as the reference does (stable for large |x|).
pub fn sigmoid_f64(x: f64) -> f64 {
    Float::sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_element_rules() {
        assert_eq!(rem_f32(-1.0, 3.0), 2.0);
        assert_eq!(rem_f64(1.0, -3.0), -2.0);
        assert_eq!(pow_i32(2, 10), 1024);
        assert_eq!(pow_i64(-1, -3), -1);
        assert_eq!(pow_i32(5, -1), 0);
        assert_eq!(sigmoid_f64(0.0), 0.5);
        assert!(sigmoid_f32(-200.0) >= 0.0);
    }
}
