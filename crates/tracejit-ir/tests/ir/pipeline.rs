//! Tests of the pass manager (fixpoint caps, verifier failures naming the
//! pass, disabling passes, dumps) and of `Op::Kernel` nodes through
//! inference, the interpreter, the printer and the verifier.

use std::sync::Arc;

use tracejit_ir::passes::{Dce, OptimizationOptions, Pass, PassContext, PassResult, Pipeline, Stage};
use tracejit_ir::tensor::{DType, Storage};
use tracejit_ir::{eval_primitive, interpret, verify, Graph, IrError, Op, TensorType};

use crate::common::{f32t, node};

use crate::passes::*;

// ---- the pass manager -------------------------------------------------------

/// Claims a change every time without changing anything.
struct Restless;
impl Pass for Restless {
    fn name(&self) -> &'static str {
        "restless"
    }
    fn run(&self, _g: &mut Graph, _cx: &PassContext) -> PassResult {
        PassResult::changed("nothing, really")
    }
}

/// Breaks the graph: an output type that inference disagrees with.
struct Vandal;
impl Pass for Vandal {
    fn name(&self) -> &'static str {
        "vandal"
    }
    fn run(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let last = g.nodes().map(|(id, _)| id).last().unwrap();
        g.node_mut(last).outputs[0] = TensorType::known(DType::I64, &[7]);
        PassResult::changed("broke it")
    }
}

struct Panicky;
impl Pass for Panicky {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn run(&self, _g: &mut Graph, _cx: &PassContext) -> PassResult {
        panic!("oops")
    }
}

#[test]
fn fixpoints_stop_at_the_cap_and_say_so() {
    let p = Pipeline::new(vec![Stage::Fixpoint { name: "loop", passes: vec![Box::new(Restless)], max_iterations: 3 }]);
    let (_, report) = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap();
    assert_eq!(report.passes.len(), 3);
    assert_eq!(report.fixpoints[0].rounds, 3);
    assert!(!report.fixpoints[0].converged);
    assert!(report.to_string().contains("stopped at the iteration cap after 3 round(s)"), "{report}");
    let (_, report) = Pipeline::default_pipeline().run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap();
    assert!(report.fixpoints[0].converged);
}

#[test]
fn a_verifier_failure_names_the_pass() {
    let p = Pipeline::new(vec![Stage::pass(Dce), Stage::pass(Vandal)])
        .with_options(OptimizationOptions { verify: Some(true), ..OptimizationOptions::default() });
    let e = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap_err();
    assert!(matches!(&e, IrError::Verifier { message, .. } if message.starts_with("after pass `vandal`")), "{e}");
    let p = Pipeline::new(vec![Stage::pass(Panicky)]);
    let e = p.run(&gelu_graph(&[4]), &PassContext::new("g")).unwrap_err();
    assert!(e.to_string().contains("pass `panicky` panicked: oops"), "{e}");
}

#[test]
fn passes_can_be_disabled_and_the_pipeline_switched_off() {
    let opts = OptimizationOptions::default().disable("fusion").disable("cse");
    let (after, report) =
        Pipeline::default_pipeline().with_options(opts).run(&softmax_graph(), &PassContext::new("s")).unwrap();
    assert!(fused_bodies(&after).is_empty());
    assert_eq!(report.pass("cse").count(), 0);
    assert_eq!(report.pass("dce").count(), 1);
    let (after, report) = Pipeline::default_pipeline()
        .with_options(OptimizationOptions::none())
        .run(&softmax_graph(), &PassContext::new("s"))
        .unwrap();
    assert_eq!(after.to_string(), softmax_graph().to_string());
    assert!(report.passes.is_empty() && !report.enabled);
    assert!(report.to_string().contains("optimizations off"));
    // Without the selector, composites are inlined by `inline` itself.
    let opts = OptimizationOptions { selector: false, ..OptimizationOptions::default() };
    let cx = PassContext::new("main").with_kernels(registry());
    let (after, _) = Pipeline::default_pipeline().with_options(opts).run(&call_graph(), &cx).unwrap();
    assert_eq!(count_ops(&after, "kernel") + count_ops(&after, "call"), 0, "{after}");
}

#[test]
fn dumps_are_written_in_pipeline_order() {
    let dir = std::env::temp_dir().join(format!("tracejit-dump-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = OptimizationOptions { dump_dir: Some(dir.clone()), ..OptimizationOptions::default() };
    let cx = PassContext { dump_prefix: Some("my fn.1".into()), ..PassContext::new("my fn") };
    let (_, report) = Pipeline::default_pipeline().with_options(opts).run(&gelu_graph(&[4]), &cx).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), report.passes.len() * 4, "{names:?}");
    assert_eq!(names[0], "my_fn.1.001.inline.before.dot");
    assert_eq!(names[1], "my_fn.1.001.inline.before.txt");
    assert_eq!(names[2], "my_fn.1.002.inline.after.dot");
    let txt: Vec<&String> = names.iter().filter(|n| n.ends_with(".txt")).collect();
    let order: Vec<&str> = txt.iter().map(|n| n.split('.').nth(3).unwrap()).collect();
    let expected: Vec<&str> = report.passes.iter().flat_map(|r| [r.pass, r.pass]).collect();
    assert_eq!(order, expected);
    let last = std::fs::read_to_string(dir.join(txt.last().unwrap())).unwrap();
    assert!(last.contains("fused"), "{last}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- Op::Kernel ------------------------------------------------------------

#[test]
fn kernel_nodes_infer_interpret_print_and_verify() {
    let mut g = Graph::new("k");
    let x = g.add_param(f32t(&[-1]));
    let op = Op::Kernel {
        name: "tracejit.test.double".into(),
        kernel: Arc::new(PlusHundred),
        inputs: vec![f32t(&[-1])],
        outputs: vec![f32t(&[-1])],
    };
    let k = node(&mut g, op.clone(), &[x]);
    g.outputs = vec![k];
    verify(&g).unwrap();
    assert!(g.to_string().contains(r#"%1 = kernel["tracejit.test.double"] %0 : f32[?]"#), "{g}");
    assert!(g.to_dot().contains("kernel"));
    let out = interpret(&g, &[Storage::from_vec(vec![1.0f32, 2.0], &[2]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![102.0, 104.0]);
    // eval_primitive runs it too, and checks what it returns.
    let x = Storage::from_vec(vec![1.0f32], &[1]).unwrap();
    assert_eq!(eval_primitive(&op, &[&x])[0].to_vec::<f32>().unwrap(), vec![102.0]);
    let liar = Op::Kernel {
        name: "tracejit.test.liar".into(),
        kernel: Arc::new(PlusHundred),
        inputs: vec![f32t(&[-1])],
        outputs: vec![TensorType::known(DType::F64, &[1])],
    };
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| eval_primitive(&liar, &[&x]))).unwrap_err();
    let msg = e.downcast_ref::<String>().unwrap();
    assert!(msg.contains("kernel `tracejit.test.liar`") && msg.contains("f64[1]"), "{msg}");
    // Arguments must fit the declared input types.
    let mut bad = Graph::new("bad");
    let y = bad.add_param(f32t(&[2, 2]));
    let err = bad.add_node(op, &[y], &[], None).unwrap_err();
    assert!(err.to_string().contains("kernel `tracejit.test.double`"), "{err}");
}
