//! The optimization pipeline through the public surface: every traced
//! function's graph is optimized, `stats()` reports what each pass did, the
//! options switch passes off, `TRACEJIT_DUMP` writes the graphs, stateful
//! code survives, and optimized functions compute what unoptimized ones do
//! (bitwise, NaN/Inf/-0.0 included; any NaN stands for NaN).
//!
//! Bitwise comparisons run the graphs with the interpreter (`jit(false)`):
//! they test the passes; the JIT's own approximations (a few ULP for
//! `exp`/`tanh`) are tested in `tracejit-jit`.

use proptest::prelude::*;
use tracejit::ir::Op;
use tracejit::prelude::*;
use tracejit::OptimizationOptions;

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape)
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    let (x, y) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.shape() == b.shape() && x.iter().zip(&y).all(|(p, q)| (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits())
}

fn count(g: &tracejit::ir::Graph, f: impl Fn(&Op) -> bool + Copy) -> usize {
    g.nodes()
        .map(|(_, n)| match &n.op {
            Op::Fused { body } => usize::from(f(&n.op)) + count(body, f),
            op => usize::from(f(op)),
        })
        .sum()
}

#[test]
fn traced_graphs_are_optimized_and_stats_say_how() {
    let f = function(|x: Tensor| {
        let y = (&x * 1.0 + -0.0).exp(); // simplified away: x * 1, + (-0.0)
        let dup = (&x * 1.0 + -0.0).exp(); // CSE
        let k = Tensor::scalar(2.0f32) + Tensor::scalar(3.0f32); // folded eagerly already
        let _dead = x.tanh(); // DCE
        (y + dup) * k
    })
    .name("demo")
    .jit(false);
    let x = t(&[0.5, -1.0, 2.0], &[3]);
    let out = f.call(x.clone()).unwrap();
    let expect = (x.exp() + x.exp()) * 5.0;
    assert!(same(&out, &expect));
    let cf = &f.concrete_functions()[0];
    let opt = cf.optimized_graph();
    assert!(opt.len() < cf.graph().len(), "{opt}");
    assert_eq!(count(opt, |op| matches!(op, Op::Unary(tracejit::tensor::UnaryOp::Exp))), 1, "{opt}");
    assert_eq!(count(opt, |op| matches!(op, Op::Unary(tracejit::tensor::UnaryOp::Tanh))), 0, "{opt}");
    let stats = cf.stats();
    assert!(stats.enabled);
    assert_eq!(stats.function, "demo");
    assert_eq!(stats.nodes_before, cf.graph().len());
    assert_eq!(stats.nodes_after, opt.len());
    assert!(stats.changed_by("simplify") && stats.changed_by("cse") && stats.changed_by("dce"));
    assert!(stats.changed_by("fusion"));
    let text = stats.to_string();
    assert!(text.starts_with("`demo`:") && text.contains("fusion") && text.contains(" -> "), "{text}");
    for r in &stats.passes {
        assert!(r.nodes_before > 0 && r.nodes_after > 0);
    }
}

#[test]
fn options_switch_passes_and_the_pipeline_off() {
    let body = |x: Tensor| (&x * 2.0).exp().sum(&[-1], true);
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);

    let plain = function(body).optimize(false).jit(false);
    let out = plain.call(x.clone()).unwrap();
    let cf = &plain.concrete_functions()[0];
    assert_eq!(cf.optimized_graph().to_string(), cf.graph().to_string());
    assert!(!cf.stats().enabled && cf.stats().passes.is_empty());

    let no_fusion = function(body).disable_pass("fusion").jit(false);
    assert!(same(&no_fusion.call(x.clone()).unwrap(), &out));
    let cf = &no_fusion.concrete_functions()[0];
    assert_eq!(count(cf.optimized_graph(), |op| matches!(op, Op::Fused { .. })), 0);
    assert_eq!(cf.stats().pass("fusion").count(), 0);

    let fused = function(body).jit(false);
    assert!(same(&fused.call(x.clone()).unwrap(), &out));
    assert!(count(fused.concrete_functions()[0].optimized_graph(), |op| matches!(op, Op::Fused { .. })) >= 1);

    let opts = OptimizationOptions::default().disable("cse").disable("const_fold");
    let custom = function(body).with_optimizations(opts).jit(false);
    assert!(same(&custom.call(x.clone()).unwrap(), &out));
    let stats = custom.concrete_functions()[0].stats().clone();
    assert!(stats.pass("cse").next().is_none() && stats.pass("const_fold").next().is_none());
    assert!(stats.pass("dce").next().is_some());

    let typo = function(body).name("typo").disable_pass("csee");
    let e = typo.call(x).unwrap_err().to_string();
    assert!(e.contains("typo") && e.contains("unknown pass `csee`") && e.contains("fusion"), "{e}");
}

