//! Shape and dtype inference of every op: known and unknown dims, and every
//! error case (the message names the op and the shapes involved).

use std::sync::Arc;

use tracejit_ir::tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{broadcast_dims, infer, AssignKind, Graph, LibraryFunction, Op, TensorType};

use crate::common::{f32t, node, ty, TestVar};

use DType::{Bool, F32, F64, I32, I64};

/// The single output type of `op`.
#[track_caller]
fn ok(op: Op, inputs: &[TensorType]) -> TensorType {
    let out = infer(&op, inputs, None).unwrap_or_else(|e| panic!("unexpected error: {e}"));
    assert_eq!(out.len(), 1);
    out[0].clone()
}

/// The error message of `op`, checked to start with the op's name and to
/// contain each of `parts`.
#[track_caller]
fn err(op: Op, inputs: &[TensorType], parts: &[&str]) -> String {
    let e = match infer(&op, inputs, None) {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e,
    };
    assert_eq!(e.op, op.name());
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}: ", op.name())), "{msg:?}");
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
    }
    msg
}

fn reduce(op: ReduceOp, axes: &[usize], keepdims: bool) -> Op {
    Op::Reduce { op, axes: axes.to_vec(), keepdims }
}

// ---- broadcasting ----

#[test]
fn broadcast_dims_rules() {
    let d = |v: &[i64]| f32t(v).dims;
    assert_eq!(broadcast_dims(&d(&[3, 4]), &d(&[4])), Some(d(&[3, 4])));
    assert_eq!(broadcast_dims(&d(&[2, 1, 3]), &d(&[4, 1])), Some(d(&[2, 4, 3])));
    assert_eq!(broadcast_dims(&d(&[]), &d(&[2, 3])), Some(d(&[2, 3])));
    assert_eq!(broadcast_dims(&d(&[0]), &d(&[1])), Some(d(&[0])));
    assert_eq!(broadcast_dims(&d(&[3, 4]), &d(&[5])), None);
    // unknown vs 1 -> unknown, unknown vs n -> n, unknown vs unknown -> unknown
    assert_eq!(broadcast_dims(&d(&[-1]), &d(&[1])), Some(d(&[-1])));
    assert_eq!(broadcast_dims(&d(&[1]), &d(&[-1])), Some(d(&[-1])));
    assert_eq!(broadcast_dims(&d(&[-1]), &d(&[5])), Some(d(&[5])));
    assert_eq!(broadcast_dims(&d(&[5]), &d(&[-1])), Some(d(&[5])));
    assert_eq!(broadcast_dims(&d(&[-1]), &d(&[-1])), Some(d(&[-1])));
    assert_eq!(broadcast_dims(&d(&[-1, 3]), &d(&[4, 1, 1])), Some(d(&[4, -1, 3])));
}

// ---- elementwise ----

#[test]
fn unary_types() {
    assert_eq!(ok(Op::Unary(UnaryOp::Exp), &[f32t(&[-1, 3])]), f32t(&[-1, 3]));
    assert_eq!(ok(Op::Unary(UnaryOp::IsNan), &[ty(I32, &[2])]), ty(Bool, &[2]));
    assert_eq!(ok(Op::Unary(UnaryOp::LogicalNot), &[ty(Bool, &[])]), ty(Bool, &[]));
    // Every unary op follows UnaryOp::result_dtype for every dtype.
    for u in UnaryOp::ALL {
        for d in DType::ALL {
            let got = infer(&Op::Unary(u), &[ty(d, &[2, -1])], None);
            match u.result_dtype(d) {
                Some(r) => assert_eq!(got.unwrap()[0], ty(r, &[2, -1])),
                None => assert!(got.unwrap_err().to_string().starts_with(u.name())),
            }
        }
    }
}

