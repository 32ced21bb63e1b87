//! Artifacts end to end: the digits MLP's forward and its Adam training
//! step saved in this process and run in child processes (this test binary
//! again, `child`, which never sees the closures), compared bit for bit
//! with the same calls here; the compile counts of the loading process; the
//! AVX2/AVX-512 forcing both ways; and bad files named for what is wrong.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracejit::artifact;
use tracejit::optim::{Adam, Optimizer};
use tracejit::prelude::*;
use tracejit::Target;

#[derive(Module, Clone)]
struct Dense {
    w: Variable,
    b: Variable,
}

#[derive(Module, Clone)]
struct Mlp {
    layers: Vec<Dense>,
}

impl Mlp {
    fn new() -> Mlp {
        let dense = |i: usize, o: usize, seed| Dense {
            w: Variable::new(Tensor::randn(&[i, o], seed) * (2.0 / i as f64).sqrt()),
            b: Variable::new(Tensor::zeros(&[o], DType::F32)),
        };
        Mlp { layers: vec![dense(64, 128, 1), dense(128, 10, 2)] }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let [hidden, out] = &self.layers[..] else { unreachable!() };
        let h = (x.matmul(&hidden.w.read()) + hidden.b.read()).relu();
        h.matmul(&out.w.read()) + out.b.read()
    }
}

#[derive(Module)]
struct TrainState {
    model: Mlp,
    opt: Adam,
}

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/digits.safetensors");

/// Batch `k` of 32 images and labels.
fn batch(k: usize) -> (Tensor, Tensor) {
    let data = tracejit::checkpoint::read(DATA).unwrap();
    let at = |t: &Tensor| t.slice_axis(0, 32 * k as i64, 32 * k as i64 + 32);
    (at(&data["images"]), at(&data["labels"]))
}

