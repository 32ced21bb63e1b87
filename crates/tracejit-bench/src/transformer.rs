//! W9 `transformer_block` and W10 `gpt_train_step`, on the very inputs
//! `shared/peers/bench_peers.py` builds (its `gen` / `gen_labels`
//! generator, reimplemented in [`gen`] so the figures compare like for
//! like), written as a tracejit user writes a GPT: `nn::layer_norm`,
//! `nn::scaled_dot_product_attention`, `nn::gelu`, `nn::embedding`,
//! `nn::softmax_cross_entropy_with_logits`.
//!
//! W10 is a pure function as JAX writes train steps (parameters and AdamW
//! state in, updated ones out), so the harness can call it again and again
//! on the same inputs and compare modes.

use tracejit::{DType, Tensor};

use crate::workloads::{Body, Case};

/// Batch, sequence, width, heads, MLP width and vocabulary of W9 and W10.
pub const B: usize = 8;
/// Sequence length.
pub const T: usize = 128;
/// Model width.
pub const D: usize = 256;
/// Attention heads (of `D / NH` = 64).
pub const NH: usize = 4;
/// MLP width.
pub const F: usize = 1024;
/// Vocabulary.
pub const VOCAB: usize = 96;

/// `bench_peers.py`'s `_mix`: 24 random bits per element of a splitmix64
/// stream from `seed`.
fn mix(seed: u64, n: usize) -> impl Iterator<Item = u64> {
    let base = seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (1..=n as u64).map(move |i| {
        let mut z = base.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) >> 40
    })
}

/// `bench_peers.py`'s `gen(seed, shape, lo, hi)`: f32 uniform in `[lo, hi)`.
pub fn gen(seed: u64, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f32> = mix(seed, n).map(|z| (lo + (hi - lo) * (z as f64 / 16_777_216.0)) as f32).collect();
    Tensor::from_vec(v, shape)
}

/// `bench_peers.py`'s `gen_labels(seed, n, k)`: i64 in `[0, k)`.
pub fn gen_labels(seed: u64, n: usize, k: usize) -> Tensor {
    Tensor::from_vec(mix(seed, n).map(|z| ((z * k as u64) >> 24) as i64).collect(), &[n])
}

/// He-uniform bound `sqrt(6 / fan_in)`.
pub(crate) fn he(fan_in: usize) -> f64 {
    (6.0 / fan_in as f64).sqrt()
}

/// One block's 12 parameters from seeds `s..s+11`, as `block_params`:
/// `ln1_g, ln1_b, w_qkv [D, 3D], b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc [D, F],
/// b_fc, w_proj [F, D], b_proj`.
pub fn block_params(s: u64) -> Vec<Tensor> {
    vec![
        gen(s, &[D], 0.8, 1.2),
        gen(s + 1, &[D], -0.1, 0.1),
        gen(s + 2, &[D, 3 * D], -he(D), he(D)),
        gen(s + 3, &[3 * D], -0.1, 0.1),
        gen(s + 4, &[D, D], -he(D), he(D)),
        gen(s + 5, &[D], -0.1, 0.1),
        gen(s + 6, &[D], 0.8, 1.2),
        gen(s + 7, &[D], -0.1, 0.1),
        gen(s + 8, &[D, F], -he(D), he(D)),
        gen(s + 9, &[F], -0.1, 0.1),
        gen(s + 10, &[F, D], -he(F), he(F)),
        gen(s + 11, &[D], -0.1, 0.1),
    ]
}

/// W10's 29 parameters: token embedding, positions, two blocks, the final
/// layer norm and the LM head, as `make_data`'s `gpt_p`.
pub fn gpt_params() -> Vec<Tensor> {
    let mut p = vec![gen(61, &[VOCAB, D], -1.0, 1.0), gen(62, &[T, D], -0.2, 0.2)];
    p.extend(block_params(63));
    p.extend(block_params(75));
    p.extend([gen(87, &[D], 0.8, 1.2), gen(88, &[D], -0.1, 0.1), gen(89, &[D, VOCAB], -he(D), he(D))]);
    p
}

fn ln(x: &Tensor, g: &Tensor, b: &Tensor) -> Tensor {
    tracejit::nn::layer_norm(x, g, b, 1e-5)
}

/// `[b, t, D]` to heads `[b, NH, t, D / NH]`.
fn heads(x: &Tensor, b: i64, t: i64) -> Tensor {
    x.reshape(&[b, t, NH as i64, (D / NH) as i64]).transpose(&[0, 2, 1, 3])
}

