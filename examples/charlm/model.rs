//! The character-level GPT: W10's architecture (token embedding, learned
//! positions, pre-norm blocks of causal attention and a GELU MLP, a final
//! layer norm and an LM head without bias) as a `#[derive(Module)]`, with
//! dropout on the residual branches, and the single-token step that
//! sampling runs against a KV cache.

use tracejit::nn::{dropout, dropout_at, embedding, gelu, layer_norm, scaled_dot_product_attention};
use tracejit::prelude::*;
use tracejit::random::Generator;

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Distinct characters of the corpus.
    pub vocab: usize,
    /// Context length (learned positions).
    pub context: usize,
    /// Model width.
    pub width: usize,
    /// Attention heads.
    pub heads: usize,
    /// Transformer blocks.
    pub blocks: usize,
}

impl Shape {
    /// Width of one head.
    pub fn head_width(&self) -> usize {
        self.width / self.heads
    }
}

/// One pre-norm block's parameters (W9's twelve).
#[derive(Module, Clone)]
pub struct Block {
    /// First layer norm's scale.
    pub ln1_g: Variable,
    /// First layer norm's shift.
    pub ln1_b: Variable,
    /// Queries, keys and values `[D, 3D]`.
    pub w_qkv: Variable,
    /// Their bias `[3D]`.
    pub b_qkv: Variable,
    /// Attention output projection `[D, D]`.
    pub w_o: Variable,
    /// Its bias.
    pub b_o: Variable,
    /// Second layer norm's scale.
    pub ln2_g: Variable,
    /// Second layer norm's shift.
    pub ln2_b: Variable,
    /// MLP up `[D, 4D]`.
    pub w_fc: Variable,
    /// Its bias.
    pub b_fc: Variable,
    /// MLP down `[4D, D]`.
    pub w_proj: Variable,
    /// Its bias.
    pub b_proj: Variable,
}

/// The whole model.
#[derive(Module, Clone)]
pub struct Gpt {
    /// Token embedding `[vocab, D]`.
    pub tokens: Variable,
    /// Learned positions `[context, D]`.
    pub positions: Variable,
    /// The blocks, input to output.
    pub blocks: Vec<Block>,
    /// Final layer norm's scale.
    pub ln_g: Variable,
    /// Final layer norm's shift.
    pub ln_b: Variable,
    /// LM head `[D, vocab]`, no bias.
    pub head: Variable,
}

/// `[b, t, D]` to heads `[b, H, t, D / H]`.
fn heads(x: &Tensor, s: &Shape) -> Tensor {
    let d = x.dims();
    let (b, t) = (d[0].map_or(-1, |v| v as i64), d[1].map_or(-1, |v| v as i64));
    x.reshape(&[b, t, s.heads as i64, s.head_width() as i64]).transpose(&[0, 2, 1, 3])
}

/// Heads `[b, H, t, dh]` back to `[b, t, D]`.
fn merge(x: &Tensor, s: &Shape) -> Tensor {
    let d = x.dims();
    let (b, t) = (d[0].map_or(-1, |v| v as i64), d[2].map_or(-1, |v| v as i64));
    x.transpose(&[0, 2, 1, 3]).reshape(&[b, t, s.width as i64])
}

/// Where dropout draws from, its rate, and the first row of the global
/// batch that this batch starts at (0 in one process; a data-parallel
/// rank's share starts further in, and draws that part of the whole
/// batch's masks, so the curve does not depend on the number of ranks);
/// `None` evaluates.
pub type Dropout<'a> = Option<(&'a Generator, f64, usize)>;

fn drop(x: Tensor, d: Dropout<'_>) -> Tensor {
    match d {
        Some((g, p, 0)) if p > 0.0 => dropout(&x, p, g, true),
        Some((g, p, first_row)) if p > 0.0 => {
            let row: usize = x.dims()[1..].iter().map(|d| d.expect("known activation sizes")).product();
            dropout_at(&x, p, g, true, (first_row * row) as u64)
        }
        _ => x,
    }
}

impl Block {
    /// A block of width `d` (GPT-2's initialization: normal(0, 0.02), the
    /// residual projections scaled by `1/sqrt(2 * blocks)`).
    fn new(s: &Shape, seed: u64) -> Block {
        let d = s.width;
        let w = |shape: &[usize], k: u64, scale: f64| Variable::new(Tensor::randn(shape, seed + k) * scale);
        let zeros = |n: usize| Variable::new(Tensor::zeros(&[n], DType::F32));
        let ones = |n: usize| Variable::new(Tensor::ones(&[n], DType::F32));
        let residual = 0.02 / (2.0 * s.blocks as f64).sqrt();
        Block {
            ln1_g: ones(d),
            ln1_b: zeros(d),
            w_qkv: w(&[d, 3 * d], 1, 0.02),
            b_qkv: zeros(3 * d),
            w_o: w(&[d, d], 2, residual),
            b_o: zeros(d),
            ln2_g: ones(d),
            ln2_b: zeros(d),
            w_fc: w(&[d, 4 * d], 3, 0.02),
            b_fc: zeros(4 * d),
            w_proj: w(&[4 * d, d], 4, residual),
            b_proj: zeros(d),
        }
    }

