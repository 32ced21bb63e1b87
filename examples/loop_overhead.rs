//! The cost of one iteration of a compiled loop node: a `fori_loop` whose
//! body is one scalar add, timed at two trip counts; the slope is the
//! per-iteration overhead of the `while` node (condition + body dispatch).
//!
//! `cargo run --release --example loop_overhead`

use std::time::Instant;

use tracejit::prelude::*;

fn main() -> tracejit::Result<()> {
    let time = |trips: i64| -> tracejit::Result<f64> {
        let f = function(move |x: Tensor| fori_loop(0, trips, |_, y: Tensor| &y + 1.0, x));
        let x = Tensor::scalar(0.0f32);
        f.call(x.clone())?;
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            f.call(x.clone())?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let (short, long) = (time(100)?, time(10_100)?);
    let per_iteration_us = (long - short) / 10_000.0 * 1e6;
    println!("fori_loop: {:.0} µs for 100 trips, {:.0} µs for 10,100 trips", short * 1e6, long * 1e6);
    println!("per-iteration overhead of the loop node: {per_iteration_us:.2} µs");
    Ok(())
}
