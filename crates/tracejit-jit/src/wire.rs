//! A little-endian byte format for what tracejit writes to disk itself
//! (compile cache entries, the kernels inside artifacts): a [`Writer`] that
//! appends fixed-width integers and length-prefixed byte strings, and a
//! [`Reader`] that reads them back with every length checked against the
//! bytes that remain, so a truncated or altered file is an error naming the
//! field being read, never a panic or an allocation the file's bytes do not
//! back.

use std::fmt;

/// Why bytes did not read as the format they claim to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    /// The field being read (`"kernel code"`, `"relocation 3 symbol"`).
    pub field: String,
    /// What was wrong with it.
    pub message: String,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for WireError {}

/// Appends values in the wire format.
#[derive(Default, Debug)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// A little-endian `i64`.
    pub fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// Bytes as they are, with no length (the reader must know it).
    pub fn raw(&mut self, v: &[u8]) {
        self.bytes.extend_from_slice(v);
    }

    /// A byte string: its length as a `u64`, then its bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.raw(v);
    }

    /// A UTF-8 string, as [`Writer::bytes`].
    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads values in the wire format from a byte slice.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// An error about `field` at the current position.
    pub fn error(&self, field: &str, message: impl Into<String>) -> WireError {
        WireError { field: field.to_string(), message: format!("{} (at byte {})", message.into(), self.at) }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(self.error(field, format!("truncated: needs {n} bytes, {} left", self.remaining())));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, field: &str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, field: &str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, field: &str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A little-endian `i64`.
    pub fn i64(&mut self, field: &str) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    /// A count of items of at least `min_item_bytes` each: refused when the
    /// remaining bytes cannot hold that many, so a corrupt count never
    /// reserves memory the input does not back.
    pub fn count(&mut self, min_item_bytes: usize, field: &str) -> Result<usize, WireError> {
        let n = self.u64(field)?;
        let fits = usize::try_from(n).ok().filter(|&n| n.saturating_mul(min_item_bytes.max(1)) <= self.remaining());
        fits.ok_or_else(|| self.error(field, format!("count {n} exceeds the {} bytes left", self.remaining())))
    }

    /// A byte string written by [`Writer::bytes`].
    pub fn bytes(&mut self, field: &str) -> Result<&'a [u8], WireError> {
        let n = self.count(1, field)?;
        self.take(n, field)
    }

    /// A UTF-8 string written by [`Writer::str`].
    pub fn str(&mut self, field: &str) -> Result<&'a str, WireError> {
        let b = self.bytes(field)?;
        std::str::from_utf8(b).map_err(|e| self.error(field, format!("not UTF-8: {e}")))
    }

    /// Succeeds when every byte was read.
    pub fn finish(&self, what: &str) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.error(what, format!("{n} unexpected bytes after the end"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_truncation_is_named() {
        let mut w = Writer::new();
        w.u8(7);
        w.u32(0xdead_beef);
        w.i64(-3);
        w.str("tj_unary_f32");
        let bytes = w.finish();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u32("b").unwrap(), 0xdead_beef);
        assert_eq!(r.i64("c").unwrap(), -3);
        assert_eq!(r.str("d").unwrap(), "tj_unary_f32");
        r.finish("all").unwrap();
        for cut in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..cut]);
            let e = (|| -> Result<(), WireError> {
                r.u8("a")?;
                r.u32("b")?;
                r.i64("c")?;
                r.str("name")?;
                Ok(())
            })()
            .unwrap_err();
            assert!(e.message.contains("truncated") || e.message.contains("exceeds"), "{e}");
        }
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.u64(u64::MAX);
        let bytes = w.finish();
        let e = Reader::new(&bytes).count(16, "consts").unwrap_err();
        assert!(e.to_string().starts_with("consts: count 18446744073709551615 exceeds"), "{e}");
    }
}
