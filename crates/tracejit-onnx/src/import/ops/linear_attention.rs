//! `LinearAttention` (opset 27): the recurrent linear-attention family on
//! packed 3-D `[batch, T, heads · width]` query, key and value, with its
//! four update rules of a per-head state `S` (`[batch, kv_heads, d_k,
//! d_v]`, zeros or `past_state`), step by step over time:
//!
//! - `gated`, `gated_delta`: `S ← S · exp(decay_t)` (per head, or per key
//!   channel);
//! - `delta`, `gated_delta`: `v_t ← beta_t · (v_t − Sᵀk_t)`;
//! - all: `S ← S + k_t ⊗ v_t`, then `o_t = scale · q_t · S` (query head `h`
//!   reads state `h / group`, grouped-query attention without copies).
//!
//! The recurrence is one `fori_loop` over T (one traced body, any length,
//! differentiable), computed in f32 as ONNX's reference computes it and
//! rounded to the input dtype at the end; `present_state` takes
//! `past_state`'s dtype (the query's without one). `chunk_size` is a
//! tuning hint of the spec with no effect on the result.

use tracejit_tensor::DType;
use tracejit_trace::{fori_loop, Tensor};

use crate::import::node::{Node, OpResult};

/// The attributes `LinearAttention` reads.
pub(crate) const ATTRS: &[&str] = &["chunk_size", "kv_num_heads", "q_num_heads", "scale", "update_rule"];

/// The import-time check of the attribute values.
pub(crate) fn check(n: &Node) -> Result<(), String> {
    rule(n)?;
    let (q, kv) = (n.attr_i("q_num_heads", 0)?, n.attr_i("kv_num_heads", 0)?);
    if q <= 0 || kv <= 0 || q % kv != 0 {
        return Err(format!("q_num_heads {q} must be a positive multiple of kv_num_heads {kv} (both are required)"));
    }
    let scale = n.attr_f("scale", 0.0)?;
    if !scale.is_finite() {
        return Err(format!("scale {scale} must be finite"));
    }
    Ok(())
}

/// `(gating, delta correction)` of the update rule.
fn rule(n: &Node) -> Result<(bool, bool), String> {
    match n.attr_s("update_rule", "gated_delta")?.as_str() {
        "linear" => Ok((false, false)),
        "gated" => Ok((true, false)),
        "delta" => Ok((false, true)),
        "gated_delta" => Ok((true, true)),
        r => Err(format!("update_rule '{r}' is not 'linear', 'gated', 'delta' or 'gated_delta'")),
    }
}

/// The operands in time-major f32 layout: `[T, batch, heads, width]`.
struct Steps {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// `[T, batch, kv_heads, d_k or 1]`.
    decay: Option<Tensor>,
    /// `[T, batch, kv_heads or 1, 1]`.
    beta: Option<Tensor>,
}

/// `[B, T, heads · width]` as `[T, B, heads, width]` in f32.
fn time_major(name: &str, t: &Tensor, heads: usize) -> Result<Tensor, String> {
    let s = t.shape();
    if s.len() != 3 || !s[2].is_multiple_of(heads) {
        return Err(format!("{name} {s:?} must be [batch, T, {heads} heads · width]"));
    }
    Ok(t.reshape(&[s[0] as i64, s[1] as i64, heads as i64, (s[2] / heads) as i64])
        .transpose(&[1, 0, 2, 3])
        .cast(DType::F32))
}

