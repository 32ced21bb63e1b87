//! Mutation fuzzing, on stable Rust, of the parsers users feed files to:
//! the IR text parser (`Graph::parse`), the checkpoint reader
//! (`checkpoint::read_bytes` / `restore_bytes`, and the safetensors header
//! they trust), the ONNX importer (`onnx::import_bytes`, and
//! `onnx::load_tensor_bytes` for serialized tensors) and the artifact
//! reader (`artifact::load_bytes`, as written and re-sealed with a valid
//! length and checksum so mutations reach the graph, the variables and the
//! kernel entries behind it).
//!
//! Each target starts from valid files (the IR filetests and listings of
//! traced functions; checkpoints of every dtype, optimizer state and odd
//! shapes; ONNX models exported by tracejit and written by hand, with
//! local functions, integer initializers and typed-field tensors) and runs
//! mutated copies of them through the parser: bit flips,
//! bytes and tokens inserted, spans deleted or duplicated, numbers made
//! huge, the safetensors length field and offsets rewritten. Every input
//! must come back as `Ok` or as an `Err` whose message names what was
//! wrong; no panic may escape, and the parse may not allocate more than a
//! small multiple of the input's size (a header claiming a terabyte must
//! not get one). The run is deterministic: 100,000 inputs per target by
//! default, a few seconds each; `TRACEJIT_FUZZ_CASES=n` runs `n` (and
//! `TRACEJIT_FUZZ_SEED` another stream) on demand:
//!
//! ```sh
//! TRACEJIT_FUZZ_CASES=10000000 cargo test --release --test fuzz -- --nocapture
//! ```
//!
//! A file of its own: it installs a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tracejit::checkpoint;
use tracejit::ir::Graph;
use tracejit::optim::{Adam, Optimizer};
use tracejit::prelude::*;

// ---- allocation accounting --------------------------------------------------

/// The system allocator, counting per thread the bytes live now and the
/// most live since the last reset.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(bytes: usize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get().saturating_add(bytes);
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn sub(bytes: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(bytes)));
}

// SAFETY: every call goes to the system allocator unchanged; the counters
// are thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: as allocated above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: as allocated above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning its result and the most bytes it had live at once.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get).saturating_sub(base))
}

/// What a parse of `len` input bytes may allocate at once: the structures
/// it builds are a small multiple of the text, plus a fixed allowance.
fn allowance(len: usize) -> usize {
    64 * len + (4 << 20)
}

// ---- the mutator ----------------------------------------------------------

/// A xorshift stream: deterministic inputs from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Numbers, keywords and punctuation worth splicing into either format.
const TOKENS: &[&[u8]] = &[
    b"18446744073709551615",
    b"9223372036854775807",
    b"4294967296",
    b"99999999999999999999999",
    b"-1",
    b"0",
    b"1e308",
    b"NaN",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"\"",
    b"%",
    b"%0",
    b"%999999",
    b" = ",
    b"while[trips=18446744073709551615]",
    b"while[cancel]",
    b"cond",
    b"graph g() -> () {\n}\n",
    b"f32[4294967296, 4294967296]",
    b"constant f32[1000000000] ...",
    b"read_variable[var=@v0, locked]",
    b"@v99",
    b"\n",
    b"\"data_offsets\":[0,18446744073709551615]",
    b"\"shape\":[4294967296,4294967296]",
    b"\"dtype\":\"F16\"",
    b"\"__metadata__\":{\"tracejit.checksums\":\"crc32\"}",
    b"tracejit.",
    b"\xff\xfe",
];

/// `seed` changed in one to three places.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(b.len() + 1);
        match rng.below(8) {
            0 | 1 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] ^= 1 << rng.below(8);
            }
            2 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = rng.next() as u8;
            }
            3 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                b.splice(at..at, t.iter().copied());
            }
            4 if !b.is_empty() => {
                let end = (at + 1 + rng.below(32)).min(b.len());
                b.drain(at.min(end)..end);
            }
            5 if !b.is_empty() => {
                let start = at.min(b.len() - 1);
                let end = (start + 1 + rng.below(64)).min(b.len());
                let span: Vec<u8> = b[start..end].to_vec();
                b.splice(end..end, span);
            }
            6 => {
                // A number made huge, or another number.
                let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
                if let Some(&i) = digits.get(rng.below(digits.len())) {
                    let t = TOKENS[rng.below(4)];
                    b.splice(i..i + 1, t.iter().copied());
                }
            }
            _ => b.truncate(at),
        }
    }
    b
}

