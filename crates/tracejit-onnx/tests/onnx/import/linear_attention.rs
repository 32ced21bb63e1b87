//! `LinearAttention` against the recurrence in f64 loops, for the four
//! update rules, grouped and multi-query heads, per-head and per-channel
//! decay, per-head and shared beta, with and without `past_state`, an
//! explicit or default scale. Inputs are as the spec expects them (keys
//! L2-normalized for the delta rules, beta in (0, 1), decay ≤ 0 in log
//! space). Bound: every step rounds each state entry, retrieved value and
//! output (sums of at most `d_k` or `d_v` terms), and earlier errors travel
//! through the same maps, bounded by the magnitudes the reference tracks
//! alongside (`|S|`, `|v|`, `|o|` with every term's absolute value), so the
//! error after step t is at most (t + 1)·(d_k + d_v + 8)·ε of them. Each run
//! asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

const EPS: f64 = f32::EPSILON as f64;

#[derive(Clone, Debug)]
struct Case {
    rule: &'static str,
    b: usize,
    t: usize,
    kvh: usize,
    group: usize,
    dk: usize,
    dv: usize,
    per_channel_decay: bool,
    shared_beta: bool,
    past: bool,
    scale: Option<f32>,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec!["linear", "gated", "delta", "gated_delta"]),
        (1usize..3, 1usize..6, 1usize..3, 1usize..4, 1usize..5, 1usize..5),
        (any::<bool>(), any::<bool>(), any::<bool>(), prop::option::of(Just(0.3f32))),
        0u64..10_000,
    )
        .prop_map(|(rule, (b, t, kvh, group, dk, dv), (per_channel_decay, shared_beta, past, scale), seed)| Case {
            rule,
            b,
            t,
            kvh,
            group,
            dk,
            dv,
            per_channel_decay,
            shared_beta,
            past,
            scale,
            seed,
        })
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    Tensor::randn(&[n], seed).to_vec::<f32>().unwrap()
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let (b, t, kvh, qh, dk, dv) = (c.b, c.t, c.kvh, c.kvh * c.group, c.dk, c.dv);
    let gating = c.rule.starts_with("gated");
    let delta = c.rule.ends_with("delta");
    let q = vals(b * t * qh * dk, c.seed);
    let mut k = vals(b * t * kvh * dk, c.seed + 1);
    if delta {
        for key in k.chunks_mut(dk) {
            let norm = key.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-3);
            key.iter_mut().for_each(|x| *x /= norm);
        }
    }
    let v = vals(b * t * kvh * dv, c.seed + 2);
    let decay_last = if c.per_channel_decay { kvh * dk } else { kvh };
    let decay: Vec<f32> = vals(b * t * decay_last, c.seed + 3).iter().map(|x| -(x.exp().ln_1p())).collect();
    let beta_last = if c.shared_beta { 1 } else { kvh };
    let beta: Vec<f32> = vals(b * t * beta_last, c.seed + 4).iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
    let past = vals(b * kvh * dk * dv, c.seed + 5);

    let mut names = vec!["q", "k", "v", "", "", ""];
    let mut feeds = vec![
        ("q", Tensor::from_vec(q.clone(), &[b, t, qh * dk])),
        ("k", Tensor::from_vec(k.clone(), &[b, t, kvh * dk])),
        ("v", Tensor::from_vec(v.clone(), &[b, t, kvh * dv])),
    ];
    if c.past {
        names[3] = "past";
        feeds.push(("past", Tensor::from_vec(past.clone(), &[b, kvh, dk, dv])));
    }
    if gating {
        names[4] = "decay";
        feeds.push(("decay", Tensor::from_vec(decay.clone(), &[b, t, decay_last])));
    }
    if delta {
        names[5] = "beta";
        feeds.push(("beta", Tensor::from_vec(beta.clone(), &[b, t, beta_last])));
    }
    while names.last() == Some(&"") {
        names.pop();
    }
    let mut attrs =
        vec![attr_i("q_num_heads", qh as i64), attr_i("kv_num_heads", kvh as i64), attr_s("update_rule", c.rule)];
    attrs.extend(c.scale.map(|s| attr_f("scale", s)));
    let bytes = model(
        vec![node("LinearAttention", "la", &names, &["y", "state"], attrs)],
        feeds.iter().map(|(n, x)| fixed(n, DType::F32, x.shape())).collect(),
        vec![fixed("y", DType::F32, &[b, t, qh * dv]), fixed("state", DType::F32, &[b, kvh, dk, dv])],
        vec![],
        27,
    );
    let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let inputs: Vec<Tensor> = feeds.into_iter().map(|(_, x)| x).collect();
    let outs = model.run(&inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let (y, state) = (outs[0].to_vec::<f32>().unwrap(), outs[1].to_vec::<f32>().unwrap());

    let scale = c.scale.map_or(1.0 / (dk as f64).sqrt(), |s| s as f64);
    for bi in 0..b {
        for h in 0..kvh {
            // State and its magnitude bound, [dk][dv].
            let mut s = vec![vec![0.0f64; dv]; dk];
            let mut m = vec![vec![0.0f64; dv]; dk];
            if c.past {
                for d in 0..dk {
                    for e in 0..dv {
                        s[d][e] = past[((bi * kvh + h) * dk + d) * dv + e] as f64;
                        m[d][e] = s[d][e].abs();
                    }
                }
            }
            for ti in 0..t {
                let kt: Vec<f64> = (0..dk).map(|d| k[((bi * t + ti) * kvh + h) * dk + d] as f64).collect();
                let mut vt: Vec<f64> = (0..dv).map(|e| v[((bi * t + ti) * kvh + h) * dv + e] as f64).collect();
                let mut vm: Vec<f64> = vt.iter().map(|x| x.abs()).collect();
                if gating {
                    for d in 0..dk {
                        let g = if c.per_channel_decay {
                            decay[(bi * t + ti) * decay_last + h * dk + d]
                        } else {
                            decay[(bi * t + ti) * decay_last + h]
                        };
                        let f = (g as f64).exp();
                        s[d].iter_mut().for_each(|x| *x *= f);
                        m[d].iter_mut().for_each(|x| *x *= f);
                    }
                }
                if delta {
                    let bt = beta[(bi * t + ti) * beta_last + if c.shared_beta { 0 } else { h }] as f64;
                    for e in 0..dv {
                        let r: f64 = (0..dk).map(|d| s[d][e] * kt[d]).sum();
                        let rm: f64 = (0..dk).map(|d| m[d][e] * kt[d].abs()).sum();
                        vt[e] = bt * (vt[e] - r);
                        vm[e] = bt * (vm[e] + rm);
                    }
                }
                for d in 0..dk {
                    for e in 0..dv {
                        s[d][e] += kt[d] * vt[e];
                        m[d][e] += (kt[d] * vt[e]).abs().max(kt[d].abs() * vm[e]);
                    }
                }
                let steps = (ti + 1) as f64 * (dk + dv + 8) as f64 * EPS;
                for g in 0..c.group {
                    let hq = h * c.group + g;
                    for e in 0..dv {
                        let qd = |d: usize| q[((bi * t + ti) * qh + hq) * dk + d] as f64;
                        let want: f64 = scale * (0..dk).map(|d| qd(d) * s[d][e]).sum::<f64>();
                        let mag: f64 = scale.abs() * (0..dk).map(|d| qd(d).abs() * m[d][e]).sum::<f64>();
                        let got = y[((bi * t + ti) * qh + hq) * dv + e] as f64;
                        prop_assert!(
                            (got - want).abs() <= steps * mag + 1e-30,
                            "y[{bi},{ti},{hq},{e}] = {got}, want {want} (bound {})",
                            steps * mag
                        );
                    }
                }
            }
            let steps = (t + 1) as f64 * (dk + dv + 8) as f64 * EPS;
            for d in 0..dk {
                for e in 0..dv {
                    let got = state[((bi * kvh + h) * dk + d) * dv + e] as f64;
                    prop_assert!(
                        (got - s[d][e]).abs() <= steps * m[d][e] + 1e-30,
                        "state[{bi},{h},{d},{e}] = {got}, want {}",
                        s[d][e]
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn linear_attention_matches_the_recurrence_in_f64(c in case()) {
        run_case(&c)?;
    }
}

#[test]
fn a_rule_without_its_inputs_is_a_node_error_and_a_bad_rule_is_refused_at_import() {
    let build = |rule: &str, heads: (i64, i64)| {
        model(
            vec![node(
                "LinearAttention",
                "la",
                &["q", "k", "v"],
                &["y"],
                vec![attr_i("q_num_heads", heads.0), attr_i("kv_num_heads", heads.1), attr_s("update_rule", rule)],
            )],
            vec![
                fixed("q", DType::F32, &[1, 2, 4]),
                fixed("k", DType::F32, &[1, 2, 4]),
                fixed("v", DType::F32, &[1, 2, 4]),
            ],
            vec![fixed("y", DType::F32, &[1, 2, 4])],
            vec![],
            27,
        )
    };
    let x = Tensor::ones(&[1, 2, 4], DType::F32);
    let e =
        import_bytes(&build("gated", (2, 2))).unwrap().run(&[x.clone(), x.clone(), x.clone()]).unwrap_err().to_string();
    assert!(e.contains("'la'") && e.contains("needs the input decay"), "{e}");
    for (rule, heads, what) in [("fast", (2, 2), "update_rule 'fast'"), ("linear", (3, 2), "positive multiple")] {
        let e = import_bytes(&build(rule, heads)).unwrap_err().to_string();
        assert!(
            e.contains("LinearAttention") && e.contains("'la'") && e.contains("opset 27") && e.contains(what),
            "{e}"
        );
    }
    let y = import_bytes(&build("linear", (2, 2))).unwrap().run(&[x.clone(), x.clone(), x]).unwrap().remove(0);
    assert_eq!(y.shape(), [1, 2, 4]);
}