#[test]
fn unary_errors() {
    let m = err(Op::Unary(UnaryOp::Exp), &[ty(I32, &[3])], &[]);
    assert_eq!(m, "exp: expected a float tensor, got i32[3] (cast it first)");
    err(Op::Unary(UnaryOp::Neg), &[ty(Bool, &[2])], &["a numeric tensor", "bool[2]"]);
    err(Op::Unary(UnaryOp::LogicalNot), &[f32t(&[2])], &["a bool tensor", "f32[2]"]);
    err(Op::Unary(UnaryOp::Exp), &[], &["expected 1 input, got 0"]);
}

#[test]
fn binary_types() {
    let add = Op::Binary(BinaryOp::Add);
    assert_eq!(ok(add.clone(), &[f32t(&[3, 4]), f32t(&[4])]), f32t(&[3, 4]));
    assert_eq!(ok(add.clone(), &[f32t(&[]), f32t(&[2, 3])]), f32t(&[2, 3]));
    assert_eq!(ok(add.clone(), &[f32t(&[-1, 3]), f32t(&[1, 3])]), f32t(&[-1, 3]));
    assert_eq!(ok(add.clone(), &[f32t(&[-1]), f32t(&[5])]), f32t(&[5]));
    assert_eq!(ok(add.clone(), &[f32t(&[-1]), f32t(&[1])]), f32t(&[-1]));
    assert_eq!(ok(add, &[f32t(&[-1, 2]), f32t(&[-1, 2])]), f32t(&[-1, 2]));
    assert_eq!(ok(Op::Binary(BinaryOp::Lt), &[ty(I64, &[2]), ty(I64, &[2])]), ty(Bool, &[2]));
    assert_eq!(ok(Op::Binary(BinaryOp::Eq), &[ty(Bool, &[2]), ty(Bool, &[])]), ty(Bool, &[2]));
    assert_eq!(ok(Op::Binary(BinaryOp::LogicalOr), &[ty(Bool, &[2]), ty(Bool, &[])]), ty(Bool, &[2]));
    for b in BinaryOp::ALL {
        for d in DType::ALL {
            let got = infer(&Op::Binary(b), &[ty(d, &[2]), ty(d, &[1])], None);
            match b.result_dtype(d) {
                Some(r) => assert_eq!(got.unwrap()[0], ty(r, &[2])),
                None => assert!(got.unwrap_err().to_string().starts_with(b.name())),
            }
        }
    }
}

#[test]
fn binary_errors() {
    let add = Op::Binary(BinaryOp::Add);
    let m = err(add.clone(), &[f32t(&[3, 4]), f32t(&[5])], &[]);
    assert_eq!(m, "add: cannot broadcast [3, 4] with [5] (f32 and f32)");
    let m = err(add.clone(), &[f32t(&[2]), ty(F64, &[2])], &[]);
    assert_eq!(
        m,
        "add: operands have different dtypes f32[2] and f64[2]; tracejit never promotes implicitly — cast one of them"
    );
    err(add.clone(), &[f32t(&[-1, 3]), f32t(&[2, 4])], &["cannot broadcast", "[?, 3]", "[2, 4]"]);
    err(add.clone(), &[ty(Bool, &[2]), ty(Bool, &[2])], &["numeric operands", "bool[2]"]);
    err(Op::Binary(BinaryOp::LogicalAnd), &[f32t(&[2]), f32t(&[2])], &["bool operands", "f32[2] and f32[2]"]);
    err(Op::Binary(BinaryOp::Gt), &[ty(Bool, &[2]), ty(Bool, &[2])], &["numeric"]);
    err(add, &[f32t(&[2])], &["expected 2 inputs, got 1"]);
}

