//! The executor against the interpreter: matmul + bias + relu, softmax,
//! calls, variables, fallbacks, and concurrent runs of one Executable.

use crate::common;
use std::sync::{Arc, Mutex};

use common::*;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{AssignKind, Graph, LibraryFunction, Op, ValueId, VariableResource};
use tracejit_jit::{Executable, JitOptions};

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
    // reshape (fallback) -> transpose (a view) -> call of a library
    // function (x * 2 + 1).
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
    let r = node(&mut g, Op::Reshape { shape: vec![3, 2] }, &[x]);
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[r]);
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[t]);
    let c = node(&mut g, Op::Call { func: fid }, &[t]);
    g.outputs.push(c);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.fallbacks(), vec!["reshape".to_string()]);
    assert_eq!(exe.stats().views, 2);
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
    let a = g.add_node(Op::AssignVariable { var: vid, kind: AssignKind::Add, locked: false }, &[x], &[], None).unwrap();
    let r = ValueId::from(g.add_node(Op::ReadVariable { var: vid, locked: false }, &[], &[a], None).unwrap());
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
    // softmax + an integer side output, shared by 8 threads calling 1,000
    // times each; every result is checked against the interpreter.
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
                let mut prev: Option<(Vec<Storage>, usize)> = None;
                for i in 0..1000 {
                    let (ins, want) = &cases[i % cases.len()];
                    let got = exe.run(ins).unwrap();
                    close(&got[0], &want[0], 2e-6, 0.0).unwrap();
                    exact_eq(&got[1], &want[1]).unwrap();
                    // A result still held is never overwritten by later calls
                    // (buffers are recycled only once dropped).
                    if let Some((p, k)) = &prev {
                        close(&p[0], &cases[*k].1[0], 2e-6, 0.0).unwrap();
                        exact_eq(&p[1], &cases[*k].1[1]).unwrap();
                    }
                    if i % 3 == 0 {
                        prev = Some((got, i % cases.len()));
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn ptr_of(s: &Storage) -> usize {
    s.array::<f32>().unwrap().as_ptr() as usize
}

#[test]
fn buffers_are_recycled_but_live_results_are_not_overwritten() {
    // Two regions around a matrix product: intermediates and outputs both
    // come from the executor's pool.
    let mut g = Graph::new("recycle");
    let x = param(&mut g, DType::F32, &[32, 32]);
    let e = node(&mut g, Op::Unary(UnaryOp::Tanh), &[x]);
    let m = node(&mut g, Op::MatMul, &[e, x]);
    let two = scalar(&mut g, DType::F32, 2.0);
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[m, two]);
    let y = node(&mut g, Op::Unary(UnaryOp::Neg), &[y]);
    g.outputs.push(y);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 2);
    let a = vec![data(DType::F32, &[32, 32], 1, false)];
    let b = vec![data(DType::F32, &[32, 32], 2, false)];
    let want_a = exe.run(&a).unwrap();
    let want_b = exe.run(&b).unwrap();
    let ref_a = tracejit_ir::interpret(&g, &a).unwrap();
    close_abs(&want_a[0], &ref_a[0], 1e-3).unwrap();
    let want_a: Vec<f32> = want_a[0].to_vec().unwrap();
    let want_b: Vec<f32> = want_b[0].to_vec().unwrap();
    let mut held = Vec::new();
    for i in 0..20 {
        let (ins, want) = if i % 2 == 0 { (&a, &want_a) } else { (&b, &want_b) };
        let r = exe.run(ins).unwrap();
        assert_eq!(&r[0].to_vec::<f32>().unwrap(), want, "call {i}");
        for (k, h) in held.iter().enumerate() {
            let (h, w): &(Storage, &Vec<f32>) = h;
            assert_eq!(&h.to_vec::<f32>().unwrap(), *w, "held result {k} changed by call {i}");
        }
        let live: Vec<usize> = held.iter().map(|(h, _)| ptr_of(h)).collect();
        assert!(!live.contains(&ptr_of(&r[0])), "call {i} wrote into a live result");
        if i % 4 == 0 {
            held.push((r[0].clone(), want));
        }
    }
    // Dropped results are recycled: calls that drop their result cycle
    // through a few buffers (the output and the same-sized matmul
    // intermediate trade places) instead of taking fresh ones.
    drop(held);
    let mut seen = std::collections::HashSet::new();
    for i in 0..10 {
        let (ins, want) = if i % 2 == 0 { (&a, &want_a) } else { (&b, &want_b) };
        let r = exe.run(ins).unwrap();
        assert_eq!(&r[0].to_vec::<f32>().unwrap(), want, "call {i}");
        seen.insert(ptr_of(&r[0]));
    }
    assert!(seen.len() <= 2, "dropped output buffers were not reused: {} distinct buffers in 10 calls", seen.len());
}

