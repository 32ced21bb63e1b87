//! Limits are errors, not aborts: huge shapes and shapes whose size
//! overflows are an `Err` from `call` (compiled and interpreted alike) and
//! an op-named panic eagerly — never "memory allocation of N bytes failed",
//! never a wrong answer in release builds, never Rust's overflow panic.
//! (Regression tests for failures 1 and 2 of issue #17.)

use tracejit::prelude::*;

/// Runs `f` and returns its panic message; fails if it does not panic.
fn panic_message(f: impl FnOnce()) -> String {
    match tracejit::ir::catch_quietly(f) {
        Ok(()) => panic!("expected a panic"),
        Err(p) => tracejit::ir::panic_message(&*p),
    }
}

/// `call` under the JIT and under the interpreter: both must be an `Err`
/// whose message contains every one of `needles`.
fn both_fail<A: Nest + Clone, R: Nest>(make: impl Fn() -> Function<A, R>, args: A, needles: &[&str]) {
    for jit in [true, false] {
        let f = make().jit(jit);
        let e = match f.call(args.clone()) {
            Ok(_) => panic!("jit={jit}: expected an error"),
            Err(e) => e.to_string(),
        };
        for n in needles {
            assert!(e.contains(n), "jit={jit}: `{n}` missing from: {e}");
        }
    }
}

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, DType::F32)
}

#[test]
fn a_huge_broadcast_is_an_error_not_an_abort() {
    both_fail(
        || function(|x: Tensor| x.broadcast_to(&[1 << 40]) * 2.0).name("huge_broadcast"),
        f32s(&[1]),
        &["cannot allocate", "4398046511104 bytes", "[1099511627776]"],
    );
    let m = panic_message(|| {
        let _ = f32s(&[1]).broadcast_to(&[1 << 40]);
    });
    assert!(m.starts_with("broadcast_to: cannot allocate the result"), "{m}");
}

#[test]
fn a_huge_one_hot_is_an_error() {
    both_fail(
        || function(|i: Tensor| i.one_hot(1 << 40, DType::F32)),
        Tensor::from_vec(vec![0i64, 1, 2], &[3]),
        &["cannot allocate", "[3, 1099511627776]"],
    );
    let m = panic_message(|| {
        let _ = Tensor::from_vec(vec![0i64], &[1]).one_hot(1 << 40, DType::F32);
    });
    assert!(m.starts_with("one_hot: cannot allocate"), "{m}");
}

#[test]
fn a_huge_constructor_inside_a_closure_is_an_error() {
    let f = function(|x: Tensor| x + Tensor::zeros(&[1 << 40], DType::F32)).name("huge_zeros");
    let e = f.call(f32s(&[1])).unwrap_err().to_string();
    assert!(e.contains("zeros: a f32 tensor of shape [1099511627776] needs 4398046511104 bytes"), "{e}");
    assert!(e.contains("huge_zeros") && e.contains("limits.rs"), "names the function and the line: {e}");
    for m in [
        panic_message(|| drop(Tensor::ones(&[1 << 40, 2], DType::F64))),
        panic_message(|| drop(Tensor::randn(&[1 << 62], 0))),
        panic_message(|| drop(Tensor::full(&[usize::MAX, 2], 1.0, DType::I32))),
        panic_message(|| drop(Tensor::arange(0.0, 1e30, 1.0, DType::F32))),
    ] {
        assert!(m.contains("tensor of shape") && (m.contains("needs") || m.contains("overflows")), "{m}");
    }
}

#[test]
fn a_huge_matmul_is_an_error() {
    both_fail(
        || function(|(a, b): (Tensor, Tensor)| a.matmul(&b)),
        (f32s(&[1 << 20, 1]), f32s(&[1, 1 << 20])),
        &["matmul", "cannot allocate", "[1048576, 1048576]"],
    );
}

#[test]
fn a_reduction_over_a_huge_empty_input_is_an_error() {
    both_fail(
        || function(|x: Tensor| x.broadcast_to(&[1 << 40, 0]).sum(&[1], false)),
        f32s(&[0]),
        &["cannot allocate", "[1099511627776]"],
    );
    // The same with a size known only at run time.
    both_fail(
        || {
            function(|x: Tensor| x.broadcast_to(&[1 << 40, 0]).sum(&[1], false))
                .input_signature(vec![TensorSpec::new(DType::F32, &[-1])])
        },
        f32s(&[0]),
        &["cannot allocate"],
    );
}

