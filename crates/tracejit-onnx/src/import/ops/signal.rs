//! Signal-processing constants: `HannWindow`, `HammingWindow` and
//! `BlackmanWindow` (opset 17) of a static length, periodic (the default)
//! or symmetric, computed in f64 and rounded once to `output_datatype`
//! (ONNX's reference computes them in the output type, a few ulps apart).

use std::f64::consts::PI;

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};

/// The attributes the windows read.
pub(crate) const WINDOW_ATTRS: &[&str] = &["output_datatype", "periodic"];

/// The longest window built (it is a constant of the trace).
const MAX_LEN: i64 = 1 << 28;

/// The three windows, by op type.
pub(crate) fn window(n: &mut Node) -> OpResult {
    let len = n.known_scalar(0)? as i64;
    if !(0..=MAX_LEN).contains(&len) {
        return Err(format!("size {len} must be between 0 and {MAX_LEN}"));
    }
    let dtype = n.attr_dtype("output_datatype", DType::F32)?;
    let periodic = n.attr_i("periodic", 1)? != 0;
    // The period: N for a periodic window, N - 1 for a symmetric one.
    let period = if periodic { len } else { len - 1 } as f64;
    let op = n.op_type;
    let w: Vec<f64> = (0..len)
        .map(|i| {
            let x = 2.0 * PI * i as f64 / period;
            match op {
                "HannWindow" => 0.5 - 0.5 * x.cos(),
                "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * x.cos(),
                _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .collect();
    Ok(vec![Tensor::from_vec(w, &[len as usize]).cast(dtype)])
}
