//! `Attention` against a reference in f64 loops written from ONNX's
//! operator spec and reference implementation: 3-D and 4-D layouts,
//! grouped-query heads, the KV cache, causality aligned after the cache,
//! bool, additive and short (padded) masks, `nonpad_kv_seqlen`, softcap,
//! scale, `qk_matmul_output` in each mode, rows that see no key (NaN, as
//! the reference's softmax over nothing but -inf) and NaN/Inf queries.
//! Each run asserts that the JIT ran the model, and which path it took:
//! the flash-attention kernel (any mask), or the materialized composition
//! when a softcap or the scores are asked for.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

const EPS: f64 = f32::EPSILON as f64;

#[derive(Clone, Copy, Debug, PartialEq)]
enum MaskKind {
    None,
    /// `[Tq, T]` bool, row 0 all false when the seed says so.
    Bool,
    /// `[batch, 1, Tq, T]` floats with some -inf.
    Float,
    /// `[1, q_heads, Tq, T - 1]` floats: padded with -inf to T.
    Short,
}

#[derive(Clone, Debug)]
struct Case {
    three_d: bool,
    b: usize,
    kvh: usize,
    group: usize,
    tq: usize,
    tk: usize,
    past: usize,
    d: usize,
    dv: usize,
    mask: MaskKind,
    causal: bool,
    softcap: Option<f32>,
    scale: Option<f32>,
    mode: Option<i64>,
    nonpad: bool,
    specials: bool,
    seed: u64,
}

impl Case {
    fn qh(&self) -> usize {
        self.kvh * self.group
    }
    fn total(&self) -> usize {
        self.past + self.tk
    }
    /// Whether the importer should run the flash kernel.
    fn fused(&self) -> bool {
        self.mode.is_none() && self.softcap.is_none()
    }
}

fn case() -> impl Strategy<Value = Case> {
    let shape = (any::<bool>(), 1usize..3, 1usize..3, 1usize..4, 1usize..6, 1usize..6, 0usize..4);
    let widths = (prop::sample::select(vec![1usize, 3, 8]), prop::sample::select(vec![1usize, 4, 5]));
    let mask = prop::sample::select(vec![MaskKind::None, MaskKind::Bool, MaskKind::Float, MaskKind::Short]);
    let options = (
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![0.5f32, 3.0])),
        prop::option::of(prop::sample::select(vec![0.01f32, 0.3])),
        prop::option::of(0i64..4),
        any::<bool>(),
        prop::bool::weighted(0.3),
    );
    (shape, widths, mask, options, 0u64..10_000).prop_map(
        |(
            (three_d, b, kvh, group, tq, tk, past),
            (d, dv),
            mask,
            (causal, softcap, scale, mode, nonpad, specials),
            seed,
        )| {
            let mask = if mask == MaskKind::Short && past + tk < 2 { MaskKind::Float } else { mask };
            // nonpad_kv_seqlen is for caches kept outside the op: not with past/present.
            Case {
                three_d,
                b,
                kvh,
                group,
                tq,
                tk,
                past,
                d,
                dv,
                mask,
                causal,
                softcap,
                scale,
                mode,
                nonpad: nonpad && past == 0,
                specials,
                seed,
            }
        },
    )
}

/// Values of a `[b, h, t, w]` tensor, flat.
struct Four {
    v: Vec<f32>,
    dims: [usize; 4],
}

impl Four {
    fn new(dims: [usize; 4], seed: u64) -> Four {
        Four { v: Tensor::randn(&dims, seed).to_vec::<f32>().unwrap(), dims }
    }
    fn at(&self, b: usize, h: usize, t: usize, w: usize) -> f64 {
        let [_, hs, ts, ws] = self.dims;
        self.v[((b * hs + h) * ts + t) * ws + w] as f64
    }
    fn tensor(&self) -> Tensor {
        Tensor::from_vec(self.v.clone(), &self.dims)
    }
    /// `[b, t, h · w]`, ONNX's 3-D layout of the same values.
    fn three_d(&self) -> Tensor {
        let [bs, hs, ts, ws] = self.dims;
        let mut out = Vec::with_capacity(self.v.len());
        for b in 0..bs {
            for t in 0..ts {
                for h in 0..hs {
                    out.extend((0..ws).map(|w| self.at(b, h, t, w) as f32));
                }
            }
        }
        Tensor::from_vec(out, &[bs, ts, hs * ws])
    }
}

