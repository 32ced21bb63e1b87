//! Rough throughput of fused regions (not a benchmark harness): GELU on 1M
//! f32, softmax and layernorm on [1024, 1024], and 100 tiny ops on [16].
//! Run with `cargo run --release -p tracejit-jit --example throughput`.

use std::time::Instant;

use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::{Graph, Op, TensorType, ValueId};

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    ValueId::from(g.add_node(op, inputs, &[], None).unwrap())
}

fn k(g: &mut Graph, v: f64) -> ValueId {
    g.add_constant(Storage::scalar_of(DType::F32, v))
}

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    node(g, Op::Binary(op), &[a, b])
}

/// Nanoseconds this process has spent on a CPU (Linux), to separate our cost
/// from time spent waiting for a core on a loaded machine.
fn on_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn time(name: &str, elems: usize, reps: usize, f: impl Fn()) {
    f();
    let c0 = on_cpu_ns();
    let t0 = Instant::now();
    for _ in 0..reps {
        f();
    }
    let wall = t0.elapsed().as_secs_f64() / reps as f64;
    if let (Some(a), Some(b)) = (c0, on_cpu_ns()) {
        let cpu = (b - a) as f64 / reps as f64 * 1e-9;
        println!(
            "{name}: on-CPU {:.1} us ({:.3} ns/element), wall mean {:.1} us",
            cpu * 1e6,
            cpu * 1e9 / elems as f64,
            wall * 1e6
        );
    }
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = v[v.len() / 2];
    println!("{name}: median {:.1} us, {:.3} ns/element", med * 1e6, med * 1e9 / elems as f64);
}

fn data(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 2000) as f32 / 500.0 - 2.0).collect()
}

