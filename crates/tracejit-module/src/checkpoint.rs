//! Checkpoints: a module's variables in one [safetensors] file, keyed by
//! variable path (`layers[0].w`, as [`Module::named_variables`] prints it).
//!
//! - **Keys.** One tensor per distinct variable, under its *first* path; a
//!   variable reachable by two paths (a shared submodule) is stored once, and
//!   its other paths are not keys. Variable names play no part.
//! - **Dtypes.** f32 → `F32`, f64 → `F64`, i32 → `I32`, i64 → `I64`,
//!   bool → `BOOL` (one byte, 0 or 1); little-endian, row-major.
//! - **[`save`] is atomic**: the bytes go to a temporary file in the target's
//!   directory, which is flushed to disk (`fsync`) and renamed over the
//!   target, and the directory is synced where the platform allows. A crash
//!   leaves either the old file or the new one, never a half-written file; on
//!   error the temporary file is removed. Saving through a symlink replaces
//!   the file it points to (the link stays; a symlink loop is the OS's
//!   `ELOOP` error and changes nothing), the replaced file's permissions
//!   carry over, and temporary files left by a crashed process are skipped.
//! - **Checksums.** [`save`] records the CRC-32 of every tensor's bytes in
//!   the file's metadata (`"tracejit.crc32.<key>"`, see the `checksum`
//!   module), and one of the header's content; [`restore`] and [`read`]
//!   refuse a tensor whose bytes do not match ([`CheckpointError::Checksum`])
//!   and a damaged header ([`CheckpointError::Header`]), so a flipped bit is
//!   an error, not a silently different weight. Files written by other
//!   tools carry no `tracejit.` metadata and load as before; a file with any
//!   cannot pass for one of them.
//! - **[`restore`] is all or nothing**: every key, dtype and shape is checked
//!   and every tensor decoded before any variable changes; missing keys,
//!   unexpected keys and dtype/shape mismatches are reported together in one
//!   [`CheckpointError::Mismatch`]. A truncated or corrupt file is an `Err`
//!   ([`CheckpointError::Corrupt`]), never a panic.
//!
//! Errors are [`CheckpointError`], this module's own type (the facade's
//! `tracejit::Error` is the tracing boundary's); it converts into
//! `anyhow::Error` and any `Box<dyn Error>` with `?`.
//!
//! [safetensors]: https://github.com/huggingface/safetensors

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::SafeTensors;
use tracejit_tensor::DType;
use tracejit_trace::{Tensor, Variable};

use crate::atomic_file::write_atomically;
use crate::checksum;
use crate::inventory::Inventory;
use crate::Module;

mod encoding;
use encoding::{decode, encode, from_safetensors_dtype, Encoded};

/// A tensor in the file that does not fit the variable at its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMismatch {
    /// The key (variable path).
    pub key: String,
    /// The variable's dtype.
    pub expected_dtype: DType,
    /// The variable's shape.
    pub expected_shape: Vec<usize>,
    /// The file's dtype, as safetensors names it (`F32`, `BOOL`, `F16`, ...).
    pub found_dtype: String,
    /// The file's shape.
    pub found_shape: Vec<usize>,
}