/// One pre-norm GPT block: `h = x + attn(ln1(x))`, `h + mlp(ln2(h))`.
pub fn block(x: &Tensor, p: &[Tensor]) -> Tensor {
    let [g1, b1, wqkv, bqkv, wo, bo, g2, b2, wfc, bfc, wpr, bpr] = p else {
        panic!("a block has 12 parameters, got {}", p.len())
    };
    let dims = x.dims();
    let (b, t) = (dims[0].map_or(-1, |d| d as i64), dims[1].expect("a known sequence length") as i64);
    let qkv = ln(x, g1, b1).matmul(wqkv) + bqkv;
    let part = |i: i64| heads(&qkv.slice_axis(-1, i * D as i64, (i + 1) * D as i64), b, t);
    let attn = tracejit::nn::scaled_dot_product_attention(&part(0), &part(1), &part(2), None, true, None);
    let attn = attn.transpose(&[0, 2, 1, 3]).reshape(&[b, t, D as i64]);
    let h = x + (attn.matmul(wo) + bo);
    let u = tracejit::nn::gelu(&(ln(&h, g2, b2).matmul(wfc) + bfc));
    &h + (u.matmul(wpr) + bpr)
}

/// W9's closure.
pub fn transformer_block((x, p): (Tensor, Vec<Tensor>)) -> Tensor {
    block(&x, &p)
}

/// W10's loss: mean next-token cross-entropy, positions `0..T-1`
/// predicting tokens `1..T`.
pub fn gpt_loss(tok: &Tensor, p: &[Tensor]) -> Tensor {
    gpt_loss_with(tok, p, None)
}

/// [`gpt_loss`] with each block wrapped in
/// `autodiff::checkpoint_with(.., policy)` when a policy is given: the
/// backward recomputes the blocks instead of keeping their intermediates.
pub fn gpt_loss_with(tok: &Tensor, p: &[Tensor], remat: Option<tracejit::autodiff::CheckpointPolicy>) -> Tensor {
    let t = tok.dims()[1].expect("a known sequence length") as i64;
    let mut h = tracejit::nn::embedding(&p[0], tok) + p[1].slice_axis(0, 0, t);
    for i in 0..2 {
        let params = p[2 + 12 * i..14 + 12 * i].to_vec();
        h = match remat {
            Some(policy) => tracejit::autodiff::checkpoint_with(move |h: &Tensor| block(h, &params), policy)(&h),
            None => block(&h, &params),
        };
    }
    let logits = ln(&h, &p[26], &p[27]).matmul(&p[28]).slice_axis(1, 0, t - 1);
    let targets = tok.slice_axis(1, 1, t).one_hot(VOCAB, logits.dtype());
    tracejit::nn::softmax_cross_entropy_with_logits(&logits, &targets).mean_all()
}

/// AdamW's hyperparameters (`bench_peers.py`'s `ADAMW`): the learning
/// rate (public: W10's tolerance is in units of it), then the rest.
pub const LR: f64 = 3e-4;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;
const WEIGHT_DECAY: f64 = 0.01;

/// W10's arguments: tokens `[B, T]`, the parameters, AdamW's moments and
/// its step count (f32 scalar).
pub type GptArgs = (Tensor, Vec<Tensor>, Vec<Tensor>, Vec<Tensor>, Tensor);

/// W10's closure: the loss, its gradients through a tape, and one AdamW
/// step (bias-corrected, decoupled weight decay) on every parameter.
/// Returns the updated parameters, moments and step, then the loss.
pub fn gpt_train_step(args: GptArgs) -> Vec<Tensor> {
    gpt_train_step_with(args, None, false)
}

/// W10 as one rank of a data-parallel job: its share of the batch, the
/// gradients averaged over ranks (`distributed::average_gradients`, in
/// buckets) before AdamW. In a world of one it is W10.
pub fn gpt_train_step_data_parallel(args: GptArgs) -> Vec<Tensor> {
    gpt_train_step_with(args, None, true)
}

/// W10c's closure: W10 with its blocks checkpointed (recomputed in the
/// backward), to compare peak memory and time with W10.
pub fn gpt_train_step_remat(args: GptArgs) -> Vec<Tensor> {
    gpt_train_step_with(args, Some(tracejit::autodiff::CheckpointPolicy::NothingSaveable), false)
}

