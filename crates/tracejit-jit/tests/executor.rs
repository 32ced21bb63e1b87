//! The executor against the interpreter: matmul + bias + relu, softmax,
//! calls, variables, fallbacks, and concurrent runs of one Executable.

mod common;
use std::sync::{Arc, Mutex};

use common::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{AssignKind, Graph, LibraryFunction, Op, ValueId, VariableResource};
use tracejit_jit::Executable;

fn mlp_layer() -> Graph {
    let mut g = Graph::new("layer");
    let x = param(&mut g, DType::F32, &[64, 784]);
    let w = param(&mut g, DType::F32, &[784, 512]);
    let b = param(&mut g, DType::F32, &[512]);
    let h = node(&mut g, Op::MatMul, &[x, w]);
    let h = node(&mut g, Op::Binary(BinaryOp::Add), &[h, b]);
    let h = node(&mut g, Op::Unary(UnaryOp::Relu), &[h]);
    g.outputs.push(h);
    g
}

#[test]
fn matmul_bias_relu() {
    let g = mlp_layer();
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 1);
    assert!(exe.fallbacks().is_empty(), "{:?}", exe.fallbacks());
    let ins = vec![
        data(DType::F32, &[64, 784], 1, false),
        data(DType::F32, &[784, 512], 2, false),
        data(DType::F32, &[512], 3, false),
    ];
    let got = exe.run(&ins).unwrap();
    let want = tracejit_ir::interpret(&g, &ins).unwrap();
    // Different GEMMs sum in different orders: the error scales with
    // k·ε·Σ|aᵢbᵢ| (here Σ|aᵢbᵢ| is in the thousands), not with the result.
    close_abs(&got[0], &want[0], 5e-3).unwrap();
}

#[test]
fn batched_and_f64_matmul() {
    let mut g = Graph::new("bmm");
    let a = param(&mut g, DType::F64, &[3, 5, 7]);
    let b = param(&mut g, DType::F64, &[7, 4]);
    let c = node(&mut g, Op::MatMul, &[a, b]);
    g.outputs.push(c);
    let exe = Executable::new(&g).unwrap();
    let ins = vec![data(DType::F64, &[3, 5, 7], 1, false), data(DType::F64, &[7, 4], 2, false)];
    close(&exe.run(&ins).unwrap()[0], &tracejit_ir::interpret(&g, &ins).unwrap()[0], 0.0, 1e-12).unwrap();
}

fn softmax_graph(shape: &[usize]) -> Graph {
    let mut g = Graph::new("softmax");
    let x = param(&mut g, DType::F32, shape);
    let m = node(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdims: true }, &[x]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[e]);
    let y = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs.push(y);
    g
}

#[test]
fn softmax_graph_is_one_region() {
    let g = softmax_graph(&[16, 100]);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 1);
    let ins = vec![data(DType::F32, &[16, 100], 7, false)];
    close(&exe.run(&ins).unwrap()[0], &tracejit_ir::interpret(&g, &ins).unwrap()[0], 2e-6, 0.0).unwrap();
}

#[test]
fn fallbacks_calls_and_checks() {
    // transpose (fallback) -> call of a library function (x * 2 + 1).
    let mut f = Graph::new("affine");
    let p = param(&mut f, DType::F32, &[3, 2]);
    let two = scalar(&mut f, DType::F32, 2.0);
    let one = scalar(&mut f, DType::F32, 1.0);
    let t = node(&mut f, Op::Binary(BinaryOp::Mul), &[p, two]);
    let t = node(&mut f, Op::Binary(BinaryOp::Add), &[t, one]);
    f.outputs.push(t);
    let mut g = Graph::new("main");
    let fid = g.library.add(LibraryFunction { name: "affine".into(), attrs: Default::default(), graph: Arc::new(f) });
    let x = param(&mut g, DType::F32, &[2, 3]);
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[x]);
    let c = node(&mut g, Op::Call { func: fid }, &[t]);
    g.outputs.push(c);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.fallbacks(), vec!["transpose".to_string()]);
    let ins = vec![data(DType::F32, &[2, 3], 1, true)];
    exact_eq(&exe.run(&ins).unwrap()[0], &tracejit_ir::interpret(&g, &ins).unwrap()[0]).unwrap();
    // Bad inputs are an error, as in the interpreter.
    assert!(exe.run(&[data(DType::F32, &[3, 3], 1, false)]).is_err());
    assert!(exe.run(&[]).is_err());
}

#[derive(Debug)]
struct Var(Mutex<Storage>);

impl VariableResource for Var {
    fn name(&self) -> String {
        "v".into()
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn shape(&self) -> Vec<usize> {
        vec![4]
    }
    fn read(&self) -> Storage {
        self.0.lock().unwrap().clone()
    }
    fn write(&self, value: Storage) {
        *self.0.lock().unwrap() = value;
    }
    fn id(&self) -> u64 {
        7
    }
}

#[test]
fn variables() {
    let var = Arc::new(Var(Mutex::new(Storage::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap())));
    let mut g = Graph::new("state");
    let vid = g.add_variable(var.clone());
    let x = param(&mut g, DType::F32, &[4]);
    let a = g.add_node(Op::AssignVariable { var: vid, kind: AssignKind::Add }, &[x], &[], None).unwrap();
    let r = ValueId::from(g.add_node(Op::ReadVariable { var: vid }, &[], &[a], None).unwrap());
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[r, x]);
    g.outputs.push(y);
    let exe = Executable::new(&g).unwrap();
    let out = exe.run(&[Storage::from_vec(vec![1.0f32; 4], &[4]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    assert_eq!(var.read().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn small_ops_chain_is_one_region() {
    let mut g = Graph::new("small_ops");
    let mut x = param(&mut g, DType::F32, &[16]);
    for _ in 0..50 {
        let a = scalar(&mut g, DType::F32, 1.0001);
        x = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, a]);
        let b = scalar(&mut g, DType::F32, 0.001);
        x = node(&mut g, Op::Binary(BinaryOp::Add), &[x, b]);
    }
    g.outputs.push(x);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 1);
    let ins = vec![data(DType::F32, &[16], 1, true)];
    exact_eq(&exe.run(&ins).unwrap()[0], &tracejit_ir::interpret(&g, &ins).unwrap()[0]).unwrap();
}

#[test]
fn concurrent_runs() {
    // softmax + an integer side output, shared by 8 threads.
    let mut g = softmax_graph(&[8, 33]);
    let x = ValueId::from(g.params[0]);
    let z = scalar(&mut g, DType::F32, 0.0);
    let c = node(&mut g, Op::Binary(BinaryOp::Gt), &[x, z]);
    let c = node(&mut g, Op::Cast { to: DType::I32 }, &[c]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: false }, &[c]);
    g.outputs.push(s);
    let exe = Arc::new(Executable::new(&g).unwrap());
    let g = Arc::new(g);
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let exe = exe.clone();
            let g = g.clone();
            std::thread::spawn(move || {
                let cases: Vec<(Vec<Storage>, Vec<Storage>)> = (0..4)
                    .map(|k| {
                        let ins = vec![data(DType::F32, &[8, 33], t * 100 + k, false)];
                        let want = tracejit_ir::interpret(&g, &ins).unwrap();
                        (ins, want)
                    })
                    .collect();
                for i in 0..200 {
                    let (ins, want) = &cases[i % cases.len()];
                    let got = exe.run(ins).unwrap();
                    close(&got[0], &want[0], 2e-6, 0.0).unwrap();
                    exact_eq(&got[1], &want[1]).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
