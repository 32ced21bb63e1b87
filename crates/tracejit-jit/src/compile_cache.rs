//! The persistent compile cache: a directory of compiled kernels that later
//! processes load instead of running Cranelift.
//!
//! - **Where**: [`set_compile_cache`]`(Some(dir))`, or the environment
//!   variable `TRACEJIT_COMPILE_CACHE=dir` (read once, when the first kernel
//!   is looked up); `None` turns it off. Off by default.
//! - **What**: one file per kernel, `<digest>.tjk`, holding a
//!   cache entry (the private `cache_entry` module): the kernel key words, the JIT options, the
//!   target (Cranelift's ISA flags, which name the CPU features the code may
//!   use), the tracejit identity (version, code generator digest, Cranelift
//!   version), the relocatable code, and a CRC-32 over all of it. The key
//!   inside must equal the key looked up, byte for byte; the code is checked
//!   against this process's symbols before it is mapped.
//! - **Damage**: a truncated, altered or foreign entry is logged (`warn`),
//!   removed, recompiled and written again; it never runs and is never an
//!   error of the call that found it.
//! - **Concurrency**: an entry is written to a temporary file in the
//!   directory and renamed over its name, which is atomic: readers see the
//!   old file or the new one, and two processes filling one cache at once
//!   at worst both compile a kernel and one rename wins.
//! - **Size**: bounded by [`set_compile_cache_limit`] (default
//!   [`DEFAULT_LIMIT`], 512 MiB; `TRACEJIT_COMPILE_CACHE_LIMIT` in bytes).
//!   After a write that takes the directory past the limit, the least
//!   recently used entries (a hit refreshes an entry's modification time,
//!   the clock) are removed until it is at 90% of it.
//! - **Counts**: [`compile_cache_stats`]: kernels found (on disk or in a
//!   loaded artifact) and kernels compiled, in this process.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use crate::cache_entry::{self, EntryKey};
use crate::jit::KernelCode;
use crate::options::{JitOptions, KernelKey};

/// The default size limit of the cache directory: 512 MiB.
pub const DEFAULT_LIMIT: u64 = 512 << 20;

/// The largest file read as an entry; a larger one is damage.
const MAX_ENTRY: u64 = 256 << 20;

/// Kernels found and compiled by this process ([`compile_cache_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileCacheStats {
    /// Kernels taken from the compile cache directory or from a loaded
    /// artifact instead of being compiled.
    pub hits: u64,
    /// Kernels Cranelift compiled (hand-written kernels are not counted).
    pub misses: u64,
}

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// This process's counts of kernels found and compiled.
pub fn compile_cache_stats() -> CompileCacheStats {
    CompileCacheStats { hits: HITS.load(Ordering::Relaxed), misses: MISSES.load(Ordering::Relaxed) }
}

/// Counts a kernel compiled by Cranelift.
pub(crate) fn count_miss() {
    MISSES.fetch_add(1, Ordering::Relaxed);
}

fn dir_setting() -> &'static RwLock<Option<PathBuf>> {
    static DIR: OnceLock<RwLock<Option<PathBuf>>> = OnceLock::new();
    DIR.get_or_init(|| {
        RwLock::new(std::env::var_os("TRACEJIT_COMPILE_CACHE").filter(|v| !v.is_empty()).map(PathBuf::from))
    })
}

fn limit_setting() -> &'static AtomicU64 {
    static LIMIT: OnceLock<AtomicU64> = OnceLock::new();
    LIMIT.get_or_init(|| {
        let env = std::env::var("TRACEJIT_COMPILE_CACHE_LIMIT").ok().and_then(|v| v.trim().parse::<u64>().ok());
        AtomicU64::new(env.unwrap_or(DEFAULT_LIMIT))
    })
}

/// Uses `dir` as the persistent compile cache from now on (created when
/// the first kernel is written), or none with `None`. Overrides
/// `TRACEJIT_COMPILE_CACHE`. Kernels already compiled in this process stay
/// in its memory either way.
pub fn set_compile_cache(dir: Option<PathBuf>) {
    *dir_setting().write().unwrap_or_else(|p| p.into_inner()) = dir;
}

