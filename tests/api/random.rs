//! Randomness as graph state: `tracejit::random::Generator` and the
//! stateless draws give the same bits eagerly, in the interpreter and in the
//! JIT, and after a checkpoint restore; a compiled step draws fresh numbers
//! on every call without retracing; passes never merge or fold a draw;
//! `nn::dropout` runs as one native kernel inside a compiled step (no random
//! tensor), with the right statistics and gradient; `categorical` samples
//! the softmax's distribution; the export of a draw is an error naming it.

use tracejit::prelude::*;
use tracejit::random::{stateless_normal, stateless_uniform, Generator};

fn draws(g: &Generator) -> Vec<Tensor> {
    vec![
        g.normal(&[3, 5], DType::F32),
        g.uniform(&[7], -2.0, 3.0, DType::F64),
        g.normal(&[1025], DType::F64),
        g.uniform(&[0, 4], 0.0, 1.0, DType::F32),
    ]
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u64>> {
    ts.iter().map(|t| t.cast(DType::F64).to_vec::<f64>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn the_same_seed_gives_the_same_bits_eagerly_interpreted_and_compiled() {
    let eager = bits(&draws(&Generator::from_seed(11)));
    for jit in [false, true] {
        let g = Generator::from_seed(11);
        let g2 = g.clone();
        let f = function(move |_: ()| draws(&g2)).jit(jit);
        assert_eq!(bits(&f.call(()).unwrap()), eager, "jit={jit}");
        // The second call continues the stream: the next draws.
        let next = bits(&f.call(()).unwrap());
        assert_ne!(next, eager);
        let expected_next = {
            let e = Generator::from_seed(11);
            draws(&e);
            bits(&draws(&e))
        };
        assert_eq!(next, expected_next, "jit={jit}");
        assert_eq!(f.tracing_count(), 1);
        assert_eq!(f.concrete_functions()[0].executor_kind(), if jit { "jit" } else { "interpreter" });
    }
}

#[test]
fn values_and_statistics() {
    let g = Generator::from_seed(3);
    let n = g.normal(&[200_000], DType::F64).to_vec::<f64>().unwrap();
    let mean = n.iter().sum::<f64>() / n.len() as f64;
    let var = n.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.len() as f64;
    assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "{mean} {var}");
    let u = g.uniform(&[100_000], 2.0, 5.0, DType::F32).to_vec::<f32>().unwrap();
    assert!(u.iter().all(|&x| (2.0..5.0).contains(&x)));
    let seed = Tensor::from_vec(vec![5i64, 6], &[2]);
    let a = stateless_uniform(&[4], &seed, 0.0, 1.0, DType::F32);
    let b = function(move |s: Tensor| stateless_uniform(&[4], &s, 0.0, 1.0, DType::F32)).call(seed.clone()).unwrap();
    assert_eq!(bits(&[a]), bits(&[b]));
    let other = stateless_normal(&[4], &Tensor::from_vec(vec![5i64, 7], &[2]), DType::F32);
    assert_ne!(bits(&[other]), bits(&[stateless_normal(&[4], &seed, DType::F32)]));
}

#[test]
fn a_restored_generator_continues_its_stream() {
    #[derive(Module)]
    struct State {
        g: Generator,
    }
    let dir = std::env::temp_dir().join(format!("tracejit-random-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("g.safetensors");
    let s = State { g: Generator::from_seed(99) };
    s.g.normal(&[10], DType::F32);
    tracejit::checkpoint::save(&s, &path).unwrap();
    let expected = bits(&draws(&s.g));
    let fresh = State { g: Generator::from_seed(0) };
    tracejit::checkpoint::restore(&fresh, &path).unwrap();
    assert_eq!(bits(&draws(&fresh.g)), expected);
    assert_eq!(fresh.named_variables()[0].0, "g.state");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn passes_never_merge_or_fold_draws() {
    let seed = Tensor::from_vec(vec![1i64, 2], &[2]);
    let f = function(move |seed: Tensor| {
        let a = stateless_normal(&[3], &seed, DType::F32);
        let b = stateless_normal(&[3], &seed, DType::F32);
        (a, b)
    });
    let (a, b) = f.call(seed).unwrap();
    assert_eq!(bits(&[a]), bits(&[b]), "a pure function of the seed");
    let g = f.concrete_functions()[0].optimized_graph().clone();
    let draws = g.nodes().filter(|(_, n)| matches!(n.op, tracejit::ir::Op::Random { .. })).count();
    assert_eq!(draws, 2, "neither folded into a constant nor merged:\n{g}");
}

#[test]
fn dropout_is_one_kernel_with_the_right_mask_and_gradient() {
    let g = Generator::from_seed(5);
    let w = Variable::new(Tensor::ones(&[64, 128], DType::F32));
    let (g2, w2) = (g.clone(), w.clone());
    let step = function(move |x: Tensor| {
        let tape = GradientTape::new();
        let y = tracejit::nn::dropout(&(&x * &w2.read()), 0.25, &g2, true);
        let loss = y.sum_all();
        let grad = tape.gradient(&loss, &[&w2]).unwrap().remove(0).unwrap();
        (y, grad)
    });
    let x = Tensor::ones(&[64, 128], DType::F32);
    let (y1, g1) = step.call(x.clone()).unwrap();
    let (y2, _) = step.call(x.clone()).unwrap();
    assert_ne!(y1.to_vec::<f32>().unwrap(), y2.to_vec::<f32>().unwrap(), "a fresh mask on every call");
    assert_eq!(step.tracing_count(), 1);
    let (yv, gv) = (y1.to_vec::<f32>().unwrap(), g1.to_vec::<f32>().unwrap());
    let kept = yv.iter().filter(|&&v| v != 0.0).count() as f64 / yv.len() as f64;
    assert!((kept - 0.75).abs() < 0.02, "{kept}");
    // The gradient flows exactly where the output survived, scaled.
    for (y, g) in yv.iter().zip(&gv) {
        assert_eq!(*y == 0.0, *g == 0.0);
        assert!(*g == 0.0 || (g - 4.0 / 3.0).abs() < 1e-6);
    }
    // Compiled: the dropout and its gradient are native kernels, and no
    // random draw is left for the executor to materialize.
    let cf = &step.concrete_functions()[0];
    let graph = cf.optimized_graph();
    let names: Vec<String> = graph
        .nodes()
        .filter_map(|(_, n)| match &n.op {
            tracejit::ir::Op::Kernel { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["tracejit.nn.dropout", "tracejit.nn.dropout"], "{graph}");
    assert!(!graph.nodes().any(|(_, n)| matches!(n.op, tracejit::ir::Op::Random { .. })), "{graph}");
    // The profile of a run: two native dropout steps, no reference step
    // (no random tensor is materialized; the kernel draws in chunks).
    let profile = cf.profile(std::slice::from_ref(&x), 1).unwrap().expect("the JIT runs the step");
    let native: Vec<&str> = profile.steps.iter().filter(|s| s.kind == "native").map(|s| s.what.as_str()).collect();
    assert_eq!(native.len(), 2, "{profile}");
    assert!(native.iter().all(|w| w.contains("dropout")), "{profile}");
    assert!(!profile.steps.iter().any(|s| s.kind == "reference"), "{profile}");
    // The same draws eagerly: the kernel and the body agree bit for bit.
    let e = Generator::from_seed(5);
    let eager = tracejit::nn::dropout(&x, 0.25, &e, true);
    assert_eq!(eager.to_vec::<f32>().unwrap(), yv);
}

#[test]
fn dropout_at_draws_its_part_of_the_whole_mask() {
    // Rows split as data-parallel ranks split a batch: each part's mask,
    // compiled (and its gradient), is the part of one dropout of the whole.
    for (rows, cols, dtype) in
        [(6usize, 20usize, DType::F32), (5, 6, DType::F64), (7, 3, DType::F32), (2, 1000, DType::F32)]
    {
        let x = Tensor::randn(&[rows, cols], 3).cast(dtype);
        let whole =
            tracejit::nn::dropout(&x, 0.3, &Generator::from_seed(8), true).cast(DType::F64).to_vec::<f64>().unwrap();
        let per_block = if dtype == DType::F64 { 2 } else { 4 };
        // Parts at row boundaries whose element offset is a multiple of the block.
        let cuts: Vec<usize> = (0..=rows).filter(|r| (r * cols) % per_block == 0).collect();
        for part in cuts.windows(2) {
            let (lo, hi) = (part[0], part[1]);
            let g = Generator::from_seed(8);
            let w = Variable::new(Tensor::ones(&[hi - lo, cols], dtype));
            let (g2, w2) = (g.clone(), w.clone());
            let step = function(move |x: Tensor| {
                let tape = GradientTape::new();
                let y = tracejit::nn::dropout_at(&(&x * &w2.read()), 0.3, &g2, true, (lo * cols) as u64);
                let grad = tape.gradient(&y.sum_all(), &[&w2]).unwrap().remove(0).unwrap();
                (y, grad)
            });
            let (y, grad) = step.call(x.slice_axis(0, lo as i64, hi as i64)).unwrap();
            assert!(step.concrete_functions()[0].schedule_stats().is_some(), "the JIT ran");
            let f64s = |t: Tensor| t.cast(DType::F64).to_vec::<f64>().unwrap();
            let (y, grad) = (f64s(y), f64s(grad));
            assert_eq!(y, whole[lo * cols..hi * cols], "{dtype:?} rows {lo}..{hi}");
            // With w = 1, dy/dw = x * mask / (1 - p) = y: the backward's
            // mask is the forward's.
            assert_eq!(grad, y, "{dtype:?} rows {lo}..{hi}");
            // The generator advanced by one draw, as `dropout`'s does.
            let next = Generator::from_seed(8);
            let _ = tracejit::nn::dropout(&x, 0.3, &next, true);
            assert_eq!(g.state().value().to_vec::<i64>().unwrap(), next.state().value().to_vec::<i64>().unwrap());
        }
    }
    let x = Tensor::ones(&[3, 3], DType::F32);
    let bad = std::panic::catch_unwind(|| tracejit::nn::dropout_at(&x, 0.3, &Generator::from_seed(1), true, 6));
    let msg = bad.unwrap_err().downcast::<String>().map(|s| *s).unwrap_or_default();
    assert!(msg.contains("multiple of 4") && msg.contains("got 6"), "{msg}");
}

#[test]
fn categorical_samples_the_softmax() {
    let g = Generator::from_seed(21);
    let logits = Tensor::from_vec(vec![0.0f32, (2.0f32).ln(), f32::NEG_INFINITY, (5.0f32).ln()], &[1, 4]);
    let s = g.categorical(&logits, 8000).to_vec::<i64>().unwrap();
    let mut counts = [0usize; 4];
    s.iter().for_each(|&c| counts[c as usize] += 1);
    assert_eq!(counts[2], 0, "a -inf logit is never drawn");
    for (c, p) in [(0, 1.0 / 8.0), (1, 2.0 / 8.0), (3, 5.0 / 8.0)] {
        let f = counts[c] as f64 / 8000.0;
        assert!((f - p).abs() < 0.02, "class {c}: {f} vs {p}");
    }
    // Traced with an unknown batch.
    let g2 = g.clone();
    let f =
        function(move |l: Tensor| g2.categorical(&l, 3)).input_signature(vec![TensorSpec::new(DType::F32, &[-1, 4])]);
    let out = f.call(Tensor::zeros(&[5, 4], DType::F32)).unwrap();
    assert_eq!(out.shape(), &[5, 3]);
}

#[test]
fn exporting_a_draw_is_an_error_naming_it() {
    let f = function(move |(x, seed): (Tensor, Tensor)| &x + stateless_normal(&[2], &seed, DType::F32));
    let specs = (TensorSpec::new(DType::F32, &[2]), TensorSpec::new(DType::I64, &[2]));
    let cf = f.get_concrete_function(specs).unwrap();
    let e = tracejit::onnx::to_bytes(&cf).unwrap_err().to_string();
    assert!(e.contains("random_normal") && e.contains("random.rs"), "{e}");
}

#[test]
fn threads_sharing_a_generator_in_a_compiled_function_never_draw_the_same_numbers() {
    let g = Generator::from_seed(21);
    let h = g.clone();
    let f = function(move |x: Tensor| &x + h.uniform(&[2], 0.0, 1.0, DType::F64));
    let zero = Tensor::zeros(&[2], DType::F64);
    f.call(zero.clone()).unwrap();
    let seen: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..200).map(|_| bits(&[f.call(zero.clone()).unwrap()]).remove(0)).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let distinct: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(distinct.len(), 800, "every concurrent call drew its own numbers");
    // 801 draws advanced the counter 801 times: none was lost.
    assert_eq!(g.state().value().to_vec::<i64>().unwrap(), [0, 801, 21]);
    assert_eq!(f.tracing_count(), 1);
}

/// Huge logits draw each class with its softmax probability: the Gumbel
/// noise is added after the row's maximum is subtracted, so it is not
/// rounded away (the issue: `[1e30, 1e30]` always gave class 0, `[3e7,
/// 3e7]` in f32 74% of the time). 4000 draws of a fair coin land within
/// 5 standard deviations (0.04) of one half.
#[test]
fn categorical_is_unbiased_for_huge_logits() {
    let g = Generator::from_seed(5);
    let cases = [
        Tensor::from_vec(vec![1e30f32, 1e30], &[1, 2]),
        Tensor::from_vec(vec![3e7f32, 3e7], &[1, 2]),
        Tensor::from_vec(vec![1e300f64, 1e300], &[1, 2]),
        Tensor::from_vec(vec![-3e7f32, -3e7], &[1, 2]),
    ];
    let g2 = g.clone();
    let compiled = function(move |l: Tensor| g2.categorical(&l, 4000));
    for logits in cases {
        for (how, s) in [("eager", g.categorical(&logits, 4000)), ("compiled", compiled.call(logits.clone()).unwrap())]
        {
            let s = s.to_vec::<i64>().unwrap();
            let ones = s.iter().filter(|&&c| c == 1).count() as f64 / 4000.0;
            assert!((ones - 0.5).abs() < 0.04, "{how} {logits:?}: class 1 drawn {ones}");
        }
    }
    // Rows of -inf (and an infinite maximum) keep their old meaning.
    let l = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, f32::INFINITY, 1.0], &[2, 2]);
    let s = g.categorical(&l, 50).to_vec::<i64>().unwrap();
    assert!(s[..50].iter().all(|&c| c == 1) && s[50..].iter().all(|&c| c == 0), "{s:?}");
}

/// `uniform(low, high)` stays below `high` when `low + (high - low)·u`
/// rounds up to it (f32 near 1e8, where the spacing is 8).
#[test]
fn uniform_never_returns_the_upper_bound() {
    let g = Generator::from_seed(1);
    for (lo, hi, dtype) in [(1e8, 1e8 + 10.0, DType::F32), (1e16, 1e16 + 4.0, DType::F64), (0.0, 1.0, DType::F32)] {
        let u = g.uniform(&[20000], lo, hi, dtype).cast(DType::F64).to_vec::<f64>().unwrap();
        let hi_rounded = Tensor::full(&[], hi, dtype).cast(DType::F64).to_vec::<f64>().unwrap()[0];
        assert!(
            u.iter().all(|&v| v >= lo && v < hi_rounded),
            "{lo}..{hi} {dtype}: {:?}",
            u.iter().cloned().fold(f64::MIN, f64::max)
        );
    }
}
