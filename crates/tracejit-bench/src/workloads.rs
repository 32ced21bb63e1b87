//! The workloads W1-W13 of shared/WORKLOADS.md, each written once as a
//! closure over [`Tensor`]s and run in every [`Mode`] from that one closure.
//!
//! How each mode runs the closure is in [`crate::modes`].
//!
//! Softmax (W3) and layer norm (W4) are written with primitives (`max`, `sub`,
//! `exp`, `sum`, `div` / `mean`, `rsqrt`), as the workloads define them.
//! The LSTM cell of W7 goes through [`lstm_cell`], the single place that
//! switches it to the `tracejit::nn::lstm_cell` composite.

use tracejit::Tensor;

use crate::verify::Tolerance;

pub use crate::case::{flatten_result, Case, Runnable, TracedRunner};

pub use crate::modes::{configure_function, Mode, BF16_MODES, COMPOSITE_MODES, LOW_PRECISION_MODES, STANDARD_MODES};

/// What a workload spec builds: a runnable case, or the reason it cannot run
/// at all yet.
pub enum Body {
    /// Inputs and closure.
    Runnable(Box<dyn Runnable>),
    /// Every mode is `n/a` for this reason.
    Unavailable(String),
}

/// A workload's identity and how to build it.
pub struct WorkloadSpec {
    /// `W1`..`W13b`.
    pub id: &'static str,
    /// The name used in JSON (`small_ops`, `gelu`, ...).
    pub name: &'static str,
    /// One line saying what it computes.
    pub what: &'static str,
    /// How close every mode must be to the eager result.
    pub tolerance: Tolerance,
    /// Why that tolerance.
    pub tolerance_note: &'static str,
    /// Bytes a perfect implementation moves (for the bandwidth floor).
    pub floor_bytes: Option<f64>,
    /// The modes it runs in.
    pub modes: &'static [Mode],
    /// How close its reduced-precision modes (bf16, int8) must be to the
    /// f32 eager result.
    pub low_precision: Tolerance,
    /// Builds the inputs (from fixed seeds) and the closure.
    pub build: fn() -> Body,
}

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Every workload, in order W1..W13b, W15, then the real-model rows
/// ([`crate::onnx_models`]: W15 `minilm_onnx`, W14, W14b), then the micro
/// rows ([`crate::micro`]).
pub fn all() -> Vec<WorkloadSpec> {
    elementwise()
        .into_iter()
        .chain(networks())
        .chain(models())
        .chain(crate::onnx_models::specs())
        .chain(crate::micro::specs())
        .collect()
}

/// W1-W4: elementwise chains, softmax and layer norm.
fn elementwise() -> Vec<WorkloadSpec> {
    vec![
        WorkloadSpec {
            id: "W1",
            name: "small_ops",
            what: "x of [16]; 50 times x = x * 1.0001 + 0.001 (100 elementwise ops)",
            tolerance: Tolerance::EXACT_CHAIN,
            tolerance_note: "exact ops; FMA contraction may change the last bit of each step",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: build_small_ops,
        },
        WorkloadSpec {
            id: "W2",
            name: "gelu",
            what: "tanh-approximation GELU on [1048576]",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "tanh may be a polynomial approximation in the JIT",
            floor_bytes: Some(8.0 * MIB),
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: build_gelu,
        },
        WorkloadSpec {
            id: "W3",
            name: "softmax",
            what: "stable row softmax on [1024, 1024] (primitives: max, sub, exp, sum, div)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp approximation and reduction order",
            floor_bytes: Some(8.0 * MIB),
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: build_softmax,
        },
        WorkloadSpec {
            id: "W4",
            name: "layernorm",
            what: "layer norm over the last axis of [1024, 1024], eps 1e-5 (primitives: mean, var, rsqrt)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "rsqrt approximation and reduction order",
            floor_bytes: Some(8.0 * MIB + 2.0 * 4096.0),
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: build_layernorm,
        },
    ]
}

