//! VJPs of the shape ops on inputs whose dims are unknown in the trace (an
//! input signature with `-1`), against central finite differences through
//! the interpreter, at several run-time sizes including 0 and 1: slices of
//! the unknown axis with every sign of bound, slices of a known axis under
//! an unknown batch, gathers with a batch of indices or of params, concat
//! of one input of unknown length; and what stays refused, by name.

use tracejit_ir::autodiff::grad_graph;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, SliceSpec, Storage};
use tracejit_ir::{interpret, Graph, Op, TensorType, ValueId};

use crate::autodiff::{check_grads, data};
use crate::common::node;

/// `loss = sum(y * y + y)` for `y = f(params)`: a data-dependent cotangent
/// (`2y + 1`) whatever `y`'s shape, known or not.
fn loss_graph(param_dims: &[Vec<i64>], f: &dyn Fn(&mut Graph, &[ValueId]) -> ValueId) -> Graph {
    let mut g = Graph::new("loss");
    let ps: Vec<ValueId> = param_dims.iter().map(|d| g.add_param(TensorType::from_spec(DType::F64, d))).collect();
    let y = f(&mut g, &ps);
    let yy = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, y]);
    let t = node(&mut g, Op::Binary(BinaryOp::Add), &[yy, y]);
    let rank = g.value_type(t).rank();
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: (0..rank).collect(), keepdims: false }, &[t]);
    g.outputs.push(s);
    g
}

fn spec(start: Option<i64>, stop: Option<i64>) -> SliceSpec {
    SliceSpec { start, stop, step: 1 }
}

#[test]
fn slices_of_an_axis_of_unknown_length() {
    let cases = [
        spec(Some(1), None),
        spec(None, Some(-1)),
        spec(Some(1), Some(-1)),
        spec(Some(2), Some(-1)),
        spec(Some(-3), None),
        spec(Some(-3), Some(-1)),
        spec(Some(1), Some(3)),
        spec(None, Some(2)),
        spec(Some(0), Some(4)),
        spec(Some(3), Some(1)),
        spec(Some(-1), Some(-3)),
    ];
    for s in cases {
        let g =
            loss_graph(&[vec![-1, 2]], &move |g, p| node(g, Op::Slice { specs: vec![s, SliceSpec::FULL] }, &[p[0]]));
        for n in [0usize, 1, 3, 5] {
            check_grads(&g, &[data(&[n, 2], 50 + n as u64, -1.0, 1.0)]);
        }
    }
}

#[test]
fn slices_of_known_axes_under_an_unknown_batch() {
    for specs in [
        vec![SliceSpec::FULL, SliceSpec::range(1, 3)],
        vec![SliceSpec::FULL, spec(Some(-2), None)],
        vec![spec(Some(1), None), SliceSpec::range(0, 2)],
        vec![spec(None, Some(-1)), spec(Some(1), Some(-1))],
    ] {
        let g = loss_graph(&[vec![-1, 4]], &move |g, p| node(g, Op::Slice { specs: specs.clone() }, &[p[0]]));
        for n in [1usize, 3] {
            check_grads(&g, &[data(&[n, 4], 60 + n as u64, -1.0, 1.0)]);
        }
    }
    // Two unknown axes, both sliced.
    let g = loss_graph(&[vec![-1, -1]], &|g, p| {
        node(g, Op::Slice { specs: vec![spec(Some(1), None), spec(None, Some(-1))] }, &[p[0]])
    });
    for (r, c) in [(1usize, 1usize), (3, 2), (2, 5)] {
        check_grads(&g, &[data(&[r, c], 70 + (r * c) as u64, -1.0, 1.0)]);
    }
}

#[test]
fn gathers_with_unknown_dims() {
    // A batch of indices of unknown length into a known table (embeddings);
    // the indices are an i64 input, not differentiated.
    let mut g = Graph::new("embed");
    let table = g.add_param(TensorType::known(DType::F64, &[4, 3]));
    let idx = g.add_param(TensorType::from_spec(DType::I64, &[-1]));
    let rows = node(&mut g, Op::Gather { axis: 0 }, &[table, idx]);
    let sq = node(&mut g, Op::Binary(BinaryOp::Mul), &[rows, rows]);
    let t = node(&mut g, Op::Binary(BinaryOp::Add), &[sq, rows]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdims: false }, &[t]);
    g.outputs.push(s);
    for idx in [vec![], vec![2i64], vec![0, 3, -1, 3, 1]] {
        let n = idx.len();
        let inputs = [data(&[4, 3], 80 + n as u64, -1.0, 1.0), Storage::from_vec(idx, &[n]).unwrap()];
        check_grads_wrt(&g, &inputs, &[0]);
    }
    // Params with an unknown batch, gathered along a known axis.
    let g = loss_graph(&[vec![-1, 4]], &|g, p| {
        let idx = g.add_constant(Storage::from_vec(vec![3i64, 0, 3, -2], &[2, 2]).unwrap());
        node(g, Op::Gather { axis: 1 }, &[p[0], idx])
    });
    for n in [0usize, 1, 3] {
        check_grads(&g, &[data(&[n, 4], 90 + n as u64, -1.0, 1.0)]);
    }
    // The gathered axis itself unknown: a scatter-add needs no size.
    let g = loss_graph(&[vec![-1, 2]], &|g, p| {
        let idx = g.add_constant(Storage::from_vec(vec![0i64, -1, 0], &[3]).unwrap());
        node(g, Op::Gather { axis: 0 }, &[p[0], idx])
    });
    for n in [1usize, 3] {
        check_grads(&g, &[data(&[n, 2], 95 + n as u64, -1.0, 1.0)]);
    }
    // Two unknowns a reshape cannot both resolve: refused by name.
    let mut g = Graph::new("two_unknown");
    let table = g.add_param(TensorType::from_spec(DType::F64, &[-1, 3]));
    let idx = g.add_param(TensorType::from_spec(DType::I64, &[-1]));
    let rows = node(&mut g, Op::Gather { axis: 1 }, &[table, idx]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdims: false }, &[rows]);
    g.outputs.push(s);
    let e = grad_graph(&g, &[0]).unwrap_err().to_string();
    assert!(e.contains("`gather`") && e.contains("unknown in the trace"), "{e}");
}

