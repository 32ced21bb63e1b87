//! `RotaryEmbedding` (opset 23): rotary position embeddings on 4-D
//! `[batch, heads, seq, head_size]` or 3-D `[batch, seq, heads ·
//! head_size]` input (`num_heads` given), the first `rotary_embedding_dim`
//! channels of each head rotated (all by default), in halves
//! (`x[..d/2]`, `x[d/2..]`) or interleaved (`x[0::2]`, `x[1::2]`), by
//! `cos_cache` / `sin_cache` rows picked by `position_ids` (or given per
//! batch and position when there are none).
//!
//! Each rotated pair is `(cos·x1 − sin·x2, sin·x1 + cos·x2)`: two products
//! and a sum per output, rounded as ONNX's reference rounds them.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};

/// The attributes `RotaryEmbedding` reads.
pub(crate) const ATTRS: &[&str] = &["interleaved", "num_heads", "rotary_embedding_dim"];

/// The import-time check of the attribute values.
pub(crate) fn check(n: &Node) -> Result<(), String> {
    if n.opset < 23 {
        return Err(format!("RotaryEmbedding exists from opset 23; the model imports opset {}", n.opset));
    }
    for name in ["num_heads", "rotary_embedding_dim"] {
        let v = n.attr_i(name, 0)?;
        if v < 0 {
            return Err(format!("{name} {v} must not be negative"));
        }
    }
    match n.attr_i("interleaved", 0)? {
        0 | 1 => Ok(()),
        v => Err(format!("interleaved {v} is not 0 or 1")),
    }
}

/// `RotaryEmbedding`.
pub(crate) fn rotary_embedding(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    if !x.dtype().is_float() {
        return Err(format!("input is {}; RotaryEmbedding takes floats", x.dtype()));
    }
    // [batch, seq, heads, head_size], the layout the rotation reads.
    let x4 = match x.rank() {
        4 => x.transpose(&[0, 2, 1, 3]),
        3 => {
            let heads = n.attr_i("num_heads", 0)?;
            let s = x.shape();
            if heads <= 0 || !s[2].is_multiple_of(heads as usize) {
                return Err(format!("3-D input {s:?} needs num_heads (given {heads}) dividing its hidden size"));
            }
            x.reshape(&[s[0] as i64, s[1] as i64, heads, s[2] as i64 / heads])
        }
        r => return Err(format!("input {:?} has rank {r}; RotaryEmbedding takes 3-D or 4-D input", x.shape())),
    };
    let (b, seq, head) = (x4.shape()[0], x4.shape()[1], x4.shape()[3]);
    let rot = match n.attr_i("rotary_embedding_dim", 0)? {
        0 => head,
        r => r as usize,
    };
    if rot > head || !rot.is_multiple_of(2) {
        return Err(format!("rotary_embedding_dim {rot} must be even and at most the head size {head}"));
    }
    let half = rot / 2;
    let cos = cache(n, 1, "cos_cache", (b, seq, half), x.dtype())?;
    let sin = cache(n, 2, "sin_cache", (b, seq, half), x.dtype())?;
    let interleaved = n.attr_i("interleaved", 0)? == 1;

    let x_rot = x4.slice_axis(3, 0, rot as i64);
    let (x1, x2) = if interleaved {
        let pairs = x_rot.reshape(&[b as i64, seq as i64, -1, half as i64, 2]);
        (pairs.slice_axis(4, 0, 1).squeeze(&[4]), pairs.slice_axis(4, 1, 2).squeeze(&[4]))
    } else {
        (x_rot.slice_axis(3, 0, half as i64), x_rot.slice_axis(3, half as i64, rot as i64))
    };
    let real = &(&cos * &x1) - &(&sin * &x2);
    let imag = &(&sin * &x1) + &(&cos * &x2);
    let rotated = if interleaved {
        Tensor::stack(&[real, imag], -1).reshape(&[b as i64, seq as i64, -1, rot as i64])
    } else {
        Tensor::concat(&[real, imag], -1)
    };
    let y4 =
        if rot < head { Tensor::concat(&[rotated, x4.slice_axis(3, rot as i64, head as i64)], -1) } else { rotated };
    let y = match x.rank() {
        4 => y4.transpose(&[0, 2, 1, 3]),
        _ => y4.reshape(&x.shape().iter().map(|&d| d as i64).collect::<Vec<_>>()),
    };
    Ok(vec![y])
}

/// A cache as `[batch, seq, 1, half]`: rows picked by `position_ids` from a
/// `[max_position, half]` cache, or a `[batch, seq, half]` cache as it is.
fn cache(
    n: &Node,
    i: usize,
    name: &str,
    (b, seq, half): (usize, usize, usize),
    dtype: DType,
) -> Result<Tensor, String> {
    let c = n.input(i)?;
    if c.dtype() != dtype {
        return Err(format!("{name} is {}, the input is {dtype}", c.dtype()));
    }
    let picked = match n.opt_input(3) {
        Some(pos) => {
            if c.rank() != 2 || !pos.dtype().is_int() || pos.shape() != [b, seq] {
                return Err(format!(
                    "with position_ids {} {:?} ([batch {b}, seq {seq}] integers), {name} {:?} must be [max_position, {half}]",
                    pos.dtype(),
                    pos.shape(),
                    c.shape()
                ));
            }
            c.gather(&pos.cast(DType::I64), 0)
        }
        None => {
            if c.rank() != 3 || c.shape()[..2] != [b, seq] {
                return Err(format!(
                    "without position_ids, {name} {:?} must be [batch {b}, seq {seq}, {half}]",
                    c.shape()
                ));
            }
            c.clone()
        }
    };
    if picked.shape().last() != Some(&half) {
        return Err(format!("{name} {:?} must end in rotary_embedding_dim / 2 = {half}", c.shape()));
    }
    Ok(picked.expand_dims(2))
}
