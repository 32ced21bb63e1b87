//! Shared helpers of the JIT tests: graph builders, deterministic data with
//! special values, and comparison against the interpreter.

#![allow(dead_code)]

use tracejit_ir::tensor::{DType, Storage};
use tracejit_ir::{Graph, Op, TensorType, ValueId};

/// A `[rows, cols]` parameter or, with `transposed`, a `[cols, rows]` one
/// transposed in the graph (a strided view of its buffer).
pub fn matrix_param(g: &mut Graph, dtype: DType, (rows, cols): (usize, usize), transposed: bool) -> ValueId {
    if transposed {
        let t = param(g, dtype, &[cols, rows]);
        node(g, Op::Transpose { perm: vec![1, 0] }, &[t])
    } else {
        param(g, dtype, &[rows, cols])
    }
}

/// Adds a node, panicking with the inference error.
pub fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    ValueId::from(g.add_node(op, inputs, &[], None).unwrap_or_else(|e| panic!("{e}")))
}

/// A parameter of a fully known type.
pub fn param(g: &mut Graph, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_param(TensorType::known(dtype, shape))
}

/// A scalar constant of `dtype`.
pub fn scalar(g: &mut Graph, dtype: DType, v: f64) -> ValueId {
    g.add_constant(Storage::scalar_of(dtype, v))
}

/// A tiny deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random data of `dtype`; `special` mixes in NaN, ±inf, ±0, extremes.
pub fn data(dtype: DType, shape: &[usize], seed: u64, special: bool) -> Storage {
    let n: usize = shape.iter().product();
    let mut r = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    let fspecial = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e-40, -3.5, 2.5, 0.5, 1e30];
    match dtype {
        DType::BF16 | DType::F16 => tracejit_ir::tensor::kernels::cast(&data(DType::F64, shape, seed, special), dtype),
        DType::F32 | DType::F64 => {
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    if special && r.next().is_multiple_of(8) {
                        fspecial[(r.next() % fspecial.len() as u64) as usize]
                    } else {
                        (r.unit() * 8.0 - 4.0) * if r.next().is_multiple_of(4) { 10.0 } else { 1.0 }
                    }
                })
                .collect();
            if dtype == DType::F32 {
                Storage::from_vec(v.into_iter().map(|x| x as f32).collect::<Vec<_>>(), shape).unwrap()
            } else {
                Storage::from_vec(v, shape).unwrap()
            }
        }
        DType::I32 => {
            let ispecial = [i32::MIN, i32::MAX, 0, -1, 1];
            let v: Vec<i32> = (0..n)
                .map(|_| {
                    if special && r.next().is_multiple_of(8) {
                        ispecial[(r.next() % 5) as usize]
                    } else {
                        (r.next() % 21) as i32 - 10
                    }
                })
                .collect();
            Storage::from_vec(v, shape).unwrap()
        }
        DType::I64 => {
            let ispecial = [i64::MIN, i64::MAX, 0, -1, 1];
            let v: Vec<i64> = (0..n)
                .map(|_| {
                    if special && r.next().is_multiple_of(8) {
                        ispecial[(r.next() % 5) as usize]
                    } else {
                        (r.next() % 21) as i64 - 10
                    }
                })
                .collect();
            Storage::from_vec(v, shape).unwrap()
        }
        DType::Bool => {
            let v: Vec<bool> = (0..n).map(|_| r.next().is_multiple_of(2)).collect();
            Storage::from_vec(v, shape).unwrap()
        }
        // The narrow integers and u64: small values, and with `special`
        // the dtype's extremes, so that wrapping shows.
        d => {
            let (lo, hi) = d.int_range().expect("an integer dtype");
            let ispecial = [lo, hi, 0, 1, hi - 1];
            let v: Vec<i128> = (0..n)
                .map(|_| {
                    if special && r.next().is_multiple_of(8) {
                        ispecial[(r.next() % 5) as usize]
                    } else {
                        ((r.next() % 21) as i128 - 10).rem_euclid(hi - lo + 1)
                    }
                })
                .map(|x| if x > hi { x - (hi - lo + 1) } else { x })
                .collect();
            if d == DType::U64 {
                Storage::from_vec(v.into_iter().map(|x| x as u64).collect::<Vec<_>>(), shape).unwrap()
            } else {
                let wide = Storage::from_vec(v.into_iter().map(|x| x as i64).collect::<Vec<_>>(), shape).unwrap();
                tracejit_ir::tensor::kernels::cast(&wide, d)
            }
        }
    }
}

/// Exact equality where any NaN equals any NaN; otherwise bits must match.
pub fn exact_eq(a: &Storage, b: &Storage) -> Result<(), String> {
    cmp(a, b, |x, y| x.to_bits() == y.to_bits(), |x, y| x.to_bits() == y.to_bits())
}