#[test]
fn compiled_region_recycles_outputs() {
    let g = softmax_graph(&[4, 40]);
    let r = tracejit_jit::compile_region(&g).unwrap();
    let a = data(DType::F32, &[4, 40], 3, false);
    let b = data(DType::F32, &[4, 40], 4, false);
    let ra = r.run(&[&a]);
    let want_a: Vec<f32> = ra[0].to_vec().unwrap();
    let rb = r.run(&[&b]);
    let want_b: Vec<f32> = rb[0].to_vec().unwrap();
    assert_ne!(want_a, want_b);
    // ra is held: the next call must not write into it.
    let rb2 = r.run(&[&b]);
    assert_eq!(ra[0].to_vec::<f32>().unwrap(), want_a);
    assert_eq!(rb2[0].to_vec::<f32>().unwrap(), want_b);
    let p = ptr_of(&rb2[0]);
    drop(rb2);
    let ra2 = r.run(&[&a]);
    assert_eq!(ra2[0].to_vec::<f32>().unwrap(), want_a);
    assert_eq!(ptr_of(&ra2[0]), p);
    assert_eq!(rb[0].to_vec::<f32>().unwrap(), want_b);
}

#[test]
fn planned_regions_run_as_planned() {
    // Softmax as a fusion pass with the default acceptance rule splits it:
    // max | sub-exp-sum | div. The executor runs the regions it is given
    // (the fusion pass is the one planner; it never re-plans them).
    let shape = [16, 100];
    let mut f0 = Graph::new("f0");
    let x = param(&mut f0, DType::F32, &shape);
    let m = node(&mut f0, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdims: true }, &[x]);
    f0.outputs.push(m);
    let mut f1 = Graph::new("f1");
    let x = param(&mut f1, DType::F32, &shape);
    let m = param(&mut f1, DType::F32, &[16, 1]);
    let d = node(&mut f1, Op::Binary(BinaryOp::Sub), &[x, m]);
    let e = node(&mut f1, Op::Unary(UnaryOp::Exp), &[d]);
    let s = node(&mut f1, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[e]);
    f1.outputs.extend([e, s]);
    let mut f2 = Graph::new("f2");
    let e = param(&mut f2, DType::F32, &shape);
    let s = param(&mut f2, DType::F32, &[16, 1]);
    let y = node(&mut f2, Op::Binary(BinaryOp::Div), &[e, s]);
    f2.outputs.push(y);

    let mut g = Graph::new("softmax_split");
    let x = param(&mut g, DType::F32, &shape);
    let m = node(&mut g, Op::Fused { body: Arc::new(f0) }, &[x]);
    let es = g.add_node(Op::Fused { body: Arc::new(f1) }, &[x, m], &[], None).unwrap();
    let (e, s) = (ValueId::new(es, 0), ValueId::new(es, 1));
    let y = node(&mut g, Op::Fused { body: Arc::new(f2) }, &[e, s]);
    g.outputs.extend([y, s]);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.num_regions(), 3);
    assert!(exe.fallbacks().is_empty(), "{:?}", exe.fallbacks());
    let ins = vec![data(DType::F32, &shape, 5, false)];
    let got = exe.run(&ins).unwrap();
    let want = tracejit_ir::interpret(&g, &ins).unwrap();
    close(&got[0], &want[0], 2e-6, 0.0).unwrap();
    close(&got[1], &want[1], 1e-5, 0.0).unwrap();
}

#[test]
fn explicit_options_change_the_code_not_the_results() {
    // softmax + tanh: staged chunk functions where the CPU has AVX2, in-line
    // code otherwise; every unroll factor computes the same bits.
    let mut g = softmax_graph(&[7, 1023]);
    let y = g.outputs[0];
    let t = node(&mut g, Op::Unary(UnaryOp::Tanh), &[y]);
    g.outputs[0] = t;
    let ins = vec![data(DType::F32, &[7, 1023], 11, true)];
    let want = tracejit_ir::interpret(&g, &ins).unwrap();
    let run = |opts: JitOptions| {
        let exe = Executable::with_options(&g, &opts).unwrap();
        assert_eq!(exe.num_regions(), 1);
        exe.run(&ins).unwrap()
    };
    let base = JitOptions::default();
    for stage in [false, true] {
        let one = run(JitOptions { stage, unroll: Some(1), ..base });
        close(&one[0], &want[0], 2e-6, 0.0).unwrap();
        for unroll in [2, 4, 8] {
            exact_eq(&run(JitOptions { stage, unroll: Some(unroll), ..base })[0], &one[0]).unwrap();
        }
    }
}
