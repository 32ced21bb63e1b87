//! `Attention` (opsets 23 and 24): scaled dot-product attention over 3-D
//! (`[batch, seq, heads · width]` with `q_num_heads` / `kv_num_heads`) or
//! 4-D (`[batch, heads, seq, width]`) query, key and value, with
//! grouped-query attention (fewer key/value heads than query heads), the
//! key/value cache (`past_key` / `past_value` concatenated into
//! `present_key` / `present_value`), `is_causal`, `scale`, `softcap`, a
//! boolean or additive `attn_mask` (broadcasting, its key axis padded up to
//! the total length), `nonpad_kv_seqlen`, `softmax_precision` and the
//! optional `qk_matmul_output` with its `qk_matmul_output_mode`.
//!
//! Masks (none, a boolean or an additive one, causality,
//! `nonpad_kv_seqlen`) run `tracejit::nn::scaled_dot_product_attention`,
//! whose flash kernel never holds the `[Tq, Tk]` scores (an additive mask
//! with the forbidden pairs' -inf added to it; f64 with an additive mask
//! runs that function's formula, which does); a softcap, a requested
//! `qk_matmul_output` or a softmax precision the kernel does not compute
//! in need the scores, so they run the spec's pattern as a composition
//! (`Q·√scale`, `K·√scale`, MatMul, softcap, add the bias, Softmax,
//! MatMul). Both give a query that sees no key NaN, as ONNX's reference
//! does (a softmax over nothing but -inf).
//!
//! Grouped-query attention never copies key/value heads: the query's heads
//! are split as `[batch, kv_heads, group, ..]` against keys and values of
//! shape `[batch, kv_heads, 1, ..]`, and the matmuls broadcast. Query head
//! `h` reads key/value head `h / group`, ONNX's interleaved repetition.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::Node;
use crate::import::node::OpResult;

/// The attributes `Attention` reads.
pub(crate) const ATTRS: &[&str] =
    &["is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap", "softmax_precision"];

/// The node's attributes, checked.
struct Settings {
    causal: bool,
    /// The `scale` attribute; `1/√width` when absent.
    scale: Option<f64>,
    /// `softcap`, when positive.
    softcap: Option<f64>,
    /// Which intermediate `qk_matmul_output` holds (0 to 3).
    mode: i64,
    /// The dtype the softmax computes in, when given.
    precision: Option<DType>,
}

impl Settings {
    fn read(n: &Node) -> Result<Settings, String> {
        let mode = n.attr_i("qk_matmul_output_mode", 0)?;
        if !(0..=3).contains(&mode) {
            return Err(format!("qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3"));
        }
        let softcap = n.attr_f("softcap", 0.0)? as f64;
        if softcap.is_nan() || softcap < 0.0 {
            return Err(format!("softcap {softcap} must be 0 (none) or positive"));
        }
        let scale = n.has_attr("scale").then(|| n.attr_f("scale", 1.0)).transpose()?.map(f64::from);
        if scale.is_some_and(|s| !s.is_finite() || s < 0.0) {
            return Err(format!(
                "scale {} must be finite and not negative (it is applied as its square root)",
                scale.unwrap_or_default()
            ));
        }
        let precision = match n.has_attr("softmax_precision") {
            false => None,
            true => {
                let d = n.attr_dtype("softmax_precision", DType::F32)?;
                if !d.is_float() {
                    return Err(format!("softmax_precision {d} is not a float type"));
                }
                Some(d)
            }
        };
        let causal = n.attr_i("is_causal", 0)?;
        if causal != 0 && causal != 1 {
            return Err(format!("is_causal {causal} is not 0 or 1"));
        }
        Ok(Settings { causal: causal == 1, scale, softcap: (softcap > 0.0).then_some(softcap), mode, precision })
    }
}

/// The import-time check of the attribute values (no inputs needed).
pub(crate) fn check(n: &Node) -> Result<(), String> {
    if n.opset < 23 {
        return Err(format!("Attention exists from opset 23; the model imports opset {}", n.opset));
    }
    Settings::read(n).map(|_| ())
}

