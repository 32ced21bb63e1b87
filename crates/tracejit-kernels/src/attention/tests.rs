//! The attention kernels against the f64 reference ([`super::reference`]),
//! on random problems of odd sizes, every path, masks, special values and
//! thread counts.

use super::paths::Path;
use super::reference::{loss, reference, sees, Reference};
use super::{backward_on, forward_on, Grads, Mask, Operand, Problem};
use crate::threads::set_num_threads;
use crate::Isa;

/// The relative tolerance of every comparison: against the sum of the
/// terms' magnitudes (see the reference), which f32 products in any order
/// stay well within.
const TOL: f64 = 1e-5;

/// Every path this CPU runs: AVX-512, AVX2, portable (duplicates
/// removed where the CPU lacks a width).
pub(super) fn paths() -> Vec<Path> {
    let mut v = vec![Path::of(Isa::native()), Path::of(Isa::native().with_avx512(false)), Path::Portable];
    v.dedup();
    v
}

/// xorshift32.
pub(super) struct Rng(pub u32);

impl Rng {
    pub fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    /// Uniform in `[-a, a)`.
    pub fn uniform(&mut self, a: f32) -> f32 {
        (self.next() >> 8) as f32 / (1 << 24) as f32 * 2.0 * a - a
    }
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(a)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }
}

/// One problem's operands.
pub(super) struct Case {
    pub p: Problem,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub dout: Vec<f32>,
}

impl Case {
    pub fn random(rng: &mut Rng, p: Problem) -> Case {
        let (b, tq, tk, d, dv) = (p.batch, p.tq, p.tk, p.d, p.dv);
        Case {
            p,
            q: rng.vec(b * tq * d, 2.0),
            k: rng.vec(b * tk * d, 2.0),
            v: rng.vec(b * tk * dv, 1.0),
            dout: rng.vec(b * tq * dv, 1.0),
        }
    }
}

/// What one path computed.
#[derive(Clone, PartialEq)]
struct Run {
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

impl Run {
    /// Bit patterns, so that NaNs compare equal to themselves.
    fn bits(&self) -> Vec<u32> {
        [&self.out, &self.lse, &self.dq, &self.dk, &self.dv]
            .iter()
            .flat_map(|v| v.iter().map(|x| x.to_bits()))
            .collect()
    }
}

/// Forward then backward on `path`, outputs pre-filled with junk so that
/// anything left unwritten shows; once on packed operands and once on the
/// same values read in place from [`Spread`] buffers, which must give the
/// same bits.
fn run(path: Path, c: &Case, mask: Option<&Mask<'_>>) -> Run {
    let packed = run_on(path, c, mask, false);
    let spread = run_on(path, c, mask, true);
    assert!(packed.bits() == spread.bits(), "operands read in place differ from packed ones: {:?}", c.p);
    packed
}

/// An operand `[batch, rows, cols]` spread out as a view of a larger
/// tensor: rows `cols + 3` apart, problems in reverse order, NaN in every
/// gap (so a read outside the rows shows in the results).
pub(super) struct Spread {
    pub data: Vec<f32>,
    pub starts: Vec<usize>,
    pub row_stride: usize,
}

impl Spread {
    pub fn new(x: &[f32], batch: usize, rows: usize, cols: usize) -> Spread {
        let row_stride = cols + 3;
        let per = rows * row_stride + 5;
        let mut data = vec![f32::NAN; batch * per + 1];
        let starts: Vec<usize> = (0..batch).map(|b| (batch - 1 - b) * per + 1).collect();
        for (b, &s) in starts.iter().enumerate() {
            for r in 0..rows {
                let at = s + r * row_stride;
                data[at..at + cols].copy_from_slice(&x[(b * rows + r) * cols..][..cols]);
            }
        }
        Spread { data, starts, row_stride }
    }

    /// `x` spread out ([`Spread::new`]) or packed, problem after problem.
    pub fn laid(x: &[f32], batch: usize, rows: usize, cols: usize, spread: bool) -> Spread {
        if spread {
            return Spread::new(x, batch, rows, cols);
        }
        Spread { data: x.to_vec(), starts: (0..batch).map(|b| b * rows * cols).collect(), row_stride: cols }
    }

    pub fn operand(&self) -> Operand<'_> {
        Operand { data: &self.data, starts: &self.starts, row_stride: self.row_stride }
    }
}

