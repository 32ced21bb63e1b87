//! The interpreter against the kernels called directly: one small graph per
//! op family, library calls, variables, and the run-time checks of inputs
//! and of shapes left unknown at trace time.

use std::sync::Arc;

use tracejit_ir::tensor::kernels;
use tracejit_ir::tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{
    eval_primitive, interpret, verify, AssignKind, Graph, IrError, LibraryFunction, Op, TensorType, ValueId,
    VariableResource,
};

use crate::common::{f32s, f32t, i64s, node, node_ctrl, ty, TestVar};

/// Builds a graph with one parameter per input (typed exactly), applies
/// `build`, verifies it, runs it, and returns the outputs.
fn run(inputs: &[Storage], build: impl FnOnce(&mut Graph, &[ValueId]) -> Vec<ValueId>) -> Vec<Storage> {
    let mut g = Graph::new("test");
    let params: Vec<ValueId> = inputs.iter().map(|x| g.add_param(TensorType::known(x.dtype(), x.shape()))).collect();
    g.outputs = build(&mut g, &params);
    verify(&g).unwrap();
    interpret(&g, inputs).unwrap()
}

#[track_caller]
fn assert_same(got: &Storage, want: &Storage) {
    assert!(got.bit_eq(want), "got {got:?}, want {want:?}");
}

#[test]
fn elementwise_family() {
    let x = f32s(&[2, 3], 1);
    let y = f32s(&[3], 2);
    let out = run(&[x.clone(), y.clone()], |g, p| {
        let e = node(g, Op::Unary(UnaryOp::Tanh), &[p[0]]);
        let s = node(g, Op::Binary(BinaryOp::Mul), &[e, p[1]]);
        let c = node(g, Op::Binary(BinaryOp::Gt), &[p[0], p[1]]);
        let sel = node(g, Op::Select, &[c, s, p[1]]);
        let cl = node(g, Op::Clamp { min: -0.5, max: 0.5 }, &[sel]);
        let ca = node(g, Op::Cast { to: DType::I32 }, &[p[0]]);
        vec![e, s, sel, cl, ca]
    });
    let e = kernels::unary(UnaryOp::Tanh, &x);
    let s = kernels::binary(BinaryOp::Mul, &e, &y);
    let c = kernels::binary(BinaryOp::Gt, &x, &y);
    let sel = kernels::select(&c, &s, &y);
    assert_same(&out[0], &e);
    assert_same(&out[1], &s);
    assert_same(&out[2], &sel);
    assert_same(&out[3], &kernels::clamp(&sel, -0.5, 0.5));
    assert_same(&out[4], &kernels::cast(&x, DType::I32));
    assert_eq!(out[1].shape(), &[2, 3]);
}

#[test]
fn reduce_family() {
    let x = f32s(&[2, 3, 4], 3);
    let out = run(std::slice::from_ref(&x), |g, p| {
        let mut outs = Vec::new();
        for op in ReduceOp::ALL {
            outs.push(node(g, Op::Reduce { op, axes: vec![0, 2], keepdims: false }, &[p[0]]));
        }
        outs.push(node(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[p[0]]));
        outs.push(node(g, Op::ArgReduce { op: ArgReduceOp::ArgMax, axis: 1, keepdims: false }, &[p[0]]));
        outs.push(node(g, Op::ArgReduce { op: ArgReduceOp::ArgMin, axis: 2, keepdims: true }, &[p[0]]));
        outs
    });
    for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
        assert_same(&out[i], &kernels::reduce(op, &x, &[0, 2], false));
        assert_eq!(out[i].shape(), &[3]);
    }
    assert_same(&out[5], &kernels::reduce(ReduceOp::Sum, &x, &[1], true));
    assert_same(&out[6], &kernels::arg_reduce(ArgReduceOp::ArgMax, &x, 1, false));
    assert_same(&out[7], &kernels::arg_reduce(ArgReduceOp::ArgMin, &x, 2, true));
    assert_eq!(out[7].dtype(), DType::I64);
}

#[test]
fn matmul_family() {
    let a = f32s(&[2, 1, 3, 4], 4);
    let b = f32s(&[5, 4, 2], 5);
    let out = run(&[a.clone(), b.clone()], |g, p| vec![node(g, Op::MatMul, &[p[0], p[1]])]);
    assert_same(&out[0], &kernels::matmul(&a, &b));
    assert_eq!(out[0].shape(), &[2, 5, 3, 2]);
}

