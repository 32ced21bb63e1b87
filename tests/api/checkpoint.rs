//! Checkpoints through the public surface: a round trip of every dtype,
//! keys by first path, all-or-nothing restore with one error that lists
//! every problem, corrupt and truncated files, and atomic writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tracejit::checkpoint::{self, CheckpointError, TensorMismatch};
use tracejit::prelude::*;

/// A fresh, empty directory under the system's temp dir (removed on drop).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tracejit-checkpoint-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Absolute, so one test changing the working directory cannot move it.
        TempDir(dir.canonicalize().unwrap())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Module)]
struct Dense {
    w: Variable,
    b: Variable,
}

#[derive(Module)]
struct AllDtypes {
    f32s: Variable,
    f64s: Variable,
    i32s: Variable,
    i64s: Variable,
    bools: Variable,
    scalar: Variable,
    empty: Variable,
    layers: Vec<Dense>,
    by_key: BTreeMap<String, Variable>,
}

fn all_dtypes(seed: i32) -> AllDtypes {
    let s = seed as f32;
    let mut by_key = BTreeMap::new();
    by_key.insert("gain".to_string(), Variable::new(Tensor::from_vec(vec![s, 2.0 * s], &[2])));
    AllDtypes {
        f32s: Variable::new(Tensor::from_vec(vec![s, -1.5, f32::MAX, f32::MIN_POSITIVE, 0.1, -0.0], &[2, 3])),
        f64s: Variable::new(Tensor::from_vec(vec![s as f64 * 1e-300, std::f64::consts::PI, -2.0], &[3])),
        i32s: Variable::new(Tensor::from_vec(vec![seed, i32::MIN, i32::MAX, -7], &[2, 2])),
        i64s: Variable::new(Tensor::from_vec(vec![seed as i64, i64::MIN, i64::MAX], &[3, 1])),
        bools: Variable::new(Tensor::from_vec(vec![seed % 2 == 0, true, false, true, false], &[5])),
        scalar: Variable::new(Tensor::scalar(s * 10.0)),
        empty: Variable::new(Tensor::zeros(&[0, 4], DType::F32)),
        layers: vec![
            Dense {
                w: Variable::new(Tensor::full(&[2, 2], s as f64, DType::F32)),
                b: Variable::new(Tensor::zeros(&[2], DType::F32)),
            },
            Dense {
                w: Variable::new(Tensor::full(&[2, 1], 3.0 * s as f64, DType::F32)),
                b: Variable::new(Tensor::ones(&[1], DType::F32)),
            },
        ],
        by_key,
    }
}

/// Every variable's value, bit for bit, by path.
fn snapshot(m: &dyn Module) -> Vec<(String, DType, Vec<usize>, Vec<u64>)> {
    m.named_variables()
        .into_iter()
        .map(|(p, v)| {
            let t = v.value();
            let bits: Vec<u64> = match v.dtype() {
                DType::F32 => t.to_vec::<f32>().unwrap().into_iter().map(|x| x.to_bits() as u64).collect(),
                DType::F64 => t.to_vec::<f64>().unwrap().into_iter().map(f64::to_bits).collect(),
                DType::I32 => t.to_vec::<i32>().unwrap().into_iter().map(|x| x as u32 as u64).collect(),
                DType::I64 => t.to_vec::<i64>().unwrap().into_iter().map(|x| x as u64).collect(),
                DType::Bool => t.to_vec::<bool>().unwrap().into_iter().map(u64::from).collect(),
                // Widening to f64 is exact and keeps distinct values distinct.
                DType::BF16 | DType::F16 => {
                    t.cast(DType::F64).to_vec::<f64>().unwrap().into_iter().map(f64::to_bits).collect()
                }
                // Widening (or u64's identity) keeps every value.
                DType::U64 => t.to_vec::<u64>().unwrap(),
                _ => t.cast(DType::I64).to_vec::<i64>().unwrap().into_iter().map(|x| x as u64).collect(),
            };
            (p, v.dtype(), v.shape().to_vec(), bits)
        })
        .collect()
}

