//! ONNX's own conformance suite through the importer: every test of
//! onnx 1.22.0's `node/`, `pytorch-converted/`, `pytorch-operator/` and
//! `simple/` (a `model.onnx` and `test_data_set_N/{input,output}_K.pb`) is
//! imported, run on its inputs and compared with its outputs as ONNX's
//! backend runner compares (rtol 1e-3, atol 1e-5; integers and bools
//! exactly; shapes and dtypes exactly).
//!
//! Tests of the families the milestone leaves out (strings, sequences and
//! optionals, `ai.onnx.ml`, the training optimizers, sub-byte and 8-bit
//! floats) are reported apart. The others are held to
//! `tests/onnx/conformance/expected_failures.txt` (test and reason): the
//! test fails when a test not listed fails, and when a listed one passes
//! (so the list only shrinks: delete its line). Each test runs on a worker
//! thread under `tracejit_ir::catch_quietly` with a timeout; a panic is a
//! recorded failure (and a bug to fix), caught without a word from the
//! panic hook and without replacing it (the hook is process-wide, and this
//! binary runs the other ONNX tests too).
//!
//! Needs the data: `scripts/fetch_test_data.sh`, then
//! `cargo test --workspace --test onnx -- --ignored conformance:: --nocapture`.
//! `TRACEJIT_CONFORMANCE_FILTER=substr` runs the matching tests only;
//! `TRACEJIT_CONFORMANCE_BLESS=1` rewrites the list from this run.

mod classify;
mod compare;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use classify::{classify, Excluded};
use compare::mismatch;
use prost::Message;
use tracejit_onnx::pb::ModelProto;
use tracejit_onnx::Error;

const FAMILIES: [&str; 4] = ["node", "pytorch-converted", "pytorch-operator", "simple"];
const TIMEOUT: Duration = Duration::from_secs(120);
const LIST: &str = "tests/onnx/conformance/expected_failures.txt";

/// What happened to one test.
#[derive(Clone, Debug)]
enum Outcome {
    Pass,
    Excluded(Excluded),
    /// A failure: its grouping reason and the detail.
    Fail(String, String),
}

fn data_dir() -> PathBuf {
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tracejit"));
    root.join("onnx-1.22.0")
}

/// The reason a failure is grouped under: the error's kind and op, without
/// the test-specific details.
fn reason_of(e: &Error) -> String {
    let cut = |s: &str| -> String {
        let s = s.lines().next().unwrap_or("");
        if s.chars().count() > 110 {
            s.chars().take(110).collect::<String>() + "..."
        } else {
            s.to_string()
        }
    };
    match e {
        Error::UnsupportedOp { op_type, reason, .. } => format!("{op_type}: {}", cut(reason)),
        Error::UnsupportedDType { dtype, .. } => format!("needs dtype {dtype}"),
        Error::Opset { version, .. } => format!("opset {version}"),
        Error::Node { op_type, message, .. } => format!("{op_type}: {}", cut(message)),
        Error::Malformed { message, .. } => format!("malformed: {}", cut(message)),
        other => format!("run: {}", cut(&other.to_string())),
    }
}

fn fail(e: &Error) -> Outcome {
    Outcome::Fail(reason_of(e), e.to_string())
}

