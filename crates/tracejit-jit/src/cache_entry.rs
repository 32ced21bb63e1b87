//! One compiled kernel as a self-describing, checksummed record: what the
//! persistent compile cache stores per file and what artifacts embed per
//! region. Layout (little-endian, see `docs/artifact-format.md`):
//!
//! ```text
//! magic "TJKERNEL" | u32 format version | u32 CRC-32 of the rest
//! key:   bytes (identity, target, options, kernel key words)
//! image: bytes (crate::code_image's wire format)
//! ```
//!
//! The key is repeated inside the entry, whole: a cache file found under
//! a key's hash is used only when its key is byte-for-byte the one looked
//! up, so a hash collision, a file copied under another name or an entry
//! of another build, CPU or option set is never run. The identity names
//! the tracejit version, the digest of the code generator's source
//! (`build.rs`) and Cranelift's version; the target names the CPU features
//! the code may use ([`crate::jit::target_description`]).

use crate::options::{JitOptions, KernelKey};
use crate::wire::{Reader, Writer};
use crate::JitError;

const MAGIC: &[u8; 8] = b"TJKERNEL";

/// The entry format's version; an entry of another version is refused.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The build of tracejit whose code generator produced an entry.
pub(crate) fn identity() -> String {
    format!(
        "tracejit {} codegen {} cranelift {}",
        env!("CARGO_PKG_VERSION"),
        env!("TRACEJIT_CODEGEN_HASH"),
        cranelift_native::VERSION
    )
}

/// What an entry's code was compiled for, decoded from its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntryKey {
    pub identity: String,
    pub target: String,
    pub unroll: Option<u8>,
    pub stage: bool,
    pub avx512: bool,
    pub words: Vec<u64>,
}

impl EntryKey {
    /// The key of `words` compiled in this process under `opts`.
    pub fn of(key: &KernelKey, opts: &JitOptions) -> Result<EntryKey, JitError> {
        Ok(EntryKey {
            identity: identity(),
            target: crate::jit::target_description(opts)?,
            unroll: opts.unroll,
            stage: opts.stage,
            avx512: runs_avx512(opts),
            words: key.words().to_vec(),
        })
    }

    /// The key in the wire format (hashed for the cache file's name).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.str(&self.identity);
        w.str(&self.target);
        w.u8(self.unroll.unwrap_or(0));
        w.u8(u8::from(self.stage));
        w.u8(u8::from(self.avx512));
        w.u64(self.words.len() as u64);
        for &x in &self.words {
            w.u64(x);
        }
        w.finish()
    }

    fn from_bytes(bytes: &[u8]) -> Result<EntryKey, String> {
        let mut r = Reader::new(bytes);
        let e = |e: crate::wire::WireError| format!("kernel entry key: {e}");
        let identity = r.str("identity").map_err(e)?.to_string();
        let target = r.str("target").map_err(e)?.to_string();
        let unroll = match r.u8("unroll").map_err(e)? {
            0 => None,
            u @ (1 | 2 | 4 | 8) => Some(u),
            u => return Err(format!("kernel entry key: unroll factor {u}")),
        };
        let flag = |r: &mut Reader<'_>, what: &str| match r.u8(what) {
            Ok(0) => Ok(false),
            Ok(1) => Ok(true),
            Ok(v) => Err(format!("kernel entry key: {what} flag {v}")),
            Err(x) => Err(e(x)),
        };
        let stage = flag(&mut r, "stage")?;
        let avx512 = flag(&mut r, "avx512")?;
        let n = r.count(8, "key words").map_err(e)?;
        let words = (0..n).map(|_| r.u64("key word")).collect::<Result<Vec<u64>, _>>().map_err(e)?;
        r.finish("kernel entry key").map_err(e)?;
        Ok(EntryKey { identity, target, unroll, stage, avx512, words })
    }

    /// Why code compiled under this key must not run in this process under
    /// `opts`, or `None` when it fits exactly.
    pub fn mismatch(&self, opts: &JitOptions) -> Result<Option<String>, JitError> {
        let ours = identity();
        if self.identity != ours {
            return Ok(Some(format!("compiled by `{}`, this is `{ours}`", self.identity)));
        }
        if (self.unroll, self.stage, self.avx512) != (opts.unroll, opts.stage, runs_avx512(opts)) {
            return Ok(Some(format!(
                "compiled with avx512={} stage={} unroll={:?}, this process uses avx512={} stage={} unroll={:?}",
                self.avx512,
                self.stage,
                self.unroll,
                runs_avx512(opts),
                opts.stage,
                opts.unroll
            )));
        }
        let target = crate::jit::target_description(opts)?;
        if self.target != target {
            return Ok(Some(format!("compiled for the target `{}`, this host is `{target}`", self.target)));
        }
        Ok(None)
    }
}