/// How many inputs each target runs, and the stream they come from.
fn budget() -> (usize, u64) {
    let cases = std::env::var("TRACEJIT_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let seed = std::env::var("TRACEJIT_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    (cases, seed)
}

/// Runs `cases` mutations of `seeds` through `check`, which returns the
/// error message of a rejected input (`None`: accepted). Panics name the
/// input that escaped, was refused without a reason, or allocated too much.
fn fuzz(target: &str, seeds: &[Vec<u8>], check: &dyn Fn(&[u8]) -> Option<String>) {
    let (cases, seed) = budget();
    let mut rng = Rng(seed ^ target.len() as u64);
    let (mut accepted, mut refused) = (0usize, 0usize);
    for case in 0..cases {
        let input = mutate(&mut rng, &seeds[case % seeds.len()]);
        IN_CHECK.with(|c| c.set(true));
        let (outcome, peak) = peak_of(|| catch_unwind(AssertUnwindSafe(|| check(&input))));
        IN_CHECK.with(|c| c.set(false));
        let show = || String::from_utf8_lossy(&input[..input.len().min(400)]).into_owned();
        match outcome {
            Ok(None) => accepted += 1,
            Ok(Some(message)) => {
                assert!(
                    message.len() > 10,
                    "{target} case {case}: an error that says nothing: {message:?}\n{}",
                    show()
                );
                refused += 1;
            }
            Err(p) => {
                let message =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("{target} case {case}: a panic escaped: {message:?}\ninput: {}", show());
            }
        }
        assert!(
            peak <= allowance(input.len()),
            "{target} case {case}: {peak} bytes allocated for {} bytes of input\ninput: {}",
            input.len(),
            show()
        );
    }
    eprintln!("{target}: {cases} inputs, {accepted} accepted, {refused} refused with an error");
    assert!(refused > 0 && accepted + refused == cases);
}

thread_local! {
    /// Set while an input runs: its panics are reported by the fuzzer.
    static IN_CHECK: Cell<bool> = const { Cell::new(false) };
}

/// No panic hook output for the panics a parser must not raise (the
/// fuzzer reports them itself); the test's own panics print as usual.
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_CHECK.with(Cell::get) {
                default(info);
            }
        }));
    });
}

// ---- the IR text parser -------------------------------------------------------

/// A filetest's input: its lines that are not `;` directives or
/// expectations.
fn input_of(file: &str) -> String {
    file.lines().filter(|l| !l.starts_with(';')).map(|l| format!("{l}\n")).collect()
}

/// Listings of traced functions: control flow, variables, composites,
/// regions, a loop gradient.
fn traced_listings() -> Vec<String> {
    let w = Variable::new(Tensor::randn(&[3, 3], 1));
    let w2 = w.clone();
    let f = function(move |x: Tensor| {
        let y = cond(&x.sum_all().gt(0.0), || (&x * 2.0).tanh(), || x.exp() - 1.0);
        let h = fori_loop(0, 4, |_, h: Tensor| (h.matmul(&w2.read()) + 0.5).tanh(), y.reshape(&[1, 3]));
        let tape = GradientTape::new();
        tape.watch(&x);
        let z = tracejit::nn::softmax(&(&x * 3.0), -1).sum_all();
        let g = tape.gradient(&z, &[&x]).unwrap().remove(0).unwrap();
        w2.assign_add(&(w2.read() * 0.0));
        h.reshape(&[3]) + g
    });
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[3])).unwrap();
    vec![format!("{:#}", cf.graph()), format!("{:#}", cf.optimized_graph()), format!("{}", cf.graph())]
}

fn ir_seeds() -> Vec<Vec<u8>> {
    let files = [
        include_str!("../crates/tracejit-ir/tests/ir/filetests/control_flow.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/const_fold.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/fusion_softmax.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/fusion_layer_norm.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/inline_keeps_composites.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/pipeline_default.tj"),
        include_str!("../crates/tracejit-ir/tests/ir/filetests/selector.tj"),
    ];
    let mut seeds: Vec<Vec<u8>> = files.iter().map(|f| input_of(f).into_bytes()).collect();
    seeds.extend(traced_listings().into_iter().map(String::into_bytes));
    for s in &seeds {
        // Each seed is valid (or needs only a kernel registry).
        let text = String::from_utf8_lossy(s);
        if let Err(e) = Graph::parse(&text) {
            assert!(e.to_string().contains("kernel"), "seed does not parse: {e}\n{text}");
        }
    }
    seeds
}