impl fmt::Display for TensorMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}`: the module has {}{:?}, the file has {}{:?}",
            self.key, self.expected_dtype, self.expected_shape, self.found_dtype, self.found_shape
        )
    }
}

impl From<CheckpointError> for tracejit_trace::Error {
    /// Lets `?` on a checkpoint call work in functions returning
    /// `tracejit::Result`.
    fn from(e: CheckpointError) -> tracejit_trace::Error {
        tracejit_trace::Error::Checkpoint { source: std::sync::Arc::new(e) }
    }
}

/// An error saving or restoring a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading, writing, syncing or renaming a file failed.
    #[error("checkpoint {}: {action} failed: {source}", path.display())]
    Io {
        /// The file involved (the checkpoint or its temporary file).
        path: PathBuf,
        /// What was being done (`reading`, `writing the temporary file`, ...).
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid safetensors file (truncated, corrupt, or a
    /// tensor whose bytes do not match its dtype and shape).
    #[error("checkpoint {}: not a valid safetensors file: {reason}", path.display())]
    Corrupt {
        /// The checkpoint.
        path: PathBuf,
        /// What the reader found wrong.
        reason: String,
    },
    /// A tensor's bytes do not match the checksum the file records: the
    /// file was corrupted after it was written. Nothing was restored.
    #[error("checkpoint {}: tensor `{key}` is corrupt: {reason}; nothing was restored", path.display())]
    Checksum {
        /// The checkpoint.
        path: PathBuf,
        /// The tensor's key.
        key: String,
        /// What does not match.
        reason: String,
    },
    /// The file's header does not match the header checksum it records,
    /// or a file tracejit wrote lost its checksum marker: it was corrupted
    /// after it was written. Nothing was restored.
    #[error("checkpoint {}: its header is corrupt: {reason}; nothing was restored", path.display())]
    Header {
        /// The checkpoint.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The safetensors writer refused the tensors (should not happen for
    /// variables; reported rather than panicking).
    #[error("checkpoint {}: cannot serialize: {reason}", path.display())]
    Serialize {
        /// The checkpoint.
        path: PathBuf,
        /// The writer's message.
        reason: String,
    },
    /// The file does not fit the module; nothing was restored.
    #[error("{}", mismatch_message(path, missing, unexpected, mismatched))]
    Mismatch {
        /// The checkpoint.
        path: PathBuf,
        /// Variable paths with no tensor in the file.
        missing: Vec<String>,
        /// Keys in the file that name no variable of the module.
        unexpected: Vec<String>,
        /// Keys whose dtype or shape differ from the variable's.
        mismatched: Vec<TensorMismatch>,
    },
}

fn mismatch_message(path: &Path, missing: &[String], unexpected: &[String], mismatched: &[TensorMismatch]) -> String {
    let quote = |keys: &[String]| keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("{} missing key(s): {}", missing.len(), quote(missing)));
    }
    if !unexpected.is_empty() {
        parts.push(format!("{} unexpected key(s): {}", unexpected.len(), quote(unexpected)));
    }
    if !mismatched.is_empty() {
        let items: Vec<String> = mismatched.iter().map(ToString::to_string).collect();
        parts.push(format!("{} mismatched tensor(s): {}", mismatched.len(), items.join("; ")));
    }
    format!("checkpoint {} does not fit the module ({}); nothing was restored", path.display(), parts.join("; "))
}

/// Writes every distinct variable of `module` to a safetensors file at
/// `path`, keyed by its first path, atomically (see the [module docs](self)).
///
/// ```
/// use tracejit_module::{checkpoint, Module, Segment, Variable, Visit, Visitor};
/// use tracejit_trace::{DType, Tensor};
///
/// // `#[derive(Module)]` writes this impl (through the `tracejit` facade).
/// struct Dense { w: Variable }
/// impl Module for Dense {
///     fn type_name(&self) -> &'static str { "Dense" }
///     fn visit_fields<'m>(&'m self, v: &mut dyn Visitor<'m>) {
///         v.enter(Segment::Field("w"));
///         self.w.visit(v);
///         v.exit(Segment::Field("w"));
///     }
/// }
///
/// let path = std::env::temp_dir().join(format!("tracejit-doc-{}.safetensors", std::process::id()));
/// let m = Dense { w: Variable::new(Tensor::from_vec(vec![1.0f32, 2.0], &[2])) };
/// checkpoint::save(&m, &path)?;
/// m.w.assign(&Tensor::zeros(&[2], DType::F32));
/// checkpoint::restore(&m, &path)?;                      // checks each tensor's CRC-32
/// assert_eq!(m.w.value().to_vec::<f32>()?, [1.0, 2.0]);
/// assert_eq!(checkpoint::read(&path)?["w"].shape(), [2]);
/// std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let bytes = to_bytes(module).map_err(|reason| CheckpointError::Serialize { path: path.to_path_buf(), reason })?;
    write_atomically(path, &bytes).map_err(|e| CheckpointError::Io { path: e.path, action: e.action, source: e.source })
}