    /// Queries, keys and values of `x` `[b, t, D]`, as heads.
    fn qkv(&self, x: &Tensor, s: &Shape) -> [Tensor; 3] {
        let d = s.width as i64;
        let qkv =
            layer_norm(x, &self.ln1_g.read(), &self.ln1_b.read(), 1e-5).matmul(&self.w_qkv.read()) + self.b_qkv.read();
        [0, 1, 2].map(|i| heads(&qkv.slice_axis(-1, i * d, (i + 1) * d), s))
    }

    /// The rest of the block after attention: output projection, residual,
    /// MLP, residual.
    fn finish(&self, x: &Tensor, attn: &Tensor, s: &Shape, d: Dropout<'_>) -> Tensor {
        let h = x + drop(merge(attn, s).matmul(&self.w_o.read()) + self.b_o.read(), d);
        let u = gelu(
            &(layer_norm(&h, &self.ln2_g.read(), &self.ln2_b.read(), 1e-5).matmul(&self.w_fc.read())
                + self.b_fc.read()),
        );
        &h + drop(u.matmul(&self.w_proj.read()) + self.b_proj.read(), d)
    }

    /// The block on a whole sequence (causal attention); also returns its
    /// keys and values, which sampling caches.
    fn forward(&self, x: &Tensor, s: &Shape, d: Dropout<'_>) -> (Tensor, Tensor, Tensor) {
        let [q, k, v] = self.qkv(x, s);
        let attn = scaled_dot_product_attention(&q, &k, &v, None, true, None);
        (self.finish(x, &attn, s, d), k, v)
    }
}

impl Gpt {
    /// A fresh model of `shape`, weights drawn from `seed`.
    pub fn new(s: &Shape, seed: u64) -> Gpt {
        let w = |shape: &[usize], k: u64, scale: f64| Variable::new(Tensor::randn(shape, seed * 1000 + k) * scale);
        Gpt {
            tokens: w(&[s.vocab, s.width], 1, 0.02),
            positions: w(&[s.context, s.width], 2, 0.01),
            blocks: (0..s.blocks).map(|i| Block::new(s, seed * 1000 + 100 * (i as u64 + 1))).collect(),
            ln_g: Variable::new(Tensor::ones(&[s.width], DType::F32)),
            ln_b: Variable::new(Tensor::zeros(&[s.width], DType::F32)),
            head: w(&[s.width, s.vocab], 3, 0.02),
        }
    }

    /// Logits `[b, t, vocab]` of tokens `[b, t]` (i64, `t <= context`),
    /// and each block's keys and values `[b, H, t, dh]`.
    pub fn forward(&self, tokens: &Tensor, s: &Shape, d: Dropout<'_>) -> (Tensor, Vec<(Tensor, Tensor)>) {
        let t = tokens.dims()[1].expect("a known sequence length") as i64;
        let mut h = drop(embedding(&self.tokens.read(), tokens) + self.positions.read().slice_axis(0, 0, t), d);
        let mut caches = Vec::new();
        for b in &self.blocks {
            let (next, k, v) = b.forward(&h, s, d);
            h = next;
            caches.push((k, v));
        }
        (self.logits(&h), caches)
    }

    fn logits(&self, h: &Tensor) -> Tensor {
        layer_norm(h, &self.ln_g.read(), &self.ln_b.read(), 1e-5).matmul(&self.head.read())
    }

    /// Mean next-token cross-entropy (nats) of windows `[b, t]`: positions
    /// `0..t-1` predict tokens `1..t`.
    pub fn loss(&self, tokens: &Tensor, s: &Shape, d: Dropout<'_>) -> Tensor {
        let t = tokens.dims()[1].expect("a known sequence length") as i64;
        let logits = self.forward(tokens, s, d).0.slice_axis(1, 0, t - 1);
        let targets = tokens.slice_axis(1, 1, t).one_hot(s.vocab, DType::F32);
        tracejit::nn::softmax_cross_entropy_with_logits(&logits, &targets).mean_all()
    }

    /// One token `[1, 1]` at position `at` (i64 scalar) against caches
    /// `[1, H, context, dh]` holding positions `0..at`: its logits `[1,
    /// vocab]` and the caches with its keys and values written at `at`.
    pub fn step(
        &self,
        token: &Tensor,
        at: &Tensor,
        caches: &[(Tensor, Tensor)],
        s: &Shape,
    ) -> (Tensor, Vec<(Tensor, Tensor)>) {
        let zero = Tensor::scalar(0i64);
        let row = Tensor::stack(&[at, &zero], 0);
        let position = self.positions.read().dynamic_slice(&row, &[1, s.width]);
        let mut h = embedding(&self.tokens.read(), token) + position.expand_dims(0);
        // Cached positions `0..=at` are visible; the rest of the cache is
        // not written yet.
        let visible =
            Tensor::arange(0.0, s.context as f64, 1.0, DType::I64).le(at).reshape(&[1, 1, 1, s.context as i64]);
        let start = Tensor::stack(&[&zero, &zero, at, &zero], 0);
        let mut next = Vec::new();
        for (b, (kc, vc)) in self.blocks.iter().zip(caches) {
            let [q, k, v] = b.qkv(&h, s);
            let (kc, vc) = (kc.dynamic_update_slice(&k, &start), vc.dynamic_update_slice(&v, &start));
            let attn = scaled_dot_product_attention(&q, &kc, &vc, Some(&visible), false, None);
            h = b.finish(&h, &attn, s, None);
            next.push((kc, vc));
        }
        (self.logits(&h).reshape(&[1, s.vocab as i64]), next)
    }
}
