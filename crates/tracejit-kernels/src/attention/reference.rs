//! The plain formula in f64 for the tests: every score materialized, the
//! softmax over each query's unmasked keys, the products (masked pairs
//! weighing 0 but multiplied all the same, so `0 · NaN` is NaN as in
//! dense products; fully masked queries skipped), and the
//! gradients in closed form (`dS = P ⊙ (dP − rowsum(dP ⊙ P))`), each value
//! with the sum of its terms' magnitudes, which bounds the f32 rounding of
//! a product computed in any order.

use super::{Mask, Problem};

/// Results of the reference, with magnitudes.
pub(super) struct Reference {
    pub out: Vec<f64>,
    pub out_mag: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dq_mag: Vec<f64>,
    pub dk: Vec<f64>,
    pub dk_mag: Vec<f64>,
    pub dv: Vec<f64>,
    pub dv_mag: Vec<f64>,
}

/// Whether query `i` of problem `b` sees key `j`.
pub(super) fn sees(p: &Problem, mask: Option<&Mask<'_>>, b: usize, i: usize, j: usize) -> bool {
    let causal = !p.causal || j as isize <= i as isize + p.tk as isize - p.tq as isize;
    let masked = mask.is_some_and(|m| !m.data[b * m.batch_stride + i * m.row_stride + j * m.col_stride]);
    causal && !masked
}

/// The forward and (for `dout`) backward of `p` in f64.
pub(super) fn reference(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&Mask<'_>>,
    dout: &[f32],
) -> Reference {
    let (tq, tk, d, dv) = (p.tq, p.tk, p.d, p.dv);
    let f = |x: &[f32]| x.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let (q, k, v, dout) = (f(q), f(k), f(v), f(dout));
    let scale = f64::from(p.scale);
    let zeros = |n: usize| vec![0.0f64; n];
    let mut r = Reference {
        out: zeros(p.batch * tq * dv),
        out_mag: zeros(p.batch * tq * dv),
        lse: vec![f64::NEG_INFINITY; p.batch * tq],
        dq: zeros(q.len()),
        dq_mag: zeros(q.len()),
        dk: zeros(k.len()),
        dk_mag: zeros(k.len()),
        dv: zeros(v.len()),
        dv_mag: zeros(v.len()),
    };
    for b in 0..p.batch {
        let (qb, kb, vb) = (b * tq, b * tk, b * tk);
        for i in 0..tq {
            let seen: Vec<bool> = (0..tk).map(|j| sees(p, mask, b, i, j)).collect();
            if !seen.contains(&true) {
                continue;
            }
            let qi = &q[(qb + i) * d..][..d];
            let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
            let s: Vec<f64> = (0..tk).filter(|&j| seen[j]).map(|j| dot(qi, &k[(kb + j) * d..][..d]) * scale).collect();
            let m = s.iter().fold(f64::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            let sum: f64 = s.iter().map(|&x| (x - m).exp()).sum();
            // log Σ exp(-inf) = -inf (where the stable form gives NaN).
            r.lse[qb + i] = if s.iter().all(|&x| x == f64::NEG_INFINITY) { m } else { m + sum.ln() };
            // Masked pairs weigh 0 but still multiply their operands, as
            // the plain formula's products do.
            let mut unmasked = s.iter();
            let pr: Vec<f64> =
                seen.iter().map(|&y| if y { (unmasked.next().unwrap() - m).exp() / sum } else { 0.0 }).collect();
            let row = (qb + i) * dv;
            for (j, &pj) in pr.iter().enumerate() {
                for c in 0..dv {
                    r.out[row + c] += pj * v[(vb + j) * dv + c];
                    r.out_mag[row + c] += (pj * v[(vb + j) * dv + c]).abs();
                }
            }
            // Backward for this query.
            let go = &dout[row..][..dv];
            let vj = |j: usize| &v[(vb + j) * dv..][..dv];
            let dp: Vec<f64> = (0..tk).map(|j| dot(go, vj(j))).collect();
            let dp_mag: Vec<f64> = (0..tk).map(|j| go.iter().zip(vj(j)).map(|(a, b)| (a * b).abs()).sum()).collect();
            let dd: f64 = (0..tk).filter(|&j| seen[j]).map(|j| pr[j] * dp[j]).sum();
            let dd_mag: f64 = (0..dv).map(|c| (go[c] * r.out_mag[row + c]).abs()).sum();
            for j in 0..tk {
                let (ds, ds_mag) = if seen[j] {
                    (pr[j] * (dp[j] - dd), pr[j] * (dp_mag[j] + dd_mag + (dp[j] - dd).abs()))
                } else {
                    (0.0, 0.0)
                };
                for c in 0..d {
                    let (qc, kc) = (q[(qb + i) * d + c], k[(kb + j) * d + c]);
                    r.dq[(qb + i) * d + c] += scale * ds * kc;
                    r.dq_mag[(qb + i) * d + c] += (scale * ds_mag * kc).abs();
                    r.dk[(kb + j) * d + c] += scale * ds * qc;
                    r.dk_mag[(kb + j) * d + c] += (scale * ds_mag * qc).abs();
                }
                for (c, &g) in go.iter().enumerate() {
                    r.dv[(vb + j) * dv + c] += pr[j] * g;
                    r.dv_mag[(vb + j) * dv + c] += (pr[j] * g).abs();
                }
            }
        }
    }
    r
}

/// `Σ out · dout` in f64 (the loss whose gradients [`reference`] gives),
/// for finite differences.
pub(super) fn loss(p: &Problem, q: &[f32], k: &[f32], v: &[f32], mask: Option<&Mask<'_>>, dout: &[f32]) -> f64 {
    let r = reference(p, q, k, v, mask, dout);
    r.out.iter().zip(dout).map(|(o, g)| o * f64::from(*g)).sum()
}
