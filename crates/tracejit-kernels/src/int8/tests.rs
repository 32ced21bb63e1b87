//! Tests of the int8 products: the exact quantized arithmetic recomputed
//! here bit for bit on every path (AMX where this CPU has it, `vpdpbusd`,
//! portable), the error against f64, odd sizes, strides, non-finite
//! values and thread counts.

use std::sync::atomic::Ordering;

use ndarray::{s, Array2, ArrayView2};
use proptest::prelude::*;

use super::kernel::AMX_BLOCKS;
use super::*;
use crate::bf16::tests::{all_paths, with_threads, Rng};
use crate::bf16::tiles::{lhs_slot, with_scratch, OutPtr};

/// Runs `f` and asserts that it ran AMX blocks exactly when
/// `Isa::native()` has AMX int8 (other tests meanwhile only add blocks
/// where AMX exists, so neither side of the check can be fooled).
fn asserting_amx<R>(f: impl FnOnce() -> R) -> R {
    let before = AMX_BLOCKS.load(Ordering::Relaxed);
    let out = f();
    let (ran, has) = (AMX_BLOCKS.load(Ordering::Relaxed) > before, Isa::native().has_amx_int8());
    assert_eq!(ran, has, "the AMX kernel ran: {ran}, has_amx_int8: {has}");
    out
}

/// Every path with whether the portable tile is forced: the native one
/// (AMX where this CPU has it), `vpdpbusd`, the AVX2 tile (on a CPU with
/// AVX2), and the portable tile.
fn every_path() -> [(Isa, bool); 4] {
    let [native, vector, avx2] = all_paths();
    [(native, false), (vector, false), (avx2, false), (avx2, true)]
}

/// Serializes the runs that force the portable tile (a process-wide
/// switch) with each other.
static PORTABLE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `f` with the portable tile forced when `portable`, and asserts
/// that the portable tile ran then if `f` has tiles to run. (Its count,
/// not the AVX2 tile's: other tests may run the AVX2 tile meanwhile, and
/// only forced runs, all under the lock, reach the portable tile on a CPU
/// with AVX2.)
fn run_path(portable: bool, has_tiles: bool, f: impl FnOnce()) {
    use super::kernel::{FORCE_PORTABLE, PORTABLE_TILES};
    let _lock = PORTABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    FORCE_PORTABLE.store(portable, Ordering::Relaxed);
    let before = PORTABLE_TILES.load(Ordering::Relaxed);
    f();
    FORCE_PORTABLE.store(false, Ordering::Relaxed);
    if portable && has_tiles {
        assert!(PORTABLE_TILES.load(Ordering::Relaxed) > before, "the portable tile did not run while forced");
    }
}

/// Scales and levels of the rows of `x`, by the documented symmetric rule.
fn levels(x: ArrayView2<'_, f32>) -> (Vec<f32>, Array2<i64>) {
    levels_with(x, false).0
}

/// Scales and levels of the rows of `x` by the documented rule, rows with
/// no negative value unsigned when `unsigned`; and which rows are.
fn levels_with(x: ArrayView2<'_, f32>, unsigned: bool) -> ((Vec<f32>, Array2<i64>), Vec<bool>) {
    let mut q = Array2::zeros(x.dim());
    let mut forms = Vec::new();
    let scales = x
        .rows()
        .into_iter()
        .zip(q.rows_mut())
        .map(|(row, mut q)| {
            if !row.iter().all(|v| v.is_finite()) {
                forms.push(false);
                return f32::NAN;
            }
            let positive = unsigned && row.iter().all(|&v| v >= 0.0);
            forms.push(positive);
            let (steps, lo, hi) = if positive { (255.0, 0.0, 255.0) } else { (127.0, -127.0, 127.0) };
            let scale = row.iter().fold(0f32, |t, v| t.max(v.abs())) / steps;
            let scale = if scale == 0.0 { 1.0 } else { scale };
            for (q, &v) in q.iter_mut().zip(&row) {
                *q = (v / scale).round_ties_even().clamp(lo, hi) as i64;
            }
            scale
        })
        .collect();
    ((scales, q), forms)
}