fn main() {
    use BinaryOp::*;
    // Calibration: a plain Rust loop writing a fresh 1M buffer.
    let n = 1 << 20;
    let src = data(n);
    time("calibration: rust x*a+b [1M] into a new Vec", n, 200, || {
        let v: Vec<f32> = src.iter().map(|&x| x * 1.0001 + 0.001).collect();
        std::hint::black_box(v);
    });
    let mut g = Graph::new("axpb");
    let x = g.add_param(TensorType::known(DType::F32, &[n]));
    let a = k(&mut g, 1.0001);
    let b = k(&mut g, 0.001);
    let y = bin(&mut g, Mul, x, a);
    let y = bin(&mut g, Add, y, b);
    g.outputs.push(y);
    let r = tracejit_jit::compile_region(&g).unwrap();
    let xs = Storage::from_vec(data(n), &[n]).unwrap();
    time("jit x*a+b [1M] f32", n, 200, || drop(r.run(&[&xs])));
    // GELU, tanh approximation.
    let n = 1 << 20;
    let mut g = Graph::new("gelu");
    let x = g.add_param(TensorType::known(DType::F32, &[n]));
    let x2 = bin(&mut g, Mul, x, x);
    let x3 = bin(&mut g, Mul, x2, x);
    let c1 = k(&mut g, 0.044715);
    let t = bin(&mut g, Mul, c1, x3);
    let t = bin(&mut g, Add, x, t);
    let c2 = k(&mut g, 0.7978845608);
    let t = bin(&mut g, Mul, c2, t);
    let t = node(&mut g, Op::Unary(UnaryOp::Tanh), &[t]);
    let one = k(&mut g, 1.0);
    let t = bin(&mut g, Add, one, t);
    let half = k(&mut g, 0.5);
    let h = bin(&mut g, Mul, half, x);
    let y = bin(&mut g, Mul, h, t);
    g.outputs.push(y);
    let r = tracejit_jit::compile_region(&g).unwrap();
    let xs = Storage::from_vec(data(n), &[n]).unwrap();
    time("gelu [1M] f32", n, 200, || drop(r.run(&[&xs])));
    let small = 16 * 1024;
    let rs = tracejit_jit::compile_region(&{
        let mut g2 = g.clone();
        let p = g2.params[0];
        g2.node_mut(p).outputs[0] = TensorType::known(DType::F32, &[small]);
        // Re-infer is not needed: every other node's dims are unknown-agnostic here.
        g2
    });
    if let Ok(rs) = rs {
        let xs = Storage::from_vec(data(small), &[small]).unwrap();
        time("gelu [16K] f32 (cache resident)", small, 2000, || drop(rs.run(&[&xs])));
    }

    // Softmax over rows.
    let (m, c) = (1024, 1024);
    let mut g = Graph::new("softmax");
    let x = g.add_param(TensorType::known(DType::F32, &[m, c]));
    let mx = node(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdims: true }, &[x]);
    let d = bin(&mut g, Sub, x, mx);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdims: true }, &[e]);
    let y = bin(&mut g, Div, e, s);
    g.outputs.push(y);
    let r = tracejit_jit::compile_region(&g).unwrap();
    let xs = Storage::from_vec(data(m * c), &[m, c]).unwrap();
    time("softmax [1024,1024] f32", m * c, 200, || drop(r.run(&[&xs])));
    let xs16 = Storage::from_vec(data(16 * c), &[16, c]).unwrap();
    let mut gs = g.clone();
    let p = gs.params[0];
    gs.node_mut(p).outputs[0] = TensorType::known(DType::F32, &[16, c]);
    if let Ok(rs) = tracejit_jit::compile_region(&gs) {
        time("softmax [16,1024] f32 (cache resident)", 16 * c, 2000, || drop(rs.run(&[&xs16])));
    }

    // The pieces of softmax, cache resident: exp alone, a row max, a row
    // sum followed by a division.
    let small = 16 * c;
    let xs = Storage::from_vec(data(small), &[16, c]).unwrap();
    let piece = |name: &str, body: &dyn Fn(&mut Graph, ValueId) -> ValueId| {
        let mut g = Graph::new("piece");
        let x = g.add_param(TensorType::known(DType::F32, &[16, c]));
        let y = body(&mut g, x);
        g.outputs.push(y);
        let r = tracejit_jit::compile_region(&g).unwrap();
        time(&format!("piece: {name} [16,1024]"), small, 2000, || drop(r.run(&[&xs])));
    };
    let reduce = |op| Op::Reduce { op, axes: vec![1], keepdims: true };
    piece("exp", &|g, x| node(g, Op::Unary(UnaryOp::Exp), &[x]));
    piece("row max", &|g, x| node(g, reduce(ReduceOp::Max), &[x]));
    piece("x / row sum", &|g, x| {
        let s = node(g, reduce(ReduceOp::Sum), &[x]);
        bin(g, Div, x, s)
    });

    // Layernorm over rows.
    let mut g = Graph::new("layernorm");
    let x = g.add_param(TensorType::known(DType::F32, &[m, c]));
    let gamma = g.add_param(TensorType::known(DType::F32, &[c]));
    let beta = g.add_param(TensorType::known(DType::F32, &[c]));
    let mean = node(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdims: true }, &[x]);
    let d = bin(&mut g, Sub, x, mean);
    let d2 = bin(&mut g, Mul, d, d);
    let var = node(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdims: true }, &[d2]);
    let eps = k(&mut g, 1e-5);
    let ve = bin(&mut g, Add, var, eps);
    let rs = node(&mut g, Op::Unary(UnaryOp::Rsqrt), &[ve]);
    let y = bin(&mut g, Mul, d, rs);
    let y = bin(&mut g, Mul, y, gamma);
    let y = bin(&mut g, Add, y, beta);
    g.outputs.push(y);
    let r = tracejit_jit::compile_region(&g).unwrap();
    let gs = Storage::from_vec(data(c), &[c]).unwrap();
    let bs = Storage::from_vec(data(c), &[c]).unwrap();
    time("layernorm [1024,1024] f32", m * c, 200, || drop(r.run(&[&xs, &gs, &bs])));

    // W1: 50 times x = x * 1.0001 + 0.001 on [16].
    let mut g = Graph::new("small_ops");
    let mut x = g.add_param(TensorType::known(DType::F32, &[16]));
    for _ in 0..50 {
        let a = k(&mut g, 1.0001);
        let b = k(&mut g, 0.001);
        x = bin(&mut g, Mul, x, a);
        x = bin(&mut g, Add, x, b);
    }
    g.outputs.push(x);
    let t0 = Instant::now();
    let r = tracejit_jit::compile_region(&g).unwrap();
    println!("small_ops compile: {:.2} ms", t0.elapsed().as_secs_f64() * 1e3);
    let xs = Storage::from_vec(data(16), &[16]).unwrap();
    time("small_ops 100 ops [16] f32 (per call)", 1, 20000, || drop(r.run(&[&xs])));
}
