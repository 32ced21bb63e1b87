//! First-call latency against graph size: trace + optimize + compile + run
//! of a fresh function holding a chain of `n` elementwise ops (1,000,
//! 4,000 and 16,000), to watch that the pipeline stays O(n log n). Every
//! sample builds a new `Function`, so nothing is cached.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BatchSize, BenchmarkId, Criterion, Throughput};
use tracejit::prelude::*;

fn chain(n: usize) -> Function<Tensor, Tensor> {
    function(move |x: Tensor| {
        let mut y = x;
        for i in 0..n {
            y = if i % 2 == 0 { &y * 1.0001 } else { (&y + 0.001).tanh() };
        }
        y
    })
}

fn first_call(c: &mut Criterion) {
    let x = Tensor::randn(&[64], 0);
    let mut g = c.benchmark_group("first_call");
    g.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(5));
    for n in [1_000usize, 4_000, 16_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("chain", n), &n, |b, &n| {
            b.iter_batched(|| chain(n), |f| black_box(f.call(x.clone()).expect("runs")), BatchSize::PerIteration)
        });
    }
    g.finish();
}

criterion_group!(benches, first_call);