/// Runs one test directory.
fn run_test(dir: &Path) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Fail("unreadable model".into(), e.to_string()),
    };
    if let Ok(proto) = ModelProto::decode(&bytes[..]) {
        if let Some(ex) = classify(&proto) {
            return Outcome::Excluded(ex);
        }
    }
    let model = match tracejit_onnx::import_bytes(&bytes) {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    sets.sort();
    for set in sets {
        let load = |prefix: &str| -> Result<Vec<tracejit_trace::Tensor>, Error> {
            let mut out = Vec::new();
            for k in 0.. {
                let p = set.join(format!("{prefix}_{k}.pb"));
                if !p.exists() {
                    break;
                }
                out.push(tracejit_onnx::load_tensor(&p)?);
            }
            Ok(out)
        };
        let (inputs, expected) = match (load("input"), load("output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return fail(&e),
        };
        let got = match model.run(&inputs) {
            Ok(g) => g,
            Err(e) => return fail(&e),
        };
        if got.len() != expected.len() {
            return Outcome::Fail(
                "wrong output count".into(),
                format!("{} outputs instead of {}", got.len(), expected.len()),
            );
        }
        for (k, (g, w)) in got.iter().zip(&expected).enumerate() {
            if let Some(m) = mismatch(g, w) {
                let kind = m.split(':').next().unwrap_or(&m).split(" (").next().unwrap_or(&m).to_string();
                return Outcome::Fail(kind, format!("output {k}: {m}"));
            }
        }
    }
    Outcome::Pass
}

/// Every test directory: (family, name, path).
fn collect(root: &Path, filter: Option<&str>) -> Vec<(String, String, PathBuf)> {
    let mut tests = Vec::new();
    for family in FAMILIES {
        let Ok(rd) = std::fs::read_dir(root.join(family)) else { continue };
        let mut dirs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.join("model.onnx").exists()).collect();
        dirs.sort();
        for d in dirs {
            let name = d.file_name().unwrap_or_default().to_string_lossy().to_string();
            if filter.is_none_or(|f| format!("{family}/{name}").contains(f)) {
                tests.push((family.to_string(), name, d));
            }
        }
    }
    tests
}

/// Runs the tests on worker threads, each under `catch_quietly` and a
/// timeout (a test past it is recorded as timed out; its thread is left
/// to finish on its own).
fn run_all(tests: &[(String, String, PathBuf)]) -> Vec<Outcome> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).max(1);
    let (tx, rx) = mpsc::channel::<(usize, Outcome)>();
    let mut results: Vec<Option<Outcome>> = vec![None; tests.len()];
    let mut next = 0;
    let mut running: BTreeMap<usize, Instant> = BTreeMap::new();
    while next < tests.len() || !running.is_empty() {
        while running.len() < workers && next < tests.len() {
            let (i, dir, tx) = (next, tests[next].2.clone(), tx.clone());
            std::thread::Builder::new()
                .name(tests[i].1.clone())
                .stack_size(64 << 20)
                .spawn(move || {
                    let outcome = tracejit_ir::catch_quietly(|| run_test(&dir)).unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Outcome::Fail("PANIC (a bug)".into(), msg)
                    });
                    let _ = tx.send((i, outcome));
                })
                .expect("spawn a test thread");
            running.insert(i, Instant::now());
            next += 1;
        }
        let oldest = running.values().min().copied().unwrap_or_else(Instant::now);
        let wait = TIMEOUT.saturating_sub(oldest.elapsed()).max(Duration::from_millis(1));
        match rx.recv_timeout(wait) {
            Ok((i, outcome)) => {
                if running.remove(&i).is_some() {
                    results[i] = Some(outcome);
                }
            }
            Err(_) => {
                let late: Vec<usize> =
                    running.iter().filter(|(_, t)| t.elapsed() >= TIMEOUT).map(|(&i, _)| i).collect();
                for i in late {
                    running.remove(&i);
                    results[i] = Some(Outcome::Fail("TIMEOUT".into(), format!("over {TIMEOUT:?}")));
                }
            }
        }
    }
    results.into_iter().map(|r| r.expect("every test has an outcome")).collect()
}

