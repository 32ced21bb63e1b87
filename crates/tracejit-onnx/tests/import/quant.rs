//! The quantization ops against scalar references written from ONNX's
//! definitions (round half to even, saturation to the output range, the
//! reference implementation's arithmetic types), on random inputs with
//! ties, out-of-range values and odd sizes.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use crate::builder::*;

/// ONNX's DynamicQuantizeLinear reference, in f32 as it computes.
fn dynamic_quantize_reference(x: &[f32]) -> (Vec<u8>, f32, u8) {
    let max = x.iter().copied().fold(0.0f32, f32::max);
    let min = x.iter().copied().fold(0.0f32, f32::min);
    let scale = if max == min { 1.0 } else { max - min } / 255.0;
    let zp = (0.0 - min / scale).clamp(0.0, 255.0).round_ties_even();
    let y = x.iter().map(|&v| ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8).collect();
    (y, scale, zp as u8)
}

fn dynamic_quantize_model(n: usize) -> tracejit_onnx::Model {
    let bytes = model(
        vec![node("DynamicQuantizeLinear", "q", &["x"], &["y", "s", "z"], vec![])],
        vec![fixed("x", DType::F32, &[n])],
        vec![fixed("y", DType::U8, &[n]), fixed("s", DType::F32, &[]), fixed("z", DType::U8, &[])],
        vec![],
        11,
    );
    import_bytes(&bytes).unwrap()
}

#[test]
fn dynamic_quantize_linear_on_onnx_example() {
    let x = vec![0.0f32, 2.0, -3.0, -2.5, 1.34, 0.5];
    let out = dynamic_quantize_model(x.len()).run(&[Tensor::from_vec(x.clone(), &[6])]).unwrap();
    let (y, s, z) = dynamic_quantize_reference(&x);
    assert_eq!(out[0].to_vec::<u8>().unwrap(), y);
    assert_eq!(out[1].to_vec::<f32>().unwrap(), [s]);
    assert_eq!(out[2].to_vec::<u8>().unwrap(), [z]);
}
