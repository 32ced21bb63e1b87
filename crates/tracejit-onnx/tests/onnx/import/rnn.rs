//! `RNN`, `GRU` and `LSTM` against the spec's equations in f64, each value
//! carried with a bound on its f32 error (every add, product and dot
//! product adds its rounding, errors propagate through the Lipschitz
//! constants of sigmoid (1/4) and tanh (1), and each activation adds a few
//! ulps of its result): forward, reverse and bidirectional, both layouts,
//! `sequence_lens`, initial states, biases, `clip`, GRU's
//! `linear_before_reset`, LSTM's peepholes and `input_forget`. Each run
//! asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

const EPS: f64 = f32::EPSILON as f64;

/// A value and a bound on the f32 computation's distance from it.
#[derive(Clone, Copy, Debug)]
struct V {
    v: f64,
    e: f64,
}

fn exact(v: f32) -> V {
    V { v: v as f64, e: 0.0 }
}
fn add(a: V, b: V) -> V {
    let v = a.v + b.v;
    V { v, e: a.e + b.e + EPS * v.abs() }
}
fn sub(a: V, b: V) -> V {
    add(a, V { v: -b.v, e: b.e })
}
fn mul(a: V, b: V) -> V {
    let v = a.v * b.v;
    V { v, e: a.v.abs() * b.e + b.v.abs() * a.e + a.e * b.e + EPS * v.abs() }
}
fn sigmoid(a: V) -> V {
    let v = 1.0 / (1.0 + (-a.v).exp());
    V { v, e: 0.25 * a.e + 4.0 * EPS * v.abs() }
}
fn tanh(a: V) -> V {
    let v = a.v.tanh();
    V { v, e: a.e + 4.0 * EPS * v.abs() }
}
fn clip(a: V, c: Option<f64>) -> V {
    match c {
        Some(c) => V { v: a.v.clamp(-c, c), e: a.e },
        None => a,
    }
}
/// `Σ x_k · w_k` with exact weights: the inputs' errors weighted, plus
/// (K + 1) roundings of the magnitudes.
fn dot(x: &[V], w: &[f32]) -> V {
    let v: f64 = x.iter().zip(w).map(|(a, &b)| a.v * b as f64).sum();
    let mag: f64 = x.iter().zip(w).map(|(a, &b)| (a.v * b as f64).abs()).sum();
    let e: f64 = x.iter().zip(w).map(|(a, &b)| a.e * (b as f64).abs()).sum();
    V { v, e: e + (x.len() + 1) as f64 * EPS * mag }
}

#[derive(Clone, Debug)]
struct Case {
    op: &'static str,
    dir: &'static str,
    layout: i64,
    t: usize,
    b: usize,
    i: usize,
    h: usize,
    lens: bool,
    init: bool,
    bias: bool,
    clip: Option<f32>,
    lbr: bool,
    peep: bool,
    input_forget: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec!["RNN", "GRU", "LSTM"]),
        prop::sample::select(vec!["forward", "reverse", "bidirectional"]),
        (0i64..2, 1usize..5, 1usize..4, 1usize..4, 1usize..4),
        (any::<bool>(), any::<bool>(), any::<bool>(), prop::option::of(Just(0.7f32))),
        (any::<bool>(), any::<bool>(), any::<bool>(), 0u64..10_000),
    )
        .prop_map(|(op, dir, (layout, t, b, i, h), (lens, init, bias, clip), (lbr, peep, input_forget, seed))| {
            Case {
                op,
                dir,
                layout,
                t,
                b,
                i,
                h,
                lens,
                init,
                bias,
                clip,
                lbr: lbr && op == "GRU",
                peep: peep && op == "LSTM",
                input_forget: input_forget && op == "LSTM",
                seed,
            }
        })
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    Tensor::randn(&[n], seed).to_vec::<f32>().unwrap().iter().map(|v| v * 0.5).collect()
}

/// Per batch row, per hidden unit.
type States = Vec<Vec<V>>;

/// One direction's operands, as the reference reads them.
struct Dir<'a> {
    x: &'a [f32],
    w: &'a [f32],
    r: &'a [f32],
    bias: Option<&'a [f32]>,
    p: Option<&'a [f32]>,
    h0: States,
    c0: States,
    lens: &'a [usize],
    reverse: bool,
}