/// [`run`] on packed operands or on spread ones.
fn run_on(path: Path, c: &Case, mask: Option<&Mask<'_>>, spread: bool) -> Run {
    let p = &c.p;
    let lay = |x: &[f32], rows: usize, cols: usize| Spread::laid(x, p.batch, rows, cols, spread);
    let (q, k, v) = (lay(&c.q, p.tq, p.d), lay(&c.k, p.tk, p.d), lay(&c.v, p.tk, p.dv));
    let mut out = vec![7.0f32; p.batch * p.tq * p.dv];
    let mut lse = vec![7.0f32; p.batch * p.tq];
    forward_on(path, p, q.operand(), k.operand(), v.operand(), mask, None, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (vec![7.0f32; c.q.len()], vec![7.0f32; c.k.len()], vec![7.0f32; c.v.len()]);
    let g = Grads { dq: &mut dq, dk: &mut dk, dv: &mut dv };
    let (o, dout) = (lay(&out, p.tq, p.dv), lay(&c.dout, p.tq, p.dv));
    backward_on(path, p, [q.operand(), k.operand(), v.operand()], mask, o.operand(), &lse, dout.operand(), g);
    Run { out, lse, dq, dk, dv }
}

/// `got` within `TOL · mag` of `want`, or both NaN.
fn close(what: &str, p: &Problem, got: &[f32], want: &[f64], mag: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (n, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let g = f64::from(g);
        let ok = if w.is_nan() { g.is_nan() } else { (g - w).abs() <= TOL * m + 1e-30 || g == w };
        assert!(ok, "{what}[{n}] of {p:?}: got {g:e}, want {w:e} (magnitude {m:e})");
    }
}

/// Every output of `r` against the reference.
fn check(c: &Case, r: &Run, want: &Reference) {
    let p = &c.p;
    close("out", p, &r.out, &want.out, &want.out_mag);
    for (n, (&g, &w)) in r.lse.iter().zip(&want.lse).enumerate() {
        let g = f64::from(g);
        let ok = if w.is_nan() { g.is_nan() } else { g == w || (g - w).abs() <= TOL * (1.0 + w.abs()) };
        assert!(ok, "lse[{n}] of {p:?}: got {g:e}, want {w:e}");
    }
    close("dq", p, &r.dq, &want.dq, &want.dq_mag);
    close("dk", p, &r.dk, &want.dk, &want.dk_mag);
    close("dv", p, &r.dv, &want.dv, &want.dv_mag);
}

/// Every path against the reference, all giving the same bits.
fn check_all_paths(c: &Case, mask: Option<&Mask<'_>>) {
    let want = reference(&c.p, &c.q, &c.k, &c.v, mask, &c.dout);
    let mut first: Option<Run> = None;
    for path in paths() {
        let r = run(path, c, mask);
        check(c, &r, &want);
        match &first {
            None => first = Some(r),
            Some(f) => assert!(f.bits() == r.bits(), "{path:?} differs in bits from the first path on {:?}", c.p),
        }
    }
}

const SIZES: [usize; 7] = [0, 1, 3, 5, 17, 33, 130];

/// Random problem `n` of a series over the odd sizes (the first seven
/// take each size of each dimension at least once), causal when `n` is
/// even, `tq ≠ tk` included, `scale = 1/√d`.
pub(super) fn random_problem(rng: &mut Rng, n: usize) -> Problem {
    let mut pick = |at: usize| if n < 7 { SIZES[(n + at) % 7] } else { SIZES[rng.below(7)] };
    let (tq, tk) = (pick(0), pick(3));
    let (d, dv) = (pick(5), pick(6));
    let scale = 1.0 / (d.max(1) as f32).sqrt();
    Problem { batch: 1 + rng.below(3), tq, tk, d, dv, scale, causal: n.is_multiple_of(2) }
}

/// Random problems over the odd sizes (each size of each dimension at
/// least once), causal or not, `tq ≠ tk` included.
#[test]
fn random_problems_match_the_reference_on_every_path() {
    let mut rng = Rng(0x2545_f491);
    for n in 0..48 {
        let p = random_problem(&mut rng, n);
        let c = Case::random(&mut rng, p);
        check_all_paths(&c, None);
    }
}

/// The causal rule with more queries than keys and fewer, on sizes that
/// cross tiles and blocks.
#[test]
fn causal_with_unequal_lengths() {
    let mut rng = Rng(77);
    for (tq, tk) in [(130, 33), (33, 130), (1, 130), (130, 1), (70, 200), (200, 70), (65, 64)] {
        let p = Problem { batch: 2, tq, tk, d: 17, dv: 5, scale: 0.3, causal: true };
        check_all_paths(&Case::random(&mut rng, p), None);
    }
}

/// Masks with every axis broadcast in turn, alone and with the causal rule.
#[test]
fn masks_with_broadcast_strides() {
    let mut rng = Rng(99);
    let (batch, tq, tk) = (2, 33, 70);
    let data: Vec<bool> = (0..batch * tq * tk).map(|_| rng.below(4) != 0).collect();
    let strides = [(tq * tk, tk, 1), (0, tk, 1), (tq * tk, 0, 1), (tq * tk, tk, 0), (0, 0, 1), (tk, 1, tq)];
    for (n, &(bs, rs, cs)) in strides.iter().enumerate() {
        let mask = Mask { data: &data, batch_stride: bs, row_stride: rs, col_stride: cs };
        let p = Problem { batch, tq, tk, d: 5, dv: 17, scale: 0.4, causal: n % 2 == 1 };
        check_all_paths(&Case::random(&mut rng, p), Some(&mask));
        let p = Problem { causal: !p.causal, ..p };
        check_all_paths(&Case::random(&mut rng, p), Some(&mask));
    }
}

/// Key masks (one row for all queries, as padding masks are) across tiles
/// and blocks: a problem with every key masked, one whose first block of
/// keys is masked (its queries see a key only in a later block), and one
/// with random padding, with and without the causal rule, `tq` above and
/// below `tk`.
#[test]
fn key_masks_across_tiles_and_blocks() {
    let mut rng = Rng(0x6b6d);
    for (tq, tk) in [(130, 150), (150, 130), (70, 70)] {
        let batch = 3;
        let data: Vec<bool> = (0..batch * tk)
            .map(|n| match n / tk {
                0 => false,
                1 => n % tk >= 64,
                _ => rng.below(3) != 0,
            })
            .collect();
        let mask = Mask { data: &data, batch_stride: tk, row_stride: 0, col_stride: 1 };
        for causal in [false, true] {
            let p = Problem { batch, tq, tk, d: 7, dv: 9, scale: 0.4, causal };
            let c = Case::random(&mut rng, p);
            check_all_paths(&c, Some(&mask));
            let r = run(Path::of(Isa::native()), &c, Some(&mask));
            assert!(r.lse[..tq].iter().all(|&x| x == f32::NEG_INFINITY), "a fully masked problem sees no key");
            assert!(r.out[..tq * 9].iter().all(|&x| x == 0.0));
        }
    }
}

/// Queries that see no key: zeros, `lse = -inf`, no gradient.
#[test]
fn fully_masked_rows_give_zeros() {
    let mut rng = Rng(5);
    let (tq, tk) = (20, 40);
    // Queries 3 and 17 see nothing.
    let data: Vec<bool> = (0..tq * tk).map(|n| n / tk != 3 && n / tk != 17 && rng.below(3) != 0).collect();
    let mask = Mask { data: &data, batch_stride: 0, row_stride: tk, col_stride: 1 };
    let p = Problem { batch: 2, tq, tk, d: 8, dv: 8, scale: 0.5, causal: false };
    let c = Case::random(&mut rng, p);
    check_all_paths(&c, Some(&mask));
    let r = run(Path::of(Isa::native()), &c, Some(&mask));
    for b in 0..2 {
        for i in [3, 17] {
            let row = b * tq + i;
            assert_eq!(r.lse[row], f32::NEG_INFINITY);
            assert!(r.out[row * 8..][..8].iter().chain(&r.dq[row * 8..][..8]).all(|&x| x == 0.0));
        }
    }
    // Causal with more queries than keys: the first tq - tk see nothing.
    let p = Problem { batch: 1, tq: 40, tk: 10, d: 3, dv: 4, scale: 1.0, causal: true };
    let c = Case::random(&mut rng, p);
    let r = run(Path::of(Isa::native()), &c, None);
    assert!(r.lse[..30].iter().all(|&x| x == f32::NEG_INFINITY) && r.lse[30..].iter().all(|x| x.is_finite()));
    assert!(r.out[..30 * 4].iter().chain(&r.dq[..30 * 3]).all(|&x| x == 0.0));
}

/// A size of 0 anywhere: nothing to compute, every output written.
#[test]
fn zero_sizes_fill_the_outputs() {
    let mut rng = Rng(11);
    for dims in [[0, 3, 4, 5, 6], [2, 0, 4, 5, 6], [2, 3, 0, 5, 6], [2, 3, 4, 0, 6], [2, 3, 4, 5, 0]] {
        for causal in [false, true] {
            let [batch, tq, tk, d, dv] = dims;
            let p = Problem { batch, tq, tk, d, dv, scale: 0.5, causal };
            let c = Case::random(&mut rng, p);
            check_all_paths(&c, None);
            if tk == 0 {
                let r = run(Path::Portable, &c, None);
                assert!(r.out.iter().chain(&r.dq).all(|&x| x == 0.0) && r.lse.iter().all(|&x| x == f32::NEG_INFINITY));
            }
        }
    }
}

/// NaN and Inf in the inputs: NaN exactly where the plain formula has it.
#[test]
fn nan_and_inf_propagate_as_the_plain_formula() {
    let mut rng = Rng(3);
    let p = Problem { batch: 1, tq: 20, tk: 30, d: 4, dv: 3, scale: 0.5, causal: false };
    let base = Case::random(&mut rng, p);
    let poke = |f: &dyn Fn(&mut Case)| {
        let mut c = Case { q: base.q.clone(), k: base.k.clone(), v: base.v.clone(), dout: base.dout.clone(), ..base };
        f(&mut c);
        c
    };
    let cases = [
        poke(&|c| c.q[5 * 4 + 1] = f32::NAN),
        poke(&|c| c.k[7 * 4] = f32::NAN),
        poke(&|c| c.v[9 * 3 + 2] = f32::INFINITY),
        poke(&|c| c.q[2 * 4..3 * 4].copy_from_slice(&[f32::INFINITY, 1.0, 1.0, 1.0])),
        poke(&|c| c.q[4 * 4..5 * 4].copy_from_slice(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0])),
        poke(&|c| c.dout[6 * 3] = f32::NAN),
    ];
    for c in &cases {
        check_all_paths(c, None);
        let r = run(Path::Portable, c, None);
        // The pattern is the reference's (above); it is not empty.
        assert!(r.out.iter().chain(&r.dq).any(|x| !x.is_finite()));
    }
    // Unmasked scores all -inf make the row NaN: k's first column +1 and
    // q's row -inf there, 0 elsewhere. Under the causal rule with a NaN
    // key, queries that do not see it stay finite.
    let mut c = poke(&|c| c.q[4 * 4..5 * 4].copy_from_slice(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0]));
    (0..30).for_each(|j| c.k[j * 4] = 1.0);
    check_all_paths(&c, None);
    assert!(run(Path::Portable, &c, None).out[4 * 3..5 * 3].iter().all(|x| x.is_nan()));
    let p = Problem { causal: true, ..p };
    let c = Case { p, ..poke(&|c| c.k[25 * 4] = f32::NAN) };
    check_all_paths(&c, None);
    let r = run(Path::Portable, &c, None);
    let off = 10;
    for i in 0..20 {
        let nan = r.out[i * 3].is_nan();
        assert_eq!(nan, 25 <= i + off, "query {i}");
    }
}

