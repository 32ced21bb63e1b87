//! Flash attention speeds and memory: the forward and backward on W9's
//! sizes (32 problems, batch 8 × 4 heads, tq = tk = 128, d = dv = 64,
//! causal) and on longer sequences, at 1 and 2 threads, as the best time
//! in µs and G multiply-adds/s; the `gemm` crate's rate on the tile
//! products a `gemm`-based design would run; and the peak memory a call
//! allocates at tq = tk = 4096 (a counting global allocator).
//!
//! Multiply-adds counted: the forward's `q·kᵀ` and `p·v` over the pairs the
//! causal rule keeps ([`Problem::pairs`] · (d + dv)); the backward's seven
//! products as run (`S` and `dP` in both passes, `dq`, `dk`, `dv`: pairs ·
//! (4d + 3dv)), and in brackets the five a fused backward needs (3d + 2dv).
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-attn taskset -c 0 \
//!     cargo run --release -p tracejit-kernels --example attention
//! ```
//! (under `taskset -c 0` the 2-thread lines share one core; use `-c 0-1`
//! for them).
//!
//! On one Zen 4 core (f32 FMA peak ~58 G MAC/s), best of three runs on a
//! shared machine: W9 forward 37 G MAC/s (0.90 ms), backward 37 (3.2 ms);
//! tq = tk = 1024 causal 46 and 45, not causal 48 and 47; 256-bit code on
//! W9 32 and 35. The `gemm` crate reaches 48 on the bare 64 × 64 × 64 tile
//! products, while the whole forward here (products, softmax, copies) runs
//! at 46-48 with its own kernel, which is why the products do not go
//! through `gemm::product` (which would also need `kᵀ` and `P` copied per
//! block).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tracejit_kernels::attention::{backward, forward, forward_strided_bf16, Mask, Operand, Problem};
use tracejit_kernels::{gemm, threads, Isa};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to `System`, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's pointer, allocated above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes allocated by `f` at its peak beyond what was live before.
fn peak_extra(f: impl FnOnce()) -> usize {
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst) - before
}

