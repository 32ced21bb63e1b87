//! The peak-memory counter: with `PeakAlloc` installed, `measure_peak` sees
//! what a call allocates above the live heap at its start, also on other
//! threads, and forgets what was allocated before.

use tracejit_bench::peak::{measure_peak, PeakAlloc};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

#[test]
fn the_peak_is_what_the_call_holds_at_once() {
    let held: Vec<u8> = vec![1; 8 << 20];
    // Two 1 MiB buffers live at once, then freed: the peak counts both.
    let (sum, peak) = measure_peak(|| {
        let a = vec![1u8; 1 << 20];
        let b = vec![2u8; 1 << 20];
        a.iter().map(|&x| u64::from(x)).sum::<u64>() + b.iter().map(|&x| u64::from(x)).sum::<u64>()
    });
    assert_eq!(sum, 3 << 20);
    let peak = peak.expect("the counting allocator is installed");
    assert!((2 << 20..(2 << 20) + 4096).contains(&peak), "peak {peak}");
    // Sequential buffers: the peak is one of them.
    let ((), peak) = measure_peak(|| {
        for _ in 0..4 {
            drop(std::hint::black_box(vec![0u8; 1 << 20]));
        }
    });
    let peak = peak.unwrap();
    assert!((1 << 20..(1 << 20) + 4096).contains(&peak), "peak {peak}");
    // Another thread's allocation counts too.
    let ((), peak) = measure_peak(|| {
        std::thread::spawn(|| drop(std::hint::black_box(vec![0u8; 3 << 20]))).join().unwrap();
    });
    assert!(peak.unwrap() >= 3 << 20, "peak {peak:?}");
    drop(held);
}
