//! One fused kernel's throughput: W2's tanh-approximation GELU on
//! `[1048576]` f32 through a traced function, reported in bytes moved
//! (4 MiB read + 4 MiB written per call) so it compares with the bandwidth
//! floor. The benchmark id names the executor that actually ran
//! (`traced-jit` or `traced-interpreter`), so interpreter figures are never
//! reported as JIT figures; eager is the baseline.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use tracejit::prelude::*;

/// W2: `0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3)))`.
fn gelu(x: Tensor) -> Tensor {
    let inner = (&x + 0.044715 * (&x * &x * &x)) * 0.7978845608;
    0.5 * &x * (inner.tanh() + 1.0)
}

fn fused_gelu(c: &mut Criterion) {
    const N: usize = 1 << 20;
    let x = Tensor::randn(&[N], 2);
    let f = function(gelu).name("gelu").jit(true);
    f.call(x.clone()).expect("first call traces");
    let kind = f.concrete_functions()[0].executor_kind();

    let mut g = c.benchmark_group("fused_gelu/1048576");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    g.throughput(Throughput::Bytes((2 * N * std::mem::size_of::<f32>()) as u64));
    g.bench_function(format!("traced-{kind}"), |b| b.iter(|| black_box(f.call(black_box(x.clone())).expect("call"))));
    g.bench_function("eager", |b| b.iter(|| black_box(gelu(black_box(x.clone())))));
    g.finish();
}

criterion_group!(benches, fused_gelu);