#[test]
fn select_types_and_errors() {
    assert_eq!(ok(Op::Select, &[ty(Bool, &[3, 1]), f32t(&[4]), f32t(&[])]), f32t(&[3, 4]));
    assert_eq!(ok(Op::Select, &[ty(Bool, &[-1]), ty(I32, &[1]), ty(I32, &[-1])]), ty(I32, &[-1]));
    err(Op::Select, &[f32t(&[3]), f32t(&[3]), f32t(&[3])], &["condition must be bool", "f32[3]"]);
    err(Op::Select, &[ty(Bool, &[3]), f32t(&[3]), ty(F64, &[3])], &["different dtypes", "f32[3]", "f64[3]"]);
    err(Op::Select, &[ty(Bool, &[3]), f32t(&[4]), f32t(&[3])], &["cannot broadcast", "bool[3]", "f32[4]"]);
    err(Op::Select, &[ty(Bool, &[3]), f32t(&[3])], &["expected 3 inputs, got 2"]);
}

#[test]
fn cast_and_clamp() {
    assert_eq!(ok(Op::Cast { to: F64 }, &[ty(I32, &[-1, 2])]), ty(F64, &[-1, 2]));
    assert_eq!(ok(Op::Cast { to: Bool }, &[f32t(&[])]), ty(Bool, &[]));
    let clamp = |min, max| Op::Clamp { min, max };
    assert_eq!(ok(clamp(0.0, 6.0), &[ty(I64, &[-1])]), ty(I64, &[-1]));
    assert_eq!(ok(clamp(1.0, 1.0), &[f32t(&[2])]), f32t(&[2]));
    err(clamp(0.0, 1.0), &[ty(Bool, &[2])], &["numeric", "bool[2]"]);
    err(clamp(3.0, 1.0), &[f32t(&[2])], &["min 3.0", "max 1.0", "f32[2]"]);
    err(clamp(f64::NAN, 1.0), &[f32t(&[2])], &["NaN"]);
}

// ---- reductions ----

#[test]
fn reduce_types() {
    let x = f32t(&[2, -1, 4]);
    assert_eq!(ok(reduce(ReduceOp::Sum, &[1], false), std::slice::from_ref(&x)), f32t(&[2, 4]));
    assert_eq!(ok(reduce(ReduceOp::Sum, &[1], true), std::slice::from_ref(&x)), f32t(&[2, 1, 4]));
    assert_eq!(ok(reduce(ReduceOp::Mean, &[0, 2], false), std::slice::from_ref(&x)), f32t(&[-1]));
    assert_eq!(ok(reduce(ReduceOp::Max, &[0, 1, 2], false), std::slice::from_ref(&x)), f32t(&[]));
    assert_eq!(ok(reduce(ReduceOp::Min, &[0, 1, 2], true), std::slice::from_ref(&x)), f32t(&[1, 1, 1]));
    assert_eq!(ok(reduce(ReduceOp::Prod, &[], false), std::slice::from_ref(&x)), x);
    assert_eq!(ok(reduce(ReduceOp::Sum, &[0], false), &[ty(I32, &[3])]), ty(I32, &[]));
    // Sum has an identity: an empty axis is fine; max of an unknown axis is checked at run time.
    assert_eq!(ok(reduce(ReduceOp::Sum, &[0], false), &[f32t(&[0, 3])]), f32t(&[3]));
    assert_eq!(ok(reduce(ReduceOp::Max, &[0], false), &[f32t(&[-1, 3])]), f32t(&[3]));
}

#[test]
fn reduce_errors() {
    err(reduce(ReduceOp::Mean, &[0], false), &[ty(I32, &[3])], &["mean", "a float tensor", "i32[3]"]);
    err(reduce(ReduceOp::Sum, &[0], false), &[ty(Bool, &[3])], &["sum", "numeric", "bool[3]"]);
    let m = err(reduce(ReduceOp::Sum, &[2], false), &[f32t(&[2, 3])], &[]);
    assert_eq!(m, "sum: axis 2 is out of range for f32[2, 3]");
    err(reduce(ReduceOp::Sum, &[1, 0], false), &[f32t(&[2, 3])], &["[1, 0]", "sorted and unique", "f32[2, 3]"]);
    err(reduce(ReduceOp::Sum, &[0, 0], false), &[f32t(&[2, 3])], &["[0, 0]", "sorted and unique"]);
    err(reduce(ReduceOp::Max, &[0], false), &[f32t(&[0, 3])], &["max: cannot reduce an empty axis", "f32[0, 3]"]);
    err(reduce(ReduceOp::Min, &[1], true), &[f32t(&[3, 0])], &["min: cannot reduce an empty axis", "f32[3, 0]"]);
}

