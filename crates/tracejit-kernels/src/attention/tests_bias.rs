//! The forward with an additive [`Bias`] against an f64 evaluation of
//! `softmax(q·kᵀ·scale + bias, masked)·v`, on every path, the odd sizes,
//! key-only and per-pair biases with broadcast strides, with masks and the
//! causal rule; a bias of 0 and `-inf` against the same bool mask; the
//! bf16 forward with a bias; a short bias.

use super::paths::Path;
use super::reference::sees;
use super::tests::{paths, random_problem, Case, Rng, Spread};
use super::{forward_on, Bias, Mask, Problem};
use crate::Isa;

/// The f64 forward with a bias: `(out, out's magnitudes, lse)`. A query
/// that sees no key gets zeros and `lse = -inf`; unmasked scores that are
/// all `-inf` give NaN, as the plain formula does.
fn reference(c: &Case, mask: Option<&Mask<'_>>, bias: &Bias<'_>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let p = &c.p;
    let (tq, tk, d, dv) = (p.tq, p.tk, p.d, p.dv);
    let mut out = vec![0.0f64; p.batch * tq * dv];
    let mut mag = out.clone();
    let mut lse = vec![f64::NEG_INFINITY; p.batch * tq];
    for b in 0..p.batch {
        for i in 0..tq {
            let seen: Vec<usize> = (0..tk).filter(|&j| sees(p, mask, b, i, j)).collect();
            if seen.is_empty() {
                continue;
            }
            let qi = &c.q[(b * tq + i) * d..][..d];
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    let kj = &c.k[(b * tk + j) * d..][..d];
                    let dot: f64 = qi.iter().zip(kj).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                    let at = b * bias.batch_stride + i * bias.row_stride + j * bias.col_stride;
                    dot * f64::from(p.scale) + f64::from(bias.data[at])
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|&x| (x - m).exp()).sum();
            lse[b * tq + i] = if m == f64::NEG_INFINITY { m } else { m + sum.ln() };
            for (&j, &sj) in seen.iter().zip(&s) {
                let pj = (sj - m).exp() / sum;
                for col in 0..dv {
                    let term = pj * f64::from(c.v[(b * tk + j) * dv + col]);
                    out[(b * tq + i) * dv + col] += term;
                    mag[(b * tq + i) * dv + col] += term.abs();
                }
            }
        }
    }
    (out, mag, lse)
}

/// `(out, lse)` of the forward on `path` with `bias`, on packed or spread
/// operands, outputs pre-filled with junk.
fn forward(path: Path, c: &Case, mask: Option<&Mask<'_>>, bias: Option<&Bias<'_>>, spread: bool) -> Vec<u32> {
    let p = &c.p;
    let lay = |x: &[f32], rows: usize, cols: usize| Spread::laid(x, p.batch, rows, cols, spread);
    let (q, k, v) = (lay(&c.q, p.tq, p.d), lay(&c.k, p.tk, p.d), lay(&c.v, p.tk, p.dv));
    let (mut out, mut lse) = (vec![7.0f32; p.batch * p.tq * p.dv], vec![7.0f32; p.batch * p.tq]);
    forward_on(path, p, q.operand(), k.operand(), v.operand(), mask, bias, &mut out, &mut lse);
    out.iter().chain(&lse).map(|x| x.to_bits()).collect()
}

/// The forward on every path against [`reference`] (within `1e-5` of the
/// magnitudes summed, the bias counted in a score's size), the paths and
/// the operand layouts agreeing in bits.
fn check(c: &Case, mask: Option<&Mask<'_>>, bias: &Bias<'_>) {
    let (want, mag, want_lse) = reference(c, mask, bias);
    let mut first: Option<Vec<u32>> = None;
    for path in paths() {
        let bits = forward(path, c, mask, Some(bias), false);
        assert!(bits == forward(path, c, mask, Some(bias), true), "{path:?}: spread operands differ on {:?}", c.p);
        let (out, lse) = bits.split_at(want.len());
        for (n, ((&g, &w), &m)) in out.iter().zip(&want).zip(&mag).enumerate() {
            let g = f64::from(f32::from_bits(g));
            let ok = if w.is_nan() { g.is_nan() } else { (g - w).abs() <= 1e-5 * m + 1e-30 };
            assert!(ok, "{path:?} out[{n}] of {:?}: got {g:e}, want {w:e} (magnitude {m:e})", c.p);
        }
        for (n, (&g, &w)) in lse.iter().zip(&want_lse).enumerate() {
            let g = f64::from(f32::from_bits(g));
            let ok = if w.is_nan() { g.is_nan() } else { g == w || (g - w).abs() <= 1e-5 * (1.0 + w.abs()) };
            assert!(ok, "{path:?} lse[{n}] of {:?}: got {g:e}, want {w:e}", c.p);
        }
        match &first {
            None => first = Some(bits),
            Some(f) => assert!(*f == bits, "{path:?} differs in bits from the first path on {:?}", c.p),
        }
    }
}

/// Random problems over the odd sizes, causal or not, with a bias that is
/// per key (a padding bias), per pair, or broadcast over the problems,
/// alone and with a mask.
#[test]
fn biases_match_the_f64_formula_on_every_path() {
    let mut rng = Rng(0xb1a5);
    for n in 0..36 {
        let p = random_problem(&mut rng, n);
        let c = Case::random(&mut rng, p);
        let (b, tq, tk) = (p.batch, p.tq, p.tk);
        let values = rng.vec(b * tq * tk, 3.0);
        let strides = match n % 3 {
            0 => [tk, 0, 1],
            1 => [tq * tk, tk, 1],
            _ => [0, tk, 1],
        };
        let bias = Bias { data: &values, batch_stride: strides[0], row_stride: strides[1], col_stride: strides[2] };
        check(&c, None, &bias);
        let flags: Vec<bool> = (0..b * tq * tk).map(|_| rng.below(4) != 0).collect();
        let mask = Mask { data: &flags, batch_stride: tq * tk, row_stride: tk, col_stride: 1 };
        check(&c, Some(&mask), &bias);
    }
}