/// Restores every variable of `module` from the safetensors file at `path`:
/// all of them, or (on any error) none.
pub fn restore<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let bytes =
        fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_path_buf(), action: "reading", source })?;
    restore_from_bytes(module, &bytes, path)
}

/// Reads every tensor of a safetensors file of tracejit's dtypes, by key
/// (for inspecting a checkpoint without a module).
pub fn read(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    let path = path.as_ref();
    let bytes =
        fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_path_buf(), action: "reading", source })?;
    read_bytes_at(&bytes, path)
}

/// [`read`] of a checkpoint already in memory (errors name the file as
/// `<bytes>`).
///
/// ```
/// use tracejit_module::checkpoint;
///
/// let e = checkpoint::read_bytes(b"\x08\0\0\0\0\0\0\0{\"a\":1}").unwrap_err();
/// assert!(e.to_string().contains("not a valid safetensors file"), "{e}");
/// ```
pub fn read_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    read_bytes_at(bytes, Path::new("<bytes>"))
}

/// [`restore`] from a checkpoint already in memory (errors name the file
/// as `<bytes>`): all of `module`'s variables, or (on any error) none.
pub fn restore_bytes<M: Module + ?Sized>(module: &M, bytes: &[u8]) -> Result<(), CheckpointError> {
    restore_from_bytes(module, bytes, Path::new("<bytes>"))
}

fn read_bytes_at(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_path_buf(), reason };
    let file = SafeTensors::deserialize(bytes).map_err(|e| corrupt(e.to_string()))?;
    let metadata = file_metadata(bytes);
    verify_header(&file, metadata.as_ref(), path)?;
    let mut out = BTreeMap::new();
    for (key, view) in file.iter() {
        verify_checksum(metadata.as_ref(), key, view.data(), path)?;
        let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
            corrupt(format!("tensor `{key}` has dtype {:?}, which tracejit does not have", view.dtype()))
        })?;
        let storage = decode(dtype, view.shape(), view.data()).map_err(|e| corrupt(format!("tensor `{key}`: {e}")))?;
        out.insert(key.to_string(), Tensor::from_raw_storage(storage));
    }
    Ok(out)
}

/// The `__metadata__` map of a file that parsed (`None` if it has none).
fn file_metadata(bytes: &[u8]) -> Option<std::collections::HashMap<String, String>> {
    SafeTensors::read_metadata(bytes).ok().and_then(|(_, m)| m.metadata().clone())
}

/// Checks the file's header against its header checksum, and that a file
/// tracejit wrote still says so (see the `checksum` module).
fn verify_header(
    file: &SafeTensors<'_>,
    metadata: Option<&std::collections::HashMap<String, String>>,
    path: &Path,
) -> Result<(), CheckpointError> {
    let tensors = file.tensors();
    let entries: Vec<checksum::HeaderEntry<'_>> =
        tensors.iter().map(|(k, view)| (k.as_str(), format!("{:?}", view.dtype()), view.shape())).collect();
    checksum::verify_header(metadata, &entries)
        .map_err(|reason| CheckpointError::Header { path: path.to_path_buf(), reason })
}

/// Checks tensor `key`'s bytes against the checksums the file records.
fn verify_checksum(
    metadata: Option<&std::collections::HashMap<String, String>>,
    key: &str,
    data: &[u8],
    path: &Path,
) -> Result<(), CheckpointError> {
    checksum::verify(metadata, key, data).map_err(|problem| CheckpointError::Checksum {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: problem.to_string(),
    })
}

/// The distinct variables of `module`, each under its first path.
fn entries<M: Module + ?Sized>(module: &M) -> Vec<(String, Variable)> {
    Inventory::of(module).distinct_variables().map(|v| (v.path.clone(), v.variable.clone())).collect()
}

/// The safetensors bytes of `module`'s checkpoint.
fn to_bytes<M: Module + ?Sized>(module: &M) -> Result<Vec<u8>, String> {
    let entries = entries(module);
    let mut keys = HashSet::new();
    if let Some((dup, _)) = entries.iter().find(|(k, _)| !keys.insert(k.as_str())) {
        // Only a hand-written walk that repeats a segment can do this.
        return Err(format!("two different variables have the path `{dup}`"));
    }
    serialize(entries.into_iter().map(|(key, var)| (key, var.value())).collect())
}