/// `Attention`.
pub(crate) fn attention(n: &mut Node) -> OpResult {
    let set = Settings::read(n)?;
    let io = Operands::read(n)?;
    let (b, qh, tq, d) = dims4(&io.q);
    let (kvh, tk, dv) = (io.k.shape()[1], io.k.shape()[2], io.v.shape()[3]);
    let scale = set.scale.unwrap_or(1.0 / (d.max(1) as f64).sqrt());
    let g = Grouping { kvh, group: qh / kvh };

    // The flash kernel fits when the scores are not wanted and nothing but
    // a mask (allowing / forbidding pairs, or added) happens to them.
    let fused = !n.wants(3)
        && set.softcap.is_none()
        && set.precision.is_none_or(|p| {
            p == io.q.dtype() || (p == DType::F32 && io.q.dtype().is_float() && io.q.dtype() != DType::F64)
        });
    let masks = Masks::build(n, &io, &set, (b, qh, tq, tk), fused)?;
    let (y, qk) = if fused {
        (fused_attention(&io, &masks, &g, scale), None)
    } else {
        let (y, qk) = composed_attention(&io, &masks, &set, &g, scale);
        (y, n.wants(3).then_some(qk))
    };
    let y = g.merge(&y, [b, qh, tq, dv]);
    let y = if io.three_d { y.transpose(&[0, 2, 1, 3]).reshape(&[b as i64, tq as i64, (qh * dv) as i64]) } else { y };
    let mut outs = vec![y, io.k.clone(), io.v.clone()];
    outs.extend(qk.map(|t| g.merge(&t, [b, qh, tq, tk])));
    Ok(outs)
}

/// `[batch, heads, seq, width]`.
fn dims4(t: &Tensor) -> (usize, usize, usize, usize) {
    let s = t.shape();
    (s[0], s[1], s[2], s[3])
}

/// Query, key and value as 4-D `[batch, heads, seq, width]`, the key and
/// value with the cache prepended (so they are the present ones).
struct Operands {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    three_d: bool,
    /// The cache's length (0 without one).
    past: usize,
}

impl Operands {
    fn read(n: &Node) -> Result<Operands, String> {
        let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
        let dtype = q.dtype();
        if !dtype.is_float() {
            return Err(format!("Q is {dtype}; Attention takes float Q, K and V"));
        }
        for (name, t) in [("K", k), ("V", v)] {
            if t.dtype() != dtype {
                return Err(format!("{name} is {}, Q is {dtype}: Q, K and V take one dtype", t.dtype()));
            }
            if t.rank() != q.rank() {
                return Err(format!("Q {:?} and {name} {:?} differ in rank", q.shape(), t.shape()));
            }
        }
        let three_d = match q.rank() {
            3 => true,
            4 => false,
            r => return Err(format!("Q {:?} has rank {r}; Attention takes 3-D or 4-D Q, K and V", q.shape())),
        };
        let (q, k, v) = if three_d { split_heads(n, q, k, v)? } else { heads_given(n, q, k, v)? };
        let (k, v, past) = with_cache(n, k, v)?;
        check_fit(&q, &k, &v)?;
        Ok(Operands { q, k, v, three_d, past })
    }
}

/// 3-D `[batch, seq, heads · width]` to 4-D by the head-count attributes.
fn split_heads(n: &Node, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor, Tensor), String> {
    let heads = |name: &str| -> Result<usize, String> {
        match n.attr_i(name, 0)? {
            h if h > 0 => Ok(h as usize),
            0 if !n.has_attr(name) => Err(format!("3-D Q, K and V need the attribute '{name}'")),
            h => Err(format!("{name} {h} must be positive")),
        }
    };
    let (qh, kvh) = (heads("q_num_heads")?, heads("kv_num_heads")?);
    let split = |name: &str, t: &Tensor, h: usize| -> Result<Tensor, String> {
        let s = t.shape();
        if !s[2].is_multiple_of(h) {
            return Err(format!("{name} {s:?}: hidden size {} is not a multiple of {h} heads", s[2]));
        }
        Ok(t.reshape(&[s[0] as i64, s[1] as i64, h as i64, (s[2] / h) as i64]).transpose(&[0, 2, 1, 3]))
    };
    Ok((split("Q", q, qh)?, split("K", k, kvh)?, split("V", v, kvh)?))
}

