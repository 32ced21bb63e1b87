//! An executable built for a [`Target`] runs with the target's thread
//! count and thresholds whatever the process's are, with the bits of one
//! thread; a target naming none follows the process's settings at each
//! call.

use crate::common::*;
use crate::serial;
use tracejit_ir::tensor::{BinaryOp, DType, Storage, UnaryOp};
use tracejit_ir::{Graph, Op};
use tracejit_jit::threads::{self, pool_dispatches, set_num_threads, set_split_threshold};
use tracejit_jit::{Executable, JitOptions, Target};

/// `tanh(a * b + a)` over `[r, c]`: one elementwise region.
fn elementwise(r: usize, c: usize) -> Graph {
    let mut g = Graph::new("ew");
    let a = param(&mut g, DType::F32, &[r, c]);
    let b = param(&mut g, DType::F32, &[r, c]);
    let m = node(&mut g, Op::Binary(BinaryOp::Mul), &[a, b]);
    let s = node(&mut g, Op::Binary(BinaryOp::Add), &[m, a]);
    let y = node(&mut g, Op::Unary(UnaryOp::Tanh), &[s]);
    g.outputs.push(y);
    g
}

fn build(g: &Graph, target: Target) -> Executable {
    Executable::with_options(g, &JitOptions::global().for_target(target)).unwrap()
}

/// Runs `exe` and says whether it entered the pool.
fn dispatched(exe: &Executable, ins: &[Storage]) -> (Vec<Storage>, bool) {
    let before = pool_dispatches();
    let out = exe.run(ins).unwrap();
    (out, pool_dispatches() != before)
}

#[test]
fn an_executables_target_overrides_the_process_thread_count_and_threshold() {
    let _s = serial();
    let g = elementwise(64, 1000);
    let ins = [data(DType::F32, &[64, 1000], 5, true), data(DType::F32, &[64, 1000], 6, true)];
    let host = build(&g, Target::host());
    let one = build(&g, Target::host().with_threads(1));
    // Two threads and a split threshold that splits this small kernel.
    let two = build(&g, Target::host().with_threads(2).with_split_threshold(1));
    assert_eq!(two.target().threads, Some(2));

    // The process says two threads and a threshold that splits anything.
    set_num_threads(2);
    set_split_threshold(1);
    let (want, host_split) = dispatched(&host, &ins);
    assert!(host_split, "the host target follows the process: it split");
    let (got, split) = dispatched(&one, &ins);
    assert!(!split, "a one-thread target entered the pool");
    same(&got, &want);

    // The process says one thread and the default threshold (under which
    // this kernel stays whole).
    set_num_threads(1);
    set_split_threshold(threads::DEFAULT_SPLIT_THRESHOLD);
    let (got, split) = dispatched(&host, &ins);
    assert!(!split, "the host target follows the process: one thread");
    same(&got, &want);
    let (got, split) = dispatched(&two, &ins);
    assert!(split, "a two-thread target with threshold 1 did not split");
    same(&got, &want);
    // Outside the call the process's settings are back.
    assert_eq!(threads::num_threads(), 1);
    assert_eq!(threads::split_threshold(), threads::DEFAULT_SPLIT_THRESHOLD);
}

#[test]
fn a_target_reaches_the_workers_of_a_split_call() {
    let _s = serial();
    set_num_threads(1);
    let seen = std::sync::Mutex::new(Vec::new());
    let target = Target::avx2().with_threads(2).with_split_threshold(3);
    target.enter(|| {
        let pool = threads::pool().expect("two threads give a pool");
        // Parts long enough that the worker takes some.
        pool.run(8, &|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            seen.lock().unwrap().push((std::thread::current().id(), Target::entered()));
        });
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 8);
    assert!(seen.iter().all(|(_, t)| *t == Some(target)), "{seen:?}");
    assert_eq!(Target::entered(), None);
}

fn same(a: &[Storage], b: &[Storage]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        let (Storage::F32(x), Storage::F32(y)) = (x, y) else { panic!("f32 results") };
        assert!(x.iter().zip(y.iter()).all(|(p, q)| p.to_bits() == q.to_bits()), "different bits");
    }
}
