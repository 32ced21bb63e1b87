//! Timing: warm-up, then per-call statistics over enough calls to fill a time
//! budget, as shared/WORKLOADS.md prescribes.
//!
//! A call that takes less than [`MIN_SAMPLE`] is timed in batches (the same
//! call repeated `batch` times between two clock reads, the sample being the
//! batch's mean), so the clock's own cost (~20-30 ns) does not pollute
//! sub-microsecond figures. For such calls `min` and `max` are the extremes of
//! batch means; for every call slower than [`MIN_SAMPLE`] a sample is one call.

use std::time::{Duration, Instant};

/// The shortest stretch timed between two clock reads.
pub const MIN_SAMPLE: Duration = Duration::from_micros(20);

/// The fewest samples taken, whatever the budget (slow calls overrun it).
pub const MIN_SAMPLES: usize = 5;

/// The most samples kept (bounds memory for very fast calls).
pub const MAX_SAMPLES: usize = 200_000;

/// Per-call statistics of one measured function.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Median time per call, µs.
    pub median_us: f64,
    /// Fastest sample, µs per call.
    pub min_us: f64,
    /// Slowest sample, µs per call.
    pub max_us: f64,
    /// Number of samples.
    pub samples: usize,
    /// Calls per sample (1 unless calls are faster than [`MIN_SAMPLE`]).
    pub batch: usize,
}

impl Timing {
    /// Total calls timed (not counting the warm-up).
    pub fn calls(&self) -> usize {
        self.samples * self.batch
    }
}

/// The timing budget of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Warm-up time (at least two calls are made whatever it says).
    pub warmup: Duration,
    /// Timed time: samples are taken until this is filled (and at least
    /// [`MIN_SAMPLES`] were taken).
    pub measure: Duration,
}

impl Budget {
    /// 0.5 s of timing (WORKLOADS.md's rule), 0.1 s of warm-up.
    pub const FULL: Budget = Budget { warmup: Duration::from_millis(100), measure: Duration::from_millis(500) };
    /// 0.05 s of timing, 0.01 s of warm-up (`--quick`).
    pub const QUICK: Budget = Budget { warmup: Duration::from_millis(10), measure: Duration::from_millis(50) };
}

/// Median of a non-empty slice (sorted in place); the mean of the two middle
/// values for an even length.
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "median of no values");
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    }
}

/// Warms `f` up, then times it. `f` returning `Err` stops the measurement
/// with that error (a call that fails must never produce a figure).
pub fn measure<E>(budget: Budget, mut f: impl FnMut() -> Result<(), E>) -> Result<Timing, E> {
    // Warm-up: at least two calls, and until the warm-up time has passed.
    let start = Instant::now();
    let mut warm_calls = 0usize;
    while warm_calls < 2 || start.elapsed() < budget.warmup {
        f()?;
        warm_calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / warm_calls as f64;
    let batch = if per_call <= 0.0 { 1024 } else { (MIN_SAMPLE.as_secs_f64() / per_call).ceil().max(1.0) as usize };

    let mut samples: Vec<f64> = Vec::with_capacity(1024);
    let begin = Instant::now();
    while samples.len() < MAX_SAMPLES && (samples.len() < MIN_SAMPLES || begin.elapsed() < budget.measure) {
        let t0 = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        let dt = t0.elapsed().as_secs_f64();
        samples.push(dt * 1e6 / batch as f64);
    }
    let min_us = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max_us = samples.iter().copied().fold(0.0, f64::max);
    let n = samples.len();
    Ok(Timing { median_us: median(&mut samples), min_us, max_us, samples: n, batch })
}

/// Times one call of `f`, in µs, with its result.
pub fn time_once<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t0 = Instant::now();
    let out = f();
    (t0.elapsed().as_secs_f64() * 1e6, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lengths() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn measure_takes_enough_samples_and_orders_min_median_max() {
        let budget = Budget { warmup: Duration::from_millis(1), measure: Duration::from_millis(5) };
        let t = measure(budget, || {
            std::hint::black_box((0..100).sum::<u64>());
            Ok::<(), ()>(())
        })
        .unwrap();
        assert!(t.samples >= MIN_SAMPLES);
        assert!(t.batch > 1, "a trivial call is batched: {t:?}");
        assert!(t.min_us <= t.median_us && t.median_us <= t.max_us, "{t:?}");
    }

    #[test]
    fn measure_stops_on_the_first_error() {
        let mut n = 0;
        let r = measure(Budget::QUICK, || {
            n += 1;
            if n == 3 {
                Err("broke")
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err("broke"));
    }
}
