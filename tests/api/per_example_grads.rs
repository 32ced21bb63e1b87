//! `examples/per_example_grads.rs` in short: DP-SGD (per-example
//! gradients by vmap, clipped, noised) and plain SGD on the digits for a
//! few epochs, each step compiled once; both learn, DP-SGD less well.

#[path = "../../examples/per_example_grads.rs"]
#[allow(dead_code, reason = "the example's `main` and option parsing are not used here")]
#[allow(clippy::duplicate_mod, reason = "the example brings its own copy of the digits module")]
mod example;

#[test]
fn dp_sgd_learns_the_digits_with_noise() {
    let o = example::Options { epochs: 4, ..example::Options::default() };
    let s = example::run(&o).unwrap();
    assert_eq!(s.traces, (1, 1), "each step traced once");
    let (dp, sgd) = s.accuracy;
    assert!(dp > 0.5 && sgd > 0.85, "DP-SGD {dp}, SGD {sgd}");
    assert!(dp < sgd, "the noise costs accuracy: DP-SGD {dp}, SGD {sgd}");
}
