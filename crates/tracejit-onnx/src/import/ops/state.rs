//! The state updates of decoder models: `TensorScatter` (opset 24: a KV
//! cache written at a per-batch position, linearly or circularly) and
//! `CausalConvWithState` (opset 27: a depthwise causal 1-D convolution
//! whose left context is the previous call's state, with an optional SiLU).
//!
//! `TensorScatter` reads, for every cache position, which update row (if
//! any) lands there — `position − write_index[b]`, wrapped in circular
//! mode — and selects between a gather of the update and the old cache, so
//! the write indices may be runtime values. The convolution is its k
//! shifted multiply-adds (depthwise: one filter per channel), computed in
//! f32 for f16 input and rounded once, as a convolution kernel would.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};

/// The attributes `TensorScatter` reads.
pub(crate) const SCATTER_ATTRS: &[&str] = &["axis", "mode"];

/// The attributes `CausalConvWithState` reads.
pub(crate) const CONV_ATTRS: &[&str] = &["activation"];

/// Import-time check of `TensorScatter`'s mode.
pub(crate) fn check_scatter(n: &Node) -> Result<(), String> {
    match n.attr_s("mode", "linear")?.as_str() {
        "linear" | "circular" => Ok(()),
        m => Err(format!("mode '{m}' is not 'linear' or 'circular'")),
    }
}

/// Import-time check of `CausalConvWithState`'s activation.
pub(crate) fn check_conv(n: &Node) -> Result<(), String> {
    match n.attr_s("activation", "none")?.as_str() {
        "none" | "silu" | "swish" => Ok(()),
        a => Err(format!("activation '{a}' is not 'none', 'silu' or 'swish'")),
    }
}

/// `TensorScatter`.
pub(crate) fn tensor_scatter(n: &mut Node) -> OpResult {
    let (cache, update) = (n.input(0)?, n.input(1)?);
    let rank = cache.rank();
    let axis = normalize_axis(n.attr_i("axis", -2)?, rank)?;
    if axis == 0 {
        return Err("axis must not be the batch axis 0".into());
    }
    let (cs, us) = (cache.shape(), update.shape());
    let fits = us.len() == rank && (0..rank).all(|a| if a == axis { us[a] <= cs[a] } else { us[a] == cs[a] });
    if update.dtype() != cache.dtype() || !fits {
        return Err(format!(
            "update {} {us:?} does not fit past_cache {} {cs:?} (equal but for axis {axis}, where it is no longer)",
            update.dtype(),
            cache.dtype()
        ));
    }
    let (batch, max, len) = (cs[0], cs[axis] as i64, us[axis] as i64);
    if len == 0 {
        return Ok(vec![cache.clone()]);
    }
    let write = match n.opt_input(2) {
        Some(w) if w.dtype().is_int() && w.shape() == [batch] => w.cast(DType::I64),
        Some(w) => {
            return Err(format!("write_indices {} {:?} must be integers of shape [{batch}]", w.dtype(), w.shape()))
        }
        None => Tensor::zeros(&[batch], DType::I64),
    };
    let at_axis = |len: usize| -> Vec<i64> { (0..rank).map(|a| if a == axis { len as i64 } else { 1 }).collect() };
    let mut batch_shape = vec![1i64; rank];
    batch_shape[0] = batch as i64;
    let position = Tensor::arange(0.0, max as f64, 1.0, DType::I64).reshape(&at_axis(cs[axis]));
    // The update row that lands at each cache position.
    let mut row = &position - &write.reshape(&batch_shape);
    if n.attr_s("mode", "linear")? == "circular" {
        // `rem` takes the divisor's sign: rows wrap into [0, max).
        row = row.rem(max);
    }
    let lands = row.ge(0i64).logical_and(row.lt(len));
    let row = row.clamp(0.0, (len - 1) as f64);
    let full = cs.to_vec();
    let gathered = update.gather_elements(axis as i64, &row.broadcast_to(&full));
    Ok(vec![Tensor::select(&lands.broadcast_to(&full), &gathered, cache)])
}

/// `CausalConvWithState`: `(output, present_state)`.
pub(crate) fn causal_conv_with_state(n: &mut Node) -> OpResult {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let dtype = x.dtype();
    if !dtype.is_float() || w.dtype() != dtype {
        return Err(format!("input {dtype} and weight {} must be one float dtype", w.dtype()));
    }
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || ws[2] == 0 {
        return Err(format!(
            "input {xs:?} ([batch, channels, length]) and weight {ws:?} ([channels, 1, k]) do not fit"
        ));
    }
    let (b, c, len, k) = (xs[0], xs[1], xs[2], ws[2]);
    let state = match n.opt_input(3) {
        Some(s) if s.dtype() == dtype && s.shape() == [b, c, k - 1] => Some(s.clone()),
        Some(s) => {
            return Err(format!("past_state {} {:?} must be {dtype} [{b}, {c}, {}]", s.dtype(), s.shape(), k - 1));
        }
        None => (k > 1).then(|| Tensor::zeros(&[b, c, k - 1], dtype)),
    };
    let padded = match &state {
        Some(s) if k > 1 => Tensor::concat(&[s, x], 2),
        _ => x.clone(),
    };
    // 16-bit floats accumulate in f32 and round once.
    let wide = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let (p, wv) = (padded.cast(wide), w.cast(wide).reshape(&[1, c as i64, k as i64]));
    let mut y = &p.slice_axis(2, 0, len as i64) * &wv.slice_axis(2, 0, 1);
    for j in 1..k as i64 {
        y = &y + &(&p.slice_axis(2, j, j + len as i64) * &wv.slice_axis(2, j, j + 1));
    }
    if let Some(bias) = n.opt_input(2) {
        if bias.dtype() != dtype || bias.shape() != [c] {
            return Err(format!("bias {} {:?} must be {dtype} [{c}]", bias.dtype(), bias.shape()));
        }
        y = &y + &bias.cast(wide).reshape(&[1, c as i64, 1]);
    }
    if n.attr_s("activation", "none")? != "none" {
        // The reference rounds the convolution to the input dtype first.
        y = y.cast(dtype).cast(wide);
        y = &y * &y.sigmoid();
    }
    let total = padded.shape()[2] as i64;
    let present = padded.slice_axis(2, total - (k as i64 - 1), total);
    Ok(vec![y.cast(dtype), present])
}