/// A padding bias across tiles and blocks: large negative values (as
/// ONNX exports write, `-10000` or the f32 minimum) and `-inf` on the
/// padded keys of each problem.
#[test]
fn padding_biases_across_tiles_and_blocks() {
    let mut rng = Rng(0x9ad);
    for (tq, tk, pad) in [(130, 150, -10_000.0f32), (150, 130, f32::MIN), (70, 70, f32::NEG_INFINITY)] {
        let batch = 3;
        let values: Vec<f32> = (0..batch * tk).map(|n| if n % tk < tk - 20 * (n / tk) { 0.0 } else { pad }).collect();
        let bias = Bias { data: &values, batch_stride: tk, row_stride: 0, col_stride: 1 };
        for causal in [false, true] {
            let p = Problem { batch, tq, tk, d: 7, dv: 9, scale: 0.4, causal };
            check(&Case::random(&mut rng, p), None, &bias);
        }
    }
}

/// A key bias of `0` and `-inf` gives the bits of the bool mask with the
/// same pattern (key 0 always allowed, so no query is left with only
/// `-inf` scores, where the two differ: NaN against zeros).
#[test]
fn a_bias_of_zero_and_minus_infinity_is_the_mask() {
    let mut rng = Rng(0x5eed);
    for n in 0..12 {
        let p = Problem { batch: 2, ..random_problem(&mut rng, n) };
        if p.tk == 0 {
            continue;
        }
        let c = Case::random(&mut rng, p);
        let flags: Vec<bool> = (0..p.batch * p.tk).map(|j| j % p.tk == 0 || rng.below(3) != 0).collect();
        let values: Vec<f32> = flags.iter().map(|&f| if f { 0.0 } else { f32::NEG_INFINITY }).collect();
        let mask = Mask { data: &flags, batch_stride: p.tk, row_stride: 0, col_stride: 1 };
        let bias = Bias { data: &values, batch_stride: p.tk, row_stride: 0, col_stride: 1 };
        for path in paths() {
            let masked = forward(path, &c, Some(&mask), None, false);
            assert!(masked == forward(path, &c, None, Some(&bias), false), "{path:?} on {p:?}");
        }
    }
}

/// A query whose every score the bias makes `-inf` gets NaN, as the plain
/// formula's `0 / 0` (a mask gives zeros instead).
#[test]
fn a_row_of_minus_infinity_biases_is_nan() {
    let p = Problem { batch: 1, tq: 3, tk: 5, d: 2, dv: 2, scale: 1.0, causal: false };
    let c = Case::random(&mut Rng(3), p);
    let values = [f32::NEG_INFINITY; 5];
    let bias = Bias { data: &values, batch_stride: 0, row_stride: 0, col_stride: 1 };
    for path in paths() {
        let bits = forward(path, &c, None, Some(&bias), false);
        assert!(bits[..6].iter().all(|&x| f32::from_bits(x).is_nan()), "{path:?}");
    }
}

/// The bf16 forward adds the bias too (within its own tolerance of the
/// f32 forward with the bias: the bias makes the difference between the
/// two results here, so a forward that dropped it would fail).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_bf16_forward_adds_the_bias() {
    let path = Path::of_bf16(Isa::native());
    let p = Problem { batch: 2, tq: 33, tk: 70, d: 8, dv: 5, scale: 0.35, causal: false };
    let mut rng = Rng(0xbf);
    let c = Case::random(&mut rng, p);
    let values: Vec<f32> = (0..p.batch * p.tk).map(|j| if j % 3 == 0 { 4.0 } else { -4.0 }).collect();
    let bias = Bias { data: &values, batch_stride: p.tk, row_stride: 0, col_stride: 1 };
    let (want, mag, _) = reference(&c, None, &bias);
    let (plain, _, _) = reference(&c, None, &Bias { data: &[0.0], batch_stride: 0, row_stride: 0, col_stride: 0 });
    let bits = forward(path, &c, None, Some(&bias), false);
    let mut moved = false;
    for (n, &g) in bits[..want.len()].iter().enumerate() {
        let g = f64::from(f32::from_bits(g));
        // The bf16 bound of `forward_strided_bf16` with scores up to
        // |s| ≤ 4 + d·4·scale.
        let tol = 2f64.powi(-7) * 20.0 * mag[n] + 1e-30;
        assert!((g - want[n]).abs() <= tol, "out[{n}]: {g} vs {}", want[n]);
        moved |= (want[n] - plain[n]).abs() > 2.0 * tol;
    }
    assert!(moved, "the bias moves some output by more than twice the tolerance");
}

/// A bias shorter than its strides reach panics, naming it.
#[test]
#[should_panic(expected = "bias of 4 values is too short")]
fn a_short_bias_panics() {
    let p = Problem { batch: 2, tq: 3, tk: 3, d: 1, dv: 1, scale: 1.0, causal: false };
    let c = Case::random(&mut Rng(5), p);
    let bias = Bias { data: &[0.0; 4], batch_stride: 3, row_stride: 0, col_stride: 1 };
    forward(Path::of(Isa::native()), &c, None, Some(&bias), false);
}
