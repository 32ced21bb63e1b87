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
//! The header is checked too: `"tracejit.header_crc32"` holds the CRC-32 of
//! the header's content (every tensor's key, dtype and shape, and every
//! other metadata entry, in a canonical order; the data offsets need no
//! check of their own, since a wrong offset reads bytes whose checksum does
//! not match).
//!
//! On restore, a file whose metadata has any `tracejit.` key is a file
//! tracejit wrote: it must carry a valid marker, its header checksum (when
//! present: files of earlier versions have none) must match, and every
//! tensor must have a matching checksum. Since such a file has at least two
//! `tracejit.` keys, no single flipped bit can make it pass for another
//! tool's file and skip the checks (one flip in the marker's key and one in
//! the data used to restore a wrong weight silently). A file without any
//! (written by another tool) is read without checks, as before.

use std::collections::HashMap;

/// What every metadata key tracejit writes starts with.
const NAMESPACE: &str = "tracejit.";
/// The metadata entry saying the file carries tracejit's checksums.
pub(crate) const MARKER_KEY: &str = "tracejit.checksums";
/// The only scheme so far.
const SCHEME: &str = "crc32";
/// Prefix of the per-tensor entries.
const PREFIX: &str = "tracejit.crc32.";
/// The header checksum's entry.
const HEADER_KEY: &str = "tracejit.header_crc32";

/// One tensor as the header describes it: key, dtype (as safetensors names
/// it: `F32`), shape.
pub(crate) type HeaderEntry<'a> = (&'a str, String, &'a [usize]);

/// The canonical text of a header that the header checksum covers: one
/// line per tensor by key, then one per metadata entry by key (the header
/// checksum's own left out), fields separated by NUL.
fn header_text(tensors: &[HeaderEntry<'_>], metadata: &HashMap<String, String>) -> String {
    let mut tensors: Vec<&HeaderEntry<'_>> = tensors.iter().collect();
    tensors.sort_by_key(|t| t.0);
    let mut text = String::new();
    for (key, dtype, shape) in tensors {
        text.push_str(&format!("{key}\0{dtype}\0{shape:?}\n"));
    }
    let mut entries: Vec<(&String, &String)> = metadata.iter().filter(|(k, _)| k.as_str() != HEADER_KEY).collect();
    entries.sort();
    for (k, v) in entries {
        text.push_str(&format!("{k}\0{v}\n"));
    }
    text
}

/// The CRC-32 of `data`.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The metadata a checkpoint of these tensors (header entry and data)
/// records: the marker, a checksum per tensor and the header checksum.
pub(crate) fn metadata(tensors: &[(HeaderEntry<'_>, &[u8])]) -> HashMap<String, String> {
    let mut m: HashMap<String, String> =
        tensors.iter().map(|((key, _, _), data)| (format!("{PREFIX}{key}"), format!("{:08x}", crc32(data)))).collect();
    m.insert(MARKER_KEY.to_string(), SCHEME.to_string());
    let entries: Vec<HeaderEntry<'_>> = tensors.iter().map(|(e, _)| e.clone()).collect();
    let header = crc32(header_text(&entries, &m).as_bytes());
    m.insert(HEADER_KEY.to_string(), format!("{header:08x}"));
    m
}

/// Checks the header of a file as a whole: a file with any `tracejit.`
/// metadata key must carry tracejit's marker, and its header checksum
/// (when it has one) must match `tensors`, the header as parsed.
pub(crate) fn verify_header(
    metadata: Option<&HashMap<String, String>>,
    tensors: &[HeaderEntry<'_>],
) -> Result<(), String> {
    let Some(m) = metadata else { return Ok(()) };
    let ours: Vec<&String> = m.keys().filter(|k| k.starts_with(NAMESPACE)).collect();
    if ours.is_empty() {
        return Ok(());
    }
    match m.get(MARKER_KEY) {
        Some(scheme) if scheme == SCHEME => {}
        Some(scheme) => return Err(format!("the file's checksums use `{scheme}`, which is not known")),
        None => {
            let mut shown: Vec<&str> = ours.iter().map(|k| k.as_str()).take(3).collect();
            shown.sort_unstable();
            return Err(format!(
                "its metadata has tracejit's entries ({}) but no valid `{MARKER_KEY}` marker: the header was \
                 damaged after it was written",
                shown.join(", ")
            ));
        }
    }
    let Some(recorded) = m.get(HEADER_KEY) else { return Ok(()) };
    let computed = crc32(header_text(tensors, m).as_bytes());
    if format!("{computed:08x}") != *recorded {
        return Err(format!("the header has CRC-32 {computed:08x}, the file records {recorded}"));
    }
    Ok(())
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
        let shape = [data.len()];
        let m = metadata(&[(("w", "U8".to_string(), &shape[..]), data.as_slice())]);
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

    #[test]
    fn the_header_checksum_covers_keys_dtypes_shapes_and_metadata() {
        let data = [1u8, 2, 3, 4];
        let shape = [4usize];
        let entry = ("w", "U8".to_string(), &shape[..]);
        let m = metadata(&[(entry.clone(), &data[..])]);
        assert_eq!(verify_header(Some(&m), std::slice::from_ref(&entry)), Ok(()));
        let other_shape = [2usize, 2];
        assert!(verify_header(Some(&m), &[("w", "U8".to_string(), &other_shape[..])]).is_err());
        assert!(verify_header(Some(&m), &[("v", "U8".to_string(), &shape[..])]).is_err());
        // Any one key renamed: the header no longer matches, or the marker
        // is gone; never a file that passes for another tool's. (A damaged
        // name of the header checksum itself leaves the per-tensor checks.)
        for key in m.keys().filter(|k| *k != HEADER_KEY) {
            let mut renamed = m.clone();
            let value = renamed.remove(key).unwrap();
            renamed.insert(key.replacen('t', "u", 1), value);
            assert!(verify_header(Some(&renamed), std::slice::from_ref(&entry)).is_err(), "{key}");
        }
    }
}
