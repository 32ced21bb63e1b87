//! `RotaryEmbedding` against f64 loops written from ONNX's spec and
//! reference: 3-D and 4-D input, halves or interleaved pairs, partial
//! rotation (`rotary_embedding_dim`), caches picked by `position_ids` or
//! given per batch and position, NaN and infinities in the input. Each run
//! asserts that the JIT ran the model.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

const EPS: f64 = f32::EPSILON as f64;

#[derive(Clone, Debug)]
struct Case {
    three_d: bool,
    b: usize,
    heads: usize,
    seq: usize,
    head: usize,
    /// `rotary_embedding_dim` (0: the head size).
    rot: usize,
    interleaved: bool,
    positions: bool,
    specials: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), 1usize..3, 1usize..4, 1usize..5, prop::sample::select(vec![2usize, 4, 6, 8]), 0usize..4)
        .prop_flat_map(|(three_d, b, heads, seq, head, rot_pick)| {
            // An even rotary width up to the head size, or 0 (all of it).
            let rot = if rot_pick == 0 { 0 } else { 2 * (1 + (rot_pick - 1) % (head / 2)) };
            (
                Just((three_d, b, heads, seq, head, rot)),
                any::<bool>(),
                any::<bool>(),
                prop::bool::weighted(0.3),
                0u64..10_000,
            )
        })
        .prop_map(|((three_d, b, heads, seq, head, rot), interleaved, positions, specials, seed)| Case {
            three_d,
            b,
            heads,
            seq,
            head,
            rot,
            interleaved,
            positions,
            specials,
            seed,
        })
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let (b, h, s, d) = (c.b, c.heads, c.seq, c.head);
    let rot = if c.rot == 0 { d } else { c.rot };
    let half = rot / 2;
    let max_pos = 7;
    // x as [b, h, s, d] values; the 3-D layout is [b, s, h·d].
    let mut x4 = Tensor::randn(&[b, h, s, d], c.seed).to_vec::<f32>().unwrap();
    if c.specials {
        let n = x4.len();
        x4[c.seed as usize % n] = f32::NAN;
        x4[(c.seed as usize + 1) % n] = f32::INFINITY;
    }
    let at4 = |bi: usize, hi: usize, si: usize, di: usize| x4[((bi * h + hi) * s + si) * d + di] as f64;
    let x = if c.three_d {
        let mut v = Vec::with_capacity(x4.len());
        for bi in 0..b {
            for si in 0..s {
                for hi in 0..h {
                    v.extend((0..d).map(|di| at4(bi, hi, si, di) as f32));
                }
            }
        }
        Tensor::from_vec(v, &[b, s, h * d])
    } else {
        Tensor::from_vec(x4.clone(), &[b, h, s, d])
    };
    let angles = Tensor::rand_uniform(&[max_pos * half], -3.0, 3.0, c.seed + 1).to_vec::<f32>().unwrap();
    let pos: Vec<i64> = (0..b * s).map(|i| ((c.seed as usize + 5 * i) % max_pos) as i64).collect();
    // Cache row r (a position, or a (batch, seq) pair without position_ids).
    let rows = if c.positions { max_pos } else { b * s };
    let angle = |r: usize, k: usize| angles[(r % max_pos) * half + k];
    let cos: Vec<f32> = (0..rows * half).map(|i| angle(i / half, i % half).cos()).collect();
    let sin: Vec<f32> = (0..rows * half).map(|i| angle(i / half, i % half).sin()).collect();
    let cache_shape = if c.positions { vec![max_pos, half] } else { vec![b, s, half] };
    let mut feeds = vec![
        ("input", x.clone()),
        ("cos", Tensor::from_vec(cos.clone(), &cache_shape)),
        ("sin", Tensor::from_vec(sin.clone(), &cache_shape)),
    ];
    if c.positions {
        feeds.push(("pos", Tensor::from_vec(pos.clone(), &[b, s])));
    }
    let mut attrs = vec![attr_i("interleaved", c.interleaved as i64)];
    if c.rot > 0 {
        attrs.push(attr_i("rotary_embedding_dim", c.rot as i64));
    }
    if c.three_d {
        attrs.push(attr_i("num_heads", h as i64));
    }
    let names: Vec<&str> = feeds.iter().map(|(n, _)| *n).collect();
    let bytes = model(
        vec![node("RotaryEmbedding", "rope", &names, &["y"], attrs)],
        feeds.iter().map(|(n, t)| fixed(n, t.dtype(), t.shape())).collect(),
        vec![fixed("y", DType::F32, x.shape())],
        vec![],
        23,
    );
    let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let inputs: Vec<Tensor> = feeds.into_iter().map(|(_, t)| t).collect();
    let y = model.run(&inputs).map_err(|e| TestCaseError::fail(e.to_string()))?.remove(0);
    let cf = &model.function().concrete_functions()[0];
    prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
    prop_assert_eq!(y.shape(), x.shape());
    let y = y.to_vec::<f32>().unwrap();
    for bi in 0..b {
        for si in 0..s {
            let row = if c.positions { pos[bi * s + si] as usize } else { bi * s + si };
            for hi in 0..h {
                for di in 0..d {
                    // Which pair k this channel belongs to, and whether it is
                    // the first (real) or second (imaginary) of it.
                    let want = if di >= rot {
                        (at4(bi, hi, si, di), 0.0)
                    } else {
                        let (k, second) = if c.interleaved { (di / 2, di % 2 == 1) } else { (di % half, di >= half) };
                        let (i1, i2) = if c.interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
                        let (co, si_) = (cos[row * half + k] as f64, sin[row * half + k] as f64);
                        let (x1, x2) = (at4(bi, hi, si, i1), at4(bi, hi, si, i2));
                        let (a, bb) = if second { (si_ * x1, co * x2) } else { (co * x1, -si_ * x2) };
                        // Two rounded products and their rounded sum.
                        (a + bb, 2.0 * EPS * (a.abs() + bb.abs()) + 1e-38)
                    };
                    let at =
                        if c.three_d { ((bi * s + si) * h + hi) * d + di } else { ((bi * h + hi) * s + si) * d + di };
                    let got = y[at] as f64;
                    let ok = if want.0.is_nan() {
                        got.is_nan()
                    } else if want.0.is_infinite() {
                        got == want.0
                    } else {
                        (got - want.0).abs() <= want.1
                    };
                    prop_assert!(ok, "y[{bi},{hi},{si},{di}] = {got}, want {} (bound {})", want.0, want.1);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn rotary_embedding_matches_the_spec_in_f64(c in case()) {
        run_case(&c)?;
    }
}
