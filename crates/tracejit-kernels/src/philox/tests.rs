use super::*;

/// Every path this CPU can run, the portable one first.
fn paths() -> Vec<Path> {
    #[allow(unused_mut, reason = "only x86_64 has vector paths")]
    let mut p = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::native().with_avx512(false).width() == Some(crate::Width::W8) {
            p.push(Path::Avx2);
        }
        if Isa::native().width() == Some(crate::Width::W16) {
            p.push(Path::Avx512);
        }
    }
    p
}

/// A stream whose counter carries out of word 0 (and on through words 1
/// and 2) 21 blocks in.
const CARRYING: Stream = Stream { key: [0x1234_5678, 0x9abc_def0], counter: [u32::MAX - 20, u32::MAX, u32::MAX, 7] };

/// Elements `first..first + n` of one output kind, by `path`.
type Draw<T> = fn(&Stream, u64, &mut [T], Path);

fn bits(s: &Stream, first: u64, out: &mut [u32], path: Path) {
    s.draw(u128::from(first), out, path);
}
fn uf32(s: &Stream, first: u64, out: &mut [f32], path: Path) {
    s.draw(u128::from(first), out, path);
}
fn uf64(s: &Stream, first: u64, out: &mut [f64], path: Path) {
    s.draw(u128::from(first), out, path);
}
fn nf32(s: &Stream, first: u64, out: &mut [f32], path: Path) {
    s.normals(first, out, path);
}
fn nf64(s: &Stream, first: u64, out: &mut [f64], path: Path) {
    s.normals(first, out, path);
}

/// Bit patterns, so that floats compare exactly.
trait Bits: Copy + Default {
    fn bits(self) -> u64;
}
impl Bits for u32 {
    fn bits(self) -> u64 {
        self.into()
    }
}
impl Bits for f32 {
    fn bits(self) -> u64 {
        self.to_bits().into()
    }
}
impl Bits for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

fn as_bits<T: Bits>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.bits()).collect()
}

/// Every range (starting at each element offset mod 4, each block offset
/// mod 32, of lengths around the group sizes) on every path equals the
/// same slice of a long portable draw.
fn check_ranges<T: Bits>(s: &Stream, draw: Draw<T>) {
    let mut long = vec![T::default(); 560];
    draw(s, 0, &mut long, Path::Portable);
    for path in paths() {
        for first in 0..130u64 {
            for n in [0, 1, 2, 3, 5, 8, 15, 17, 31, 33, 64, 65, 127, 129, 257, 430] {
                let mut out = vec![T::default(); n];
                draw(s, first, &mut out, path);
                let want = &long[first as usize..first as usize + n];
                assert_eq!(as_bits(&out), as_bits(want), "{path:?} first {first} n {n}");
            }
        }
    }
}