/// Whether kernels compiled under `opts` in this process use 512-bit code:
/// allowed *and* on this CPU. The policy alone would key an AVX2 host's
/// native kernels apart from its `Target::avx2()` ones, which are the same
/// code, and a cache filled under one would miss under the other.
fn runs_avx512(opts: &JitOptions) -> bool {
    opts.isa().width() == Some(tracejit_kernels::Width::W16)
}

/// An entry: the key and the code image, checksummed.
pub(crate) fn encode(key: &[u8], image: &[u8]) -> Vec<u8> {
    let mut body = Writer::new();
    body.bytes(key);
    body.bytes(image);
    let body = body.finish();
    let mut w = Writer::new();
    w.raw(MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(crc32fast::hash(&body));
    w.raw(&body);
    w.finish()
}

/// An entry's parts, after checking its magic, version and checksum.
pub(crate) struct Decoded<'a> {
    /// The key's bytes (compare with [`EntryKey::to_bytes`]).
    pub key_bytes: &'a [u8],
    /// The code image's bytes.
    pub image: &'a [u8],
}

impl Decoded<'_> {
    /// The key, decoded.
    pub fn key(&self) -> Result<EntryKey, String> {
        EntryKey::from_bytes(self.key_bytes)
    }
}

/// Reads an entry written by [`encode`]; the error names what is wrong
/// (truncated, another format version, a checksum mismatch).
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded<'_>, String> {
    let mut r = Reader::new(bytes);
    let e = |e: crate::wire::WireError| format!("kernel entry: {e}");
    if r.take(8, "magic").map_err(e)? != MAGIC {
        return Err("kernel entry: not a tracejit kernel (bad magic)".into());
    }
    let version = r.u32("format version").map_err(e)?;
    if version != FORMAT_VERSION {
        return Err(format!("kernel entry: format version {version}, this tracejit reads {FORMAT_VERSION}"));
    }
    let crc = r.u32("checksum").map_err(e)?;
    let body = &bytes[bytes.len() - r.remaining()..];
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Err(format!("kernel entry: checksum mismatch (stored {crc:08x}, computed {actual:08x}): altered"));
    }
    let key_bytes = r.bytes("key").map_err(e)?;
    let image = r.bytes("code image").map_err(e)?;
    r.finish("kernel entry").map_err(e)?;
    Ok(Decoded { key_bytes, image })
}

/// A stable 128-bit digest of `bytes` as 32 hex digits (two FNV-1a
/// passes with different offsets): the cache file's name.
pub(crate) fn digest(bytes: &[u8]) -> String {
    let fnv = |mut h: u64| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h
    };
    format!("{:016x}{:016x}", fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> EntryKey {
        let mut k = KernelKey::default();
        k.list([3, 4, 5]);
        EntryKey::of(&k, &JitOptions::default()).unwrap()
    }

    #[test]
    fn entries_round_trip_and_fit_this_process() {
        let k = key();
        let bytes = encode(&k.to_bytes(), b"image");
        let d = decode(&bytes).unwrap();
        assert_eq!(d.key().unwrap(), k);
        assert_eq!(d.image, b"image");
        assert_eq!(k.mismatch(&JitOptions::default()).unwrap(), None);
    }

    #[test]
    fn damage_is_named() {
        let bytes = encode(&key().to_bytes(), b"image");
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            let e = decode(&b).err().unwrap_or_else(|| panic!("flip at {at} went unnoticed"));
            assert!(e.contains("magic") || e.contains("version") || e.contains("checksum"), "{e}");
        }
        let mut b = bytes.clone();
        b[8] = 9;
        assert_eq!(decode(&b).err().unwrap(), "kernel entry: format version 9, this tracejit reads 1");
    }

    #[test]
    fn another_build_or_option_set_does_not_fit() {
        let mut k = key();
        k.identity = "tracejit 0.0.1 codegen 0 cranelift 0.1".into();
        assert!(k.mismatch(&JitOptions::default()).unwrap().unwrap().contains("compiled by `tracejit 0.0.1"));
        // Code that used 512-bit registers (compiled on an AVX-512 host)
        // never fits the AVX2 target, whatever this host is.
        let mut k = key();
        k.avx512 = true;
        let avx2 = JitOptions::default().for_target(tracejit_kernels::Target::avx2());
        assert!(k.mismatch(&avx2).unwrap().unwrap().contains("compiled with avx512=true"));
        let mut k = key();
        k.target = "x86_64 has_avx512f=true".into();
        assert!(k.mismatch(&JitOptions::default()).unwrap().unwrap().contains("this host is"));
    }
}