#[test]
fn shape_arithmetic_that_overflows_is_an_error_naming_the_op() {
    // Release builds used to return Ok([0, 0, 0, 0]) here.
    both_fail(
        || function(|x: Tensor| (x.broadcast_to(&[1 << 32, 1 << 32, 4]) * 2.0).sum(&[0, 1], false)),
        f32s(&[4]),
        &["broadcast_to", "overflows", "[4294967296, 4294967296, 4]"],
    );
    both_fail(
        || function(|x: Tensor| x.reshape(&[1 << 32, 1 << 32])),
        f32s(&[4]),
        &["reshape", "[4294967296, 4294967296]"],
    );
    let m = panic_message(|| drop(f32s(&[4]).reshape(&[1 << 32, 1 << 32])));
    assert!(m.starts_with("reshape:") && !m.contains("attempt to multiply"), "{m}");
    let m = panic_message(|| drop(f32s(&[4]).reshape(&[-1, 1 << 32, 1 << 32])));
    assert!(m.starts_with("reshape:"), "{m}");
}

#[test]
fn overflowing_signatures_are_errors() {
    // A spec whose dims are known but absurd: concatenating it overflows.
    let f = function(|x: Tensor| Tensor::concat(&[&x, &x, &x], 0));
    let e = f.get_concrete_function(TensorSpec::new(DType::Bool, &[1 << 62])).unwrap_err().to_string();
    assert!(e.contains("concat"), "{e}");
    let e = f.get_concrete_function(TensorSpec::new(DType::F32, &[1 << 61, 4])).unwrap_err().to_string();
    assert!(e.contains("concat") && e.contains("overflows"), "{e}");
}

#[test]
fn ordinary_sizes_still_work_after_a_refused_one() {
    let f = function(|(x, n): (Tensor, Static<usize>)| x.broadcast_to(&[*n]) * 2.0);
    assert!(f.call((f32s(&[1]), Static(1 << 40))).is_err());
    for n in [0usize, 1, 3, 5] {
        let out = f.call((f32s(&[1]), Static(n))).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0; n]);
    }
}

#[test]
fn a_huge_result_of_sizes_known_only_at_run_time_is_an_error() {
    // The region's output size comes from the operands at run time.
    both_fail(
        || {
            function(|(a, b): (Tensor, Tensor)| (&a + &b) * 2.0)
                .input_signature(vec![TensorSpec::new(DType::F32, &[-1, 1]), TensorSpec::new(DType::F32, &[1, -1])])
        },
        (f32s(&[1 << 20, 1]), f32s(&[1, 1 << 20])),
        &["cannot allocate", "[1048576, 1048576]"],
    );
}

/// A pad width whose sum overflows: an error naming `pad` and the axis,
/// eagerly (the issue: "attempt to add with overflow" inside the kernel,
/// a wrapped size in a build without overflow checks), compiled and
/// interpreted, with the dim known or known only at run time.
#[test]
fn a_pad_whose_size_overflows_is_an_error_naming_the_op() {
    let huge = usize::MAX - 1;
    let m = panic_message(|| drop(f32s(&[2, 3]).pad(&[(0, 0), (huge, 1)], 0.0)));
    assert!(m.starts_with("pad:") && m.contains("axis 1") && m.contains("overflows"), "{m}");
    assert!(!m.contains("attempt to add"), "{m}");
    both_fail(move || function(move |x: Tensor| x.pad(&[(huge, 3)], 1.0)), f32s(&[2]), &["pad", "overflows"]);
    both_fail(
        move || {
            function(move |x: Tensor| x.pad(&[(0, 0), (huge, 3)], 1.0))
                .input_signature(vec![TensorSpec::new(DType::F32, &[2, -1])])
        },
        f32s(&[2, 4]),
        &["pad", "overflows"],
    );
    // A huge but representable width is refused by the allocation check.
    let m = panic_message(|| drop(f32s(&[2]).pad(&[(1 << 40, 0)], 0.0)));
    assert!(m.starts_with("pad: cannot allocate"), "{m}");
}
