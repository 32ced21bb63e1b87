//! The quantization ops against scalar references written from ONNX's
//! definitions (round half to even, saturation to the output range, the
//! reference implementation's arithmetic types), on random inputs with
//! ties, out-of-range values and odd sizes.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

/// ONNX's DynamicQuantizeLinear reference, in f32 as it computes.
fn dynamic_quantize_reference(x: &[f32]) -> (Vec<u8>, f32, u8) {
    let max = x.iter().copied().fold(0.0f32, f32::max);
    let min = x.iter().copied().fold(0.0f32, f32::min);
    let scale = if max == min { 1.0 } else { max - min } / 255.0;
    let zp = (0.0 - min / scale).clamp(0.0, 255.0).round_ties_even();
    let y = x.iter().map(|&v| ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8).collect();
    (y, scale, zp as u8)
}

fn dynamic_quantize_model(n: usize) -> tracejit_onnx::Model {
    let bytes = model(
        vec![node("DynamicQuantizeLinear", "q", &["x"], &["y", "s", "z"], vec![])],
        vec![fixed("x", DType::F32, &[n])],
        vec![fixed("y", DType::U8, &[n]), fixed("s", DType::F32, &[]), fixed("z", DType::U8, &[])],
        vec![],
        11,
    );
    import_bytes(&bytes).unwrap()
}

#[test]
fn dynamic_quantize_linear_on_onnx_example() {
    let x = vec![0.0f32, 2.0, -3.0, -2.5, 1.34, 0.5];
    let out = dynamic_quantize_model(x.len()).run(&[Tensor::from_vec(x.clone(), &[6])]).unwrap();
    let (y, s, z) = dynamic_quantize_reference(&x);
    assert_eq!(out[0].to_vec::<u8>().unwrap(), y);
    assert_eq!(out[1].to_vec::<f32>().unwrap(), [s]);
    assert_eq!(out[2].to_vec::<u8>().unwrap(), [z]);
}

fn assert_jit(model: &tracejit_onnx::Model) {
    for cf in model.function().concrete_functions() {
        assert_eq!(cf.executor_kind(), "jit", "the JIT did not run the model: {:?}", cf.jit_error());
    }
}

/// Deterministic pseudo-random numbers for the data of one case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

/// Values of a quantized dtype as a tensor of it.
fn ints_of(d: DType, v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).cast(d)
}

