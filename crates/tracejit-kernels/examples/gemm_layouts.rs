//! The f32 GEMM on each operand layout, single-threaded: how fast
//! `a · b`, `a · bᵀ` (`b` stored `[n, k]`, as linear layers' weights and
//! the backward pass's `dy · wᵀ`) and `aᵀ · b` run on this CPU, in G
//! multiply-adds/s. The layout rules of `gemm/micro.rs` (which products
//! copy an operand, which take the 8-lane kernels) were set from these
//! figures; run it on a new CPU before changing them.
//!
//! `cargo run --release -p tracejit-kernels --example gemm_layouts`
//! (pin it with `taskset -c 0`; medians of 31 runs).

use std::time::Instant;

use tracejit_kernels::{gemm::product, Isa};

/// Times one layout of an `m×k` by `k×n` product; `ta`/`tb`: the operand
/// is stored transposed.
fn time(m: usize, k: usize, n: usize, ta: bool, tb: bool) {
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 1000) as f32 * 1e-3).collect();
    let mut c = vec![0f32; m * n];
    let (rsa, csa) = if ta { (1, m as isize) } else { (k as isize, 1) };
    let (rsb, csb) = if tb { (1, k as isize) } else { (n as isize, 1) };
    let mut times = Vec::new();
    for _ in 0..31 {
        let start = Instant::now();
        // SAFETY: `a`, `b` and `c` hold `m·k`, `k·n` and `m·n` values, and
        // the strides describe those matrices.
        unsafe {
            product(
                Isa::current(),
                m,
                k,
                n,
                a.as_ptr(),
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                c.as_mut_ptr(),
                n as isize,
                1,
                false,
            )
        };
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let name = match (ta, tb) {
        (false, false) => "a·b",
        (false, true) => "a·bᵀ",
        _ => "aᵀ·b",
    };
    let rate = (m * k * n) as f64 / median / 1e3;
    println!("{m:>5}x{k:<5}x{n:<5} {name:5} {median:9.0} µs {rate:6.1} G/s");
}

fn main() {
    // W5/W6's MLP, and W10's forward and backward products.
    let shapes = [(64, 784, 512), (64, 512, 512), (1024, 256, 1024), (1024, 1024, 256), (1024, 256, 768)];
    for (m, k, n) in shapes {
        for (ta, tb) in [(false, false), (false, true), (true, false)] {
            time(m, k, n, ta, tb);
        }
    }
}