fn gpt_train_step_with(
    (tok, params, m, v, step): GptArgs,
    remat: Option<tracejit::autodiff::CheckpointPolicy>,
    data_parallel: bool,
) -> Vec<Tensor> {
    let tape = tracejit::GradientTape::new();
    for p in &params {
        tape.watch(p);
    }
    let loss = gpt_loss_with(&tok, &params, remat);
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = tape.gradient(&loss, &refs).expect("every parameter is differentiable");
    let grads = if data_parallel {
        let g: Vec<Tensor> = grads.into_iter().map(|g| g.expect("every parameter reaches the loss")).collect();
        tracejit::distributed::average_gradients(&g).into_iter().map(Some).collect()
    } else {
        grads
    };
    let step = step + 1.0;
    let c1 = -(Tensor::full(&[], BETA1, step.dtype()).pow(&step)) + 1.0;
    let c2 = -(Tensor::full(&[], BETA2, step.dtype()).pow(&step)) + 1.0;
    let (mut new_p, mut new_m, mut new_v) = (Vec::new(), Vec::new(), Vec::new());
    for (((p, g), m), v) in params.iter().zip(grads).zip(&m).zip(&v) {
        let g = g.expect("every parameter reaches the loss");
        let m = m * BETA1 + &g * (1.0 - BETA1);
        let v = v * BETA2 + &g * &g * (1.0 - BETA2);
        let update = (&m / &c1) / ((&v / &c2).sqrt() + EPS) + p * WEIGHT_DECAY;
        new_p.push(p - update * LR);
        new_m.push(m);
        new_v.push(v);
    }
    let mut out = new_p;
    out.extend(new_m);
    out.extend(new_v);
    out.extend([step, loss]);
    out
}

/// W9's inputs, as `make_data`'s `tb_x` and `tb_p`.
pub fn build_transformer_block() -> Body {
    let x = gen(40, &[B, T, D], -1.0, 1.0);
    Body::Runnable(Box::new(Case::new("transformer_block", (x, block_params(41)), transformer_block)))
}

/// W10's inputs (`bench_peers.py`'s `gpt_tok` and `gpt_p`), zero moments, step 0.
pub fn gpt_args() -> GptArgs {
    let tok = gen_labels(60, B * T, VOCAB).reshape(&[B as i64, T as i64]);
    let params = gpt_params();
    let zeros: Vec<Tensor> = params.iter().map(Tensor::zeros_like).collect();
    (tok, params, zeros.clone(), zeros, Tensor::zeros(&[], DType::F32))
}

/// W10's inputs: `gpt_tok`, `gpt_p`, zero moments and step 0.
pub fn build_gpt_train_step() -> Body {
    Body::Runnable(Box::new(Case::new("gpt_train_step", gpt_args(), gpt_train_step)))
}

/// W10c: W10's inputs, blocks checkpointed.
pub fn build_gpt_train_step_remat() -> Body {
    Body::Runnable(Box::new(Case::new("gpt_train_step_remat", gpt_args(), gpt_train_step_remat)))
}

/// Multiply-adds of W9 (the products and the attention's two) and of
/// W10's forward, as `bench_peers.py --macs` counts them: W10's train step
/// is three times its forward.
pub fn macs() -> (u64, u64) {
    let (b, t, d, f, v) = (B as u64, T as u64, D as u64, F as u64, VOCAB as u64);
    let tokens = b * t;
    let products = tokens * (d * 3 * d + d * d + 2 * d * f);
    // Causal attention: half of the T x T scores, twice (q·kᵀ and p·v).
    let attention = b * NH as u64 * (t * t) * (d / NH as u64) * 2 / 2;
    let block = products + attention;
    (block, 2 * block + tokens * d * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_bench_peers() {
        // numpy: gen(1, (4,), -1, 1) and gen_labels(14, 4, 10).
        let x = gen(1, &[4], -1.0, 1.0).to_vec::<f32>().unwrap();
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)), "{x:?}");
        let l = gen_labels(14, 64, 10).to_vec::<i64>().unwrap();
        assert!(l.iter().all(|v| (0..10).contains(v)) && l.iter().any(|&v| v != l[0]), "{l:?}");
    }

    #[test]
    fn a_small_block_and_step_run_and_the_loss_is_near_log_vocab() {
        let x = gen(40, &[2, T, D], -1.0, 1.0);
        let y = block(&x, &block_params(41));
        assert_eq!(y.shape(), &[2, T, D]);
        let tok = gen_labels(60, 2 * T, VOCAB).reshape(&[2, T as i64]);
        let loss = gpt_loss(&tok, &gpt_params()).to_scalar::<f32>().unwrap();
        // Random weights: near ln(96) = 4.56, though the He-scaled head spreads it.
        assert!(loss.is_finite() && loss > 3.0 && loss < 12.0, "{loss}");
    }
}