#[test]
fn arg_reduce_types_and_errors() {
    let argmax = |axis, keepdims| Op::ArgReduce { op: ArgReduceOp::ArgMax, axis, keepdims };
    let argmin = |axis, keepdims| Op::ArgReduce { op: ArgReduceOp::ArgMin, axis, keepdims };
    assert_eq!(ok(argmax(1, false), &[f32t(&[-1, 3])]), ty(I64, &[-1]));
    assert_eq!(ok(argmin(0, true), &[ty(I32, &[2, 3])]), ty(I64, &[1, 3]));
    err(argmax(0, false), &[ty(Bool, &[2])], &["argmax", "numeric", "bool[2]"]);
    err(argmin(2, false), &[f32t(&[2, 3])], &["argmin", "axis 2 is out of range for f32[2, 3]"]);
    err(argmax(0, false), &[f32t(&[])], &["axis 0 is out of range for f32[]"]);
    err(argmax(0, false), &[f32t(&[0, 2])], &["empty axis", "f32[0, 2]"]);
}

// ---- linear algebra ----

#[test]
fn matmul_types() {
    assert_eq!(ok(Op::MatMul, &[f32t(&[2, 3]), f32t(&[3, 4])]), f32t(&[2, 4]));
    assert_eq!(ok(Op::MatMul, &[f32t(&[5, 1, 2, 3]), f32t(&[7, 3, 4])]), f32t(&[5, 7, 2, 4]));
    assert_eq!(ok(Op::MatMul, &[f32t(&[-1, 2, -1]), f32t(&[3, 4])]), f32t(&[-1, 2, 4]));
    assert_eq!(ok(Op::MatMul, &[f32t(&[-1, 2, 3]), f32t(&[1, 3, -1])]), f32t(&[-1, 2, -1]));
    assert_eq!(ok(Op::MatMul, &[ty(I64, &[2, 3]), ty(I64, &[3, 2])]), ty(I64, &[2, 2]));
}

#[test]
fn matmul_errors() {
    let m = err(Op::MatMul, &[f32t(&[2, 3]), f32t(&[4, 5])], &[]);
    assert_eq!(m, "matmul: inner dimensions differ: f32[2, 3] @ f32[4, 5]");
    err(Op::MatMul, &[f32t(&[3]), f32t(&[3, 4])], &["rank >= 2", "f32[3] @ f32[3, 4]"]);
    err(Op::MatMul, &[f32t(&[2, 3]), ty(F64, &[3, 4])], &["different dtypes", "f32[2, 3]", "f64[3, 4]"]);
    err(Op::MatMul, &[ty(Bool, &[2, 2]), ty(Bool, &[2, 2])], &["numeric", "bool[2, 2]"]);
    err(Op::MatMul, &[f32t(&[2, 2, 3]), f32t(&[5, 3, 4])], &["batch", "f32[2, 2, 3] @ f32[5, 3, 4]"]);
}

// ---- shape ops ----

#[test]
fn reshape_types() {
    let reshape = |s: &[i64]| Op::Reshape { shape: s.to_vec() };
    assert_eq!(ok(reshape(&[3, 2]), &[f32t(&[2, 3])]), f32t(&[3, 2]));
    assert_eq!(ok(reshape(&[-1]), &[f32t(&[2, 3])]), f32t(&[6]));
    assert_eq!(ok(reshape(&[2, -1, 1]), &[f32t(&[2, 3])]), f32t(&[2, 3, 1]));
    assert_eq!(ok(reshape(&[]), &[f32t(&[1, 1])]), f32t(&[]));
    assert_eq!(ok(reshape(&[3, 0]), &[f32t(&[0, 3])]), f32t(&[3, 0]));
    // Unknown element count: -1 stays unknown, a target without -1 is taken as is.
    assert_eq!(ok(reshape(&[-1, 2]), &[f32t(&[-1, 4])]), f32t(&[-1, 2]));
    assert_eq!(ok(reshape(&[8]), &[f32t(&[-1, 4])]), f32t(&[8]));
}