#[test]
fn the_ir_parser_survives_mutated_listings() {
    quiet();
    fuzz("ir parser", &ir_seeds(), &|bytes| {
        let text = std::str::from_utf8(bytes).ok()?;
        match Graph::parse(text) {
            Ok(g) => {
                // What parses must also verify, print and parse again.
                if let Err(e) = tracejit::ir::verify(&g) {
                    return Some(e.to_string());
                }
                let again = format!("{g:#}");
                Graph::parse(&again).map(|_| None).unwrap_or_else(|e| panic!("a printed graph does not parse: {e}"))
            }
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains("line "), "a parse error without its line: {m}");
                Some(m)
            }
        }
    });
}

// ---- the checkpoint reader ----------------------------------------------------

#[derive(Module)]
struct Everything {
    f32s: Variable,
    f64s: Variable,
    i32s: Variable,
    i64s: Variable,
    flags: Variable,
    empty: Variable,
    scalar: Variable,
}

fn everything(seed: u64) -> Everything {
    let s = seed as f32;
    Everything {
        f32s: Variable::new(Tensor::randn(&[3, 4], seed)),
        f64s: Variable::new(Tensor::from_vec(vec![s as f64, -2.5, 1e300], &[3])),
        i32s: Variable::new(Tensor::from_vec(vec![1i32, i32::MIN, 7, 9], &[2, 2])),
        i64s: Variable::new(Tensor::from_vec(vec![seed as i64, i64::MAX], &[2, 1])),
        flags: Variable::new(Tensor::from_vec(vec![true, false, true], &[3])),
        empty: Variable::new(Tensor::zeros(&[0, 5], DType::F32)),
        scalar: Variable::new(Tensor::scalar(s)),
    }
}

#[derive(Module)]
struct State {
    model: Everything,
    opt: Adam,
}

fn checkpoint_seeds() -> Vec<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("tracejit-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("seed.safetensors");
    let mut seeds = Vec::new();
    checkpoint::save(&everything(3), &path).unwrap();
    seeds.push(std::fs::read(&path).unwrap());
    let state = State { model: everything(4), opt: Adam::new(1e-3) };
    let vars = vec![state.model.f32s.clone(), state.model.f64s.clone()];
    let grads: Vec<Tensor> = vars.iter().map(|v| v.read() * 0.5).collect();
    state.opt.apply_gradients(&grads, &vars);
    checkpoint::save(&state, &path).unwrap();
    seeds.push(std::fs::read(&path).unwrap());
    std::fs::remove_dir_all(&dir).ok();
    seeds
}

