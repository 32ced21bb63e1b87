//! Random-number kernels. `random` is the reference kernel of the random
//! ops (`Op::Random`): Philox4x32-10 ([`tracejit_kernels::philox`]) keyed
//! by a state tensor, element `i` a function of the state and `i` only.
//! `randn` and `rand_uniform` (the eager constructors `Tensor::randn` and
//! `Tensor::rand_uniform`, which take a plain seed) keep their own
//! counter-based generator (a splitmix64 hash of the seed and the
//! element's row-major index), so the values they have always given stay.

use ndarray::{ArrayD, IxDyn};
use tracejit_kernels::philox::Stream;

use crate::{DType, RandomDist, Storage};

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream key of a seed: the first splitmix64 output of that seed.
fn key(seed: u64) -> u64 {
    mix(seed.wrapping_add(GAMMA))
}

/// The 64 random bits of `counter` in the stream `key`.
fn bits(key: u64, counter: u64) -> u64 {
    mix(key.wrapping_add(counter.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A uniform f64 in `[0, 1)` from the top 53 bits.
fn uniform(key: u64, counter: u64) -> f64 {
    (bits(key, counter) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn check_float(name: &str, dtype: DType) {
    if !dtype.is_float() {
        panic!("{name}: dtype {dtype} is not accepted (random values need f32 or f64)");
    }
}

/// Builds a tensor of `shape` whose element `i` is `f(i)`, rounded to `dtype`.
fn generate(
    shape: &[usize],
    dtype: DType,
    f: impl Fn(u64) -> f64,
    fix32: impl Fn(f32) -> f32,
    fix64: impl Fn(f64) -> f64,
) -> Storage {
    let n: usize = shape.iter().product();
    match dtype {
        DType::F32 => {
            let data: Vec<f32> = (0..n as u64).map(|i| fix32(f(i) as f32)).collect();
            Storage::from_array(ArrayD::from_shape_vec(IxDyn(shape), data).expect("sized above"))
        }
        DType::F64 => {
            let data: Vec<f64> = (0..n as u64).map(|i| fix64(f(i))).collect();
            Storage::from_array(ArrayD::from_shape_vec(IxDyn(shape), data).expect("sized above"))
        }
        _ => unreachable!("dtype checked by the caller"),
    }
}

/// The Philox stream of a state: an i64 `[counter_lo, counter_hi, key]`
/// (a generator's), or an i64 `[s0, s1]` seed (a stateless draw's), read
/// as the state `[0, s1, s0]`.
pub(crate) fn stream(name: &str, state: &Storage) -> Stream {
    let words: Vec<i64> = match state {
        Storage::I64(a) if a.ndim() == 1 && (a.len() == 3 || a.len() == 2) => a.iter().copied().collect(),
        other => panic!(
            "{name}: the state must be an i64 [3] (counter low, counter high, key) or an i64 [2] seed, got {}{:?}",
            other.dtype(),
            other.shape()
        ),
    };
    let (lo, hi, key) = match words[..] {
        [lo, hi, key] => (lo as u64, hi as u64, key as u64),
        [s0, s1] => (0, s1 as u64, s0 as u64),
        _ => unreachable!("length checked above"),
    };
    let split = |x: u64| [x as u32, (x >> 32) as u32];
    let (l, h) = (split(lo), split(hi));
    Stream { key: split(key), counter: [l[0], l[1], h[0], h[1]] }
}

/// A random draw of `shape` and `dtype` (f32 or f64) from `state`
/// ([`stream`]): element `i` of the stream mapped by `dist`.
pub(crate) fn random(dist: RandomDist, state: &Storage, shape: &[usize], dtype: DType) -> Storage {
    let name = dist.name();
    check_float(name, dtype);
    let s = stream(name, state);
    let n: usize = shape.iter().product();
    let isa = tracejit_kernels::Isa::current();
    let (a, b) = dist.params();
    match dtype {
        DType::F32 => {
            let mut data = vec![0.0f32; n];
            match dist {
                RandomDist::Uniform { .. } => s.uniform_f32(0, &mut data, isa),
                RandomDist::Normal { .. } => s.normal_f32(0, &mut data, isa),
            }
            let (a, b) = (a as f32, b as f32);
            let uniform = matches!(dist, RandomDist::Uniform { .. });
            let scale = if uniform { b - a } else { b };
            if (a, scale) != (0.0, 1.0) {
                data.iter_mut().for_each(|x| *x = a + scale * *x);
            }
            if uniform && a < b && b.is_finite() {
                // `a + (b - a)·u` rounds to `b` for u near 1 when `b - a`
                // is small against `a` (1e8 + 10 in f32): keep `[a, b)`.
                let top = below_f32(b).max(a);
                data.iter_mut().filter(|x| **x >= b).for_each(|x| *x = top);
            }
            Storage::from_array(ArrayD::from_shape_vec(IxDyn(shape), data).expect("sized above"))
        }
        _ => {
            let mut data = vec![0.0f64; n];
            match dist {
                RandomDist::Uniform { .. } => s.uniform_f64(0, &mut data, isa),
                RandomDist::Normal { .. } => s.normal_f64(0, &mut data, isa),
            }
            let uniform = matches!(dist, RandomDist::Uniform { .. });
            let scale = if uniform { b - a } else { b };
            if (a, scale) != (0.0, 1.0) {
                data.iter_mut().for_each(|x| *x = a + scale * *x);
            }
            if uniform && a < b && b.is_finite() {
                let top = below_f64(b).max(a);
                data.iter_mut().filter(|x| **x >= b).for_each(|x| *x = top);
            }
            Storage::from_array(ArrayD::from_shape_vec(IxDyn(shape), data).expect("sized above"))
        }
    }
}

pub(crate) fn randn(shape: &[usize], seed: u64, dtype: DType) -> Storage {
    check_float("randn", dtype);
    let k = key(seed);
    let normal = |i: u64| {
        let u1 = uniform(k, 2 * i);
        let u2 = uniform(k, 2 * i + 1);
        // libm (a pure-Rust port of musl) rather than the platform's libm,
        // so the values are the same everywhere.
        (-2.0 * libm::log(1.0 - u1)).sqrt() * libm::cos(2.0 * std::f64::consts::PI * u2)
    };
    generate(shape, dtype, normal, |x| x, |x| x)
}

/// The largest f32 below `x` (for finite `x`).
fn below_f32(x: f32) -> f32 {
    if x == 0.0 {
        -f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() - 1)
    } else {
        f32::from_bits(x.to_bits() + 1)
    }
}

/// The largest f64 below `x` (for finite `x`).
fn below_f64(x: f64) -> f64 {
    if x == 0.0 {
        -f64::from_bits(1)
    } else if x > 0.0 {
        f64::from_bits(x.to_bits() - 1)
    } else {
        f64::from_bits(x.to_bits() + 1)
    }
}

pub(crate) fn rand_uniform(shape: &[usize], low: f64, high: f64, seed: u64, dtype: DType) -> Storage {
    check_float("rand_uniform", dtype);
    let k = key(seed);
    let value = |i: u64| low + uniform(k, i) * (high - low);
    // Keep results below `high` when rounding reaches it.
    let ordered = low < high;
    let (hi32, hi64) = (high as f32, high);
    let fix32 = |x: f32| if ordered && x >= hi32 && hi32.is_finite() { below_f32(hi32).max(low as f32) } else { x };
    let fix64 = |x: f64| if ordered && x >= hi64 && hi64.is_finite() { below_f64(hi64).max(low) } else { x };
    generate(shape, dtype, value, fix32, fix64)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::v;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn deterministic_and_seed_dependent() {
        let a = randn(&[4, 5], 42, DType::F64);
        let b = randn(&[4, 5], 42, DType::F64);
        assert!(a.bit_eq(&b));
        let c = randn(&[4, 5], 43, DType::F64);
        assert!(!a.bit_eq(&c));
        // Pinned values: the generator must not change across platforms.
        assert_eq!(bits(key(0), 0), bits(key(0), 0));
        assert_eq!(mix(0), 0);
        assert_eq!(key(0), 0xE220_A839_7B1D_CDAF);
        // Values from an independent Python implementation of the same recipe.
        let n = v::<f64>(&randn(&[3], 7, DType::F64));
        let expected = [-0.9422576653840772, -1.0013831968636933, 0.38178265192226435];
        for (g, e) in n.iter().zip(expected) {
            assert!((g - e).abs() < 1e-15, "{g} vs {e}");
        }
        let u = v::<f64>(&rand_uniform(&[2], 0.5, 2.5, 7, DType::F64));
        assert_eq!(u, vec![1.9430163612099405, 1.7994086729369114]);
    }

    #[test]
    fn element_depends_only_on_index() {
        let big = v::<f32>(&randn(&[6, 7], 9, DType::F32));
        let flat = v::<f32>(&randn(&[42], 9, DType::F32));
        assert_eq!(big, flat);
        let prefix = v::<f32>(&randn(&[10], 9, DType::F32));
        assert_eq!(prefix[..], big[..10]);
        let u = v::<f64>(&rand_uniform(&[3, 3], -1.0, 1.0, 5, DType::F64));
        let u2 = v::<f64>(&rand_uniform(&[4], -1.0, 1.0, 5, DType::F64));
        assert_eq!(u2[..], u[..4]);
        // f32 is the f64 draw rounded.
        let n64 = v::<f64>(&randn(&[42], 9, DType::F64));
        assert_eq!(flat, n64.iter().map(|&x| x as f32).collect::<Vec<_>>());
    }

    #[test]
    fn statistics_are_plausible() {
        let n = 20_000;
        let x = v::<f64>(&randn(&[n], 1, DType::F64));
        let mean = x.iter().sum::<f64>() / n as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
        assert!(x.iter().all(|v| v.is_finite()));
        let u = v::<f64>(&rand_uniform(&[n], 2.0, 4.0, 1, DType::F64));
        assert!(u.iter().all(|&v| (2.0..4.0).contains(&v)));
        let mean = u.iter().sum::<f64>() / n as f64;
        assert!((mean - 3.0).abs() < 0.03, "mean {mean}");
    }

    #[test]
    fn uniform_stays_below_high_in_f32() {
        // A tiny interval just below 1: many f64 draws round to high in f32.
        let low = 1.0 - 1e-7;
        let u = v::<f32>(&rand_uniform(&[1000], low, 1.0, 3, DType::F32));
        assert!(u.iter().all(|&x| x < 1.0 && x >= low as f32), "{u:?}");
        let c = v::<f32>(&rand_uniform(&[3], 2.0, 2.0, 3, DType::F32));
        assert_eq!(c, vec![2.0; 3]);
    }

    #[test]
    fn empty_and_rank0() {
        assert_eq!(randn(&[0, 3], 1, DType::F32).shape(), &[0, 3]);
        let s = randn(&[], 1, DType::F64);
        assert_eq!(s.shape(), &[] as &[usize]);
        assert_eq!(v::<f64>(&s), v::<f64>(&randn(&[1], 1, DType::F64)));
        assert_eq!(rand_uniform(&[2, 0], 0.0, 1.0, 1, DType::F64).len(), 0);
    }

    #[test]
    #[should_panic(expected = "randn: dtype i32 is not accepted")]
    fn randn_int_rejected() {
        randn(&[2], 0, DType::I32);
    }

    #[test]
    #[should_panic(expected = "rand_uniform: dtype bool is not accepted")]
    fn uniform_bool_rejected() {
        rand_uniform(&[2], 0.0, 1.0, 0, DType::Bool);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn randn_prefix_property(seed in any::<u64>(), n in 0usize..64, m in 0usize..64) {
            let (small, large) = (n.min(m), n.max(m));
            let a = v::<f32>(&randn(&[small], seed, DType::F32));
            let b = v::<f32>(&randn(&[large], seed, DType::F32));
            prop_assert_eq!(&a[..], &b[..small]);
            let again = v::<f32>(&randn(&[large], seed, DType::F32));
            prop_assert_eq!(b, again);
        }
    }
}