/// The list: test key (`family/name`) to reason.
fn read_list(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((k, r)) => (k.to_string(), r.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

fn write_list(path: &Path, failures: &BTreeMap<String, String>) {
    let mut text = String::from(
        "# Tests of ONNX's conformance suite (onnx 1.22.0) the importer fails today, with the reason.\n\
         # tests/onnx/conformance/mod.rs fails when a test not listed here fails, or a listed one passes:\n\
         # delete a line when its test passes. Regenerate with TRACEJIT_CONFORMANCE_BLESS=1.\n",
    );
    for (k, r) in failures {
        text.push_str(&format!("{k}\t{r}\n"));
    }
    std::fs::write(path, text).expect("write the expected-failures list");
}

fn report(tests: &[(String, String, PathBuf)], outcomes: &[Outcome]) {
    for family in FAMILIES {
        let mine: Vec<(&(String, String, PathBuf), &Outcome)> =
            tests.iter().zip(outcomes).filter(|(t, _)| t.0 == family).collect();
        if mine.is_empty() {
            continue;
        }
        let counted: Vec<_> = mine.iter().filter(|(_, o)| !matches!(o, Outcome::Excluded(_))).collect();
        let passed = counted.iter().filter(|(_, o)| matches!(o, Outcome::Pass)).count();
        let rate = if counted.is_empty() { 100.0 } else { 100.0 * passed as f64 / counted.len() as f64 };
        println!("\n== {family}: {passed} / {} passed ({rate:.1}%)", counted.len());
        let mut excluded: BTreeMap<&str, usize> = BTreeMap::new();
        let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (t, o) in &mine {
            match o {
                Outcome::Excluded(e) => *excluded.entry(e.name()).or_default() += 1,
                Outcome::Fail(r, _) => reasons.entry(r).or_default().push(&t.1),
                Outcome::Pass => {}
            }
        }
        if !excluded.is_empty() {
            let parts: Vec<String> = excluded.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("   excluded by the milestone (not counted): {}", parts.join(", "));
        }
        let mut by_count: Vec<_> = reasons.into_iter().collect();
        by_count.sort_by_key(|(r, names)| (std::cmp::Reverse(names.len()), *r));
        for (r, names) in by_count {
            let shown: Vec<&str> = names.iter().take(4).copied().collect();
            let more = if names.len() > 4 { format!(", +{}", names.len() - 4) } else { String::new() };
            println!("   {:4}  {r}  [{}{more}]", names.len(), shown.join(", "));
        }
    }
}

#[test]
#[ignore = "needs ONNX's test data: scripts/fetch_test_data.sh"]
fn onnx_backend_conformance() {
    let root = data_dir();
    assert!(
        root.join(".complete").exists(),
        "ONNX's test data is not in {}: run scripts/fetch_test_data.sh first (TRACEJIT_TEST_DATA sets the cache root)",
        root.display()
    );
    let filter = std::env::var("TRACEJIT_CONFORMANCE_FILTER").ok();
    let tests = collect(&root, filter.as_deref());
    assert!(!tests.is_empty(), "no tests found under {} (filter {filter:?})", root.display());
    let started = Instant::now();
    let outcomes = run_all(&tests);
    report(&tests, &outcomes);
    println!("\n{} tests in {:.0?}", tests.len(), started.elapsed());

    let list_path = Path::new(env!("CARGO_MANIFEST_DIR")).join(LIST);
    let listed = read_list(&list_path);
    let mut failures = BTreeMap::new();
    let mut ran = BTreeSet::new();
    for (t, o) in tests.iter().zip(&outcomes) {
        let key = format!("{}/{}", t.0, t.1);
        if let Outcome::Fail(r, detail) = o {
            failures.insert(key.clone(), format!("{r} -- {}", detail.lines().next().unwrap_or("")));
        }
        ran.insert(key);
    }
    if std::env::var_os("TRACEJIT_CONFORMANCE_BLESS").is_some() {
        let mut all = if filter.is_some() { listed.clone() } else { BTreeMap::new() };
        all.retain(|k, _| !ran.contains(k));
        all.extend(failures.iter().map(|(k, r)| (k.clone(), r.clone())));
        write_list(&list_path, &all);
        println!("wrote {} entries to {}", all.len(), list_path.display());
        return;
    }
    let unexpected: Vec<String> =
        failures.iter().filter(|(k, _)| !listed.contains_key(*k)).map(|(k, r)| format!("  {k}: {r}")).collect();
    let fixed: Vec<&String> = listed.keys().filter(|k| ran.contains(*k) && !failures.contains_key(*k)).collect();
    assert!(
        unexpected.is_empty() && fixed.is_empty(),
        "{} test(s) fail that {LIST} does not list:\n{}\n{} listed test(s) now pass (delete their lines): {fixed:?}",
        unexpected.len(),
        unexpected.join("\n"),
        fixed.len(),
    );
}
