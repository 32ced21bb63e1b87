//! Reduced-precision products beside the f32 GEMM on the workloads'
//! shapes, on one thread (or `LOWP_THREADS`): per shape, µs and G multiply-adds/s of the f32
//! GEMM (`gemm::product::<f32>`), of the bf16 product (f32 lhs rounded
//! while packed, weight packed once) on the AMX tiles (where the CPU has
//! them) and with `vdpbf16ps` (`Isa::native().with_amx(false)`), and of
//! the dynamic int8 product
//! (weight quantized once, lhs quantized per call), with each one's error
//! (max |c − c_f64| / max |c_f64|); then what packing each weight into
//! bf16 pairs costs, paid per call when the weight is an argument.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-lowp taskset -c 0 \
//!     cargo run --release -p tracejit-kernels --example lowp_gemm
//! ```

use std::time::{Duration, Instant};

use ndarray::{Array2, ArrayView2};
use tracejit_kernels::bf16::{gemm_bf16_from_f32, PackedBf16};
use tracejit_kernels::int8::{gemm_dynamic_i8, PackedI8};
use tracejit_kernels::{threads, Isa};

/// A product to measure: `a [m, k] · b [k, n]`, `a` stored transposed
/// when `at` (W6's `aᵀ · dy`).
struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    at: bool,
}

const SHAPES: [Shape; 14] = [
    Shape { name: "W5 fc1", m: 64, k: 784, n: 512, at: false },
    Shape { name: "W5 fc2", m: 64, k: 512, n: 512, at: false },
    Shape { name: "W5 fc3", m: 64, k: 512, n: 10, at: false },
    Shape { name: "W6 aT.dy", m: 784, k: 64, n: 512, at: true },
    Shape { name: "W9 qkv", m: 1024, k: 256, n: 768, at: false },
    Shape { name: "W9 proj", m: 1024, k: 256, n: 256, at: false },
    Shape { name: "W9 up", m: 1024, k: 256, n: 1024, at: false },
    Shape { name: "W9 down", m: 1024, k: 1024, n: 256, at: false },
    Shape { name: "W10 hT.dy", m: 1024, k: 1024, n: 256, at: true },
    Shape { name: "W10 xT.dy", m: 256, k: 1024, n: 1024, at: true },
    Shape { name: "LM qkv", m: 900, k: 384, n: 1152, at: false },
    Shape { name: "LM out", m: 900, k: 384, n: 384, at: false },
    Shape { name: "LM up", m: 900, k: 384, n: 1536, at: false },
    Shape { name: "LM down", m: 900, k: 1536, n: 384, at: false },
];

/// The least time per call of `f` over 150 batches of about 1 ms (at
/// least one call): on a shared machine the least is the run least
/// disturbed by other work.
fn time(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    f();
    let once = start.elapsed().max(Duration::from_nanos(100));
    let per_batch = (Duration::from_millis(1).as_nanos() / once.as_nanos()).max(1) as u32;
    (0..150)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed() / per_batch
        })
        .min()
        .unwrap_or(once)
}

/// Deterministic values in [-1, 1).
fn matrix(r: usize, c: usize, seed: u64) -> Array2<f32> {
    let mut s = seed | 1;
    Array2::from_shape_fn((r, c), |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    })
}

/// max |c − want| / max |want|.
fn error(c: &[f32], want: &[f64]) -> f64 {
    let top = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    c.iter().zip(want).fold(0f64, |m, (c, w)| m.max((f64::from(*c) - w).abs())) / top
}

fn main() {
    let n_threads = std::env::var("LOWP_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    threads::set_num_threads(n_threads);
    let isa = Isa::from_env();
    let vdp = isa.with_amx(false);
    println!(
        "{n_threads} thread(s); amx-bf16 {}, avx512-bf16 {}, vnni {}",
        isa.has_amx_bf16(),
        isa.has_avx512_bf16(),
        isa.has_avx512_vnni()
    );
    println!(
        "{:<9} {:>14} | {:>7} {:>6} {:>7} | {:>7} {:>6} {:>5} {:>7} | {:>7} {:>6} {:>5} | {:>7} {:>6} {:>5} {:>7}",
        "shape",
        "m×k×n",
        "f32 µs",
        "GMAC/s",
        "error",
        "amx µs",
        "GMAC/s",
        "×f32",
        "error",
        "vdp µs",
        "GMAC/s",
        "×f32",
        "int8 µs",
        "GMAC/s",
        "×f32",
        "error"
    );
    let mut packing = Vec::new();
    for s in &SHAPES {
        let (m, k, n) = (s.m, s.k, s.n);
        let stored = if s.at { matrix(k, m, 1) } else { matrix(m, k, 1) };
        let a: ArrayView2<'_, f32> = if s.at { stored.t() } else { stored.view() };
        let b = matrix(k, n, 2);
        let want: Vec<f64> = a.mapv(f64::from).dot(&b.mapv(f64::from)).into_iter().collect();
        let macs = (m * k * n) as f64;
        let rate = |t: Duration| macs / t.as_secs_f64() / 1e9;
        let us = |t: Duration| t.as_secs_f64() * 1e6;

        let mut c = vec![0f32; m * n];
        let (sa, sb) = (a.strides(), b.strides());
        let f32_time = time(|| {
            // SAFETY: the views describe m×k and k×n matrices with these
            // strides; `c` is a separate contiguous m×n buffer.
            unsafe {
                tracejit_kernels::gemm::product::<f32>(
                    isa,
                    m,
                    k,
                    n,
                    a.as_ptr(),
                    sa[0],
                    sa[1],
                    b.as_ptr(),
                    sb[0],
                    sb[1],
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                    false,
                )
            }
        });
        let f32_err = error(&c, &want);

        let packed = PackedBf16::from_f32(b.view());
        // What a product whose weight is an argument pays per call on top.
        packing.push((s.name, us(time(|| drop(PackedBf16::from_f32(b.view()))))));
        let bf16_time = time(|| gemm_bf16_from_f32(a, &packed, &mut c, false, isa));
        let bf16_err = error(&c, &want);
        let vdp_time = time(|| gemm_bf16_from_f32(a, &packed, &mut c, false, vdp));

        let quantized = PackedI8::quantize(b.view());
        let int8_time = time(|| gemm_dynamic_i8(a, &quantized, &mut c, false, isa));
        let int8_err = error(&c, &want);

        let speedup = |t: Duration| f32_time.as_secs_f64() / t.as_secs_f64();
        println!(
            "{:<9} {:>14} | {:>7.1} {:>6.1} {:>7.1e} | {:>7.1} {:>6.1} {:>5.2} {:>7.1e} \
             | {:>7.1} {:>6.1} {:>5.2} | {:>7.1} {:>6.1} {:>5.2} {:>7.1e}",
            s.name,
            format!("{m}×{k}×{n}"),
            us(f32_time),
            rate(f32_time),
            f32_err,
            us(bf16_time),
            rate(bf16_time),
            speedup(bf16_time),
            bf16_err,
            us(vdp_time),
            rate(vdp_time),
            speedup(vdp_time),
            us(int8_time),
            rate(int8_time),
            speedup(int8_time),
            int8_err
        );
    }
    println!("packing the rhs into bf16 pairs (per call when the weight is an argument):");
    for (name, t) in packing {
        println!("  {name:<9} {t:>7.1} µs");
    }
}
