//! The attention composites' kernels for f64: the plain formula one query
//! at a time, so the only scores ever held are one query's row (`Tk`
//! values) — never the `[Tq, Tk]` matrix the body materializes (2 GiB of
//! f64 at T = 16384). The f32 flash kernels' tiles and SIMD are not worth
//! an f64 copy; this path is for accuracy, not speed.
//!
//! Each row follows the body's arithmetic: masked pairs weigh 0 but still
//! multiply their operands (so `0 · NaN` is NaN, as in the body's
//! products), a row with no key to see gets zeros and a log-sum-exp of
//! -inf, and a row whose allowed scores are all -inf gives `0/0`, as the
//! formula does.

use std::borrow::Cow;

use tracejit_kernels::attention::{Mask, Problem};
use tracejit_tensor::{kernels, Storage};

use super::native::{mask_of, scalar, sum_to, Geometry};

/// `s` broadcast to `shape`, its f64 values in row-major order.
fn f64s(s: &Storage, shape: &[usize]) -> Vec<f64> {
    let s = if s.shape() == shape { Cow::Borrowed(s) } else { Cow::Owned(kernels::broadcast_to(s, shape)) };
    s.to_vec::<f64>().expect("the predicate accepted f64")
}

fn storage(v: Vec<f64>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("kernel output size")
}

/// Whether query `i` of problem `b` sees key `j` (causal pattern and mask).
fn sees(p: &Problem, mask: Option<&Mask<'_>>, b: usize, i: usize, j: usize) -> bool {
    let causal = !p.causal || j + p.tq <= i + p.tk;
    let kept = mask.is_none_or(|m| m.data[b * m.batch_stride + i * m.row_stride + j * m.col_stride]);
    causal && kept
}

/// The operands of one call, contiguous f64 `[batch, rows, cols]`.
struct Operands {
    p: Problem,
    scale: f64,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

impl Operands {
    fn of(inputs: &[Storage], g: &Geometry) -> Operands {
        let p = g.problem;
        Operands {
            p,
            scale: scalar::<f64>(&inputs[3], "scale"),
            q: f64s(&inputs[0], &g.shape(&[p.tq, p.d])),
            k: f64s(&inputs[1], &g.shape(&[p.tk, p.d])),
            v: f64s(&inputs[2], &g.shape(&[p.tk, p.dv])),
        }
    }