/// 1, 2 and 3 threads give the same bits (on problems large enough for
/// the pool), and they match the reference.
#[test]
fn thread_counts_give_the_same_bits() {
    let _guard = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(21);
    let data: Vec<bool> = (0..130 * 150).map(|_| rng.below(5) != 0).collect();
    let mask = Mask { data: &data, batch_stride: 0, row_stride: 150, col_stride: 1 };
    for (causal, mask) in [(true, None), (false, Some(&mask)), (true, Some(&mask))] {
        let p = Problem { batch: 3, tq: 130, tk: 150, d: 33, dv: 64, scale: 0.2, causal };
        let c = Case::random(&mut rng, p);
        let want = reference(&c.p, &c.q, &c.k, &c.v, mask, &c.dout);
        for path in paths() {
            let mut first: Option<Vec<u32>> = None;
            for n in [1, 2, 3] {
                set_num_threads(n);
                let dispatches = crate::threads::pool_dispatches();
                let r = run(path, &c, mask);
                // Both passes went to the pool (when the count allows),
                // on packed and on spread operands.
                let split = crate::threads::pool_dispatches() - dispatches;
                assert!(
                    n == 1 || split == 4 || crate::threads::num_threads() != n,
                    "{split} dispatches at {n} threads"
                );
                check(&c, &r, &want);
                match &first {
                    None => first = Some(r.bits()),
                    Some(f) => assert!(*f == r.bits(), "{path:?}: {n} threads differ from 1"),
                }
            }
        }
    }
    set_num_threads(0);
}

