//! Variables eagerly and inside compiled functions: the same sequences give
//! the same values, program order is kept, creation follows the first-trace
//! rule, `remember` creates state once, and concurrent updates are atomic.

use tracejit::prelude::*;
use tracejit::{remember, remember_in, Scope, Variable};

fn scalar(v: f32) -> Tensor {
    Tensor::scalar(v)
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn eager_reads_and_writes_act_at_once() {
    let v = Variable::new(Tensor::from_vec(vec![1.0f32, 2.0], &[2])).with_name("v");
    assert_eq!(v.name(), "v");
    assert_eq!(v.shape(), &[2]);
    assert_eq!(v.dtype(), DType::F32);
    v.assign_add(&Tensor::from_vec(vec![1.0f32, 1.0], &[2]));
    assert_eq!(vals(&v.read()), vec![2.0, 3.0]);
    v.assign_sub(&Tensor::from_vec(vec![0.5f32, 0.5], &[2]));
    assert_eq!(vals(&v.value()), vec![1.5, 2.5]);
    v.assign(&Tensor::zeros(&[2], DType::F32));
    assert_eq!(vals(&v.read()), vec![0.0, 0.0]);
    let snapshot = v.read();
    v.assign_add(&Tensor::ones(&[2], DType::F32));
    assert_eq!(vals(&snapshot), vec![0.0, 0.0], "a read is a snapshot");
}

#[test]
#[should_panic(expected = "variables keep the dtype and shape")]
fn assigning_another_shape_panics_with_the_types() {
    let v = Variable::new(Tensor::zeros(&[2], DType::F32));
    v.assign(&Tensor::zeros(&[3], DType::F32));
}

#[test]
fn assigning_another_dtype_inside_a_function_is_an_error() {
    let v = Variable::new(Tensor::zeros(&[2], DType::F32)).with_name("w");
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        v2.assign(&x);
        x
    });
    let e = f.call(Tensor::zeros(&[2], DType::F64)).unwrap_err().to_string();
    assert!(e.contains("`w`") && e.contains("f64"), "{e}");
    assert_eq!(vals(&v.value()), vec![0.0, 0.0], "nothing changed");
}

/// The same program of reads and writes, run eagerly and compiled.
fn program(v: &Variable, x: &Tensor) -> Tensor {
    let a = v.read();
    v.assign_add(x);
    let b = v.read();
    v.assign(&(&b * 2.0));
    v.assign_sub(&a);
    let c = v.read();
    &a + &b * 10.0 + &c * 100.0
}

