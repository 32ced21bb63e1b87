//! The artifact file format (version [`FORMAT_VERSION`]; described for
//! readers in `docs/artifact-format.md`). Little-endian, in
//! `tracejit_jit::wire`'s encoding:
//!
//! ```text
//! magic "TJARTIFX" | u32 format version | u64 body length | u32 CRC-32 of the body
//! body:
//!   str  identity      the tracejit build that wrote it (version, code generator digest, Cranelift)
//!   str  name          the function's name
//!   str  features      the CPU features of the writer (informative; kernels carry their own target)
//!   list inputs        path, dtype, dims (-1: unknown)
//!   list outputs       path, dtype, dims
//!   list statics       the static arguments' type names (baked into the graph)
//!   list variables     path, dtype, shape
//!   str  graph         the optimized graph's text (`{:#}`: every constant in full)
//!   bytes values       the variables' values: a checksummed safetensors file keyed by path
//!   list kernels       compile cache entries (`tracejit_jit::compile_cache`), each its own checksummed record
//! ```
//!
//! Reading checks the magic, the version, the length and the checksum
//! before anything else, so a truncated or altered file is named as such;
//! every count and length is checked against the bytes left.

use tracejit_ir::tensor::DType;
use tracejit_jit::wire::{Reader, WireError, Writer};

const MAGIC: &[u8; 8] = b"TJARTIFX";

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes before the body: magic, version, length, checksum.
const HEADER: usize = 8 + 4 + 8 + 4;

/// A tensor's place in the signature or a variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub path: String,
    pub dtype: DType,
    /// `None`: unknown (any size).
    pub dims: Vec<Option<usize>>,
}

/// Everything an artifact holds.
#[derive(Clone, Debug)]
pub(crate) struct Parts {
    pub identity: String,
    pub name: String,
    pub features: String,
    pub inputs: Vec<Slot>,
    pub outputs: Vec<Slot>,
    pub statics: Vec<String>,
    pub variables: Vec<Slot>,
    pub graph: String,
    pub values: Vec<u8>,
    pub kernels: Vec<Vec<u8>>,
}

fn write_slots(w: &mut Writer, slots: &[Slot]) {
    w.u64(slots.len() as u64);
    for s in slots {
        w.str(&s.path);
        w.str(s.dtype.name());
        w.u64(s.dims.len() as u64);
        for d in &s.dims {
            w.i64(d.map_or(-1, |d| d as i64));
        }
    }
}

fn read_slots(r: &mut Reader<'_>, what: &str) -> Result<Vec<Slot>, WireError> {
    let n = r.count(8 + 8 + 8, what)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let field = format!("{what} {i}");
        let path = r.str(&field)?.to_string();
        let dt = r.str(&field)?;
        let dtype = DType::ALL
            .into_iter()
            .find(|d| d.name() == dt)
            .ok_or_else(|| r.error(&field, format!("unknown dtype `{dt}`")))?;
        let rank = r.count(8, &field)?;
        let mut dims = Vec::with_capacity(rank);
        for _ in 0..rank {
            dims.push(match r.i64(&field)? {
                -1 => None,
                d if d >= 0 => Some(d as usize),
                d => return Err(r.error(&field, format!("dimension {d}"))),
            });
        }
        out.push(Slot { path, dtype, dims });
    }
    Ok(out)
}

/// The file's bytes.
pub(crate) fn encode(p: &Parts) -> Vec<u8> {
    let mut w = Writer::new();
    w.str(&p.identity);
    w.str(&p.name);
    w.str(&p.features);
    write_slots(&mut w, &p.inputs);
    write_slots(&mut w, &p.outputs);
    w.u64(p.statics.len() as u64);
    for s in &p.statics {
        w.str(s);
    }
    write_slots(&mut w, &p.variables);
    w.str(&p.graph);
    w.bytes(&p.values);
    w.u64(p.kernels.len() as u64);
    for k in &p.kernels {
        w.bytes(k);
    }
    let body = w.finish();
    let mut out = Writer::new();
    out.raw(MAGIC);
    out.u32(FORMAT_VERSION);
    out.u64(body.len() as u64);
    out.u32(crc32fast::hash(&body));
    out.raw(&body);
    out.finish()
}