#[test]
fn shape_family() {
    let x = f32s(&[2, 3], 6);
    let y = f32s(&[4, 3], 7);
    let idx = i64s(vec![2, 0, 1, 2], &[2, 2]);
    let out = run(&[x.clone(), y.clone(), idx.clone()], |g, p| {
        vec![
            node(g, Op::Reshape { shape: vec![3, -1] }, &[p[0]]),
            node(g, Op::Transpose { perm: vec![1, 0] }, &[p[0]]),
            node(g, Op::BroadcastTo { shape: vec![5, 2, 3] }, &[p[0]]),
            node(g, Op::ExpandDims { axis: 1 }, &[p[0]]),
            {
                let e = node(g, Op::ExpandDims { axis: 0 }, &[p[0]]);
                node(g, Op::Squeeze { axes: vec![0] }, &[e])
            },
            node(g, Op::Concat { axis: 0 }, &[p[0], p[1]]),
            node(g, Op::Stack { axis: 1 }, &[p[0], p[0]]),
            node(
                g,
                Op::Slice { specs: vec![SliceSpec { start: None, stop: None, step: -1 }, SliceSpec::range(1, 3)] },
                &[p[1]],
            ),
            node(g, Op::Gather { axis: 1 }, &[p[0], p[2]]),
            node(g, Op::OneHot { depth: 3, dtype: DType::F32 }, &[p[2]]),
            {
                // A transpose is a view; reshaping it must follow the logical order.
                let t = node(g, Op::Transpose { perm: vec![1, 0] }, &[p[0]]);
                node(g, Op::ExpandDims { axis: 2 }, &[t])
            },
        ]
    });
    assert_same(&out[0], &kernels::reshape(&x, &[3, 2]));
    assert_same(&out[1], &kernels::transpose(&x, &[1, 0]));
    assert_same(&out[2], &kernels::broadcast_to(&x, &[5, 2, 3]));
    assert_same(&out[3], &kernels::reshape(&x, &[2, 1, 3]));
    assert_same(&out[4], &x);
    assert_same(&out[5], &kernels::concat(&[&x, &y], 0));
    assert_same(&out[6], &kernels::stack(&[&x, &x], 1));
    let specs = [SliceSpec { start: None, stop: None, step: -1 }, SliceSpec::range(1, 3)];
    assert_same(&out[7], &kernels::slice(&y, &specs));
    assert_same(&out[8], &kernels::gather(&x, &idx, 1));
    assert_same(&out[9], &kernels::one_hot(&idx, 3, DType::F32));
    assert_same(&out[10], &kernels::reshape(&kernels::transpose(&x, &[1, 0]), &[3, 2, 1]));
    assert_eq!(out[10].to_vec::<f32>().unwrap(), kernels::transpose(&x, &[1, 0]).to_vec::<f32>().unwrap());
    let shapes: Vec<&[usize]> = out.iter().map(|s| s.shape()).collect();
    assert_eq!(
        shapes,
        vec![
            &[3, 2][..],
            &[3, 2],
            &[5, 2, 3],
            &[2, 1, 3],
            &[2, 3],
            &[6, 3],
            &[2, 2, 3],
            &[4, 2],
            &[2, 2, 2],
            &[2, 2, 3],
            &[3, 2, 1],
        ]
    );
}

#[test]
fn constants_and_pass_through_outputs() {
    let x = f32s(&[3], 8);
    let c = Storage::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    let out = run(std::slice::from_ref(&x), |g, p| {
        let k = g.add_constant(c.clone());
        let s = node(g, Op::Binary(BinaryOp::Add), &[p[0], k]);
        vec![s, p[0], s, k]
    });
    let s = kernels::binary(BinaryOp::Add, &x, &c);
    assert_same(&out[0], &s);
    assert_same(&out[1], &x);
    assert_same(&out[2], &s);
    assert_same(&out[3], &c);
}

#[test]
fn eval_primitive_matches_kernels() {
    let x = f32s(&[2, 3], 9);
    let got = eval_primitive(&Op::Unary(UnaryOp::Exp), &[&x]);
    assert_eq!(got.len(), 1);
    assert_same(&got[0], &kernels::unary(UnaryOp::Exp, &x));
    let got = eval_primitive(&Op::Reshape { shape: vec![-1, 2] }, &[&x]);
    assert_same(&got[0], &kernels::reshape(&x, &[3, 2]));
    let c = Storage::scalar(2i64);
    assert_same(&eval_primitive(&Op::Constant { value: c.clone() }, &[])[0], &c);
}

