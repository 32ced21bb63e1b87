//! `ConcreteFunction::profile` (and `tracejit-bench --profile`): one entry
//! per scheduled step, named by kind and ops, timed over the runs asked
//! for; the runs are real calls (a variable assigned in the function is
//! assigned once per run); the interpreter has no profile; bad arguments
//! are refused like a call's.

use tracejit::prelude::*;

#[test]
fn every_step_is_timed_and_named() {
    let counter = Variable::new(Tensor::scalar(0.0f32));
    let c2 = counter.clone();
    let f = function(move |(x, w): (Tensor, Tensor)| {
        c2.assign_add(&Tensor::scalar(1.0f32));
        let h = (x.matmul(&w) + 1.0).relu();
        let (_, y) = tracejit::while_loop(
            |(i, _): &(Tensor, Tensor)| i.lt(3i64),
            |(i, y): (Tensor, Tensor)| (&i + 1i64, y.tanh()),
            (Tensor::scalar(0i64), h),
        );
        y
    });
    let (x, w) = (Tensor::randn(&[64, 32], 0), Tensor::randn(&[32, 16], 1));
    f.call((x.clone(), w.clone())).unwrap();
    assert_eq!(counter.read().to_vec::<f32>().unwrap(), [1.0]);
    let cf = f.concrete_functions()[0].clone();
    let p = cf.profile(&[x.clone(), w.clone()], 7).unwrap().expect("the JIT runs it");
    assert_eq!(p.runs, 7);
    // Every run assigned the variable: the runs are real calls.
    assert_eq!(counter.read().to_vec::<f32>().unwrap(), [8.0]);
    let st = cf.schedule_stats().unwrap();
    let count = |kind: &str| p.steps.iter().filter(|s| s.kind == kind).count();
    assert_eq!(count("gemm"), st.gemms, "{p}");
    assert_eq!((count("while"), count("read"), count("assign")), (1, st.reads, st.writes), "{p}");
    assert_eq!(st.writes, 1);
    let gemm = p.steps.iter().find(|s| s.kind == "gemm").unwrap();
    assert_eq!(gemm.what, "matmul -> f32[64, 16]");
    assert!(gemm.total > std::time::Duration::ZERO);
    let region = p.steps.iter().find(|s| s.kind == "region" && s.what.contains("relu")).expect("bias + relu region");
    // It writes over the product, which dies there.
    assert_eq!(region.what, "add,relu -> f32[64, 16] (in place of input 0)");
    // The loop body's steps follow the loop, under its path, timed over
    // every trip (3 per run).
    let w = p.steps.iter().find(|s| s.kind == "while").unwrap();
    let body: Vec<_> = p.steps.iter().filter(|s| s.path.starts_with(&format!("{}.body.", w.path))).collect();
    let tanh = body.iter().find(|s| s.what.contains("tanh")).expect("the body's tanh region");
    assert!(tanh.depth == 1 && tanh.kind == "region" && tanh.total > std::time::Duration::ZERO, "{p}");
    assert!(tanh.total <= w.total);
    assert!(p.steps.iter().any(|s| s.path.starts_with(&format!("{}.cond.", w.path))));
    // Top-level indices follow the schedule; the listing names the slowest
    // first.
    let top: Vec<_> = p.steps.iter().filter(|s| s.depth == 0).collect();
    assert!(top.iter().enumerate().all(|(i, s)| s.index == i && s.path == i.to_string()));
    let sum: std::time::Duration = top.iter().map(|s| s.total).sum();
    assert_eq!(p.per_run(), sum / 7);
    assert!(p.per_run() > std::time::Duration::ZERO);
    let text = p.to_string();
    assert!(text.starts_with(&format!("profile of {} over 7 runs:", cf.name())), "{text}");
    let first_line = text.lines().nth(1).unwrap();
    let slowest = p.steps.iter().max_by_key(|s| s.total).unwrap();
    assert!(first_line.contains(&format!("#{} ", slowest.path)), "{text}");
}

#[test]
fn the_interpreter_has_no_profile_and_bad_arguments_are_refused() {
    let g = function(|x: Tensor| x.exp()).jit(false);
    let x = Tensor::randn(&[3], 2);
    g.call(x.clone()).unwrap();
    assert!(g.concrete_functions()[0].profile(std::slice::from_ref(&x), 3).unwrap().is_none());

    let f = function(|x: Tensor| x.exp() * 2.0);
    f.call(x.clone()).unwrap();
    let cf = f.concrete_functions()[0].clone();
    let err = cf.profile(&[], 3).unwrap_err().to_string();
    assert!(err.contains("expected 1") || err.contains("1 argument"), "{err}");
    let err = cf.profile(&[Tensor::randn(&[4], 0)], 3).unwrap_err().to_string();
    assert!(err.contains("[3]") && err.contains("[4]"), "{err}");
    // Zero runs: every step listed, nothing timed.
    let p = cf.profile(&[x], 0).unwrap().unwrap();
    assert!(!p.steps.is_empty() && p.steps.iter().all(|s| s.total.is_zero()));
    assert_eq!(p.per_run(), std::time::Duration::ZERO);
}