/// The documented result, computed independently (i64 sums).
fn exact(a: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>, c0: &[f32], acc: bool) -> Vec<f32> {
    let ((sa, qa), _) = levels_with(a, true);
    let (sw, qw) = levels(w.t());
    let ((m, k), n) = (a.dim(), w.ncols());
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: i64 = (0..k).map(|p| qa[[i, p]] * qw[[j, p]]).sum();
            let y = dot as i32 as f32 * sa[i] * sw[j];
            c[i * n + j] = if acc { c0[i * n + j] + y } else { y };
        }
    }
    c
}

/// `x`'s values with rows stored reversed (a negative row stride).
fn reversed_rows(x: &Array2<f32>) -> Array2<f32> {
    let mut r = x.slice(s![..;-1, ..]).to_owned();
    r.invert_axis(ndarray::Axis(0));
    r
}

fn check_shape(m: usize, k: usize, n: usize, rng: &mut Rng) {
    let (mut a, w) = (rng.matrix(m, k), rng.matrix(k, n));
    // Every third row a relu's output: quantized unsigned.
    a.rows_mut().into_iter().step_by(3).for_each(|mut r| r.mapv_inplace(|v| v.max(0.0)));
    let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform()).collect();
    let packed = PackedI8::quantize(w.view());
    let ((sa, _), _) = levels_with(a.view(), true);
    let want64 = a.mapv(f64::from).dot(&w.mapv(f64::from));
    let a_t = a.t().as_standard_layout().to_owned();
    for acc in [false, true] {
        let want = exact(a.view(), w.view(), &c0, acc);
        for (kind, a) in [a.view(), a_t.t(), reversed_rows(&a).view()].into_iter().enumerate() {
            for (isa, portable) in every_path() {
                let mut c = c0.clone();
                run_path(portable, m * k * n > 0, || gemm_dynamic_i8(a, &packed, &mut c, acc, isa));
                let what = format!("{isa:?} (portable tile forced: {portable}) {m}x{k}x{n} layout {kind} acc {acc}");
                assert!(c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: {c:?} vs {want:?}");
                // The quantization's error bound against f64.
                for i in 0..m {
                    for j in 0..n {
                        let (da, dw) = (f64::from(sa[i]) / 2.0, f64::from(packed.scales()[j]) / 2.0);
                        let bound: f64 = (0..k)
                            .map(|p| f64::from(a[[i, p]]).abs() * dw + f64::from(w[[p, j]]).abs() * da + da * dw)
                            .sum();
                        let base = if acc { f64::from(c0[i * n + j]) } else { 0.0 };
                        let err = (f64::from(c[i * n + j]) - base - want64[[i, j]]).abs();
                        assert!(err <= bound * 1.0001 + 1e-6, "{what}: ({i}, {j}) off by {err} > {bound}");
                    }
                }
            }
        }
    }
}