    /// Query `i` of problem `b`'s scores into `s` (`scale · q·k`, every
    /// key), and whether it sees any key.
    fn scores(&self, mask: Option<&Mask<'_>>, b: usize, i: usize, s: &mut [f64], seen: &mut [bool]) -> bool {
        let p = &self.p;
        let qi = &self.q[(b * p.tq + i) * p.d..][..p.d];
        for j in 0..p.tk {
            let kj = &self.k[(b * p.tk + j) * p.d..][..p.d];
            s[j] = qi.iter().zip(kj).map(|(a, c)| a * c).sum::<f64>() * self.scale;
            seen[j] = sees(p, mask, b, i, j);
        }
        seen.contains(&true)
    }
}

/// The mask of a call, as the kernels take it.
fn mask<'a>(flags: &'a Option<(Cow<'a, [bool]>, [usize; 3])>) -> Option<Mask<'a>> {
    flags.as_ref().map(|(data, [b, r, c])| Mask { data, batch_stride: *b, row_stride: *r, col_stride: *c })
}

/// The forward: `(out [.., Tq, dv], lse [.., Tq])`.
pub(super) fn forward(inputs: &[Storage]) -> Vec<Storage> {
    let g = Geometry::of(inputs, inputs.get(5));
    let ops = Operands::of(inputs, &g);
    let flags = inputs.get(5).map(|m| mask_of(m, &g));
    let mask = mask(&flags);
    let p = ops.p;
    let mut out = vec![0.0f64; p.batch * p.tq * p.dv];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * p.tq];
    let (mut s, mut seen) = (vec![0.0f64; p.tk], vec![false; p.tk]);
    for b in 0..p.batch {
        for i in 0..p.tq {
            if !ops.scores(mask.as_ref(), b, i, &mut s, &mut seen) {
                continue;
            }
            // The body's max propagates NaN; a maximum of -inf shifts by 0.
            let m = (0..p.tk).filter(|&j| seen[j]).map(|j| s[j]).fold(f64::NEG_INFINITY, |m, x| {
                if x.is_nan() || x > m {
                    x
                } else {
                    m
                }
            });
            let m = if m == f64::NEG_INFINITY { 0.0 } else { m };
            let z: f64 = (0..p.tk).filter(|&j| seen[j]).map(|j| (s[j] - m).exp()).sum();
            let row = &mut out[(b * p.tq + i) * p.dv..][..p.dv];
            for j in 0..p.tk {
                let pj = if seen[j] { (s[j] - m).exp() / z } else { 0.0 };
                let vj = &ops.v[(b * p.tk + j) * p.dv..][..p.dv];
                row.iter_mut().zip(vj).for_each(|(o, x)| *o += pj * x);
            }
            lse[b * p.tq + i] = z.ln() + m;
        }
    }
    let lse = g.lse_as_body(storage(lse, &g.shape(&[p.tq])), inputs, inputs.get(5));
    vec![storage(out, &g.shape(&[p.tq, p.dv])), lse]
}

/// The backward: `(dq, dk, dv)` in the shapes of `q`, `k` and `v`, from
/// `(q, k, v, scale, causal, out, lse, dout[, mask])`: the probabilities
/// recomputed from the log-sum-exp one row at a time.
pub(super) fn backward(inputs: &[Storage]) -> Vec<Storage> {
    let g = Geometry::of(inputs, inputs.get(8));
    let ops = Operands::of(inputs, &g);
    let p = ops.p;
    let out = f64s(&inputs[5], &g.shape(&[p.tq, p.dv]));
    let lse = f64s(&inputs[6], &g.shape(&[p.tq]));
    let dout = f64s(&inputs[7], &g.shape(&[p.tq, p.dv]));
    let flags = inputs.get(8).map(|m| mask_of(m, &g));
    let mask = mask(&flags);
    let (mut dq, mut dk, mut dv) = (vec![0.0f64; ops.q.len()], vec![0.0f64; ops.k.len()], vec![0.0f64; ops.v.len()]);
    let (mut s, mut seen) = (vec![0.0f64; p.tk], vec![false; p.tk]);
    for b in 0..p.batch {
        for i in 0..p.tq {
            ops.scores(mask.as_ref(), b, i, &mut s, &mut seen);
            let at = b * p.tq + i;
            let (qi, doi) = (&ops.q[at * p.d..][..p.d], &dout[at * p.dv..][..p.dv]);
            let row: f64 = doi.iter().zip(&out[at * p.dv..][..p.dv]).map(|(a, c)| a * c).sum();
            for j in 0..p.tk {
                let key = b * p.tk + j;
                let pj = if seen[j] { (s[j] - lse[at]).exp() } else { 0.0 };
                let vj = &ops.v[key * p.dv..][..p.dv];
                let dp: f64 = doi.iter().zip(vj).map(|(a, c)| a * c).sum();
                let ds = pj * (dp - row) * ops.scale;
                dv[key * p.dv..][..p.dv].iter_mut().zip(doi).for_each(|(g, x)| *g += pj * x);
                let kj = &ops.k[key * p.d..][..p.d];
                dq[at * p.d..][..p.d].iter_mut().zip(kj).for_each(|(g, x)| *g += ds * x);
                dk[key * p.d..][..p.d].iter_mut().zip(qi).for_each(|(g, x)| *g += ds * x);
            }
        }
    }
    let dq = storage(dq, &g.shape(&[p.tq, p.d]));
    let dk = storage(dk, &g.shape(&[p.tk, p.d]));
    let dv = storage(dv, &g.shape(&[p.tk, p.dv]));
    vec![sum_to(dq, &inputs[0]), sum_to(dk, &inputs[1]), sum_to(dv, &inputs[2])]
}