fn step_function(state: &TrainState) -> Function<(Tensor, Tensor), Tensor> {
    let (model, opt) = (state.model.clone(), state.opt.clone());
    let vars = model.trainable_variables();
    function(move |(x, y): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let logits = model.forward(&x);
        let loss =
            tracejit::nn::softmax_cross_entropy_with_logits(&logits, &y.one_hot(10, DType::F32)).mean(&[0], false);
        let grads: Vec<Tensor> = tape.gradient(&loss, &vars).unwrap().into_iter().map(Option::unwrap).collect();
        opt.apply_gradients(&grads, &vars);
        loss
    })
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// FNV-1a of every variable's value bits, in path order.
fn digest_vars(vars: &[(String, Variable)]) -> String {
    let mut sorted: Vec<&(String, Variable)> = vars.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (p, v) in sorted {
        let t = v.read();
        let words: Vec<u64> = match t.dtype() {
            DType::F32 => bits(&t).into_iter().map(u64::from).collect(),
            DType::I64 => t.to_vec::<i64>().unwrap().into_iter().map(|x| x as u64).collect(),
            d => panic!("{p}: {d}"),
        };
        for w in words {
            for b in w.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    format!("{h:016x}")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracejit-artifact-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Run in a child process (`ARTIFACT_CHILD=mode:path`): loads or saves an
/// artifact and prints what the parent checks. No closure is traced in the
/// loading modes.
#[test]
fn child() {
    let Ok(spec) = std::env::var("ARTIFACT_CHILD") else { return };
    let (mode, path) = spec.split_once(':').unwrap();
    match mode {
        "forward" => {
            let a = artifact::load(path).unwrap();
            let (x, _) = batch(40);
            let out = a.call(&[x]).unwrap();
            println!("OUT {:?}", bits(&out[0]));
            println!("EXECUTOR {}", a.executor_kind());
        }
        "train" => {
            let a = artifact::load(path).unwrap();
            for k in 3..6 {
                let (x, y) = batch(k);
                println!("LOSS {:?}", bits(&a.call(&[x, y]).unwrap()[0]));
            }
            println!("VARS {}", digest_vars(&a.variables()));
            artifact::save_artifact(&a, format!("{path}.after")).unwrap();
        }
        "onnx" => {
            let a = artifact::load(path).unwrap();
            for batch in [2, 5] {
                println!("OUT{batch} {:?}", bits(&a.call(&[onnx_input(batch)]).unwrap()[0]));
            }
            let wide = Tensor::randn(&[2, 3, 7, 7], 1);
            let refused = a.call(&[wide]).expect_err("7 x 7 images for a trace of 6 x 6");
            println!("REFUSED {}", refused.to_string().replace('\n', " "));
            let mut names: Vec<String> = a.variables().into_iter().map(|(p, _)| p).collect();
            names.sort();
            println!("NAMES {names:?}");
        }
        "save-forward" => {
            let model = Mlp::new();
            let m = model.clone();
            let f = function(move |x: Tensor| m.forward(&x));
            f.call(batch(0).0).unwrap();
            artifact::save(&f.concrete_functions()[0], path).unwrap();
        }
        other => panic!("unknown mode {other}"),
    }
    let st = tracejit::config::compile_cache_stats();
    println!("STATS hits={} misses={}", st.hits, st.misses);
}

struct ChildReport {
    stdout: String,
}

impl ChildReport {
    fn all(&self, tag: &str) -> Vec<String> {
        self.stdout.lines().filter_map(|l| l.split_once(tag).map(|(_, r)| r.to_string())).collect()
    }
    fn one(&self, tag: &str) -> String {
        self.all(tag).pop().unwrap_or_else(|| panic!("no {tag} in\n{}", self.stdout))
    }
    fn stats(&self) -> (u64, u64) {
        let s = self.one("STATS ");
        let f = |k: &str| s.split(' ').find_map(|kv| kv.strip_prefix(k)).unwrap().parse::<u64>().unwrap();
        (f("hits="), f("misses="))
    }
}

fn run_child(mode: &str, path: &Path, isa: Option<&str>) -> ChildReport {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("ARTIFACT_CHILD", format!("{mode}:{}", path.display()))
        .env_remove("TRACEJIT_COMPILE_CACHE");
    match isa {
        Some(i) => c.env("TRACEJIT_ISA", i),
        None => c.env_remove("TRACEJIT_ISA"),
    };
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child {mode} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    ChildReport { stdout }
}

/// The `TRACEJIT_ISA` this test process runs under (CI runs the suite a
/// second time under `avx2`): a child that must find this process's
/// kernels runs under the same.
fn own_isa() -> Option<String> {
    std::env::var("TRACEJIT_ISA").ok()
}

/// Whether this process compiles AVX-512 code (the host has it and no
/// `TRACEJIT_ISA=avx2` holds it back).
fn own_avx512() -> bool {
    host_avx512() && own_isa().as_deref() != Some("avx2")
}

fn host_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A small CNN (conv, relu, flatten, dense, an elementwise tail) exported to ONNX bytes: what
/// the importer reads in the ONNX test below.
fn cnn_onnx() -> Vec<u8> {
    use tracejit::nn::{conv2d, Conv2dOptions};
    let w = Variable::new(Tensor::randn(&[4, 3, 3, 3], 7) * 0.3);
    let b = Variable::new(Tensor::randn(&[4], 8) * 0.1);
    let dense = Variable::new(Tensor::randn(&[4 * 4 * 4, 6], 9) * 0.2);
    let f = function(move |x: Tensor| {
        let h = conv2d(&x, &w.read(), Some(&b.read()), Conv2dOptions::default()).relu();
        let y = h.reshape(&[-1, 64]).matmul(&dense.read());
        // An elementwise tail: a region the JIT compiles (conv and matmul
        // with their bias and relu run as native kernels).
        y.tanh() * 2.0 - y.sigmoid()
    });
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 3, 6, 6])).unwrap();
    tracejit::onnx::to_bytes(&cf).unwrap()
}

/// The ONNX test's input of `batch` images.
fn onnx_input(batch: usize) -> Tensor {
    Tensor::randn(&[batch, 3, 6, 6], 100 + batch as u64)
}

/// An imported ONNX model saved as an artifact, traced for any batch size:
/// a child serves it with neither the file nor the importer, at two batch
/// sizes with the bits of the imported model's own runs, compiling
/// nothing, its initializers as the artifact's variables; images of
/// another size are refused.
#[test]
fn an_imported_onnx_model_runs_from_an_artifact() {
    let model = tracejit::onnx::import_bytes(&cnn_onnx()).unwrap();
    let cf = model.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 3, 6, 6])]).unwrap();
    assert!(!cf.kernel_entries().is_empty(), "the imported model was compiled");
    let path = temp("imported.tjx");
    artifact::save(&cf, &path).unwrap();
    let child = run_child("onnx", &path, own_isa().as_deref());
    for batch in [2, 5] {
        let want = bits(&model.run(&[onnx_input(batch)]).unwrap()[0]);
        assert_eq!(child.one(&format!("OUT{batch} ")), format!("{want:?}"), "batch {batch}");
    }
    assert!(child.one("REFUSED ").contains('7'), "{}", child.one("REFUSED "));
    let mut names: Vec<String> = model.variables().into_iter().map(|(n, _)| n).collect();
    names.sort();
    assert_eq!(child.one("NAMES "), format!("{names:?}"));
    // The three weights, and float constants the export made initializers.
    assert!(names.len() >= 3, "the weights came in as variables: {names:?}");
    assert_eq!(child.stats().1, 0, "the child compiled nothing");
}