/// W5-W8: the MLP forward and train step, the LSTM cell, the RNN loop.
fn networks() -> Vec<WorkloadSpec> {
    vec![
        WorkloadSpec {
            id: "W5",
            name: "mlp_forward",
            what: "batch 64, 784 -> 512 -> 512 -> 10, bias + relu between layers",
            tolerance: Tolerance { rtol: 1e-5, atol: 1e-5, abs: 0.0, row_cosine: 0.0 },
            tolerance_note: "exact ops, but dot products of length 784 summed in another order cancel",
            floor_bytes: None,
            modes: LOW_PRECISION_MODES,
            low_precision: Tolerance::BF16,
            build: build_mlp_forward,
        },
        WorkloadSpec {
            id: "W6",
            name: "mlp_train_step",
            what: "W5 + softmax cross-entropy + backward + SGD (lr 0.01)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp/log in the loss",
            floor_bytes: None,
            modes: BF16_MODES,
            low_precision: Tolerance::BF16,
            build: build_mlp_train_step,
        },
        WorkloadSpec {
            id: "W7",
            name: "lstm_cell",
            what: "LSTM cell, batch 64, input 256, hidden 256, one step",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "sigmoid/tanh approximations",
            floor_bytes: None,
            modes: COMPOSITE_MODES,
            low_precision: Tolerance::BF16,
            build: build_lstm_cell,
        },
        WorkloadSpec {
            id: "W8",
            name: "rnn_loop",
            what: "32 steps of h = tanh(x[t] @ wx + h @ wh + b) in one while loop node; x [32, 32, 64], hidden 128",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "tanh approximation, compounded over 32 steps",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: build_rnn_loop,
        },
    ]
}

/// W9-W13b: transformers, convolutional nets, per-example gradients.
fn models() -> Vec<WorkloadSpec> {
    vec![
        WorkloadSpec {
            id: "W9",
            name: "transformer_block",
            what: "pre-norm causal GPT block: x [8, 128, 256], 4 heads of 64, MLP 1024, tanh-GELU; forward",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp in the attention, tanh in GELU, rsqrt in the layer norms",
            floor_bytes: None,
            modes: LOW_PRECISION_MODES,
            low_precision: Tolerance::BF16,
            build: crate::transformer::build_transformer_block,
        },
        WorkloadSpec {
            id: "W10",
            name: "gpt_train_step",
            what: "2-block W9 GPT, vocabulary 96: embedding, loss, backward, AdamW on every parameter",
            tolerance: Tolerance { rtol: 1e-3, atol: 1e-3, abs: 2.0 * crate::transformer::LR, row_cosine: 0.0 },
            tolerance_note: "AdamW's first step is lr * g / (|g| + eps): a gradient within rounding of 0 may flip its \
                             sign, moving that parameter by up to 2 lr (6e-4) whatever the tensor's scale",
            floor_bytes: None,
            modes: BF16_MODES,
            low_precision: Tolerance::BF16,
            build: crate::transformer::build_gpt_train_step,
        },
        WorkloadSpec {
            id: "W10c",
            name: "gpt_train_step_remat",
            what: "W10 with both blocks in autodiff::checkpoint: the backward recomputes them (peak memory vs W10)",
            tolerance: Tolerance { rtol: 2e-3, atol: 2e-3, abs: 2.0 * crate::transformer::LR, row_cosine: 0.0 },
            tolerance_note: "W10's, doubled: the recomputed blocks' gradients reach the shared parameters in another \
                             order, and AdamW's first step is about lr * sign(g), so a gradient near 0 may flip",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: crate::transformer::build_gpt_train_step_remat,
        },
        WorkloadSpec {
            id: "W11",
            name: "conv_block",
            what: "NCHW x [32, 32, 32, 32]: 3x3 conv 32 -> 64 pad 1 + bias, relu, 2x2 max pool; forward",
            tolerance: Tolerance { rtol: 1e-5, atol: 1e-5, abs: 0.0, row_cosine: 0.0 },
            tolerance_note: "exact ops, but sums of 288 products in another order than the reference loops",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: crate::cnn::build_conv_block,
        },
        WorkloadSpec {
            id: "W12",
            name: "cnn_train_step",
            what: "x [64, 1, 28, 28]: two 5x5 conv + bias, relu, 2x2 max pool blocks (16, 32), dense 1568 -> 10, \
                   softmax cross-entropy, backward, SGD (lr 0.01)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp/log in the loss; gradients summed over 50,176 pixels in another order",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: crate::cnn::build_cnn_train_step,
        },
        WorkloadSpec {
            id: "W13",
            name: "per_example_grads",
            what: "vmap(grad) of W5's MLP + softmax cross-entropy over 128 examples: [128, ..] per parameter (343 MB)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp/log in the loss; products summed in another order",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: crate::per_example::build_per_example_grads,
        },
        WorkloadSpec {
            id: "W13b",
            name: "per_example_grad_norms",
            what: "W13 returning only each example's gradient norm [128] (the DP-SGD case; weights' per-example \
                   gradients never built)",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "exp/log in the loss; norms factored as ||x|| ||g|| sum in another order",
            floor_bytes: None,
            modes: STANDARD_MODES,
            low_precision: Tolerance::BF16,
            build: crate::per_example::build_per_example_grad_norms,
        },
        WorkloadSpec {
            id: "W15",
            name: "minilm",
            what: "all-MiniLM-L6-v2 sentence embeddings, native BERT: 32 sequences of 32..128 tokens (padded to \
                   128), mean pooling, L2 norm -> [32, 384]; rows grouped by length",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "erf in GELU, exp in the attention, rsqrt in 13 layer norms; unit-vector outputs",
            floor_bytes: None,
            modes: LOW_PRECISION_MODES,
            low_precision: Tolerance::EMBEDDINGS,
            build: crate::minilm::build_minilm,
        },
    ]
}

