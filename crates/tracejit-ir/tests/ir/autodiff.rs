//! The VJP rules against central finite differences, through the
//! interpreter, in f64: every differentiable unary and binary op (with
//! broadcasting on either side), select, clamp, every reduction with and
//! without keepdims, batched matmul, the shape ops, and inputs whose dims
//! are unknown in the trace; plus the ops that give no gradient and the
//! ones without a rule yet.

use proptest::prelude::*;
use tracejit_ir::autodiff::grad_graph;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{interpret, verify, Graph, Op, TensorType, ValueId};

use crate::common::node;

/// Deterministic f64 data in `[lo, hi]`.
pub(crate) fn data(shape: &[usize], seed: u64, lo: f64, hi: f64) -> Storage {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let v = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect();
    Storage::from_vec(v, shape).unwrap()
}

/// `loss = sum(f(params) * w)` for a fixed random `w`, so that the seed
/// cotangent is not uniform.
fn loss_graph(param_dims: &[Vec<i64>], f: &dyn Fn(&mut Graph, &[ValueId]) -> ValueId, out_shape: &[usize]) -> Graph {
    let mut g = Graph::new("loss");
    let ps: Vec<ValueId> = param_dims.iter().map(|d| g.add_param(TensorType::from_spec(DType::F64, d))).collect();
    let y = f(&mut g, &ps);
    let w = g.add_constant(data(out_shape, 99, -1.0, 1.0));
    let yw = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, w]);
    let rank = out_shape.len();
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: (0..rank).collect(), keepdims: false }, &[yw]);
    g.outputs.push(s);
    g
}

fn scalar_of(s: &Storage) -> f64 {
    s.to_vec::<f64>().unwrap()[0]
}

/// Checks the gradient of `loss` w.r.t. every input against central
/// differences at `inputs`.
pub(crate) fn check_grads(g: &Graph, inputs: &[Storage]) {
    verify(g).unwrap();
    let wrt: Vec<usize> = (0..inputs.len()).collect();
    let dg = grad_graph(g, &wrt).unwrap_or_else(|e| panic!("{e}\n{g}"));
    verify(&dg).unwrap_or_else(|e| panic!("{e}\n{dg}"));
    let out = interpret(&dg, inputs).unwrap();
    for (k, x) in inputs.iter().enumerate() {
        let got = out[1 + k].to_vec::<f64>().unwrap();
        assert_eq!(out[1 + k].shape(), x.shape(), "gradient {k} has the input's shape");
        let xs = x.to_vec::<f64>().unwrap();
        for i in 0..xs.len() {
            let h = 1e-6 * xs[i].abs().max(1.0);
            let at = |d: f64| {
                let mut v = xs.clone();
                v[i] += d;
                let mut ins = inputs.to_vec();
                ins[k] = Storage::from_vec(v, x.shape()).unwrap();
                scalar_of(&interpret(g, &ins).unwrap()[0])
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let tol = 1e-5 * fd.abs().max(1.0);
            assert!(
                (got[i] - fd).abs() <= tol,
                "input {k} element {i}: autodiff {} vs finite differences {fd}\n{g}",
                got[i]
            );
        }
    }
}

fn unary_case(u: UnaryOp) -> (f64, f64) {
    use UnaryOp::*;
    match u {
        Log | Sqrt | Rsqrt | Reciprocal => (0.3, 3.0),
        Log1p => (-0.5, 3.0),
        // Away from the kink at 0.
        Abs | Relu => (0.1, 2.0),
        _ => (-2.0, 2.0),
    }
}

#[test]
fn every_differentiable_unary_op() {
    for u in UnaryOp::ALL {
        if u.result_dtype(DType::F64) != Some(DType::F64) {
            continue;
        }
        if matches!(u, UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round) {
            continue;
        }
        let (lo, hi) = unary_case(u);
        let g = loss_graph(&[vec![3, 5]], &|g, p| node(g, Op::Unary(u), &[p[0]]), &[3, 5]);
        // Relu and abs also on negative values.
        let x = if matches!(u, UnaryOp::Abs | UnaryOp::Relu) {
            Storage::from_vec(
                (0..15).map(|i| if i % 2 == 0 { 0.5 + i as f64 } else { -0.7 - i as f64 }).collect(),
                &[3, 5],
            )
            .unwrap()
        } else {
            data(&[3, 5], u as u64, lo, hi)
        };
        check_grads(&g, &[x]);
    }
}

#[test]
fn every_differentiable_binary_op_with_broadcasting() {
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Rem,
    ];
    // (a dims, b dims, result shape)
    let shapes: [(&[i64], &[i64], &[usize]); 4] =
        [(&[3, 4], &[3, 4], &[3, 4]), (&[3, 4], &[4], &[3, 4]), (&[1, 4], &[3, 1], &[3, 4]), (&[], &[2, 3], &[2, 3])];
    for op in ops {
        for (sa, sb, out) in shapes {
            let g = loss_graph(&[sa.to_vec(), sb.to_vec()], &|g, p| node(g, Op::Binary(op), &[p[0], p[1]]), out);
            let sa: Vec<usize> = sa.iter().map(|&d| d as usize).collect();
            let sb: Vec<usize> = sb.iter().map(|&d| d as usize).collect();
            // Positive bases for pow; operands apart for max/min and rem.
            let a = data(&sa, 1, 0.5, 2.0);
            let b = data(&sb, 2, 2.5, 4.0);
            check_grads(&g, &[a, b]);
        }
    }
}