/// The inputs of one case, in f32, as the reference reads them.
struct Inputs {
    q: Four,
    k: Four,
    v: Four,
    past_k: Four,
    past_v: Four,
    /// The mask as given, and its value at `[b, h, i, j]` as bias (0 / -inf
    /// for bool), `j` past its end: -inf.
    mask: Option<(Tensor, Vec<f64>, [usize; 4])>,
    nonpad: Vec<i64>,
}

fn inputs(c: &Case) -> Inputs {
    let s = c.seed;
    let mut q = Four::new([c.b, c.qh(), c.tq, c.d], s);
    if c.specials {
        let n = q.v.len();
        q.v[s as usize % n] = f32::NAN;
        q.v[(s as usize + 1) % n] = f32::INFINITY;
    }
    let (k, v) = (Four::new([c.b, c.kvh, c.tk, c.d], s + 1), Four::new([c.b, c.kvh, c.tk, c.dv], s + 2));
    let (past_k, past_v) = (Four::new([c.b, c.kvh, c.past, c.d], s + 3), Four::new([c.b, c.kvh, c.past, c.dv], s + 4));
    let t = c.total();
    let u = Tensor::rand_uniform(&[c.b * c.qh() * c.tq * t], 0.0, 1.0, s + 5).to_vec::<f32>().unwrap();
    let g = Tensor::randn(&[c.b * c.qh() * c.tq * t], s + 6).to_vec::<f32>().unwrap();
    let mask = match c.mask {
        MaskKind::None => None,
        MaskKind::Bool => {
            let blank_row = s.is_multiple_of(3);
            let m: Vec<bool> = (0..c.tq * t).map(|i| u[i] > 0.3 && !(blank_row && i < t)).collect();
            let bias = m.iter().map(|&a| if a { 0.0 } else { f64::NEG_INFINITY }).collect();
            Some((Tensor::from_vec(m, &[c.tq, t]), bias, [1, 1, c.tq, t]))
        }
        MaskKind::Float => {
            let m: Vec<f32> = (0..c.b * c.tq * t).map(|i| if u[i] < 0.2 { f32::NEG_INFINITY } else { g[i] }).collect();
            let bias = m.iter().map(|&x| x as f64).collect();
            Some((Tensor::from_vec(m, &[c.b, 1, c.tq, t]), bias, [c.b, 1, c.tq, t]))
        }
        MaskKind::Short => {
            let n = c.qh() * c.tq * (t - 1);
            let m: Vec<f32> = g[..n].to_vec();
            let bias = m.iter().map(|&x| x as f64).collect();
            Some((Tensor::from_vec(m, &[1, c.qh(), c.tq, t - 1]), bias, [1, c.qh(), c.tq, t - 1]))
        }
    };
    let nonpad = (0..c.b).map(|b| ((s as usize + 3 * b) % (t + 1)) as i64).collect();
    Inputs { q, k, v, past_k, past_v, mask, nonpad }
}

/// The serialized model and its runtime inputs.
fn build(c: &Case, x: &Inputs) -> (Vec<u8>, Vec<Tensor>) {
    let f32v = |name: &str, t: &Tensor| fixed(name, DType::F32, t.shape());
    let lay = |f: &Four| if c.three_d { f.three_d() } else { f.tensor() };
    let mut feeds = vec![("Q", lay(&x.q)), ("K", lay(&x.k)), ("V", lay(&x.v))];
    let mut names = vec!["Q", "K", "V", "", "", "", ""];
    if let Some((m, ..)) = &x.mask {
        feeds.push(("attn_mask", m.clone()));
        names[3] = "attn_mask";
    }
    let mut outputs = vec!["Y"];
    if c.past > 0 {
        feeds.push(("past_key", x.past_k.tensor()));
        feeds.push(("past_value", x.past_v.tensor()));
        names[4] = "past_key";
        names[5] = "past_value";
        outputs.extend(["present_key", "present_value"]);
    }
    if c.nonpad {
        feeds.push(("nonpad_kv_seqlen", Tensor::from_vec(x.nonpad.clone(), &[c.b])));
        names[6] = "nonpad_kv_seqlen";
    }
    if c.mode.is_some() {
        outputs.resize(3, "");
        outputs.push("qk");
    }
    while names.last() == Some(&"") {
        names.pop();
    }
    let mut attrs = vec![attr_i("is_causal", c.causal as i64)];
    if c.three_d {
        attrs.extend([attr_i("q_num_heads", c.qh() as i64), attr_i("kv_num_heads", c.kvh as i64)]);
    }
    attrs.extend(c.softcap.map(|v| attr_f("softcap", v)));
    attrs.extend(c.scale.map(|v| attr_f("scale", v)));
    attrs.extend(c.mode.map(|m| attr_i("qk_matmul_output_mode", m)));
    let value_infos = feeds
        .iter()
        .map(|(n, t)| if t.dtype() == DType::F32 { f32v(n, t) } else { fixed(n, t.dtype(), t.shape()) })
        .collect();
    let outs = outputs
        .iter()
        .filter(|o| !o.is_empty())
        .map(|o| value(o, elem(DType::F32), &[None; 4][..if *o == "Y" && c.three_d { 3 } else { 4 }]))
        .collect();
    let bytes = model(vec![node("Attention", "attn", &names, &outputs, attrs)], value_infos, outs, vec![], 24);
    (bytes, feeds.into_iter().map(|(_, t)| t).collect())
}