#[test]
#[should_panic(expected = "not a primitive")]
fn eval_primitive_rejects_call() {
    eval_primitive(&Op::Call { func: tracejit_ir::FuncId::from_u32(0) }, &[]);
}

#[test]
#[should_panic(expected = "not a primitive")]
fn eval_primitive_rejects_parameter() {
    eval_primitive(&Op::Parameter { index: 0 }, &[]);
}

#[test]
#[should_panic(expected = "reshape: cannot reshape 6 elements into [4, 2]")]
fn eval_primitive_reshape_mismatch_panics() {
    let x = f32s(&[2, 3], 10);
    eval_primitive(&Op::Reshape { shape: vec![4, 2] }, &[&x]);
}

#[test]
fn call_to_library_function() {
    // inner(x, y) = (x * y, exp(x))
    let mut inner = Graph::new("inner");
    let a = inner.add_param(f32t(&[-1, 3]));
    let b = inner.add_param(f32t(&[3]));
    let m = node(&mut inner, Op::Binary(BinaryOp::Mul), &[a, b]);
    let e = node(&mut inner, Op::Unary(UnaryOp::Exp), &[a]);
    inner.outputs = vec![m, e];

    let mut g = Graph::new("outer");
    let f = g.library.add(LibraryFunction { name: "inner".into(), attrs: Default::default(), graph: Arc::new(inner) });
    let x = g.add_param(f32t(&[2, 3]));
    let y = g.add_param(f32t(&[3]));
    let call = g.add_node(Op::Call { func: f }, &[x, y], &[], None).unwrap();
    let s = node(&mut g, Op::Binary(BinaryOp::Add), &[ValueId::new(call, 0), ValueId::new(call, 1)]);
    g.outputs = vec![s, ValueId::new(call, 1)];
    verify(&g).unwrap();

    let xv = f32s(&[2, 3], 11);
    let yv = f32s(&[3], 12);
    let out = interpret(&g, &[xv.clone(), yv.clone()]).unwrap();
    let m = kernels::binary(BinaryOp::Mul, &xv, &yv);
    let e = kernels::unary(UnaryOp::Exp, &xv);
    assert_same(&out[0], &kernels::binary(BinaryOp::Add, &m, &e));
    assert_same(&out[1], &e);
}

#[test]
fn variables_read_and_assign_in_program_order() {
    let w = TestVar::new("w", Storage::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap());
    let mut g = Graph::new("step");
    let var = g.add_variable(w.clone());
    let x = g.add_param(f32t(&[3]));
    let r0 = node_ctrl(&mut g, Op::ReadVariable { var, locked: false }, &[], &[]);
    let a1 = node_ctrl(&mut g, Op::AssignVariable { var, kind: AssignKind::Add, locked: false }, &[x], &[r0]);
    let r1 = node_ctrl(&mut g, Op::ReadVariable { var, locked: false }, &[], &[a1]);
    let a2 = node_ctrl(
        &mut g,
        Op::AssignVariable { var, kind: AssignKind::Sub, locked: false },
        &[ValueId::from(r0)],
        &[r1],
    );
    let r2 = node_ctrl(&mut g, Op::ReadVariable { var, locked: false }, &[], &[a2]);
    let d = node(&mut g, Op::Binary(BinaryOp::Mul), &[ValueId::from(r1), x]);
    let a3 = node_ctrl(&mut g, Op::AssignVariable { var, kind: AssignKind::Assign, locked: false }, &[d], &[r2]);
    g.outputs = vec![ValueId::from(r0), ValueId::from(r1), ValueId::from(r2)];
    let _ = a3;
    verify(&g).unwrap();

    let w0 = w.read();
    let xv = f32s(&[3], 13);
    let out = interpret(&g, std::slice::from_ref(&xv)).unwrap();
    let w1 = kernels::binary(BinaryOp::Add, &w0, &xv);
    let w2 = kernels::binary(BinaryOp::Sub, &w1, &w0);
    assert_same(&out[0], &w0);
    assert_same(&out[1], &w1);
    assert_same(&out[2], &w2);
    assert_same(&w.read(), &kernels::binary(BinaryOp::Mul, &w1, &xv));

    // A second run sees the state the first one left.
    let w3 = w.read();
    let out = interpret(&g, std::slice::from_ref(&xv)).unwrap();
    assert_same(&out[0], &w3);
}

