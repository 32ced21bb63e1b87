//! Quickstart: trace a closure with `function`, look at the graph before and
//! after optimization, call it, and watch a second input signature trigger a
//! second trace.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```

use tracejit::prelude::*;

#[path = "common/logging.rs"]
mod logging;

fn main() -> tracejit::Result<()> {
    logging::init();
    // Ordinary eager tensor code in a closure. `x.exp()` appears twice on
    // purpose: common-subexpression elimination can merge them.
    let f = function(|(x, b): (Tensor, Tensor)| {
        let y = (&x * 2.0 + &b).relu();
        let z = x.exp() + x.exp();
        (y * z).sum(&[-1], false)
    })
    .name("quickstart");

    let x = Tensor::randn(&[4, 8], 0);
    let b = Tensor::randn(&[8], 1);

    // The first call traces the closure into a graph, optimizes it and runs it.
    let out = f.call((x.clone(), b.clone()))?;
    let cf = f.concrete_functions()[0].clone();
    println!("== graph as traced\n{}", cf.graph());
    println!("== graph after optimization (what runs; executor: {})\n{}", cf.executor_kind(), cf.optimized_graph());
    println!("result: {:?}", out.to_vec::<f32>()?);

    // The same closure still runs eagerly; the results agree.
    let eager = ((&x * 2.0 + &b).relu() * (x.exp() + x.exp())).sum(&[-1], false);
    println!("eager:  {:?}", eager.to_vec::<f32>()?);

    // Same signature: served from the cache, no new trace.
    f.call((x.clone(), b.clone()))?;
    println!("tracing count after a second call with the same shapes: {}", f.tracing_count());

    // A new shape is a new signature: one more trace, with its reason.
    f.call((Tensor::randn(&[16, 8], 2), b.clone()))?;
    println!(
        "tracing count after a call with x of [16, 8]: {} (reason: {})",
        f.tracing_count(),
        f.concrete_functions()[1].trace_reason()
    );
    Ok(())
}
