//! [`BertConfig`]: the settings of a BERT encoder, read from a Hugging Face
//! `config.json` (`BertConfig` of `transformers`). Only what the forward
//! pass needs is read; a setting this crate cannot honour (another
//! activation, relative positions) is refused by name.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Error, Result};

/// The feed-forward activation of a BERT layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · Φ(x)` with the error function (`"gelu"`, BERT's and MiniLM's).
    Gelu,
    /// The tanh approximation (`"gelu_new"`, `"gelu_pytorch_tanh"`).
    GeluTanh,
    /// `max(x, 0)` (`"relu"`).
    Relu,
}

/// A BERT encoder's settings.
///
/// ```
/// let c = tracejit_models::BertConfig::from_json(r#"{"vocab_size": 30522, "hidden_size": 384,
///     "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
///     "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
///     "type_vocab_size": 2}"#)?;
/// assert_eq!(c.head_dim(), 32);
/// # Ok::<(), tracejit_models::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Width of every layer's input and output.
    pub hidden_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (`hidden_size` divides by it).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// The feed-forward activation.
    pub hidden_act: Activation,
    /// The layer norms' epsilon.
    pub layer_norm_eps: f64,
    /// Rows of the position embedding: the longest input.
    pub max_position_embeddings: usize,
    /// Rows of the token-type embedding.
    pub type_vocab_size: usize,
}

impl BertConfig {
    /// Reads `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        BertConfig::parse(&text, path)
    }

    /// Reads a `config.json`'s text.
    pub fn from_json(text: &str) -> Result<BertConfig> {
        BertConfig::parse(text, Path::new("<json>"))
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn parse(text: &str, path: &Path) -> Result<BertConfig> {
        let err = |message: String| Error::Config { path: PathBuf::from(path), message };
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let size = |key: &str| -> Result<usize> {
            let n = v.get(key).ok_or_else(|| err(format!("`{key}` is missing")))?;
            n.as_u64()
                .filter(|&n| n > 0 && n <= 1 << 24)
                .map(|n| n as usize)
                .ok_or_else(|| err(format!("`{key}` must be a positive integer of at most 2^24, got {n}")))
        };
        let text_of = |key: &str, default: &str| v.get(key).and_then(Value::as_str).unwrap_or(default).to_string();
        if let Some(t) = v.get("model_type").and_then(Value::as_str) {
            if t != "bert" {
                return Err(err(format!("`model_type` is {t:?}: this encoder runs \"bert\" models")));
            }
        }
        let position = text_of("position_embedding_type", "absolute");
        if position != "absolute" {
            return Err(err(format!("`position_embedding_type` {position:?} is not supported (only \"absolute\")")));
        }
        let hidden_act = match text_of("hidden_act", "gelu").as_str() {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            other => return Err(err(format!("`hidden_act` {other:?} is not supported (gelu, gelu_new, relu)"))),
        };
        let layer_norm_eps = match v.get("layer_norm_eps") {
            None => 1e-12,
            Some(e) => e
                .as_f64()
                .filter(|e| e.is_finite() && *e >= 0.0)
                .ok_or_else(|| err(format!("`layer_norm_eps` must be a finite number >= 0, got {e}")))?,
        };
        let c = BertConfig {
            vocab_size: size("vocab_size")?,
            hidden_size: size("hidden_size")?,
            num_hidden_layers: size("num_hidden_layers")?,
            num_attention_heads: size("num_attention_heads")?,
            intermediate_size: size("intermediate_size")?,
            hidden_act,
            layer_norm_eps,
            max_position_embeddings: size("max_position_embeddings")?,
            type_vocab_size: if v.get("type_vocab_size").is_some() { size("type_vocab_size")? } else { 2 },
        };
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(err(format!(
                "`hidden_size` {} is not a multiple of `num_attention_heads` {}",
                c.hidden_size, c.num_attention_heads
            )));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
        "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
        "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
        "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}"#;

    #[test]
    fn minilm_reads() {
        let c = BertConfig::from_json(MINILM).unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.head_dim(), c.vocab_size), (384, 6, 32, 30522));
        assert_eq!((c.hidden_act, c.layer_norm_eps), (Activation::Gelu, 1e-12));
    }

    #[test]
    fn what_cannot_run_is_refused_by_name() {
        for (edit, says) in [
            (("\"gelu\"", "\"swish\""), "hidden_act"),
            (("\"absolute\"", "\"relative_key\""), "position_embedding_type"),
            (("\"num_attention_heads\": 12", "\"num_attention_heads\": 7"), "not a multiple"),
            (("\"hidden_size\": 384", "\"hidden_size\": -1"), "hidden_size"),
            (("\"vocab_size\": 30522", "\"vocab\": 1"), "`vocab_size` is missing"),
            (("\"bert\"", "\"gpt2\""), "model_type"),
        ] {
            let e = BertConfig::from_json(&MINILM.replace(edit.0, edit.1)).unwrap_err().to_string();
            assert!(e.contains(says), "{edit:?}: {e}");
        }
        assert!(BertConfig::from_json("{").unwrap_err().to_string().contains("not valid JSON"));
    }
}
