//! Per-tensor checksums in a checkpoint's safetensors metadata.
//!
//! safetensors has no checksum: a flipped bit in a tensor's data loads as a
//! slightly different weight, silently. A checkpoint tracejit writes
//! therefore records, in the header's `__metadata__` map (strings only),
//! `"tracejit.checksums": "crc32"` and, per tensor key `k`,
//! `"tracejit.crc32.k"`: the CRC-32 (IEEE) of the tensor's data bytes as 8
//! lowercase hex digits. CRC-32 detects every error of up to 3 flipped bits
//! and every burst of up to 32 bits in a tensor, and all but 2^-32 of the
//! rest.
//!
//! On restore, a file that has the marker must have a matching checksum for
//! every tensor; a file without it (written by another tool) is read
//! without checks, as before.

use std::collections::HashMap;

/// The metadata entry saying the file carries tracejit's checksums.
pub(crate) const MARKER_KEY: &str = "tracejit.checksums";
/// The only scheme so far.
const SCHEME: &str = "crc32";
/// Prefix of the per-tensor entries.
const PREFIX: &str = "tracejit.crc32.";

/// The CRC-32 of `data`.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The metadata a checkpoint of these `(key, data)` tensors records.
pub(crate) fn metadata<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> HashMap<String, String> {
    let mut m: HashMap<String, String> =
        tensors.into_iter().map(|(key, data)| (format!("{PREFIX}{key}"), format!("{:08x}", crc32(data)))).collect();
    m.insert(MARKER_KEY.to_string(), SCHEME.to_string());
    m
}

/// Why a tensor's data does not match the file's checksums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChecksumProblem {
    /// The recorded checksum differs from the data's.
    Mismatch {
        /// What the file records.
        recorded: String,
        /// The CRC-32 of the data read.
        computed: u32,
    },
    /// The file says it has checksums, but none for this tensor (or one
    /// that is not 8 hex digits).
    Missing,
    /// A checksum scheme this version does not know.
    UnknownScheme(String),
}

impl std::fmt::Display for ChecksumProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChecksumProblem::Mismatch { recorded, computed } => {
                write!(f, "its data has CRC-32 {computed:08x}, the file records {recorded}")
            }
            ChecksumProblem::Missing => write!(f, "the file records checksums but none (or a malformed one) for it"),
            ChecksumProblem::UnknownScheme(s) => write!(f, "the file's checksums use `{s}`, which is not known"),
        }
    }
}

/// Checks tensor `key`'s `data` against the file's metadata; `Ok` for a
/// file without tracejit's checksums.
pub(crate) fn verify(
    metadata: Option<&HashMap<String, String>>,
    key: &str,
    data: &[u8],
) -> Result<(), ChecksumProblem> {
    let Some(m) = metadata else { return Ok(()) };
    let Some(scheme) = m.get(MARKER_KEY) else { return Ok(()) };
    if scheme != SCHEME {
        return Err(ChecksumProblem::UnknownScheme(scheme.clone()));
    }
    let recorded = m.get(&format!("{PREFIX}{key}")).ok_or(ChecksumProblem::Missing)?;
    let parsed = (recorded.len() == 8).then(|| u32::from_str_radix(recorded, 16).ok()).flatten();
    let Some(expected) = parsed else { return Err(ChecksumProblem::Missing) };
    let computed = crc32(data);
    if computed != expected {
        return Err(ChecksumProblem::Mismatch { recorded: recorded.clone(), computed });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_checksums_verify_and_any_flip_is_caught() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let m = metadata([("w", data.as_slice())]);
        assert_eq!(verify(Some(&m), "w", &data), Ok(()));
        for bit in 0..data.len() * 8 {
            let mut d = data.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            assert!(matches!(verify(Some(&m), "w", &d), Err(ChecksumProblem::Mismatch { .. })), "bit {bit}");
        }
        assert_eq!(verify(Some(&m), "other", &data), Err(ChecksumProblem::Missing));
        // Files of other tools: no marker, no checks.
        assert_eq!(verify(None, "w", &[1, 2]), Ok(()));
        let foreign: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        assert_eq!(verify(Some(&foreign), "w", &[1, 2]), Ok(()));
        let future: HashMap<String, String> = [(MARKER_KEY.to_string(), "sha256".to_string())].into();
        assert!(matches!(verify(Some(&future), "w", &[]), Err(ChecksumProblem::UnknownScheme(_))));
    }
}
