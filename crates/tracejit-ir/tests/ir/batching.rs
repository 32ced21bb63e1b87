//! Every batching rule against its reference: the batched graph
//! (`batch_graph`) on a batch equals the graph on each example, stacked,
//! for random inputs (a NaN among them), batch sizes 0, 1, 3 and 5, and
//! each operand mapped on a random axis or shared.

use proptest::prelude::*;
use tracejit_ir::batching::batch_graph;
use tracejit_ir::tensor::{kernels, ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};
use tracejit_ir::{interpret, Graph, Op, TensorType, ValueId};

/// One case: per-example parameter types (f64 values, or i64 indices below
/// the bound) and the body applied to them.
struct Case {
    name: &'static str,
    params: Vec<(Vec<usize>, Option<i64>)>,
    body: fn(&mut Graph, &[ValueId]) -> Vec<ValueId>,
}

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    ValueId::from(g.add_node(op, inputs, &[], None).unwrap_or_else(|e| panic!("{e}")))
}

fn nodes(g: &mut Graph, op: Op, inputs: &[ValueId]) -> Vec<ValueId> {
    let id = g.add_node(op, inputs, &[], None).unwrap_or_else(|e| panic!("{e}"));
    (0..g.node(id).outputs.len()).map(|i| ValueId::new(id, i as u32)).collect()
}

fn cases() -> Vec<Case> {
    let f = |s: &[usize]| (s.to_vec(), None);
    vec![
        Case { name: "unary", params: vec![f(&[2, 3])], body: |g, p| vec![node(g, Op::Unary(UnaryOp::Exp), &[p[0]])] },
        Case {
            name: "binary broadcasting",
            params: vec![f(&[2, 3]), f(&[3])],
            body: |g, p| vec![node(g, Op::Binary(BinaryOp::Sub), &[p[1], p[0]])],
        },
        Case {
            name: "select",
            params: vec![f(&[3]), f(&[2, 3]), f(&[1])],
            body: |g, p| {
                let c = node(g, Op::Binary(BinaryOp::Gt), &[p[0], p[2]]);
                vec![node(g, Op::Select, &[c, p[1], p[2]])]
            },
        },
        Case {
            name: "cast clamp",
            params: vec![f(&[4])],
            body: |g, p| {
                let c = node(g, Op::Clamp { min: -1.0, max: 0.5 }, &[p[0]]);
                vec![node(g, Op::Cast { to: DType::F32 }, &[c])]
            },
        },
        Case {
            name: "reductions",
            params: vec![f(&[2, 3])],
            body: |g, p| {
                vec![
                    node(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[p[0]]),
                    node(g, Op::Reduce { op: ReduceOp::Max, axes: vec![0, 1], keepdims: false }, &[p[0]]),
                    node(g, Op::ArgReduce { op: ArgReduceOp::ArgMax, axis: 0, keepdims: false }, &[p[0]]),
                    node(g, Op::Cumsum { axis: 1 }, &[p[0]]),
                ]
            },
        },
        Case {
            name: "matmul",
            params: vec![f(&[2, 3]), f(&[3, 4]), f(&[2, 2, 3])],
            body: |g, p| vec![node(g, Op::MatMul, &[p[0], p[1]]), node(g, Op::MatMul, &[p[2], p[1]])],
        },
        Case {
            name: "shape ops",
            params: vec![f(&[2, 3]), f(&[3])],
            body: |g, p| {
                vec![
                    node(g, Op::Reshape { shape: vec![3, -1] }, &[p[0]]),
                    node(g, Op::Transpose { perm: vec![1, 0] }, &[p[0]]),
                    node(g, Op::BroadcastTo { shape: vec![2, 3] }, &[p[1]]),
                    node(g, Op::ExpandDims { axis: 1 }, &[p[1]]),
                    node(g, Op::Concat { axis: 0 }, &[p[1], p[1]]),
                    node(g, Op::Stack { axis: 1 }, &[p[0], p[0]]),
                ]
            },
        },
        Case {
            name: "squeeze slice pad",
            params: vec![f(&[1, 5])],
            body: |g, p| {
                let specs = vec![SliceSpec::FULL, SliceSpec { start: Some(4), stop: None, step: -2 }];
                vec![
                    node(g, Op::Squeeze { axes: vec![0] }, &[p[0]]),
                    node(g, Op::Slice { specs }, &[p[0]]),
                    node(g, Op::Pad { pads: vec![(1, 0), (0, 2)], value: 7.0 }, &[p[0]]),
                    nodes(g, Op::TopK { k: 2 }, &[p[0]])[1],
                ]
            },
        },
    ]
    .into_iter()
    .chain(indexing_cases())
    .collect()
}

/// The indexing ops' cases: integer indices and starts.
fn indexing_cases() -> Vec<Case> {
    let f = |s: &[usize]| (s.to_vec(), None);
    let i = |s: &[usize], bound: i64| (s.to_vec(), Some(bound));
    vec![
        Case {
            name: "gather",
            params: vec![f(&[4, 2]), i(&[3], 4)],
            body: |g, p| {
                vec![
                    node(g, Op::Gather { axis: 0 }, &[p[0], p[1]]),
                    node(g, Op::OneHot { depth: 4, dtype: DType::F64 }, &[p[1]]),
                ]
            },
        },
        Case {
            name: "gather_elements scatter_add",
            params: vec![f(&[3, 2]), i(&[2, 2], 3), f(&[2, 2])],
            body: |g, p| {
                vec![
                    node(g, Op::GatherElements { axis: 0 }, &[p[0], p[1]]),
                    node(g, Op::ScatterAdd { axis: 0 }, &[p[0], p[1], p[2]]),
                ]
            },
        },
        Case {
            name: "dynamic windows",
            params: vec![f(&[4, 3]), i(&[2], 4), f(&[2, 2])],
            body: |g, p| {
                let shared = g.add_constant(Storage::from_vec(vec![1i64, 1], &[2]).unwrap());
                vec![
                    node(g, Op::DynamicSlice { sizes: vec![2, 2] }, &[p[0], p[1]]),
                    node(g, Op::DynamicUpdateSlice, &[p[0], p[2], shared]),
                ]
            },
        },
    ]
}

