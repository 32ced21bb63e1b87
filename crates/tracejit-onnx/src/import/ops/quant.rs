//! Quantization: `QuantizeLinear` / `DequantizeLinear` (per tensor, per
//! axis and blocked), `DynamicQuantizeLinear`, the integer products
//! `MatMulInteger` / `ConvInteger`, the requantizing `QLinearMatMul` /
//! `QLinearConv`, and the bit ops composable from wrapping arithmetic:
//! `BitShift`, `BitwiseNot`, and `BitCast` between integers (or bool) of
//! one width.
//!
//! Each follows ONNX's reference implementation step by step, in the
//! same arithmetic types, because a quantized result is an integer that a
//! different rounding of the float step changes by one: the scale division
//! in the input's dtype, rounding half to even (`rint`), the zero point
//! added, then saturation to the output type's range. Integer products
//! are exact: `MatMulInteger` in i32 (wrapping, as int32 does), the
//! convolutions in f64 (sums of products of 8- and 16-bit values are
//! integers far below 2^53) and cast to i32; the requantizing ops scale
//! the i32 sums in f64, as numpy's `int32 * float` does.
//!
//! Where the reference leaves a value undefined (NaN quantized, a
//! product past i32), tracejit's casts decide: NaN saturates to 0.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};
use crate::import::ops::conv::conv_with;

/// `a / b` rounded to `dtype` (f32, f16 or bf16) as one IEEE division in
/// that dtype rounds it, computed in f64. The JIT may divide by an
/// invariant divisor as a multiplication by its reciprocal (within an ulp
/// of the quotient), which would move a quotient like -127.49999 to the
/// tie -127.5 and change the quantized value; in f64 that error is far
/// below the distance from the exact quotient of two f32s (or f16s) to
/// an f32 rounding boundary (2p + 2 <= 53 bits), so the rounding to
/// `dtype` gives the correctly rounded quotient either way. f64 operands
/// divide as they are.
fn div_rounded(a: &Tensor, b: &Tensor, dtype: DType) -> Tensor {
    if dtype == DType::F64 {
        return a.cast(dtype) / b.cast(dtype);
    }
    (a.cast(DType::F64) / b.cast(DType::F64)).cast(dtype)
}

/// The smallest and largest value of a quantized integer dtype.
fn quant_range(d: DType) -> Result<(f64, f64), String> {
    match d {
        DType::I8 | DType::U8 | DType::I16 | DType::U16 => {
            let (lo, hi) = d.int_range().expect("an integer dtype");
            Ok((lo as f64, hi as f64))
        }
        other => Err(format!("quantization to {other} is not supported (int8, uint8, int16 and uint16 are)")),
    }
}

/// A scale or zero point `p` shaped to broadcast against a tensor of
/// `shape`: one element as a scalar; else per axis (1-D, the size of axis
/// `axis`) or, with `block > 0`, blocked (`shape` but for axis `axis`,
/// which has `ceil(dim / block)` entries, each repeated `block` times and
/// the last block cut to fit), as ONNX's `reshape_input` does.
fn along(p: &Tensor, shape: &[usize], axis: i64, block: i64) -> Result<Tensor, String> {
    if p.len() == 1 {
        return Ok(p.reshape(&[]));
    }
    let axis = crate::import::node::normalize_axis(axis, shape.len())?;
    let ps = p.shape().to_vec();
    if block <= 0 {
        if ps != [shape[axis]] {
            return Err(format!("a scale or zero point of shape {ps:?} does not fit axis {axis} of shape {shape:?}"));
        }
        let mut dims = vec![1i64; shape.len()];
        dims[axis] = shape[axis] as i64;
        return Ok(p.reshape(&dims));
    }
    let block = block as usize;
    let fits = ps.len() == shape.len()
        && (0..shape.len()).all(|i| ps[i] == if i == axis { shape[i].div_ceil(block) } else { shape[i] });
    if !fits {
        return Err(format!(
            "a blocked scale or zero point of shape {ps:?} does not fit shape {shape:?} with block_size {block} on axis {axis}"
        ));
    }
    let mut wide = ps.clone();
    wide.insert(axis + 1, block);
    let mut merged: Vec<i64> = ps.iter().map(|&d| d as i64).collect();
    merged[axis] = (ps[axis] * block) as i64;
    let repeated = p.expand_dims(axis as i64 + 1).broadcast_to(&wide).reshape(&merged);
    Ok(repeated.slice_axis(axis as i64, 0, shape[axis] as i64))
}

