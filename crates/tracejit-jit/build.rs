//! Computes `TRACEJIT_CODEGEN_HASH`: a digest of the source that decides
//! what machine code a kernel key compiles to (this crate's code generator,
//! the IR and op tables it lowers, the kernels crate whose functions it
//! calls by name and op index). The persistent compile cache and artifacts
//! record it, so code compiled by a different build of tracejit is never
//! taken for this one's, even when the version number did not change.

use std::path::{Path, PathBuf};

/// FNV-1a, 64 bits: stable across Rust releases (std's hasher is not
/// promised to be).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let crates = here.parent().map(Path::to_path_buf).unwrap_or_else(|| here.clone());
    let mut all = Vec::new();
    for name in ["tracejit-jit", "tracejit-kernels", "tracejit-tensor", "tracejit-ir"] {
        let src = crates.join(name).join("src");
        if src.is_dir() {
            println!("cargo:rerun-if-changed={}", src.display());
            files(&src, &mut all);
        }
    }
    all.sort();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in &all {
        let rel = p.strip_prefix(&crates).unwrap_or(p);
        h = fnv(h, rel.to_string_lossy().as_bytes());
        h = fnv(h, &std::fs::read(p).unwrap_or_default());
    }
    println!("cargo:rustc-env=TRACEJIT_CODEGEN_HASH={h:016x}");
}
