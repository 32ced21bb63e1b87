//! The persistent compile cache across processes: each case runs this test
//! binary again as child processes (`child_compiles_the_regions` alone) with
//! `TRACEJIT_COMPILE_CACHE` set, and reads what they report — the cache
//! counts, the warnings, and a digest of every output's bits. Code loaded
//! from the cache is the code compiled, so the digests must be equal bit
//! for bit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tracejit_ir::tensor::{kernels, Storage};
use tracejit_ir::Graph;

/// Region bodies of several kinds: staged chunk calls (`tanh`, and `erf`
/// where the CPU has vector code), in-line polynomials with vector
/// constants (`exp` unstaged in f64),
/// element helpers (`sin` f64, `log1p`), row and column reductions, casts
/// and selects.
const REGIONS: [&str; 7] = [
    include_str!("../lowering/gelu.tj"),
    include_str!("../lowering/softmax.tj"),
    include_str!("../lowering/bias_grad.tj"),
    include_str!("../lowering/broadcast_clamp.tj"),
    "graph a(%0: f32[?, 24]) -> (%2) {\n  %1 = erf %0 : f32[?, 24]\n  %2 = log1p %1 : f32[?, 24]\n}",
    "graph b(%0: f64[?, 9]) -> (%2) {\n  %1 = sin %0 : f64[?, 9]\n  %2 = exp %1 : f64[?, 9]\n}",
    "graph c(%0: f32[?, 33], %1: f32[33]) -> (%3) {\n  %2 = sub %0, %1 : f32[?, 33]\n  %3 = sigmoid %2 : f32[?, 33]\n}",
];

/// Deterministic inputs of `body`'s types (unknown dims 7), with NaN, Inf
/// and signed zeros among them.
fn inputs(body: &Graph) -> Vec<Storage> {
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 1e-30, -88.5, 30.0];
    body.param_types()
        .iter()
        .enumerate()
        .map(|(p, t)| {
            let shape: Vec<usize> = t.dims.iter().map(|d| d.unwrap_or(7)).collect();
            let n: usize = shape.iter().product();
            let values: Vec<f64> = (0..n)
                .map(|i| match (i * 7 + p) % 23 {
                    k if k < specials.len() => specials[k],
                    k => ((i as f64) * 0.37 + k as f64).sin() * 4.0,
                })
                .collect();
            let x = Storage::from_vec(values, &shape).unwrap();
            kernels::cast(&x, t.dtype)
        })
        .collect()
}

/// FNV-1a over the bits of every output (as f64, which holds every f32,
/// i32 and bool exactly, NaN payloads included).
fn digest(outs: &[Storage], h: &mut u64) {
    for o in outs {
        for x in kernels::cast(o, tracejit_ir::tensor::DType::F64).to_vec::<f64>().unwrap() {
            for b in x.to_bits().to_le_bytes() {
                *h ^= u64::from(b);
                *h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}

/// Collects `log` warnings, printed for the parent to read.
struct Warnings(Mutex<()>);

impl log::Log for Warnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let _guard = self.0.lock();
            println!("WARN {}", record.args());
        }
    }
    fn flush(&self) {}
}

static WARNINGS: Warnings = Warnings(Mutex::new(()));

/// Run by the cases below in a child process (`CACHE_CHILD=1`): compiles
/// and runs every region, then reports the counts and the digest.
#[test]
fn child_compiles_the_regions() {
    if std::env::var_os("CACHE_CHILD").is_none() {
        return;
    }
    log::set_logger(&WARNINGS).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for text in REGIONS {
        let body = Graph::parse(text).unwrap();
        let region = tracejit_jit::compile_region(&body).unwrap();
        let xs = inputs(&body);
        let refs: Vec<&Storage> = xs.iter().collect();
        digest(&region.run(&refs), &mut h);
    }
    let st = tracejit_jit::compile_cache::compile_cache_stats();
    println!("STATS hits={} misses={}", st.hits, st.misses);
    println!("DIGEST {h:016x}");
}

/// What one child reported.
#[derive(Debug)]
struct Report {
    hits: u64,
    misses: u64,
    digest: String,
    warnings: Vec<String>,
}

