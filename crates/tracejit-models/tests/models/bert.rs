//! The BERT encoder against a plain f64 implementation written here from
//! Hugging Face's `BertModel` (loops over rows, heads and positions, no
//! tracejit op), on small random models written to safetensors under
//! Hugging Face's names: eagerly, compiled, with padding, and through the
//! pooling of sentence-transformers.
//!
//! Tolerance: every value the encoder produces is a layer norm's output
//! (of order 1) or a unit vector; with widths ≤ 24 each output is a chain
//! of ~10⁴ f32 operations whose relative rounding (2⁻²⁴ each) is damped by
//! every layer norm, and the JIT's f32 `erf` and `exp` are within a few
//! ULP. 2e-4 absolute leaves a 10x margin over the ~2e-5 worst case seen
//! here on AVX-512 and AVX2, and is still 100x below what a wrong mask, a
//! transposed weight or a swapped head gives (≥ 2e-2 in every mutation
//! tried).

use std::collections::BTreeMap;

use tracejit::prelude::*;
use tracejit_models::{l2_normalize, mean_pool, Bert, BertConfig, EmbedOptions, SentenceEncoder};

const TOL: f64 = 2e-4;

fn config(layers: usize) -> BertConfig {
    BertConfig::from_json(&format!(
        r#"{{"vocab_size": 13, "hidden_size": 12, "num_hidden_layers": {layers}, "num_attention_heads": 3,
        "intermediate_size": 20, "max_position_embeddings": 24, "type_vocab_size": 2, "layer_norm_eps": 1e-12}}"#
    ))
    .unwrap()
}

/// Random weights under Hugging Face's names, plus a pooler the model
/// must ignore; layer norms' scales near 1.
fn weights(c: &BertConfig, seed: u64) -> BTreeMap<String, Tensor> {
    let mut m: BTreeMap<String, Tensor> = Bert::expected_shapes(c)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let t = Tensor::randn(&shape, seed * 1000 + i as u64) * 0.4;
            let t = if name.ends_with("LayerNorm.weight") { t + 1.0 } else { t };
            (name, t)
        })
        .collect();
    m.insert("pooler.dense.weight".into(), Tensor::randn(&[c.hidden_size, c.hidden_size], 7));
    m
}

fn values(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

/// Hugging Face's `BertModel` forward in f64: `[b][t][h]` hidden states.
fn reference(c: &BertConfig, w: &BTreeMap<String, Tensor>, ids: &[Vec<i64>], mask: &[Vec<i64>]) -> Vec<Vec<Vec<f64>>> {
    let get = |n: &str| values(&w[n]);
    let (h, nh, d, inter) = (c.hidden_size, c.num_attention_heads, c.head_dim(), c.intermediate_size);
    let linear = |x: &[f64], wt: &[f64], b: &[f64], out: usize| -> Vec<f64> {
        let inp = x.len();
        (0..out).map(|o| b[o] + (0..inp).map(|i| x[i] * wt[o * inp + i]).sum::<f64>()).collect()
    };
    let norm = |x: &[f64], g: &[f64], b: &[f64]| -> Vec<f64> {
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64;
        x.iter().enumerate().map(|(i, v)| (v - mean) / (var + c.layer_norm_eps).sqrt() * g[i] + b[i]).collect()
    };
    let (word, pos, typ) = (
        get("embeddings.word_embeddings.weight"),
        get("embeddings.position_embeddings.weight"),
        get("embeddings.token_type_embeddings.weight"),
    );
    let mut out = Vec::new();
    for (row, m) in ids.iter().zip(mask) {
        let t = row.len();
        let mut x: Vec<Vec<f64>> = (0..t)
            .map(|p| {
                let e: Vec<f64> = (0..h).map(|j| word[row[p] as usize * h + j] + pos[p * h + j] + typ[j]).collect();
                norm(&e, &get("embeddings.LayerNorm.weight"), &get("embeddings.LayerNorm.bias"))
            })
            .collect();
        for l in 0..c.num_hidden_layers {
            let n = |s: &str| get(&format!("encoder.layer.{l}.{s}"));
            let proj = |s: &str| -> Vec<Vec<f64>> {
                x.iter()
                    .map(|xi| {
                        linear(
                            xi,
                            &n(&format!("attention.self.{s}.weight")),
                            &n(&format!("attention.self.{s}.bias")),
                            h,
                        )
                    })
                    .collect()
            };
            let (q, k, v) = (proj("query"), proj("key"), proj("value"));
            let mut ctx = vec![vec![0.0; h]; t];
            for head in 0..nh {
                for i in 0..t {
                    let scores: Vec<f64> = (0..t)
                        .map(|j| {
                            let s: f64 = (0..d).map(|e| q[i][head * d + e] * k[j][head * d + e]).sum();
                            if m[j] != 0 {
                                s / (d as f64).sqrt()
                            } else {
                                f64::NEG_INFINITY
                            }
                        })
                        .collect();
                    let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for j in 0..t {
                        for f in 0..d {
                            ctx[i][head * d + f] += e[j] / total * v[j][head * d + f];
                        }
                    }
                }
            }
            for i in 0..t {
                let a = linear(&ctx[i], &n("attention.output.dense.weight"), &n("attention.output.dense.bias"), h);
                let r: Vec<f64> = (0..h).map(|j| x[i][j] + a[j]).collect();
                let y = norm(&r, &n("attention.output.LayerNorm.weight"), &n("attention.output.LayerNorm.bias"));
                let f = linear(&y, &n("intermediate.dense.weight"), &n("intermediate.dense.bias"), inter);
                let g: Vec<f64> = f.iter().map(|v| 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))).collect();
                let o = linear(&g, &n("output.dense.weight"), &n("output.dense.bias"), h);
                let r: Vec<f64> = (0..h).map(|j| y[j] + o[j]).collect();
                x[i] = norm(&r, &n("output.LayerNorm.weight"), &n("output.LayerNorm.bias"));
            }
        }
        out.push(x);
    }
    out
}

