//! The signature cache: the cost of calling a traced function whose
//! ConcreteFunction is already cached, for two tensor arguments.
//!
//! - `call_hit/add`: `f.call((a, b))` on two `[4]` f32 tensors, `a + b`:
//!   flatten + hash + lookup + run a one-node graph + rebuild the result.
//! - `call_hit/identity`: the same call on a function returning its first
//!   argument; the graph has no node, so this is the signature and lookup
//!   cost plus the fixed cost of entering the executor (an upper bound on
//!   "build the signature and find the cached function").
//! - `get_concrete_function`: the lookup by specs (tensors standing for their
//!   own type) through `get_concrete_function`, the slower, lock-taking path
//!   used by tooling.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use tracejit::prelude::*;

fn cache_hit(c: &mut Criterion) {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]);
    let b = Tensor::from_vec(vec![0.5f32, 0.25, 0.125, 0.0625], &[4]);

    let add = function(|(x, y): (Tensor, Tensor)| &x + &y).name("add");
    let identity = function(|(x, _y): (Tensor, Tensor)| x).name("identity");
    add.call((a.clone(), b.clone())).expect("first call traces");
    identity.call((a.clone(), b.clone())).expect("first call traces");

    let mut g = c.benchmark_group("cache");
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(1));
    g.bench_function("call_hit/add", |bench| {
        bench.iter(|| black_box(add.call(black_box((a.clone(), b.clone()))).expect("cached call")))
    });
    g.bench_function("call_hit/identity", |bench| {
        bench.iter(|| black_box(identity.call(black_box((a.clone(), b.clone()))).expect("cached call")))
    });
    g.bench_function("get_concrete_function", |bench| {
        bench.iter(|| black_box(add.get_concrete_function(black_box((&a, &b))).expect("cached")))
    });
    g.finish();
    assert_eq!(add.tracing_count(), 1, "the benchmark must only hit the cache");
    assert_eq!(identity.tracing_count(), 1, "the benchmark must only hit the cache");
}

criterion_group!(benches, cache_hit);
