//! [`SentenceEmbedder`]: sentence-transformers' `encode` for a BERT model
//! directory such as all-MiniLM-L6-v2's — Hugging Face's tokenizer from
//! `tokenizer.json`, then a [`SentenceEncoder`] ([`crate::Bert`], mean
//! pooling over the attention mask, L2 normalization, texts of similar
//! lengths batched together).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::{Tokenizer, TruncationParams};
use tracejit::prelude::*;

use crate::{Bert, EmbedOptions, Error, Result, SentenceEncoder};

/// A sentence-embedding model: text in, one unit vector per text out
/// (a tokenizer and a [`SentenceEncoder`]).
pub struct SentenceEmbedder {
    encoder: SentenceEncoder,
    tokenizer: Tokenizer,
    max_length: usize,
}

impl SentenceEmbedder {
    /// Loads a model directory: `config.json`, `model.safetensors`,
    /// `tokenizer.json`, and `sentence_bert_config.json` when present (its
    /// `max_seq_length`: 256 for all-MiniLM-L6-v2; without it, the
    /// position table's length).
    pub fn load(dir: impl AsRef<Path>) -> Result<SentenceEmbedder> {
        let dir = dir.as_ref();
        let bert = Bert::load(dir)?;
        let max_length = read_max_length(&dir.join("sentence_bert_config.json"))?
            .unwrap_or(bert.config().max_position_embeddings)
            .min(bert.config().max_position_embeddings);
        let tokenizer = load_tokenizer(&dir.join("tokenizer.json"), max_length)?;
        Ok(SentenceEmbedder { encoder: SentenceEncoder::new(bert), tokenizer, max_length })
    }

    /// This model with its encoder's products in `low` precision
    /// ([`SentenceEncoder::with_mixed_precision`]).
    pub fn with_mixed_precision(self, low: DType) -> SentenceEmbedder {
        let encoder = SentenceEncoder::with_mixed_precision(self.encoder.bert().clone(), low);
        SentenceEmbedder { encoder, ..self }
    }

    /// The encoder: token ids to embeddings.
    pub fn encoder(&self) -> &SentenceEncoder {
        &self.encoder
    }

    /// The BERT model.
    pub fn bert(&self) -> &Bert {
        self.encoder.bert()
    }

    /// The compiled function behind the embeddings
    /// ([`SentenceEncoder::function`]).
    pub fn function(&self) -> &Function<(Tensor, Tensor), Tensor> {
        self.encoder.function()
    }

    /// The most word pieces a text keeps, `[CLS]` and `[SEP]` included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Word-piece ids of each text as the model sees them: `[CLS]`, the
    /// pieces, `[SEP]`, truncated to [`SentenceEmbedder::max_length`].
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| Error::Tokenizer {
            path: PathBuf::from("tokenizer.json"),
            message: format!("encoding failed: {e}"),
        })?;
        Ok(encodings.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// One embedding per text, in order ([`EmbedOptions::default`]).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_with(texts, EmbedOptions::default(), &mut |_| {})
    }

    /// [`SentenceEmbedder::embed`] batched as `options` say, calling
    /// `progress(done)` after each batch with the number of texts done.
    pub fn embed_with(
        &self,
        texts: &[&str],
        options: EmbedOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenize(texts)?;
        self.encoder.embed_tokens(&ids, options, progress)
    }
}

/// `max_seq_length` of a `sentence_bert_config.json`, if the file exists.
fn read_max_length(path: &Path) -> Result<Option<usize>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: path.to_path_buf(), source }),
    };
    let err = |message: String| Error::Config { path: path.to_path_buf(), message };
    let v: Value = serde_json::from_str(&text).map_err(|e| err(format!("not valid JSON: {e}")))?;
    match v.get("max_seq_length") {
        None => Ok(None),
        Some(n) => n
            .as_u64()
            .filter(|&n| n >= 2)
            .map(|n| Some(n as usize))
            .ok_or_else(|| err(format!("`max_seq_length` must be an integer of at least 2, got {n}"))),
    }
}

/// `tokenizer.json`, truncating at `max_length` and padding nothing (the
/// file's own padding and truncation settings are for other callers).
fn load_tokenizer(path: &Path, max_length: usize) -> Result<Tokenizer> {
    let err = |message: String| Error::Tokenizer { path: path.to_path_buf(), message };
    if !path.exists() {
        return Err(err("the file does not exist".into()));
    }
    let mut t = Tokenizer::from_file(path).map_err(|e| err(e.to_string()))?;
    t.with_padding(None);
    t.with_truncation(Some(TruncationParams { max_length, ..TruncationParams::default() }))
        .map_err(|e| err(format!("truncation at {max_length}: {e}")))?;
    Ok(t)
}
