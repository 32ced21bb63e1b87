//! Tests of the AMX path (`Isa::native()` where the CPU has AMX and the
//! OS grants it): random shapes against the f64 product within the
//! module's bound, NaN and ±Inf as the f64 product of the rounded values
//! has them, the bits of one thread on two. On a CPU without AMX the same
//! tests run the `vdpbf16ps` or portable path (the AMX code cannot run
//! there); each test asserts that the AMX kernel ran exactly where
//! `has_amx_bf16()` says it can.

use std::sync::atomic::Ordering;

use half::bf16;
use ndarray::Array2;
use proptest::prelude::*;

use super::kernel::AMX_BLOCKS;
use super::tests::{with_threads, Rng};
use super::*;

/// Runs `f` and asserts that it ran AMX blocks exactly when `isa` has
/// AMX bf16 (other tests running meanwhile only add blocks where AMX
/// exists, so neither side of the check can be fooled by them).
fn asserting_amx<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    let before = AMX_BLOCKS.load(Ordering::Relaxed);
    let out = f();
    let ran = AMX_BLOCKS.load(Ordering::Relaxed) > before;
    assert_eq!(ran, isa.has_amx_bf16(), "the AMX kernel ran: {ran}, has_amx_bf16: {}", isa.has_amx_bf16());
    out
}

/// `x` with `specials` entries (at positions from `rng`) set to NaN, +Inf
/// or −Inf.
fn with_specials(mut x: Array2<f32>, specials: usize, rng: &mut Rng) -> Array2<f32> {
    let (r, c) = x.dim();
    for _ in 0..specials.min(r * c) {
        let at = (rng.bits() as usize % r, rng.bits() as usize % c);
        x[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.bits() as usize % 3];
    }
    x
}

/// The AMX product of `a [m, k]` and `b [k, n]` (values in [-1, 1), NaN
/// and ±Inf at a few places) against the f64 product of the bf16-rounded
/// values: the same NaN and infinities, and the finite outputs within
/// the module's bound for inputs already in bf16, `(k + 1) · 2⁻²⁴` times
/// the sum of the terms' sizes (`c₀` counted among them). The same for
/// the f32-lhs entry point, whose rounding is the bf16 one's.
fn check(m: usize, k: usize, n: usize, accumulate: bool, specials: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let a = with_specials(rng.matrix(m, k), specials, &mut rng);
    let b = with_specials(rng.matrix(k, n), specials, &mut rng);
    let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform()).collect();
    let (ar, br) = (a.mapv(|v| bf16::from_f32(v).to_f32()), b.mapv(|v| bf16::from_f32(v).to_f32()));
    let packed = PackedBf16::from_f32_for(b.view(), Isa::native());
    let isa = Isa::native();
    let (mut c, mut c16) = (c0.clone(), c0.clone());
    asserting_amx(isa, || {
        gemm_bf16_from_f32(a.view(), &packed, &mut c, accumulate, isa);
        gemm_bf16(a.mapv(bf16::from_f32).view(), &packed, &mut c16, accumulate, isa);
    });
    assert!(c.iter().zip(&c16).all(|(x, y)| x.to_bits() == y.to_bits()), "the f32 lhs is the bf16 one rounded");
    let eps = (k as f64 + 1.0) * 2f64.powi(-24);
    for i in 0..m {
        for j in 0..n {
            let start = if accumulate { f64::from(c0[i * n + j]) } else { 0.0 };
            let (mut want, mut size) = (start, start.abs());
            for p in 0..k {
                let t = f64::from(ar[[i, p]]) * f64::from(br[[p, j]]);
                want += t;
                size += t.abs();
            }
            let got = c[i * n + j];
            let what = format!("{m}x{k}x{n} acc {accumulate}: c[{i}, {j}] = {got} vs {want}");
            if want.is_nan() {
                assert!(got.is_nan(), "{what}");
            } else if want.is_infinite() {
                assert_eq!(f64::from(got), want, "{what}");
            } else {
                assert!((f64::from(got) - want).abs() <= eps * size, "{what}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random shapes around the tiles' sizes (16 rows, 16 columns, 32
    /// values of depth), with and without accumulation.
    #[test]
    fn amx_products_are_within_the_bound_at_random_shapes(
        m in 1usize..70, k in 1usize..100, n in 1usize..100, accumulate: bool, seed: u64,
    ) {
        check(m, k, n, accumulate, 0, seed);
    }

    /// The same with NaN and infinities in both operands.
    #[test]
    fn amx_products_propagate_nan_and_inf(
        m in 1usize..40, k in 1usize..70, n in 1usize..70, accumulate: bool, specials in 1usize..4, seed: u64,
    ) {
        check(m, k, n, accumulate, specials, seed);
    }
}

/// The degenerate and the tile-sized shapes, and one deep enough for
/// many groups.
#[test]
fn amx_products_at_the_edges_of_the_tiles() {
    for (m, k, n) in [(1, 1, 1), (1, 1, 64), (64, 1, 1), (1, 300, 1), (16, 32, 16), (32, 32, 32), (33, 33, 33)] {
        for accumulate in [false, true] {
            check(m, k, n, accumulate, 0, (m * k * n) as u64);
        }
    }
    check(100, 1000, 70, true, 0, 5);
}

/// Products large enough to be cut into blocks, by rows and by columns
/// (blocks starting inside a 32-row or 32-column strip): the bits of one
/// thread on two and three.
#[test]
fn amx_thread_counts_give_the_same_bits() {
    let mut rng = Rng::new(41);
    for (m, k, n) in [(70, 333, 1023), (1023, 65, 130), (900, 384, 384)] {
        let (a, b) = (rng.matrix(m, k), PackedBf16::from_f32_for(rng.matrix(k, n).view(), Isa::native()));
        let isa = Isa::native();
        let runs: Vec<Vec<f32>> = [1, 2, 3]
            .iter()
            .map(|&t| {
                with_threads(t, || {
                    let mut c = vec![0f32; m * n];
                    asserting_amx(isa, || gemm_bf16_from_f32(a.view(), &b, &mut c, false, isa));
                    c
                })
            })
            .collect();
        for c in &runs[1..] {
            assert!(c.iter().zip(&runs[0]).all(|(x, y)| x.to_bits() == y.to_bits()), "{m}x{k}x{n}");
        }
    }
}
