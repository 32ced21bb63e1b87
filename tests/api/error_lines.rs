//! What a user reads when something fails: functions named by their
//! definition site, errors worded as errors, and the user's line in
//! control-flow mismatches, a late `Variable::new` and kernels that fail on
//! their values at run time (compiled and interpreted).

use tracejit::prelude::*;

fn here(line: u32) -> String {
    format!("{}:{line}", file!())
}

#[test]
fn unnamed_closures_are_named_by_their_definition_site() {
    let (a, line_a) = (function(|x: Tensor| x.exp()), line!());
    let (b, line_b) = (function(|x: Tensor| x.tanh()), line!());
    let name = a.function_name().to_string();
    assert_eq!(name, format!("unnamed_closures_are_named_by_their_definition_site@{}", here(line_a)));
    assert_eq!(b.function_name(), format!("unnamed_closures_are_named_by_their_definition_site@{}", here(line_b)));
    // A function item keeps its own name; `.name()` replaces either.
    fn square(x: Tensor) -> Tensor {
        &x * &x
    }
    assert_eq!(function(square).function_name(), "square");
    assert_eq!(function(|x: Tensor| x).name("ident").function_name(), "ident");
    // The name is what listings and errors print.
    a.call(Tensor::ones(&[2], DType::F32)).unwrap();
    assert!(a.concrete_functions()[0].graph().to_string().contains(&here(line_a)));
}

#[test]
fn a_failed_trace_is_an_error_naming_the_function_and_where_it_is_defined() {
    let (f, line) = (function(|x: Tensor| -> Tensor { panic!("user bug with rank {}", x.rank()) }), line!());
    let e = f.call(Tensor::ones(&[2], DType::F32)).unwrap_err().to_string();
    assert!(e.starts_with("error while tracing function `"), "{e}");
    assert!(e.contains(&here(line)) && e.contains("user bug with rank 1"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // A named function says where it is defined after the message.
    let (g, line) = (function(|x: Tensor| -> Tensor { panic!("bad {}", x.rank()) }).name("g"), line!());
    let e = g.call(Tensor::ones(&[2], DType::F32)).unwrap_err();
    assert!(matches!(&e, Error::TracePanic { function, .. } if function == "g"), "{e}");
    let text = e.to_string();
    assert!(text.starts_with("error while tracing function `g`: bad 1"), "{text}");
    assert!(text.contains(&format!("(`g` is defined at {})", here(line))), "{text}");
}

#[test]
fn cond_branch_mismatches_name_the_cond_line_and_the_output() {
    let line = line!() + 1;
    let f = function(|x: Tensor| cond(&x.sum_all().gt(0.0), || (x.clone(), x.sum_all()), || (x.clone(), x.clone())));
    let e = f.call(Tensor::ones(&[3], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("output 1 (`output.1`)") && e.contains("f32[]") && e.contains("f32[3]"), "{e}");
    assert!(e.contains(&format!("the cond at {})", here(line))), "{e}");
}

#[test]
fn a_carried_value_changing_shape_names_the_loop_line_and_the_value() {
    let line = line!() + 1;
    let f = function(|x: Tensor| while_loop(|h: &Tensor| h.sum_all().lt(3.0), |h: Tensor| h.sum(&[0], true), x));
    let e = f.call(Tensor::ones(&[3, 2], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("carried value 0 (`state`)") && e.contains("f32[3, 2]"), "{e}");
    assert!(e.contains(&format!("the loop at {})", here(line))), "{e}");
}

#[test]
fn a_variable_created_on_a_later_trace_names_its_line() {
    let f = function(|x: Tensor| {
        let v = Variable::new(Tensor::zeros(&[1], DType::F32));
        x + v.read()
    });
    let line = line!() - 3;
    f.call(Tensor::ones(&[1], DType::F32)).unwrap();
    let e = f.call(Tensor::ones(&[2], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("creates a variable on a later trace"), "{e}");
    assert!(e.contains(&format!("Variable::new at {}:", here(line))), "{e}");
}

#[test]
fn a_kernel_failing_at_run_time_names_the_users_line() {
    for jit in [true, false] {
        let (f, line) = (function(|(x, i): (Tensor, Tensor)| x.gather(&i, 0) * 2.0).jit(jit), line!());
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
        f.call((x.clone(), Tensor::from_vec(vec![0i64, 2], &[2]))).unwrap();
        let e = f.call((x, Tensor::from_vec(vec![0i64, 5], &[2]))).unwrap_err().to_string();
        assert!(e.contains("error while running") && e.contains("gather: index 5 is out of range"), "jit {jit}: {e}");
        assert!(e.contains(&here(line)), "jit {jit}: {e}");
    }
}