/// Named eager tensors as a checksummed safetensors file's bytes.
fn serialize(tensors: Vec<(String, Tensor)>) -> Result<Vec<u8>, String> {
    let mut encoded: Vec<(String, Encoded)> = Vec::with_capacity(tensors.len());
    for (key, value) in tensors {
        let storage =
            value.storage().map_err(|_| format!("tensor `{key}` is symbolic: only eager tensors are saved"))?;
        encoded.push((key, encode(storage)));
    }
    let described: Vec<(checksum::HeaderEntry<'_>, &[u8])> = encoded
        .iter()
        .map(|(k, e)| ((k.as_str(), format!("{:?}", e.dtype), e.shape.as_slice()), e.data.as_slice()))
        .collect();
    let metadata = checksum::metadata(&described);
    safetensors::serialize(encoded.iter().map(|(k, e)| (k.as_str(), e)), Some(metadata)).map_err(|e| e.to_string())
}

/// Writes named eager tensors to a safetensors file (with [`save`]'s
/// checksums, atomically), the inverse of [`read`]: for data that is not
/// a module's variables (a cache of embeddings, a model's weights under
/// another framework's names).
///
/// ```
/// use std::collections::BTreeMap;
/// use tracejit_module::checkpoint;
/// use tracejit_trace::Tensor;
///
/// let path = std::env::temp_dir().join(format!("tracejit_write_doc_{}.safetensors", std::process::id()));
/// let tensors = BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![1.0f32, 2.0], &[2]))]);
/// checkpoint::write(&path, &tensors)?;
/// assert_eq!(checkpoint::read(&path)?["x"].to_vec::<f32>()?, [1.0, 2.0]);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write(path: impl AsRef<Path>, tensors: &BTreeMap<String, Tensor>) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let bytes = serialize(tensors.iter().map(|(k, t)| (k.clone(), t.clone())).collect())
        .map_err(|reason| CheckpointError::Serialize { path: path.to_path_buf(), reason })?;
    write_atomically(path, &bytes).map_err(|e| CheckpointError::Io { path: e.path, action: e.action, source: e.source })
}

/// Named tensors as the bytes of a checksummed safetensors file (what
/// [`write`] writes; [`read_bytes`] reads them back): for formats that hold
/// a checkpoint inside a larger file (`tracejit::artifact`).
pub fn tensors_to_bytes(tensors: &BTreeMap<String, Tensor>) -> Result<Vec<u8>, CheckpointError> {
    serialize(tensors.iter().map(|(k, t)| (k.clone(), t.clone())).collect())
        .map_err(|reason| CheckpointError::Serialize { path: std::path::PathBuf::from("<memory>"), reason })
}

/// The checks and the all-or-nothing update of [`restore`], over the bytes
/// of a file (`path` is for messages).
pub(crate) fn restore_from_bytes<M: Module + ?Sized>(
    module: &M,
    bytes: &[u8],
    path: &Path,
) -> Result<(), CheckpointError> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| CheckpointError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
    let metadata = file_metadata(bytes);
    verify_header(&file, metadata.as_ref(), path)?;
    let inventory = Inventory::of(module);
    let entries: Vec<(&str, &Variable)> =
        inventory.distinct_variables().map(|v| (v.path.as_str(), v.variable)).collect();
    let expected: HashSet<&str> = entries.iter().map(|(k, _)| *k).collect();
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut updates = Vec::with_capacity(entries.len());
    for &(key, var) in &entries {
        if file.tensor(key).is_err() {
            missing.push(key.to_string());
            continue;
        }
        match decode_for(&file, metadata.as_ref(), key, var, path)? {
            Ok(value) => updates.push((var, value)),
            Err(m) => mismatched.push(m),
        }
    }
    // A key naming a slot that a holder has not created yet (a fresh
    // optimizer) is that slot's value, kept until the slot is created.
    let mut unexpected = Vec::new();
    let mut deferred = Vec::new();
    for key in file.names().into_iter().filter(|k| !expected.contains(k)) {
        match crate::slots::owner_of(&inventory, key) {
            Some((holder, name, owner)) => match decode_for(&file, metadata.as_ref(), key, owner, path)? {
                Ok(value) => deferred.push((holder, name, owner, value)),
                Err(m) => mismatched.push(m),
            },
            None => unexpected.push(key.to_string()),
        }
    }
    unexpected.sort();
    if !(missing.is_empty() && unexpected.is_empty() && mismatched.is_empty()) {
        return Err(CheckpointError::Mismatch { path: path.to_path_buf(), missing, unexpected, mismatched });
    }
    for (var, value) in updates {
        var.set_value(&value);
    }
    for (holder, name, owner, value) in deferred {
        holder.defer_slot(name, owner, value);
    }
    Ok(())
}

