//! Attention as exporters spell it out — `MatMul(Q, Kᵀ)`, divided or
//! multiplied by a scalar, plus an additive mask, `Softmax` over the last
//! axis, `MatMul` with `V` (PyTorch's BERT-style models, MiniLM among
//! them) — runs as one `tracejit::nn::scaled_dot_product_attention`, whose
//! flash kernel never writes the `[.., Tq, Tk]` scores and probabilities
//! to memory: in W15 those two tensors and their products took a fifth of
//! the model's time.
//!
//! [`find`] matches the chains when the graph is prepared, each ending at
//! its last `MatMul` and each intermediate value read by the next node
//! alone (not a graph output, not read by a subgraph). When the graph is
//! evaluated, [`Chain::run`] computes that `MatMul`'s output from the
//! chain's operands, or declines when they do not fit (a non-float dtype,
//! dtypes that differ, a softmax axis that is not the last, a scale that is
//! not one number, shapes the kernel does not take or that the scale or
//! the mask would widen), and the nodes run as
//! written. The nodes before the last one have run by then; their results
//! are read by nothing and leave the trace with the dead code. The result
//! is the formula's up to rounding: the kernel scales `Q·Kᵀ` by `1/c` where
//! the graph divides by `c`, and sums in another order.

use std::collections::HashMap;

use tracejit_tensor::{kernels, DType};
use tracejit_trace::Tensor;

use super::program::NodeSpec;
use crate::Result;

/// One matched chain, by value names.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    q: String,
    /// `Kᵀ` as the first `MatMul` reads it (`[.., d, Tk]`).
    kt: String,
    v: String,
    /// The scalar the scores are divided (`true`) or multiplied by.
    scale: Option<(String, bool)>,
    /// Whether a `Constant` node gives the scale: its number goes to the
    /// kernel. Another scale (an initializer, which is a Variable, or a
    /// computed value) scales the queries as a tensor, so that a tape
    /// watching it still gets its gradient.
    scale_constant: bool,
    /// The additive mask.
    bias: Option<String>,
    /// The `Softmax` node's axis attribute, if given.
    axis: Option<i64>,
}

/// The nodes that end a chain, by index, with their chains.
pub(crate) fn find(nodes: &[NodeSpec], graph_outputs: &[String], opset: i64) -> HashMap<usize, Chain> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut reads: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            producer.insert(o, i);
        }
        for name in n.inputs.iter().chain(&n.captures).filter(|s| !s.is_empty()) {
            *reads.entry(name).or_default() += 1;
        }
    }
    for o in graph_outputs {
        *reads.entry(o).or_default() += 1;
    }
    // The node producing `name`, when `name` is read once and is its op's
    // only output, and the op has its arity (a malformed file's node may
    // not: it is refused when it runs, not here).
    let only = |name: &str, op: &str| -> Option<&NodeSpec> {
        let n = &nodes[*producer.get(name)?];
        let arity = if op == "Softmax" { 1 } else { 2 };
        let fits = n.inputs.len() == arity && n.inputs.iter().all(|i| !i.is_empty());
        (n.op_type == op && fits && reads.get(name) == Some(&1) && n.outputs.len() == 1).then_some(n)
    };
    let mut chains = HashMap::new();
    for (i, last) in nodes.iter().enumerate() {
        let named = |names: &[String]| names.iter().all(|n| !n.is_empty());
        if last.op_type != "MatMul" || last.inputs.len() != 2 || !named(&last.inputs) || !named(&last.outputs) {
            continue;
        }
        let Some(softmax) = only(&last.inputs[0], "Softmax") else { continue };
        let axis = softmax.attrs.get("axis").map(|a| a.i());
        if opset < 13 && axis.is_none() {
            // The old default, axis 1, flattens from there: not the last
            // axis of attention's scores.
            continue;
        }
        let (scores, bias) = match only(&softmax.inputs[0], "Add") {
            Some(add) => match scaled_product(&add.inputs[0], &only) {
                Some(found) => (found, Some(add.inputs[1].clone())),
                None => match scaled_product(&add.inputs[1], &only) {
                    Some(found) => (found, Some(add.inputs[0].clone())),
                    None => continue,
                },
            },
            None => match scaled_product(&softmax.inputs[0], &only) {
                Some(found) => (found, None),
                None => continue,
            },
        };
        let ((q, kt), scale) = scores;
        let scale_constant = scale
            .as_ref()
            .is_some_and(|(name, _)| producer.get(name.as_str()).is_some_and(|&p| nodes[p].op_type == "Constant"));
        chains.insert(i, Chain { q, kt, v: last.inputs[1].clone(), scale, scale_constant, bias, axis });
    }
    chains
}