#[test]
fn products_have_the_documented_bits_at_odd_sizes() {
    let mut rng = Rng::new(21);
    let sizes = [1, 3, 5, 17, 33];
    asserting_amx(|| {
        for &m in &sizes {
            for &k in &sizes {
                for &n in &sizes {
                    check_shape(m, k, n, &mut rng);
                }
            }
        }
        for (m, k, n) in [(1023, 5, 17), (17, 1023, 3), (5, 33, 1023), (64, 130, 49), (9, 4, 96), (40, 300, 70)] {
            check_shape(m, k, n, &mut rng);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random shapes around the AMX tiles' sizes (16 rows, 16 columns, 64
    /// values of depth), signed and unsigned rows, with and without
    /// accumulation, a non-finite value in some: the native path (AMX
    /// where this CPU has it) has the documented bits.
    #[test]
    fn native_products_have_the_documented_bits_at_random_shapes(
        m in 1usize..70, k in 1usize..200, n in 1usize..100, acc: bool, special: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let (mut a, mut w) = (rng.matrix(m, k), rng.matrix(k, n));
        a.rows_mut().into_iter().step_by(3).for_each(|mut r| r.mapv_inplace(|v| v.max(0.0)));
        if special {
            a[[rng.bits() as usize % m, rng.bits() as usize % k]] = f32::INFINITY;
            w[[rng.bits() as usize % k, rng.bits() as usize % n]] = f32::NAN;
        }
        let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform()).collect();
        let packed = PackedI8::quantize(w.view());
        let mut c = c0.clone();
        asserting_amx(|| gemm_dynamic_i8(a.view(), &packed, &mut c, acc, Isa::native()));
        let want = exact(a.view(), w.view(), &c0, acc);
        let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        prop_assert!(same, "{}x{}x{} acc {}: {:?} vs {:?}", m, k, n, acc, c, want);
    }
}

#[test]
fn quantization_follows_the_rule_on_both_paths() {
    let mut rng = Rng::new(2);
    // Ties, zeros, a huge and a tiny row, a non-finite one, and rows with
    // no negative value (unsigned: a relu's output, with -0.0 and a tie).
    let mut a = rng.matrix(8, 77);
    a.row_mut(1).fill(0.0);
    a.row_mut(2).iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 38.0) * 0.5);
    a.row_mut(3).mapv_inplace(|v| v * 1e-42);
    a.row_mut(4).mapv_inplace(|v| v * 3e38);
    a[[5, 60]] = f32::NEG_INFINITY;
    a.row_mut(6).mapv_inplace(|v| v.max(0.0));
    a[[6, 3]] = -0.0;
    a.row_mut(7).iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 * 0.5);
    let ((want_scales, want_q), want_unsigned) = levels_with(a.view(), true);
    assert_eq!(want_unsigned, [false, true, false, false, false, false, true, true]);
    for isa in all_paths() {
        let kw = 77usize.div_ceil(4);
        let mut forms = vec![quantize::RowForm { scale: 0.0, unsigned: false }; 8];
        with_scratch(lhs_words(8, kw, isa), |lhs| {
            quantize::pack_lhs(a.view(), lhs, &mut forms, isa);
            let bytes = crate::bf16::tiles::bytes_mut(lhs);
            for i in 0..8 {
                let offset = if want_unsigned[i] { 0 } else { 128 };
                for p in 0..77 {
                    let at = 4 * lhs_slot(panel_rows(isa), 8, kw, i, p / 64) + 4 * (p % 64 / 4) + p % 4;
                    let q = if want_scales[i].is_nan() { 0 } else { want_q[[i, p]] };
                    assert_eq!(i64::from(bytes[at]) - offset, q, "{isa:?} ({i}, {p})");
                }
            }
        });
        for (i, got) in forms.iter().enumerate() {
            assert_eq!(
                (got.scale.to_bits(), got.unsigned),
                (want_scales[i].to_bits(), want_unsigned[i]),
                "{isa:?} {i}"
            );
        }
    }
}

#[test]
fn non_finite_rows_and_columns_give_nan() {
    let mut rng = Rng::new(4);
    let (mut a, mut w) = (rng.matrix(5, 9), rng.matrix(9, 20));
    a[[1, 3]] = f32::NAN;
    w[[8, 17]] = f32::INFINITY;
    let packed = PackedI8::quantize(w.view());
    assert!(packed.scales()[17].is_nan() && packed.scales()[16].is_finite());
    for isa in all_paths() {
        for acc in [false, true] {
            let mut c = vec![1f32; 5 * 20];
            gemm_dynamic_i8(a.view(), &packed, &mut c, acc, isa);
            for (i, v) in c.iter().enumerate() {
                assert_eq!(v.is_nan(), i / 20 == 1 || i % 20 == 17, "{isa:?} {acc}: c[{i}] = {v}");
            }
        }
    }
}

#[test]
fn empty_sizes_write_zeros_or_nothing() {
    let w = PackedI8::quantize(Array2::<f32>::zeros((0, 3)).view());
    assert_eq!(w.scales(), [1.0; 3]);
    for isa in all_paths() {
        let mut c = vec![5.0f32; 6];
        gemm_dynamic_i8(Array2::<f32>::zeros((2, 0)).view(), &w, &mut c, true, isa);
        assert_eq!(c, [5.0; 6]);
        gemm_dynamic_i8(Array2::<f32>::zeros((2, 0)).view(), &w, &mut c, false, isa);
        assert_eq!(c, [0.0; 6]);
        let w = PackedI8::quantize(Array2::<f32>::zeros((4, 0)).view());
        gemm_dynamic_i8(Array2::<f32>::zeros((2, 4)).view(), &w, &mut [], false, isa);
        let w = PackedI8::quantize(Array2::<f32>::zeros((4, 3)).view());
        gemm_dynamic_i8(Array2::<f32>::zeros((0, 4)).view(), &w, &mut [], false, isa);
    }
}

