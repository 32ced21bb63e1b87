//! Tests of the bf16 conversions and products against `half` and f64
//! references, on every path, at odd sizes, for several strides and
//! thread counts: the `vdpbf16ps` and the portable paths with the same
//! bits, the AMX one (where this CPU has it) within the same bound. More
//! of the AMX path in `tests_amx`.

use half::bf16;
use ndarray::{s, Array2, ArrayView2};

use super::tiles::{lhs_len, with_scratch, OutPtr};
use super::*;

/// A small xorshift generator: uniform values in [-1, 1) and raw bits.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub(crate) fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn uniform(&mut self) -> f32 {
        (self.bits() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(crate) fn matrix(&mut self, r: usize, c: usize) -> Array2<f32> {
        Array2::from_shape_fn((r, c), |_| self.uniform())
    }
}

/// The two paths with the same bits: `vdpbf16ps` (where this CPU has it)
/// and the portable one.
pub(crate) fn paths() -> [Isa; 2] {
    [Isa::native().with_amx(false), Isa::native().with_avx512(false)]
}

/// Every path: AMX (where this CPU has it and the OS grants it; else the
/// `vdpbf16ps` one again), then [`paths`].
pub(crate) fn all_paths() -> [Isa; 3] {
    let [vector, portable] = paths();
    [Isa::native(), vector, portable]
}

/// Every bf16 product path, as `(name, the Isa the rhs is packed for, the
/// Isa of the product)`: AMX, `vdpbf16ps`, the pair layout's tile without
/// bf16 products, the wide layout's AVX2 tile ([`super::wide`]) under an
/// AVX2 Isa and under one with bf16 products. All but the first give the
/// same bits where no subnormal appears (on a CPU without AVX-512 BF16
/// several are the same path).
pub(crate) fn routes() -> [(&'static str, Isa, Isa); 5] {
    let [native, vector, avx2] = all_paths();
    [
        ("native", native, native),
        ("vdpbf16ps", vector, vector),
        ("pairs without bf16", vector, avx2),
        ("wide", avx2, avx2),
        ("wide under avx512", avx2, vector),
    ]
}

/// Serializes the tests that change the thread count, and restores the
/// default after `f` (even when it fails).
pub(crate) fn with_threads<R>(n: usize, f: impl FnOnce() -> R) -> R {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            crate::threads::set_num_threads(0);
        }
    }
    let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _restore = Restore;
    crate::threads::set_num_threads(n);
    f()
}

#[test]
fn f32_to_bf16_has_the_bits_of_half_for_every_kind_of_value() {
    let mut rng = Rng::new(7);
    let mut src: Vec<f32> = (0..4000).map(|_| f32::from_bits(rng.bits() as u32)).collect();
    // Subnormals, ties, NaNs with payloads, infinities, zeros, the top.
    for i in 0..200 {
        src[i * 7] = f32::from_bits(rng.bits() as u32 & 0x807f_ffff);
        src[i * 7 + 1] = f32::from_bits((rng.bits() as u32 & 0xffff_0000) | 0x8000);
        src[i * 7 + 2] = f32::from_bits(0x7f80_0000 | rng.bits() as u32 & 0x807f_ffff | 1);
    }
    src[5..11].copy_from_slice(&[f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, f32::MIN_POSITIVE]);
    for isa in paths() {
        for len in (0..70).chain([src.len()]) {
            let mut dst = vec![bf16::ZERO; len];
            f32_to_bf16_slice(&src[..len], &mut dst, isa);
            for (s, d) in src.iter().zip(&dst) {
                let want = bf16::from_f32(*s);
                assert_eq!(d.to_bits(), want.to_bits(), "{isa:?} len {len}: {s:e} ({:08x})", s.to_bits());
            }
            let mut back = vec![0f32; len];
            bf16_to_f32_slice(&dst, &mut back, isa);
            for (b, d) in back.iter().zip(&dst) {
                assert_eq!(b.to_bits(), d.to_f32().to_bits(), "{isa:?} len {len}");
            }
        }
    }
}

/// An operand's values in one of three layouts: row-major, transposed
/// storage (column-major), reversed rows.
pub(super) fn layout(x: &Array2<f32>, kind: usize) -> Array2<f32> {
    match kind {
        0 => x.clone(),
        1 => x.t().as_standard_layout().to_owned().reversed_axes(),
        _ => {
            let mut r = x.slice(s![..;-1, ..]).to_owned();
            r.invert_axis(ndarray::Axis(0));
            r
        }
    }
}