/// A batch: random ids, each row padded after its own length.
fn batch(lengths: &[usize], t: usize, seed: u64) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as i64
    };
    let ids = lengths.iter().map(|&n| (0..t).map(|p| if p < n { 1 + next() % 12 } else { 0 }).collect()).collect();
    let mask = lengths.iter().map(|&n| (0..t).map(|p| i64::from(p < n)).collect()).collect();
    (ids, mask)
}

fn tensor(rows: &[Vec<i64>]) -> Tensor {
    Tensor::from_vec(rows.concat(), &[rows.len(), rows[0].len()])
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= TOL, "{what}: max |error| {worst:.3e} > {TOL:e}");
}

/// The real positions (mask 1) of the reference's states, flattened.
fn valid(reference: &[Vec<Vec<f64>>], mask: &[Vec<i64>]) -> Vec<f64> {
    let mut v = Vec::new();
    for (r, m) in reference.iter().zip(mask) {
        for (x, &on) in r.iter().zip(m) {
            if on != 0 {
                v.extend(x);
            }
        }
    }
    v
}

fn valid_of(hidden: &Tensor, mask: &[Vec<i64>]) -> Vec<f64> {
    let (t, h) = (hidden.shape()[1], hidden.shape()[2]);
    let all = values(hidden);
    let mut v = Vec::new();
    for (b, m) in mask.iter().enumerate() {
        for (p, &on) in m.iter().enumerate() {
            if on != 0 {
                v.extend(&all[(b * t + p) * h..(b * t + p + 1) * h]);
            }
        }
    }
    v
}

#[test]
fn eager_forward_matches_the_reference_on_real_positions() {
    for (layers, lengths, t) in [(1, vec![5], 5), (2, vec![7, 3, 1], 7), (2, vec![2, 11, 11, 6, 9], 13)] {
        let c = config(layers);
        let w = weights(&c, layers as u64);
        let bert = Bert::from_tensors(c.clone(), &w).unwrap();
        let (ids, mask) = batch(&lengths, t, 3);
        let got = bert.forward(&tensor(&ids), &tensor(&mask));
        assert_eq!(got.shape(), [lengths.len(), t, 12]);
        let want = reference(&c, &w, &ids, &mask);
        assert_close(&valid_of(&got, &mask), &valid(&want, &mask), &format!("{layers} layers, lengths {lengths:?}"));
    }
}

/// Padding changes nothing for the real positions: a sentence alone and
/// padded in a batch of longer ones gives the same states.
#[test]
fn padding_does_not_leak_into_real_positions() {
    let c = config(2);
    let bert = Bert::from_tensors(c.clone(), &weights(&c, 5)).unwrap();
    let (ids, mask) = batch(&[4, 9], 9, 11);
    let both = bert.forward(&tensor(&ids), &tensor(&mask));
    let alone = bert.forward(&tensor(&[ids[0][..4].to_vec()]), &tensor(&[vec![1; 4]]));
    let padded_row: Vec<f64> = values(&both)[..4 * 12].to_vec();
    assert_close(&padded_row, &values(&alone), "row 0 padded vs alone");
}

