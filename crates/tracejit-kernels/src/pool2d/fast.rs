//! The 2x2 stride-2 pool without padding (the workloads' pool), whose
//! windows do not overlap, in loops without branches. Each output's
//! operations are the general loops' ([`super::general`]), in the same
//! order — the max of each column pair then of the two columns; the sum of
//! each column pair (from 0) then of the two (from 0), divided by 4; the
//! backward's row-major scan `x[0,0], x[0,1], x[1,0], x[1,1]` and `0 + dy`
//! at the winner; the mean's gradient `0 + (0 + dy / 4)` — so the results
//! are the general loops' bits. Whole rows run in vector code where the
//! CPU has it ([`super::simd`]), the rest here.

use super::general::pick;
use super::{takes, Pool2dGeometry};
use crate::Width;

/// The pass a plane runs.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pass {
    /// Max forward.
    Max,
    /// Max backward.
    MaxBack,
    /// Mean forward.
    Avg,
    /// Mean backward.
    AvgBack,
}

/// One plane of `pass`, in vector code of width `w` if given (the CPU has
/// it): `src` is `x` (`dy` for [`Pass::AvgBack`]), `dy` the max backward's,
/// `out` the output plane (overwritten).
pub(super) fn plane(w: Option<Width>, pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = w {
        // SAFETY: the caller's width came from `Isa::width` (or a test
        // that checked the CPU).
        return unsafe { super::simd::plane(w, pass, g, src, dy, out) };
    }
    let _ = w;
    if matches!(pass, Pass::MaxBack | Pass::AvgBack) && (g.in_h % 2 == 1 || g.in_w % 2 == 1) {
        out.fill(0.0);
    }
    for oh in 0..g.out_h() {
        row(pass, g, src, dy, out, oh);
    }
}

/// Output row `oh` (see [`plane`]).
fn row(pass: Pass, g: &Pool2dGeometry, src: &[f32], dy: &[f32], out: &mut [f32], oh: usize) {
    let (iw, ow) = (g.in_w, g.out_w());
    let (r0, r1) = (2 * oh * iw, (2 * oh + 1) * iw);
    for j in 0..ow {
        let (c0, c1) = (2 * j, 2 * j + 1);
        match pass {
            Pass::Max => {
                let (a, b, c, e) = (src[r0 + c0], src[r0 + c1], src[r1 + c0], src[r1 + c1]);
                out[oh * ow + j] = pick(pick(a, c), pick(b, e));
            }
            Pass::Avg => {
                let (a, b, c, e) = (src[r0 + c0], src[r0 + c1], src[r1 + c0], src[r1 + c1]);
                let (s0, s1) = ((0.0 + a) + c, (0.0 + b) + e);
                out[oh * ow + j] = ((0.0 + s0) + s1) / 4.0;
            }
            Pass::AvgBack => {
                let v = 0.0 + (0.0 + src[oh * ow + j] / 4.0);
                for at in [r0 + c0, r0 + c1, r1 + c0, r1 + c1] {
                    out[at] = v;
                }
            }
            Pass::MaxBack => {
                let (a, b, c, e) = (src[r0 + c0], src[r0 + c1], src[r1 + c0], src[r1 + c1]);
                let (mut m, mut at) = (a, r0 + c0);
                for (v, i) in [(b, r0 + c1), (c, r1 + c0), (e, r1 + c1)] {
                    if takes(v, m) {
                        (m, at) = (v, i);
                    }
                }
                for i in [r0 + c0, r0 + c1, r1 + c0, r1 + c1] {
                    out[i] = 0.0;
                }
                out[at] = 0.0 + dy[oh * ow + j];
            }
        }
    }
}