/// The real-model workloads (ONNX files): run only when a filter names
/// them (`--filter W14`, `resnet50`, `minilm_onnx`, or `models` for all
/// three), as `bench_peers.py` runs W14/W15 only when named.
pub const MODEL_WORKLOADS: [&str; 3] = ["minilm_onnx", "resnet50", "resnet50_b8"];

/// The workloads whose name contains `filter` (ASCII case-insensitive) or
/// whose id is `filter` (`W3`); with `None` all but [`MODEL_WORKLOADS`],
/// with `models` those.
pub fn selected(filter: Option<&str>) -> Vec<WorkloadSpec> {
    all()
        .into_iter()
        .filter(|w| match filter {
            None => !MODEL_WORKLOADS.contains(&w.name),
            Some("models") => MODEL_WORKLOADS.contains(&w.name),
            Some(f) => {
                let f = f.to_ascii_lowercase();
                w.name.contains(&f) || w.id.eq_ignore_ascii_case(&f)
            }
        })
        .collect()
}

// ---- W1 -------------------------------------------------------------------

/// W1's closure.
pub fn small_ops(x: Tensor) -> Tensor {
    let mut x = x;
    for _ in 0..50 {
        x = x * 1.0001 + 0.001;
    }
    x
}

fn build_small_ops() -> Body {
    Body::Runnable(Box::new(Case::new("small_ops", Tensor::randn(&[16], 1), small_ops)))
}

// ---- W2 -------------------------------------------------------------------

/// W2's closure: `0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3)))`.
pub fn gelu(x: Tensor) -> Tensor {
    let inner = (&x + 0.044715 * (&x * &x * &x)) * 0.7978845608;
    0.5 * &x * (inner.tanh() + 1.0)
}

fn build_gelu() -> Body {
    Body::Runnable(Box::new(Case::new("gelu", Tensor::randn(&[1_048_576], 2), gelu)))
}

// ---- W3 -------------------------------------------------------------------

/// W3's closure: a stable softmax over the last axis.
pub fn softmax(x: Tensor) -> Tensor {
    let m = x.max(&[-1], true);
    let e = (&x - &m).exp();
    let s = e.sum(&[-1], true);
    &e / &s
}

fn build_softmax() -> Body {
    Body::Runnable(Box::new(Case::new("softmax", Tensor::randn(&[1024, 1024], 3), softmax)))
}

// ---- W4 -------------------------------------------------------------------

/// W4's closure: layer norm over the last axis, eps 1e-5.
pub fn layernorm((x, gamma, beta): (Tensor, Tensor, Tensor)) -> Tensor {
    let mean = x.mean(&[-1], true);
    let xc = &x - &mean;
    let var = (&xc * &xc).mean(&[-1], true);
    &xc * (var + 1e-5).rsqrt() * &gamma + &beta
}

