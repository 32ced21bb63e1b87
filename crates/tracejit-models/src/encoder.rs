//! [`SentenceEncoder`]: token ids to sentence embeddings — [`Bert`], mean
//! pooling over the attention mask and L2 normalization in one compiled
//! function — with batching that keeps padding small.
//!
//! Batching: sequences are sorted by length, longest first, and cut into
//! batches of at most [`EmbedOptions::batch_size`] whose lengths stay
//! within [`EmbedOptions::length_spread`] of the batch's longest; each
//! batch is padded only to its longest (rounded up to
//! [`EmbedOptions::pad_multiple`], which bounds the number of distinct
//! shapes and so of traces). A padded position costs as much as a real
//! one in every product (ONNX Runtime computes all of them), so a batch of
//! 32 sequences of 32..128 tokens padded to 128 wastes ~37% of its work;
//! batched this way, a few percent. The results go back in the caller's
//! order.

use tracejit::prelude::*;

use crate::{l2_normalize, mean_pool, Bert, Result};

/// How [`SentenceEncoder::embed_tokens`] batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Sequences per batch at most (sentence-transformers' default is 32).
    pub batch_size: usize,
    /// A batch's length is rounded up to a multiple of this.
    pub pad_multiple: usize,
    /// A batch ends where a sequence is more than this many tokens shorter
    /// than the batch's longest (`usize::MAX`: never; only `batch_size`
    /// cuts).
    pub length_spread: usize,
}

impl Default for EmbedOptions {
    fn default() -> EmbedOptions {
        EmbedOptions { batch_size: 32, pad_multiple: 8, length_spread: 16 }
    }
}

/// The compiled pooled forward: `(ids, mask)` to unit embeddings.
pub type EmbedFunction = Function<(Tensor, Tensor), Tensor>;

/// Token ids in, one unit vector per sequence out.
pub struct SentenceEncoder {
    bert: Bert,
    function: EmbedFunction,
}

impl SentenceEncoder {
    /// The encoder of `bert` (its variables shared, not copied).
    pub fn new(bert: Bert) -> SentenceEncoder {
        SentenceEncoder::build(bert, None)
    }

    /// The encoder of `bert` with its products in `low` precision and f32
    /// accumulation (`Function::mixed_precision`: `DType::BF16`, on the
    /// AMX tiles or AVX-512 BF16 where the CPU has them). all-MiniLM-L6-v2's
    /// embeddings stay within cosine 0.9999 of f32's (W15's harness rows).
    ///
    /// ```no_run
    /// use tracejit::DType;
    /// use tracejit_models::{Bert, SentenceEncoder};
    ///
    /// let bert = Bert::load("all-minilm-l6-v2-0.1.0")?;
    /// let encoder = SentenceEncoder::with_mixed_precision(bert, DType::BF16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_mixed_precision(bert: Bert, low: DType) -> SentenceEncoder {
        SentenceEncoder::build(bert, Some(low))
    }

    fn build(bert: Bert, low: Option<DType>) -> SentenceEncoder {
        let model = bert.clone();
        let function =
            function(move |(ids, mask): (Tensor, Tensor)| l2_normalize(&mean_pool(&model.forward(&ids, &mask), &mask)))
                .name("sentence_embedding")
                // One trace per batch shape is the plan (lengths rounded to
                // `pad_multiple`), not a cache churning.
                .warn_on_retrace(false);
        let function = match low {
            Some(low) => function.mixed_precision(low),
            None => function,
        };
        SentenceEncoder { bert, function }
    }

    /// The BERT model.
    pub fn bert(&self) -> &Bert {
        &self.bert
    }

    /// The compiled function `(ids [b, t] i64, mask [b, t] i64) -> [b,
    /// hidden]` (`profile`, `concrete_functions`, `mixed_precision`
    /// apply).
    pub fn function(&self) -> &EmbedFunction {
        &self.function
    }

    /// Unit embeddings `[batch, hidden]` of padded ids `[batch, seq]` and
    /// their mask (1 = token, 0 = padding), as one batch.
    pub fn embed_ids(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        Ok(self.function.call((ids.clone(), mask.clone()))?)
    }

    /// One embedding per sequence of token ids (each with its special
    /// tokens), in order, batched as `options` say; `progress(done)` after
    /// each batch.
    pub fn embed_tokens(
        &self,
        ids: &[Vec<u32>],
        options: EmbedOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let max = self.bert.config().max_position_embeddings;
        let mut out = vec![Vec::new(); ids.len()];
        let mut done = 0;
        for batch in batches(ids, options) {
            let longest = batch.iter().map(|&i| ids[i].len()).max().unwrap_or(0);
            let multiple = options.pad_multiple.max(1);
            let len = (longest.div_ceil(multiple) * multiple).min(max).max(longest);
            let (tokens, mask) = padded(batch.iter().map(|&i| ids[i].as_slice()), len);
            let e = self.embed_ids(&tokens, &mask)?;
            let width = e.shape()[1];
            let values = e.to_vec::<f32>()?;
            for (row, &i) in batch.iter().enumerate() {
                out[i] = values[row * width..(row + 1) * width].to_vec();
            }
            done += batch.len();
            progress(done);
        }
        Ok(out)
    }
}

/// The batches of `ids`' indices (see the module documentation).
fn batches(ids: &[Vec<u32>], options: EmbedOptions) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    // Longest first: the first trace is the largest shape; stable, so
    // equal lengths keep the caller's order.
    order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
    let mut out: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match out.last_mut() {
            Some(b)
                if b.len() < options.batch_size.max(1) && ids[b[0]].len() - ids[i].len() <= options.length_spread =>
            {
                b.push(i)
            }
            _ => out.push(vec![i]),
        }
    }
    out
}

/// Ids `[n, len]` (i64, 0 = `[PAD]`) and mask `[n, len]` (i64) of rows of
/// ids, each at most `len` long.
pub(crate) fn padded<'a>(rows: impl ExactSizeIterator<Item = &'a [u32]>, len: usize) -> (Tensor, Tensor) {
    let n = rows.len();
    let (mut ids, mut mask) = (vec![0i64; n * len], vec![0i64; n * len]);
    for (r, row) in rows.enumerate() {
        for (j, &id) in row.iter().enumerate() {
            ids[r * len + j] = i64::from(id);
            mask[r * len + j] = 1;
        }
    }
    (Tensor::from_vec(ids, &[n, len]), Tensor::from_vec(mask, &[n, len]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_lengths_together_and_cover_every_sequence_once() {
        let lens = [5usize, 40, 7, 38, 6, 100, 39, 8];
        let ids: Vec<Vec<u32>> = lens.iter().map(|&n| vec![1; n]).collect();
        let b = batches(&ids, EmbedOptions { batch_size: 3, pad_multiple: 8, length_spread: 4 });
        assert_eq!(b, [vec![5], vec![1, 6, 3], vec![7, 2, 4], vec![0]]);
        let all = batches(&ids, EmbedOptions { batch_size: 32, pad_multiple: 8, length_spread: usize::MAX });
        assert_eq!(all.len(), 1);
        let mut seen: Vec<usize> = all.concat();
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        assert!(batches(&[], EmbedOptions::default()).is_empty());
    }
}
