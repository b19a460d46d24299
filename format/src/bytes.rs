//! Bounds-checked little-endian reading and writing, so that no decoder indexes a slice directly.
//! Public so that every crate decoding bytes from disk (the codec parameters in
//! `kvhoard-kernels` among them) uses the same checked reads.

use crate::FormatError;

/// Reads little-endian fields from a slice; every read is checked against the slice's length.
pub struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `buf`; errors name the structure `what`.
    pub fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Reader { what, buf, pos: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len());
        match end.and_then(|end| self.buf.get(self.pos..end).map(|s| (s, end))) {
            Some((slice, end)) => {
                self.pos = end;
                Ok(slice)
            }
            None => Err(FormatError::Truncated {
                what: self.what,
                needed: (self.pos as u64).saturating_add(n as u64),
                available: self.buf.len() as u64,
            }),
        }
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// The next little-endian `u8`.
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    /// The next little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Appends little-endian fields to a vector.
pub struct Writer {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer { buf: Vec::with_capacity(n) }
    }
    /// Appends `b`.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// Appends `v`, little-endian.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Appends `v`, little-endian.
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    /// Appends `v`, little-endian.
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    /// Appends `v`, little-endian.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// Appends `n` zero bytes.
    pub fn zeros(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + n, 0);
    }
}

/// Checks `stored` against the crc32c of `parts`.
pub(crate) fn check_crc(what: &'static str, stored: u32, parts: &[&[u8]]) -> Result<(), FormatError> {
    let computed = crate::crc32c_of(parts);
    if computed == stored {
        Ok(())
    } else {
        Err(FormatError::ChecksumMismatch { what, stored, computed })
    }
}

/// Checks a magic number.
pub(crate) fn check_magic(what: &'static str, found: &[u8], expected: &[u8]) -> Result<(), FormatError> {
    if found == expected {
        Ok(())
    } else {
        Err(FormatError::BadMagic { what, found: found.to_vec() })
    }
}

/// Checks a version number.
pub(crate) fn check_version(what: &'static str, found: u32, supported: u32) -> Result<(), FormatError> {
    if found == 0 || found > supported {
        Err(FormatError::UnsupportedVersion { what, found, supported })
    } else {
        Ok(())
    }
}