fn build_layernorm() -> Body {
    let x = Tensor::randn(&[1024, 1024], 4);
    let gamma = Tensor::rand_uniform(&[1024], 0.5, 1.5, 41);
    let beta = Tensor::randn(&[1024], 42) * 0.1;
    Body::Runnable(Box::new(Case::new("layernorm", (x, gamma, beta), layernorm)))
}

// ---- W5 -------------------------------------------------------------------

/// W5's arguments: x [64, 784], then (w, b) of each layer.
pub type MlpArgs = (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor);

/// W5's closure: three dense layers, relu between them.
pub fn mlp_forward((x, w1, b1, w2, b2, w3, b3): MlpArgs) -> Tensor {
    let h1 = (x.matmul(&w1) + &b1).relu();
    let h2 = (h1.matmul(&w2) + &b2).relu();
    h2.matmul(&w3) + &b3
}

/// A dense layer's weight [fan_in, fan_out] scaled by 1/sqrt(fan_in), and its
/// bias [fan_out], from `seed`.
/// W5/W6's input `x [64, 784]` (U(0, 1)) and weights, `bench_peers.py`'s
/// `mlp_x` and `mlp_p`: the same numbers as the peers', so that the
/// reduced-precision modes' errors compare like with like (a quantized
/// product's error depends on its inputs' signs and spread).
fn mlp_data() -> (Tensor, [Tensor; 6]) {
    let p = crate::per_example::mlp_params();
    let x = crate::transformer::gen(7, &[64, 784], 0.0, 1.0);
    (x, p.try_into().expect("six parameters"))
}

fn build_mlp_forward() -> Body {
    let (x, [w1, b1, w2, b2, w3, b3]) = mlp_data();
    Body::Runnable(Box::new(Case::new("mlp_forward", (x, w1, b1, w2, b2, w3, b3), mlp_forward)))
}

// ---- W6 -------------------------------------------------------------------

/// W6's arguments: x `[64, 784]`, integer labels `[64]`, then W5's weights.
pub type TrainArgs = (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor);

/// W6's closure: W5's forward, softmax cross-entropy on integer labels, the
/// backward pass through a tape, and SGD (lr 0.01). It is a pure function,
/// as JAX writes train steps: it returns the loss and the updated weights
/// (the harness calls it many times on the same inputs and compares modes).
pub fn mlp_train_step((x, labels, w1, b1, w2, b2, w3, b3): TrainArgs) -> Vec<Tensor> {
    let params = [w1, b1, w2, b2, w3, b3];
    let tape = tracejit::GradientTape::new();
    for p in &params {
        tape.watch(p);
    }
    let [w1, b1, w2, b2, w3, b3] = params.clone();
    let logits = mlp_forward((x, w1, b1, w2, b2, w3, b3));
    let onehot = labels.one_hot(10, logits.dtype());
    let loss = tracejit::nn::softmax_cross_entropy_with_logits(&logits, &onehot).mean(&[0], false);
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = tape.gradient(&loss, refs.as_slice()).expect("every weight is differentiable");
    let mut out = vec![loss];
    for (p, g) in params.iter().zip(grads) {
        out.push(p - g.expect("every weight reaches the loss") * 0.01);
    }
    out
}

fn build_mlp_train_step() -> Body {
    let (x, [w1, b1, w2, b2, w3, b3]) = mlp_data();
    // `mlp_y`.
    let labels = crate::transformer::gen_labels(14, 64, 10);
    Body::Runnable(Box::new(Case::new("mlp_train_step", (x, labels, w1, b1, w2, b2, w3, b3), mlp_train_step)))
}

// ---- W7 -------------------------------------------------------------------

/// Where W7's LSTM cell comes from, for the report. Update with [`lstm_cell`].
pub const LSTM_CELL_IMPL: &str = "the composite tracejit::nn::lstm_cell (`tracejit.nn.lstm_cell`)";

/// THE switch for W7's LSTM cell: the `tracejit::nn::lstm_cell` composite.
/// [`lstm_cell_primitives`] is the same cell written with primitives in the
/// harness (switch to it, and update [`LSTM_CELL_IMPL`], to measure without
/// the composite).
pub fn lstm_cell(x: &Tensor, h: &Tensor, c: &Tensor, w_ih: &Tensor, w_hh: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    tracejit::nn::lstm_cell(x, h, c, w_ih, w_hh, b)
}

