//! The crate's error: which file, which tensor or which setting was wrong,
//! so a model directory that does not fit is refused with a reason rather
//! than a panic deep inside a forward pass.

use std::path::PathBuf;

/// An error of loading or running a pretrained model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `config.json` lacks a setting or holds one this crate cannot run.
    #[error("{path}: {message}")]
    Config {
        /// The file (or `<json>` for a string).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The weights do not fit the configuration: a tensor missing, of
    /// another shape or dtype.
    #[error("weights {path}: {message}")]
    Weights {
        /// The safetensors file (or `<tensors>`).
        path: PathBuf,
        /// What is wrong, naming the tensor.
        message: String,
    },
    /// The tokenizer file could not be read or used.
    #[error("tokenizer {path}: {message}")]
    Tokenizer {
        /// `tokenizer.json`.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Running the model failed (a tracing or run-time error of tracejit).
    #[error(transparent)]
    Run(#[from] tracejit::Error),
    /// Reading a safetensors file failed.
    #[error(transparent)]
    Checkpoint(#[from] tracejit::checkpoint::CheckpointError),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
