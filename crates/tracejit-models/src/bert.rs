//! [`Bert`]: the BERT encoder of Hugging Face's `BertModel` (post-norm
//! layers: `x = LN(x + attn(x))`, `x = LN(x + ffn(x))`), built from a
//! `config.json` and the tensors of a `model.safetensors` under their
//! Hugging Face names (with or without the `bert.` prefix a
//! `BertForMaskedLM` checkpoint adds).
//!
//! Layout: tracejit multiplies `x · W` with `W` as `[in, out]`, so the
//! loader transposes every `nn.Linear` weight (stored `[out, in]`) once, and
//! joins a layer's query, key and value projections into one `[h, 3h]`
//! product (one GEMM instead of three; the heads are then strided views of
//! its result that attention reads in place). Padded positions are masked
//! out of attention as keys, as Hugging Face's extended attention mask does;
//! their own rows are computed (and later left out by [`crate::mean_pool`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracejit::prelude::*;

use crate::config::Activation;
use crate::{BertConfig, Error, Result};

/// The embeddings: token, position and token type, summed and normalized.
#[derive(Module, Clone)]
pub struct BertEmbeddings {
    /// `[vocab_size, hidden]`.
    pub word: Variable,
    /// `[max_position_embeddings, hidden]`.
    pub position: Variable,
    /// `[type_vocab_size, hidden]`.
    pub token_type: Variable,
    /// The layer norm's scale.
    pub norm_gamma: Variable,
    /// The layer norm's shift.
    pub norm_beta: Variable,
}

/// One encoder layer: self-attention and the feed-forward, each followed
/// by a residual add and a layer norm.
#[derive(Module, Clone)]
pub struct BertLayer {
    /// Query, key and value projections side by side: `[hidden, 3·hidden]`.
    pub qkv_w: Variable,
    /// Their biases, `[3·hidden]`.
    pub qkv_b: Variable,
    /// Attention output projection, `[hidden, hidden]`.
    pub attn_out_w: Variable,
    /// Its bias.
    pub attn_out_b: Variable,
    /// Layer norm after attention: scale.
    pub attn_norm_gamma: Variable,
    /// Layer norm after attention: shift.
    pub attn_norm_beta: Variable,
    /// Feed-forward in, `[hidden, intermediate]`.
    pub ffn_in_w: Variable,
    /// Its bias.
    pub ffn_in_b: Variable,
    /// Feed-forward out, `[intermediate, hidden]`.
    pub ffn_out_w: Variable,
    /// Its bias.
    pub ffn_out_b: Variable,
    /// Layer norm after the feed-forward: scale.
    pub ffn_norm_gamma: Variable,
    /// Layer norm after the feed-forward: shift.
    pub ffn_norm_beta: Variable,
}

/// A BERT encoder.
///
/// ```
/// use std::collections::BTreeMap;
/// use tracejit::prelude::*;
/// use tracejit_models::{Bert, BertConfig};
///
/// // A tiny random model under Hugging Face's names.
/// let config = BertConfig::from_json(r#"{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
///     "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 6}"#)?;
/// let tensors: BTreeMap<String, Tensor> = Bert::expected_shapes(&config)
///     .into_iter()
///     .enumerate()
///     .map(|(i, (name, shape))| (name, Tensor::randn(&shape, i as u64) * 0.1))
///     .collect();
/// let bert = Bert::from_tensors(config, &tensors)?;
/// let ids = Tensor::from_vec(vec![1i64, 5, 2, 0], &[1, 4]);
/// let mask = Tensor::from_vec(vec![1i64, 1, 1, 0], &[1, 4]);
/// assert_eq!(bert.forward(&ids, &mask).shape(), [1, 4, 8]);
/// # Ok::<(), tracejit_models::Error>(())
/// ```
#[derive(Module, Clone)]
pub struct Bert {
    /// The embeddings.
    pub embeddings: BertEmbeddings,
    /// The layers, first to last.
    pub layers: Vec<BertLayer>,
    #[module(skip)]
    config: BertConfig,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bert({:?})", self.config)
    }
}

