//! Losses: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss`
//! (log-softmax over the class axis 1, then the same negative
//! log-likelihood), with per-class weights, `ignore_index` and the
//! reductions `none`, `sum` and `mean` (the weighted mean: the sum of
//! losses over the sum of the weights that applied).

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

/// The weighted negative log-likelihood of `logp` `[N, C, d..]` at the
/// classes `target` `[N, d..]`, reduced as `reduction` says.
fn nll(n: &Node, logp: &Tensor, target: &Tensor, weight: Option<&Tensor>) -> Result<Tensor, String> {
    if logp.rank() < 2 || target.rank() + 1 != logp.rank() {
        return Err(format!(
            "input {:?} and target {:?} do not fit [N, C, d..] / [N, d..]",
            logp.shape(),
            target.shape()
        ));
    }
    let t = target.cast(DType::I64);
    let zero = Tensor::scalar(0i64);
    let mask = if n.has_attr("ignore_index") { Some(t.ne(Tensor::scalar(n.attr_i("ignore_index", 0)?))) } else { None };
    let safe = match &mask {
        Some(m) => Tensor::select(m, &t, &zero),
        None => t.clone(),
    };
    let picked = logp.gather_elements(1, &safe.expand_dims(1)).squeeze(&[1]);
    let mut w = match weight {
        Some(w) => w.gather(&safe, 0),
        None => Tensor::ones(safe.shape(), logp.dtype()),
    };
    if let Some(m) = &mask {
        w = Tensor::select(m, &w, &scalar_like(&w, 0.0));
    }
    let loss = picked.neg() * &w;
    match n.attr_s("reduction", "mean")?.as_str() {
        "none" => Ok(loss),
        "sum" => Ok(loss.sum_all()),
        "mean" => Ok(loss.sum_all() / w.sum_all()),
        r => Err(format!("reduction '{r}' is not none, sum or mean")),
    }
}

/// `NegativeLogLikelihoodLoss`.
pub(crate) fn nll_loss(n: &mut Node) -> OpResult {
    let (x, t) = (n.input(0)?, n.input(1)?);
    Ok(vec![nll(n, x, t, n.opt_input(2))?])
}

/// `SoftmaxCrossEntropyLoss`, with the optional `log_prob` output.
pub(crate) fn softmax_cross_entropy(n: &mut Node) -> OpResult {
    let (x, t) = (n.input(0)?, n.input(1)?);
    if x.rank() < 2 {
        return Err(format!("scores {:?} need a class axis", x.shape()));
    }
    let logp = tracejit_nn::log_softmax(x, 1);
    let loss = nll(n, &logp, t, n.opt_input(2))?;
    Ok(vec![loss, logp])
}