#[test]
fn reshape_errors() {
    let reshape = |s: &[i64]| Op::Reshape { shape: s.to_vec() };
    err(reshape(&[4, 2]), &[f32t(&[2, 3])], &["[4, 2]", "f32[2, 3]", "6 elements"]);
    err(reshape(&[4, -1]), &[f32t(&[2, 3])], &["[4, -1]", "f32[2, 3]", "multiple"]);
    err(reshape(&[-1, -1]), &[f32t(&[2, 3])], &["more than one -1", "[-1, -1]"]);
    err(reshape(&[-1, -1]), &[f32t(&[-1, 3])], &["more than one -1"]);
    err(reshape(&[2, -3]), &[f32t(&[-1, 3])], &["invalid dimension -3"]);
    err(reshape(&[0, -1]), &[f32t(&[0, 3])], &["[0, -1]", "f32[0, 3]"]);
    err(reshape(&[0, -1]), &[f32t(&[2, 3])], &["[0, -1]", "f32[2, 3]"]);
}

#[test]
fn transpose_types_and_errors() {
    let tr = |p: &[usize]| Op::Transpose { perm: p.to_vec() };
    assert_eq!(ok(tr(&[1, 0]), &[f32t(&[-1, 3])]), f32t(&[3, -1]));
    assert_eq!(ok(tr(&[2, 0, 1]), &[ty(I32, &[2, 3, 4])]), ty(I32, &[4, 2, 3]));
    assert_eq!(ok(tr(&[]), &[f32t(&[])]), f32t(&[]));
    err(tr(&[0, 0]), &[f32t(&[2, 3])], &["[0, 0] is not a permutation", "f32[2, 3]"]);
    err(tr(&[0]), &[f32t(&[2, 3])], &["[0]", "f32[2, 3]"]);
    err(tr(&[0, 2]), &[f32t(&[2, 3])], &["[0, 2]", "f32[2, 3]"]);
}

#[test]
fn broadcast_to_types_and_errors() {
    let bt = |s: &[usize]| Op::BroadcastTo { shape: s.to_vec() };
    assert_eq!(ok(bt(&[2, 3]), &[f32t(&[3])]), f32t(&[2, 3]));
    assert_eq!(ok(bt(&[4, 3]), &[f32t(&[1, 3])]), f32t(&[4, 3]));
    assert_eq!(ok(bt(&[2, 3]), &[f32t(&[-1, 3])]), f32t(&[2, 3]));
    assert_eq!(ok(bt(&[5]), &[f32t(&[])]), f32t(&[5]));
    err(bt(&[4, 2]), &[f32t(&[3])], &["cannot broadcast f32[3] to [4, 2]"]);
    err(bt(&[3]), &[f32t(&[2, 3])], &["f32[2, 3]", "[3]"]);
}

#[test]
fn expand_dims_and_squeeze() {
    let ed = |axis| Op::ExpandDims { axis };
    assert_eq!(ok(ed(0), &[f32t(&[-1, 3])]), f32t(&[1, -1, 3]));
    assert_eq!(ok(ed(2), &[f32t(&[-1, 3])]), f32t(&[-1, 3, 1]));
    err(ed(3), &[f32t(&[2, 3])], &["axis 3 is out of range for f32[2, 3]"]);

    let sq = |axes: &[usize]| Op::Squeeze { axes: axes.to_vec() };
    assert_eq!(ok(sq(&[0, 2]), &[f32t(&[1, 3, 1])]), f32t(&[3]));
    assert_eq!(ok(sq(&[0]), &[f32t(&[-1, 3])]), f32t(&[3]));
    assert_eq!(ok(sq(&[]), &[f32t(&[1])]), f32t(&[1]));
    err(sq(&[0]), &[f32t(&[2, 1])], &["axis 0 of f32[2, 1] has size 2, not 1"]);
    err(sq(&[2]), &[f32t(&[1, 1])], &["axis 2 is out of range for f32[1, 1]"]);
    err(sq(&[1, 0]), &[f32t(&[1, 1])], &["sorted and unique", "f32[1, 1]"]);
}