/// The `output_dtype`-style attribute `name`, `None` when absent or 0 (unset).
fn dtype_attr(n: &Node, name: &str) -> Result<Option<DType>, String> {
    if n.attr_i(name, 0)? == 0 {
        return Ok(None);
    }
    n.attr_dtype(name, DType::F32).map(Some)
}

/// `q` (floats holding whole numbers) plus the zero point, saturated to
/// `out`'s range and cast to it.
fn saturate(q: Tensor, out: DType) -> Result<Tensor, String> {
    let (lo, hi) = quant_range(out)?;
    Ok(q.clamp(lo, hi).cast(out))
}

/// `QuantizeLinear`: `saturate(rint(x / scale) + zero_point)`, the output
/// dtype the zero point's (else `output_dtype`, else uint8).
pub(crate) fn quantize_linear(n: &mut Node) -> OpResult {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    let zp = n.opt_input(2);
    let attr_out = dtype_attr(n, "output_dtype")?;
    let out = match (zp, attr_out) {
        (Some(z), Some(d)) if z.dtype() != d => {
            return Err(format!("output_dtype {d} differs from the zero point's dtype {}", z.dtype()))
        }
        (Some(z), _) => z.dtype(),
        (None, d) => d.unwrap_or(DType::U8),
    };
    quant_range(out)?;
    let (axis, block) = (n.attr_i("axis", 1)?, n.attr_i("block_size", 0)?);
    let shape = x.shape().to_vec();
    // The division runs in `precision` when given, else in x's dtype.
    let work = dtype_attr(n, "precision")?.unwrap_or(x.dtype());
    let scaled = div_rounded(&x.cast(work), &along(scale, &shape, axis, block)?.cast(work), work);
    let mut q = scaled.round().cast(DType::F64);
    if let Some(z) = zp {
        q = q + along(z, &shape, axis, block)?.cast(DType::F64);
    }
    Ok(vec![saturate(q, out)?])
}

/// `DequantizeLinear`: `(x - zero_point) · scale` in f32 (the reference's
/// arithmetic), rounded once to the scale's dtype (or `output_dtype`).
pub(crate) fn dequantize_linear(n: &mut Node) -> OpResult {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    if !x.dtype().is_int() {
        return Err(format!("DequantizeLinear of {} is not supported (integers are)", x.dtype()));
    }
    let out = dtype_attr(n, "output_dtype")?.unwrap_or(scale.dtype());
    let work = if scale.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let (axis, block) = (n.attr_i("axis", 1)?, n.attr_i("block_size", 0)?);
    let shape = x.shape().to_vec();
    let mut dx = x.cast(work);
    if let Some(z) = n.opt_input(2) {
        dx = dx - along(z, &shape, axis, block)?.cast(work);
    }
    Ok(vec![(dx * along(scale, &shape, axis, block)?.cast(work)).cast(out)])
}

/// `DynamicQuantizeLinear`: uint8 with the scale and zero point that map
/// `[min(x, 0), max(x, 0)]` onto `[0, 255]` (scale `1/255` when that
/// range is empty, as the reference does), all in f32.
pub(crate) fn dynamic_quantize_linear(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if x.dtype() != DType::F32 {
        return Err(format!("DynamicQuantizeLinear takes f32, got {}", x.dtype()));
    }
    if x.is_empty() {
        return Err("DynamicQuantizeLinear of an empty tensor (it has no range)".into());
    }
    let max = x.max_all().maximum(0.0f32);
    let min = x.min_all().minimum(0.0f32);
    let range = &max - &min;
    let range = Tensor::select(&range.eq(0.0f32), &Tensor::full(&[], 1.0, DType::F32), &range);
    let f32_div = |a: &Tensor, b: &Tensor| div_rounded(a, b, DType::F32);
    let scale = f32_div(&range, &Tensor::full(&[], 255.0, DType::F32));
    let zp = f32_div(&min.neg(), &scale).clamp(0.0, 255.0).round();
    let y = saturate(f32_div(x, &scale).round() + &zp, DType::U8)?;
    Ok(vec![y, scale, zp.cast(DType::U8)])
}

