//! `one_hot` inside fused regions: `out[.., j] = labels[..] == j` compiled
//! as an iota compare on the new inner axis, checked bit for bit against the
//! reference kernel on random labels (in range, out of range, negative, the
//! integer extremes), depths 0, 1, 3, 10 and 1023, label shapes of 0 to 2
//! axes with sizes 0, 1, 3, 5 and 1023, every output dtype, alone and fused
//! with what consumes it (a product with a float input, a row sum). The
//! executor runs it in one region, with no reference-kernel fallback
//! (except over at most one element, which the planner leaves unfused).

use crate::common;
use common::*;
use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage};
use tracejit_ir::{Graph, Op};
use tracejit_jit::Executable;

/// Labels of `dtype` in `[-3, depth + 3)`, with the integer extremes mixed in.
fn labels(dtype: DType, shape: &[usize], depth: usize, seed: u64) -> Storage {
    let n: usize = shape.iter().product();
    let mut r = Rng(seed);
    let span = depth as i64 + 6;
    let v: Vec<i64> = (0..n)
        .map(|_| match r.next() % 16 {
            0 => i64::MIN,
            1 => i64::MAX,
            2 => -1,
            _ => (r.next() % span as u64) as i64 - 3,
        })
        .collect();
    match dtype {
        DType::I32 => {
            Storage::from_vec(v.iter().map(|&x| x.clamp(i32::MIN.into(), i32::MAX.into()) as i32).collect(), shape)
        }
        _ => Storage::from_vec(v, shape),
    }
    .unwrap()
}

/// How the one_hot is used in the graph.
#[derive(Clone, Copy, Debug)]
enum Use {
    /// The graph's output.
    Alone,
    /// `one_hot * x`, with `x` a float input of the output's shape.
    Product,
    /// `sum(one_hot * x, last axis)`: a row region.
    RowSum,
}

fn build(shape: &[usize], index: DType, depth: usize, dtype: DType, usage: Use) -> Graph {
    let mut g = Graph::new("one_hot");
    let l = param(&mut g, index, shape);
    let oh = node(&mut g, Op::OneHot { depth, dtype }, &[l]);
    let out_shape: Vec<usize> = shape.iter().copied().chain([depth]).collect();
    match usage {
        Use::Alone => g.outputs.push(oh),
        Use::Product | Use::RowSum => {
            let x = param(&mut g, dtype, &out_shape);
            let p = node(&mut g, Op::Binary(BinaryOp::Mul), &[oh, x]);
            let out = match usage {
                Use::RowSum => {
                    node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![shape.len()], keepdims: false }, &[p])
                }
                Use::Alone | Use::Product => p,
            };
            g.outputs.push(out);
        }
    }
    g
}

fn inputs(shape: &[usize], index: DType, depth: usize, dtype: DType, usage: Use, seed: u64) -> Vec<Storage> {
    let mut v = vec![labels(index, shape, depth, seed)];
    if !matches!(usage, Use::Alone) {
        let out_shape: Vec<usize> = shape.iter().copied().chain([depth]).collect();
        v.push(data(dtype, &out_shape, seed + 1, true));
    }
    v
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop::sample::select(vec![0usize, 1, 3, 5, 1023]), 0..=2)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn one_hot_regions_match_the_reference(
        shape in shape_strategy(),
        index in prop::sample::select(vec![DType::I32, DType::I64]),
        depth in prop::sample::select(vec![0usize, 1, 3, 10, 1023]),
        dtype in prop::sample::select(vec![DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool]),
        usage in prop::sample::select(vec![Use::Alone, Use::Product, Use::RowSum]),
        seed in 0u64..10_000,
    ) {
        prop_assume!(shape.iter().product::<usize>() * depth <= 1 << 18);
        // A product or sum of bools is not an op the graph takes.
        let usage = if dtype == DType::Bool { Use::Alone } else { usage };
        let g = build(&shape, index, depth, dtype, usage);
        let ins = inputs(&shape, index, depth, dtype, usage, seed);
        let exe = Executable::new(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
        let got = exe.run(&ins).unwrap();
        let want = tracejit_ir::interpret(&g, &ins).unwrap();
        for (x, y) in got.iter().zip(&want) {
            if let Err(e) = exact_eq(x, y) {
                return Err(TestCaseError::fail(format!("{shape:?} {index} depth {depth} {dtype} {usage:?}: {e}")));
            }
        }
        let st = exe.stats();
        // The planner leaves work over at most one element to the
        // reference kernels (cheaper than a kernel call), and regions reduce
        // no axis of static size 1.
        let elements = shape.iter().product::<usize>() * depth;
        if elements > 1 && !(matches!(usage, Use::RowSum) && depth == 1) {
            prop_assert!(exe.fallbacks().is_empty(), "{:?}: {}", exe.fallbacks(), st);
            prop_assert_eq!(st.regions, 1, "{}", st);
        }
    }
}

#[test]
fn out_of_range_and_negative_labels_give_zero_rows() {
    let g = build(&[6], DType::I64, 3, DType::F32, Use::Alone);
    let ins = [Storage::from_vec(vec![0i64, 2, 3, -1, i64::MIN, 1], &[6]).unwrap()];
    let got = Executable::new(&g).unwrap().run(&ins).unwrap();
    let want: Vec<f32> = [[1., 0., 0.], [0., 0., 1.], [0.; 3], [0.; 3], [0.; 3], [0., 1., 0.]].concat();
    exact_eq(&got[0], &Storage::from_vec(want, &[6, 3]).unwrap()).unwrap();
}

#[test]
fn one_hot_compiles_as_a_region() {
    for depth in [3, 10, 1023] {
        let g = build(&[5], DType::I64, depth, DType::F32, Use::RowSum);
        let mut planned = g.clone();
        let cx = tracejit_ir::passes::PassContext::new("one_hot")
            .with_region_acceptor(std::sync::Arc::new(tracejit_jit::supports));
        tracejit_ir::passes::Pass::run(&tracejit_ir::passes::Fusion::default(), &mut planned, &cx);
        let fused: Vec<_> = planned.nodes().filter(|(_, n)| matches!(n.op, Op::Fused { .. })).collect();
        assert_eq!(fused.len(), 1, "one region: one_hot, product and sum\n{planned}");
        let Op::Fused { body } = &fused[0].1.op else { unreachable!() };
        assert_eq!(tracejit_jit::unsupported_reason(body), None);
        assert!(body.nodes().any(|(_, n)| matches!(n.op, Op::OneHot { .. })), "{planned}");
    }
    // Too deep for an iota constant: the reference kernel runs it.
    let g = build(&[2], DType::I64, 1 << 17, DType::F32, Use::Alone);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.fallbacks(), ["one_hot"]);
}