/// Trains 3 steps, saves the step, trains 3 more here; a child loads the
/// saved step and trains the same 3 steps: the losses and the variables
/// agree bit for bit, the child compiles nothing, and its saved artifact
/// holds the six-step values.
#[test]
fn a_training_step_keeps_training_in_another_process() {
    let state = TrainState { model: Mlp::new(), opt: Adam::new(3e-3) };
    state.opt.build_for(&state.model);
    state.assign_names();
    let step = step_function(&state);
    for k in 0..3 {
        step.call(batch(k)).unwrap();
    }
    let path = temp("step.tjx");
    artifact::save(&step.concrete_functions()[0], &path).unwrap();
    let here: Vec<Vec<u32>> = (3..6).map(|k| bits(&step.call(batch(k)).unwrap())).collect();

    let child = run_child("train", &path, own_isa().as_deref());
    let losses: Vec<String> = child.all("LOSS ");
    assert_eq!(losses, here.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>());
    let (hits, misses) = child.stats();
    assert!(hits > 0 && misses == 0, "the loading process compiled {misses} kernels ({hits} loaded)");

    let named: Vec<(String, Variable)> = state.named_variables();
    let after = artifact::load(format!("{}.after", path.display())).unwrap();
    let mut ours: Vec<Vec<u32>> = Vec::new();
    let mut theirs: Vec<Vec<u32>> = Vec::new();
    for (_, v) in &named {
        let (_, w) = after.variables().into_iter().find(|(p, _)| *p == v.name()).expect("every variable is saved");
        if v.dtype() == DType::F32 {
            ours.push(bits(&v.read()));
            theirs.push(bits(&w.read()));
        }
    }
    assert_eq!(ours, theirs, "the child's variables after six steps");
    assert_eq!(child.one("VARS "), digest_vars(&after.variables()));
    // Every Adam slot and the step count went along.
    assert_eq!(after.variables().len(), named.len());
}

/// The forward saved here runs in a child with the same bits and no
/// compiling; forced to AVX2 on an AVX-512 host the child compiles its
/// own kernels instead of running AVX-512 code, and the reverse.
#[test]
fn a_forward_runs_in_another_process_and_respects_the_target() {
    let model = Mlp::new();
    let m = model.clone();
    let f = function(move |x: Tensor| m.forward(&x));
    let expected = bits(&f.call(batch(40).0).unwrap());
    let path = temp("forward.tjx");
    artifact::save(&f.concrete_functions()[0], &path).unwrap();

    let same = run_child("forward", &path, own_isa().as_deref());
    assert_eq!(same.one("OUT "), format!("{expected:?}"));
    assert_eq!(same.one("EXECUTOR "), "jit");
    assert_eq!(same.stats().1, 0, "nothing compiled");

    let narrow = run_child("forward", &path, Some("avx2"));
    assert_eq!(narrow.one("EXECUTOR "), "jit");
    if own_avx512() {
        assert!(narrow.stats().1 > 0, "AVX-512 kernels were not recompiled under TRACEJIT_ISA=avx2");
    } else {
        assert_eq!(narrow.stats().1, 0, "AVX2 kernels saved here were recompiled for AVX2");
    }
    // Saved under AVX2, loaded with the host's features.
    let path2 = temp("forward-avx2.tjx");
    run_child("save-forward", &path2, Some("avx2"));
    let wide = run_child("forward", &path2, None);
    if host_avx512() {
        assert!(wide.stats().1 > 0, "AVX2 kernels were taken for the AVX-512 options");
    }
    let back = run_child("forward", &path2, Some("avx2"));
    assert_eq!(back.stats().1, 0);
}

