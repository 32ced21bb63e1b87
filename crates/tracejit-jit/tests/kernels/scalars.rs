//! Binary ops on two 0-d operands (a loop's counter and bound), which the
//! executor computes itself instead of calling the reference kernel, give
//! the interpreter's bits for every op and dtype, NaN, infinities, integer
//! extremes and division by zero included, and never overwrite a result
//! the caller still holds.

use crate::common;
use common::*;
use proptest::prelude::*;
use tracejit_ir::tensor::{BinaryOp, DType, Storage};
use tracejit_ir::{Graph, Op, TensorType};
use tracejit_jit::Executable;

fn binary_graph(op: BinaryOp, dt: DType) -> Graph {
    let mut g = Graph::new("scalar");
    let a = param(&mut g, dt, &[]);
    let b = param(&mut g, dt, &[]);
    let y = node(&mut g, Op::Binary(op), &[a, b]);
    g.outputs.push(y);
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn scalar_binary_ops_match_the_interpreter(
        op in prop::sample::select(BinaryOp::ALL.to_vec()),
        dt in prop::sample::select(vec![DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool]),
        seed in 0u64..10_000,
        same in any::<bool>(),
    ) {
        // Ops the dtype does not take (`logical_and` on floats, `add` on
        // bools) are type inference's to refuse.
        let t = TensorType::known(dt, &[]);
        prop_assume!(tracejit_ir::infer(&Op::Binary(op), &[t.clone(), t], None).is_ok());
        let g = binary_graph(op, dt);
        let exe = Executable::new(&g).unwrap();
        // Equal operands half the time: where `lt` and `le` differ.
        let a = data(dt, &[], seed, true);
        let b = if same { a.clone() } else { data(dt, &[], seed + 1, seed % 3 == 0) };
        let ins = [a, b];
        let want = tracejit_ir::interpret(&g, &ins);
        let got = exe.run(&ins);
        match (got, want) {
            (Ok(got), Ok(want)) => {
                exact_eq(&got[0], &want[0]).map_err(TestCaseError::fail)?;
                // A second run takes a pooled buffer, never the one the
                // caller holds.
                let again = exe.run(&[ins[1].clone(), ins[0].clone()]).unwrap();
                exact_eq(&got[0], &want[0]).map_err(|e| TestCaseError::fail(format!("result overwritten: {e}")))?;
                let swapped = tracejit_ir::interpret(&g, &[ins[1].clone(), ins[0].clone()]).unwrap();
                exact_eq(&again[0], &swapped[0]).map_err(TestCaseError::fail)?;
            }
            (Err(_), Err(_)) => {}
            (got, want) => prop_assert!(false, "executor {:?} vs interpreter {:?}", got.map(|_| ()), want.map(|_| ())),
        }
    }
}

/// The loop counter's ops take the executor's scalar path (no region is
/// formed for a 0-d op) and keep giving fresh results run after run.
#[test]
fn counter_ops_run_without_the_reference_kernel_and_stay_correct() {
    let g = binary_graph(BinaryOp::Add, DType::I64);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 0, "a 0-d op stays a step of its own");
    let mut i = Storage::scalar(0i64);
    let one = Storage::scalar(1i64);
    let mut seen = Vec::new();
    for _ in 0..10 {
        i = exe.run(&[i, one.clone()]).unwrap().remove(0);
        seen.push(i.clone());
    }
    let values: Vec<String> = seen.iter().map(|s| format!("{s:?}")).collect();
    let want: Vec<String> = (1..=10i64).map(|v| format!("{:?}", Storage::scalar(v))).collect();
    assert_eq!(values, want);
}