#[test]
fn select_clamp_and_non_differentiable_ops() {
    let g = loss_graph(
        &[vec![2, 3], vec![2, 3]],
        &|g, p| {
            let c = node(g, Op::Binary(BinaryOp::Gt), &[p[0], p[1]]);
            node(g, Op::Select, &[c, p[0], p[1]])
        },
        &[2, 3],
    );
    check_grads(&g, &[data(&[2, 3], 3, -1.0, 1.0), data(&[2, 3], 4, -1.0, 1.0)]);
    let g = loss_graph(&[vec![7]], &|g, p| node(g, Op::Clamp { min: -0.5, max: 0.5 }, &[p[0]]), &[7]);
    check_grads(&g, &[Storage::from_vec(vec![-2.0, -0.4, 0.0, 0.3, 0.45, 1.0, 3.0], &[7]).unwrap()]);
    // floor has no gradient: zeros, of the input's shape.
    let g = loss_graph(&[vec![4]], &|g, p| node(g, Op::Unary(UnaryOp::Floor), &[p[0]]), &[4]);
    let out = interpret(&grad_graph(&g, &[0]).unwrap(), &[data(&[4], 5, -2.0, 2.0)]).unwrap();
    assert_eq!(out[1].to_vec::<f64>().unwrap(), vec![0.0; 4]);
}

#[test]
fn every_reduction_with_and_without_keepdims() {
    for r in ReduceOp::ALL {
        for (axes, keepdims, out) in
            [(vec![1], false, vec![2, 4]), (vec![0, 2], true, vec![1, 3, 1]), (vec![0, 1, 2], false, vec![])]
        {
            let ax = axes.clone();
            let g = loss_graph(
                &[vec![2, 3, 4]],
                &move |g, p| node(g, Op::Reduce { op: r, axes: ax.clone(), keepdims }, &[p[0]]),
                &out,
            );
            // Distinct values (no ties) away from 0 (prod).
            let x = data(&[2, 3, 4], 7 + r as u64, 0.5, 1.5);
            check_grads(&g, &[x]);
        }
    }
}

#[test]
fn max_shares_the_gradient_among_ties() {
    let mut g = Graph::new("ties");
    let x = g.add_param(TensorType::known(DType::F64, &[4]));
    let m = node(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdims: false }, &[x]);
    g.outputs.push(m);
    let out = interpret(&grad_graph(&g, &[0]).unwrap(), &[Storage::from_vec(vec![1.0, 3.0, 3.0, 2.0], &[4]).unwrap()])
        .unwrap();
    assert_eq!(out[1].to_vec::<f64>().unwrap(), vec![0.0, 0.5, 0.5, 0.0]);
}

#[test]
fn batched_matmul_and_shape_ops() {
    let g = loss_graph(&[vec![2, 3, 4], vec![4, 5]], &|g, p| node(g, Op::MatMul, &[p[0], p[1]]), &[2, 3, 5]);
    check_grads(&g, &[data(&[2, 3, 4], 11, -1.0, 1.0), data(&[4, 5], 12, -1.0, 1.0)]);
    type Build = Box<dyn Fn(&mut Graph, &[ValueId]) -> ValueId>;
    let cases: Vec<(Vec<i64>, Build, Vec<usize>)> = vec![
        (vec![2, 6], Box::new(|g, p| node(g, Op::Reshape { shape: vec![3, -1] }, &[p[0]])), vec![3, 4]),
        (vec![2, 3, 4], Box::new(|g, p| node(g, Op::Transpose { perm: vec![2, 0, 1] }, &[p[0]])), vec![4, 2, 3]),
        (vec![3, 1], Box::new(|g, p| node(g, Op::BroadcastTo { shape: vec![2, 3, 4] }, &[p[0]])), vec![2, 3, 4]),
        (vec![3], Box::new(|g, p| node(g, Op::ExpandDims { axis: 1 }, &[p[0]])), vec![3, 1]),
        (vec![3, 1, 2], Box::new(|g, p| node(g, Op::Squeeze { axes: vec![1] }, &[p[0]])), vec![3, 2]),
        (vec![2, 3], Box::new(|g, p| node(g, Op::Concat { axis: 1 }, &[p[0], p[0]])), vec![2, 6]),
        (vec![2, 3], Box::new(|g, p| node(g, Op::Stack { axis: 0 }, &[p[0], p[0], p[0]])), vec![3, 2, 3]),
    ];
    for (i, (dims, f, out)) in cases.into_iter().enumerate() {
        let g = loss_graph(std::slice::from_ref(&dims), &*f, &out);
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        check_grads(&g, &[data(&shape, 20 + i as u64, -1.0, 1.0)]);
    }
}