/// Blocks the pool never uses (starting inside a panel or a register)
/// give the bits of the whole product too.
#[test]
fn any_blocks_give_the_bits_of_the_whole() {
    let mut rng = Rng::new(6);
    let (m, k, n) = (37, 23, 101);
    let (mut a, w) = (rng.matrix(m, k), PackedI8::quantize(rng.matrix(k, n).view()));
    a.rows_mut().into_iter().step_by(2).for_each(|mut r| r.mapv_inplace(f32::abs));
    for isa in all_paths() {
        let mut whole = vec![0f32; m * n];
        gemm_dynamic_i8(a.view(), &w, &mut whole, false, isa);
        let mut parts = vec![0f32; m * n];
        let (kw, mut forms) = (k.div_ceil(4), vec![quantize::RowForm { scale: 0.0, unsigned: false }; m]);
        with_scratch(lhs_words(m, kw, isa), |lhs| {
            quantize::pack_lhs(a.view(), lhs, &mut forms, isa);
            let row_scales: Vec<f32> = forms.iter().map(|f| f.scale).collect();
            let unsigned_rows: Vec<bool> = forms.iter().map(|f| f.unsigned).collect();
            let ep = kernel::Epilogue {
                c: OutPtr(parts.as_mut_ptr()),
                n,
                accumulate: false,
                row_scales: &row_scales,
                unsigned_rows: &unsigned_rows,
                col_scales: &w.scales,
                starts: &w.starts,
            };
            for rows in [0..3, 3..8, 8..21, 21..37] {
                for cols in [0..7, 7..16, 16..50, 50..101] {
                    // SAFETY: disjoint blocks of `parts`, sized m×n.
                    unsafe { kernel::run_block(lhs, m, w.words.words(), kw, rows.clone(), cols, &ep, isa) };
                }
            }
        });
        assert!(whole.iter().zip(&parts).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa:?}");
    }
}

#[test]
fn thread_counts_give_the_same_bits() {
    let mut rng = Rng::new(8);
    for (m, k, n) in [(70, 333, 1023), (1023, 65, 130)] {
        let (a, w) = (rng.matrix(m, k), PackedI8::quantize(rng.matrix(k, n).view()));
        for isa in all_paths() {
            let runs: Vec<Vec<f32>> = [1, 2, 3]
                .iter()
                .map(|&t| {
                    with_threads(t, || {
                        let mut c = vec![0f32; m * n];
                        gemm_dynamic_i8(a.view(), &w, &mut c, false, isa);
                        c
                    })
                })
                .collect();
            for c in &runs[1..] {
                assert!(c.iter().zip(&runs[0]).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa:?} {m}x{k}x{n}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "gemm_dynamic_i8: a [2, 3] times a quantized w [4, 5]")]
fn mismatched_sizes_panic_with_the_sizes() {
    let w = PackedI8::quantize(Array2::<f32>::zeros((4, 5)).view());
    gemm_dynamic_i8(Array2::<f32>::zeros((2, 3)).view(), &w, &mut [0.0; 10], false, Isa::native());
}

#[test]
fn the_avx2_tile_runs_where_avx2_has_no_vnni() {
    use super::kernel::AVX2_TILES;
    let isa = Isa::native().with_avx512(false);
    if isa.width().is_none() {
        // A CPU without AVX2 has no such tile; the portable one is checked
        // on every path above.
        return;
    }
    let mut rng = Rng::new(5);
    let (a, w) = (rng.matrix(13, 300), rng.matrix(300, 70));
    let packed = PackedI8::quantize(w.view());
    let mut c = vec![0.0; 13 * 70];
    let _lock = PORTABLE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = AVX2_TILES.load(Ordering::Relaxed);
    gemm_dynamic_i8(a.view(), &packed, &mut c, false, isa);
    assert!(AVX2_TILES.load(Ordering::Relaxed) > before, "the AVX2 tile did not run");
    assert_eq!(
        c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        exact(a.view(), w.view(), &[0.0; 13 * 70], false).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