/// 4-D inputs: head-count attributes, if given, must agree with the shapes.
fn heads_given(n: &Node, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor, Tensor), String> {
    for (name, t) in [("q_num_heads", q), ("kv_num_heads", k)] {
        if n.has_attr(name) && n.attr_i(name, 0)? != t.shape()[1] as i64 {
            return Err(format!("{name} {} contradicts the 4-D shape {:?}", n.attr_i(name, 0)?, t.shape()));
        }
    }
    Ok((q.clone(), k.clone(), v.clone()))
}

/// `past_key` / `past_value` (both or neither) prepended along the sequence.
fn with_cache(n: &Node, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor, usize), String> {
    match (n.opt_input(4), n.opt_input(5)) {
        (None, None) => Ok((k, v, 0)),
        (Some(pk), Some(pv)) => {
            for (name, p, t) in [("past_key", pk, &k), ("past_value", pv, &v)] {
                let (ps, ts) = (p.shape(), t.shape());
                if p.dtype() != t.dtype() || ps.len() != 4 || ps[0] != ts[0] || ps[1] != ts[1] || ps[3] != ts[3] {
                    return Err(format!(
                        "{name} {} {ps:?} does not fit the new {} {ts:?} ([batch, kv_heads, past, width])",
                        p.dtype(),
                        t.dtype()
                    ));
                }
            }
            let past = pk.shape()[2];
            if pv.shape()[2] != past {
                return Err(format!("past_key {:?} and past_value {:?} differ in length", pk.shape(), pv.shape()));
            }
            Ok((Tensor::concat(&[pk, &k], 2), Tensor::concat(&[pv, &v], 2), past))
        }
        _ => Err("past_key and past_value come together or not at all".into()),
    }
}