/// The compile cache directory in use, if any.
pub fn compile_cache() -> Option<PathBuf> {
    dir_setting().read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Bounds the cache directory's size in bytes (default [`DEFAULT_LIMIT`]).
pub fn set_compile_cache_limit(bytes: u64) {
    limit_setting().store(bytes, Ordering::Relaxed);
}

/// Entries of loaded artifacts, by file digest of their key: found before
/// the directory, so loading an artifact runs no Cranelift.
fn preloaded() -> &'static Mutex<HashMap<String, Arc<[u8]>>> {
    static MAP: OnceLock<Mutex<HashMap<String, Arc<[u8]>>>> = OnceLock::new();
    MAP.get_or_init(Mutex::default)
}

/// Makes an entry (from an artifact) available to kernel lookups in this
/// process. `Ok(None)` when it was registered; `Ok(Some(why))` when its code
/// does not fit this process (another CPU, options or build: the kernel
/// will be compiled for the host instead); `Err` when it is damaged.
pub fn preload_entry(bytes: &[u8]) -> Result<Option<String>, String> {
    let decoded = cache_entry::decode(bytes)?;
    let key = decoded.key()?;
    let image = crate::code_image::CodeImage::from_bytes(decoded.image).map_err(|e| format!("kernel entry: {e}"))?;
    // The target first: code for another CPU may call chunk functions this
    // one lacks (16-lane ones on an AVX2-only host), which `check` rightly
    // refuses as unknown symbols; such an entry is not damaged, only not
    // for this host, and its kernel is compiled here instead.
    let opts = JitOptions::current();
    if let Some(why) = key.mismatch(&opts).map_err(|e| e.to_string())? {
        return Ok(Some(why));
    }
    image.check().map_err(|e| format!("kernel entry: {e}"))?;
    let name = cache_entry::digest(decoded.key_bytes);
    preloaded().lock().unwrap_or_else(|p| p.into_inner()).insert(name, Arc::from(bytes));
    Ok(None)
}

/// The code of `key` under `opts` from a loaded artifact or the cache
/// directory, with its entry's bytes; `None` when neither has it (a damaged
/// file is logged and removed).
pub(crate) fn lookup(key: &KernelKey, opts: &JitOptions) -> Option<(KernelCode, Arc<[u8]>)> {
    let dir = compile_cache();
    let pre = !preloaded().lock().unwrap_or_else(|p| p.into_inner()).is_empty();
    if dir.is_none() && !pre {
        return None;
    }
    let want = EntryKey::of(key, opts).ok()?.to_bytes();
    let name = cache_entry::digest(&want);
    let from_artifact = preloaded().lock().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
    if let Some(bytes) = from_artifact {
        if let Ok(code) = code_of(&bytes, &want) {
            HITS.fetch_add(1, Ordering::Relaxed);
            return Some((code, bytes));
        }
    }
    let path = dir?.join(format!("{name}.tjk"));
    let bytes = match read_entry(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(why) => {
            discard(&path, &why);
            return None;
        }
    };
    match code_of(&bytes, &want) {
        Ok(code) => {
            HITS.fetch_add(1, Ordering::Relaxed);
            // The LRU clock: a hit makes the entry the newest.
            if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(SystemTime::now());
            }
            Some((code, Arc::from(bytes)))
        }
        Err(why) => {
            discard(&path, &why);
            None
        }
    }
}

