//! The differential property test of the passes: random graphs give the
//! same results through the interpreter before and after optimization (the
//! whole pipeline and each pass alone), NaN/Inf/-0.0 included.

use proptest::prelude::*;
use tracejit_ir::passes::{
    ConstantFolding, Cse, Dce, Fusion, HoistLoopProducts, Inline, Pass, PassContext, Pipeline, SelectImplementation,
    Simplify,
};
use tracejit_ir::tensor::{BinaryOp, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{interpret, verify, Graph, Op, ValueId};

use crate::common::{f32t, node};

use crate::passes::*;

// ---- differential property test --------------------------------------------

/// Values that exercise IEEE corner cases.
const SPECIAL: [f32; 12] =
    [-0.0, 0.0, 1.0, -1.0, 2.0, 0.25, 3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.5, 1e-30];

const UNARY: [UnaryOp; 10] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Relu,
    UnaryOp::Sqrt,
    UnaryOp::Log,
    UnaryOp::Square,
    UnaryOp::Sigmoid,
    UnaryOp::Floor,
];
const BINARY: [BinaryOp; 6] =
    [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum];
const REDUCE: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Prod];

#[derive(Clone, Debug)]
struct Step {
    kind: u8,
    a: usize,
    b: usize,
    c: usize,
    flag: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..12, any::<usize>(), any::<usize>(), any::<usize>(), any::<bool>()).prop_map(|(kind, a, b, c, flag)| Step {
        kind,
        a,
        b,
        c,
        flag,
    })
}

/// Input data: special values and ordinary ones.
fn data(shape: &[usize], seed: u64) -> Storage {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if s.is_multiple_of(3) {
                SPECIAL[(s >> 8) as usize % SPECIAL.len()]
            } else {
                ((s >> 11) % 1000) as f32 / 250.0 - 2.0
            }
        })
        .collect();
    Storage::from_vec(v, shape).unwrap()
}