/// The compiled pooled forward (what `SentenceEmbedder` runs) equals the
/// reference's mean-pooled unit vectors, and the JIT compiled it.
#[test]
fn compiled_embeddings_match_the_reference() {
    let c = config(2);
    let w = weights(&c, 9);
    let bert = Bert::from_tensors(c.clone(), &w).unwrap();
    let model = bert.clone();
    let f = function(move |(ids, mask): (Tensor, Tensor)| l2_normalize(&mean_pool(&model.forward(&ids, &mask), &mask)));
    let (ids, mask) = batch(&[6, 2, 10, 1], 10, 21);
    let got = f.call((tensor(&ids), tensor(&mask))).unwrap();
    let stats = f.concrete_functions()[0].schedule_stats().expect("compiled by the JIT");
    assert!(stats.regions > 0 && stats.gemms > 0, "{stats}");
    let reference = reference(&c, &w, &ids, &mask);
    let mut want = Vec::new();
    for (r, m) in reference.iter().zip(&mask) {
        let n = m.iter().sum::<i64>() as f64;
        let mean: Vec<f64> =
            (0..12).map(|j| r.iter().zip(m).filter(|(_, &on)| on != 0).map(|(x, _)| x[j]).sum::<f64>() / n).collect();
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
        want.extend(mean.iter().map(|v| v / norm));
    }
    assert_close(&values(&got), &want, "pooled, compiled");
    // Eager gives the same within the tolerance too.
    let eager = l2_normalize(&mean_pool(&bert.forward(&tensor(&ids), &tensor(&mask)), &tensor(&mask)));
    assert_close(&values(&eager), &want, "pooled, eager");
}

/// The encoder with bf16 products (`SentenceEncoder::with_mixed_precision`)
/// runs its products on the bf16 GEMM and stays within cosine 0.999 of
/// the f32 encoder's unit vectors: each product's inputs are rounded to 8
/// significant bits (relative error 2⁻⁸ each), which moves a width-12
/// embedding by ~1e-2 at most through two layers, a cosine above 0.9999;
/// a wrong head or mask gives cosines below 0.99.
#[test]
fn bf16_encoder_stays_within_cosine_of_f32() {
    let c = config(2);
    let bert = Bert::from_tensors(c.clone(), &weights(&c, 5)).unwrap();
    let (f32_enc, bf16_enc) =
        (SentenceEncoder::new(bert.clone()), SentenceEncoder::with_mixed_precision(bert, DType::BF16));
    let (ids, _) = batch(&[6, 2, 10, 1], 10, 33);
    let ids: Vec<Vec<u32>> = ids.iter().map(|r| r.iter().filter(|&&t| t != 0).map(|&t| t as u32).collect()).collect();
    let opts = EmbedOptions::default();
    let want = f32_enc.embed_tokens(&ids, opts, &mut |_| {}).unwrap();
    let got = bf16_enc.embed_tokens(&ids, opts, &mut |_| {}).unwrap();
    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
        let cosine: f32 = g.iter().zip(w).map(|(a, b)| a * b).sum();
        assert!(cosine >= 0.999, "row {r}: cosine {cosine}");
    }
    let cf = &bf16_enc.function().concrete_functions()[0];
    let stats = cf.schedule_stats().expect("compiled by the JIT");
    assert!(stats.bf16_gemms > 0, "the products ran in bf16: {stats}");
}

/// A safetensors file as a Hugging Face checkpoint holds it (with the
/// `bert.` prefix a masked-LM checkpoint adds) loads through `Bert::load`;
/// a tensor of the wrong shape or missing is refused by name.
#[test]
fn a_model_directory_loads_and_bad_weights_are_named() {
    let dir = std::env::temp_dir().join(format!("tracejit_bert_dir_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = config(1);
    let w: BTreeMap<String, Tensor> = weights(&c, 2).into_iter().map(|(k, v)| (format!("bert.{k}"), v)).collect();
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "bert", "vocab_size": 13, "hidden_size": 12, "num_hidden_layers": 1,
        "num_attention_heads": 3, "intermediate_size": 20, "max_position_embeddings": 24}"#,
    )
    .unwrap();
    tracejit::checkpoint::write(dir.join("model.safetensors"), &w).unwrap();
    let bert = Bert::load(&dir).unwrap();
    assert_eq!(bert.named_variables().len(), 5 + 12);

    let mut bad = w.clone();
    bad.insert("bert.encoder.layer.0.output.dense.weight".into(), Tensor::zeros(&[20, 12], DType::F32));
    tracejit::checkpoint::write(dir.join("model.safetensors"), &bad).unwrap();
    let e = Bert::load(&dir).unwrap_err().to_string();
    assert!(e.contains("encoder.layer.0.output.dense.weight") && e.contains("[12, 20]"), "{e}");
    bad.remove("bert.embeddings.LayerNorm.bias");
    tracejit::checkpoint::write(dir.join("model.safetensors"), &bad).unwrap();
    let e = Bert::load(&dir).unwrap_err().to_string();
    assert!(e.contains("`embeddings.LayerNorm.bias` is missing"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
