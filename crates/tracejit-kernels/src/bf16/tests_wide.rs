//! Tests of the wide layout ([`super::wide`]), the bf16 products of a CPU
//! without bf16 instructions: its packing holds each value rounded to
//! bf16 and widened, in its slot, whatever the operand's strides and the
//! thread count; its portable tile has the AVX2 tile's bits, special
//! values and subnormals included; and the AVX2 tile is the one that runs.
//! The products' bound and their bits against the other paths are in
//! `tests` (`routes`).

use std::sync::atomic::Ordering;

use half::bf16;
use ndarray::{s, Array2, ArrayView2};

use super::tests::{layout, special_matrix, with_threads, Rng};
use super::tiles::{groups, lhs_len, lhs_slot, rhs_index, rhs_len, GROUP, MR, NR};
use super::wide::{self, AVX2_TILES, FORCE_PORTABLE, PORTABLE_TILES};
use super::*;

/// Serializes the tests that force the portable tile (only they run it,
/// so its count grows only under this lock; other tests may run the AVX2
/// tile meanwhile).
static TILE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The f32 bits a slot holds for `x`.
fn slot(x: f32) -> u32 {
    bf16::from_f32(x).to_f32().to_bits()
}

/// Three strided views of `x`'s values: row-major, transposed storage,
/// every other column of a wider matrix.
fn views_of<'a>(
    x: &'a Array2<f32>,
    t: &'a Array2<f32>,
    w: &'a Array2<f32>,
) -> [(&'static str, ArrayView2<'a, f32>); 3] {
    [("row-major", x.view()), ("transposed storage", t.view()), ("every other column", w.slice(s![.., ..;2]))]
}

#[test]
fn the_wide_lhs_holds_each_rounded_value_in_its_slot() {
    let mut rng = Rng::new(43);
    for (m, k) in [(1, 1), (2, 2), (5, 3), (7, 33), (13, 5041), (257, 300), (64, 1024)] {
        let x = special_matrix(&mut rng, m, k);
        let t = layout(&x, 1);
        let mut w = special_matrix(&mut rng, m, 2 * k);
        w.slice_mut(s![.., ..;2]).assign(&x);
        let depth = wide::slots(k.div_ceil(2));
        for (name, a) in views_of(&x, &t, &w) {
            for threads in [1, 2] {
                let mut got = vec![u32::MAX; lhs_len(m, depth)];
                with_threads(threads, || pack::pack_lhs_split(a, &mut got, Isa::avx2(), true));
                for i in 0..m {
                    let row: Vec<u32> = (0..groups(depth))
                        .flat_map(|g| got[lhs_slot(MR, m, depth, i, g)..][..GROUP].to_vec())
                        .collect();
                    let want: Vec<u32> =
                        (0..groups(depth) * GROUP).map(|p| if p < k { slot(x[[i, p]]) } else { 0 }).collect();
                    assert!(row == want, "{name} [{m}, {k}] row {i} at {threads} threads");
                }
            }
        }
    }
}

#[test]
fn the_wide_rhs_holds_each_rounded_value_in_its_slot() {
    let mut rng = Rng::new(47);
    for (k, n) in [(1, 1), (3, 5), (33, 64), (300, 257), (65, 1023), (7, 10000)] {
        let x = special_matrix(&mut rng, k, n);
        let t = layout(&x, 1);
        let mut w = special_matrix(&mut rng, k, 2 * n);
        w.slice_mut(s![.., ..;2]).assign(&x);
        let depth = wide::slots(k.div_ceil(2));
        for (name, b) in views_of(&x, &t, &w) {
            for threads in [1, 2] {
                let got = with_threads(threads, || pack::pack_rhs_split(b, Isa::avx2(), true));
                let mut want = vec![0u32; rhs_len(n, depth)];
                for ((p, j), &v) in x.indexed_iter() {
                    want[rhs_index(depth, p, j)] = slot(v);
                }
                assert!(got.words() == want.as_slice(), "{name} [{k}, {n}] at {threads} threads");
            }
        }
    }
}

/// Uniform values with subnormals, NaN, ±Inf and signed zeros, but no
/// product past f32's range (where the FMA and the unfused sum may differ,
/// see `wide`).
fn edgy(rng: &mut Rng, r: usize, c: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |_| match rng.bits() % 12 {
        0 => f32::from_bits(rng.bits() as u32 & 0x807f_ffff),
        1 => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0][rng.bits() as usize % 4],
        _ => rng.uniform(),
    })
}

/// The product of `a` and `b` from `c0` on the wide path, the portable
/// tile forced or not; asserts which tile ran.
fn wide_product(a: &Array2<f32>, b: &PackedBf16, c0: &[f32], accumulate: bool, portable: bool) -> Vec<u32> {
    let _lock = TILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    FORCE_PORTABLE.store(portable, Ordering::Relaxed);
    let counts = || (AVX2_TILES.with(std::cell::Cell::get), PORTABLE_TILES.with(std::cell::Cell::get));
    let before = counts();
    let mut c = c0.to_vec();
    // On this thread, where the tile counts are kept.
    crate::threads::serial(|| gemm_bf16_from_f32(a.view(), b, &mut c, accumulate, Isa::avx2()));
    FORCE_PORTABLE.store(false, Ordering::Relaxed);
    let after = counts();
    if portable || Isa::avx2().width().is_none() {
        assert!(after.1 > before.1, "the portable tile did not run");
    } else {
        assert!(after.0 > before.0, "the AVX2 tile did not run");
        assert_eq!(after.1, before.1, "the portable tile ran unforced");
    }
    c.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_portable_wide_tile_has_the_avx2_tiles_bits() {
    let mut rng = Rng::new(53);
    for (m, k, n) in [(1, 1, 1), (3, 5, 17), (6, 33, 64), (7, 2, 100), (13, 64, 129), (40, 257, 33)] {
        let (a, b) = (edgy(&mut rng, m, k), edgy(&mut rng, k, n));
        let packed = PackedBf16::from_f32_for(b.view(), Isa::avx2());
        assert!(packed.wide || Isa::avx2().width().is_none(), "an AVX2 Isa packs wide");
        let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform()).collect();
        for accumulate in [false, true] {
            let vector = wide_product(&a, &packed, &c0, accumulate, false);
            let portable = wide_product(&a, &packed, &c0, accumulate, true);
            let same = vector
                .iter()
                .zip(&portable)
                .all(|(x, y)| x == y || f32::from_bits(*x).is_nan() && f32::from_bits(*y).is_nan());
            assert!(same, "{m}x{k}x{n} accumulate {accumulate}");
        }
    }
}

#[test]
fn an_avx2_packing_is_wide_and_twice_the_pairs() {
    let b = Array2::from_shape_fn((33, 70), |(i, j)| (i * 70 + j) as f32);
    let (pairs, wide) =
        (PackedBf16::from_f32_for(b.view(), Isa::native()), PackedBf16::from_f32_for(b.view(), Isa::avx2()));
    assert_eq!(wide.wide, Isa::avx2().width().is_some());
    if wide.wide && !pairs.wide {
        assert_eq!(wide.words.words().len(), rhs_len(70, 34));
        assert_eq!(pairs.words.words().len(), rhs_len(70, 17));
        assert_eq!(NR % 16, 0);
    }
}
