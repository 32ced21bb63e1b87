//! The bf16 forward ([`super::lowp`]) against the f64 reference within the
//! tolerance [`super::forward_strided_bf16`] documents, on the odd sizes,
//! masks, special values and thread counts of the f32 tests; and that the
//! bf16 products really run (their rounding shows).

use super::paths::Path;
use super::reference::{reference, sees};
use super::tests::{random_problem, Case, Rng, Spread};
use super::{forward_on, Mask, Problem};
use crate::threads::set_num_threads;
use crate::Isa;

/// The bf16 path, where this CPU has it.
fn bf16_path() -> Option<Path> {
    let path = Path::of_bf16(Isa::native());
    if path != Path::Avx512Bf16 {
        eprintln!("this CPU has no AVX-512 BF16: the bf16 forward runs the f32 one (tested by `falls_back`)");
        return None;
    }
    Some(path)
}

/// `(out, lse)` of the forward on `path`, on packed operands or spread
/// ones (NaN between the rows), outputs pre-filled with junk.
fn forward(path: Path, c: &Case, mask: Option<&Mask<'_>>, spread: bool) -> (Vec<f32>, Vec<f32>) {
    let p = &c.p;
    let lay = |x: &[f32], rows: usize, cols: usize| Spread::laid(x, p.batch, rows, cols, spread);
    let (q, k, v) = (lay(&c.q, p.tq, p.d), lay(&c.k, p.tk, p.d), lay(&c.v, p.tk, p.dv));
    let (mut out, mut lse) = (vec![7.0f32; p.batch * p.tq * p.dv], vec![7.0f32; p.batch * p.tq]);
    forward_on(path, p, q.operand(), k.operand(), v.operand(), mask, None, &mut out, &mut lse);
    (out, lse)
}

/// [`forward`] on packed and on spread operands, which must agree in bits.
fn forward_both(path: Path, c: &Case, mask: Option<&Mask<'_>>) -> (Vec<f32>, Vec<f32>) {
    let packed = forward(path, c, mask, false);
    let spread = forward(path, c, mask, true);
    let bits = |(o, l): &(Vec<f32>, Vec<f32>)| o.iter().chain(l).map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert!(bits(&packed) == bits(&spread), "{path:?}: spread operands differ from packed ones on {:?}", c.p);
    packed
}

/// Per query, the largest `scale·Σ_c |q_ic·k_jc|` over the keys it sees:
/// what the rounding of `q` and `k` can move its scores by, in units of
/// `2⁻⁸`.
fn score_magnitudes(c: &Case, mask: Option<&Mask<'_>>) -> Vec<f64> {
    let p = &c.p;
    let mut mags = vec![0.0f64; p.batch * p.tq];
    for b in 0..p.batch {
        for i in 0..p.tq {
            let qi = &c.q[(b * p.tq + i) * p.d..][..p.d];
            for j in (0..p.tk).filter(|&j| sees(p, mask, b, i, j)) {
                let kj = &c.k[(b * p.tk + j) * p.d..][..p.d];
                let s: f64 = qi.iter().zip(kj).map(|(x, y)| f64::from(x.abs()) * f64::from(y.abs())).sum();
                let m = &mut mags[b * p.tq + i];
                *m = m.max(s * f64::from(p.scale));
            }
        }
    }
    mags
}

/// The bf16 forward within its tolerance of the reference: each output
/// within `2⁻⁷·(1 + 2·S_i)` of the sum of its terms' magnitudes, `lse`
/// within `2⁻⁷·(1 + 2·S_i)` plus f32's error (`S_i` from
/// [`score_magnitudes`]); NaN wherever the f32 forward has NaN.
fn check(c: &Case, mask: Option<&Mask<'_>>) {
    let Some(path) = bf16_path() else { return };
    let p = &c.p;
    let want = reference(p, &c.q, &c.k, &c.v, mask, &c.dout);
    let (out, lse) = forward_both(path, c, mask);
    let (f32_out, f32_lse) = forward_both(Path::of(Isa::native()), c, mask);
    let mags = score_magnitudes(c, mask);
    let unit = 2f64.powi(-7);
    for (row, &s) in mags.iter().enumerate() {
        let rel = unit * (1.0 + 2.0 * s);
        for n in row * p.dv..(row + 1) * p.dv {
            let (g, w) = (f64::from(out[n]), want.out[n]);
            if f32_out[n].is_nan() {
                assert!(g.is_nan(), "out[{n}] of {p:?}: {g:e} where the f32 forward has NaN");
            } else if w.is_finite() {
                let tol = rel * want.out_mag[n] + 1e-30;
                assert!((g - w).abs() <= tol, "out[{n}] of {p:?}: got {g:e}, want {w:e} ± {tol:e}");
            }
        }
        let (g, w) = (f64::from(lse[row]), want.lse[row]);
        if w.is_finite() && !f32_lse[row].is_nan() {
            let tol = rel + 1e-5 * (1.0 + w.abs());
            assert!((g - w).abs() <= tol, "lse[{row}] of {p:?}: got {g:e}, want {w:e} ± {tol:e}");
        } else {
            assert!(
                lse[row].to_bits() == f32_lse[row].to_bits(),
                "lse[{row}] of {p:?}: {g:e} vs f32's {}",
                f32_lse[row]
            );
        }
    }
}

/// Random problems over the odd sizes, causal or not, `tq ≠ tk` included.
#[test]
fn random_problems_within_the_bf16_tolerance() {
    let mut rng = Rng(0x9e37_79b9);
    for n in 0..48 {
        let p = random_problem(&mut rng, n);
        check(&Case::random(&mut rng, p), None);
    }
}