#[test]
fn the_same_program_eagerly_and_compiled_gives_the_same_values() {
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3]);
    let init = Tensor::from_vec(vec![3.0f32, 4.0, 5.0], &[3]);
    let eager_v = Variable::new(init.clone());
    let traced_v = Variable::new(init.clone());
    let tv = traced_v.clone();
    let f = function(move |x: Tensor| program(&tv, &x));
    for _ in 0..3 {
        let e = program(&eager_v, &x);
        let t = f.call(x.clone()).unwrap();
        assert_eq!(vals(&e), vals(&t));
        assert_eq!(vals(&eager_v.value()), vals(&traced_v.value()));
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn compiled_functions_see_later_outside_assignments() {
    let v = Variable::new(scalar(1.0));
    let v2 = v.clone();
    let f = function(move |x: Tensor| &x * v2.read());
    assert_eq!(vals(&f.call(scalar(3.0)).unwrap()), vec![3.0]);
    v.assign(&scalar(5.0));
    assert_eq!(vals(&f.call(scalar(3.0)).unwrap()), vec![15.0]);
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn the_adder_of_the_tf_java_proposal() {
    // A variable created inside the function, once, and accumulated into.
    let adder = function(|x: Tensor| {
        let acc = remember(|| Variable::new(Tensor::zeros(&[], DType::F32)).with_name("acc"));
        acc.assign_add(&x);
        acc.read()
    });
    assert_eq!(vals(&adder.call(scalar(1.0)).unwrap()), vec![1.0]);
    assert_eq!(vals(&adder.call(scalar(2.0)).unwrap()), vec![3.0]);
    assert_eq!(vals(&adder.call(scalar(4.0)).unwrap()), vec![7.0]);
    assert_eq!(adder.tracing_count(), 1);
}

#[test]
fn remember_creates_one_variable_across_retraces() {
    let created = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c2 = created.clone();
    let f = function(move |x: Tensor| {
        let w = remember(|| {
            c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Variable::new(Tensor::scalar(2.0f32))
        });
        w.assign_add(&Tensor::scalar(1.0f32));
        &x * w.read()
    });
    f.call(Tensor::ones(&[2], DType::F32)).unwrap();
    f.call(Tensor::ones(&[3], DType::F32)).unwrap();
    let out = f.call(Tensor::ones(&[4], DType::F32)).unwrap();
    assert_eq!(f.tracing_count(), 3);
    assert_eq!(created.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(vals(&out), vec![5.0; 4], "one variable, incremented by each of three calls");
}

#[test]
fn creating_a_variable_on_a_later_trace_is_an_error() {
    let f = function(|x: Tensor| {
        let v = Variable::new(Tensor::zeros(&[], DType::F32));
        &x + v.read()
    })
    .name("makes_vars");
    f.call(Tensor::ones(&[2], DType::F32)).unwrap();
    let e = f.call(Tensor::ones(&[3], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("makes_vars") && e.contains("remember") && e.contains("first trace"), "{e}");
    // The cache is still usable.
    f.call(Tensor::ones(&[2], DType::F32)).unwrap();
}

#[test]
fn an_initial_value_depending_on_inputs_is_an_error() {
    let f = function(|x: Tensor| {
        let v = Variable::new(&x * 2.0);
        v.read()
    })
    .name("init_from_input");
    let e = f.call(Tensor::ones(&[2], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("init_from_input") && e.contains("initial value"), "{e}");
}

#[test]
fn remember_outside_functions_is_per_call_site_and_scope() {
    let make = |scope: &Scope| remember_in(scope, || Variable::new(Tensor::scalar(0.0f32)));
    let s1 = Scope::new();
    let s2 = Scope::new();
    assert_eq!(make(&s1), make(&s1));
    assert_ne!(make(&s1), make(&s2));
    let site = || remember(|| Variable::new(Tensor::scalar(0.0f32)));
    assert_eq!(site(), site());
}

#[test]
fn eight_threads_of_assign_add_lose_no_update() {
    let v = Variable::new(Tensor::scalar(0.0f32));
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        v2.assign_add(&x);
    });
    let one = Tensor::scalar(1.0f32);
    std::thread::scope(|s| {
        for _ in 0..8 {
            let f = f.clone();
            let one = one.clone();
            s.spawn(move || {
                for _ in 0..1000 {
                    f.call(one.clone()).unwrap();
                }
            });
        }
    });
    assert_eq!(vals(&v.value()), vec![8000.0]);
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn reads_and_writes_keep_program_order_in_the_graph() {
    let v = Variable::new(scalar(1.0));
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        v2.assign_add(&x);
        let r = v2.read();
        v2.assign(&scalar(0.0));
        r
    });
    assert_eq!(vals(&f.call(scalar(2.0)).unwrap()), vec![3.0]);
    assert_eq!(vals(&v.value()), vec![0.0]);
    let g = f.concrete_functions()[0].graph().clone();
    let text = g.to_string();
    assert!(text.contains("ctrl("), "stateful nodes carry control inputs:\n{text}");
}

#[test]
fn a_nested_call_without_tensor_arguments_runs_on_every_call() {
    let v = Variable::new(scalar(0.0));
    let v2 = v.clone();
    let inner = function(move |(): ()| {
        v2.assign_add(&scalar(1.0));
        v2.read()
    });
    let outer = function(move |x: Tensor| &x + inner.call(()).unwrap());
    for k in 1..=3 {
        let out = outer.call(scalar(10.0)).unwrap();
        assert_eq!(vals(&out), vec![10.0 + k as f32], "call {k}");
    }
    assert_eq!(vals(&v.value()), vec![3.0]);
    assert_eq!(outer.tracing_count(), 1);
}

#[test]
fn a_call_with_side_effects_is_ordered_with_the_callers_accesses() {
    let v = Variable::new(scalar(1.0));
    let (v2, v3) = (v.clone(), v.clone());
    let bump = function(move |(): ()| v2.assign_add(&scalar(5.0)));
    let f = function(move |x: Tensor| {
        v3.assign(&x);
        bump.call(()).unwrap();
        v3.read()
    });
    assert_eq!(vals(&f.call(scalar(2.0)).unwrap()), vec![7.0]);
    assert_eq!(vals(&v.value()), vec![7.0]);
    let g = f.concrete_functions()[0].graph().clone();
    let (call_id, call) = g.nodes().find(|(_, n)| matches!(n.op, tracejit::ir::Op::Call { .. })).expect("a call node");
    assert!(!call.control_inputs.is_empty(), "the call waits for the assign:\n{g}");
    let read = g.nodes().find(|(_, n)| matches!(n.op, tracejit::ir::Op::ReadVariable { .. })).unwrap().1;
    assert!(read.control_inputs.contains(&call_id), "the read waits for the call:\n{g}");
}

#[test]
fn remember_in_a_generic_function_keeps_one_value_per_type() {
    fn make<T: Clone + Send + Sync + 'static>(v: T) -> T {
        remember(move || v)
    }
    assert_eq!(make(1i32), 1);
    assert_eq!(make("a"), "a");
    assert_eq!(make(2i32), 1, "memoized per (call site, type)");
}