fn child(dir: &Path, isa: Option<&str>) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    let name = crate::common::test_name(module_path!(), "child_compiles_the_regions");
    c.args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env("CACHE_CHILD", "1")
        .env("TRACEJIT_COMPILE_CACHE", dir)
        .env_remove("TRACEJIT_JIT_DUMP")
        .env_remove("TRACEJIT_COMPILE_CACHE_LIMIT");
    match isa {
        Some(isa) => c.env("TRACEJIT_ISA", isa),
        None => c.env_remove("TRACEJIT_ISA"),
    };
    c
}

fn report(out: Output) -> Report {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // The harness prints the test's name on the line of the first output.
    let after = |l: &'_ str, tag: &str| l.split_once(tag).map(|(_, rest)| rest.to_string());
    let line = |tag: &str| stdout.lines().find_map(|l| after(l, tag)).unwrap_or_else(|| panic!("{stdout}"));
    let stats = line("STATS ");
    let field = |name: &str| -> u64 { stats.split(' ').find_map(|kv| kv.strip_prefix(name)).unwrap().parse().unwrap() };
    Report {
        hits: field("hits="),
        misses: field("misses="),
        digest: line("DIGEST "),
        warnings: stdout.lines().filter_map(|l| after(l, "WARN ")).collect(),
    }
}

fn run(dir: &Path, isa: Option<&str>) -> Report {
    report(child(dir, isa).output().unwrap())
}

/// [`run`] with the cache bounded to `limit` bytes.
fn run_with_limit(dir: &Path, limit: u64) -> Report {
    report(child(dir, None).env("TRACEJIT_COMPILE_CACHE_LIMIT", limit.to_string()).output().unwrap())
}

