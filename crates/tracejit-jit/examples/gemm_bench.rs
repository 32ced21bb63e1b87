//! Throwaway measurement: the `gemm` crate against `matrixmultiply` on the
//! MLP shapes (single thread, f32, row-major). Run with
//! `cargo run --release -p tracejit-jit --example gemm_bench`.

use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    for &(m, k, n) in &[(64usize, 784usize, 512usize), (64, 512, 512), (64, 512, 10), (1024, 1024, 1024)] {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut c = vec![0f32; m * n];
        let reps = if m * n * k > 100_000_000 { 5 } else { 200 };
        let flops = 2.0 * (m * n * k) as f64;
        let mut t_mm = Vec::new();
        let mut t_g = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            // SAFETY: buffers sized m*k, k*n, m*n, row-major.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    k as isize,
                    1,
                    b.as_ptr(),
                    n as isize,
                    1,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            };
            t_mm.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            // SAFETY: as above; gemm's (cs, rs) order.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
            t_g.push(t.elapsed().as_secs_f64());
        }
        let (mm, g) = (median(t_mm), median(t_g));
        println!(
            "{m}x{k}x{n}: matrixmultiply {:.1} us ({:.1} GFLOP/s), gemm {:.1} us ({:.1} GFLOP/s)",
            mm * 1e6,
            flops / mm / 1e9,
            g * 1e6,
            flops / g / 1e9
        );
    }
}
