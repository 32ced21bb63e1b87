//! Convolution and pooling speeds on the layers of W11 (x [32, 32, 32, 32],
//! 3x3 conv 32 -> 64 pad 1 + bias + relu, 2x2 max pool) and W12 (x [64, 1,
//! 28, 28], 5x5 conv 1 -> 16 pad 2, relu, pool 2, 5x5 conv 16 -> 32 pad 2,
//! relu, pool 2, with the backward), at 1 and 2 threads: per kernel the
//! best time in µs and G multiply-adds/s (for pools, G input elements/s)
//! by the wall clock and, at one thread, by the thread's time on a CPU;
//! and the `gemm` crate's rate on W11's product shape for comparison.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-conv taskset -c 0-1 \
//!     cargo run --release -p tracejit-kernels --example conv [name filter]
//! ```
//!
//! `CONV_THREADS=1,2` (the default) lists the thread counts.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tracejit_kernels::conv::{self, Conv2dGeometry};
use tracejit_kernels::pool2d::{self, Pool2dGeometry};
use tracejit_kernels::{threads, Isa};

/// `struct timespec` of Linux on 64-bit targets.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
unsafe extern "C" {
    /// The C library's `clock_gettime` (the standard library links it).
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// This thread's time on a CPU in seconds (`CLOCK_THREAD_CPUTIME_ID`), if
/// known: unlike the wall clock, it leaves out the time that other
/// processes on the shared cores took.
fn cpu_time() -> Option<f64> {
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    {
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid timespec; clock 3 is the calling thread's
        // CPU-time clock.
        if unsafe { clock_gettime(3, &mut ts) } == 0 {
            return Some(ts.sec as f64 + ts.nsec as f64 * 1e-9);
        }
    }
    None
}

/// The best time of `f` in seconds over about 0.4 s (at least 3 runs):
/// (wall clock, this thread's time on a CPU where known).
fn best(mut f: impl FnMut()) -> (f64, Option<f64>) {
    f();
    let start = Instant::now();
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    let mut runs = 0;
    while start.elapsed() < Duration::from_millis(400) || runs < 3 {
        let (t, c) = (Instant::now(), cpu_time());
        f();
        wall = wall.min(t.elapsed().as_secs_f64());
        if let (Some(c0), Some(c1)) = (c, cpu_time()) {
            cpu = cpu.min(c1 - c0);
        }
        runs += 1;
    }
    (wall, cpu.is_finite().then_some(cpu))
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// A stride-1 convolution with square kernel `k` and padding `p`.
fn conv_geo(batch: usize, cin: usize, hw: usize, cout: usize, k: usize, p: usize) -> Conv2dGeometry {
    Conv2dGeometry {
        batch,
        in_channels: cin,
        in_h: hw,
        in_w: hw,
        out_channels: cout,
        kernel: [k, k],
        stride: [1, 1],
        dilation: [1, 1],
        pad: [p; 4],
        groups: 1,
    }
}

/// Whether to measure the kernel called `name`: every one, or those whose
/// names contain the program's first argument.
fn wanted(name: &str) -> bool {
    std::env::args().nth(1).is_none_or(|f| name.contains(&f))
}

/// Times `f` and prints one line if [`wanted`]: name, µs and rate by the
/// wall clock, and at one thread by the calling thread's time on a CPU
/// (the figure to trust on a busy machine). Returns that figure (else the
/// wall clock's) in seconds, 0 when not measured.
fn line(name: &str, units: usize, unit: &str, f: impl FnMut()) -> f64 {
    if !wanted(name) {
        return 0.0;
    }
    let (wall, cpu) = best(f);
    let rate = |secs: f64| units as f64 / secs / 1e9;
    print!("  {name:<36} {:>9.1} µs {:>6.1} {unit}", wall * 1e6, rate(wall));
    match cpu.filter(|_| threads::num_threads() == 1) {
        Some(c) => {
            println!("   on-CPU {:>9.1} µs {:>6.1} {unit}", c * 1e6, rate(c));
            c
        }
        None => {
            println!();
            wall
        }
    }
}

/// The passes of one layer (backward-data when asked); returns the
/// seconds of (forward, backward).
fn conv_layer(name: &str, g: &Conv2dGeometry, relu: bool, backward_data: bool) -> (f64, f64) {
    // TRACEJIT_ISA=avx2 measures the AVX2 kernels.
    let isa = Isa::current();
    let (x, w, b) = (
        values(g.batch * g.in_channels * g.in_h * g.in_w, 1),
        values(g.out_channels * g.in_channels * g.kernel[0] * g.kernel[1] / g.groups, 2),
        values(g.out_channels, 3),
    );
    let ylen = g.batch * g.out_channels * g.out_h() * g.out_w();
    let (mut y, dy) = (vec![0.0; ylen], values(ylen, 4));
    let macs = g.macs();
    let forward = line(&format!("{name} forward"), macs, "G MAC/s", || {
        conv::forward(g, &x, &w, Some(&b), relu, black_box(&mut y), isa)
    });
    if let Some(filter) = conv::PackedFilter::new(g, &w, isa) {
        // The channel-lane kernel from weights packed once, as a compiled
        // model's layer runs it, and packing in every call.
        let mut y2 = vec![0.0; ylen];
        line(&format!("{name} forward, filter packed"), macs, "G MAC/s", || {
            conv::forward_with_filter(g, &x, &filter, Some(&b), relu, black_box(&mut y2), isa)
        });
        line(&format!("{name} forward, packing per call"), macs, "G MAC/s", || {
            let f = conv::PackedFilter::new(g, &w, isa).expect("packed above");
            conv::forward_with_filter(g, &x, &f, Some(&b), relu, black_box(&mut y2), isa)
        });
        // Weights out of the caches, as in a model whose layers' weights
        // exceed them: a new filter of 24 in every call.
        let cold: Vec<_> = (0..24).map(|_| filter.clone()).collect();
        let mut turn = 0;
        line(&format!("{name} forward, filter packed, weights cold"), macs, "G MAC/s", || {
            turn = (turn + 1) % cold.len();
            conv::forward_with_filter(g, &x, &cold[turn], Some(&b), relu, black_box(&mut y2), isa)
        });
        let diff = y.iter().zip(&y2).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        if wanted(&format!("{name} forward")) {
            println!("  {name:<36} largest difference between the two kernels: {diff:e}");
        }
        // Channels last (x read as [n, h, w, c], y written so), weights
        // warm and out of the caches.
        line(&format!("{name} forward, channels last"), macs, "G MAC/s", || {
            conv::forward_channels_last_with_filter(g, &x, &filter, Some(&b), relu, black_box(&mut y2), isa)
        });
        let mut ya = vec![0.0f32; ylen + 16];
        let off = ya.as_ptr().align_offset(64);
        line(&format!("{name} forward, channels last, aligned"), macs, "G MAC/s", || {
            conv::forward_channels_last_with_filter(
                g,
                &x,
                &filter,
                Some(&b),
                relu,
                black_box(&mut ya[off..off + ylen]),
                isa,
            )
        });
        line(&format!("{name} forward, channels last, weights cold"), macs, "G MAC/s", || {
            turn = (turn + 1) % cold.len();
            conv::forward_channels_last_with_filter(g, &x, &cold[turn], Some(&b), relu, black_box(&mut y2), isa)
        });
        // A ResNet block's last convolution: batch norm's scale and shift,
        // the shortcut added, relu; the shortcut read from memory.
        let (scale, residual) = (values(g.out_channels, 9), values(ylen, 10));
        let epi = conv::Epilogue { scale: Some(&scale), bias: Some(&b), residual: Some(&residual), relu };
        line(&format!("{name} forward, channels last, residual"), macs, "G MAC/s", || {
            conv::forward_channels_last_fused(g, &x, &w, Some(&filter), epi, black_box(&mut y2), isa)
        });
        // The same, written over the shortcut (as a compiled model does
        // when the shortcut dies there); the values grow, staying finite.
        let mut y3 = residual.clone();
        let own = conv::Epilogue { residual: None, ..epi };
        line(&format!("{name} forward, channels last, onto residual"), macs, "G MAC/s", || {
            conv::forward_channels_last_onto(g, &x, &w, Some(&filter), own, black_box(&mut y3), isa)
        });
    }
    let mut backward = 0.0;
    if backward_data {
        let mut dx = vec![0.0; x.len()];
        backward += line(&format!("{name} backward-data"), macs, "G MAC/s", || {
            conv::backward_data(g, &dy, &w, black_box(&mut dx), isa)
        });
    }
    let (mut dw, mut db) = (vec![0.0; w.len()], vec![0.0; b.len()]);
    backward += line(&format!("{name} backward-filter"), macs, "G MAC/s", || {
        conv::backward_filter(g, &x, &dy, black_box(&mut dw), Some(&mut db), isa)
    });
    (forward, backward)
}

/// Max and average pooling, forward and backward, of a 2x2 stride-2 pool;
/// returns the seconds of the max's (forward, backward).
fn pool_layer(name: &str, batch: usize, channels: usize, hw: usize) -> (f64, f64) {
    let g = Pool2dGeometry { batch, channels, in_h: hw, in_w: hw, kernel: [2, 2], stride: [2, 2], pad: [0; 4] };
    let n = batch * channels * hw * hw;
    let x = values(n, 5);
    let (mut y, dy, mut dx) = (vec![0.0; batch * channels * g.out_h() * g.out_w()], values(n / 4, 6), vec![0.0; n]);
    let forward = line(&format!("{name} max forward"), n, "G elem/s", || {
        pool2d::max_forward(&g, &x, black_box(&mut y), Isa::native())
    });
    let backward = line(&format!("{name} max backward"), n, "G elem/s", || {
        pool2d::max_backward(&g, &x, &dy, black_box(&mut dx), Isa::native())
    });
    line(&format!("{name} avg forward"), n, "G elem/s", || {
        pool2d::avg_forward(&g, &x, black_box(&mut y), Isa::native())
    });
    line(&format!("{name} avg backward"), n, "G elem/s", || {
        pool2d::avg_backward(&g, &dy, black_box(&mut dx), Isa::native())
    });
    (forward, backward)
}

/// The gemm crate's rate on one image's product of W11 (64 × 288 × 1024).
fn gemm_rate() {
    let (m, k, n) = (64, 288, 1024);
    let (a, b, mut c) = (values(m * k, 7), values(k * n, 8), vec![0.0f32; m * n]);
    line("gemm 32 x (64x288 . 288x1024)", 32 * m * k * n, "G MAC/s", || {
        for _ in 0..32 {
            // SAFETY: row-major m×k, k×n and m×n buffers.
            unsafe {
                tracejit_kernels::gemm::product::<f32>(
                    Isa::native(),
                    m,
                    k,
                    n,
                    a.as_ptr(),
                    k as isize,
                    1,
                    b.as_ptr(),
                    n as isize,
                    1,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                    false,
                )
            }
        }
    });
}

/// ResNet-50's 3x3 convolutions (stride 1, pad 1) at batch 1 and its stem's
/// 3x3 stride-2 max pool: the direct kernel on wide and narrow maps.
fn resnet_layers() {
    for (c, hw) in [(64, 56), (128, 28), (256, 14), (512, 7)] {
        conv_layer(&format!("resnet 3x3 {c}->{c} @{hw}"), &conv_geo(1, c, hw, c, 3, 1), true, false);
    }
    // The strided layers (torchvision's v1.5: the stride on the 3x3) and
    // the 1x1 products at the widest map.
    for (name, cin, hw, cout, k, p) in
        [("3x3/2 128->128 @56", 128, 56, 128, 3, 1), ("1x1/2 256->512 @56", 256, 56, 512, 1, 0)]
    {
        let g = Conv2dGeometry { stride: [2, 2], ..conv_geo(1, cin, hw, cout, k, p) };
        conv_layer(&format!("resnet {name}"), &g, true, false);
    }
    for (cin, cout) in [(64, 256), (256, 64)] {
        conv_layer(&format!("resnet 1x1 {cin}->{cout} @56"), &conv_geo(1, cin, 56, cout, 1, 0), true, false);
    }
    // The stem: 7x7 stride 2 over the image's three channels.
    let stem = Conv2dGeometry { stride: [2, 2], ..conv_geo(1, 3, 224, 64, 7, 3) };
    conv_layer("resnet stem 7x7/2 3->64 @224", &stem, true, false);
    conv_layer("resnet b8 stem 7x7/2 3->64 @224", &Conv2dGeometry { batch: 8, ..stem }, true, false);
    // The narrow maps' 1x1 products and strided 3x3s.
    for (cin, cout, hw) in [(512, 256, 28), (256, 1024, 14), (1024, 256, 14), (512, 2048, 7), (2048, 512, 7)] {
        let name = format!("resnet 1x1 {cin}->{cout} @{hw}");
        conv_layer(&name, &conv_geo(1, cin, hw, cout, 1, 0), true, false);
    }
    // W14b's batch of 8 on the narrow maps.
    for (c, hw) in [(128, 28), (256, 14), (512, 7)] {
        conv_layer(&format!("resnet b8 3x3 {c}->{c} @{hw}"), &conv_geo(8, c, hw, c, 3, 1), true, false);
    }
    conv_layer("resnet b8 1x1 1024->256 @14", &conv_geo(8, 1024, 14, 256, 1, 0), true, false);
    // And on the widest map, whose activations at batch 8 (25 MB for 256
    // channels) come from memory.
    conv_layer("resnet b8 3x3 64->64 @56", &conv_geo(8, 64, 56, 64, 3, 1), true, false);
    for (cin, cout) in [(64, 256), (256, 64)] {
        conv_layer(&format!("resnet b8 1x1 {cin}->{cout} @56"), &conv_geo(8, cin, 56, cout, 1, 0), true, false);
    }
    for (c, hw) in [(256, 28), (512, 14)] {
        let g = Conv2dGeometry { stride: [2, 2], ..conv_geo(1, c, hw, c, 3, 1) };
        conv_layer(&format!("resnet 3x3/2 {c}->{c} @{hw}"), &g, true, false);
        conv_layer(&format!("resnet b8 3x3/2 {c}->{c} @{hw}"), &Conv2dGeometry { batch: 8, ..g }, true, false);
    }
    let g =
        Pool2dGeometry { batch: 1, channels: 64, in_h: 112, in_w: 112, kernel: [3, 3], stride: [2, 2], pad: [1; 4] };
    let x = values(64 * 112 * 112, 5);
    let mut y = vec![0.0; 64 * g.out_h() * g.out_w()];
    line("resnet max pool 3x3/2 [1,64,112,112]", x.len(), "G elem/s", || {
        pool2d::max_forward(&g, &x, black_box(&mut y), Isa::native())
    });
    line("resnet max pool 3x3/2 [1,64,112,112] channels last", x.len(), "G elem/s", || {
        pool2d::max_forward_channels_last(&g, &x, black_box(&mut y))
    });
    // W14b's stem pool, and its head's global average over the last block.
    let g8 = Pool2dGeometry { batch: 8, ..g };
    let (x8, mut y8) = (values(8 * x.len(), 6), vec![0.0; 8 * y.len()]);
    line("resnet b8 max pool 3x3/2 [8,64,112,112] channels last", x8.len(), "G elem/s", || {
        pool2d::max_forward_channels_last(&g8, &x8, black_box(&mut y8))
    });
    let head =
        Pool2dGeometry { batch: 8, channels: 2048, in_h: 7, in_w: 7, kernel: [7, 7], stride: [1, 1], pad: [0; 4] };
    let xh = values(8 * 2048 * 49, 7);
    let mut yh = vec![0.0; 8 * 2048];
    line("resnet b8 global avg pool [8,2048,7,7] channels last", xh.len(), "G elem/s", || {
        pool2d::avg_forward_channels_last(&head, &xh, black_box(&mut yh), Isa::current())
    });
}

fn main() {
    let w11 = conv_geo(32, 32, 32, 64, 3, 1);
    let w12a = conv_geo(64, 1, 28, 16, 5, 2);
    let w12b = conv_geo(64, 16, 14, 32, 5, 2);
    let counts: Vec<usize> = std::env::var("CONV_THREADS")
        .map_or(vec![1, 2], |v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect());
    for n in counts {
        threads::set_num_threads(n);
        println!("{n} thread(s):");
        gemm_rate();
        resnet_layers();
        let (c11, _) = conv_layer("W11 conv 32->64 3x3", &w11, true, true);
        let (p11, _) = pool_layer("W11 pool [32,64,32,32]", 32, 64, 32);
        let (c1f, c1b) = conv_layer("W12 conv1 1->16 5x5", &w12a, true, false);
        let (p1f, p1b) = pool_layer("W12 pool1 [64,16,28,28]", 64, 16, 28);
        let (c2f, c2b) = conv_layer("W12 conv2 16->32 5x5", &w12b, true, true);
        let (p2f, p2b) = pool_layer("W12 pool2 [64,32,14,14]", 64, 32, 14);
        if std::env::args().nth(1).is_none() {
            println!("  W11 forward (conv + bias + relu, max pool)  {:>9.1} µs", (c11 + p11) * 1e6);
            println!("  W12 convolutions, forward + backward        {:>9.1} µs", (c1f + c1b + c2f + c2b) * 1e6);
            println!(
                "  W12 with the max pools, forward + backward  {:>9.1} µs",
                (c1f + c1b + c2f + c2b + p1f + p1b + p2f + p2b) * 1e6
            );
        }
    }
}