/// `MatMul(Q, Kᵀ)` at `name`, divided or multiplied by a value or not:
/// `((Q, Kᵀ), scale)` by names.
type Scores = ((String, String), Option<(String, bool)>);

/// The scores behind `name`, if it is a chain's product (scaled or not).
fn scaled_product<'a>(name: &str, only: &impl Fn(&str, &str) -> Option<&'a NodeSpec>) -> Option<Scores> {
    let product = |name: &str| only(name, "MatMul").map(|m| (m.inputs[0].clone(), m.inputs[1].clone()));
    if let Some(div) = only(name, "Div") {
        return product(&div.inputs[0]).map(|p| (p, Some((div.inputs[1].clone(), true))));
    }
    if let Some(mul) = only(name, "Mul") {
        return match product(&mul.inputs[0]) {
            Some(p) => Some((p, Some((mul.inputs[1].clone(), false)))),
            None => product(&mul.inputs[1]).map(|p| (p, Some((mul.inputs[0].clone(), false)))),
        };
    }
    product(name).map(|p| (p, None))
}

impl Chain {
    /// The last `MatMul`'s output computed by the attention kernel, or
    /// `None` when the operands do not fit it (see the module).
    pub fn run<'a>(&'a self, get: &mut dyn FnMut(&'a str) -> Result<Tensor>) -> Result<Option<Tensor>> {
        let (q, kt, v) = (get(&self.q)?, get(&self.kt)?, get(&self.v)?);
        let bias = self.bias.as_deref().map(&mut *get).transpose()?;
        let scale = match &self.scale {
            Some((name, divide)) => Some((get(name)?, *divide)),
            None => None,
        };
        let dtype = q.dtype();
        let same = [&kt, &v].into_iter().chain(&bias).chain(scale.as_ref().map(|(s, _)| s)).all(|t| t.dtype() == dtype);
        if !dtype.is_float() || !same || q.rank() < 2 || kt.rank() < 2 || v.rank() < 2 {
            return Ok(None);
        }
        let (qs, ks, vs) = (q.shape(), kt.shape(), v.shape());
        let (d, tk) = (ks[ks.len() - 2], ks[ks.len() - 1]);
        if qs[qs.len() - 1] != d || vs[vs.len() - 2] != tk {
            return Ok(None);
        }
        // The Softmax's input: the scores of Q and Kᵀ alone (V's leading
        // axes join only at the last MatMul), which neither the scale nor
        // the mask may widen (the kernel's result has the operands' axes).
        let Some(lead) = broadcast(&[&qs[..qs.len() - 2], &ks[..ks.len() - 2]]) else {
            return Ok(None);
        };
        let scores: Vec<usize> = lead.iter().copied().chain([qs[qs.len() - 2], tk]).collect();
        let widens = |t: &Tensor| broadcast(&[&scores, t.shape()]).as_deref() != Some(&scores);
        if bias.as_ref().is_some_and(widens) || scale.as_ref().is_some_and(|(s, _)| widens(s)) {
            return Ok(None);
        }
        if broadcast(&[&lead, &vs[..vs.len() - 2]]).is_none() {
            return Ok(None);
        }
        let rank = scores.len() as i64;
        if self.axis.is_some_and(|a| a != -1 && a != rank - 1) {
            return Ok(None);
        }
        let (q, factor) = match &scale {
            None => (q, 1.0),
            Some((s, divide)) if s.shape().iter().all(|&n| n == 1) => {
                let known = (self.scale_constant && !s.is_symbolic())
                    .then(|| s.cast(DType::F64).to_vec::<f64>().ok())
                    .flatten();
                match known {
                    Some(c) if *divide => (q, 1.0 / c[0]),
                    Some(c) => (q, c[0]),
                    None if *divide => (&q / &s.reshape(&[]), 1.0),
                    None => (&q * &s.reshape(&[]), 1.0),
                }
            }
            Some(_) => return Ok(None),
        };
        let k = kt.t();
        Ok(Some(tracejit_nn::scaled_dot_product_attention(&q, &k, &v, bias.as_ref(), false, Some(factor))))
    }
}

/// The numpy broadcast of `shapes`, if they broadcast.
fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    shapes.iter().try_fold(Vec::new(), |acc, s| kernels::broadcast_shapes(&acc, s))
}
