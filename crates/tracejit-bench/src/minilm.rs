//! W15 `minilm`: all-MiniLM-L6-v2 sentence embeddings through
//! tracejit-models' native BERT, from the model's own `model.safetensors`
//! (`scripts/fetch_minilm.sh`; `bench_peers.py` reads the same weights
//! through `models/make_models.py`).
//!
//! Inputs are `bench_peers.py`'s `w15_inputs`: 32 sequences of 128 ids,
//! row `b` holding `32..128` tokens (`[CLS]` first, `[SEP]` last) and
//! padding after. ONNX Runtime and PyTorch compute every padded position;
//! tracejit does what `SentenceEncoder::embed_tokens` does for a user's
//! batch: the rows are grouped by length (sorted, a group's lengths within
//! 16 tokens of its longest, padded to a multiple of 8), each group runs
//! the encoder, and the embeddings return in the rows' order. The grouping
//! is read off the mask when the inputs are built (it is what a caller who
//! made the mask knows); the call does the rest. The weights are
//! arguments, so the harness's f64 reference runs the same code.

use std::path::PathBuf;

use tracejit::{DType, Tensor};
use tracejit_models::{l2_normalize, mean_pool, Bert, BertConfig};

use crate::transformer::gen_labels;
use crate::workloads::{Body, Case};

/// Sequences in the batch.
pub const B: usize = 32;
/// Tokens per sequence, padding included.
pub const T: usize = 128;

/// The model directory: `TRACEJIT_MINILM`, else where
/// `scripts/fetch_minilm.sh` unpacks it.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TRACEJIT_MINILM") {
        return PathBuf::from(d);
    }
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tracejit"));
    root.join("all-minilm-l6-v2-0.1.0")
}

/// `bench_peers.py`'s W15 ids and mask (i64 `[32, 128]`) and each row's
/// length.
pub fn inputs() -> (Tensor, Tensor, Vec<usize>) {
    let raw = gen_labels(120, B * T, 29000).to_vec::<i64>().expect("eager");
    let lens: Vec<usize> =
        gen_labels(121, B, T - 31).to_vec::<i64>().expect("eager").into_iter().map(|l| 32 + l as usize).collect();
    let (mut ids, mut mask) = (vec![0i64; B * T], vec![0i64; B * T]);
    for (b, &len) in lens.iter().enumerate() {
        for p in 0..len {
            ids[b * T + p] = 1000 + raw[b * T + p];
            mask[b * T + p] = 1;
        }
        ids[b * T] = 101;
        ids[b * T + len - 1] = 102;
    }
    (Tensor::from_vec(ids, &[B, T]), Tensor::from_vec(mask, &[B, T]), lens)
}

/// The arguments of one call: each group's ids and mask `[rows, len]`, the
/// permutation putting the groups' rows back in order, and the weights.
pub type Args = (Vec<(Tensor, Tensor)>, Tensor, Vec<Tensor>);

/// Groups of rows of similar length (see the module documentation) and
/// the permutation back.
pub fn grouped(ids: &Tensor, lens: &[usize]) -> (Vec<(Tensor, Tensor)>, Tensor) {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match groups.last_mut() {
            Some(g) if lens[g[0]] - lens[i] <= 16 => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    let all = ids.to_vec::<i64>().expect("eager");
    let width = ids.shape()[1];
    let mut position = vec![0i64; lens.len()];
    let mut out = Vec::new();
    let mut next = 0;
    for g in &groups {
        let len = (lens[g[0]].div_ceil(8) * 8).min(width);
        let (mut gi, mut gm) = (vec![0i64; g.len() * len], vec![0i64; g.len() * len]);
        for (r, &row) in g.iter().enumerate() {
            gi[r * len..r * len + lens[row]].copy_from_slice(&all[row * width..row * width + lens[row]]);
            gm[r * len..r * len + lens[row]].iter_mut().for_each(|m| *m = 1);
            position[row] = next;
            next += 1;
        }
        out.push((Tensor::from_vec(gi, &[g.len(), len]), Tensor::from_vec(gm, &[g.len(), len])));
    }
    (out, Tensor::from_vec(position, &[lens.len()]))
}

/// W15's closure: each group through BERT, mean-pooled and normalized,
/// the rows back in order: `[32, 384]`.
pub fn embeddings(config: &BertConfig, (groups, order, params): Args) -> Tensor {
    let parts: Vec<Tensor> = groups
        .iter()
        .map(|(ids, mask)| l2_normalize(&mean_pool(&Bert::forward_with(config, &params, ids, mask), mask)))
        .collect();
    Tensor::concat(&parts, 0).gather(&order, 0)
}

/// W15's inputs and closure, or why not (the model is not fetched).
pub fn build_minilm() -> Body {
    let dir = model_dir();
    let bert = match Bert::load(&dir) {
        Ok(b) => b,
        Err(e) => return Body::Unavailable(format!("all-MiniLM-L6-v2 ({e}): run scripts/fetch_minilm.sh")),
    };
    let (ids, _mask, lens) = inputs();
    let (groups, order) = grouped(&ids, &lens);
    let params: Vec<Tensor> = tracejit::Module::named_variables(&bert).iter().map(|(_, v)| v.value()).collect();
    debug_assert!(params.iter().all(|p| p.dtype() == DType::F32));
    let config = bert.config().clone();
    // The inputs the int8 mode keeps as arguments: each group's ids and
    // mask, and the permutation.
    let inputs = 2 * groups.len() + 1;
    Body::Runnable(Box::new(
        Case::new("minilm", (groups, order, params), move |a: Args| embeddings(&config, a)).with_inputs(inputs),
    ))
}

/// Multiply-adds of W15 as ONNX Runtime computes it (every padded
/// position: `bench_peers.py`'s `minilm_macs(32, 128)`), and of the
/// grouped batch tracejit computes.
pub fn macs(lens: &[usize]) -> (u64, u64) {
    let per_layer = |rows: u64, t: u64| {
        let (h, f) = (384u64, 1536u64);
        rows * t * (4 * h * h + 2 * h * f) + rows * 2 * t * t * h
    };
    let padded = 6 * per_layer(B as u64, T as u64);
    let (ids, _, _) = inputs();
    let (groups, _) = grouped(&ids, lens);
    let grouped: u64 = groups.iter().map(|(g, _)| 6 * per_layer(g.shape()[0] as u64, g.shape()[1] as u64)).sum();
    (padded, grouped)
}