#[test]
fn concat_types_and_errors() {
    let cat = |axis| Op::Concat { axis };
    assert_eq!(ok(cat(0), &[f32t(&[2, 3]), f32t(&[4, 3])]), f32t(&[6, 3]));
    assert_eq!(ok(cat(1), &[f32t(&[2, 3]), f32t(&[2, 1]), f32t(&[2, 0])]), f32t(&[2, 4]));
    assert_eq!(ok(cat(0), &[f32t(&[2, 3])]), f32t(&[2, 3]));
    assert_eq!(ok(cat(0), &[f32t(&[-1, 3]), f32t(&[4, 3])]), f32t(&[-1, 3]));
    assert_eq!(ok(cat(0), &[f32t(&[2, -1]), f32t(&[4, 3])]), f32t(&[6, 3]));
    err(cat(0), &[], &["at least one input"]);
    err(cat(0), &[f32t(&[2]), ty(I32, &[2])], &["different dtypes f32[2] and i32[2]"]);
    err(cat(0), &[f32t(&[2]), f32t(&[2, 3])], &["different ranks f32[2] and f32[2, 3]"]);
    err(cat(0), &[f32t(&[2, 3]), f32t(&[2, 4])], &["dimension 1", "f32[2, 3]", "f32[2, 4]"]);
    err(cat(2), &[f32t(&[2, 3]), f32t(&[2, 3])], &["axis 2 is out of range for f32[2, 3]"]);
    err(cat(0), &[f32t(&[]), f32t(&[])], &["axis 0 is out of range for f32[]"]);
}

#[test]
fn stack_types_and_errors() {
    let st = |axis| Op::Stack { axis };
    assert_eq!(ok(st(0), &[f32t(&[2, 3]), f32t(&[2, 3]), f32t(&[2, 3])]), f32t(&[3, 2, 3]));
    assert_eq!(ok(st(2), &[f32t(&[2, 3]), f32t(&[2, 3])]), f32t(&[2, 3, 2]));
    assert_eq!(ok(st(0), &[f32t(&[])]), f32t(&[1]));
    assert_eq!(ok(st(1), &[f32t(&[-1, 3]), f32t(&[2, -1])]), f32t(&[2, 2, 3]));
    err(st(0), &[], &["at least one input"]);
    err(st(0), &[f32t(&[2]), f32t(&[3])], &["different shapes f32[2] and f32[3]"]);
    err(st(0), &[f32t(&[2]), ty(I64, &[2])], &["different dtypes"]);
    err(st(3), &[f32t(&[2, 3])], &["axis 3 is out of range", "f32[2, 3]"]);
}

#[test]
fn slice_types_and_errors() {
    let sl = |specs: &[SliceSpec]| Op::Slice { specs: specs.to_vec() };
    let s = |start, stop, step| SliceSpec { start, stop, step };
    assert_eq!(ok(sl(&[s(Some(2), Some(8), 2)]), &[f32t(&[10])]), f32t(&[3]));
    assert_eq!(ok(sl(&[s(None, None, -1), SliceSpec::FULL]), &[f32t(&[10, -1])]), f32t(&[10, -1]));
    assert_eq!(ok(sl(&[SliceSpec::range(1, 3)]), &[f32t(&[-1])]), f32t(&[-1]));
    assert_eq!(ok(sl(&[SliceSpec::range(-3, 100)]), &[f32t(&[5])]), f32t(&[3]));
    assert_eq!(ok(sl(&[]), &[f32t(&[])]), f32t(&[]));
    err(sl(&[SliceSpec::FULL]), &[f32t(&[2, 3])], &["one spec per axis of f32[2, 3], got 1"]);
    err(sl(&[s(None, None, 0)]), &[f32t(&[2])], &["step of axis 0 is 0", "f32[2]"]);
}