#[test]
fn nested_functions_are_inlined_and_fused_across() {
    let inner = function(|x: Tensor| x.tanh() * 2.0).name("inner");
    let i2 = inner.clone();
    let outer = function(move |x: Tensor| i2.call(&x + 1.0).unwrap().exp()).name("outer").jit(false);
    let x = t(&[0.1, 0.2, -3.0], &[3]);
    let out = outer.call(x.clone()).unwrap();
    // The interpreter runs libm's tanh and exp; eager f32 takes the
    // compiled recipes (tanh within 4 ULP, exp within 1): exp(2·tanh)
    // carries tanh's error times 2 as a relative error, plus exp's own.
    let eager = ((&x + 1.0).tanh() * 2.0).exp();
    let (got, want) = (out.to_vec::<f32>().unwrap(), eager.to_vec::<f32>().unwrap());
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 12.0 * f32::EPSILON * w.abs()), "{got:?} vs {want:?}");
    let cf = &outer.concrete_functions()[0];
    assert_eq!(count(cf.graph(), |op| matches!(op, Op::Call { .. })), 1);
    let opt = cf.optimized_graph();
    assert_eq!(count(opt, |op| matches!(op, Op::Call { .. })), 0, "{opt}");
    assert!(opt.library.is_empty());
    assert_eq!(count(opt, |op| matches!(op, Op::Fused { .. })), 1, "add, tanh, mul, exp: one region\n{opt}");
}

#[test]
fn the_listing_shows_the_regions_the_jit_runs() {
    // One planner: with the JIT on, the fusion pass forms the regions the
    // JIT compiles (a whole softmax, with both reductions, in one region),
    // and the executor runs exactly those.
    let softmax = function(|x: Tensor| tracejit::nn::softmax(&x, -1)).selector(false);
    let x = Tensor::randn(&[4, 33], 3);
    let out = softmax.call(x.clone()).unwrap();
    let eager = tracejit::nn::softmax(&x, -1);
    let (a, b) = (out.to_vec::<f32>().unwrap(), eager.to_vec::<f32>().unwrap());
    assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-6), "{a:?}\n{b:?}");
    let opt = softmax.concrete_functions()[0].optimized_graph().clone();
    assert_eq!(count(&opt, |op| matches!(op, Op::Fused { .. })), 1, "{opt}");
    let text = opt.to_string();
    for piece in ["reduce_max", "exp", "reduce_sum", "div"] {
        assert!(text.contains(piece), "{piece} is in the region:\n{text}");
    }
    // Under the interpreter the default rule splits at the reductions.
    let interp = function(|x: Tensor| tracejit::nn::softmax(&x, -1)).selector(false).jit(false);
    interp.call(x).unwrap();
    let opt = interp.concrete_functions()[0].optimized_graph().clone();
    assert_eq!(count(&opt, |op| matches!(op, Op::Fused { .. })), 3, "max | sub, exp, sum | div\n{opt}");
}