/// A fresh directory under the target directory's temp area.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracejit-cache-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tjk"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_process_runs_what_the_first_compiled() {
    let dir = temp_dir("second");
    let first = run(&dir, None);
    assert!(first.misses > 0 && first.hits == 0, "{first:?}");
    assert_eq!(entries(&dir).len() as u64, first.misses);
    let second = run(&dir, None);
    assert_eq!((second.hits, second.misses), (first.misses, 0), "{second:?}");
    assert_eq!(second.digest, first.digest, "cached code computed other bits");
    assert!(second.warnings.is_empty(), "{:?}", second.warnings);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_entries_are_recompiled_and_replaced() {
    let dir = temp_dir("damaged");
    let first = run(&dir, None);
    let files = entries(&dir);
    assert!(files.len() >= 5, "{files:?}");
    // Truncated, a flipped bit in the code, another entry's bytes under
    // this one's name, garbage, and an empty file.
    let bytes: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    std::fs::write(&files[0], &bytes[0][..bytes[0].len() / 2]).unwrap();
    let mut flipped = bytes[1].clone();
    let at = flipped.len() - 40;
    flipped[at] ^= 0x04;
    std::fs::write(&files[1], flipped).unwrap();
    std::fs::write(&files[2], &bytes[3]).unwrap();
    std::fs::write(&files[3], b"not a kernel at all").unwrap();
    std::fs::write(&files[4], b"").unwrap();
    let damaged = run(&dir, None);
    assert_eq!(damaged.digest, first.digest);
    assert_eq!((damaged.misses, damaged.hits), (5, first.misses - 5), "{damaged:?}");
    let all = damaged.warnings.join("\n");
    for expected in ["truncated", "checksum mismatch", "its key is not the one looked up", "bad magic"] {
        assert!(all.contains(expected), "no warning names `{expected}`:\n{all}");
    }
    assert_eq!(damaged.warnings.len(), 5, "{all}");
    // Recompiled entries were written back.
    let third = run(&dir, None);
    assert_eq!((third.hits, third.misses), (first.misses, 0), "{third:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_processes_filling_one_cache_corrupt_nothing() {
    let dir = temp_dir("concurrent");
    for round in 0..3 {
        let _ = std::fs::remove_dir_all(&dir);
        let a = child(&dir, None).spawn_and_collect();
        let b = child(&dir, None).spawn_and_collect();
        let (a, b) = (report(a.wait_with_output().unwrap()), report(b.wait_with_output().unwrap()));
        assert_eq!(a.digest, b.digest, "round {round}");
        assert!(a.warnings.is_empty() && b.warnings.is_empty(), "{a:?} {b:?}");
        let after = run(&dir, None);
        assert_eq!((after.misses, after.digest.as_str()), (0, a.digest.as_str()), "round {round}: {after:?}");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn bytes_in(files: &[PathBuf]) -> u64 {
    files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum()
}

/// Past its size limit the cache removes the least recently used entries
/// (oldest modification time first) down to 90% of the limit: ten planted
/// entries last used an hour ago go, oldest first, and the kernels the
/// process just compiled stay, so the next process finds every one.
#[test]
fn a_size_limit_evicts_the_least_recently_used_entries() {
    // What the regions' kernels weigh.
    let sizing = temp_dir("limit-sizing");
    let reference = run(&sizing, None);
    let compiled = bytes_in(&entries(&sizing));
    std::fs::remove_dir_all(&sizing).unwrap();

    // Ten older entries of half that each, planted k was last used an hour
    // ago plus k seconds; the limit holds the new kernels and some of them.
    let dir = temp_dir("limit");
    std::fs::create_dir_all(&dir).unwrap();
    let base = SystemTime::now() - Duration::from_secs(3600);
    let planted: Vec<PathBuf> = (0..10u64)
        .map(|k| {
            let p = dir.join(format!("old-{k:02}.tjk"));
            std::fs::write(&p, vec![0u8; (compiled / 2) as usize]).unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(base + Duration::from_secs(k)).unwrap();
            p
        })
        .collect();
    let limit = compiled * 7 / 2;
    let filled = run_with_limit(&dir, limit);
    assert_eq!((filled.misses, filled.hits), (reference.misses, 0), "{filled:?}");
    assert_eq!(filled.digest, reference.digest);

    let gone = planted.iter().take_while(|p| !p.exists()).count();
    assert!(gone > 0, "nothing was evicted: {} bytes under a limit of {limit}", bytes_in(&entries(&dir)));
    assert!(gone < planted.len(), "eviction went past 90% of the limit: every planted entry is gone");
    for p in &planted[gone..] {
        assert!(p.exists(), "{} was evicted before an older entry", p.display());
    }
    let left = entries(&dir);
    assert!(bytes_in(&left) <= limit, "{} bytes left under a limit of {limit}", bytes_in(&left));
    assert_eq!(left.len() as u64, (planted.len() - gone) as u64 + reference.misses, "{left:?}");

    // The newest entries, the ones just compiled, all stayed.
    let again = run_with_limit(&dir, limit);
    assert_eq!((again.hits, again.misses), (reference.misses, 0), "{again:?}");
    assert_eq!(again.digest, reference.digest);
    std::fs::remove_dir_all(&dir).unwrap();
}

trait SpawnAndCollect {
    fn spawn_and_collect(&mut self) -> std::process::Child;
}

impl SpawnAndCollect for Command {
    fn spawn_and_collect(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}

/// Code compiled for AVX-512 is not taken for a process forced to AVX2,
/// and the reverse: each compiles its own, and both stay cached.
#[test]
fn a_forced_avx2_process_never_runs_avx512_code() {
    let dir = temp_dir("isa");
    let wide = run(&dir, None);
    let narrow = run(&dir, Some("avx2"));
    let host_avx512 = {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    };
    if host_avx512 {
        assert_eq!((narrow.hits, narrow.misses), (0, wide.misses), "{narrow:?}");
        assert_eq!(entries(&dir).len() as u64, 2 * wide.misses);
    } else {
        // Without AVX-512 both processes compile the same AVX2 code.
        assert_eq!((narrow.hits, narrow.misses), (wide.misses, 0), "{narrow:?}");
    }
    let wide_again = run(&dir, None);
    assert_eq!((wide_again.misses, &wide_again.digest), (0, &wide.digest));
    let narrow_again = run(&dir, Some("avx2"));
    assert_eq!((narrow_again.misses, &narrow_again.digest), (0, &narrow.digest));
    std::fs::remove_dir_all(&dir).unwrap();
}