/// The file's tensor `key` (which exists) decoded for `var` after its
/// checksum is verified, or why it does not fit `var`'s dtype and shape.
fn decode_for(
    file: &SafeTensors<'_>,
    metadata: Option<&std::collections::HashMap<String, String>>,
    key: &str,
    var: &Variable,
    path: &Path,
) -> Result<Result<Tensor, TensorMismatch>, CheckpointError> {
    let view =
        file.tensor(key).map_err(|e| CheckpointError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
    let fits = from_safetensors_dtype(view.dtype()) == Some(var.dtype()) && view.shape() == var.shape();
    if !fits {
        return Ok(Err(TensorMismatch {
            key: key.to_string(),
            expected_dtype: var.dtype(),
            expected_shape: var.shape().to_vec(),
            found_dtype: format!("{:?}", view.dtype()),
            found_shape: view.shape().to_vec(),
        }));
    }
    verify_checksum(metadata, key, view.data(), path)?;
    let storage = decode(var.dtype(), view.shape(), view.data())
        .map_err(|e| CheckpointError::Corrupt { path: path.to_path_buf(), reason: format!("tensor `{key}`: {e}") })?;
    Ok(Ok(Tensor::from_raw_storage(storage)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomic_file;
    use crate::visitor::{Segment, Visitor};
    use crate::Visit;

    /// A hand-written module (the derive's paths name the facade, which this
    /// crate cannot see).
    struct Pair {
        a: Variable,
        b: Vec<Variable>,
    }

    impl Module for Pair {
        fn type_name(&self) -> &'static str {
            "Pair"
        }
        fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
            visitor.enter(Segment::Field("a"));
            self.a.visit(visitor);
            visitor.exit(Segment::Field("a"));
            visitor.enter(Segment::Field("b"));
            self.b.visit(visitor);
            visitor.exit(Segment::Field("b"));
        }
    }

    fn pair() -> Pair {
        Pair {
            a: Variable::new(Tensor::from_vec(vec![1.0f32, -2.5, 3.0], &[3])),
            b: vec![
                Variable::new(Tensor::from_vec(vec![7i64, -8], &[2, 1])),
                Variable::new(Tensor::from_vec(vec![true, false, true], &[3])),
            ],
        }
    }

    #[test]
    fn bytes_round_trip() {
        let p = pair();
        let bytes = to_bytes(&p).unwrap();
        let q = pair();
        q.a.assign(&Tensor::zeros(&[3], DType::F32));
        restore_from_bytes(&q, &bytes, Path::new("mem")).unwrap();
        assert_eq!(q.a.value().to_vec::<f32>().unwrap(), vec![1.0, -2.5, 3.0]);
        assert_eq!(q.b[0].value().to_vec::<i64>().unwrap(), vec![7, -8]);
        assert_eq!(q.b[1].value().to_vec::<bool>().unwrap(), vec![true, false, true]);
    }

    /// Every prefix of a valid file, and every single-byte corruption of its
    /// header, gives `Ok` or `Err` but never a panic, and an `Err` changes
    /// nothing.
    #[test]
    fn truncations_and_corruptions_never_panic() {
        let p = pair();
        let bytes = to_bytes(&p).unwrap();
        let q = pair();
        q.a.assign(&Tensor::zeros(&[3], DType::F32));
        for n in 0..bytes.len() {
            let r = restore_from_bytes(&q, &bytes[..n], Path::new("mem"));
            assert!(matches!(r, Err(CheckpointError::Corrupt { .. })), "prefix {n}: {r:?}");
            assert_eq!(q.a.value().to_vec::<f32>().unwrap(), vec![0.0; 3]);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..bytes.len() {
            for _ in 0..4 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut b = bytes.clone();
                b[i] = seed as u8;
                let _ = restore_from_bytes(&q, &b, Path::new("mem"));
            }
        }
        for len in [0usize, 1, 7, 8, 9, 64, 1000] {
            let noise: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            assert!(restore_from_bytes(&q, &noise, Path::new("mem")).is_err());
        }
    }

    /// A fresh directory under the system's temp dir.
    fn scratch_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tracejit-ckpt-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// Temporary files left behind under the names this process would use
    /// next (a crashed process with the same pid) do not make `save` fail.
    #[test]
    fn stale_temporary_files_are_skipped() {
        let d = scratch_dir("stale");
        let path = d.join("m.safetensors");
        let next = atomic_file::next_temp_counter();
        for c in next..next + 8 {
            fs::write(d.join(atomic_file::temp_name(path.file_name().unwrap(), c)), b"stale").unwrap();
        }
        save(&pair(), &path).unwrap();
        let q = pair();
        q.a.assign(&Tensor::zeros(&[3], DType::F32));
        restore(&q, &path).unwrap();
        assert_eq!(q.a.value().to_vec::<f32>().unwrap(), vec![1.0, -2.5, 3.0]);
        let _ = fs::remove_dir_all(&d);
    }

    /// Saving through a symlink replaces the file it points to and keeps the
    /// link; the replaced file's permissions are kept.
    #[cfg(unix)]
    #[test]
    fn symlinks_and_permissions_survive_a_save() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch_dir("link");
        fs::create_dir_all(d.join("store")).unwrap();
        let real = d.join("store").join("real.safetensors");
        let link = d.join("link.safetensors");
        let p = pair();
        save(&p, &real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        p.a.assign(&Tensor::from_vec(vec![9.0f32, 8.0, 7.0], &[3]));
        save(&p, &link).unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced by a file");
        assert_eq!(fs::metadata(&real).unwrap().permissions().mode() & 0o777, 0o600);
        let q = pair();
        restore(&q, &real).unwrap();
        assert_eq!(q.a.value().to_vec::<f32>().unwrap(), vec![9.0, 8.0, 7.0]);
        let _ = fs::remove_dir_all(&d);
    }

    struct Nothing;

    impl Module for Nothing {
        fn type_name(&self) -> &'static str {
            "Nothing"
        }
        fn visit_fields<'m>(&'m self, _visitor: &mut dyn Visitor<'m>) {}
    }

    /// Two variables under one path (only a hand-written walk can do it).
    struct Clash(Variable, Variable);

    impl Module for Clash {
        fn type_name(&self) -> &'static str {
            "Clash"
        }
        fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
            for v in [&self.0, &self.1] {
                visitor.enter(Segment::Field("x"));
                v.visit(visitor);
                visitor.exit(Segment::Field("x"));
            }
        }
    }

    #[test]
    fn an_empty_module_round_trips_and_a_path_clash_is_an_error() {
        let bytes = to_bytes(&Nothing).unwrap();
        restore_from_bytes(&Nothing, &bytes, Path::new("mem")).unwrap();
        let e = restore_from_bytes(&pair(), &bytes, Path::new("mem")).unwrap_err();
        assert!(matches!(&e, CheckpointError::Mismatch { missing, .. } if missing.len() == 3), "{e}");
        let clash = Clash(Variable::new(Tensor::scalar(1.0f32)), Variable::new(Tensor::scalar(2.0f32)));
        assert!(to_bytes(&clash).unwrap_err().contains("`x`"));
    }

    #[test]
    fn decode_checks_the_byte_count() {
        assert!(decode(DType::F32, &[2], &[0; 7]).is_err());
        assert!(decode(DType::F32, &[usize::MAX, 2], &[]).is_err());
        assert_eq!(decode(DType::I32, &[1], &5i32.to_le_bytes()).unwrap().to_vec::<i32>().unwrap(), vec![5]);
    }
}
