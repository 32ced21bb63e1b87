//! Regions on the narrow integers (i8, u8, i16, u16, u32), which compile in
//! their compute dtype (i32; i64 for u32): loads extend, stores truncate,
//! every arithmetic result wraps back to the storage width, casts from
//! floats saturate. Each region must compile (the JIT runs it) and equal
//! the reference kernels bit for bit on data with the dtype's extremes,
//! broadcasting and odd sizes (vector and scalar tails).

use crate::common::*;
use tracejit_ir::tensor::{BinaryOp, DType, UnaryOp};
use tracejit_ir::{Graph, Op};

const NARROW: [DType; 5] = [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32];

/// `((a + b) * a - b) / (b | 1)`-style chains, compared, selected and cast
/// to f32 and back (saturating), for every narrow dtype and a few shapes.
#[test]
fn narrow_integer_chains_compile_and_wrap() {
    for dt in NARROW {
        for (shape, seed) in [(vec![37usize], 1u64), (vec![3, 9], 2), (vec![1], 3), (vec![2, 2, 5], 4)] {
            let mut g = Graph::new("narrow");
            let a = param(&mut g, dt, &shape);
            let b = param(&mut g, dt, &shape[shape.len() - 1..]);
            let s = node(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
            let p = node(&mut g, Op::Binary(BinaryOp::Mul), &[s, a]);
            let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[p, b]);
            let q = node(&mut g, Op::Binary(BinaryOp::Div), &[d, b]);
            let r = node(&mut g, Op::Binary(BinaryOp::Rem), &[q, a]);
            let n = node(&mut g, Op::Unary(UnaryOp::Neg), &[r]);
            let lt = node(&mut g, Op::Binary(BinaryOp::Lt), &[n, a]);
            let m = node(&mut g, Op::Select, &[lt, n, p]);
            let f = node(&mut g, Op::Cast { to: DType::F32 }, &[m]);
            let k = g.add_constant(tracejit_ir::tensor::Storage::scalar(300.75f32));
            let big = node(&mut g, Op::Binary(BinaryOp::Mul), &[f, k]);
            let back = node(&mut g, Op::Cast { to: dt }, &[big]);
            let wide = node(&mut g, Op::Cast { to: DType::I64 }, &[m]);
            let other = if dt == DType::I8 { DType::U16 } else { DType::I8 };
            let cross = node(&mut g, Op::Cast { to: other }, &[wide]);
            let c = node(&mut g, Op::Clamp { min: -5.0, max: 100.0 }, &[m]);
            g.outputs.extend([m, back, cross, c, lt]);
            let inputs = [data(dt, &shape, seed, true), data(dt, &shape[shape.len() - 1..], seed + 10, true)];
            check_exact(&g, &inputs);
        }
    }
}

/// Dequantization as ONNX models write it: `(cast(q, f32) - zp) * scale`
/// over u8 and i8 weights, and the requantization back with round, clamp
/// and a cast: the region compiles and equals the reference.
#[test]
fn dequantize_and_requantize_regions_compile() {
    for dt in [DType::U8, DType::I8] {
        let mut g = Graph::new("dequant");
        let q = param(&mut g, dt, &[4, 33]);
        let zp = param(&mut g, dt, &[33]);
        let scale = param(&mut g, DType::F32, &[33]);
        let qf = node(&mut g, Op::Cast { to: DType::F32 }, &[q]);
        let zf = node(&mut g, Op::Cast { to: DType::F32 }, &[zp]);
        let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[qf, zf]);
        let x = node(&mut g, Op::Binary(BinaryOp::Mul), &[d, scale]);
        let y = node(&mut g, Op::Binary(BinaryOp::Div), &[x, scale]);
        let r = node(&mut g, Op::Unary(UnaryOp::Round), &[y]);
        let back = node(&mut g, Op::Binary(BinaryOp::Add), &[r, zf]);
        let (lo, hi) = dt.int_range().unwrap();
        let c = node(&mut g, Op::Clamp { min: lo as f64, max: hi as f64 }, &[back]);
        let out = node(&mut g, Op::Cast { to: dt }, &[c]);
        g.outputs.extend([x, out]);
        let scales: Vec<f32> = (0..33).map(|i| 0.01 + i as f32 / 64.0).collect();
        let scales = tracejit_ir::tensor::Storage::from_vec(scales, &[33]).unwrap();
        check_exact(&g, &[data(dt, &[4, 33], 5, true), data(dt, &[33], 6, false), scales]);
    }
}