/// An LSTM cell from primitives (the harness's own, to cross-check the
/// composite): gates `x @ w_ih + h @ w_hh + b` of
/// `[batch, 4 * hidden]` in the order i, f, g, o; `c' = f * c + i * g`,
/// `h' = o * tanh(c')`. Returns `(h', c')`.
pub fn lstm_cell_primitives(
    x: &Tensor,
    h: &Tensor,
    c: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b: &Tensor,
) -> (Tensor, Tensor) {
    let hidden = h.dims()[1].expect("lstm_cell: the hidden size must be known") as i64;
    let gates = x.matmul(w_ih) + h.matmul(w_hh) + b;
    let i = gates.slice_axis(1, 0, hidden).sigmoid();
    let f = gates.slice_axis(1, hidden, 2 * hidden).sigmoid();
    let g = gates.slice_axis(1, 2 * hidden, 3 * hidden).tanh();
    let o = gates.slice_axis(1, 3 * hidden, 4 * hidden).sigmoid();
    let c_next = f * c + i * g;
    let h_next = o * c_next.tanh();
    (h_next, c_next)
}

/// W7's arguments: x `[64, 256]`, h `[64, 256]`, c `[64, 256]`, w_ih
/// `[256, 1024]`, w_hh `[256, 1024]`, b `[1024]`.
pub type LstmArgs = (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor);

/// W7's closure.
pub fn lstm_step((x, h, c, w_ih, w_hh, b): LstmArgs) -> (Tensor, Tensor) {
    lstm_cell(&x, &h, &c, &w_ih, &w_hh, &b)
}

fn build_lstm_cell() -> Body {
    let x = Tensor::randn(&[64, 256], 7);
    let h = Tensor::randn(&[64, 256], 71) * 0.5;
    let c = Tensor::randn(&[64, 256], 72) * 0.5;
    let w_ih = Tensor::randn(&[256, 1024], 73) * (1.0 / 16.0);
    let w_hh = Tensor::randn(&[256, 1024], 74) * (1.0 / 16.0);
    let b = Tensor::randn(&[1024], 75) * 0.1;
    Body::Runnable(Box::new(Case::new("lstm_cell", (x, h, c, w_ih, w_hh, b), lstm_step)))
}

// ---- W8 -------------------------------------------------------------------

/// W8's arguments: x `[32, 32, 64]` (steps, batch, features), wx
/// `[64, 128]`, wh `[128, 128]`, b `[128]`.
pub type RnnArgs = (Tensor, Tensor, Tensor, Tensor);

/// W8's closure: a loop with a static trip count (JAX's `lax.fori_loop`);
/// traced, one `while` node whose body is compiled once, not 32 unrolled
/// copies.
pub fn rnn_loop((xs, wx, wh, b): RnnArgs) -> Tensor {
    let [steps, batch, hidden] =
        [xs.dims()[0], xs.dims()[1], wh.dims()[1]].map(|d| d.expect("rnn_loop: the sizes must be known"));
    let h0 = Tensor::zeros(&[batch, hidden], xs.dtype());
    tracejit::fori_loop(0, steps as i64, |t, h: Tensor| (xs.gather(&t, 0).matmul(&wx) + h.matmul(&wh) + &b).tanh(), h0)
}