const QUANT: [DType; 4] = [DType::I8, DType::U8, DType::I16, DType::U16];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// QuantizeLinear per axis (or per tensor): `x / scale` as one f32 division, rounded
    /// half to even, plus the zero point, saturated. The data has exact
    /// ties (k · scale / 2), values past the range and infinities (which
    /// saturate; NaN becomes 0, where the reference is undefined).
    #[test]
    fn quantize_linear_per_axis(r in 1usize..5, c in 1usize..6, per_tensor in any::<bool>(), d in prop::sample::select(QUANT.to_vec()), seed in 0u64..10_000) {
        let mut g = Rng(seed);
        let (lo, hi) = d.int_range().unwrap();
        let (lo, hi) = (lo as i64, hi as i64);
        let np = if per_tensor { 1 } else { c };
        let mut scales: Vec<f32> = (0..np).map(|_| [0.5f32, 0.25, 0.1, 3.0, 0.013, 5.0 / 255.0][g.int(0, 5) as usize]).collect();
        let mut zps: Vec<i64> = (0..np).map(|_| g.int(lo.max(-100), hi.min(100))).collect();
        let pdims: &[usize] = if per_tensor { &[] } else { &[c] };
        let (s_init, z_init) = (Tensor::from_vec(scales.clone(), pdims), ints_of(d, &zps, pdims));
        if per_tensor {
            (scales, zps) = (vec![scales[0]; c], vec![zps[0]; c]);
        }
        let x: Vec<f32> = (0..r * c)
            .map(|i| match g.int(0, 9) {
                0 => (g.int(-600, 600) as f32) * scales[i % c] / 2.0,
                1 => g.int(-12, 12) as f32 / 2.0,
                2 => [f32::INFINITY, f32::NEG_INFINITY, 1e9, -1e9][g.int(0, 3) as usize],
                _ => (g.int(-40_000, 40_000) as f32) / 97.0,
            })
            .collect();
        let bytes = model(
            vec![node("QuantizeLinear", "q", &["x", "s", "z"], &["y"], vec![attr_i("axis", 1)])],
            vec![fixed("x", DType::F32, &[r, c])],
            vec![fixed("y", d, &[r, c])],
            vec![init("s", &s_init), init("z", &z_init)],
            21,
        );
        let m = import_bytes(&bytes).unwrap();
        let y = m.run(&[Tensor::from_vec(x.clone(), &[r, c])]).unwrap().remove(0);
        assert_jit(&m);
        prop_assert_eq!(y.dtype(), d);
        let got = y.cast(DType::I64).to_vec::<i64>().unwrap();
        for (i, &v) in x.iter().enumerate() {
            let q = (v / scales[i % c]).round_ties_even() as f64 + zps[i % c] as f64;
            let want = q.clamp(lo as f64, hi as f64) as i64;
            prop_assert_eq!(got[i], want, "x = {} scale {} zp {}", v, scales[i % c], zps[i % c]);
        }
    }

    /// DequantizeLinear blocked along axis 0 (the last block cut short):
    /// `(x - zero_point) · scale` in f32.
    #[test]
    fn dequantize_linear_blocked(r in 1usize..9, c in 1usize..4, block in 1usize..4, d in prop::sample::select(QUANT.to_vec()), seed in 0u64..10_000) {
        let mut g = Rng(seed);
        let (lo, hi) = d.int_range().unwrap();
        let (lo, hi) = (lo as i64, hi as i64);
        let nb = r.div_ceil(block);
        let x: Vec<i64> = (0..r * c).map(|_| if g.int(0, 4) == 0 { [lo, hi][g.int(0, 1) as usize] } else { g.int(lo, hi) }).collect();
        let scales: Vec<f32> = (0..nb * c).map(|_| g.int(1, 1000) as f32 / 337.0).collect();
        let zps: Vec<i64> = (0..nb * c).map(|_| g.int(lo, hi)).collect();
        let bytes = model(
            vec![node("DequantizeLinear", "dq", &["x", "s", "z"], &["y"], vec![attr_i("axis", 0), attr_i("block_size", block as i64)])],
            vec![fixed("x", d, &[r, c])],
            vec![fixed("y", DType::F32, &[r, c])],
            vec![init("s", &Tensor::from_vec(scales.clone(), &[nb, c])), init("z", &ints_of(d, &zps, &[nb, c]))],
            21,
        );
        let m = import_bytes(&bytes).unwrap();
        let y = m.run(&[ints_of(d, &x, &[r, c])]).unwrap().remove(0);
        assert_jit(&m);
        let got = y.to_vec::<f32>().unwrap();
        for i in 0..r {
            for j in 0..c {
                let b = (i / block) * c + j;
                let want = (x[i * c + j] as f32 - zps[b] as f32) * scales[b];
                prop_assert_eq!(got[i * c + j].to_bits(), want.to_bits(), "[{}, {}]", i, j);
            }
        }
    }

    /// DynamicQuantizeLinear against the reference's f32 steps, on data
    /// with exact ties, all-zero and one-signed inputs.
    #[test]
    fn dynamic_quantize_linear_matches_the_reference(n in 1usize..40, kind in 0u8..5, seed in 0u64..10_000) {
        let mut g = Rng(seed);
        let (top, bottom) = (g.int(1, 12) as f32 / 2.0, -g.int(1, 12) as f32 / 2.0);
        let mut x: Vec<f32> = (0..n)
            .map(|_| match kind {
                0 => 0.0,
                1 => g.int(0, 5000) as f32 / 7.0,
                2 => -(g.int(0, 5000) as f32) / 7.0,
                // Halves: 255 x / range is often a tie in exact arithmetic,
                // which the f32 scale moves just off (ONNX's own example).
                3 => g.int(-12, 12) as f32 / 2.0,
                _ => g.int(-5000, 5000) as f32 / 8.0,
            })
            .collect();
        if kind == 3 {
            // Both ends of the range present, as in ONNX's example (2 and -3).
            x.extend([top, bottom]);
        }
        let n = x.len();
        let out = dynamic_quantize_model(n).run(&[Tensor::from_vec(x.clone(), &[n])]).unwrap();
        let (y, s, z) = dynamic_quantize_reference(&x);
        prop_assert_eq!(out[0].to_vec::<u8>().unwrap(), y);
        prop_assert_eq!(out[1].to_vec::<f32>().unwrap()[0].to_bits(), s.to_bits());
        prop_assert_eq!(out[2].to_vec::<u8>().unwrap(), vec![z]);
    }

    /// MatMulInteger (u8 by i8, a per-row zero point for A, a scalar one
    /// for B) and QLinearMatMul against i32 loops; QLinearMatMul scales
    /// the sums by `fl(fl(a_scale · b_scale) / y_scale)` in f64, rounds
    /// half to even and saturates, as the reference does.
    #[test]
    fn integer_products_match_loops(m in 1usize..5, k in 1usize..7, n in 1usize..5, seed in 0u64..10_000) {
        let mut g = Rng(seed);
        let a: Vec<i64> = (0..m * k).map(|_| g.int(0, 255)).collect();
        let b: Vec<i64> = (0..k * n).map(|_| g.int(-128, 127)).collect();
        let azp: Vec<i64> = (0..m).map(|_| g.int(0, 255)).collect();
        let bzp = g.int(-128, 127);
        let bytes = model(
            vec![node("MatMulInteger", "mm", &["a", "b", "az", "bz"], &["y"], vec![])],
            vec![fixed("a", DType::U8, &[m, k]), fixed("b", DType::I8, &[k, n])],
            vec![fixed("y", DType::I32, &[m, n])],
            vec![init("az", &ints_of(DType::U8, &azp, &[m])), init("bz", &ints_of(DType::I8, &[bzp], &[]))],
            10,
        );
        let mi = import_bytes(&bytes).unwrap();
        let (ta, tb) = (ints_of(DType::U8, &a, &[m, k]), ints_of(DType::I8, &b, &[k, n]));
        let y = mi.run(&[ta.clone(), tb]).unwrap().remove(0).to_vec::<i32>().unwrap();
        assert_jit(&mi);
        let dot = |i: usize, j: usize, az: i64, bz: i64| -> i64 { (0..k).map(|t| (a[i * k + t] - az) * (b[t * n + j] - bz)).sum() };
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(y[i * n + j] as i64, dot(i, j, azp[i], bzp));
            }
        }
        // QLinearMatMul: u8 by u8 into u8, scalar scales and zero points.
        let b2: Vec<i64> = b.iter().map(|v| v + 128).collect();
        let (sa, sb, sy) = (g.int(1, 100) as f32 / 640.0, g.int(1, 100) as f32 / 320.0, g.int(1, 100) as f32 / 50.0);
        let (za, zb, zy) = (g.int(0, 255), g.int(0, 255), g.int(0, 255));
        let scalar = |v: f32| Tensor::from_vec(vec![v], &[]);
        let u8s = |v: i64| ints_of(DType::U8, &[v], &[]);
        let bytes = model(
            vec![node("QLinearMatMul", "q", &["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], &["y"], vec![])],
            vec![fixed("a", DType::U8, &[m, k]), fixed("b", DType::U8, &[k, n])],
            vec![fixed("y", DType::U8, &[m, n])],
            vec![init("sa", &scalar(sa)), init("za", &u8s(za)), init("sb", &scalar(sb)), init("zb", &u8s(zb)), init("sy", &scalar(sy)), init("zy", &u8s(zy))],
            21,
        );
        let q = import_bytes(&bytes).unwrap();
        let y = q.run(&[ta, ints_of(DType::U8, &b2, &[k, n])]).unwrap().remove(0).to_vec::<u8>().unwrap();
        assert_jit(&q);
        let mult = (sa * sb / sy) as f64;
        for i in 0..m {
            for j in 0..n {
                let c: i64 = (0..k).map(|t| (a[i * k + t] - za) * (b2[t * n + j] - zb)).sum();
                let want = (c as f64 * mult + zy as f64).round_ties_even().clamp(0.0, 255.0) as u8;
                prop_assert_eq!(y[i * n + j], want, "[{}, {}] sum {}", i, j, c);
            }
        }
    }
}
