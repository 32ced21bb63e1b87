//! `FlexAttention` (domain `ai.onnx.preview`, version 1): attention over
//! 4-D query, key and value with grouped-query heads and two optional
//! modifier subgraphs, `score_mod` (on the scores before the softmax) and
//! `prob_mod` (on the probabilities after it), run inline on the scores
//! as the importer runs any graph. Scores are `(Q·√scale)·(K·√scale)ᵀ` in
//! the input dtype, then the softmax precision (`softmax_precision`, or
//! f32 for 16-bit floats, else the input's), as ONNX's reference computes
//! them.
//!
//! Without modifiers the op is plain attention: it runs
//! `tracejit::nn::scaled_dot_product_attention`'s flash kernel (which
//! computes 16-bit floats in f32, as the spec asks), never holding the
//! scores.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};
use crate::import::ops::attention::Grouping;
use crate::import::program::Program;

/// The attributes `FlexAttention` reads.
pub(crate) const ATTRS: &[&str] = &["prob_mod", "scale", "score_mod", "softmax_precision"];

/// The attributes that hold subgraphs.
pub(crate) const SUBGRAPHS: &[&str] = &["prob_mod", "score_mod"];

/// The import-time check of the attribute values.
pub(crate) fn check(n: &Node) -> Result<(), String> {
    precision(n).map(|_| ())
}

fn precision(n: &Node) -> Result<Option<DType>, String> {
    if !n.has_attr("softmax_precision") {
        return Ok(None);
    }
    match n.attr_dtype("softmax_precision", DType::F32)? {
        d if d.is_float() => Ok(Some(d)),
        d => Err(format!("softmax_precision {d} is not a float type")),
    }
}

/// A modifier subgraph, prepared.
fn modifier(n: &Node, name: &str) -> Result<Option<Program>, String> {
    let Some(g) = n.attrs.get(name).and_then(|a| a.g.as_ref()) else { return Ok(None) };
    let p = Program::subgraph(g, n.opsets).map_err(|e| e.to_string())?;
    if p.inputs.len() != 1 || p.outputs.len() != 1 {
        return Err(format!(
            "{name} takes one input and gives one output, not {} and {}",
            p.inputs.len(),
            p.outputs.len()
        ));
    }
    Ok(Some(p))
}

/// `x` through a modifier, which must keep its shape and dtype.
fn modify(n: &Node, p: &Program, name: &str, x: Tensor) -> Result<Tensor, String> {
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    let y = p.evaluate_with(vec![x], &n.captures).map_err(|e| format!("{name}: {e}"))?.remove(0);
    if y.shape() != shape.as_slice() || y.dtype() != dtype {
        return Err(format!("{name} turned {dtype} {shape:?} into {} {:?}; it must keep both", y.dtype(), y.shape()));
    }
    Ok(y)
}

/// `FlexAttention`.
pub(crate) fn flex_attention(n: &mut Node) -> OpResult {
    let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = q.dtype();
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let fits = qs.len() == 4
        && ks.len() == 4
        && vs.len() == 4
        && qs[0] == ks[0]
        && ks[0] == vs[0]
        && qs[3] == ks[3]
        && ks[1] == vs[1]
        && ks[2] == vs[2]
        && ks[1] > 0
        && qs[1] % ks[1] == 0;
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype || !fits {
        return Err(format!(
            "Q {dtype} {qs:?}, K {} {ks:?} and V {} {vs:?} must be one float dtype, [batch, heads, seq, width], \
             with Q's heads a multiple of K's and V's",
            k.dtype(),
            v.dtype()
        ));
    }
    let scale = if n.has_attr("scale") { n.attr_f("scale", 1.0)? as f64 } else { 1.0 / (qs[3] as f64).sqrt() };
    let wide = match precision(n)? {
        Some(p) => p,
        None if matches!(dtype, DType::F16 | DType::BF16) => DType::F32,
        None => dtype,
    };
    let (score_mod, prob_mod) = (modifier(n, "score_mod")?, modifier(n, "prob_mod")?);
    let g = Grouping { kvh: ks[1], group: qs[1] / ks[1] };
    let (gq, gk, gv) = (g.query(q), g.key(k), g.key(v));
    let plain = score_mod.is_none() && prob_mod.is_none();
    let y = if plain && (wide == dtype || wide == DType::F32 && dtype != DType::F64) {
        tracejit_nn::scaled_dot_product_attention(&gq, &gk, &gv, None, false, Some(scale))
    } else {
        let root = Tensor::full(&[], (scale as f32).sqrt() as f64, dtype);
        let scores = (&gq * &root).matmul(&(&gk * &root).t()).cast(wide);
        let four = [qs[0], qs[1], qs[2], ks[2]];
        let scores = match &score_mod {
            Some(p) => g.group_like(&modify(n, p, "score_mod", g.merge(&scores, four))?, &scores),
            None => scores,
        };
        let probs = tracejit_nn::softmax(&scores, -1);
        let probs = match &prob_mod {
            Some(p) => g.group_like(&modify(n, p, "prob_mod", g.merge(&probs, four))?, &probs),
            None => probs,
        };
        probs.matmul(&gv.cast(wide)).cast(dtype)
    };
    Ok(vec![g.merge(&y, [qs[0], qs[1], qs[2], vs[3]])])
}
