//! Philox4x32-10 draw rates on one thread, in G elements/s, for each
//! output kind at each vector width: a cache-resident buffer (64 Ki
//! elements, redrawn) and a large one (16 Mi elements, bound by memory
//! writes).
//!
//! `CARGO_TARGET_DIR=/work/target-philox taskset -c 0 cargo run --release
//! -p tracejit-kernels --example philox`

use std::hint::black_box;
use std::time::{Duration, Instant};

use tracejit_kernels::philox::Stream;
use tracejit_kernels::Isa;

/// Elements per second of `draw(first, buf)` over `n` elements: the
/// fastest of the draws (at advancing offsets) made in 0.3 s, so that other
/// processes sharing the core slow the figure down less.
fn rate<T: Copy + Default>(n: usize, draw: impl Fn(u64, &mut [T])) -> f64 {
    let mut buf = vec![T::default(); n];
    draw(0, &mut buf);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut reps = 0u64;
    while start.elapsed() < Duration::from_millis(300) || reps < 3 {
        let t = Instant::now();
        draw(reps * n as u64, black_box(&mut buf));
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    n as f64 / best
}

fn main() {
    let s = Stream { key: [0x1234_5678, 0x9abc_def0], counter: [0, 0, 0, 0] };
    let isas = [("avx512", Isa::native()), ("avx2", Isa::native().with_avx512(false))];
    println!("{:<12} {:>8} {:>12} {:>12}", "kind", "isa", "64Ki G/s", "16Mi G/s");
    for (name, isa) in isas {
        let g = |r: f64| r / 1e9;
        let rows: [(&str, f64, f64); 5] = [
            (
                "bits_u32",
                rate::<u32>(1 << 16, |f, b| s.bits_u32(f, b, isa)),
                rate::<u32>(1 << 24, |f, b| s.bits_u32(f, b, isa)),
            ),
            (
                "uniform_f32",
                rate::<f32>(1 << 16, |f, b| s.uniform_f32(f, b, isa)),
                rate::<f32>(1 << 24, |f, b| s.uniform_f32(f, b, isa)),
            ),
            (
                "uniform_f64",
                rate::<f64>(1 << 16, |f, b| s.uniform_f64(f, b, isa)),
                rate::<f64>(1 << 24, |f, b| s.uniform_f64(f, b, isa)),
            ),
            (
                "normal_f32",
                rate::<f32>(1 << 16, |f, b| s.normal_f32(f, b, isa)),
                rate::<f32>(1 << 24, |f, b| s.normal_f32(f, b, isa)),
            ),
            (
                "normal_f64",
                rate::<f64>(1 << 16, |f, b| s.normal_f64(f, b, isa)),
                rate::<f64>(1 << 24, |f, b| s.normal_f64(f, b, isa)),
            ),
        ];
        for (kind, small, large) in rows {
            println!("{kind:<12} {name:>8} {:>12.3} {:>12.3}", g(small), g(large));
        }
    }
}
