//! Output comparison as ONNX's backend test runner does it: dtypes and
//! shapes exactly, floats within `|got - want| <= atol + rtol · |want|`
//! (NaN matches NaN, infinities match themselves), integers and bools
//! exactly.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

/// ONNX's backend tolerance for these tests.
pub const RTOL: f64 = 1e-3;
/// ONNX's backend absolute tolerance.
pub const ATOL: f64 = 1e-5;

/// `None` when `got` matches `want`, else what differs (short: it becomes
/// a failure reason, grouped across tests).
pub fn mismatch(got: &Tensor, want: &Tensor) -> Option<String> {
    if got.dtype() != want.dtype() {
        return Some(format!("wrong dtype: {} instead of {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Some(format!("wrong shape: {:?} instead of {:?}", got.shape(), want.shape()));
    }
    let d = want.dtype();
    if d.is_float() {
        let g = got.cast(DType::F64).to_vec::<f64>().ok()?;
        let w = want.cast(DType::F64).to_vec::<f64>().ok()?;
        let bad = g.iter().zip(&w).position(|(&g, &w)| !close(g, w));
        return bad.map(|i| format!("wrong values (first at flat index {i}: {} instead of {})", g[i], w[i]));
    }
    // Integers and bools exactly (every tracejit integer fits i64).
    let g = got.cast(DType::I64).to_vec::<i64>().ok()?;
    let w = want.cast(DType::I64).to_vec::<i64>().ok()?;
    let bad = g.iter().zip(&w).position(|(a, b)| a != b);
    bad.map(|i| format!("wrong values (first at flat index {i}: {} instead of {})", g[i], w[i]))
}

fn close(g: f64, w: f64) -> bool {
    if w.is_nan() {
        return g.is_nan();
    }
    if w.is_infinite() {
        return g == w;
    }
    (g - w).abs() <= ATOL + RTOL * w.abs()
}
