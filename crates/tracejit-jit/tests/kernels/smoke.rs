//! Quick smoke tests of single ops through the JIT.

use crate::common;
use common::*;
use tracejit_ir::tensor::{BinaryOp, DType, Exactness, ReduceOp, UnaryOp};
use tracejit_ir::{Graph, Op};

#[test]
fn add_f32() {
    let mut g = Graph::new("t");
    let a = param(&mut g, DType::F32, &[37]);
    let b = param(&mut g, DType::F32, &[37]);
    let c = node(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    g.outputs.push(c);
    check_exact(&g, &[data(DType::F32, &[37], 1, true), data(DType::F32, &[37], 2, true)]);
}

#[test]
fn all_unary_all_dtypes() {
    // Regions compute f32, f64 and the integers, the narrow ones in their
    // compute dtype (16-bit floats and u64 stay out).
    for dt in DType::ALL.into_iter().filter(|d| !d.is_low_precision() && *d != DType::U64) {
        for u in UnaryOp::ALL {
            if u.result_dtype(dt).is_none() {
                continue;
            }
            // Approximated ops are held to their ULP bounds in ulp.rs.
            if dt == DType::F32 && u.exactness() == Exactness::ApproxF32 {
                continue;
            }
            let mut g = Graph::new("t");
            let a = param(&mut g, dt, &[3, 7]);
            let c = node(&mut g, Op::Unary(u), &[a]);
            g.outputs.push(c);
            eprintln!("{dt} {}", u.name());
            check_exact(&g, &[data(dt, &[3, 7], 7, true)]);
        }
    }
}

#[test]
fn all_binary_all_dtypes() {
    // Regions compute f32, f64 and the integers, the narrow ones in their
    // compute dtype (16-bit floats and u64 stay out).
    for dt in DType::ALL.into_iter().filter(|d| !d.is_low_precision() && *d != DType::U64) {
        for op in BinaryOp::ALL {
            if op.result_dtype(dt).is_none() {
                continue;
            }
            let mut g = Graph::new("t");
            let a = param(&mut g, dt, &[2, 9]);
            let b = param(&mut g, dt, &[9]);
            let c = node(&mut g, Op::Binary(op), &[a, b]);
            g.outputs.push(c);
            eprintln!("{dt} {}", op.name());
            check_exact(&g, &[data(dt, &[2, 9], 3, true), data(dt, &[9], 4, true)]);
        }
    }
}

#[test]
fn softmax_rows() {
    let mut g = Graph::new("softmax");
    let x = param(&mut g, DType::F32, &[5, 37]);
    let m = node(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdims: true }, &[x]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[e]);
    let y = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs.push(y);
    let xs = data(DType::F32, &[5, 37], 9, false);
    let region = tracejit_jit::compile_region(&g).unwrap();
    let got = region.run(&[&xs]);
    let want = tracejit_ir::interpret(&g, &[xs]).unwrap();
    close(&got[0], &want[0], 1e-5, 1e-12).unwrap();
}