/// Values for a per-example type, `n` examples stacked on `axis` (or one
/// shared value), a NaN first when asked.
fn values(shape: &[usize], bound: Option<i64>, seed: u64, nan: bool) -> Storage {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s >> 33
    };
    match bound {
        Some(b) => Storage::from_vec((0..n).map(|_| (next() % b as u64) as i64).collect::<Vec<_>>(), shape).unwrap(),
        None => {
            let mut v: Vec<f64> = (0..n).map(|_| (next() % 1000) as f64 / 250.0 - 2.0).collect();
            if nan && n > 1 {
                v[1] = f64::NAN;
            }
            Storage::from_vec(v, shape).unwrap()
        }
    }
}

fn example(x: &Storage, axis: usize, i: usize) -> Storage {
    let mut specs = vec![SliceSpec::FULL; x.rank()];
    specs[axis] = SliceSpec { start: Some(i as i64), stop: Some(i as i64 + 1), step: 1 };
    let s = kernels::slice(x, &specs);
    let mut shape = s.shape().to_vec();
    shape.remove(axis);
    kernels::reshape(&s, &shape)
}

fn same(a: &Storage, b: &Storage) -> bool {
    let (a, b) = (kernels::cast(a, DType::F64), kernels::cast(b, DType::F64));
    a.shape() == b.shape()
        && a.to_vec::<f64>()
            .unwrap()
            .iter()
            .zip(b.to_vec::<f64>().unwrap())
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-12 * (1.0 + y.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn batched_graphs_match_stacked_examples(
        which in 0usize..11,
        n in prop::sample::select(vec![0usize, 1, 3, 5]),
        axes in prop::collection::vec(0usize..4, 3),
        seed in 0u64..10_000,
        nan in any::<bool>(),
    ) {
        let case = &cases()[which];
        let mut g = Graph::new(case.name);
        let params: Vec<ValueId> = case.params.iter().map(|(s, b)| {
            g.add_param(TensorType::known(if b.is_some() { DType::I64 } else { DType::F64 }, s))
        }).collect();
        g.outputs = (case.body)(&mut g, &params);
        // Each parameter mapped on some axis of its rank, or shared (one at
        // least mapped).
        let mut in_axes: Vec<Option<usize>> = case.params.iter().zip(&axes)
            .map(|((s, _), &a)| (a <= s.len()).then_some(a)).collect();
        if in_axes.iter().all(Option::is_none) {
            in_axes[0] = Some(0);
        }
        let inputs: Vec<Storage> = case.params.iter().zip(&in_axes).enumerate().map(|(k, ((s, b), a))| {
            let mut shape = s.clone();
            if let Some(a) = a { shape.insert(*a, n); }
            values(&shape, *b, seed + k as u64, nan)
        }).collect();
        let batched = batch_graph(&g, &in_axes, n).map_err(|e| TestCaseError::fail(format!("{}: {e}", case.name)))?;
        tracejit_ir::verify(&batched).map_err(|e| TestCaseError::fail(format!("{}: {e}", case.name)))?;
        let got = interpret(&batched, &inputs).map_err(|e| TestCaseError::fail(format!("{}: {e}", case.name)))?;
        let per: Vec<Vec<Storage>> = (0..n).map(|i| {
            let args: Vec<Storage> = inputs.iter().zip(&in_axes).map(|(x, a)| match a {
                Some(a) => example(x, *a, i),
                None => x.clone(),
            }).collect();
            interpret(&g, &args).unwrap()
        }).collect();
        for (j, out) in got.iter().enumerate() {
            let mut want_shape = g.output_types()[j].shape().unwrap();
            want_shape.insert(0, n);
            prop_assert_eq!(out.shape(), &want_shape[..], "{} output {}", case.name, j);
            if n > 0 {
                let rows: Vec<&Storage> = per.iter().map(|r| &r[j]).collect();
                let want = kernels::stack(&rows, 0);
                prop_assert!(same(out, &want), "{} output {} with in_axes {:?}: {:?} vs {:?}", case.name, j, in_axes, out, want);
            }
        }
    }
}

#[test]
fn a_filter_gradient_per_example_is_one_grouped_convolution() {
    let mut g = Graph::new("w");
    let x = g.add_param(TensorType::known(DType::F64, &[2]));
    let grad = Op::Spatial(tracejit_ir::tensor::SpatialOp::Conv2dBackwardFilter {
        conv: tracejit_ir::tensor::Conv2dAttrs::DEFAULT,
        kernel: [1, 1],
        bias: false,
    });
    let x4 = node(&mut g, Op::Reshape { shape: vec![1, 1, 1, 2] }, &[x]);
    g.outputs = vec![node(&mut g, grad, &[x4, x4])];
    let batched = batch_graph(&g, &[Some(0)], 3).unwrap();
    assert!(format!("{batched:?}").contains("groups: 3"), "{batched:?}");
    // Example b's 1x1 filter gradient of x against itself: Σ x_b².
    let xs = Storage::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, -5.0, 0.5], &[3, 2]).unwrap();
    let out = interpret(&batched, &[xs]).unwrap();
    assert_eq!(out[0].shape(), &[3, 1, 1, 1, 1]);
    assert_eq!(out[0].to_vec::<f64>().unwrap(), [5.0, 25.0, 25.25]);
}