#[test]
fn gather_types_and_errors() {
    let ga = |axis| Op::Gather { axis };
    assert_eq!(ok(ga(0), &[f32t(&[5, 3]), ty(I64, &[2, 4])]), f32t(&[2, 4, 3]));
    assert_eq!(ok(ga(1), &[f32t(&[5, 3]), ty(I32, &[-1])]), f32t(&[5, -1]));
    assert_eq!(ok(ga(0), &[f32t(&[5]), ty(I32, &[])]), f32t(&[]));
    err(ga(0), &[f32t(&[5, 3]), f32t(&[2])], &["indices must be i32 or i64, got f32[2]"]);
    err(ga(2), &[f32t(&[5, 3]), ty(I64, &[2])], &["axis 2 is out of range for f32[5, 3]"]);
}

#[test]
fn one_hot_types_and_errors() {
    let oh = |depth, dtype| Op::OneHot { depth, dtype };
    assert_eq!(ok(oh(10, F32), &[ty(I32, &[-1, 3])]), f32t(&[-1, 3, 10]));
    assert_eq!(ok(oh(4, Bool), &[ty(I64, &[])]), ty(Bool, &[4]));
    err(oh(4, F32), &[f32t(&[3])], &["one_hot", "indices must be i32 or i64, got f32[3]"]);
}

#[test]
fn parameter_and_constant() {
    err(Op::Parameter { index: 0 }, &[], &["Graph::add_param"]);
    let value = Storage::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    assert_eq!(ok(Op::Constant { value: value.clone() }, &[]), ty(I32, &[2, 3]));
    err(Op::Constant { value }, &[f32t(&[])], &["expected 0 inputs, got 1"]);
}

// ---- functions and variables ----

/// A graph with library function f0 `inner(x: f32[?, 3]) -> exp(x)`.
fn graph_with_callee() -> Graph {
    let mut inner = Graph::new("inner");
    let x = inner.add_param(f32t(&[-1, 3]));
    let y = node(&mut inner, Op::Unary(UnaryOp::Exp), &[x]);
    inner.outputs = vec![y];
    let mut g = Graph::new("outer");
    g.library.add(LibraryFunction { name: "inner".into(), attrs: Default::default(), graph: Arc::new(inner) });
    g
}

#[test]
fn call_types() {
    let g = graph_with_callee();
    let call = Op::Call { func: g.library.iter().next().unwrap().0 };
    // The outputs are the callee's output types, unknown dims included.
    let out = infer(&call, &[f32t(&[2, 3])], Some(&g)).unwrap();
    assert_eq!(out.to_vec(), vec![f32t(&[-1, 3])]);
    let out = infer(&call, &[f32t(&[-1, -1])], Some(&g)).unwrap();
    assert_eq!(out.to_vec(), vec![f32t(&[-1, 3])]);
}

#[test]
fn call_errors() {
    let g = graph_with_callee();
    let func = g.library.iter().next().unwrap().0;
    let call = Op::Call { func };
    let e = |inputs: &[TensorType], graph: Option<&Graph>| infer(&call, inputs, graph).unwrap_err().to_string();
    assert!(e(&[f32t(&[2, 3])], None).starts_with("call: needs the calling graph"));
    let m = e(&[], Some(&g));
    assert!(m.contains("f0 \"inner\" takes 1 argument, got 0"), "{m}");
    let m = e(&[f32t(&[2, 4])], Some(&g));
    assert!(m.contains("argument 0") && m.contains("f32[2, 4]") && m.contains("f32[?, 3]"), "{m}");
    assert!(e(&[ty(F64, &[2, 3])], Some(&g)).contains("f64[2, 3]"));
    assert!(e(&[f32t(&[3])], Some(&g)).contains("f32[3]"));
    let missing = Op::Call { func: tracejit_ir::FuncId::from_u32(7) };
    let m = infer(&missing, &[], Some(&g)).unwrap_err().to_string();
    assert_eq!(m, "call: unknown function f7");
}

