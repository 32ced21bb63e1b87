//! Replacing a file atomically: the bytes go to a temporary file in the
//! target's directory, which is flushed to disk (`fsync`) and renamed over
//! the target, and the directory is synced where the platform allows. A
//! crash or an error (a full disk, a file-size limit) leaves either the old
//! file or the new one, never a half-written file, and the temporary file
//! is removed on error. Checkpoints ([`crate::checkpoint::save`]) and ONNX
//! export (`tracejit::onnx::save`) write through it.
//!
//! Writing through a symlink replaces the file it points to (the link
//! stays; a symlink loop is the OS's `ELOOP` error and changes nothing),
//! the replaced file's permissions carry over, and temporary files left by
//! a crashed process (hidden, named after the target, the pid and a
//! counter) are skipped, never overwritten.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why [`write_atomically`] failed; the file named is the one asked for
/// (the temporary one is gone by the time the error is read).
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct WriteError {
    /// The file asked for.
    pub path: PathBuf,
    /// What was being done (`writing a temporary file next to it`, ...).
    pub action: &'static str,
    /// The OS's error.
    pub source: std::io::Error,
}

/// Attempts at a fresh temporary name before giving up (a name can be taken
/// by a file left behind by a crashed process that had the same pid).
const TEMP_ATTEMPTS: u64 = 64;

/// Counter of temporary names, so that threads of one process never collide.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The counter the next temporary name takes (tests leave stale files
/// under the next names).
#[cfg(test)]
pub(crate) fn next_temp_counter() -> u64 {
    TEMP_COUNTER.load(Ordering::Relaxed)
}

/// The temporary name for `file_name`: hidden, in the same directory.
pub(crate) fn temp_name(file_name: &std::ffi::OsStr, counter: u64) -> String {
    format!(".{}.{}.{}.tmp", file_name.to_string_lossy(), std::process::id(), counter)
}

/// Writes `bytes` to `path` through a temporary file in the same directory:
/// write, fsync, rename, fsync the directory (best effort). A symlink at
/// `path` is followed (the file it points to is replaced, the link stays),
/// and the replaced file's permissions carry over to the new one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let io = |p: &Path, action: &'static str| {
        let p = p.to_path_buf();
        move |source| WriteError { path: p, action, source }
    };
    // Renaming over a symlink would replace the link itself: write to the
    // file it points to (which need not exist yet).
    let mut target = path.to_path_buf();
    for _ in 0..40 {
        if !fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
            break;
        }
        let next = fs::read_link(&target).map_err(io(&target, "following the symlink"))?;
        target = match target.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
    }
    // A symlink loop (or a chain longer than the OS follows): let the OS
    // say so (ELOOP) rather than renaming over the last link.
    if fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
        let source = match fs::metadata(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => e,
            _ => std::io::Error::other("more than 40 levels of symbolic links"),
        };
        return Err(WriteError { path: path.to_path_buf(), action: "following the symlink", source });
    }
    let path = target.as_path();
    let file_name = path.file_name().ok_or_else(|| WriteError {
        path: path.to_path_buf(),
        action: "naming the file",
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path has no file name"),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let permissions = fs::metadata(path).ok().map(|m| m.permissions());
    let mut attempt = 0;
    let (tmp, mut f) = loop {
        let tmp = dir.join(temp_name(file_name, TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt + 1 < TEMP_ATTEMPTS => attempt += 1,
            Err(e) => return Err(io(path, "creating a temporary file next to it")(e)),
        }
    };
    // Errors name the file the user asked for; the temporary one is gone
    // by the time they read it.
    let result = (|| {
        f.write_all(bytes).map_err(io(path, "writing a temporary file next to it"))?;
        if let Some(p) = permissions {
            f.set_permissions(p).map_err(io(path, "copying its permissions to the temporary file"))?;
        }
        f.sync_all().map_err(io(path, "syncing the temporary file next to it"))?;
        fs::rename(&tmp, path).map_err(io(path, "renaming the temporary file over it"))
    })();
    drop(f);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Make the rename itself durable. Opening a directory is not possible on
    // every platform (Windows); there the rename is as durable as it gets.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
