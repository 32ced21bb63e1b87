//! A checkpoint or an ONNX model saved onto a full disk is an `Err` that
//! changes nothing: the previous file keeps its bytes and no temporary file
//! is left behind.
//!
//! A full disk is simulated with a file-size limit (`RLIMIT_FSIZE`, with
//! `SIGXFSZ` ignored so the write fails with `EFBIG` instead of killing the
//! process), set in a child process — this test binary run again with
//! `TRACEJIT_DISK_FULL_CHILD` naming the file — so the limit touches nothing
//! else.
#![cfg(target_os = "linux")]

use std::path::PathBuf;
use std::process::Command;

use tracejit::checkpoint;
use tracejit::prelude::*;

#[derive(Module)]
struct Net {
    w: Variable,
    b: Variable,
}

fn net(seed: u64) -> Net {
    // 64 KiB of weights: far past the child's 4 KiB limit.
    Net { w: Variable::new(Tensor::randn(&[128, 128], seed)), b: Variable::new(Tensor::randn(&[128], seed + 1)) }
}

const CHILD: &str = "TRACEJIT_DISK_FULL_CHILD";

/// Limits the files this process writes to 4 KiB, with `SIGXFSZ` ignored
/// so that a write past it fails with `EFBIG`.
fn limit_file_size() {
    // SAFETY: plain libc calls on a single-threaded child with valid
    // arguments; the limit is this process's own.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit { rlim_cur: 4096, rlim_max: libc::RLIM_INFINITY };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0, "setrlimit");
    }
}

/// The child of `a_full_disk_is_an_err_and_changes_nothing`.
#[test]
fn child_save_onto_a_full_disk() {
    let Some(path) = std::env::var_os(CHILD) else { return };
    limit_file_size();
    let e = checkpoint::save(&net(2), &path).expect_err("a save past the size limit must fail");
    let msg = e.to_string();
    assert!(msg.contains(&PathBuf::from(&path).display().to_string()), "names the file: {msg}");
}

#[test]
fn a_full_disk_is_an_err_and_changes_nothing() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(ONNX_CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracejit-disk-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("net.safetensors");
    let original = net(1);
    checkpoint::save(&original, &path).unwrap();
    let before = std::fs::read(&path).unwrap();

    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", "child_save_onto_a_full_disk", "--nocapture", "--test-threads=1"])
        .env(CHILD, &path)
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran its case");

    assert_eq!(std::fs::read(&path).unwrap(), before, "the previous checkpoint keeps its bytes");
    let entries: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(entries, vec!["net.safetensors".to_string()], "no temporary file is left behind");
    let restored = net(9);
    checkpoint::restore(&restored, &path).unwrap();
    assert_eq!(restored.w.read().to_vec::<f32>().unwrap(), original.w.read().to_vec::<f32>().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

const ONNX_CHILD: &str = "TRACEJIT_ONNX_DISK_FULL_CHILD";

/// A model whose initializer (64 KiB) is past the child's limit.
fn onnx_model(seed: u64) -> std::sync::Arc<ConcreteFunction> {
    let w = Variable::new(Tensor::randn(&[128, 128], seed));
    let f = function(move |x: Tensor| x.matmul(&w.read()));
    f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 128])).unwrap()
}

/// The child of `an_onnx_save_onto_a_full_disk_keeps_the_old_model`.
#[test]
fn child_onnx_save_onto_a_full_disk() {
    let Some(path) = std::env::var_os(ONNX_CHILD) else { return };
    limit_file_size();
    let e = tracejit::onnx::save(&onnx_model(2), &path).expect_err("a save past the size limit must fail");
    assert!(e.to_string().contains(&PathBuf::from(&path).display().to_string()), "names the file: {e}");
}

/// `onnx::save` under a file-size limit returned an `Err` but left a
/// truncated file where a valid model had been.
#[test]
fn an_onnx_save_onto_a_full_disk_keeps_the_old_model() {
    if std::env::var_os(ONNX_CHILD).is_some() || std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracejit-onnx-disk-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.onnx");
    tracejit::onnx::save(&onnx_model(1), &path).unwrap();
    let before = std::fs::read(&path).unwrap();

    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", "child_onnx_save_onto_a_full_disk", "--nocapture", "--test-threads=1"])
        .env(ONNX_CHILD, &path)
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran its case");

    assert_eq!(std::fs::read(&path).unwrap(), before, "the previous model keeps its bytes");
    let entries: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(entries, vec!["model.onnx".to_string()], "no temporary file is left behind");
    assert!(tracejit::onnx::decode(&before).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}