/// The same in one process: a function traced for AVX2
/// (`Function::target`) saves AVX2 kernels, which run when the artifact is
/// loaded under the AVX2 target, with that function's bits, and are
/// compiled again for the host's code otherwise, with the host function's
/// bits.
#[test]
fn an_artifact_loads_for_the_target_entered_in_this_process() {
    let model = Mlp::new();
    let (m, m2) = (model.clone(), model.clone());
    let host = function(move |x: Tensor| m.forward(&x));
    let zen3 = function(move |x: Tensor| m2.forward(&x)).target(Target::avx2());
    let x = batch(40).0;
    let (want_host, want_zen3) = (bits(&host.call(x.clone()).unwrap()), bits(&zen3.call(x.clone()).unwrap()));
    let path = temp("forward-target.tjx");
    artifact::save(&zen3.concrete_functions()[0], &path).unwrap();

    let narrow = Target::avx2().enter(|| artifact::load(&path).unwrap());
    assert_eq!(narrow.target().map(|t| t.isa), Some(Target::avx2().isa));
    assert_eq!(bits(&narrow.call(std::slice::from_ref(&x)).unwrap()[0]), want_zen3);
    let wide = artifact::load(&path).unwrap();
    assert_eq!(wide.target().map(|t| t.isa), Some(Target::host().isa));
    assert_eq!(bits(&wide.call(std::slice::from_ref(&x)).unwrap()[0]), want_host);
}

/// A quantized function (its products in int8, chosen by the precision
/// pass) saves and loads like any other: the int8 product's kernel belongs
/// to the IR, so its graph text parses without a registry, and the loaded
/// artifact gives the quantized function's bits.
#[test]
fn a_quantized_function_round_trips_through_an_artifact() {
    let model = Mlp::new();
    let m = model.clone();
    let f = function(move |x: Tensor| m.forward(&x));
    let x = batch(3).0;
    f.call(x.clone()).unwrap();
    let q = tracejit::quantize::dynamic(&f.concrete_functions()[0]).unwrap();
    let want = q.call_flat(std::slice::from_ref(&x)).unwrap();
    let path = temp("quantized.tjx");
    artifact::save(&q, &path).unwrap();
    let a = artifact::load(&path).unwrap();
    let listing = format!("{}", a.graph());
    assert_eq!(listing.matches(tracejit::quantize::KERNEL_NAME).count(), 2, "{listing}");
    assert_eq!(a.executor_kind(), "jit");
    assert_eq!(bits(&a.call(std::slice::from_ref(&x)).unwrap()[0]), bits(&want[0]));
}

#[test]
fn bad_files_and_bad_calls_are_named() {
    let model = Mlp::new();
    let m = model.clone();
    let f = function(move |x: Tensor| m.forward(&x));
    f.call(batch(1).0).unwrap();
    let path = temp("bad.tjx");
    artifact::save(&f.concrete_functions()[0], &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let a = artifact::load(&path).unwrap();
    assert_eq!(a.input_paths(), ["args"]);

    let err = |bytes: &[u8]| artifact::load_bytes(bytes, "x.tjx").unwrap_err().to_string();
    assert!(err(&good[..good.len() - 7]).contains("truncated"), "{}", err(&good[..good.len() - 7]));
    let mut altered = good.clone();
    let mid = altered.len() / 2;
    altered[mid] ^= 0x20;
    assert!(err(&altered).contains("checksum mismatch"), "{}", err(&altered));
    let mut version = good.clone();
    version[8] = 7;
    assert_eq!(err(&version), "artifact x.tjx: format version 7, this tracejit reads version 1");
    assert!(err(b"PK\x03\x04 a zip").contains("not a tracejit artifact"));
    let missing = artifact::load(temp("missing.tjx")).unwrap_err().to_string();
    assert!(missing.contains("cannot read"), "{missing}");

    let wrong_shape = a.call(&[Tensor::zeros(&[32, 63], DType::F32)]).unwrap_err().to_string();
    assert!(wrong_shape.contains("argument `args`: expected f32[32, 64], got f32[32, 63]"), "{wrong_shape}");
    let wrong_count = a.call(&[]).unwrap_err().to_string();
    assert!(wrong_count.contains("expected 1 tensor arguments, got 0"), "{wrong_count}");
    // An error converts into tracejit's own.
    let e: tracejit::Error = artifact::load_bytes(&version, "x.tjx").unwrap_err().into();
    assert!(e.downcast_source::<artifact::Error>().is_some());
}