/// [`check_grads`] for the inputs `wrt` only (the others may be integers).
fn check_grads_wrt(g: &Graph, inputs: &[Storage], wrt: &[usize]) {
    let dg = grad_graph(g, wrt).unwrap_or_else(|e| panic!("{e}\n{g}"));
    tracejit_ir::verify(&dg).unwrap_or_else(|e| panic!("{e}\n{dg}"));
    let out = interpret(&dg, inputs).unwrap();
    for (j, &k) in wrt.iter().enumerate() {
        let x = &inputs[k];
        assert_eq!(out[1 + j].shape(), x.shape(), "gradient {k} has the input's shape");
        let got = out[1 + j].to_vec::<f64>().unwrap();
        let xs = x.to_vec::<f64>().unwrap();
        for i in 0..xs.len() {
            let h = 1e-6;
            let at = |d: f64| {
                let mut v = xs.clone();
                v[i] += d;
                let mut ins = inputs.to_vec();
                ins[k] = Storage::from_vec(v, x.shape()).unwrap();
                interpret(g, &ins).unwrap()[0].to_vec::<f64>().unwrap()[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!((got[i] - fd).abs() <= 1e-5 * fd.abs().max(1.0), "input {k} element {i}: {} vs {fd}", got[i]);
        }
    }
}

#[test]
fn concat_with_one_input_of_unknown_length() {
    type Build = Box<dyn Fn(&mut Graph, &[ValueId]) -> ValueId>;
    let square = |g: &mut Graph, v: ValueId| node(g, Op::Binary(BinaryOp::Mul), &[v, v]);
    let cases: Vec<Build> = vec![
        Box::new(move |g, p| {
            let sq = square(g, p[1]);
            node(g, Op::Concat { axis: 0 }, &[p[0], sq])
        }),
        Box::new(move |g, p| {
            let sq = square(g, p[1]);
            node(g, Op::Concat { axis: 0 }, &[sq, p[0]])
        }),
        Box::new(move |g, p| {
            let sq = square(g, p[1]);
            node(g, Op::Concat { axis: 0 }, &[p[1], p[0], sq])
        }),
    ];
    for f in cases {
        let g = loss_graph(&[vec![-1, 2], vec![3, 2]], &*f);
        for n in [0usize, 1, 4] {
            check_grads(&g, &[data(&[n, 2], 100 + n as u64, -1.0, 1.0), data(&[3, 2], 101, -1.0, 1.0)]);
        }
    }
    // Two inputs of unknown length: refused by name.
    let g = loss_graph(&[vec![-1, 2]], &|g, p| node(g, Op::Concat { axis: 0 }, &[p[0], p[0]]));
    let e = grad_graph(&g, &[0]).unwrap_err().to_string();
    assert!(e.contains("`concat`") && e.contains("more than one size unknown"), "{e}");
}

#[test]
fn slices_still_refused_name_the_slice() {
    let refuse = |s: SliceSpec, what: &str| {
        let g = loss_graph(&[vec![-1]], &move |g, p| node(g, Op::Slice { specs: vec![s] }, &[p[0]]));
        let e = grad_graph(&g, &[0]).unwrap_err().to_string();
        assert!(e.contains("`slice`") && e.contains(what), "{e}");
    };
    refuse(spec(Some(-2), Some(3)), "negative start and a non-negative stop");
    refuse(SliceSpec { start: None, stop: None, step: 2 }, "step 2");
}

#[test]
fn reshapes_of_one_unknown_dim_and_the_refusal_of_two() {
    let reshape =
        |shape: Vec<i64>| move |g: &mut Graph, p: &[ValueId]| node(g, Op::Reshape { shape: shape.clone() }, &[p[0]]);
    let g = loss_graph(&[vec![-1, 3]], &reshape(vec![-1]));
    for n in [0usize, 1, 3] {
        check_grads(&g, &[data(&[n, 3], 110 + n as u64, -1.0, 1.0)]);
    }
    let g = loss_graph(&[vec![2, -1, 3]], &reshape(vec![3, -1, 2]));
    for n in [0usize, 1, 5] {
        check_grads(&g, &[data(&[2, n, 3], 120 + n as u64, -1.0, 1.0)]);
    }
    // Two unknown dims merged into one: the cotangent would need x's
    // run-time shape. Refused by name.
    let g = loss_graph(&[vec![-1, -1]], &reshape(vec![-1]));
    let e = grad_graph(&g, &[0]).unwrap_err().to_string();
    assert!(e.contains("`reshape`") && e.contains("more than one unknown dim"), "{e}");
}