/// Why a file is not a readable artifact.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// Another format version.
    Version(u32),
    /// Not an artifact, truncated, altered or malformed: the message says which.
    Format(String),
}

/// Reads a file written by [`encode`].
pub(crate) fn decode(bytes: &[u8]) -> Result<Parts, DecodeError> {
    let fmt = |e: WireError| DecodeError::Format(e.to_string());
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(DecodeError::Format("not a tracejit artifact (bad magic)".into()));
    }
    let mut r = Reader::new(bytes);
    r.take(8, "magic").map_err(fmt)?;
    let version = r.u32("format version").map_err(fmt)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    let len = r.u64("body length").map_err(fmt)?;
    let crc = r.u32("checksum").map_err(fmt)?;
    let have = (bytes.len() - HEADER.min(bytes.len())) as u64;
    if have < len {
        return Err(DecodeError::Format(format!("truncated: the header says {len} bytes follow, the file has {have}")));
    }
    if have > len {
        return Err(DecodeError::Format(format!("{} unexpected bytes after the end", have - len)));
    }
    let body = &bytes[HEADER..];
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Err(DecodeError::Format(format!(
            "checksum mismatch (stored {crc:08x}, computed {actual:08x}): the file was altered"
        )));
    }
    let mut r = Reader::new(body);
    let identity = r.str("identity").map_err(fmt)?.to_string();
    let name = r.str("name").map_err(fmt)?.to_string();
    let features = r.str("features").map_err(fmt)?.to_string();
    let inputs = read_slots(&mut r, "input").map_err(fmt)?;
    let outputs = read_slots(&mut r, "output").map_err(fmt)?;
    let n = r.count(8, "statics").map_err(fmt)?;
    let statics = (0..n).map(|_| r.str("static").map(str::to_string)).collect::<Result<_, _>>().map_err(fmt)?;
    let variables = read_slots(&mut r, "variable").map_err(fmt)?;
    let graph = r.str("graph").map_err(fmt)?.to_string();
    let values = r.bytes("variable values").map_err(fmt)?.to_vec();
    let n = r.count(8, "kernels").map_err(fmt)?;
    let kernels = (0..n).map(|_| r.bytes("kernel").map(<[u8]>::to_vec)).collect::<Result<_, _>>().map_err(fmt)?;
    r.finish("artifact").map_err(fmt)?;
    Ok(Parts { identity, name, features, inputs, outputs, statics, variables, graph, values, kernels })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Parts {
        Parts {
            identity: "tracejit test".into(),
            name: "f".into(),
            features: "avx2".into(),
            inputs: vec![Slot { path: "args".into(), dtype: DType::F32, dims: vec![None, Some(3)] }],
            outputs: vec![Slot { path: "output".into(), dtype: DType::I64, dims: vec![] }],
            statics: vec!["usize".into()],
            variables: vec![Slot { path: "w".into(), dtype: DType::BF16, dims: vec![Some(2)] }],
            graph: "graph f() -> () {\n}".into(),
            values: vec![1, 2, 3],
            kernels: vec![vec![9; 5]],
        }
    }

    #[test]
    fn parts_round_trip() {
        let bytes = encode(&parts());
        let back = decode(&bytes).unwrap();
        assert_eq!((back.inputs, back.outputs, back.variables), (parts().inputs, parts().outputs, parts().variables));
        assert_eq!((back.graph, back.values, back.kernels), (parts().graph, parts().values, parts().kernels));
    }

    #[test]
    fn truncation_alteration_and_versions_are_named() {
        let bytes = encode(&parts());
        for cut in 0..bytes.len() {
            let DecodeError::Format(m) = decode(&bytes[..cut]).unwrap_err() else { panic!() };
            assert!(m.contains("truncated") || m.contains("magic") || m.contains("needs"), "cut {cut}: {m}");
        }
        for at in HEADER..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 1;
            let DecodeError::Format(m) = decode(&b).unwrap_err() else { panic!() };
            assert!(m.contains("checksum mismatch"), "{m}");
        }
        let mut b = bytes.clone();
        b[8] = 2;
        assert!(matches!(decode(&b), Err(DecodeError::Version(2))));
    }
}
