//! Property tests: random elementwise/broadcast graphs on random shapes
//! interpret to exactly what applying the kernels directly gives (and
//! survive their text form), and
//! inference of broadcasting agrees with the kernels' broadcasting.

use proptest::prelude::*;
use tracejit_ir::tensor::kernels;
use tracejit_ir::tensor::{BinaryOp, DType, Storage, UnaryOp};
use tracejit_ir::{broadcast_dims, interpret, verify, Dims, Graph, Op, TensorType, ValueId};

use crate::common::f32s;

const UNARY: [UnaryOp; 10] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Square,
    UnaryOp::Sin,
    UnaryOp::Floor,
    UnaryOp::Softplus,
];
const BINARY: [BinaryOp; 6] =
    [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum];

/// One input: how many leading dims of the base shape it drops, which of the
/// rest are 1, which are unknown in the parameter type, and a data seed.
#[derive(Clone, Debug)]
struct InputSpec {
    drop: usize,
    ones: u8,
    unknown: u8,
    seed: u64,
}

/// One step of the graph: an op kind and operand picks (taken modulo the
/// number of values so far).
#[derive(Clone, Debug)]
struct Step {
    kind: usize,
    a: usize,
    b: usize,
    c: usize,
}

fn input_spec() -> impl Strategy<Value = InputSpec> {
    (0usize..4, any::<u8>(), any::<u8>(), any::<u64>()).prop_map(|(drop, ones, unknown, seed)| InputSpec {
        drop,
        ones,
        unknown,
        seed,
    })
}

fn step() -> impl Strategy<Value = Step> {
    (0usize..UNARY.len() + BINARY.len() + 3, any::<usize>(), any::<usize>(), any::<usize>())
        .prop_map(|(kind, a, b, c)| Step { kind, a, b, c })
}

/// Builds the graph and evaluates the same ops eagerly with the kernels.
fn build(base: &[usize], inputs: &[InputSpec], steps: &[Step]) -> (Graph, Vec<Storage>, Vec<Storage>) {
    let mut g = Graph::new("random");
    let mut values: Vec<(ValueId, Storage)> = Vec::new();
    let mut args = Vec::new();
    for spec in inputs {
        let drop = spec.drop.min(base.len());
        let shape: Vec<usize> =
            base[drop..].iter().enumerate().map(|(i, &d)| if spec.ones >> i & 1 == 1 { 1 } else { d }).collect();
        let dims: Dims = shape.iter().enumerate().map(|(i, &d)| (spec.unknown >> i & 1 == 0).then_some(d)).collect();
        let v = g.add_param(TensorType { dtype: DType::F32, dims });
        let x = f32s(&shape, spec.seed);
        args.push(x.clone());
        values.push((v, x));
    }
    for s in steps {
        let n = values.len();
        let (a, b, c) = (values[s.a % n].clone(), values[s.b % n].clone(), values[s.c % n].clone());
        let add = |g: &mut Graph, op: Op, inputs: &[ValueId]| ValueId::from(g.add_node(op, inputs, &[], None).unwrap());
        if s.kind < UNARY.len() {
            let u = UNARY[s.kind];
            values.push((add(&mut g, Op::Unary(u), &[a.0]), kernels::unary(u, &a.1)));
        } else if s.kind < UNARY.len() + BINARY.len() {
            let op = BINARY[s.kind - UNARY.len()];
            values.push((add(&mut g, Op::Binary(op), &[a.0, b.0]), kernels::binary(op, &a.1, &b.1)));
        } else if s.kind == UNARY.len() + BINARY.len() {
            let cond = add(&mut g, Op::Binary(BinaryOp::Gt), &[a.0, b.0]);
            let cond_v = kernels::binary(BinaryOp::Gt, &a.1, &b.1);
            values.push((add(&mut g, Op::Select, &[cond, a.0, c.0]), kernels::select(&cond_v, &a.1, &c.1)));
        } else if s.kind == UNARY.len() + BINARY.len() + 1 {
            let wide = add(&mut g, Op::Cast { to: DType::F64 }, &[a.0]);
            let back = add(&mut g, Op::Cast { to: DType::F32 }, &[wide]);
            let v = kernels::cast(&kernels::cast(&a.1, DType::F64), DType::F32);
            values.push((back, v));
        } else {
            let v = kernels::broadcast_to(&a.1, base);
            values.push((add(&mut g, Op::BroadcastTo { shape: base.to_vec() }, &[a.0]), v));
        }
    }
    g.outputs = values.iter().map(|(v, _)| *v).collect();
    let expected = values.into_iter().map(|(_, s)| s).collect();
    (g, args, expected)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_elementwise_graphs_match_kernels(
        base in prop::collection::vec(1usize..5, 0..4),
        inputs in prop::collection::vec(input_spec(), 1..4),
        steps in prop::collection::vec(step(), 1..10),
    ) {
        let (g, args, expected) = build(&base, &inputs, &steps);
        verify(&g).unwrap();
        crate::common::assert_round_trip(&g);
        let got = interpret(&g, &args).unwrap();
        prop_assert_eq!(got.len(), expected.len());
        for (i, (x, want)) in got.iter().zip(&expected).enumerate() {
            prop_assert!(x.bit_eq(want), "output {}: got {:?}, want {:?}\n{}", i, x, want, g);
            let ty = g.value_type(g.outputs[i]);
            prop_assert!(ty.accepts(x.dtype(), x.shape()), "output {} of type {} got shape {:?}", i, ty, x.shape());
        }
    }

    #[test]
    fn broadcast_dims_agrees_with_kernels(
        a in prop::collection::vec(0usize..4, 0..4),
        b in prop::collection::vec(0usize..4, 0..4),
        unknown_a in any::<u8>(),
        unknown_b in any::<u8>(),
    ) {
        let known = |s: &[usize]| -> Dims { s.iter().map(|&d| Some(d)).collect() };
        let relaxed = |s: &[usize], mask: u8| -> Dims {
            s.iter().enumerate().map(|(i, &d)| (mask >> i & 1 == 0).then_some(d)).collect()
        };
        let concrete = kernels::broadcast_shapes(&a, &b);
        prop_assert_eq!(broadcast_dims(&known(&a), &known(&b)), concrete.as_deref().map(known));
        // With dims relaxed to unknown, inference still accepts every shape
        // that broadcasts, and its result admits the concrete result.
        if let Some(c) = concrete {
            let d = broadcast_dims(&relaxed(&a, unknown_a), &relaxed(&b, unknown_b));
            prop_assert!(d.is_some());
            let t = TensorType { dtype: DType::F32, dims: d.unwrap() };
            prop_assert!(t.accepts(DType::F32, &c), "{} does not admit {:?}", t, c);
        }
    }
}