/// The reference's closed-form gradients against central differences of
/// its own loss, so that the tests above compare with the right thing.
#[test]
fn the_reference_gradients_match_finite_differences() {
    let mut rng = Rng(8);
    let data: Vec<bool> = (0..5 * 7).map(|_| rng.below(4) != 0).collect();
    let mask = Mask { data: &data, batch_stride: 0, row_stride: 7, col_stride: 1 };
    let p = Problem { batch: 1, tq: 5, tk: 7, d: 3, dv: 2, scale: 0.7, causal: true };
    let c = Case::random(&mut rng, p);
    let r = reference(&p, &c.q, &c.k, &c.v, Some(&mask), &c.dout);
    let fd = |which: usize, n: usize| {
        let mut ops = [c.q.clone(), c.k.clone(), c.v.clone()];
        let x = ops[which][n];
        let (hi, lo) = (x + 1e-3, x - 1e-3);
        ops[which][n] = hi;
        let up = loss(&p, &ops[0], &ops[1], &ops[2], Some(&mask), &c.dout);
        ops[which][n] = lo;
        let down = loss(&p, &ops[0], &ops[1], &ops[2], Some(&mask), &c.dout);
        (up - down) / (f64::from(hi) - f64::from(lo))
    };
    for (which, grad) in [(0, &r.dq), (1, &r.dk), (2, &r.dv)] {
        for (n, &g) in grad.iter().enumerate() {
            let f = fd(which, n);
            assert!((f - g).abs() <= 1e-5 * (1.0 + g.abs()), "operand {which}[{n}]: closed form {g}, differences {f}");
        }
    }
    // Keys masked for every query get no gradient.
    for j in 0..7 {
        if (0..5).all(|i| !sees(&p, Some(&mask), 0, i, j)) {
            assert!(r.dk[j * 3..][..3].iter().chain(&r.dv[j * 2..][..2]).all(|&x| x == 0.0));
        }
    }
}