#[test]
fn known_answers() {
    assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
    assert_eq!(
        philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

/// Element i is word i % 4 of philox(counter + i / 4), the add carrying
/// through all four words and wrapping at 2^128, on every path.
#[test]
fn bits_follow_the_block_mapping() {
    let wrapping = Stream { key: [1, 2], counter: [u32::MAX; 4] };
    for s in [CARRYING, wrapping] {
        for path in paths() {
            let mut out = vec![0u32; 4 * 70];
            bits(&s, 0, &mut out, path);
            for (b, w) in out.chunks(4).enumerate() {
                let c = to_words(to_u128(s.counter).wrapping_add(b as u128));
                assert_eq!(w, philox4x32_10(c, s.key), "{path:?} block {b}");
            }
        }
    }
    // The carry reaches word 3 at block 21, and 2^128 - 1 wraps to 0.
    assert_eq!(to_words(to_u128(CARRYING.counter) + 21), [0, 0, 0, 8]);
    assert_eq!(wrapping.advanced(1).counter, [0; 4]);
}

#[test]
fn ranges_equal_slices_of_a_long_draw() {
    let plain = Stream { key: [0xdead_beef, 42], counter: [5, 0, 0, 0] };
    for s in [plain, CARRYING] {
        check_ranges(&s, bits);
        check_ranges(&s, uf32);
        check_ranges(&s, uf64);
        check_ranges(&s, nf32);
        check_ranges(&s, nf64);
    }
}

/// The public methods under each `Isa` give the portable path's bits.
#[test]
fn every_isa_gives_the_portable_bits() {
    let s = CARRYING;
    let n = 1001;
    for isa in [Isa::native(), Isa::native().with_avx512(false)] {
        let (mut a, mut b) = (vec![0u32; n], vec![0u32; n]);
        s.bits_u32(3, &mut a, isa);
        bits(&s, 3, &mut b, Path::Portable);
        assert_eq!(a, b);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        s.uniform_f32(3, &mut a, isa);
        uf32(&s, 3, &mut b, Path::Portable);
        assert_eq!(as_bits(&a), as_bits(&b));
        s.normal_f32(3, &mut a, isa);
        nf32(&s, 3, &mut b, Path::Portable);
        assert_eq!(as_bits(&a), as_bits(&b));
        let (mut a, mut b) = (vec![0f64; n], vec![0f64; n]);
        s.uniform_f64(3, &mut a, isa);
        uf64(&s, 3, &mut b, Path::Portable);
        assert_eq!(as_bits(&a), as_bits(&b));
        s.normal_f64(3, &mut a, isa);
        nf64(&s, 3, &mut b, Path::Portable);
        assert_eq!(as_bits(&a), as_bits(&b));
    }
}

/// The documented formulas, element by element; the normals also within
/// a few ulp of `std`'s (libm's) `ln`, `sin` and `cos`.
#[test]
fn uniform_and_normal_mappings() {
    let s = CARRYING;
    let isa = Isa::native();
    let mut w = vec![0u32; 256];
    s.bits_u32(0, &mut w, isa);
    let mut u = vec![0f32; 256];
    s.uniform_f32(0, &mut u, isa);
    let mut z = vec![0f32; 256];
    s.normal_f32(0, &mut z, isa);
    let libm = |u1: f64, u2: f64, odd: bool| {
        let theta = std::f64::consts::TAU * u2;
        (-2.0 * u1.ln()).sqrt() * if odd { theta.sin() } else { theta.cos() }
    };
    for i in 0..256 {
        assert_eq!(u[i], f32::from_bits((w[i] >> 9) | 0x3f80_0000) - 1.0);
        let (u1, u2) = (1.0 - f64::from(u[i & !1]), 1.0 - f64::from(u[i | 1]));
        let (z0, z1) = normal::box_muller(u1, u2);
        let want = if i % 2 == 0 { z0 } else { z1 };
        assert_eq!(z[i].to_bits(), (want as f32).to_bits(), "normal_f32 {i}");
        let near = libm(u1, u2, i % 2 == 1) as f32;
        assert!((z[i] - near).abs() <= f32::EPSILON * near.abs().max(1.0), "normal_f32 {i}: {} vs {near}", z[i]);
    }
    let mut u = vec![0f64; 128];
    s.uniform_f64(0, &mut u, isa);
    let mut z = vec![0f64; 128];
    s.normal_f64(0, &mut z, isa);
    for i in 0..128 {
        let x = u64::from(w[2 * i]) | (u64::from(w[2 * i + 1]) << 32);
        assert_eq!(u[i], f64::from_bits((x >> 12) | 0x3ff0_0000_0000_0000) - 1.0);
        let (u1, u2) = (1.0 - u[i & !1], 1.0 - u[i | 1]);
        let (z0, z1) = normal::box_muller(u1, u2);
        assert_eq!(z[i].to_bits(), if i % 2 == 0 { z0 } else { z1 }.to_bits(), "normal_f64 {i}");
        let near = libm(u1, u2, i % 2 == 1);
        assert!((z[i] - near).abs() <= 8.0 * f64::EPSILON * near.abs().max(1.0), "normal_f64 {i}: {} vs {near}", z[i]);
    }
}

/// `normal`'s `ln` and `sin_cos_turns` against `std` over their inputs:
/// random multiples of 2^-52 and 2^-23, and the edges.
#[test]
fn normal_math_accuracy() {
    let mut w = vec![0u32; 1 << 17];
    Stream { key: [5, 6], counter: [0; 4] }.bits_u32(0, &mut w, Isa::native());
    let mut xs: Vec<f64> = w.chunks(2).map(|p| 1.0 - unit_f64(pair_u64(p[0], p[1]))).collect();
    xs.extend(w.iter().map(|&w| 1.0 - f64::from(unit_f32(w))));
    xs.extend((0..=52).map(|e| 2f64.powi(-e)));
    let r = 0.5f64.sqrt();
    xs.extend([r, r.next_up(), r.next_down(), 1.0f64.next_down(), 0.25, 0.75]);
    for &x in &xs {
        let (l, want) = (normal::ln(x), x.ln());
        assert!((l - want).abs() <= f64::EPSILON * want.abs(), "ln({x:e}) = {l:e}, std {want:e}");
        let (s, c) = normal::sin_cos_turns(x);
        // 2π x = theta + d: std's argument corrected to first order for
        // the roundings of 2π and of the product (up to 4e-16 here).
        let tau = std::f64::consts::TAU;
        let theta = tau * x;
        let d = tau.mul_add(x, -theta) + 2.449_293_598_294_706_4e-16 * x;
        let (ws, wc) = (theta.sin() + d * theta.cos(), theta.cos() - d * theta.sin());
        let err = (s - ws).abs().max((c - wc).abs());
        assert!(err <= 1.5 * f64::EPSILON, "sincos(2π·{x:e}): error {err:e}");
        assert!(s.abs() <= 1.0 && c.abs() <= 1.0);
    }
    assert_eq!(normal::sin_cos_turns(1.0), (0.0, 1.0));
    assert_eq!(normal::sin_cos_turns(0.25), (1.0, 0.0));
    assert_eq!(normal::sin_cos_turns(0.5), (0.0, -1.0));
    assert_eq!(normal::sin_cos_turns(0.75), (-1.0, 0.0));
    assert_eq!(normal::ln(1.0), 0.0);
}

/// The extreme words: uniforms stay below 1, normals finite at the
/// smallest `u1`, and 0 at `u1 = 1`.
#[test]
fn extremes() {
    assert_eq!(unit_f32(u32::MAX), 1.0 - f32::EPSILON);
    assert_eq!(unit_f32(0), 0.0);
    assert_eq!(unit_f64(u64::MAX), 1.0 - f64::EPSILON);
    // u1 = 2^-23 (word u32::MAX), u2 = 1 (word 0).
    let (z0, z1) = normal::box_muller(1.0 - f64::from(unit_f32(u32::MAX)), 1.0);
    assert!((z0 - (46.0 * std::f64::consts::LN_2).sqrt()).abs() < 1e-14 && z1 == 0.0, "{z0} {z1}");
    let (z0, _) = normal::box_muller(1.0 - unit_f64(u64::MAX), 0.5);
    assert!((z0 + (104.0 * std::f64::consts::LN_2).sqrt()).abs() < 1e-14, "{z0}");
    let (z0, z1) = normal::box_muller(1.0, 0.3);
    assert_eq!((z0, z1), (0.0, 0.0));
}

/// Mean, variance, range and (for normals) kurtosis and the pair's
/// correlation of 10^6 draws, within 5 standard errors.
#[test]
fn statistics() {
    const N: usize = 1_000_000;
    let s = Stream { key: [2024, 7], counter: [0, 0, 0, 0] };
    let isa = Isa::native();
    let moments = |v: &[f64]| {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let m2 = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        let m4 = v.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / v.len() as f64;
        (mean, m2, m4 / (m2 * m2))
    };
    let se = 1.0 / (N as f64).sqrt();

    let mut u = vec![0f32; N];
    s.uniform_f32(0, &mut u, isa);
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let (mean, var, _) = moments(&u.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    assert!((mean - 0.5).abs() < 5.0 * se * (1.0f64 / 12.0).sqrt(), "uniform_f32 mean {mean}");
    assert!((var - 1.0 / 12.0).abs() < 5.0 * se * (1.0f64 / 80.0 - 1.0 / 144.0).sqrt(), "uniform_f32 var {var}");

    let mut u = vec![0f64; N];
    s.uniform_f64(0, &mut u, isa);
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let (mean, var, _) = moments(&u);
    assert!((mean - 0.5).abs() < 5.0 * se * (1.0f64 / 12.0).sqrt(), "uniform_f64 mean {mean}");
    assert!((var - 1.0 / 12.0).abs() < 5.0 * se * (1.0f64 / 80.0 - 1.0 / 144.0).sqrt(), "uniform_f64 var {var}");

    let mut z = vec![0f32; N];
    s.normal_f32(0, &mut z, isa);
    assert!(z.iter().all(|x| x.abs() < 5.65), "normal_f32 out of range");
    let z: Vec<f64> = z.iter().map(|&x| f64::from(x)).collect();
    let mut z64 = vec![0f64; N];
    s.normal_f64(0, &mut z64, isa);
    assert!(z64.iter().all(|x| x.abs() < 8.5), "normal_f64 out of range");
    for (name, z) in [("normal_f32", &z), ("normal_f64", &z64)] {
        let (mean, var, kurt) = moments(z);
        assert!(mean.abs() < 5.0 * se, "{name} mean {mean}");
        assert!((var - 1.0).abs() < 5.0 * se * 2f64.sqrt(), "{name} var {var}");
        assert!((kurt - 3.0).abs() < 5.0 * se * 24f64.sqrt(), "{name} kurtosis {kurt}");
        // z0 and z1 of a pair are independent.
        let corr = z.chunks(2).map(|p| p[0] * p[1]).sum::<f64>() / (N / 2) as f64;
        assert!(corr.abs() < 5.0 * (2.0 / N as f64).sqrt(), "{name} pair correlation {corr}");
        // Tails: P(|z| > 3) = 0.0027.
        let tail = z.iter().filter(|x| x.abs() > 3.0).count() as f64 / N as f64;
        assert!((tail - 0.0027).abs() < 5.0 * (0.0027 / N as f64).sqrt(), "{name} tail {tail}");
    }
}

/// `advanced(n)` continues where a draw of `n` blocks ended, and draws
/// starting at the very end of the u64 element range work.
#[test]
fn advanced_and_far_offsets() {
    let s = CARRYING;
    let isa = Isa::native();
    for k in [0u64, 1, 5, 21, 1000] {
        let (mut a, mut b) = (vec![0u32; 37], vec![0u32; 37]);
        s.advanced(k).bits_u32(0, &mut a, isa);
        s.bits_u32(4 * k, &mut b, isa);
        assert_eq!(a, b);
        let (mut a, mut b) = (vec![0f64; 37], vec![0f64; 37]);
        s.advanced(k).uniform_f64(1, &mut a, isa);
        s.uniform_f64(2 * k + 1, &mut b, isa);
        assert_eq!(as_bits(&a), as_bits(&b));
    }
    let first = u64::MAX - 2;
    for path in paths() {
        let mut out = vec![0u32; 70];
        bits(&s, first, &mut out, path);
        for (j, &w) in out.iter().enumerate() {
            let e = u128::from(first) + j as u128;
            let c = to_words(to_u128(s.counter).wrapping_add(e / 4));
            assert_eq!(w, philox4x32_10(c, s.key)[(e % 4) as usize], "{path:?} {j}");
        }
        let mut z = vec![0f64; 70];
        nf64(&s, first, &mut z, path);
        assert!(z.iter().all(|x| x.is_finite()));
    }
}

/// The same call twice gives the same bits (the normals' libm included).
#[test]
fn repeatable() {
    let s = Stream { key: [3, 4], counter: [9, 9, 9, 9] };
    let (mut a, mut b) = (vec![0f32; 4099], vec![0f32; 4099]);
    s.normal_f32(17, &mut a, Isa::native());
    s.normal_f32(17, &mut b, Isa::native());
    assert_eq!(as_bits(&a), as_bits(&b));
}