/// One direction's reference: `(Y [T][B][H], h [B][H], c [B][H])`.
fn reference(c: &Case, dir: Dir) -> (Vec<States>, States, States) {
    let Dir { x, w, r, bias, p, h0, c0, lens, reverse } = dir;
    let (t_len, b, ni, nh) = (c.t, c.b, c.i, c.h);
    let gates = match c.op {
        "RNN" => 1,
        "GRU" => 3,
        _ => 4,
    };
    let clipv = c.clip.map(|v| v as f64);
    let xt = |t: usize, bi: usize| -> Vec<V> {
        (0..ni)
            .map(|k| exact(if c.layout == 0 { x[(t * b + bi) * ni + k] } else { x[(bi * t_len + t) * ni + k] }))
            .collect()
    };
    let wrow = |g: usize, u: usize| &w[(g * nh + u) * ni..(g * nh + u + 1) * ni];
    let rrow = |g: usize, u: usize| &r[(g * nh + u) * nh..(g * nh + u + 1) * nh];
    let wb = |g: usize, u: usize| bias.map_or(0.0, |bv| bv[g * nh + u]);
    let rb = |g: usize, u: usize| bias.map_or(0.0, |bv| bv[gates * nh + g * nh + u]);
    let (mut h, mut cs) = (h0, c0);
    let mut y = vec![vec![vec![V { v: 0.0, e: 0.0 }; nh]; b]; t_len];
    for step in 0..t_len {
        let t = if reverse { t_len - 1 - step } else { step };
        for bi in 0..b {
            if t >= lens[bi] {
                continue;
            }
            let xv = xt(t, bi);
            let hp = h[bi].clone();
            // X·Wᵀ + Wb + Rb + H·Rᵀ of gate g, unit u (GRU's h gate apart).
            let pre = |g: usize, u: usize, hh: &[V]| {
                add(add(dot(&xv, wrow(g, u)), dot(hh, rrow(g, u))), exact(wb(g, u) + rb(g, u)))
            };
            let mut hn = Vec::with_capacity(nh);
            let mut cn = Vec::with_capacity(nh);
            match c.op {
                "RNN" => (0..nh).for_each(|u| hn.push(tanh(clip(pre(0, u, &hp), clipv)))),
                "GRU" => {
                    let z: Vec<V> = (0..nh).map(|u| sigmoid(clip(pre(0, u, &hp), clipv))).collect();
                    let rg: Vec<V> = (0..nh).map(|u| sigmoid(clip(pre(1, u, &hp), clipv))).collect();
                    for u in 0..nh {
                        let hh = if c.lbr {
                            let rh = add(dot(&hp, rrow(2, u)), exact(rb(2, u)));
                            tanh(clip(add(add(dot(&xv, wrow(2, u)), exact(wb(2, u))), mul(rg[u], rh)), clipv))
                        } else {
                            let rhp: Vec<V> = (0..nh).map(|k| mul(rg[k], hp[k])).collect();
                            tanh(clip(pre(2, u, &rhp), clipv))
                        };
                        hn.push(add(mul(sub(exact(1.0), z[u]), hh), mul(z[u], hp[u])));
                    }
                }
                _ => {
                    let pp =
                        |k: usize, u: usize, s: V| p.map_or(V { v: 0.0, e: 0.0 }, |pv| mul(exact(pv[k * nh + u]), s));
                    for (u, &cp) in cs[bi].iter().enumerate() {
                        let i = sigmoid(clip(add(pre(0, u, &hp), pp(0, u, cp)), clipv));
                        let f = if c.input_forget {
                            sub(exact(1.0), i)
                        } else {
                            sigmoid(clip(add(pre(2, u, &hp), pp(2, u, cp)), clipv))
                        };
                        let g = tanh(clip(pre(3, u, &hp), clipv));
                        let cnew = add(mul(f, cp), mul(i, g));
                        let o = sigmoid(clip(add(pre(1, u, &hp), pp(1, u, cnew)), clipv));
                        hn.push(mul(o, tanh(cnew)));
                        cn.push(cnew);
                    }
                }
            }
            if c.op == "LSTM" {
                cs[bi] = cn;
            }
            y[t][bi] = hn.clone();
            h[bi] = hn;
        }
    }
    (y, h, cs)
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let dirs: Vec<bool> = match c.dir {
        "forward" => vec![false],
        "reverse" => vec![true],
        _ => vec![false, true],
    };
    let d = dirs.len();
    let gates = match c.op {
        "RNN" => 1,
        "GRU" => 3,
        _ => 4,
    };
    let (t, b, ni, nh) = (c.t, c.b, c.i, c.h);
    let s = c.seed;
    let x = vals(t * b * ni, s);
    let w = vals(d * gates * nh * ni, s + 1);
    let r = vals(d * gates * nh * nh, s + 2);
    let bias = vals(d * 2 * gates * nh, s + 3);
    let h0 = vals(d * b * nh, s + 4);
    let c0 = vals(d * b * nh, s + 5);
    let p = vals(d * 3 * nh, s + 6);
    let lens: Vec<usize> = (0..b).map(|bi| if c.lens { 1 + (s as usize + bi) % t } else { t }).collect();
    let x_shape = if c.layout == 0 { vec![t, b, ni] } else { vec![b, t, ni] };
    let st_shape = if c.layout == 0 { vec![d, b, nh] } else { vec![b, d, nh] };
    // States in the file's layout.
    let lay = |v: &[f32]| -> Vec<f32> {
        if c.layout == 0 {
            return v.to_vec();
        }
        let mut out = vec![0.0; v.len()];
        for k in 0..d {
            for bi in 0..b {
                for u in 0..nh {
                    out[(bi * d + k) * nh + u] = v[(k * b + bi) * nh + u];
                }
            }
        }
        out
    };
    let mut names = vec!["x", "w", "r", "", "", "", "", ""];
    let mut feeds = vec![
        ("x", Tensor::from_vec(x.clone(), &x_shape)),
        ("w", Tensor::from_vec(w.clone(), &[d, gates * nh, ni])),
        ("r", Tensor::from_vec(r.clone(), &[d, gates * nh, nh])),
    ];
    let mut add_feed = |slot: usize, name: &'static str, t: Tensor| {
        names[slot] = name;
        feeds.push((name, t));
    };
    if c.bias {
        add_feed(3, "b", Tensor::from_vec(bias.clone(), &[d, 2 * gates * nh]));
    }
    if c.lens {
        add_feed(4, "lens", Tensor::from_vec(lens.iter().map(|&l| l as i64).collect::<Vec<_>>(), &[b]));
    }
    if c.init {
        add_feed(5, "h0", Tensor::from_vec(lay(&h0), &st_shape));
        if c.op == "LSTM" {
            add_feed(6, "c0", Tensor::from_vec(lay(&c0), &st_shape));
        }
    }
    if c.peep {
        add_feed(7, "p", Tensor::from_vec(p.clone(), &[d, 3 * nh]));
    }
    while names.last() == Some(&"") {
        names.pop();
    }
    let mut attrs = vec![attr_i("hidden_size", nh as i64), attr_s("direction", c.dir), attr_i("layout", c.layout)];
    attrs.extend(c.clip.map(|v| attr_f("clip", v)));
    if c.lbr {
        attrs.push(attr_i("linear_before_reset", 1));
    }
    if c.input_forget {
        attrs.push(attr_i("input_forget", 1));
    }
    let outs_names: Vec<&str> = if c.op == "LSTM" { vec!["y", "yh", "yc"] } else { vec!["y", "yh"] };
    let bytes = model(
        vec![node(c.op, "rnn", &names, &outs_names, attrs)],
        feeds.iter().map(|(n, t)| fixed(n, t.dtype(), t.shape())).collect(),
        outs_names.iter().map(|o| value(o, elem(DType::F32), &[None; 4][..if *o == "y" { 4 } else { 3 }])).collect(),
        vec![],
        14,
    );
    let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let inputs: Vec<Tensor> = feeds.into_iter().map(|(_, t)| t).collect();
    let outs = model.run(&inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    let got: Vec<Vec<f32>> = outs.iter().map(|o| o.to_vec::<f32>().unwrap()).collect();
    for (k, &reverse) in dirs.iter().enumerate() {
        let at = |v: &[f32], stride: usize| v[k * stride..(k + 1) * stride].to_vec();
        let state = |v: &[f32], on: bool| -> Vec<Vec<V>> {
            (0..b)
                .map(|bi| (0..nh).map(|u| if on { exact(v[(k * b + bi) * nh + u]) } else { exact(0.0) }).collect())
                .collect()
        };
        let (wk, rk) = (at(&w, gates * nh * ni), at(&r, gates * nh * nh));
        let (bk, pk) = (c.bias.then(|| at(&bias, 2 * gates * nh)), c.peep.then(|| at(&p, 3 * nh)));
        let (y, h, cs) = reference(
            c,
            Dir {
                x: &x,
                w: &wk,
                r: &rk,
                bias: bk.as_deref(),
                p: pk.as_deref(),
                h0: state(&h0, c.init),
                c0: state(&c0, c.init && c.op == "LSTM"),
                lens: &lens,
                reverse,
            },
        );
        let check = |what: &str, g: f32, want: V| -> Result<(), TestCaseError> {
            prop_assert!(
                (g as f64 - want.v).abs() <= 2.0 * want.e + 1e-30,
                "{what}: {g}, want {} (bound {})",
                want.v,
                2.0 * want.e
            );
            Ok(())
        };
        for (ti, yt) in y.iter().enumerate() {
            for (bi, row) in yt.iter().enumerate() {
                for (u, &want) in row.iter().enumerate() {
                    let at =
                        if c.layout == 0 { ((ti * d + k) * b + bi) * nh + u } else { ((bi * t + ti) * d + k) * nh + u };
                    check(&format!("Y[t {ti}, dir {k}, b {bi}, {u}]"), got[0][at], want)?;
                }
            }
        }
        for bi in 0..b {
            for u in 0..nh {
                let at = if c.layout == 0 { (k * b + bi) * nh + u } else { (bi * d + k) * nh + u };
                check(&format!("Y_h[dir {k}, b {bi}, {u}]"), got[1][at], h[bi][u])?;
                if c.op == "LSTM" {
                    check(&format!("Y_c[dir {k}, b {bi}, {u}]"), got[2][at], cs[bi][u])?;
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn recurrent_layers_match_the_equations_in_f64(c in case()) {
        run_case(&c)?;
    }
}