#[test]
fn variable_types_and_errors() {
    let mut g = Graph::new("vars");
    let w = g.add_variable(TestVar::new("w", Storage::full(&[2, 3], F32, 0.0)));
    let flag = g.add_variable(TestVar::new("flag", Storage::full(&[], Bool, 0.0)));
    let read = Op::ReadVariable { var: w, locked: false };
    assert_eq!(infer(&read, &[], Some(&g)).unwrap().to_vec(), vec![f32t(&[2, 3])]);
    assert!(infer(&read, &[], None).unwrap_err().to_string().starts_with("read_variable: needs the graph"));
    let missing = Op::ReadVariable { var: tracejit_ir::VarId::from_u32(9), locked: false };
    assert_eq!(infer(&missing, &[], Some(&g)).unwrap_err().to_string(), "read_variable: unknown variable var9");

    let assign = |kind| Op::AssignVariable { var: w, kind, locked: false };
    for kind in [AssignKind::Assign, AssignKind::Add, AssignKind::Sub] {
        assert!(infer(&assign(kind), &[f32t(&[2, 3])], Some(&g)).unwrap().is_empty());
        assert!(infer(&assign(kind), &[f32t(&[-1, 3])], Some(&g)).unwrap().is_empty());
    }
    let m = infer(&assign(AssignKind::Add), &[ty(F64, &[2, 3])], Some(&g)).unwrap_err().to_string();
    assert!(m.starts_with("assign_variable:") && m.contains("f64[2, 3]") && m.contains("f32[2, 3]"), "{m}");
    assert!(m.contains("assign_add") && m.contains("\"w\""), "{m}");
    let m = infer(&assign(AssignKind::Assign), &[f32t(&[3])], Some(&g)).unwrap_err().to_string();
    assert!(m.contains("f32[3]") && m.contains("f32[2, 3]"), "{m}");
    let m = infer(&assign(AssignKind::Assign), &[], Some(&g)).unwrap_err().to_string();
    assert!(m.contains("expected 1 input, got 0"), "{m}");
    let m = infer(&Op::AssignVariable { var: flag, kind: AssignKind::Add, locked: false }, &[ty(Bool, &[])], Some(&g))
        .unwrap_err()
        .to_string();
    assert!(m.contains("bool variable"), "{m}");
    assert!(infer(
        &Op::AssignVariable { var: flag, kind: AssignKind::Assign, locked: false },
        &[ty(Bool, &[])],
        Some(&g)
    )
    .is_ok());
}

#[test]
fn add_node_reports_inference_errors() {
    let mut g = Graph::new("g");
    let a = g.add_param(f32t(&[3, 4]));
    let b = g.add_param(f32t(&[5]));
    let e = g.add_node(Op::Binary(BinaryOp::Add), &[a, b], &[], None).unwrap_err();
    assert_eq!(e.to_string(), "add: cannot broadcast [3, 4] with [5] (f32 and f32)");
    assert_eq!(g.len(), 2, "a rejected node is not added");
}

#[test]
fn num_inputs_and_outputs() {
    assert_eq!(Op::Select.num_inputs(), Some(3));
    assert_eq!(Op::Concat { axis: 0 }.num_inputs(), None);
    assert_eq!(Op::MatMul.num_outputs(), Some(1));
    assert_eq!(
        Op::AssignVariable { var: tracejit_ir::VarId::from_u32(0), kind: AssignKind::Add, locked: false }.num_outputs(),
        Some(0)
    );
}