impl Bert {
    /// Loads `dir/config.json` and `dir/model.safetensors`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Bert> {
        let dir = dir.as_ref();
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let weights = dir.join("model.safetensors");
        let tensors = tracejit::checkpoint::read(&weights)?;
        Bert::build(config, &tensors, &weights)
    }

    /// A model from tensors under Hugging Face's names (the `bert.` prefix
    /// optional): every tensor of [`Bert::expected_shapes`] must be there,
    /// f32, of that shape; others (the pooler, `position_ids`) are ignored.
    pub fn from_tensors(config: BertConfig, tensors: &BTreeMap<String, Tensor>) -> Result<Bert> {
        Bert::build(config, tensors, Path::new("<tensors>"))
    }

    /// Every tensor the model reads, by Hugging Face name, with its shape
    /// as stored (`nn.Linear` weights `[out, in]`).
    pub fn expected_shapes(c: &BertConfig) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let mut v = vec![
            ("embeddings.word_embeddings.weight".to_string(), vec![c.vocab_size, h]),
            ("embeddings.position_embeddings.weight".to_string(), vec![c.max_position_embeddings, h]),
            ("embeddings.token_type_embeddings.weight".to_string(), vec![c.type_vocab_size, h]),
            ("embeddings.LayerNorm.weight".to_string(), vec![h]),
            ("embeddings.LayerNorm.bias".to_string(), vec![h]),
        ];
        for l in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for (name, shape) in [
                ("attention.self.query.weight", vec![h, h]),
                ("attention.self.query.bias", vec![h]),
                ("attention.self.key.weight", vec![h, h]),
                ("attention.self.key.bias", vec![h]),
                ("attention.self.value.weight", vec![h, h]),
                ("attention.self.value.bias", vec![h]),
                ("attention.output.dense.weight", vec![h, h]),
                ("attention.output.dense.bias", vec![h]),
                ("attention.output.LayerNorm.weight", vec![h]),
                ("attention.output.LayerNorm.bias", vec![h]),
                ("intermediate.dense.weight", vec![i, h]),
                ("intermediate.dense.bias", vec![i]),
                ("output.dense.weight", vec![h, i]),
                ("output.dense.bias", vec![h]),
                ("output.LayerNorm.weight", vec![h]),
                ("output.LayerNorm.bias", vec![h]),
            ] {
                v.push((format!("{p}.{name}"), shape));
            }
        }
        v
    }

    fn build(config: BertConfig, tensors: &BTreeMap<String, Tensor>, path: &Path) -> Result<Bert> {
        let shapes: BTreeMap<String, Vec<usize>> = Bert::expected_shapes(&config).into_iter().collect();
        let get = |name: &str| -> Result<Tensor> {
            let err = |message: String| Error::Weights { path: PathBuf::from(path), message };
            let t = tensors
                .get(name)
                .or_else(|| tensors.get(&format!("bert.{name}")))
                .ok_or_else(|| err(format!("tensor `{name}` is missing")))?;
            let want = &shapes[name];
            if t.dtype() != DType::F32 || t.shape() != want.as_slice() {
                return Err(err(format!(
                    "tensor `{name}` is {} {:?}, the configuration needs f32 {want:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            Ok(t.clone())
        };
        let var = |t: Tensor| Variable::new(t);
        // `nn.Linear` stores `[out, in]`; tracejit multiplies by `[in, out]`,
        // laid out row-major once here (an eager transpose is a strided view).
        let linear_t = |name: &str| -> Result<Tensor> {
            let t = get(name)?.transpose(&[1, 0]);
            Ok(Tensor::from_vec(t.to_vec::<f32>()?, t.shape()))
        };
        let embeddings = BertEmbeddings {
            word: var(get("embeddings.word_embeddings.weight")?),
            position: var(get("embeddings.position_embeddings.weight")?),
            token_type: var(get("embeddings.token_type_embeddings.weight")?),
            norm_gamma: var(get("embeddings.LayerNorm.weight")?),
            norm_beta: var(get("embeddings.LayerNorm.bias")?),
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let n = |s: &str| format!("encoder.layer.{l}.{s}");
            let qkv = ["query", "key", "value"];
            let w: Vec<Tensor> =
                qkv.iter().map(|p| linear_t(&n(&format!("attention.self.{p}.weight")))).collect::<Result<_>>()?;
            let b: Vec<Tensor> =
                qkv.iter().map(|p| get(&n(&format!("attention.self.{p}.bias")))).collect::<Result<_>>()?;
            layers.push(BertLayer {
                qkv_w: var(Tensor::concat(&w.iter().collect::<Vec<_>>(), 1)),
                qkv_b: var(Tensor::concat(&b.iter().collect::<Vec<_>>(), 0)),
                attn_out_w: var(linear_t(&n("attention.output.dense.weight"))?),
                attn_out_b: var(get(&n("attention.output.dense.bias"))?),
                attn_norm_gamma: var(get(&n("attention.output.LayerNorm.weight"))?),
                attn_norm_beta: var(get(&n("attention.output.LayerNorm.bias"))?),
                ffn_in_w: var(linear_t(&n("intermediate.dense.weight"))?),
                ffn_in_b: var(get(&n("intermediate.dense.bias"))?),
                ffn_out_w: var(linear_t(&n("output.dense.weight"))?),
                ffn_out_b: var(get(&n("output.dense.bias"))?),
                ffn_norm_gamma: var(get(&n("output.LayerNorm.weight"))?),
                ffn_norm_beta: var(get(&n("output.LayerNorm.bias"))?),
            });
        }
        Ok(Bert { embeddings, layers, config })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The last layer's hidden states `[batch, seq, hidden]` of token ids
    /// `[batch, seq]` (i64 or i32) under an attention mask of the same
    /// shape (nonzero or `true` = a token, zero = padding; any dtype), with
    /// every token type 0. Eagerly, or recorded into the current trace.
    ///
    /// # Panics
    /// As tensor ops panic: on ids and mask of other shapes, a sequence
    /// longer than the position table, or ids out of the vocabulary.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Tensor {
        let params: Vec<Tensor> = self.named_variables().iter().map(|(_, v)| v.read()).collect();
        Bert::forward_with(&self.config, &params, ids, mask)
    }

    /// [`Bert::forward`] as a pure function of the weights: `params` are the
    /// values of [`Module::named_variables`] in that order (5 for the
    /// embeddings, then 12 per layer), of any one float dtype, so the same
    /// code runs with weights passed as arguments (a benchmark's f64
    /// reference, `vmap` over models, a functional training step).
    ///
    /// # Panics
    /// As [`Bert::forward`], and on a wrong number of `params`.
    #[track_caller]
    pub fn forward_with(c: &BertConfig, params: &[Tensor], ids: &Tensor, mask: &Tensor) -> Tensor {
        assert_eq!(
            params.len(),
            5 + 12 * c.num_hidden_layers,
            "Bert::forward_with: {} layers take {} weights",
            c.num_hidden_layers,
            5 + 12 * c.num_hidden_layers
        );
        let dims = ids.dims();
        assert!(dims.len() == 2, "Bert::forward: ids must be [batch, seq], got {:?}", ids.shape());
        let b = dims[0].map_or(-1, |d| d as i64);
        let t = dims[1].expect("Bert::forward: the sequence length must be known while tracing");
        assert!(
            t <= c.max_position_embeddings,
            "Bert::forward: {t} positions, the model has {}",
            c.max_position_embeddings
        );
        let [word, position, token_type, gamma, beta] = &params[..5] else { unreachable!() };
        let x =
            tracejit::nn::embedding(word, ids) + position.slice_axis(0, 0, t as i64) + token_type.slice_axis(0, 0, 1);
        let mut x = tracejit::nn::layer_norm(&x, gamma, beta, c.layer_norm_eps);
        // `true` where a key may be attended to, broadcast over heads and queries.
        let keys = mask.cast(DType::Bool).reshape(&[b, 1, 1, t as i64]);
        for p in params[5..].chunks(12) {
            x = layer(c, p, &x, &keys, b, t as i64);
        }
        x
    }
}

/// One layer over its 12 weights (in [`BertLayer`]'s field order).
fn layer(c: &BertConfig, p: &[Tensor], x: &Tensor, keys: &Tensor, b: i64, t: i64) -> Tensor {
    let [qkv_w, qkv_b, out_w, out_b, g1, b1, in_w, in_b, ffn_w, ffn_b, g2, b2] = p else { unreachable!() };
    let (h, nh, d) = (c.hidden_size as i64, c.num_attention_heads as i64, c.head_dim() as i64);
    let eps = c.layer_norm_eps;
    let qkv = x.matmul(qkv_w) + qkv_b;
    let heads = |i: i64| qkv.slice_axis(-1, i * h, (i + 1) * h).reshape(&[b, t, nh, d]).transpose(&[0, 2, 1, 3]);
    let a = tracejit::nn::scaled_dot_product_attention(&heads(0), &heads(1), &heads(2), Some(keys), false, None);
    let a = a.transpose(&[0, 2, 1, 3]).reshape(&[b, t, h]);
    let x = tracejit::nn::layer_norm(&(x + (a.matmul(out_w) + out_b)), g1, b1, eps);
    let f = x.matmul(in_w) + in_b;
    let f = match c.hidden_act {
        Activation::Gelu => gelu_erf(&f),
        Activation::GeluTanh => tracejit::nn::gelu(&f),
        Activation::Relu => f.relu(),
    };
    tracejit::nn::layer_norm(&(&x + (f.matmul(ffn_w) + ffn_b)), g2, b2, eps)
}

/// `x · Φ(x) = 0.5 · x · (1 + erf(x / √2))`, BERT's GELU.
fn gelu_erf(x: &Tensor) -> Tensor {
    0.5 * x * ((x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0)
}