#[test]
fn unknown_dims_in_the_trace() {
    // A dense layer with a batch of unknown size: x[?, 3] @ w[3, 2] + b[2],
    // then the mean over the batch: every gradient, for two batch sizes.
    let f = |g: &mut Graph, p: &[ValueId]| {
        let h = node(g, Op::MatMul, &[p[0], p[1]]);
        let h = node(g, Op::Binary(BinaryOp::Add), &[h, p[2]]);
        let h = node(g, Op::Unary(UnaryOp::Tanh), &[h]);
        node(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdims: false }, &[h])
    };
    let g = loss_graph(&[vec![-1, 3], vec![3, 2], vec![2]], &f, &[2]);
    for n in [1, 5] {
        check_grads(
            &g,
            &[data(&[n, 3], 30 + n as u64, -1.0, 1.0), data(&[3, 2], 31, -1.0, 1.0), data(&[2], 32, -1.0, 1.0)],
        );
    }
}

#[test]
fn slices_and_gathers_scatter_back() {
    let specs = |s: &[(i64, i64)]| s.iter().map(|&(a, b)| SliceSpec::range(a, b)).collect::<Vec<_>>();
    for (sp, out) in [
        (vec![SliceSpec::range(1, 3), SliceSpec::FULL], vec![2, 4]),
        (specs(&[(0, 2), (1, 4)]), vec![2, 3]),
        (vec![SliceSpec::FULL, SliceSpec { start: Some(-2), stop: None, step: 1 }], vec![4, 2]),
        // Other steps, negative ones too, scatter through a selection matrix.
        (
            vec![SliceSpec { start: None, stop: None, step: 2 }, SliceSpec { start: None, stop: None, step: -1 }],
            vec![2, 4],
        ),
        (vec![SliceSpec::FULL, SliceSpec { start: Some(3), stop: Some(0), step: -2 }], vec![4, 2]),
        (vec![SliceSpec { start: Some(1), stop: None, step: 3 }, SliceSpec::range(1, 3)], vec![1, 2]),
    ] {
        let sp2 = sp.clone();
        let g = loss_graph(&[vec![4, 4]], &move |g, p| node(g, Op::Slice { specs: sp2.clone() }, &[p[0]]), &out);
        check_grads(&g, &[data(&[4, 4], 40, -1.0, 1.0)]);
    }
    // gather along axis 0 and 1, with repeated and negative indices (on
    // axis 1, of size 3, -1 and 2 are the same column).
    for (axis, out) in [(0usize, vec![5, 3]), (1, vec![4, 5])] {
        let g = loss_graph(
            &[vec![4, 3]],
            &move |g, p| {
                let idx = g.add_constant(Storage::from_vec(vec![0i64, 2, -1, 2, 1], &[5]).unwrap());
                node(g, Op::Gather { axis }, &[p[0], idx])
            },
            &out,
        );
        check_grads(&g, &[data(&[4, 3], 41 + axis as u64, -1.0, 1.0)]);
    }
}

#[test]
fn ops_without_a_rule_are_errors_naming_them() {
    let g = loss_graph(
        &[vec![4]],
        &move |g, p| {
            let mut body = Graph::new("region");
            let x = body.add_param(TensorType::known(DType::F64, &[4]));
            let y = node(&mut body, Op::Unary(UnaryOp::Exp), &[x]);
            body.outputs.push(y);
            node(g, Op::Fused { body: std::sync::Arc::new(body) }, &[p[0]])
        },
        &[4],
    );
    let e = grad_graph(&g, &[0]).unwrap_err().to_string();
    assert!(e.contains("`fused`") && e.contains("fusion"), "{e}");
    let e = grad_graph(&g, &[3]).unwrap_err().to_string();
    assert!(e.contains("source 3 is not an input"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random chains of differentiable elementwise ops over broadcast
    /// shapes, odd sizes included.
    #[test]
    fn random_elementwise_chains(rows in prop::sample::select(vec![1usize, 3, 5]), cols in prop::sample::select(vec![1usize, 2, 7]), seed in any::<u64>(), picks in prop::collection::vec(0usize..6, 1..6)) {
        let picks2 = picks.clone();
        let g = loss_graph(&[vec![rows as i64, cols as i64], vec![cols as i64]], &move |g, p| {
            let mut y = p[0];
            for &k in &picks2 {
                y = match k {
                    0 => node(g, Op::Unary(UnaryOp::Tanh), &[y]),
                    1 => node(g, Op::Binary(BinaryOp::Mul), &[y, p[1]]),
                    2 => node(g, Op::Binary(BinaryOp::Add), &[y, p[1]]),
                    3 => node(g, Op::Unary(UnaryOp::Sigmoid), &[y]),
                    4 => node(g, Op::Unary(UnaryOp::Sin), &[y]),
                    _ => node(g, Op::Unary(UnaryOp::Square), &[y]),
                };
            }
            y
        }, &[rows, cols]);
        check_grads(&g, &[data(&[rows, cols], seed, -1.0, 1.0), data(&[cols], seed ^ 1, -1.0, 1.0)]);
    }
}