/// The f64 product of `a` and `b` with `c0` added, and the sums of the
/// terms' sizes.
fn reference(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let ((m, k), n) = (a.dim(), b.ncols());
    let (mut want, mut size) = (vec![0f64; m * n], vec![0f64; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut z) = (f64::from(c0[i * n + j]), f64::from(c0[i * n + j]).abs());
            for p in 0..k {
                let t = f64::from(a[[i, p]]) * f64::from(b[[p, j]]);
                s += t;
                z += t.abs();
            }
            (want[i * n + j], size[i * n + j]) = (s, z);
        }
    }
    (want, size)
}

/// Both entry points on every path for one shape, every layout of `a`,
/// with and without accumulation: within the documented bound of the f64
/// reference (of the original values for an f32 lhs, of the rounded ones
/// for a bf16 lhs), and every path but AMX with the same bits.
fn check_shape(m: usize, k: usize, n: usize, rng: &mut Rng) {
    let (a, b) = (rng.matrix(m, k), rng.matrix(k, n));
    let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform()).collect();
    let round = |x: &Array2<f32>| x.mapv(|v| bf16::from_f32(v).to_f32());
    let sum_eps = (k as f64 + 1.0) * 2f64.powi(-24);
    for acc in [false, true] {
        let zero = vec![0f32; m * n];
        let start = if acc { &c0 } else { &zero };
        let (want, size) = reference(a.view(), b.view(), start);
        let (want_r, size_r) = reference(round(&a).view(), round(&b).view(), start);
        for kind in 0..3 {
            let a = layout(&a, kind);
            let a16 = a.mapv(bf16::from_f32);
            let mut got = Vec::new();
            for (_, pack_isa, isa) in routes() {
                let packed = PackedBf16::from_f32_for(b.view(), pack_isa);
                let (mut c, mut c16) = (c0.clone(), c0.clone());
                gemm_bf16_from_f32(a.view(), &packed, &mut c, acc, isa);
                gemm_bf16(a16.view(), &packed, &mut c16, acc, isa);
                assert_eq!(c, c16, "{m}x{k}x{n}: the f32 lhs is the bf16 one rounded");
                for i in 0..m * n {
                    let what = format!("{isa:?} {m}x{k}x{n} layout {kind} acc {acc}: c[{i}] = {}", c[i]);
                    let err = (f64::from(c[i]) - want[i]).abs();
                    assert!(err <= (2f64.powi(-7) + 1.01 * sum_eps) * size[i], "{what} vs {}", want[i]);
                    let err_r = (f64::from(c[i]) - want_r[i]).abs();
                    assert!(err_r <= sum_eps * size_r[i], "{what} vs {} (rounded inputs)", want_r[i]);
                }
                got.push(c);
            }
            for (c, (name, ..)) in got[2..].iter().zip(&routes()[2..]) {
                let same = c.iter().zip(&got[1]).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{m}x{k}x{n}: {name} differs from vdpbf16ps");
            }
        }
    }
}

#[test]
fn products_match_the_f64_reference_at_odd_sizes() {
    let mut rng = Rng::new(11);
    let sizes = [1, 3, 5, 17, 33];
    for &m in &sizes {
        for &k in &sizes {
            for &n in &sizes {
                check_shape(m, k, n, &mut rng);
            }
        }
    }
    for (m, k, n) in [(1023, 5, 17), (17, 1023, 3), (5, 33, 1023), (64, 64, 49), (9, 2, 96)] {
        check_shape(m, k, n, &mut rng);
    }
}

#[test]
fn empty_sizes_write_zeros_or_nothing() {
    for (_, pack_isa, isa) in routes() {
        let b = PackedBf16::from_f32_for(Array2::<f32>::zeros((0, 3)).view(), pack_isa);
        let mut c = vec![5.0f32; 6];
        gemm_bf16_from_f32(Array2::<f32>::zeros((2, 0)).view(), &b, &mut c, true, isa);
        assert_eq!(c, [5.0; 6]);
        gemm_bf16_from_f32(Array2::<f32>::zeros((2, 0)).view(), &b, &mut c, false, isa);
        assert_eq!(c, [0.0; 6]);
        let b = PackedBf16::from_f32_for(Array2::<f32>::zeros((4, 0)).view(), pack_isa);
        gemm_bf16_from_f32(Array2::<f32>::zeros((2, 4)).view(), &b, &mut [], false, isa);
        let b = PackedBf16::from_f32_for(Array2::<f32>::zeros((4, 3)).view(), pack_isa);
        gemm_bf16_from_f32(Array2::<f32>::zeros((0, 4)).view(), &b, &mut [], false, isa);
    }
}