/// The best time of `f` in seconds over about 0.5 s (at least 3 runs).
fn best(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while start.elapsed() < Duration::from_millis(500) || runs < 3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
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

/// One problem's operands and outputs.
struct Operands {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

impl Operands {
    fn new(p: &Problem) -> Operands {
        let (nq, nk) = (p.batch * p.tq, p.batch * p.tk);
        Operands {
            q: values(nq * p.d, 1),
            k: values(nk * p.d, 2),
            v: values(nk * p.dv, 3),
            dout: values(nq * p.dv, 4),
            out: vec![0.0; nq * p.dv],
            lse: vec![0.0; nq],
            dq: vec![0.0; nq * p.d],
            dk: vec![0.0; nk * p.d],
            dv: vec![0.0; nk * p.dv],
        }
    }

    fn forward(&mut self, p: &Problem, isa: Isa) {
        forward(p, &self.q, &self.k, &self.v, None, &mut self.out, &mut self.lse, isa);
    }

    /// The forward with bf16 products (`vdpbf16ps` where the CPU has it).
    fn forward_bf16(&mut self, p: &Problem, isa: Isa) {
        let starts = |rows: usize, cols: usize| (0..p.batch).map(|b| b * rows * cols).collect::<Vec<_>>();
        let (qs, ks, vs) = (starts(p.tq, p.d), starts(p.tk, p.d), starts(p.tk, p.dv));
        let q = Operand { data: &self.q, starts: &qs, row_stride: p.d };
        let k = Operand { data: &self.k, starts: &ks, row_stride: p.d };
        let v = Operand { data: &self.v, starts: &vs, row_stride: p.dv };
        forward_strided_bf16(p, q, k, v, None, &mut self.out, &mut self.lse, isa);
    }

    fn backward(&mut self, p: &Problem, isa: Isa) {
        let o = self;
        backward(p, &o.q, &o.k, &o.v, None, &o.out, &o.lse, &o.dout, &mut o.dq, &mut o.dk, &mut o.dv, isa);
    }
}

/// Times the forward and backward of `p` at 1 and 2 threads (one thread
/// only for 256-bit code).
fn speeds(name: &str, p: Problem, isa: Isa) {
    let mut o = Operands::new(&p);
    let counts: &[usize] = if isa == Isa::native() { &[1, 2] } else { &[1] };
    let pairs = p.pairs() as f64;
    let (fwd, bwd, fused) =
        (pairs * (p.d + p.dv) as f64, pairs * (4 * p.d + 3 * p.dv) as f64, pairs * (3 * p.d + 2 * p.dv) as f64);
    println!("{name}: {p:?}, {:?}", isa.width());
    println!("  forward {:.1} M MAC, backward {:.1} M MAC ({:.1} fused)", fwd / 1e6, bwd / 1e6, fused / 1e6);
    for &n in counts {
        threads::set_num_threads(n);
        let tf = best(|| o.forward(black_box(&p), isa));
        let tb = best(|| o.backward(black_box(&p), isa));
        println!("  {n} thread(s): forward {:>8.1} µs {:>5.1} G MAC/s", tf * 1e6, fwd / tf / 1e9);
        if isa.has_avx512_bf16() {
            let th = best(|| o.forward_bf16(black_box(&p), isa));
            println!("  {n} thread(s): forward, bf16 products {:>8.1} µs {:>5.1} G MAC/s", th * 1e6, fwd / th / 1e9);
        }
        println!(
            "  {n} thread(s): backward {:>7.1} µs {:>5.1} G MAC/s ({:.1} fused-equivalent)",
            tb * 1e6,
            bwd / tb / 1e9,
            fused / tb / 1e9
        );
    }
    threads::set_num_threads(0);
}

/// A BERT encoder's attention with a key-padding mask (MiniLM's heads in
/// W15: 8 rows × 12 heads, 112 positions, d = 32, each row's keys past
/// its length masked), against the same problem unmasked: what the mask
/// costs.
fn key_mask_speeds() {
    let (rows, heads, t) = (8, 12, 112);
    let p = Problem { batch: rows * heads, tq: t, tk: t, d: 32, dv: 32, scale: 32f32.sqrt().recip(), causal: false };
    let mut o = Operands::new(&p);
    // Row r keeps its first `len(r)` keys, lengths spread over 80..=112.
    let flags: Vec<bool> = (0..p.batch).flat_map(|b| (0..t).map(move |j| j < t - (b / heads) * 4)).collect();
    let mask = Mask { data: &flags, batch_stride: t, row_stride: 0, col_stride: 1 };
    let macs = (p.batch * t * t * (p.d + p.dv)) as f64;
    let isa = Isa::native();
    for n in [1, 2] {
        threads::set_num_threads(n);
        let plain = best(|| o.forward(black_box(&p), isa));
        let masked = best(|| forward(&p, &o.q, &o.k, &o.v, Some(black_box(&mask)), &mut o.out, &mut o.lse, isa));
        println!(
            "W15 attention {n} thread(s): unmasked {:>8.1} µs {:>5.1} G MAC/s, key mask {:>8.1} µs {:>5.1} G MAC/s",
            plain * 1e6,
            macs / plain / 1e9,
            masked * 1e6,
            macs / masked / 1e9
        );
    }
    threads::set_num_threads(0);
}

/// The `gemm` crate on the products of one 64 × 64 block with d = 64
/// (`S = q·kᵀ` with `k` read transposed, then `o += P·v`), one thread.
fn gemm_tiles() {
    let (a, b) = (values(64 * 64, 5), values(64 * 64, 6));
    let mut c = vec![0.0f32; 64 * 64];
    let isa = Isa::native();
    let t = best(|| {
        threads::serial(|| {
            for _ in 0..64 {
                // SAFETY: 64 × 64 row-major matrices, `c` apart from both.
                unsafe {
                    gemm::product::<f32>(
                        isa,
                        64,
                        64,
                        64,
                        a.as_ptr(),
                        64,
                        1,
                        b.as_ptr(),
                        1,
                        64,
                        c.as_mut_ptr(),
                        64,
                        1,
                        false,
                    );
                    gemm::product::<f32>(
                        isa,
                        64,
                        64,
                        64,
                        a.as_ptr(),
                        64,
                        1,
                        b.as_ptr(),
                        64,
                        1,
                        c.as_mut_ptr(),
                        64,
                        1,
                        true,
                    );
                }
            }
            black_box(&mut c);
        })
    });
    let macs = 64.0 * 2.0 * 64.0 * 64.0 * 64.0;
    println!("gemm crate, 64 × 64 × 64 tile products (q·kᵀ, P·v): {:.1} G MAC/s on one thread", macs / t / 1e9);
}

/// Peak bytes allocated by a forward and a backward at tq = tk = 4096.
fn memory() {
    let p = Problem { batch: 1, tq: 4096, tk: 4096, d: 64, dv: 64, scale: 0.125, causal: true };
    let mut o = Operands::new(&p);
    let scores = p.tq * p.tk * 4;
    println!("memory at tq = tk = 4096, d = dv = 64 (the scores would take {} KiB):", scores >> 10);
    for n in [1, 2] {
        threads::set_num_threads(n);
        // Each in a fresh thread, so that no scratch is left from an earlier
        // call (a worker's may be: the pool's workers outlive a call).
        let (o, isa) = (&mut o, Isa::native());
        let f = std::thread::scope(|s| s.spawn(|| peak_extra(|| o.forward(&p, isa))).join().unwrap());
        let b = std::thread::scope(|s| s.spawn(|| peak_extra(|| o.backward(&p, isa))).join().unwrap());
        println!("  {n} thread(s): forward allocates {} KiB at its peak, backward {} KiB", f >> 10, b >> 10);
        assert!(f < scores / 16 && b < scores / 16, "attention allocated O(tq·tk)");
    }
    threads::set_num_threads(0);
}

fn main() {
    // `attention loop forward|bf16|backward [tq [full]]`: one pass of W9's
    // problem (or 4 problems of `tq` queries and keys; `full`: not causal)
    // for ~3 s, for a profiler.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("loop") {
        let tq = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
        let batch = if tq == 128 { 32 } else { 4 };
        let causal = args.get(4).map(String::as_str) != Some("full");
        let p = Problem { batch, tq, tk: tq, d: 64, dv: 64, scale: 0.125, causal };
        let mut o = Operands::new(&p);
        let isa = Isa::native();
        o.forward(&p, isa);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            match args.get(2).map(String::as_str) {
                Some("backward") => o.backward(black_box(&p), isa),
                Some("bf16") => o.forward_bf16(black_box(&p), isa),
                _ => o.forward(black_box(&p), isa),
            }
        }
        return;
    }
    if args.get(1).map(String::as_str) == Some("mask") {
        key_mask_speeds();
        return;
    }
    memory();
    key_mask_speeds();
    gemm_tiles();
    let w9 = Problem { batch: 32, tq: 128, tk: 128, d: 64, dv: 64, scale: 0.125, causal: true };
    let (native, narrow) = (Isa::native(), Isa::native().with_avx512(false));
    let long = Problem { batch: 4, tq: 1024, tk: 1024, ..w9 };
    speeds("W9/W10 (GPT block)", w9, native);
    speeds("W9 sizes, not causal", Problem { causal: false, ..w9 }, native);
    speeds("long, causal", long, native);
    speeds("long, not causal", Problem { causal: false, ..long }, native);
    speeds("W9/W10, 256-bit", w9, narrow);
    speeds("long, causal, 256-bit", long, narrow);
}