/// `seed` with its 8-byte header length, or a number in its JSON header,
/// rewritten (the fields a reader must not trust).
fn mutate_header(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    if rng.below(2) == 0 && b.len() >= 8 {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap());
        let v = [0, 1, n.wrapping_sub(1), n + 1, u64::MAX, 1 << 40, n * 2][rng.below(7)];
        b[..8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

#[test]
fn the_checkpoint_reader_survives_mutated_files() {
    quiet();
    let seeds = checkpoint_seeds();
    // The length field first (the part the mutator rarely hits).
    let mut rng = Rng(7);
    let mut all: Vec<Vec<u8>> = seeds.clone();
    all.extend((0..8).map(|i| mutate_header(&mut rng, &seeds[i % seeds.len()])));
    fuzz("checkpoint reader", &all, &|bytes| {
        let read = checkpoint::read_bytes(bytes);
        let target = State { model: everything(9), opt: Adam::new(1e-3) };
        let before: Vec<Vec<u8>> = target.variables().iter().map(|v| format!("{:?}", v.value()).into_bytes()).collect();
        let restored = checkpoint::restore_bytes(&target, bytes);
        if restored.is_err() {
            // All or nothing.
            let after: Vec<Vec<u8>> =
                target.variables().iter().map(|v| format!("{:?}", v.value()).into_bytes()).collect();
            assert!(after == before, "a failed restore changed a variable");
        }
        match (read, restored) {
            (Ok(_), Ok(())) => None,
            (Err(e), _) | (_, Err(e)) => {
                let m = e.to_string();
                assert!(m.contains("<bytes>"), "an error that does not name the file: {m}");
                Some(m)
            }
        }
    });
}

// ---- the ONNX importer ----------------------------------------------------------

/// ONNX models to mutate: exported by tracejit (Variables as initializers,
/// a composite as a local function, a symbolic batch dim, a CNN block) and
/// one written by hand (Reshape, Slice and Gather reading i64
/// initializers, a typed-field `float_data` initializer, opset 11).
fn onnx_seeds() -> Vec<Vec<u8>> {
    use prost::Message;
    use tracejit::onnx::pb;
    let w = Variable::new(Tensor::randn(&[4, 3], 1)).with_name("w");
    let w2 = w.clone();
    let mlp = function(move |x: Tensor| tracejit::nn::softmax(&(x.matmul(&w2.read()) + 0.5).tanh(), -1));
    let cnn = function(|x: Tensor| {
        let k = Tensor::randn(&[2, 1, 3, 3], 2);
        let y = tracejit::nn::conv2d(&x, &k, None, tracejit::nn::Conv2dOptions::default().padding(1)).relu();
        tracejit::nn::max_pool2d(&y, [2, 2], [2, 2], [0, 0]).reshape(&[-1])
    });
    let mut seeds = vec![
        tracejit::onnx::to_bytes(&mlp.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 4])).unwrap()).unwrap(),
        tracejit::onnx::to_bytes(&cnn.get_concrete_function(TensorSpec::new(DType::F32, &[1, 1, 6, 6])).unwrap())
            .unwrap(),
    ];
    let i64s = |name: &str, v: &[i64]| pb::TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(pb::tensor_proto::DataType::Int64 as i32),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let info = |name: &str, dims: &[i64]| pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| pb::tensor_shape_proto::Dimension {
                            value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = |op: &str, i: &[&str], o: &str| pb::NodeProto {
        op_type: Some(op.into()),
        input: i.iter().map(|s| s.to_string()).collect(),
        output: vec![o.into()],
        ..Default::default()
    };
    let hand = pb::ModelProto {
        ir_version: Some(7),
        opset_import: vec![pb::OperatorSetIdProto { domain: Some(String::new()), version: Some(11) }],
        graph: Some(pb::GraphProto {
            name: Some("hand".into()),
            node: vec![
                node("Reshape", &["x", "shape"], "r"),
                node("Slice", &["r", "starts", "ends"], "s"),
                node("Gather", &["s", "idx"], "g"),
                node("Mul", &["g", "scale"], "y"),
            ],
            input: vec![info("x", &[2, 6])],
            output: vec![info("y", &[2, 4])],
            initializer: vec![
                i64s("shape", &[4, 3]),
                i64s("starts", &[1]),
                i64s("ends", &[3]),
                i64s("idx", &[1, 0, -1, 0, 1, 1, 0, 0]),
                pb::TensorProto {
                    name: Some("scale".into()),
                    dims: vec![3],
                    data_type: Some(1),
                    float_data: vec![1.0, -2.0, 0.5],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        ..Default::default()
    };
    seeds.push(hand.encode_to_vec());
    // Attention written out as nodes, which the importer matches as a
    // chain when it prepares the graph (mutations break the chain's
    // arity, names and consumers).
    let attr_i = |name: &str, i: i64| pb::AttributeProto {
        name: Some(name.into()),
        r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
        i: Some(i),
        ..Default::default()
    };
    let mut softmax = node("Softmax", &["a"], "p");
    softmax.attribute.push(attr_i("axis", -1));
    let chain = pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(pb::GraphProto {
            name: Some("chain".into()),
            node: vec![
                node("MatMul", &["q", "kt"], "s"),
                node("Div", &["s", "c"], "sd"),
                node("Add", &["sd", "m"], "a"),
                softmax,
                node("MatMul", &["p", "v"], "y"),
            ],
            input: vec![info("q", &[2, 3, 4]), info("kt", &[2, 4, 5]), info("v", &[2, 5, 3]), info("m", &[2, 1, 5])],
            output: vec![info("y", &[2, 3, 3])],
            initializer: vec![pb::TensorProto {
                name: Some("c".into()),
                dims: vec![],
                data_type: Some(1),
                float_data: vec![2.0],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    seeds.push(chain.encode_to_vec());
    for s in &seeds {
        tracejit::onnx::import_bytes(s).expect("every seed imports");
    }
    seeds
}

#[test]
fn the_onnx_importer_survives_mutated_models() {
    quiet();
    fuzz("onnx importer", &onnx_seeds(), &|bytes| match tracejit::onnx::import_bytes(bytes) {
        Ok(model) => {
            // What was accepted is a coherent model: its signature reads back.
            let _ = (model.inputs().len(), model.outputs().len(), model.variables().len());
            None
        }
        Err(e) => Some(e.to_string()),
    });
}

#[test]
fn the_onnx_tensor_reader_survives_mutated_tensors() {
    use prost::Message;
    quiet();
    let seeds: Vec<Vec<u8>> = [
        Tensor::randn(&[3, 4], 1),
        Tensor::from_vec(vec![1i64, -7, i64::MAX], &[3]),
        Tensor::from_vec(vec![true, false], &[2, 1]),
        Tensor::scalar(2.5f64),
    ]
    .iter()
    .map(|t| {
        let (code, raw): (i32, Vec<u8>) = match t.dtype() {
            DType::F32 => (1, t.to_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect()),
            DType::I64 => (7, t.to_vec::<i64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect()),
            DType::Bool => (9, t.to_vec::<bool>().unwrap().iter().map(|&v| u8::from(v)).collect()),
            _ => (11, t.to_vec::<f64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        let proto = tracejit::onnx::pb::TensorProto {
            name: Some("t".into()),
            dims: t.shape().iter().map(|&d| d as i64).collect(),
            data_type: Some(code),
            raw_data: Some(raw),
            ..Default::default()
        };
        proto.encode_to_vec()
    })
    .collect();
    for s in &seeds {
        let t = tracejit::onnx::load_tensor_bytes(s).expect("every seed decodes");
        assert!(!t.is_symbolic());
    }
    fuzz("onnx tensor reader", &seeds, &|bytes| match tracejit::onnx::load_tensor_bytes(bytes) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    });
}

// ---- the artifact reader --------------------------------------------------------

/// Artifacts to mutate: a small MLP's forward (captured constant, two
/// regions) and its SGD step (variables read and assigned).
fn artifact_seeds() -> Vec<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("tracejit-fuzz-artifact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let w = Variable::new(Tensor::randn(&[5, 3], 1));
    let shift = Tensor::randn(&[3], 2);
    let (w1, s1) = (w.clone(), shift.clone());
    let forward = function(move |x: Tensor| (x.matmul(&w1.read()) + &s1).tanh());
    forward.call(Tensor::randn(&[4, 5], 3)).unwrap();
    let w2 = w.clone();
    let step = function(move |x: Tensor| {
        let tape = GradientTape::new();
        let loss = x.matmul(&w2.read()).relu().mean_all();
        let g = tape.gradient(&loss, &[&w2]).unwrap().remove(0).unwrap();
        w2.assign(&(w2.read() - g * 0.1));
        loss
    });
    step.call(Tensor::randn(&[2, 5], 4)).unwrap();
    let mut seeds = Vec::new();
    for (k, cf) in [forward.concrete_functions()[0].clone(), step.concrete_functions()[0].clone()].iter().enumerate() {
        let path = dir.join(format!("{k}.tjx"));
        tracejit::artifact::save(cf, &path).unwrap();
        seeds.push(std::fs::read(&path).unwrap());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    seeds
}

/// `bytes` with the artifact header's length and checksum made to fit the
/// (mutated) body, so the reader goes past them.
fn reseal(bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    if b.len() >= 24 {
        let body_len = (b.len() - 24) as u64;
        b[12..20].copy_from_slice(&body_len.to_le_bytes());
        let crc = crc32(&b[24..]);
        b[20..24].copy_from_slice(&crc.to_le_bytes());
    }
    b
}

/// CRC-32 (IEEE), bitwise: the test's own, to re-seal mutated files.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in bytes {
        c ^= u32::from(x);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 };
        }
    }
    !c
}

#[test]
fn the_artifact_reader_survives_mutated_files() {
    quiet();
    let seeds = artifact_seeds();
    for s in &seeds {
        assert_eq!(reseal(s), *s, "re-sealing a valid file changes nothing");
        tracejit::artifact::load_bytes(s, "seed.tjx").unwrap();
    }
    let check = |bytes: &[u8]| match tracejit::artifact::load_bytes(bytes, "fuzz.tjx") {
        Ok(_) => None,
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("fuzz.tjx"), "an error that does not name the file: {m}");
            Some(m)
        }
    };
    fuzz("artifact reader", &seeds, &check);
    fuzz("artifact reader (re-sealed)", &seeds, &|bytes| check(&reseal(bytes)));
}
