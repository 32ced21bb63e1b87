//! `config::set_mixed_precision` is process-wide, so it has a binary of its
//! own: one test, switching it on and off around functions traced under
//! each setting, and a function's own setting winning over it.

use tracejit::prelude::*;

fn bf16_gemms(f: &Function<(Tensor, Tensor), Tensor>) -> usize {
    f.concrete_functions()[0].schedule_stats().expect("compiled").bf16_gemms
}

#[test]
fn the_switch_applies_to_functions_traced_while_it_is_on() {
    let product = |(a, b): (Tensor, Tensor)| a.matmul(&b);
    let args = || (Tensor::randn(&[8, 16], 1), Tensor::randn(&[16, 4], 2));
    assert_eq!(tracejit::config::mixed_precision(), None);

    tracejit::config::set_mixed_precision(Some(DType::BF16));
    assert_eq!(tracejit::config::mixed_precision(), Some(DType::BF16));
    let on = function(product);
    on.call(args()).unwrap();
    assert_eq!(bf16_gemms(&on), 1);
    // A function's own setting wins: F32 turns it off for that one.
    let opted_out = function(product).mixed_precision(DType::F32);
    opted_out.call(args()).unwrap();
    assert_eq!(bf16_gemms(&opted_out), 0);

    tracejit::config::set_mixed_precision(None);
    let off = function(product);
    off.call(args()).unwrap();
    assert_eq!(bf16_gemms(&off), 0);
    // Traces made while it was on keep their bf16 products.
    on.call(args()).unwrap();
    assert_eq!(bf16_gemms(&on), 1);

    let e = std::panic::catch_unwind(|| tracejit::config::set_mixed_precision(Some(DType::F64))).unwrap_err();
    assert!(e.downcast_ref::<String>().unwrap().contains("expected Some(BF16), Some(F16) or None, got f64"));
}