/// The file's bytes; `Ok(None)` when there is no file.
fn read_entry(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if meta.len() > MAX_ENTRY {
        return Err(format!("{} bytes, more than any kernel entry", meta.len()));
    }
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The mapped code of an entry whose key must be `want`.
fn code_of(bytes: &[u8], want: &[u8]) -> Result<KernelCode, String> {
    let decoded = cache_entry::decode(bytes)?;
    if decoded.key_bytes != want {
        return Err("its key is not the one looked up (a copied file or a digest collision)".into());
    }
    KernelCode::load(decoded.image).map_err(|e| format!("its code: {e}"))
}

fn discard(path: &Path, why: &str) {
    log::warn!("compile cache: ignoring and removing {}: {why}; the kernel is compiled again", path.display());
    let _ = std::fs::remove_file(path);
}

/// Writes the entry of `key` under `opts` (its code image `image`) to the
/// cache directory, if there is one; returns the entry's bytes (what an
/// artifact embeds). Failures to write are logged, never errors.
pub(crate) fn store(key: &KernelKey, opts: &JitOptions, image: &[u8]) -> Option<Arc<[u8]>> {
    let entry_key = EntryKey::of(key, opts).ok()?.to_bytes();
    let bytes: Arc<[u8]> = Arc::from(cache_entry::encode(&entry_key, image));
    if let Some(dir) = compile_cache() {
        let name = cache_entry::digest(&entry_key);
        if let Err(e) = write_atomically(&dir, &format!("{name}.tjk"), &bytes) {
            log::warn!("compile cache: cannot write {name}.tjk in {}: {e}", dir.display());
        } else {
            evict(&dir, limit_setting().load(Ordering::Relaxed));
        }
    }
    Some(bytes)
}

/// Writes `bytes` to `dir/name` through a temporary file renamed over it.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}-{}-{name}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, dir.join(name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Removes the least recently used entries while the directory holds more
/// than `limit` bytes, down to 90% of it; also temporary files a crashed
/// writer left more than an hour ago.
pub(crate) fn evict(dir: &Path, limit: u64) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    let mut entries: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    let mut total = 0u64;
    for e in read.flatten() {
        let path = e.path();
        let Ok(meta) = e.metadata() else { continue };
        let mtime = meta.modified().unwrap_or(now);
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".tmp-") {
            if now.duration_since(mtime).is_ok_and(|age| age.as_secs() > 3600) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if name.ends_with(".tjk") {
            total += meta.len();
            entries.push((mtime, meta.len(), path));
        }
    }
    if total <= limit {
        return;
    }
    entries.sort();
    let target = limit / 10 * 9;
    for (_, len, path) in entries {
        if total <= target {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            log::info!("compile cache: evicted {} ({len} bytes, least recently used)", path.display());
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code_image::{CodeImage, CodeReloc};
    use std::time::Duration;

    /// An entry of `code` relocated against `symbol`, keyed for `target`.
    fn entry(target: Option<&str>, symbol: &str) -> Vec<u8> {
        let mut words = KernelKey::default();
        words.list([1, 2, 3]);
        let mut key = EntryKey::of(&words, &JitOptions::global()).unwrap();
        if let Some(t) = target {
            key.target = t.to_string();
        }
        let image = CodeImage {
            code: vec![0xc3; 16],
            align: 16,
            consts: vec![],
            relocs: vec![CodeReloc { offset: 0, symbol: symbol.into() }],
        };
        cache_entry::encode(&key.to_bytes(), &image.to_bytes())
    }

    /// An artifact's kernel for another CPU names chunk functions this one
    /// may lack: it is compiled for the host, not refused as damage; for
    /// this CPU, an unknown symbol is damage.
    #[test]
    fn another_targets_entry_is_recompiled_even_when_its_symbols_are_foreign() {
        let foreign = "tj_chunk_exp_f32x64";
        let why = preload_entry(&entry(Some("x86_64 has_avx1024=true"), foreign)).unwrap();
        assert!(why.unwrap().contains("compiled for the target `x86_64 has_avx1024=true`"));
        let err = preload_entry(&entry(None, foreign)).unwrap_err();
        assert!(err.contains("unknown symbol `tj_chunk_exp_f32x64`"), "{err}");
    }

    #[test]
    fn eviction_removes_the_least_recently_used_down_to_ninety_percent() {
        let dir = std::env::temp_dir().join(format!("tracejit-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = SystemTime::now() - Duration::from_secs(10_000);
        // Ten entries of 100 bytes, entry k used at base + k seconds.
        for k in 0..10u64 {
            let p = dir.join(format!("{k:02}.tjk"));
            std::fs::write(&p, [0u8; 100]).unwrap();
            std::fs::File::options()
                .append(true)
                .open(&p)
                .unwrap()
                .set_modified(base + Duration::from_secs(k))
                .unwrap();
        }
        // A stale temporary file and an unrelated file.
        let tmp = dir.join(".tmp-1-0-x.tjk");
        std::fs::write(&tmp, [0u8; 10]).unwrap();
        std::fs::File::options().append(true).open(&tmp).unwrap().set_modified(base).unwrap();
        std::fs::write(dir.join("README"), b"kept").unwrap();
        evict(&dir, 1000);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 11, "at the limit nothing goes but stale temporaries");
        evict(&dir, 700);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        // 630 bytes (90% of 700) keep the six most recently used.
        assert_eq!(left, ["04.tjk", "05.tjk", "06.tjk", "07.tjk", "08.tjk", "09.tjk", "README"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
