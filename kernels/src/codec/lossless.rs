//! Lossless: byte planes, then zstd.
//!
//! The high byte of a bf16 or fp16 value (sign and most of the exponent) takes few distinct
//! values in a KV tensor; the low byte (mantissa) is close to random. Interleaved, zstd finds
//! little to do (about 1.1x); split into planes, the high plane compresses well and the low one
//! is stored almost as it is (about 1.4x overall). Wider dtypes are split into as many planes as
//! bytes; one-byte dtypes are one plane.
//!
//! Payload: for each plane, most significant first, a u32 length and a zstd frame.

use crate::Error;

/// The compression contexts and plane buffer one worker reuses from block to block.
pub(crate) struct Contexts {
    compressor: Option<(i32, zstd::bulk::Compressor<'static>)>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    planes: Vec<u8>,
}

impl Contexts {
    pub fn new() -> Contexts {
        Contexts { compressor: None, decompressor: None, planes: Vec::new() }
    }

    fn compressor(&mut self, level: i32) -> Result<&mut zstd::bulk::Compressor<'static>, Error> {
        if self.compressor.as_ref().is_none_or(|(l, _)| *l != level) {
            let compressor = zstd::bulk::Compressor::new(level).map_err(Error::Zstd)?;
            self.compressor = Some((level, compressor));
        }
        Ok(&mut self.compressor.as_mut().expect("just set").1)
    }

    fn decompressor(&mut self) -> Result<&mut zstd::bulk::Decompressor<'static>, Error> {
        if self.decompressor.is_none() {
            self.decompressor = Some(zstd::bulk::Decompressor::new().map_err(Error::Zstd)?);
        }
        Ok(self.decompressor.as_mut().expect("just set"))
    }
}

pub(crate) fn max_payload(raw: usize, width: usize) -> usize {
    let plane = raw / width;
    width * (4 + zstd::zstd_safe::compress_bound(plane))
}

pub(crate) fn encode(
    data: &[u8],
    width: usize,
    level: i32,
    out: &mut [u8],
    contexts: &mut Contexts,
) -> Result<usize, Error> {
    let plane_len = data.len() / width;
    let mut planes = std::mem::take(&mut contexts.planes);
    let source: &[u8] = if width == 1 {
        data
    } else {
        planes.resize(data.len(), 0);
        split(data, width, &mut planes);
        &planes
    };
    let compressor = contexts.compressor(level)?;
    let mut at = 0;
    let mut result = Ok(());
    for plane in source.chunks_exact(plane_len.max(1)).take(width) {
        if out.len() < at + 4 {
            result = Err(Error::BufferTooSmall { need: at + 4, have: out.len() });
            break;
        }
        match compressor.compress_to_buffer(plane, &mut out[at + 4..]) {
            Ok(n) => {
                out[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
                at += 4 + n;
            }
            Err(e) => {
                result = Err(Error::Zstd(e));
                break;
            }
        }
    }
    contexts.planes = planes;
    result.map(|()| at)
}

pub(crate) fn decode(payload: &[u8], width: usize, out: &mut [u8], contexts: &mut Contexts) -> Result<(), Error> {
    let plane_len = out.len() / width;
    let mut planes = std::mem::take(&mut contexts.planes);
    let result = (|| {
        let target: &mut [u8] = if width == 1 {
            &mut *out
        } else {
            planes.resize(out.len(), 0);
            &mut planes
        };
        let decompressor = contexts.decompressor()?;
        let mut rest = payload;
        for plane in target.chunks_exact_mut(plane_len.max(1)).take(width) {
            if rest.len() < 4 {
                return Err(Error::Corrupt("lossless payload truncated"));
            }
            let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let frame = rest.get(4..4 + n).ok_or(Error::Corrupt("lossless plane longer than its payload"))?;
            let got = decompressor
                .decompress_to_buffer(frame, plane)
                .map_err(|_| Error::Corrupt("lossless plane does not decompress"))?;
            if got != plane.len() {
                return Err(Error::Corrupt("lossless plane has the wrong length"));
            }
            rest = &rest[4 + n..];
        }
        if !rest.is_empty() {
            return Err(Error::Corrupt("bytes after the last lossless plane"));
        }
        Ok(())
    })();
    if result.is_ok() && width > 1 {
        merge(&planes, width, out);
    }
    contexts.planes = planes;
    result
}

/// Plane `p` (0 = most significant byte) gets byte `width - 1 - p` of every little-endian value.
fn split(data: &[u8], width: usize, planes: &mut [u8]) {
    let n = data.len() / width;
    if width == 2 {
        let (high, low) = planes.split_at_mut(n);
        for ((value, h), l) in data.chunks_exact(2).zip(high).zip(low) {
            *l = value[0];
            *h = value[1];
        }
        return;
    }
    for (i, value) in data.chunks_exact(width).enumerate() {
        for (byte, &b) in value.iter().enumerate() {
            planes[(width - 1 - byte) * n + i] = b;
        }
    }
}

fn merge(planes: &[u8], width: usize, out: &mut [u8]) {
    let n = out.len() / width;
    if width == 2 {
        let (high, low) = planes.split_at(n);
        for ((value, &h), &l) in out.chunks_exact_mut(2).zip(high).zip(low) {
            value[0] = l;
            value[1] = h;
        }
        return;
    }
    for (i, value) in out.chunks_exact_mut(width).enumerate() {
        for (byte, b) in value.iter_mut().enumerate() {
            *b = planes[(width - 1 - byte) * n + i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_merge_are_inverse() {
        for width in [1usize, 2, 4] {
            let data: Vec<u8> = (0..64 * width).map(|i| (i * 31 % 251) as u8).collect();
            let mut planes = vec![0; data.len()];
            split(&data, width, &mut planes);
            let mut back = vec![0; data.len()];
            merge(&planes, width, &mut back);
            assert_eq!(back, data);
        }
    }
}