/// A call's scratch does not grow with the sequence lengths: one buffer
/// per thread of `O(TILE·(d + dv))` floats.
#[test]
fn scratch_is_independent_of_the_sequence_lengths() {
    let (f, b) = (super::online::scratch_len(64, 64), super::gradients::scratch_len(64, 64));
    // [d + dv + BLOCK, TILE] plus per-query vectors; twice as many regions
    // in the backward. Against 4096 × 4096 × 4 bytes = 64 MiB of scores.
    assert!(f <= 64 * (64 + 64 + 64 + 4 * 16), "forward scratch {f} floats");
    assert!(b <= 64 * (2 * 64 + 2 * 64 + 2 * 64 + 2 * 16), "backward scratch {b} floats");
    assert!(f * 4 < 64 << 10 && b * 4 < 160 << 10);
}

/// The public entry points run the path their `Isa` names.
#[test]
fn the_public_functions_follow_the_isa() {
    let mut rng = Rng(31);
    let p = Problem { batch: 2, tq: 17, tk: 33, d: 5, dv: 3, scale: 0.5, causal: true };
    let c = Case::random(&mut rng, p);
    for isa in [Isa::native(), Isa::native().with_avx512(false)] {
        let want = run(Path::of(isa), &c, None);
        let mut got = want.clone();
        super::forward(&p, &c.q, &c.k, &c.v, None, &mut got.out, &mut got.lse, isa);
        let (dq, dk, dv) = (&mut got.dq, &mut got.dk, &mut got.dv);
        super::backward(&p, &c.q, &c.k, &c.v, None, &want.out, &want.lse, &c.dout, dq, dk, dv, isa);
        assert!(got.bits() == want.bits(), "{isa:?}");
    }
}

