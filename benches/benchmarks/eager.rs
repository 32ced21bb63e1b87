//! Eager per-op overhead: one op through tracejit's eager path against the
//! same op written directly with ndarray (issue 2 wants eager within 1.2x of
//! ndarray on 1M elements). `add` on `[16]` shows the fixed dispatch cost;
//! `add` and `exp` on `[1048576]` f32 show the overhead at size.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BenchmarkGroup, Criterion, Throughput};
use ndarray::{Array1, ArrayD, IxDyn};
use tracejit::prelude::*;

fn ramp(n: usize, seed: f32) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[n]), |i| ((i[0] as f32 * 0.618 + seed) % 2.0) - 1.0)
}

fn configure(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, n: usize) {
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(n as u64));
}

fn eager_ops(c: &mut Criterion) {
    for n in [16usize, 1 << 20] {
        let (xa, ya) = (ramp(n, 0.1), ramp(n, 0.7));
        let (x, y) = (Tensor::from_array(xa.clone()), Tensor::from_array(ya.clone()));
        let (x1, y1): (Array1<f32>, Array1<f32>) =
            (xa.clone().into_dimensionality().expect("1-d"), ya.clone().into_dimensionality().expect("1-d"));

        let mut g = c.benchmark_group(format!("eager_add/{n}"));
        configure(&mut g, n);
        g.bench_function("tracejit", |b| b.iter(|| black_box(black_box(&x) + black_box(&y))));
        g.bench_function("ndarray", |b| b.iter(|| black_box(black_box(&x1) + black_box(&y1))));
        g.finish();

        if n > 16 {
            let mut g = c.benchmark_group(format!("eager_exp/{n}"));
            configure(&mut g, n);
            g.bench_function("tracejit", |b| b.iter(|| black_box(black_box(&x).exp())));
            g.bench_function("ndarray", |b| b.iter(|| black_box(black_box(&x1).mapv(f32::exp))));
            g.finish();
        }
    }
}

criterion_group!(benches, eager_ops);