/// Equality up to a relative tolerance (NaN matches NaN, inf matches inf).
pub fn close(a: &Storage, b: &Storage, rel32: f64, rel64: f64) -> Result<(), String> {
    let ok = |x: f64, y: f64, rel: f64| x == y || (x - y).abs() <= rel * x.abs().max(y.abs()).max(1e-30);
    cmp(a, b, |x, y| ok(f64::from(x), f64::from(y), rel32), |x, y| ok(x, y, rel64))
}

/// `|a - b| <= tol * (|b| + 1)`: for results that cancel (layernorm + beta).
pub fn close_abs(a: &Storage, b: &Storage, tol: f64) -> Result<(), String> {
    let ok = |x: f64, y: f64| x == y || (x - y).abs() <= tol * (y.abs() + 1.0);
    cmp(a, b, |x, y| ok(f64::from(x), f64::from(y)), ok)
}

fn cmp(
    a: &Storage,
    b: &Storage,
    f32eq: impl Fn(f32, f32) -> bool,
    f64eq: impl Fn(f64, f64) -> bool,
) -> Result<(), String> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Err(format!("type {}{:?} vs {}{:?}", a.dtype(), a.shape(), b.dtype(), b.shape()));
    }
    let a = a.to_standard();
    let b = b.to_standard();
    let fail = |i: usize, x: String, y: String| Err(format!("element {i}: jit {x} vs reference {y}"));
    match (&a, &b) {
        (Storage::F32(x), Storage::F32(y)) => {
            for (i, (p, q)) in x.iter().zip(y.iter()).enumerate() {
                if !(f32eq(*p, *q) || p.is_nan() && q.is_nan()) {
                    return fail(i, format!("{p:e}"), format!("{q:e}"));
                }
            }
        }
        (Storage::F64(x), Storage::F64(y)) => {
            for (i, (p, q)) in x.iter().zip(y.iter()).enumerate() {
                if !(f64eq(*p, *q) || p.is_nan() && q.is_nan()) {
                    return fail(i, format!("{p:e}"), format!("{q:e}"));
                }
            }
        }
        _ => {
            if !a.bit_eq(&b) {
                let (x, y) = (format!("{a:?}"), format!("{b:?}"));
                return Err(format!("jit {}\nreference {}", &x[..x.len().min(600)], &y[..y.len().min(600)]));
            }
        }
    }
    Ok(())
}

/// Compiles `g`, runs it and the interpreter on `inputs`, and checks exact equality.
pub fn check_exact(g: &Graph, inputs: &[Storage]) {
    let region = tracejit_jit::compile_region(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    let refs: Vec<&Storage> = inputs.iter().collect();
    let got = region.run(&refs);
    let want = tracejit_ir::interpret(g, inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (x, y)) in got.iter().zip(&want).enumerate() {
        if let Err(e) = exact_eq(x, y) {
            panic!("output {k}: {e}\n{g}");
        }
    }
}

/// f32 inputs for sweeps of the transcendentals: 1536 points per binade
/// of both signs (subnormals included), dense points over [-110, 110], and
/// the special values (±0, ±inf, NaN, extremes, clamp edges).
pub fn sweep_inputs() -> Vec<f32> {
    let mut xs = Vec::new();
    // 1536 points per binade from 2^-149 to 2^127, both signs.
    for e in -149..128 {
        let lo = 2f64.powi(e);
        for k in 0..1536 {
            let x = (lo * (1.0 + k as f64 / 1536.0)) as f32;
            xs.push(x);
            xs.push(-x);
        }
    }
    // Dense in the ranges where the functions are interesting.
    for k in 0..400_000 {
        xs.push(-110.0 + 220.0 * k as f32 / 400_000.0);
    }
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        // erf's worst input (6 ULP).
        3.449_202_8,
        -3.449_202_8,
        88.72283,
        88.7229,
        89.0,
        -87.33655,
        -103.97,
        -104.0,
        f32::MAX,
        f32::MIN,
        1.0,
        3.8325,
        8.017734,
    ]);
    // erf's saturation edge and the floats either side of it, where the
    // vector code's select (a difference against the float below) must
    // match the in-line compare.
    let lim = tracejit_jit::fastmath::ERF_LIM.to_bits();
    for bits in [lim - 1, lim, lim + 1] {
        xs.extend([f32::from_bits(bits), -f32::from_bits(bits)]);
    }
    xs
}

/// The harness's name of the test `test` in the module at `module_path`
/// (its `module_path!()`): the path without the crate's name, as `--exact`
/// wants it when a test runs this binary again for that test alone.
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}
