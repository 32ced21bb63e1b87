//! How long a long function takes to its first result: trace, optimize
//! (per pass), compile and run a chain of `n` elementwise ops (default
//! 4,000), to check that the pipeline stays O(n log n).
//!
//! ```sh
//! cargo run --release --example long_chain -- 4000
//! ```

use std::time::Instant;

use tracejit::prelude::*;

fn main() -> tracejit::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(4000);
    let f = function(move |x: Tensor| {
        let mut y = x.clone();
        for i in 0..n {
            y = if i % 2 == 0 { &y * 1.0001 } else { (&y + 0.001).tanh() };
        }
        y
    });
    let x = Tensor::randn(&[64], 0);
    let t = Instant::now();
    f.call(x.clone())?;
    let first = t.elapsed();
    let cf = &f.concrete_functions()[0];
    println!("{n} ops: first call {:.1} ms", first.as_secs_f64() * 1e3);
    println!("{}", cf.stats());
    let t = Instant::now();
    f.call(x)?;
    println!("second call {:.1} µs", t.elapsed().as_secs_f64() * 1e6);
    Ok(())
}