/// An integer operand minus its zero point, in i32: a 1-D zero point of
/// `a`'s row count is per row when `rows`, per column (the last axis) else.
fn shifted_i32(a: &Tensor, zp: Option<&Tensor>, rows: bool) -> Result<Tensor, String> {
    if !a.dtype().is_int() {
        return Err(format!("an integer operand is expected, got {}", a.dtype()));
    }
    let a32 = a.cast(DType::I32);
    let Some(z) = zp else { return Ok(a32) };
    let z32 = z.cast(DType::I32);
    if z.len() == 1 {
        return Ok(a32 - z32.reshape(&[]));
    }
    if z.rank() != 1 || a.rank() < 2 {
        return Err(format!("a zero point of shape {:?} for an operand of shape {:?}", z.shape(), a.shape()));
    }
    Ok(if rows { a32 - z32.reshape(&[z.len() as i64, 1]) } else { a32 - z32 })
}

/// `MatMulInteger`: `(A - a_zero_point) @ (B - b_zero_point)` in i32.
pub(crate) fn matmul_integer(n: &mut Node) -> OpResult {
    let a = shifted_i32(n.input(0)?, n.opt_input(2), true)?;
    let b = shifted_i32(n.input(1)?, n.opt_input(3), false)?;
    Ok(vec![a.matmul(&b)])
}

/// `QLinearMatMul`: the i32 product of the zero-point-shifted operands,
/// scaled by `a_scale · b_scale / y_scale` (computed in the scales'
/// dtype) in f64, plus `y_zero_point`, rounded half to even and saturated.
pub(crate) fn qlinear_matmul(n: &mut Node) -> OpResult {
    let a = shifted_i32(n.input(0)?, n.opt_input(2), true)?;
    let b = shifted_i32(n.input(3)?, n.opt_input(5), false)?;
    let per_row = |s: &Tensor| if s.len() > 1 && s.rank() == 1 { s.reshape(&[s.len() as i64, 1]) } else { s.clone() };
    let (a_scale, b_scale, y_scale) = (per_row(n.input(1)?), n.input(4)?, n.input(6)?);
    let sd = a_scale.dtype();
    let multiplier = div_rounded(&(a_scale * b_scale), y_scale, sd).cast(DType::F64);
    let mut d = a.matmul(&b).cast(DType::F64) * multiplier;
    let out = match n.opt_input(7) {
        Some(z) => {
            d = d + z.cast(DType::F64);
            z.dtype()
        }
        None => n.input(0)?.dtype(),
    };
    Ok(vec![saturate(d.round(), out)?])
}

/// `x - x_zero_point` and `w - w_zero_point` in f64 (a 1-D weight zero
/// point is per output channel), the operands of the integer convolutions.
fn conv_operands(
    x: &Tensor,
    xzp: Option<&Tensor>,
    w: &Tensor,
    wzp: Option<&Tensor>,
) -> Result<(Tensor, Tensor), String> {
    if !x.dtype().is_int() || !w.dtype().is_int() {
        return Err(format!("integer operands are expected, got {} and {}", x.dtype(), w.dtype()));
    }
    let mut xf = x.cast(DType::F64);
    if let Some(z) = xzp {
        if z.len() != 1 {
            return Err(format!("the input's zero point must be a scalar, got shape {:?}", z.shape()));
        }
        xf = xf - z.cast(DType::F64).reshape(&[]);
    }
    let mut wf = w.cast(DType::F64);
    if let Some(z) = wzp {
        wf = wf - per_channel(z, w.rank())?.cast(DType::F64);
    }
    Ok((xf, wf))
}

/// A scalar, or a 1-D per-output-channel value shaped `[C, 1, ...]` for a
/// weight of rank `rank`.
fn per_channel(z: &Tensor, rank: usize) -> Result<Tensor, String> {
    if z.len() == 1 {
        return Ok(z.reshape(&[]));
    }
    if z.rank() != 1 {
        return Err(format!("a per-channel value must be 1-D, got shape {:?}", z.shape()));
    }
    let mut dims = vec![1i64; rank];
    dims[0] = z.len() as i64;
    Ok(z.reshape(&dims))
}