fn build_rnn_loop() -> Body {
    let xs = Tensor::randn(&[32, 32, 64], 30);
    let wx = Tensor::randn(&[64, 128], 31) * (1.0 / 8.0);
    let wh = Tensor::randn(&[128, 128], 32) * (1.0 / 12.0);
    let b = Tensor::randn(&[128], 33) * 0.1;
    Body::Runnable(Box::new(Case::new("rnn_loop", (xs, wx, wh, b), rnn_loop)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_workloads_md() {
        let names: Vec<&str> = all().iter().map(|w| w.name).collect();
        assert_eq!(
            names[..16],
            [
                "small_ops",
                "gelu",
                "softmax",
                "layernorm",
                "mlp_forward",
                "mlp_train_step",
                "lstm_cell",
                "rnn_loop",
                "transformer_block",
                "gpt_train_step",
                "gpt_train_step_remat",
                "conv_block",
                "cnn_train_step",
                "per_example_grads",
                "per_example_grad_norms",
                "minilm"
            ]
        );
        assert_eq!(names[16..19], ["minilm_onnx", "resnet50", "resnet50_b8"], "then the real-model rows");
        assert_eq!(names[19..], ["layernorm_backward", "layernorm_backward_body"], "then the micro rows");
        assert_eq!(selected(Some("gelu")).len(), 1);
        // The real-model rows run only when named.
        let names_of = |f: Option<&str>| selected(f).iter().map(|w| w.name).collect::<Vec<_>>();
        assert!(!names_of(None).iter().any(|n| MODEL_WORKLOADS.contains(n)));
        assert_eq!(names_of(None).len(), names.len() - MODEL_WORKLOADS.len());
        assert_eq!(names_of(Some("models")), MODEL_WORKLOADS);
        assert_eq!(names_of(Some("W14")), ["resnet50"]);
        assert_eq!(names_of(Some("w14b")), ["resnet50_b8"]);
        assert_eq!(names_of(Some("minilm")), ["minilm", "minilm_onnx"]);
        assert_eq!(selected(Some("w7"))[0].name, "lstm_cell");
        assert_eq!(selected(Some("mlp")).len(), 2);
    }

    #[test]
    fn closures_compute_what_they_say_on_small_inputs() {
        let x = Tensor::from_vec(vec![0.0f32, 1.0, -1.0], &[3]);
        let g = gelu(x).to_vec::<f32>().unwrap();
        assert!((g[0]).abs() < 1e-7 && (g[1] - 0.841192).abs() < 1e-5 && (g[2] + 0.158808).abs() < 1e-5, "{g:?}");

        let s = softmax(Tensor::from_vec(vec![1.0f32, 1.0, 2.0, 2.0], &[2, 2])).to_vec::<f32>().unwrap();
        assert_eq!(s, vec![0.5; 4]);

        let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 2]);
        let ln = layernorm((x, Tensor::ones(&[2], tracejit::DType::F32), Tensor::zeros(&[2], tracejit::DType::F32)));
        let ln = ln.to_vec::<f32>().unwrap();
        assert!((ln[0] + 1.0).abs() < 1e-4 && (ln[1] - 1.0).abs() < 1e-4, "{ln:?}");
    }

    #[test]
    fn the_composite_lstm_cell_matches_the_primitive_one() {
        let x = Tensor::randn(&[4, 8], 1);
        let h = Tensor::randn(&[4, 6], 2);
        let c = Tensor::randn(&[4, 6], 3);
        let w_ih = Tensor::randn(&[8, 24], 4) * 0.3;
        let w_hh = Tensor::randn(&[6, 24], 5) * 0.3;
        let b = Tensor::randn(&[24], 6) * 0.1;
        let (h1, c1) = lstm_cell(&x, &h, &c, &w_ih, &w_hh, &b);
        let (h2, c2) = lstm_cell_primitives(&x, &h, &c, &w_ih, &w_hh, &b);
        for (a, b) in [(h1, h2), (c1, c2)] {
            let want = crate::verify::OutputValues::from_tensors(&[b]).unwrap();
            crate::verify::check_tensors(&want, &[a], Tolerance::TRANSCENDENTAL).unwrap();
        }
    }

    #[test]
    fn lstm_gate_order_is_i_f_g_o() {
        // hidden 1, x = h = 0: gates are b. i = sig(b0), f = sig(b1), g = tanh(b2), o = sig(b3).
        let z = Tensor::zeros(&[1, 1], tracejit::DType::F32);
        let w = Tensor::zeros(&[1, 4], tracejit::DType::F32);
        let b = Tensor::from_vec(vec![0.5f32, -0.5, 0.25, 1.0], &[4]);
        let c = Tensor::from_vec(vec![2.0f32], &[1, 1]);
        let (h1, c1) = lstm_cell(&z, &z, &c, &w, &w, &b);
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let want_c = sig(-0.5) * 2.0 + sig(0.5) * 0.25f32.tanh();
        let want_h = sig(1.0) * want_c.tanh();
        assert!((c1.to_vec::<f32>().unwrap()[0] - want_c).abs() < 1e-6);
        assert!((h1.to_vec::<f32>().unwrap()[0] - want_h).abs() < 1e-6);
    }
}