#[test]
fn round_trip_of_every_dtype() {
    let dir = TempDir::new("round-trip");
    let path = dir.file("model.safetensors");
    let saved = all_dtypes(4);
    checkpoint::save(&saved, &path).unwrap();
    let target = all_dtypes(-9);
    assert_ne!(snapshot(&saved), snapshot(&target));
    checkpoint::restore(&target, &path).unwrap();
    assert_eq!(snapshot(&saved), snapshot(&target));
    assert_eq!(dir.entries(), ["model.safetensors"], "no temporary file is left behind");
}

#[test]
fn keys_are_variable_paths_and_dtypes_are_kept() {
    let dir = TempDir::new("keys");
    let path = dir.file("m.safetensors");
    let m = all_dtypes(1);
    checkpoint::save(&m, &path).unwrap();
    let tensors = checkpoint::read(&path).unwrap();
    let keys: Vec<&str> = tensors.keys().map(String::as_str).collect();
    let mut expected: Vec<String> = m.named_variables().into_iter().map(|(p, _)| p).collect();
    expected.sort();
    assert_eq!(keys, expected);
    assert!(tensors.contains_key("layers[1].w") && tensors.contains_key(r#"by_key["gain"]"#));
    assert_eq!(tensors["bools"].dtype(), DType::Bool);
    assert_eq!(tensors["i64s"].dtype(), DType::I64);
    assert_eq!(tensors["i64s"].shape(), &[3, 1]);
    assert_eq!(tensors["i64s"].to_vec::<i64>().unwrap(), vec![1, i64::MIN, i64::MAX]);
    assert_eq!(tensors["scalar"].shape(), &[] as &[usize]);
    assert_eq!(tensors["empty"].shape(), &[0, 4]);
}

#[derive(Module)]
struct Shared {
    first: Dense,
    second: Dense,
}

#[test]
fn a_variable_with_two_paths_is_stored_once_under_its_first_path() {
    let dir = TempDir::new("shared");
    let path = dir.file("shared.safetensors");
    let d =
        Dense { w: Variable::new(Tensor::ones(&[2], DType::F32)), b: Variable::new(Tensor::ones(&[1], DType::F32)) };
    let m = Shared { first: Dense { w: d.w.clone(), b: d.b.clone() }, second: d };
    checkpoint::save(&m, &path).unwrap();
    let keys: Vec<String> = checkpoint::read(&path).unwrap().into_keys().collect();
    assert_eq!(keys, ["first.b", "first.w"]);
    m.second.w.assign(&Tensor::zeros(&[2], DType::F32));
    checkpoint::restore(&m, &path).unwrap();
    assert_eq!(m.first.w.value().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
}

#[derive(Module)]
struct Saved {
    keep: Variable,
    gone: Variable,
    reshape: Variable,
    retype: Variable,
}

#[derive(Module)]
struct Loaded {
    keep: Variable,
    reshape: Variable,
    retype: Variable,
    added: Variable,
}

#[test]
fn restore_reports_every_problem_at_once_and_changes_nothing() {
    let dir = TempDir::new("mismatch");
    let path = dir.file("ckpt.safetensors");
    let saved = Saved {
        keep: Variable::new(Tensor::ones(&[2], DType::F32)),
        gone: Variable::new(Tensor::ones(&[1], DType::F32)),
        reshape: Variable::new(Tensor::ones(&[2, 3], DType::F32)),
        retype: Variable::new(Tensor::ones(&[2], DType::F64)),
    };
    checkpoint::save(&saved, &path).unwrap();
    let loaded = Loaded {
        keep: Variable::new(Tensor::zeros(&[2], DType::F32)),
        reshape: Variable::new(Tensor::zeros(&[3, 2], DType::F32)),
        retype: Variable::new(Tensor::zeros(&[2], DType::F32)),
        added: Variable::new(Tensor::zeros(&[4], DType::I32)),
    };
    let before = snapshot(&loaded);
    let err = checkpoint::restore(&loaded, &path).unwrap_err();
    assert_eq!(snapshot(&loaded), before, "nothing changed, not even `keep`");
    let msg = err.to_string();
    for word in ["`added`", "`gone`", "`reshape`", "`retype`", "nothing was restored"] {
        assert!(msg.contains(word), "{word} in {msg}");
    }
    match err {
        CheckpointError::Mismatch { missing, unexpected, mismatched, path: p } => {
            assert_eq!(p, path);
            assert_eq!(missing, ["added"]);
            assert_eq!(unexpected, ["gone"]);
            let tm = |key: &str, shape: &[usize], found_dtype: &str, found_shape: &[usize]| TensorMismatch {
                key: key.into(),
                expected_dtype: DType::F32,
                expected_shape: shape.to_vec(),
                found_dtype: found_dtype.into(),
                found_shape: found_shape.to_vec(),
            };
            assert_eq!(mismatched, [tm("reshape", &[3, 2], "F32", &[2, 3]), tm("retype", &[2], "F64", &[2])]);
        }
        other => panic!("expected Mismatch, got {other}"),
    }
}

#[test]
fn truncated_and_random_files_are_errors_and_change_nothing() {
    let dir = TempDir::new("corrupt");
    let good = dir.file("good.safetensors");
    let m = all_dtypes(2);
    checkpoint::save(&m, &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let target = all_dtypes(5);
    let before = snapshot(&target);
    let bad = dir.file("bad.safetensors");
    for cut in [0, 1, 7, 8, 9, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&bad, &bytes[..cut]).unwrap();
        let err = checkpoint::restore(&target, &bad).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "cut at {cut}: {err}");
        assert!(checkpoint::read(&bad).is_err());
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for len in [3usize, 8, 16, 100, 4096] {
        let noise: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect();
        std::fs::write(&bad, &noise).unwrap();
        assert!(checkpoint::restore(&target, &bad).is_err(), "{len} random bytes");
    }
    // A plausible header that lies about the data.
    let header = br#"{"f32s":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
    let mut lying = (header.len() as u64).to_le_bytes().to_vec();
    lying.extend_from_slice(header);
    lying.extend_from_slice(&[0; 8]);
    std::fs::write(&bad, &lying).unwrap();
    assert!(matches!(checkpoint::restore(&target, &bad), Err(CheckpointError::Corrupt { .. })));
    assert_eq!(snapshot(&target), before);
    let missing = checkpoint::restore(&target, dir.file("no-such-file.safetensors")).unwrap_err();
    assert!(matches!(missing, CheckpointError::Io { action: "reading", .. }), "{missing}");
}

#[test]
fn save_replaces_atomically_and_leaves_no_temporary_file() {
    let dir = TempDir::new("atomic");
    let path = dir.file("m.safetensors");
    let m = all_dtypes(1);
    checkpoint::save(&m, &path).unwrap();
    m.layers[0].w.assign(&Tensor::full(&[2, 2], 42.0, DType::F32));
    checkpoint::save(&m, &path).unwrap();
    assert_eq!(dir.entries(), ["m.safetensors"]);
    assert_eq!(checkpoint::read(&path).unwrap()["layers[0].w"].to_vec::<f32>().unwrap(), vec![42.0; 4]);

    // A failing write (the target is a directory) leaves the directory as it was.
    let blocked = dir.file("blocked");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("inside"), b"x").unwrap();
    let err = checkpoint::save(&m, &blocked).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
    assert_eq!(dir.entries(), ["blocked", "m.safetensors"], "the temporary file was removed");

    // A missing directory is an error, not a panic.
    assert!(checkpoint::save(&m, dir.file("no/such/dir/m.safetensors")).is_err());
}

#[test]
fn a_relative_path_in_the_current_directory_works() {
    // The working directory is process-wide and this binary's other tests
    // read files by relative paths, so the change happens in a child.
    let dir = TempDir::new("relative");
    if let Some(target) = std::env::var_os("TRACEJIT_CWD_CHILD") {
        let m = all_dtypes(3);
        std::env::set_current_dir(target).unwrap();
        checkpoint::save(&m, "plain.safetensors").unwrap();
        checkpoint::restore(&m, Path::new("plain.safetensors")).unwrap();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args(["checkpoint::a_relative_path_in_the_current_directory_works", "--exact", "--nocapture"])
        .env("TRACEJIT_CWD_CHILD", &dir.0)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(dir.entries(), ["plain.safetensors"]);
}

#[test]
fn a_restored_module_drives_a_compiled_function_again() {
    let dir = TempDir::new("function");
    let path = dir.file("dense.safetensors");
    let layer = Dense {
        w: Variable::new(Tensor::from_vec(vec![1.0f32, -2.0, 0.5, 4.0], &[2, 2])),
        b: Variable::new(Tensor::from_vec(vec![0.25f32, -0.25], &[2])),
    };
    let (w, b) = (layer.w.clone(), layer.b.clone());
    let f = function(move |x: Tensor| (x.matmul(&w.read()) + b.read()).relu());
    let x = Tensor::from_vec(vec![1.0f32, 2.0, -1.0, 0.5], &[2, 2]);
    let before = f.call(x.clone()).unwrap().to_vec::<f32>().unwrap();
    checkpoint::save(&layer, &path).unwrap();
    layer.w.assign(&Tensor::ones(&[2, 2], DType::F32));
    assert_ne!(f.call(x.clone()).unwrap().to_vec::<f32>().unwrap(), before);
    checkpoint::restore(&layer, &path).unwrap();
    assert_eq!(f.call(x).unwrap().to_vec::<f32>().unwrap(), before);
    assert_eq!(f.tracing_count(), 1);
}

/// A xorshift stream for the corruption tests.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Where the data region of a safetensors file starts (after the 8-byte
/// header length and the header).
fn data_start(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn every_bit_flip_in_the_data_is_refused_and_changes_nothing() {
    // Issue #17 failure 6: 307 of 3,000 flips used to restore silently.
    let dir = TempDir::new("bitflip");
    let good = dir.file("good.safetensors");
    checkpoint::save(&all_dtypes(2), &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let header = String::from_utf8_lossy(&bytes[8..data_start(&bytes)]).into_owned();
    assert!(header.contains(r#""tracejit.checksums":"crc32""#), "{header}");
    assert!(header.contains(r#""tracejit.crc32.layers[0].w":""#), "{header}");
    let start = data_start(&bytes);
    let target = all_dtypes(5);
    let before = snapshot(&target);
    let bad = dir.file("bad.safetensors");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..3000 {
        let mut b = bytes.clone();
        let at = start + xorshift(&mut seed) as usize % (bytes.len() - start);
        b[at] ^= 1 << (xorshift(&mut seed) % 8);
        std::fs::write(&bad, &b).unwrap();
        let err = checkpoint::restore(&target, &bad).unwrap_err();
        assert!(matches!(err, CheckpointError::Checksum { .. }), "flip {i} at byte {at}: {err}");
        assert!(err.to_string().contains("is corrupt") && err.to_string().contains("nothing was restored"));
        assert!(matches!(checkpoint::read(&bad), Err(CheckpointError::Checksum { .. })));
    }
    assert_eq!(snapshot(&target), before);
}

#[test]
fn a_bit_flip_in_the_header_never_restores_different_values() {
    let dir = TempDir::new("headerflip");
    let good = dir.file("good.safetensors");
    let m = all_dtypes(2);
    checkpoint::save(&m, &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let (saved, start) = (snapshot(&m), data_start(&bytes));
    let bad = dir.file("bad.safetensors");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..1000 {
        let mut b = bytes.clone();
        let at = 8 + xorshift(&mut seed) as usize % (start - 8);
        b[at] ^= 1 << (xorshift(&mut seed) % 8);
        std::fs::write(&bad, &b).unwrap();
        let target = all_dtypes(5);
        let before = snapshot(&target);
        match checkpoint::restore(&target, &bad) {
            // A flip in padding or in an unused metadata byte is harmless.
            Ok(()) => assert_eq!(snapshot(&target), saved, "a header flip at {at} restored other values"),
            Err(_) => assert_eq!(snapshot(&target), before),
        }
    }
}

/// One flipped bit in the `tracejit.checksums` key made the file pass for
/// another tool's, so a second flip in the data restored a wrong weight
/// (failure 10 of issue #28). Every key of the metadata is tried.
#[test]
fn a_damaged_marker_does_not_switch_the_checksums_off() {
    let dir = TempDir::new("marker");
    let good = dir.file("good.safetensors");
    checkpoint::save(&all_dtypes(2), &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let start = data_start(&bytes);
    let header = String::from_utf8_lossy(&bytes[8..start]).into_owned();
    let bad = dir.file("bad.safetensors");
    let mut keys = 0;
    for (at, _) in header.match_indices("\"tracejit.") {
        keys += 1;
        let mut b = bytes.clone();
        // `t` (0x74) -> `u` (0x75): still valid JSON, another key.
        b[8 + at + 1] ^= 1;
        b[start] ^= 0x10;
        std::fs::write(&bad, &b).unwrap();
        let target = all_dtypes(5);
        let before = snapshot(&target);
        let err = checkpoint::restore(&target, &bad).unwrap_err();
        assert!(err.to_string().contains("nothing was restored"), "{err}");
        assert!(checkpoint::read(&bad).is_err());
        assert_eq!(snapshot(&target), before);
    }
    assert!(keys >= 3, "{header}");
}

/// A safetensors file as another tool writes it: no tracejit metadata.
fn foreign_file(metadata: &str) -> Vec<u8> {
    let header = format!(
        r#"{{{metadata}"w":{{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}},"b":{{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}}}"#
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for v in [1.0f32, 2.0, 3.0, 4.0, -1.0, -2.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes
}

#[test]
fn files_from_other_tools_load_without_checksums() {
    let dir = TempDir::new("foreign");
    let path = dir.file("other.safetensors");
    for metadata in ["", r#""__metadata__":{"format":"pt"},"#] {
        std::fs::write(&path, foreign_file(metadata)).unwrap();
        let d = Dense {
            w: Variable::new(Tensor::zeros(&[2, 2], DType::F32)),
            b: Variable::new(Tensor::zeros(&[2], DType::F32)),
        };
        checkpoint::restore(&d, &path).unwrap();
        assert_eq!(d.w.value().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(d.b.value().to_vec::<f32>().unwrap(), vec![-1.0, -2.0]);
        assert_eq!(checkpoint::read(&path).unwrap().len(), 2);
    }
    // A file that claims tracejit's checksums must have one per tensor.
    std::fs::write(&path, foreign_file(r#""__metadata__":{"tracejit.checksums":"crc32"},"#)).unwrap();
    let d = Dense {
        w: Variable::new(Tensor::zeros(&[2, 2], DType::F32)),
        b: Variable::new(Tensor::zeros(&[2], DType::F32)),
    };
    let err = checkpoint::restore(&d, &path).unwrap_err();
    assert!(matches!(err, CheckpointError::Checksum { .. }), "{err}");
    assert_eq!(d.w.value().to_vec::<f32>().unwrap(), vec![0.0; 4]);
}

#[cfg(unix)]
#[test]
fn saving_through_a_symlink_loop_is_an_error_and_keeps_the_links() {
    // Issue #17 failure 7: the link was replaced by a regular file.
    let dir = TempDir::new("symloop");
    let (a, b) = (dir.file("a.safetensors"), dir.file("b.safetensors"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let err = checkpoint::save(&all_dtypes(1), &a).unwrap_err();
    match &err {
        CheckpointError::Io { action, source, .. } => {
            assert_eq!(*action, "following the symlink");
            #[cfg(target_os = "linux")]
            assert_eq!(source.raw_os_error(), Some(40), "ELOOP: {source}");
        }
        other => panic!("expected an I/O error, got {other}"),
    }
    for link in [&a, &b] {
        assert!(std::fs::symlink_metadata(link).unwrap().file_type().is_symlink(), "{} was replaced", link.display());
    }
    assert_eq!(dir.entries(), ["a.safetensors", "b.safetensors"], "no temporary file is left");
    assert!(checkpoint::restore(&all_dtypes(1), &a).is_err());
}

/// `?` on checkpoint calls works in a function returning `tracejit::Result`
/// (DESIGN.md's form), and a failure arrives as `tracejit::Error` naming the
/// file.
#[test]
fn checkpoint_errors_convert_into_tracejit_errors() {
    let dir = TempDir::new("question-mark");
    let path = dir.file("m.safetensors");
    let round_trip = |p: &Path| -> tracejit::Result<()> {
        let m = all_dtypes(2);
        checkpoint::save(&m, p)?;
        checkpoint::restore(&m, p)?;
        Ok(())
    };
    round_trip(&path).unwrap();
    let missing = dir.file("absent/never.safetensors");
    let restore_missing = || -> tracejit::Result<()> {
        checkpoint::restore(&all_dtypes(2), &missing)?;
        Ok(())
    };
    let e = restore_missing().unwrap_err();
    assert!(matches!(e, tracejit::Error::Checkpoint { .. }), "{e}");
    assert!(e.to_string().contains("never.safetensors"), "{e}");
}