#[test]
fn bad_inputs_are_reported() {
    let mut g = Graph::new("f");
    let a = g.add_param(f32t(&[-1, 3]));
    let b = g.add_param(ty(DType::I32, &[]));
    g.outputs = vec![a, b];
    let msg = |inputs: &[Storage]| match interpret(&g, inputs) {
        Err(e @ IrError::BadInput { .. }) => e.to_string(),
        other => panic!("expected BadInput, got {other:?}"),
    };
    assert_eq!(msg(&[f32s(&[2, 3], 0)]), "graph `f`: expected 2 inputs, got 1");
    assert_eq!(
        msg(&[f32s(&[2, 4], 0), Storage::scalar(1i32)]),
        "graph `f`: input 0: expected f32[?, 3], got f32[2, 4]"
    );
    assert_eq!(msg(&[f32s(&[2, 3], 0), Storage::scalar(1i64)]), "graph `f`: input 1: expected i32[], got i64[]");
    // Any size fits an unknown dim; outputs pass straight through.
    let out = interpret(&g, &[f32s(&[0, 3], 0), Storage::scalar(1i32)]).unwrap();
    assert_eq!(out[0].shape(), &[0, 3]);
}

#[test]
fn run_time_shape_errors_name_the_op() {
    // Traced for [?] + [3]: a 4-element input only fails at run time.
    let mut g = Graph::new("f");
    let a = g.add_param(f32t(&[-1]));
    let b = g.add_param(f32t(&[3]));
    let s = node(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    g.outputs = vec![s];
    match interpret(&g, &[f32s(&[4], 0), f32s(&[3], 1)]) {
        Err(IrError::Op(e)) => assert_eq!(e.to_string(), "add: cannot broadcast [4] with [3] (f32 and f32)"),
        other => panic!("expected an op error, got {other:?}"),
    }

    // reshape to a fixed shape from an unknown element count.
    let mut g = Graph::new("r");
    let a = g.add_param(f32t(&[-1]));
    let r = node(&mut g, Op::Reshape { shape: vec![2, 2] }, &[a]);
    g.outputs = vec![r];
    match interpret(&g, &[f32s(&[5], 0)]) {
        Err(IrError::Op(e)) => {
            let m = e.to_string();
            assert!(m.starts_with("reshape:") && m.contains("5 elements") && m.contains("[2, 2]"), "{m}");
        }
        other => panic!("expected an op error, got {other:?}"),
    }

    // max over an axis that turns out to be empty.
    let mut g = Graph::new("m");
    let a = g.add_param(f32t(&[-1, 2]));
    let r = node(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdims: false }, &[a]);
    g.outputs = vec![r];
    match interpret(&g, &[f32s(&[0, 2], 0)]) {
        Err(IrError::Op(e)) => assert!(e.to_string().starts_with("max: cannot reduce an empty axis")),
        other => panic!("expected an op error, got {other:?}"),
    }
}

#[test]
fn unknown_dims_resolve_at_run_time() {
    let mut g = Graph::new("poly");
    let a = g.add_param(f32t(&[-1, 3]));
    let w = g.add_param(f32t(&[3, 2]));
    let m = node(&mut g, Op::MatMul, &[a, w]);
    let r = node(&mut g, Op::Reshape { shape: vec![-1] }, &[m]);
    g.outputs = vec![r];
    verify(&g).unwrap();
    for rows in [1, 4] {
        let av = f32s(&[rows, 3], rows as u64);
        let wv = f32s(&[3, 2], 99);
        let out = interpret(&g, &[av.clone(), wv.clone()]).unwrap();
        assert_same(&out[0], &kernels::reshape(&kernels::matmul(&av, &wv), &[rows * 2]));
    }
}

#[test]
fn broken_graphs_are_verifier_errors() {
    let mut g = Graph::new("b");
    let a = g.add_param(f32t(&[2]));
    g.outputs = vec![a, ValueId::from(tracejit_ir::NodeId::from_u32(5))];
    match interpret(&g, &[f32s(&[2], 0)]) {
        Err(IrError::Verifier { node, .. }) => assert_eq!(node, tracejit_ir::NodeId::from_u32(5)),
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

#[test]
fn test_var_roundtrip() {
    let v = TestVar::new("v", Storage::full(&[2], DType::I64, 3.0));
    assert_eq!(v.name(), "v");
    assert_eq!(v.shape(), vec![2]);
    v.write(Storage::full(&[2], DType::I64, 4.0));
    assert_eq!(v.read().to_vec::<i64>().unwrap(), vec![4, 4]);
}