/// `ConvInteger`: the convolution of the zero-point-shifted operands, as i32.
pub(crate) fn conv_integer(n: &mut Node) -> OpResult {
    let (x, w) = conv_operands(n.input(0)?, n.opt_input(2), n.input(1)?, n.opt_input(3))?;
    Ok(vec![conv_with(n, &x, &w, None)?.cast(DType::I32)])
}

/// `QLinearConv`: the integer convolution (plus the i32 bias), scaled by
/// `x_scale · w_scale / y_scale` (`w_scale` per output channel) in f64,
/// plus `y_zero_point`, saturated and rounded half to even.
pub(crate) fn qlinear_conv(n: &mut Node) -> OpResult {
    let (x, w) = conv_operands(n.input(0)?, n.opt_input(2), n.input(3)?, n.opt_input(5))?;
    let bias = n.opt_input(8).map(|b| b.cast(DType::F64));
    let res = conv_with(n, &x, &w, bias.as_ref())?;
    // The per-channel scale broadcasts along the output's axis 1.
    let ws = n.input(4)?;
    let w_scale = match (ws.len(), ws.rank()) {
        (1, _) => ws.reshape(&[]),
        (c, 1) if c == res.shape()[1] => ws.reshape(&channel_dims(&res)),
        _ => return Err(format!("w_scale of shape {:?} for {} output channels", ws.shape(), res.shape()[1])),
    };
    let x_scale = n.input(1)?.reshape(&[]);
    let sd = x_scale.dtype();
    let multiplier = div_rounded(&(x_scale * &w_scale), &n.input(6)?.reshape(&[]), sd).cast(DType::F64);
    let mut r = res * multiplier;
    let out = match n.opt_input(7) {
        Some(z) => {
            r = r + z.cast(DType::F64).reshape(&[]);
            z.dtype()
        }
        None => n.input(0)?.dtype(),
    };
    Ok(vec![saturate(r.round(), out)?])
}

/// `[1, C, 1, ...]` for an NC... tensor.
fn channel_dims(t: &Tensor) -> Vec<i64> {
    let mut dims = vec![1i64; t.rank()];
    dims[1] = t.shape()[1] as i64;
    dims
}

/// `BitShift` on unsigned integers: `x · 2^y` (LEFT) or `x / 2^y` (RIGHT),
/// both wrapping in the dtype, so a shift by the width or more gives 0.
pub(crate) fn bit_shift(n: &mut Node) -> OpResult {
    let (x, y) = (n.input(0)?, n.input(1)?);
    if !x.dtype().is_unsigned() || y.dtype() != x.dtype() {
        return Err(format!("BitShift takes two unsigned tensors of one dtype, got {} and {}", x.dtype(), y.dtype()));
    }
    let power = Tensor::full(&[], 2.0, x.dtype()).pow(y);
    match n.attr_s("direction", "")?.as_str() {
        "LEFT" => Ok(vec![x * power]),
        "RIGHT" => Ok(vec![x / power]),
        other => Err(format!("BitShift direction '{other}' (LEFT or RIGHT)")),
    }
}

/// `BitwiseNot`: `!x`, which in two's complement (and in unsigned
/// wrapping arithmetic) is `-x - 1`.
pub(crate) fn bitwise_not(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if !x.dtype().is_int() {
        return Err(format!("BitwiseNot takes an integer tensor, got {}", x.dtype()));
    }
    Ok(vec![x.neg() - 1])
}

/// `BitCast` between integer (or bool) dtypes of one width: a cast, which
/// keeps the bits (integer casts wrap). Float bit patterns need a
/// primitive tracejit lacks.
pub(crate) fn bit_cast(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let to = n.attr_dtype("to", x.dtype())?;
    let bits_kept = |d: DType| d.is_int() || d == DType::Bool;
    if !n.has_attr("to") || !bits_kept(x.dtype()) || !bits_kept(to) || x.dtype().size_of() != to.size_of() {
        return Err(format!("from {} to {to} needs primitive bitcast (integer or bool of one width cast)", x.dtype()));
    }
    Ok(vec![x.cast(to)])
}