/// A random graph of elementwise, broadcast, reduce, reshape and transpose
/// ops with constants, and inputs for it.
fn random_graph(base: &[usize], n_inputs: usize, unknown: bool, steps: &[Step], seed: u64) -> (Graph, Vec<Storage>) {
    let mut g = Graph::new("random");
    let mut vals: Vec<ValueId> = Vec::new();
    let mut args = Vec::new();
    for i in 0..n_inputs {
        let drop = i % (base.len() + 1);
        let shape: Vec<usize> = base[drop..].to_vec();
        let dims: Vec<i64> =
            shape.iter().enumerate().map(|(k, &d)| if unknown && k == 0 && i == 0 { -1 } else { d as i64 }).collect();
        vals.push(g.add_param(f32t(&dims)));
        args.push(data(&shape, seed.wrapping_add(i as u64)));
    }
    for s in steps {
        let n = vals.len();
        let a = vals[s.a % n];
        let b = vals[s.b % n];
        let ta = g.value_type(a).clone();
        let constant = |g: &mut Graph, k: usize| f32c(g, SPECIAL[k % SPECIAL.len()]);
        let v = match s.kind {
            0 | 1 => un(&mut g, UNARY[s.c % UNARY.len()], a),
            2 | 3 => {
                let op = BINARY[s.c % BINARY.len()];
                let tb = g.value_type(b);
                if tracejit_ir::broadcast_dims(&ta.dims, &tb.dims).is_some() {
                    bin(&mut g, op, a, b)
                } else {
                    let k = constant(&mut g, s.b);
                    bin(&mut g, op, a, k)
                }
            }
            4 | 5 => {
                // A binary op with a constant, on either side, maybe broadcast.
                let op = BINARY[s.c % BINARY.len()];
                let mut k = constant(&mut g, s.b);
                if s.kind == 5 {
                    if let Some(shape) = ta.shape() {
                        k = node(&mut g, Op::BroadcastTo { shape }, &[k]);
                    }
                }
                if s.flag {
                    bin(&mut g, op, k, a)
                } else {
                    bin(&mut g, op, a, k)
                }
            }
            6 if ta.rank() > 0 => {
                let axes: Vec<usize> = if s.flag { vec![ta.rank() - 1] } else { (0..ta.rank()).collect() };
                reduce(&mut g, REDUCE[s.c % REDUCE.len()], a, &axes, s.b % 2 == 0)
            }
            7 if ta.rank() > 1 => {
                let mut perm: Vec<usize> = (0..ta.rank()).collect();
                perm.rotate_left(1 + s.c % (ta.rank() - 1));
                let t = node(&mut g, Op::Transpose { perm: perm.clone() }, &[a]);
                if s.flag {
                    // Back again: the pair collapses.
                    let inv: Vec<usize> = (0..perm.len()).map(|i| perm.iter().position(|&p| p == i).unwrap()).collect();
                    node(&mut g, Op::Transpose { perm: inv }, &[t])
                } else {
                    t
                }
            }
            8 => {
                let flat = node(&mut g, Op::Reshape { shape: vec![-1] }, &[a]);
                match ta.shape() {
                    Some(shape) if s.flag => {
                        node(&mut g, Op::Reshape { shape: shape.iter().map(|&d| d as i64).collect() }, &[flat])
                    }
                    _ => flat,
                }
            }
            9 => {
                let n1 = un(&mut g, UnaryOp::Neg, b);
                if g.value_type(n1).dims.len() <= ta.dims.len()
                    && tracejit_ir::broadcast_dims(&ta.dims, &g.value_type(n1).dims).is_some()
                {
                    let op = if s.flag { BinaryOp::Add } else { BinaryOp::Sub };
                    bin(&mut g, op, a, n1)
                } else {
                    un(&mut g, UnaryOp::Neg, n1)
                }
            }
            10 => {
                // Duplicate work for CSE.
                let e1 = un(&mut g, UNARY[s.c % UNARY.len()], a);
                let e2 = un(&mut g, UNARY[s.c % UNARY.len()], a);
                bin(&mut g, BinaryOp::Add, e1, e2)
            }
            _ => {
                // Constant subexpressions for folding.
                let k1 = constant(&mut g, s.b);
                let k2 = constant(&mut g, s.c);
                let kk = bin(&mut g, BINARY[s.c % BINARY.len()], k1, k2);
                bin(&mut g, BinaryOp::Mul, a, kk)
            }
        };
        vals.push(v);
    }
    let n = vals.len();
    g.outputs = vec![vals[n - 1]];
    if n >= 3 {
        g.outputs.push(vals[n / 2]);
    }
    (g, args)
}

fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Inline),
        Box::new(SelectImplementation),
        Box::new(HoistLoopProducts),
        Box::new(ConstantFolding),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Dce),
        Box::new(Fusion::default()),
        Box::new(Fusion { single_node_regions: false, ..Fusion::default() }),
        Box::new(Fusion { reductions_end_regions: false, ..Fusion::default() }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn optimized_graphs_compute_the_same_results(
        base in prop::collection::vec(1usize..4, 0..4),
        n_inputs in 1usize..4,
        unknown in any::<bool>(),
        steps in prop::collection::vec(step(), 1..14),
        seed in any::<u64>(),
    ) {
        let (g, args) = random_graph(&base, n_inputs, unknown, &steps, seed);
        verify(&g).unwrap();
        crate::common::assert_round_trip(&g);
        // An unknown dim can hide shapes that do not broadcast at run time.
        let want = interpret(&g, &args);
        prop_assume!(want.is_ok());
        let want = want.unwrap();
        // The whole pipeline.
        let (opt, _) = Pipeline::default_pipeline().run(&g, &PassContext::new("random")).unwrap();
        crate::common::assert_round_trip(&opt);
        let got = interpret(&opt, &args).unwrap();
        prop_assert!(same_results(&want, &got), "pipeline changed results\nwant {:?}\ngot {:?}\n{}\n{}", want, got, g, opt);
        // Every pass alone: verifier-clean, idempotent, same results.
        for pass in all_passes() {
            let (once, _) = run_checked(pass.as_ref(), &g, &PassContext::new("random"));
            crate::common::assert_round_trip(&once);
            let got = interpret(&once, &args).unwrap();
            prop_assert!(same_results(&want, &got), "{} changed results\n{}\n{}", pass.name(), g, once);
        }
    }
}