/// `LinearAttention`: `(output, present_state)`.
pub(crate) fn linear_attention(n: &mut Node) -> OpResult {
    let (gating, delta) = rule(n)?;
    let (qh, kvh) = (n.attr_i("q_num_heads", 0)? as usize, n.attr_i("kv_num_heads", 0)? as usize);
    let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        return Err(format!("query {dtype}, key {} and value {} must be one float dtype", k.dtype(), v.dtype()));
    }
    let steps = Steps {
        q: time_major("query", q, qh)?,
        k: time_major("key", k, kvh)?,
        v: time_major("value", v, kvh)?,
        decay: None,
        beta: None,
    };
    let [t, b, _, dk] = dims(&steps.q);
    let dv = steps.v.shape()[3];
    if steps.k.shape() != [t, b, kvh, dk] || steps.v.shape()[..3] != [t, b, kvh] {
        return Err(format!("query {:?}, key {:?} and value {:?} do not fit", q.shape(), k.shape(), v.shape()));
    }
    let steps = Steps {
        decay: gate(n, 4, "decay", gating, &[kvh, kvh * dk])?,
        beta: gate(n, 5, "beta", delta, &[kvh, 1])?,
        ..steps
    };
    let (state, state_dtype) = match n.opt_input(3) {
        Some(s) if s.dtype().is_float() && s.shape() == [b, kvh, dk, dv] => (s.cast(DType::F32), s.dtype()),
        Some(s) => {
            return Err(format!(
                "past_state {} {:?} must be floats of shape [{b}, {kvh}, {dk}, {dv}]",
                s.dtype(),
                s.shape()
            ))
        }
        None => (Tensor::zeros(&[b, kvh, dk, dv], DType::F32), dtype),
    };
    // A scale of 0 (the default) means 1/√d_k.
    let scale = n.attr_f("scale", 0.0)? as f64;
    let scale = if scale == 0.0 { 1.0 / (dk as f64).sqrt() } else { scale };
    let out = Tensor::zeros(&[t, b, qh, dv], DType::F32);
    let (state, out) = fori_loop(0, t as i64, |i, (s, out)| step(&steps, &i, s, out, qh / kvh, scale), (state, out));
    let y = out.transpose(&[1, 0, 2, 3]).reshape(&[b as i64, t as i64, (qh * dv) as i64]).cast(dtype);
    Ok(vec![y, state.cast(state_dtype)])
}

fn dims(t: &Tensor) -> [usize; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

/// `decay` or `beta` (input `i`): required exactly when the rule uses it,
/// `[B, T, last]` with `last` among `lasts`, as `[T, B, heads or 1, width or 1]`.
fn gate(n: &Node, i: usize, name: &str, used: bool, lasts: &[usize]) -> Result<Option<Tensor>, String> {
    let rule = n.attr_s("update_rule", "gated_delta")?;
    let Some(g) = n.opt_input(i) else {
        return if used { Err(format!("update_rule '{rule}' needs the input {name}")) } else { Ok(None) };
    };
    if !used {
        return Err(format!("update_rule '{rule}' takes no {name}"));
    }
    let q = n.input(0)?.shape();
    let s = g.shape();
    if s.len() != 3 || s[..2] != q[..2] || !lasts.contains(&s[2]) {
        return Err(format!("{name} {s:?} must be [{}, {}, one of {lasts:?}]", q[0], q[1]));
    }
    // [B, T, last] as [T, B, heads (or 1), width (or 1)].
    let (heads, width) = if name == "decay" && s[2] != lasts[0] { (lasts[0], s[2] / lasts[0]) } else { (s[2], 1) };
    Ok(Some(
        g.reshape(&[s[0] as i64, s[1] as i64, heads as i64, width as i64]).transpose(&[1, 0, 2, 3]).cast(DType::F32),
    ))
}

/// Row `i` of a time-major operand: `[batch, heads, width]`.
fn at(t: &Tensor, i: &Tensor) -> Tensor {
    let [_, b, h, w] = dims(t);
    let starts = i.reshape(&[1]) * Tensor::from_vec(vec![1i64, 0, 0, 0], &[4]);
    t.dynamic_slice(&starts, &[1, b, h, w]).reshape(&[b as i64, h as i64, w as i64])
}

/// One time step: the updated state and the output with row `i` written.
fn step(x: &Steps, i: &Tensor, mut s: Tensor, out: Tensor, group: usize, scale: f64) -> (Tensor, Tensor) {
    let (k, mut v) = (at(&x.k, i), at(&x.v, i));
    if let Some(decay) = &x.decay {
        s = &s * &at(decay, i).exp().expand_dims(-1);
    }
    if let Some(beta) = &x.beta {
        // Sᵀk: [B, H, 1, d_k] · [B, H, d_k, d_v].
        let retrieved = k.expand_dims(-2).matmul(&s).squeeze(&[-2]);
        v = &at(beta, i) * &(&v - &retrieved);
    }
    s = &s + &(&k.expand_dims(-1) * &v.expand_dims(-2));
    let q = at(&x.q, i);
    let [b, qh, dk] = [q.shape()[0], q.shape()[1], q.shape()[2]];
    let kvh = qh / group;
    // Query heads grouped over the state's heads: [B, kvh, group, d_k] · [B, kvh, d_k, d_v].
    let o = q.reshape(&[b as i64, kvh as i64, group as i64, dk as i64]).matmul(&s) * scale;
    let dv = s.shape()[3];
    let row = o.reshape(&[1, b as i64, qh as i64, dv as i64]);
    let starts = i.reshape(&[1]) * Tensor::from_vec(vec![1i64, 0, 0, 0], &[4]);
    (s, out.dynamic_update_slice(&row, &starts))
}