#[test]
fn nan_and_inf_propagate_as_in_f32() {
    let mut rng = Rng::new(3);
    let (mut a, b) = (rng.matrix(5, 7), rng.matrix(7, 33));
    a[[1, 3]] = f32::NAN;
    a[[3, 0]] = f32::INFINITY;
    for (name, pack_isa, isa) in routes() {
        let packed = PackedBf16::from_f32_for(b.view(), pack_isa);
        let mut c = vec![0f32; 5 * 33];
        gemm_bf16_from_f32(a.view(), &packed, &mut c, false, isa);
        assert!(c[33..66].iter().all(|v| v.is_nan()), "{name}: a NaN row");
        let row3 = &c[99..132];
        assert!(row3.iter().zip(b.row(0)).all(|(c, b)| c.is_infinite() && c.signum() == b.signum()), "{name}");
        assert!(c[..33].iter().chain(&c[132..]).all(|v| v.is_finite()), "{name}: other rows");
    }
}

/// Every way of cutting the output into blocks, even ones the pool never
/// uses (starting inside an lhs panel or a register), gives the bits of
/// the whole product.
#[test]
fn any_blocks_give_the_bits_of_the_whole() {
    let mut rng = Rng::new(5);
    let (m, k, n) = (37, 21, 101);
    let (a, b) = (rng.matrix(m, k), rng.matrix(k, n));
    for (name, pack_isa, isa) in routes() {
        let b = PackedBf16::from_f32_for(b.view(), pack_isa);
        let mut whole = vec![0f32; m * n];
        gemm_bf16_from_f32(a.view(), &b, &mut whole, false, isa);
        let mut parts = vec![0f32; m * n];
        let kw = k.div_ceil(2);
        with_scratch(lhs_words(m, kw, isa, b.wide), |lhs| {
            pack::pack_lhs_split(a.view(), lhs, isa, b.wide);
            let out = OutPtr(parts.as_mut_ptr());
            for rows in [0..3, 3..8, 8..21, 21..37] {
                for cols in [0..7, 7..16, 16..50, 50..101] {
                    let (rhs, wide) = (b.words.words(), b.wide);
                    // SAFETY: disjoint blocks of `parts`, sized m×n.
                    unsafe { kernel::run_block(lhs, m, rhs, kw, rows.clone(), cols, out, n, false, isa, wide) };
                }
            }
        });
        assert!(whole.iter().zip(&parts).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}");
    }
}