#[test]
#[should_panic(expected = "attention::forward: q has 5 values, expected batch 1 × tq 2 × d 3 = 6")]
fn a_short_operand_panics_with_the_sizes() {
    let p = Problem { batch: 1, tq: 2, tk: 2, d: 3, dv: 1, scale: 1.0, causal: false };
    let (mut out, mut lse) = ([0.0; 2], [0.0; 2]);
    super::forward(&p, &[0.0; 5], &[0.0; 6], &[0.0; 2], None, &mut out, &mut lse, Isa::native());
}

#[test]
#[should_panic(expected = "attention::backward: mask of 3 values is too short")]
fn a_short_mask_panics() {
    let p = Problem { batch: 1, tq: 2, tk: 2, d: 1, dv: 1, scale: 1.0, causal: false };
    let mask = Mask { data: &[true; 3], batch_stride: 0, row_stride: 2, col_stride: 1 };
    let (z, mut g) = ([0.0f32; 2], [[0.0f32; 2]; 3]);
    let [dq, dk, dv] = &mut g;
    super::backward(&p, &z, &z, &z, Some(&mask), &z, &z, &z, dq, dk, dv, Isa::native());
}

/// A strided operand whose rows reach past its data, or with a start per
/// problem missing, is refused with the sizes before anything is read.
#[test]
fn strided_operands_past_their_data_panic_naming_them() {
    let p = Problem { batch: 2, tq: 3, tk: 3, d: 4, dv: 4, scale: 0.5, causal: false };
    let data = vec![0.0f32; 40];
    let good = Operand { data: &data, starts: &[0, 20], row_stride: 6 };
    let (mut out, mut lse) = (vec![0.0f32; 24], vec![0.0f32; 6]);
    let past = Operand { data: &data, starts: &[0, 30], row_stride: 6 };
    let err = std::panic::catch_unwind(|| {
        super::forward_strided(&p, good, past, good, None, &mut out.clone(), &mut lse.clone(), crate::Isa::native())
    })
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains(
            "attention::forward: k's problem 1 (3 rows of 4 values from 30, 6 apart) reaches past its 40 values"
        ),
        "{msg}"
    );
    let short = Operand { data: &data, starts: &[0], row_stride: 6 };
    let err = std::panic::catch_unwind(move || {
        super::forward_strided(&p, short, good, good, None, &mut out, &mut lse, crate::Isa::native())
    })
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("q has 1 problem starts, expected batch 2"), "{msg}");
}

/// `exp_flushed` at every width: 0 below the floor (`-inf` included),
/// `fastmath::exp` bit for bit from the floor up, NaN kept.
#[test]
fn flushed_exp_is_zero_below_the_floor_and_exp_above() {
    use super::vector::{Portable, Vector, EXP_FLOOR};
    let xs = [f32::NEG_INFINITY, -1e30, -104.0, -87.5, -87.000_01, EXP_FLOOR, -86.9, -20.0, 0.0, 1.5, 88.0, f32::NAN];
    let want: Vec<u32> =
        xs.iter().map(|&x| if x < EXP_FLOOR { 0 } else { crate::fastmath::exp(x).to_bits() }).collect();
    assert!(crate::fastmath::exp(EXP_FLOOR) >= f32::MIN_POSITIVE, "the floor's exp must be normal");
    fn run<V: Vector>(xs: &[f32]) -> Vec<u32> {
        let mut out = vec![0f32; xs.len().div_ceil(V::LANES) * V::LANES];
        let mut src = out.clone();
        src[..xs.len()].copy_from_slice(xs);
        for (i, o) in src.chunks(V::LANES).zip(out.chunks_mut(V::LANES)) {
            // SAFETY: whole vectors; the width's features are checked by the caller.
            unsafe { V::load(i.as_ptr()).exp_flushed().store(o.as_mut_ptr()) };
        }
        out[..xs.len()].iter().map(|x| x.to_bits()).collect()
    }
    let check = |got: Vec<u32>, width: &str| {
        for ((g, w), x) in got.iter().zip(&want).zip(xs) {
            let ok = if x.is_nan() { f32::from_bits(*g).is_nan() } else { g == w };
            assert!(ok, "{width}: exp_flushed({x}) = {} want {}", f32::from_bits(*g), f32::from_bits(*w));
        }
    };
    check(run::<Portable>(&xs), "portable");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m256, __m512};
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            check(run::<__m256>(&xs), "avx2");
        }
        if std::is_x86_feature_detected!("avx512f") {
            check(run::<__m512>(&xs), "avx512");
        }
    }
}
