//! The machine's floors, measured in the same run as the workloads: memory
//! bandwidth (a copy of a large f32 buffer) and the raw GEMM time of W5's
//! three matrix products.

use std::hint::black_box;

use tracejit::tensor::Storage;
use tracejit::Tensor;

use crate::measure::{measure, Budget, Timing};

/// The buffer copied for the bandwidth floor in a full run: 256 MiB of f32.
pub const BANDWIDTH_BUFFER_FULL: usize = 256 << 20;
/// The buffer copied with `--quick`: 64 MiB of f32 (still 2x the 32 MiB L3).
pub const BANDWIDTH_BUFFER_QUICK: usize = 64 << 20;

/// The memory-bandwidth floor.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    /// Size of the copied buffer, bytes.
    pub buffer_bytes: usize,
    /// Bytes moved per second (read + write) at the median copy time, in
    /// GB/s (1e9 bytes).
    pub gbps: f64,
    /// Time of one copy.
    pub timing: Timing,
}

impl Bandwidth {
    /// The time, µs, to move `bytes` at this bandwidth.
    pub fn floor_us(&self, bytes: f64) -> f64 {
        bytes / (self.gbps * 1e9) * 1e6
    }
}

/// Copies a `buffer_bytes` f32 buffer into another (both touched beforehand,
/// so no page fault is timed); bandwidth = 2 x buffer / median copy time.
pub fn measure_bandwidth(buffer_bytes: usize, budget: Budget) -> Bandwidth {
    let n = buffer_bytes / std::mem::size_of::<f32>();
    let src: Vec<f32> = (0..n).map(|i| (i % 1024) as f32).collect();
    let mut dst: Vec<f32> = vec![1.0; n];
    let timing = measure(budget, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        Ok::<(), ()>(())
    })
    .unwrap_or_else(|()| unreachable!("a copy cannot fail"));
    let gbps = 2.0 * buffer_bytes as f64 / (timing.median_us * 1e-6) / 1e9;
    Bandwidth { buffer_bytes, gbps, timing }
}

/// Which GEMM [`gemm_products`] goes through, for the report. Switch it
/// together with that function.
pub const GEMM_FLOOR_IMPL: &str = "tracejit_jit::matmul_reusing, the JIT executor's GEMM";

/// W5's matrix shapes: (m, k, n) of each product.
pub const MLP_FORWARD_PRODUCTS: [(usize, usize, usize); 3] = [(64, 784, 512), (64, 512, 512), (64, 512, 10)];

/// THE place the GEMM floor's products are computed: `a @ b` for each pair,
/// through the GEMM the JIT executor uses (`tracejit_jit::matmul_reusing`),
/// each written over the previous call's output in `outs` as the executor
/// writes into pooled buffers (so the floor counts no page faults). To
/// measure another GEMM, call it here and update [`GEMM_FLOOR_IMPL`].
pub fn gemm_products(products: &[(Storage, Storage)], outs: &mut Vec<Storage>) {
    let old: Vec<Option<Storage>> =
        std::mem::take(outs).into_iter().map(Some).chain(std::iter::repeat(None)).take(products.len()).collect();
    *outs = products.iter().zip(old).map(|((a, b), o)| tracejit_jit::matmul_reusing(a, b, o)).collect();
}

/// The GEMM floor of W5: the time of its three raw matrix products (no
/// bias, no relu), f32 operands from fixed seeds.
pub fn measure_gemm_mlp_forward(budget: Budget) -> Timing {
    let products: Vec<(Storage, Storage)> = MLP_FORWARD_PRODUCTS
        .iter()
        .enumerate()
        .map(|(i, &(m, k, n))| {
            let a = Tensor::randn(&[m, k], 100 + i as u64);
            let b = Tensor::randn(&[k, n], 200 + i as u64) * (1.0 / (k as f64).sqrt());
            (a.storage().expect("eager").clone(), b.storage().expect("eager").clone())
        })
        .collect();
    let mut outs = Vec::new();
    measure(budget, || {
        gemm_products(black_box(&products), &mut outs);
        black_box(&outs);
        Ok::<(), ()>(())
    })
    .unwrap_or_else(|()| unreachable!("a product cannot fail"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TINY: Budget = Budget { warmup: Duration::from_millis(1), measure: Duration::from_millis(2) };

    #[test]
    fn bandwidth_is_positive_and_floor_scales_with_bytes() {
        let bw = measure_bandwidth(1 << 20, TINY);
        assert!(bw.gbps > 0.0 && bw.gbps.is_finite());
        let one = bw.floor_us(1e6);
        assert!((bw.floor_us(2e6) - 2.0 * one).abs() < 1e-9 * one.max(1.0));
    }

    #[test]
    fn gemm_products_compute_the_products() {
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
        let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 2.0], &[2, 2]);
        let products = [(a.storage().unwrap().clone(), b.storage().unwrap().clone())];
        let mut out = Vec::new();
        gemm_products(&products, &mut out);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 4.0, 3.0, 8.0]);
        let first = out[0].clone();
        gemm_products(&products, &mut out);
        // `first` still holds the old buffer, so this call wrote a new one.
        assert_eq!(out[0].to_vec::<f32>().unwrap(), first.to_vec::<f32>().unwrap());
        drop(first);
        gemm_products(&products, &mut out);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 4.0, 3.0, 8.0]);
    }
}