#[test]
fn thread_counts_give_the_same_bits() {
    let mut rng = Rng::new(9);
    // By columns (blocks starting inside a 48-column panel) and by rows.
    for (m, k, n) in [(70, 333, 1023), (1023, 65, 130)] {
        let (a, b) = (rng.matrix(m, k), rng.matrix(k, n));
        for (name, pack_isa, isa) in routes() {
            let b = PackedBf16::from_f32_for(b.view(), pack_isa);
            let runs: Vec<Vec<f32>> = [1, 2, 3]
                .iter()
                .map(|&t| {
                    with_threads(t, || {
                        let mut c = vec![0f32; m * n];
                        gemm_bf16_from_f32(a.view(), &b, &mut c, false, isa);
                        c
                    })
                })
                .collect();
            for c in &runs[1..] {
                assert!(c.iter().zip(&runs[0]).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} {m}x{k}x{n}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "gemm_bf16_from_f32: a [2, 3] times a packed b [4, 5]")]
fn mismatched_sizes_panic_with_the_sizes() {
    let b = PackedBf16::from_f32(Array2::<f32>::zeros((4, 5)).view());
    gemm_bf16_from_f32(Array2::<f32>::zeros((2, 3)).view(), &b, &mut [0.0; 10], false, Isa::native());
}

/// Every value kind a weight may hold: uniform values, subnormals, NaNs
/// with payloads, infinities, signed zeros, ties.
pub(super) fn special_matrix(rng: &mut Rng, k: usize, n: usize) -> Array2<f32> {
    Array2::from_shape_fn((k, n), |_| match rng.bits() % 9 {
        0 => f32::from_bits(rng.bits() as u32 & 0x807f_ffff),
        1 => f32::from_bits(0x7f80_0000 | rng.bits() as u32 & 0x807f_ffff | 1),
        2 => [f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0][rng.bits() as usize % 4],
        3 => f32::from_bits((rng.bits() as u32 & 0xffff_0000) | 0x8000),
        _ => rng.uniform(),
    })
}

#[test]
fn the_vector_packing_has_the_portable_bits_for_every_layout() {
    let mut rng = Rng::new(23);
    let [vector, portable] = paths();
    let (ks, ns) = ([1, 2, 3, 5, 32, 33, 34, 63], [1, 15, 16, 17, 64, 65, 130]);
    for (k, n) in ks.iter().flat_map(|&k| ns.iter().map(move |&n| (k, n))) {
        let x = special_matrix(&mut rng, k, n);
        let wide = special_matrix(&mut rng, k, 2 * n);
        let transposed = layout(&x, 1);
        let views: [(&str, ArrayView2<'_, f32>); 5] = [
            ("row-major", x.view()),
            ("transposed storage", transposed.view()),
            ("reversed rows", x.slice(s![..;-1, ..])),
            ("every other column", wide.slice(s![.., ..;2])),
            ("reversed columns", x.slice(s![.., ..;-1])),
        ];
        for (name, b) in views {
            let len = tiles::rhs_len(n, k.div_ceil(2));
            let (mut got, mut want) = (vec![0u32; len], vec![0u32; len]);
            pack::pack_rhs(b, &mut got, vector);
            pack::pack_rhs(b, &mut want, portable);
            assert_eq!(got, want, "{name} [{k}, {n}]");
        }
    }
}

/// The lhs packed in parts over the pool, and a transposed lhs packed by
/// the vector path (register transposes) or gathered (portable), give the
/// words of the one-thread packing of the same values in row-major
/// storage.
#[test]
fn lhs_packing_over_threads_and_from_transposes_has_the_row_major_words() {
    let mut rng = Rng::new(29);
    // Small ones (never split), one panel, panels that do not divide
    // evenly, odd depths; the large ones pass the split's threshold.
    for (m, k) in [(1, 7), (2, 2), (5, 3), (6, 33), (13, 5041), (257, 300), (1023, 65), (64, 1024)] {
        let x = special_matrix(&mut rng, m, k);
        let wide = special_matrix(&mut rng, m, 2 * k);
        let transposed = layout(&x, 1);
        let len = lhs_len(m, k.div_ceil(2));
        for isa in all_paths() {
            let views: [(&str, ArrayView2<'_, f32>); 3] = [
                ("row-major", x.view()),
                ("transposed storage", transposed.view()),
                ("every other column", wide.slice(s![.., ..;2])),
            ];
            for (name, a) in views {
                let mut want = vec![0u32; len];
                pack::pack_lhs(a.as_standard_layout().view(), &mut want, isa);
                for threads in [1, 2, 3] {
                    let mut got = vec![u32::MAX; len];
                    with_threads(threads, || pack::pack_lhs_split(a, &mut got, isa, false));
                    assert!(got == want, "{name} [{m}, {k}] at {threads} threads, {isa:?}");
                }
            }
            // The reversed transposed storage: negative column strides.
            let flipped = transposed.slice(s![.., ..;-1]);
            let mut want = vec![0u32; len];
            pack::pack_lhs(flipped.as_standard_layout().view(), &mut want, isa);
            let mut got = vec![u32::MAX; len];
            pack::pack_lhs(flipped, &mut got, isa);
            assert!(got == want, "reversed transposed storage [{m}, {k}], {isa:?}");
        }
    }
}

/// The rhs packed in parts over the pool (each part zeroing its panels)
/// gives the words of the one-thread packing into a zeroed buffer.
#[test]
fn rhs_packing_over_threads_has_the_one_thread_words() {
    let mut rng = Rng::new(31);
    for (k, n) in [(3, 5), (300, 257), (65, 1023), (1024, 130), (7, 10000), (1023, 64)] {
        let x = special_matrix(&mut rng, k, n);
        let transposed = layout(&x, 1);
        for isa in paths() {
            for (name, b) in [("row-major", x.view()), ("transposed storage", transposed.view())] {
                let mut want = vec![0u32; tiles::rhs_len(n, k.div_ceil(2))];
                pack::pack_rhs(b, &mut want, isa);
                for threads in [1, 2, 3] {
                    let got = with_threads(threads, || pack::pack_rhs_split(b, isa, false));
                    assert!(got.words() == want.as_slice(), "{name} [{k}, {n}] at {threads} threads, {isa:?}");
                }
            }
        }
    }
}