/// The causal rule with unequal lengths (odd key counts per group: the
/// zero beside a word's last probability), and masks with broadcast axes.
#[test]
fn causal_lengths_and_masks_within_the_bf16_tolerance() {
    let mut rng = Rng(5);
    for (tq, tk) in [(130, 33), (33, 130), (1, 130), (130, 1), (70, 200), (200, 71), (65, 64), (128, 128)] {
        let p = Problem { batch: 2, tq, tk, d: 17, dv: 5, scale: 0.3, causal: true };
        check(&Case::random(&mut rng, p), None);
    }
    let (batch, tq, tk) = (2, 33, 70);
    let data: Vec<bool> = (0..batch * tq * tk).map(|_| rng.below(4) != 0).collect();
    for (n, (bs, rs, cs)) in [(tq * tk, tk, 1), (0, tk, 1), (tq * tk, 0, 1), (tk, 1, tq)].into_iter().enumerate() {
        let mask = Mask { data: &data, batch_stride: bs, row_stride: rs, col_stride: cs };
        let p = Problem { batch, tq, tk, d: 64, dv: 33, scale: 0.125, causal: n % 2 == 1 };
        check(&Case::random(&mut rng, p), Some(&mask));
    }
}

/// NaN and Inf: NaN wherever the f32 forward has it, the rest within the
/// tolerance.
#[test]
fn nan_and_inf_as_the_f32_forward() {
    let mut rng = Rng(8);
    for causal in [false, true] {
        let p = Problem { batch: 1, tq: 20, tk: 30, d: 4, dv: 3, scale: 0.5, causal };
        let base = Case::random(&mut rng, p);
        let pokes: [&dyn Fn(&mut Case); 5] = [
            &|c| c.q[5 * 4 + 1] = f32::NAN,
            &|c| c.k[25 * 4] = f32::NAN,
            &|c| c.v[9 * 3 + 2] = f32::INFINITY,
            &|c| c.q[2 * 4..3 * 4].copy_from_slice(&[f32::INFINITY, 1.0, 1.0, 1.0]),
            &|c| c.q[4 * 4..5 * 4].copy_from_slice(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0]),
        ];
        for poke in pokes {
            let mut c =
                Case { q: base.q.clone(), k: base.k.clone(), v: base.v.clone(), dout: base.dout.clone(), ..base };
            poke(&mut c);
            check(&c, None);
        }
    }
}

/// The products run in bf16: a value `1 + 2⁻¹⁰` (between two bf16 values)
/// averaged over equal weights comes out `1` exactly, where f32 keeps it.
#[test]
fn the_products_round_to_bf16() {
    let Some(path) = bf16_path() else { return };
    let p = Problem { batch: 2, tq: 40, tk: 40, d: 8, dv: 24, scale: 1.0, causal: true };
    let v = 1.0 + 2f32.powi(-10);
    let c = Case { p, q: vec![0.0; 2 * 40 * 8], k: vec![0.5; 2 * 40 * 8], v: vec![v; 2 * 40 * 24], dout: vec![] };
    let (out, _) = forward_both(path, &c, None);
    assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6), "bf16 products keep {v}: {:?}", &out[..4]);
    let (f32_out, _) = forward_both(Path::of(Isa::native()), &c, None);
    assert!(f32_out.iter().all(|&x| (x - v).abs() < 1e-6));
}

/// 1, 2 and 3 threads give the same bits, on the pool.
#[test]
fn thread_counts_give_the_same_bits() {
    let Some(path) = bf16_path() else { return };
    let _guard = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(13);
    let p = Problem { batch: 4, tq: 130, tk: 150, d: 64, dv: 64, scale: 0.125, causal: true };
    let c = Case::random(&mut rng, p);
    let mut first = None;
    for n in [1, 2, 3] {
        set_num_threads(n);
        let dispatches = crate::threads::pool_dispatches();
        let r = forward(path, &c, None, false);
        let split = crate::threads::pool_dispatches() - dispatches;
        assert!(n == 1 || split == 1 || crate::threads::num_threads() != n, "{split} dispatches at {n} threads");
        let bits: Vec<u32> = r.0.iter().chain(&r.1).map(|x| x.to_bits()).collect();
        match &first {
            None => first = Some(bits),
            Some(f) => assert!(*f == bits, "{n} threads differ from 1"),
        }
    }
    set_num_threads(0);
    check(&c, None);
}

/// Without AVX-512 BF16 in the `Isa`, the public function is the f32
/// forward, bit for bit.
#[test]
fn falls_back_to_the_f32_forward() {
    let mut rng = Rng(17);
    let p = Problem { batch: 2, tq: 33, tk: 17, d: 5, dv: 7, scale: 0.4, causal: true };
    let c = Case::random(&mut rng, p);
    let rows = |x: &[f32], n: usize, w: usize| Spread::laid(x, p.batch, n, w, false);
    let (q, k, v) = (rows(&c.q, p.tq, p.d), rows(&c.k, p.tk, p.d), rows(&c.v, p.tk, p.dv));
    let isa = Isa::native().with_avx512(false);
    let (mut out, mut lse) = (vec![0.0f32; 2 * 33 * 7], vec![0.0f32; 2 * 33]);
    super::forward_strided_bf16(&p, q.operand(), k.operand(), v.operand(), None, &mut out, &mut lse, isa);
    let (want_out, want_lse) = forward(Path::of(isa), &c, None, false);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(&out) == bits(&want_out) && bits(&lse) == bits(&want_lse));
}