#[test]
fn stateful_code_survives_optimization() {
    let v = Variable::new(Tensor::zeros(&[2], DType::F32)).with_name("acc");
    let v2 = v.clone();
    let f = function(move |x: Tensor| {
        v2.assign_add(&(&x * 1.0));
        let first = v2.read();
        v2.assign_add(&x);
        let second = v2.read();
        let _unused = v2.read();
        first + second * 0.0 + 1.0
    });
    let x = t(&[1.0, 2.0], &[2]);
    let out = f.call(x.clone()).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    assert_eq!(v.value().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    f.call(x).unwrap();
    assert_eq!(v.value().to_vec::<f32>().unwrap(), vec![4.0, 8.0]);
    let opt = f.concrete_functions()[0].optimized_graph().clone();
    assert_eq!(count(&opt, |op| matches!(op, Op::AssignVariable { .. })), 2, "{opt}");
    assert_eq!(count(&opt, |op| matches!(op, Op::ReadVariable { .. })), 3, "reads are neither merged nor dropped");
}

#[test]
fn tracejit_dump_writes_every_pass_in_order() {
    // The variable is process-wide: run in a child process.
    if let Ok(dir) = std::env::var("TRACEJIT_DUMP") {
        if std::env::var("TRACEJIT_DUMP_CHILD").is_ok() {
            let f = function(|x: Tensor| (x.exp() + 1.0).relu()).name("dumped");
            f.call(t(&[1.0, 2.0], &[2])).unwrap();
            f.call(t(&[1.0, 2.0, 3.0], &[3])).unwrap();
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(names.first().map(String::as_str), Some("dumped.1.001.inline.before.dot"), "{names:?}");
            assert!(names.iter().any(|n| n.starts_with("dumped.2.")), "the second trace dumps too: {names:?}");
            let first: Vec<&String> = names
                .iter()
                .filter(|n| n.starts_with("dumped.1.") && !n.starts_with("dumped.1.jit.") && n.ends_with(".txt"))
                .collect();
            let passes: Vec<&str> = first.iter().map(|n| n.split('.').nth(3).unwrap()).collect();
            assert_eq!(passes.first(), Some(&"inline"));
            assert_eq!(passes.last(), Some(&"fusion"));
            let last = std::fs::read_to_string(std::path::Path::new(&dir).join(first.last().unwrap())).unwrap();
            assert!(last.contains("fused"), "{last}");
            // Then the JIT's passes, each a schedule listing, in the order
            // `tracejit_jit::codegen::pass_names` gives (after the IR's
            // `plan_regions`, which the pipeline's `fusion` stood for).
            let jit: Vec<&String> = names.iter().filter(|n| n.starts_with("dumped.1.jit.")).collect();
            let jit_passes: Vec<&str> =
                jit.iter().map(|n| n.trim_end_matches(".txt").rsplit('.').next().unwrap()).collect();
            assert_eq!(jit_passes, tracejit_jit::codegen::pass_names()[1..], "{names:?}");
            let schedule = std::fs::read_to_string(std::path::Path::new(&dir).join(jit.last().unwrap())).unwrap();
            assert!(schedule.starts_with("schedule dumped") && schedule.contains("region"), "{schedule}");
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("tracejit-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args(["passes::tracejit_dump_writes_every_pass_in_order", "--exact", "--nocapture"])
        .env("TRACEJIT_DUMP", &dir)
        .env("TRACEJIT_DUMP_CHILD", "1")
        .status()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success());
}

/// Programs that exercise every rewrite, each a `Static` choice.
fn program(x: &Tensor, y: &Tensor, which: u8) -> Tensor {
    match which {
        0 => (x + -0.0) * 1.0 / 4.0 - 0.0,
        1 => x + 0.0,
        2 => (-(-x)) + (-y),
        3 => x - (-y),
        4 => (x / 3.0 + y / 0.5).transpose(&[1, 0]).transpose(&[1, 0]),
        5 => (x * y).reshape(&[-1]).reshape(&[3, 2]).exp(),
        6 => x.maximum(Tensor::scalar(0.5f32).broadcast_to(&[2, 3])).minimum(y),
        7 => (x * 0.0 + y * 1.0).sum(&[1], true) / 2.0,
        8 => {
            let m = x.max(&[-1], true);
            let e = (x - &m).exp();
            &e / e.sum(&[-1], true) + y.sigmoid()
        }
        9 => {
            let mean = x.mean(&[-1], true);
            let d = x - &mean;
            let var = (&d * &d).mean(&[-1], true);
            d * (var + 1e-5).rsqrt() + y.tanh().abs()
        }
        _ => tracejit::nn::gelu(x) + tracejit::nn::softmax(y, -1),
    }
}

fn special() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => -4.0f32..4.0,
        1 => prop::sample::select(vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            1e30,
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn optimized_functions_compute_what_unoptimized_ones_do(
        xs in prop::collection::vec(special(), 6),
        ys in prop::collection::vec(special(), 6),
        which in 0u8..11,
    ) {
        let body = |(x, y, w): (Tensor, Tensor, Static<u8>)| program(&x, &y, *w);
        let plain = function(body).optimize(false).jit(false);
        // The composite kernels are approximations: compare bodies only.
        let optimized = function(body).selector(false).jit(false);
        let (x, y) = (t(&xs, &[2, 3]), t(&ys, &[2, 3]));
        let a = plain.call((x.clone(), y.clone(), Static(which))).unwrap();
        let b = optimized.call((x.clone(), y.clone(), Static(which))).unwrap();
        prop_assert!(same(&a, &b), "program {}: {:?} vs {:?}\n{}", which, a, b,
            optimized.concrete_functions()[0].optimized_graph());
    }
}