/// Batch, widths, lengths and head counts agree.
fn check_fit(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(), String> {
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let bad = |what: &str| Err(format!("Q {qs:?}, K {ks:?} and V {vs:?} (as 4-D) {what}"));
    if qs[0] != ks[0] || ks[0] != vs[0] {
        return bad("differ in batch");
    }
    if qs[3] != ks[3] {
        return bad("differ in width of Q and K");
    }
    if ks[2] != vs[2] {
        return bad("differ in length of K and V");
    }
    if ks[1] != vs[1] {
        return bad("differ in heads of K and V");
    }
    if ks[1] == 0 || qs[1] % ks[1] != 0 {
        return bad("have query heads that are not a multiple of the key/value heads");
    }
    Ok(())
}

/// Query heads in groups over the key/value heads.
pub(crate) struct Grouping {
    pub kvh: usize,
    pub group: usize,
}

impl Grouping {
    /// `[b, qh, ..]` as `[b, kvh, group, ..]` (unchanged without groups).
    pub(crate) fn query(&self, t: &Tensor) -> Tensor {
        if self.group == 1 {
            return t.clone();
        }
        let s = t.shape();
        let mut shape = vec![s[0] as i64, self.kvh as i64, self.group as i64];
        shape.extend(s[2..].iter().map(|&d| d as i64));
        t.reshape(&shape)
    }

    /// `[b, kvh, ..]` as `[b, kvh, 1, ..]`.
    pub(crate) fn key(&self, t: &Tensor) -> Tensor {
        if self.group == 1 {
            t.clone()
        } else {
            t.expand_dims(2)
        }
    }

    /// A mask or bias of rank 4 with 1 or `qh` heads, grouped like the query.
    pub(crate) fn mask(&self, t: &Tensor) -> Tensor {
        if self.group == 1 {
            return t.clone();
        }
        let s = t.shape();
        if s[1] == 1 {
            return t.expand_dims(2);
        }
        t.reshape(&[s[0] as i64, self.kvh as i64, self.group as i64, s[2] as i64, s[3] as i64])
    }

    /// A `[b, qh, ..]` tensor in the grouped layout of `like`.
    pub(crate) fn group_like(&self, t: &Tensor, like: &Tensor) -> Tensor {
        if self.group == 1 {
            return t.clone();
        }
        t.reshape(&like.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
    }

    /// The grouped result back to `[b, qh, ..]`.
    pub(crate) fn merge(&self, t: &Tensor, shape: [usize; 4]) -> Tensor {
        if self.group == 1 {
            return t.clone();
        }
        t.reshape(&shape.map(|d| d as i64))
    }
}

/// What the mask, causality and `nonpad_kv_seqlen` allow, as 4-D tensors
/// broadcasting to `[batch, q_heads, Tq, Tk]`.
struct Masks {
    /// Pairs allowed (bool), `None` when every pair is.
    allowed: Option<Tensor>,
    /// A float mask added to the scores.
    additive: Option<Tensor>,
    /// Causality still to apply by the fused kernel: it is left out of
    /// `allowed` only for the kernel, when it is the only rule and the
    /// kernel's alignment is ONNX's.
    causal_flag: bool,
}

impl Masks {
    fn build(
        n: &Node,
        io: &Operands,
        set: &Settings,
        (b, qh, tq, tk): (usize, usize, usize, usize),
        fused: bool,
    ) -> Result<Masks, String> {
        let (mut allowed, mut additive) = (None, None);
        if let Some(m) = n.opt_input(3) {
            let m = mask_4d(m, io.q.dtype(), (b, qh, tq, tk))?;
            if m.dtype() == DType::Bool {
                allowed = Some(m);
            } else {
                additive = Some(m);
            }
        }
        if let Some(len) = n.opt_input(6) {
            let keep = nonpad_allowed(len, b, tk)?;
            allowed = Some(and(allowed, keep));
        }
        // ONNX aligns causality top-left after the cache: query i sees key
        // j when j <= i + past. The fused kernel aligns bottom-right
        // (j <= i + Tk - Tq): the same rule exactly when Tk = past + Tq.
        let mut causal_flag = false;
        if set.causal {
            // With an additive mask the rule is its -inf, added, as in
            // ONNX's reference: a NaN or +inf of the mask at a forbidden
            // pair still makes its row NaN (the kernel's rule would
            // overwrite it).
            if fused && allowed.is_none() && additive.is_none() && tk == io.past + tq {
                causal_flag = true;
            } else {
                let i = Tensor::arange(0.0, tq as f64, 1.0, DType::I64).reshape(&[1, 1, tq as i64, 1]);
                let j = Tensor::arange(0.0, tk as f64, 1.0, DType::I64).reshape(&[1, 1, 1, tk as i64]);
                allowed = Some(and(allowed, j.le(&(i + io.past as i64))));
            }
        }
        Ok(Masks { allowed, additive, causal_flag })
    }
}

fn and(a: Option<Tensor>, b: Tensor) -> Tensor {
    match a {
        Some(a) => a.logical_and(&b),
        None => b,
    }
}

/// `attn_mask` as a 4-D bool or float mask, its key axis padded to `tk`
/// (with `false` / -inf: the keys past its end are not attended).
fn mask_4d(m: &Tensor, dtype: DType, (b, qh, tq, tk): (usize, usize, usize, usize)) -> Result<Tensor, String> {
    if m.dtype() != DType::Bool && m.dtype() != dtype {
        return Err(format!("attn_mask is {}; it must be bool or Q's dtype {dtype}", m.dtype()));
    }
    let s = m.shape();
    if s.is_empty() || s.len() > 4 {
        return Err(format!("attn_mask {s:?} must have rank 1 to 4"));
    }
    let mut shape = vec![1usize; 4 - s.len()];
    shape.extend_from_slice(s);
    let fits = |have: usize, want: usize| have == 1 || have == want;
    if !fits(shape[0], b) || !fits(shape[1], qh) || !fits(shape[2], tq) || shape[3] > tk {
        return Err(format!(
            "attn_mask {s:?} does not broadcast to [batch {b}, heads {qh}, q_len {tq}, total_len {tk}] \
             (its last axis may be shorter, not longer)"
        ));
    }
    let m = m.reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
    if shape[3] == tk {
        return Ok(m);
    }
    let pad = if m.dtype() == DType::Bool { 0.0 } else { f64::NEG_INFINITY };
    Ok(m.pad(&[(0, 0), (0, 0), (0, 0), (0, tk - shape[3])], pad))
}

/// `nonpad_kv_seqlen` (`[batch]` integers) as `[batch, 1, 1, Tk]`: key `j`
/// of sample `b` counts when `j < len[b]`.
fn nonpad_allowed(len: &Tensor, b: usize, tk: usize) -> Result<Tensor, String> {
    if !len.dtype().is_int() || len.shape() != [b] {
        return Err(format!(
            "nonpad_kv_seqlen {} {:?} must be integers of shape [batch {b}]",
            len.dtype(),
            len.shape()
        ));
    }
    let j = Tensor::arange(0.0, tk as f64, 1.0, DType::I64).reshape(&[1, 1, 1, tk as i64]);
    Ok(j.lt(len.cast(DType::I64).reshape(&[b as i64, 1, 1, 1])))
}

/// NaN where a row of `allowed` (`[.., Tq, Tk]`) has no key, else `y`.
fn nan_where_nothing_seen(y: Tensor, allowed: &Tensor) -> Tensor {
    let any = allowed.cast(DType::I32).max(&[-1], true).gt(0i32);
    let nan = Tensor::full(&[], f64::NAN, y.dtype());
    Tensor::select(&any, &y, &nan)
}

/// The flash-attention composite: no scores held.
fn fused_attention(io: &Operands, masks: &Masks, g: &Grouping, scale: f64) -> Tensor {
    let allowed = masks.allowed.as_ref().map(|a| g.mask(a));
    let (q, k, v) = (g.query(&io.q), g.key(&io.k), g.key(&io.v));
    if let Some(m) = &masks.additive {
        // One float mask for the kernel: the additive one plus -inf where
        // a pair is not allowed, as the composition's bias (a query left
        // with only -inf scores gets NaN from the kernel, as ONNX's does).
        let dtype = io.q.dtype();
        let (zero, neg_inf) = (Tensor::zeros(&[], dtype), Tensor::full(&[], f64::NEG_INFINITY, dtype));
        let bias = match &allowed {
            Some(a) => g.mask(m) + Tensor::select(a, &zero, &neg_inf),
            None => g.mask(m),
        };
        return tracejit_nn::scaled_dot_product_attention(&q, &k, &v, Some(&bias), masks.causal_flag, Some(scale));
    }
    let y = tracejit_nn::scaled_dot_product_attention(&q, &k, &v, allowed.as_ref(), masks.causal_flag, Some(scale));
    match &allowed {
        Some(a) => nan_where_nothing_seen(y, a),
        None => y,
    }
}

/// The spec's pattern, scores materialized: `(Y, qk_matmul_output)` in
/// the grouped layout.
fn composed_attention(io: &Operands, masks: &Masks, set: &Settings, g: &Grouping, scale: f64) -> (Tensor, Tensor) {
    let dtype = io.q.dtype();
    let root = Tensor::full(&[], scale.sqrt(), dtype);
    let (q, k, v) = (g.query(&io.q), g.key(&io.k), g.key(&io.v));
    let raw = (&q * &root).matmul(&(&k * &root).t());
    let capped = match set.softcap {
        Some(c) => (&raw / c).tanh() * c,
        None => raw.clone(),
    };
    // The bias as ONNX's reference builds it: the float mask plus -inf
    // where a pair is not allowed (added, so a NaN score stays NaN).
    let neg_inf = Tensor::full(&[], f64::NEG_INFINITY, dtype);
    let zero = Tensor::zeros(&[], dtype);
    let blocked = masks.allowed.as_ref().map(|a| Tensor::select(&g.mask(a), &zero, &neg_inf));
    let bias = match (masks.additive.as_ref().map(|m| g.mask(m)), blocked) {
        (Some(m), Some(b)) => Some(m + b),
        (m, b) => m.or(b),
    };
    let biased = match &bias {
        Some(b) => &capped + b,
        None => capped.clone(),
    };
    let soft_dtype = set.precision.unwrap_or(dtype);
    let p = tracejit_nn::softmax(&cast(&biased, soft_dtype), -1);
    let y = cast(&p.matmul(&cast(&v, soft_dtype)), dtype);
    let qk = match set.mode {
        0 => raw,
        1 => capped,
        2 => biased,
        _ => cast(&p, dtype),
    };
    (y, qk)
}

/// `t` in `dtype` (itself when it is already).
fn cast(t: &Tensor, dtype: DType) -> Tensor {
    if t.dtype() == dtype {
        t.clone()
    } else {
        t.cast(dtype)
    }
}