/// One row of the reference: the four qk stages and `p`, each with its
/// error bound, and `y` with its bound.
struct Row {
    stages: [Vec<(f64, f64)>; 4],
    y: Vec<(f64, f64)>,
}

/// Row `(b, h, i)` in f64. Bounds: a score is a d-term dot product of
/// values each scaled by `√scale` (rounded), so its error is at most
/// `(d + 4)·ε·scale·Σ|q·k|`; softcap's tanh has derivative ≤ 1 and adds
/// a few roundings; the bias add one more. Softmax turns an absolute
/// score error δ into a relative probability error of 2δ, plus the
/// roundings of `x − max` (ε·|x − max|), exp and the T-term sum; `y` adds
/// its T-term sum. The first-order bound is doubled for the second-order
/// terms and exp's few ulps.
fn reference_row(c: &Case, x: &Inputs, b: usize, h: usize, i: usize) -> Row {
    let t = c.total();
    let scale = c.scale.map_or(1.0 / (c.d as f64).sqrt(), |s| s as f64);
    let kvh = h / c.group;
    let key = |j: usize, w: usize| if j < c.past { x.past_k.at(b, kvh, j, w) } else { x.k.at(b, kvh, j - c.past, w) };
    let val = |j: usize, w: usize| if j < c.past { x.past_v.at(b, kvh, j, w) } else { x.v.at(b, kvh, j - c.past, w) };
    let (mut raw, mut capped, mut biased) = (vec![], vec![], vec![]);
    for j in 0..t {
        let (dot, mag): (f64, f64) = (0..c.d).fold((0.0, 0.0), |(s, m), w| {
            let p = x.q.at(b, h, i, w) * key(j, w);
            (s + p, m + p.abs())
        });
        let r = scale * dot;
        let err = (c.d + 4) as f64 * EPS * scale * mag;
        raw.push((r, err));
        let cap = match c.softcap {
            Some(cap) => {
                let cap = cap as f64;
                let v = cap * (r / cap).tanh();
                (v, err + 4.0 * EPS * v.abs())
            }
            None => (r, err),
        };
        capped.push(cap);
        let mut bias = 0.0;
        if let Some((_, m, [mb, mh, _, mt])) = &x.mask {
            let at = ((if *mb == 1 { 0 } else { b }) * mh + if *mh == 1 { 0 } else { h }) * c.tq + i;
            bias += if j < *mt { m[at * mt + j] } else { f64::NEG_INFINITY };
        }
        if c.causal && j > i + c.past {
            bias += f64::NEG_INFINITY;
        }
        if c.nonpad && j as i64 >= x.nonpad[b] {
            bias += f64::NEG_INFINITY;
        }
        let v = cap.0 + bias;
        biased.push((v, cap.1 + EPS * v.abs()));
    }
    let m =
        biased.iter().fold(f64::NEG_INFINITY, |m, &(v, _)| if v.is_nan() || m.is_nan() { f64::NAN } else { m.max(v) });
    let e: Vec<f64> = biased.iter().map(|&(v, _)| (v - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let delta = biased.iter().filter(|(v, _)| v.is_finite()).fold(0.0f64, |a, &(_, e)| a.max(e));
    let p: Vec<(f64, f64)> = biased
        .iter()
        .zip(&e)
        .map(|(&(v, _), &ej)| {
            let pj = ej / z;
            let rel = 2.0 * delta + EPS * ((v - m).abs() + t as f64 + 8.0);
            (pj, 2.0 * rel * pj + 1e-30)
        })
        .collect();
    let y = (0..c.dv)
        .map(|w| {
            let want: f64 = (0..t).map(|j| p[j].0 * val(j, w)).sum();
            let mag: f64 = (0..t).map(|j| p[j].0 * val(j, w).abs()).sum();
            let err: f64 = (0..t).map(|j| p[j].1 * val(j, w).abs()).sum::<f64>() + 2.0 * (t + 2) as f64 * EPS * mag;
            (want, err + 1e-30)
        })
        .collect();
    Row { stages: [raw, capped, biased, p], y }
}

fn check(what: &str, got: f32, (want, bound): (f64, f64)) -> Result<(), TestCaseError> {
    let g = got as f64;
    let ok = if want.is_nan() {
        g.is_nan()
    } else if want.is_infinite() {
        g == want
    } else {
        !bound.is_finite() || (g - want).abs() <= bound
    };
    prop_assert!(ok, "{what}: {got}, want {want} (bound {bound})");
    Ok(())
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let x = inputs(c);
    let (bytes, feeds) = build(c, &x);
    let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let outs = model.run(&feeds).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let graph = cf.optimized_graph().to_string();
    let kernel = graph.contains("kernel[\"tracejit.nn.scaled_dot_product_attention\"]");
    prop_assert_eq!(kernel, c.fused(), "fused path expected: {}\n{}", c.fused(), graph);

    let (qh, tq) = (c.qh(), c.tq);
    let y = outs[0].to_vec::<f32>().unwrap();
    let want_shape: Vec<usize> = if c.three_d { vec![c.b, tq, qh * c.dv] } else { vec![c.b, qh, tq, c.dv] };
    prop_assert_eq!(outs[0].shape(), &want_shape[..]);
    let qk = c.mode.map(|_| outs.last().unwrap().to_vec::<f32>().unwrap());
    for b in 0..c.b {
        for h in 0..qh {
            for i in 0..tq {
                let row = reference_row(c, &x, b, h, i);
                for (w, &want) in row.y.iter().enumerate() {
                    let at = if c.three_d {
                        (b * tq + i) * qh * c.dv + h * c.dv + w
                    } else {
                        ((b * qh + h) * tq + i) * c.dv + w
                    };
                    check(&format!("Y[{b},{h},{i},{w}]"), y[at], want)?;
                }
                if let (Some(mode), Some(qk)) = (c.mode, &qk) {
                    for (j, &want) in row.stages[mode as usize].iter().enumerate() {
                        let t = c.total();
                        check(
                            &format!("qk (mode {mode})[{b},{h},{i},{j}]"),
                            qk[((b * qh + h) * tq + i) * t + j],
                            want,
                        )?;
                    }
                }
            }
        }
    }
    if c.past > 0 {
        for (out, past, new) in [(&outs[1], &x.past_k, &x.k), (&outs[2], &x.past_v, &x.v)] {
            let want = Tensor::concat(&[past.tensor(), new.tensor()], 2);
            prop_assert_eq!(out.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn attention_matches_the_spec_in_f64(c in case()) {
        run_case(&c)?;
    }
}

/// The cases that pin what the random ones may miss: causality after a
/// cache with more queries than new keys (the kernel's bottom-right rule
/// would differ), grouped heads with a per-head mask, a row that sees
/// nothing through the fused path, causality with a float mask on the
/// fused path (folded into the mask as -inf), and causality on the
/// composed path (the scores asked for, a softcap) where the kernel's rule
/// would fit.
#[test]
fn pinned_cases() {
    let base = Case {
        three_d: false,
        b: 1,
        kvh: 2,
        group: 2,
        tq: 4,
        tk: 2,
        past: 3,
        d: 3,
        dv: 4,
        mask: MaskKind::None,
        causal: true,
        softcap: None,
        scale: None,
        mode: None,
        nonpad: false,
        specials: false,
        seed: 1,
    };
    run_case(&base).unwrap();
    run_case(&Case { tq: 2, ..base.clone() }).unwrap();
    run_case(&Case { mask: MaskKind::Short, causal: false, three_d: true, ..base.clone() }).unwrap();
    run_case(&Case { mask: MaskKind::Bool, causal: false, past: 0, seed: 3, ..base.clone() }).unwrap();
    run_case(&Case { nonpad: true, past: 0, causal: false, seed: 0, ..base.clone() }).unwrap();
    run_case(&Case { tq: 3, tk: 3, past: 0, mask: MaskKind::Float, ..base.clone() }).unwrap();
    run_case(&Case { tq: 3, tk: 3, past: 0, mask: MaskKind::Float, mode: Some(2), ..base.clone() }).unwrap();
    run_case(&Case { tq: 3, tk: 3, past: 0, softcap: Some(0.5), ..base }).unwrap();
}
