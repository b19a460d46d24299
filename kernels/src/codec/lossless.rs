//! Lossless: byte planes, then zstd.
//!
//! The high byte of a bf16 or fp16 value (sign and most of the exponent) takes few distinct
//! values in a KV tensor; the low byte (mantissa) is close to random. Interleaved, zstd finds
//! little to do (about 1.1x); split into planes, the high plane compresses well and the low one
//! is stored almost as it is (about 1.4x overall). Wider dtypes are split into as many planes as
//! bytes; one-byte dtypes are one plane.
//!
//! The block is cut into chunks of [`CHUNK_ELEMENTS`] values, and each chunk into its planes:
//! a decoder inflates one chunk's planes into a buffer that stays in cache and interleaves them
//! straight into the output, instead of streaming whole-block planes through memory twice.
//!
//! Each plane is one zstd frame. By default (levels up to 1) the frame holds literals only:
//! zstd's Huffman coder without its match finder, which on KV planes compresses better than
//! zstd's level 1 and decodes 1.7 times as fast (docs/decisions/0007); a plane where matches may
//! pay (coded to less than a quarter, or a sample of it smaller with matches) is also compressed
//! with zstd's level 1, and the smaller frame kept. Levels above 1 are zstd's, matches and all. Every frame is a standard zstd
//! frame, so any zstd decoder reads any of them.
//!
//! Payload: for each chunk, for each plane (most significant first), a u32 length and a zstd
//! frame.

use std::ptr::NonNull;

use zstd::zstd_safe::zstd_sys;

#[cfg(target_arch = "x86_64")]
use crate::simd::Kind;
use crate::simd::Level;
use crate::Error;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Values per chunk: 2 MiB of bf16, so a 2 MiB block is one chunk and a larger one streams
/// through a plane buffer that stays in cache. Smaller chunks cost ratio and speed (more zstd
/// frames, shorter windows): 256 KiB chunks decoded 32 MiB blocks at 1.39 GB/s, 2 MiB at 1.54.
pub(crate) const CHUNK_ELEMENTS: usize = 1 << 20;

/// zstd's largest block: a literals-only frame has one literals section per block.
const BLOCK_MAX: usize = 128 << 10;

/// A plane coded to less than this fraction of its size by literals alone is tried with zstd's
/// matches as well.
const TRY_MATCHES_BELOW: f64 = 0.25;

/// Otherwise its first bytes are: a plane whose sample codes to less than `MATCHES_GAIN` of its
/// literals-only size with matches is tried whole with matches (data with repeats: copied heads,
/// repeated tokens). KV planes gain nothing from matches (docs/decisions/0007).
const MATCH_SAMPLE: usize = 64 << 10;
const MATCHES_GAIN: f64 = 0.9;

/// The compression contexts and plane buffer one worker reuses from block to block.
pub(crate) struct Contexts {
    compressor: Option<(i32, zstd::bulk::Compressor<'static>)>,
    literals: Option<LiteralsCoder>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    planes: Vec<u8>,
    /// Where a plane's frame with matches goes, to compare with its literals-only frame.
    spare: Vec<u8>,
}

impl Contexts {
    pub fn new() -> Contexts {
        Contexts { compressor: None, literals: None, decompressor: None, planes: Vec::new(), spare: Vec::new() }
    }

    /// Compresses one plane into `out`, returning the frame's length.
    fn compress_plane(&mut self, plane: &[u8], level: i32, out: &mut [u8]) -> Result<usize, Error> {
        if level > 1 || plane.is_empty() {
            return self.compressor(level)?.compress_to_buffer(plane, out).map_err(Error::Zstd);
        }
        if self.literals.is_none() {
            self.literals = Some(LiteralsCoder::new()?);
        }
        let mut spare = std::mem::take(&mut self.spare);
        spare.resize(zstd::zstd_safe::compress_bound(plane.len()), 0);
        let result = self.literals_or_matches(plane, out, &mut spare);
        self.spare = spare;
        result
    }

    /// The smaller of a literals-only frame and a frame with matches (zstd level 1), trying the
    /// latter only where the plane is very compressible or a sample of it gains from matches.
    fn literals_or_matches(&mut self, plane: &[u8], out: &mut [u8], spare: &mut [u8]) -> Result<usize, Error> {
        let Some(literals) = self.literals.as_mut() else { return Err(Error::Invalid("no literals coder".into())) };
        let written = literals.compress(plane, out)?;
        let try_matches = (written as f64) < TRY_MATCHES_BELOW * plane.len() as f64 || {
            let sample = &plane[..plane.len().min(MATCH_SAMPLE)];
            let sample_literals = literals.compress(sample, spare)?;
            let sample_matches = self.compressor(1)?.compress_to_buffer(sample, spare).map_err(Error::Zstd)?;
            (sample_matches as f64) < MATCHES_GAIN * sample_literals as f64
        };
        if try_matches {
            let with_matches = self.compressor(1)?.compress_to_buffer(plane, spare).map_err(Error::Zstd)?;
            if with_matches < written {
                out[..with_matches].copy_from_slice(&spare[..with_matches]);
                return Ok(with_matches);
            }
        }
        Ok(written)
    }

    fn compressor(&mut self, level: i32) -> Result<&mut zstd::bulk::Compressor<'static>, Error> {
        if self.compressor.as_ref().is_none_or(|(l, _)| *l != level) {
            let compressor = zstd::bulk::Compressor::new(level).map_err(Error::Zstd)?;
            self.compressor = Some((level, compressor));
        }
        match &mut self.compressor {
            Some((_, compressor)) => Ok(compressor),
            None => Err(Error::Invalid("no zstd compressor".into())),
        }
    }

    fn decompressor(&mut self) -> Result<&mut zstd::bulk::Decompressor<'static>, Error> {
        if self.decompressor.is_none() {
            self.decompressor = Some(zstd::bulk::Decompressor::new().map_err(Error::Zstd)?);
        }
        self.decompressor.as_mut().ok_or_else(|| Error::Invalid("no zstd decompressor".into()))
    }
}

pub(crate) fn max_payload(raw: usize, width: usize) -> usize {
    let chunk = CHUNK_ELEMENTS * width;
    let full = raw / chunk;
    let bound = |bytes: usize| width * (4 + zstd::zstd_safe::compress_bound(bytes / width));
    full * bound(chunk) + bound(raw % chunk)
}

pub(crate) fn encode(
    data: &[u8],
    width: usize,
    level: i32,
    out: &mut [u8],
    contexts: &mut Contexts,
) -> Result<usize, Error> {
    encode_at(Level::best(), data, width, level, out, contexts)
}

/// [`encode`] splitting planes on instruction set `level_of_cpu` (every one gives the same bytes).
pub(crate) fn encode_at(
    level_of_cpu: Level,
    data: &[u8],
    width: usize,
    level: i32,
    out: &mut [u8],
    contexts: &mut Contexts,
) -> Result<usize, Error> {
    let mut planes = std::mem::take(&mut contexts.planes);
    planes.resize(CHUNK_ELEMENTS * width, 0);
    let result = (|| {
        let mut at = 0;
        for chunk in data.chunks(CHUNK_ELEMENTS * width) {
            let n = chunk.len() / width;
            let source: &[u8] = if width == 1 {
                chunk
            } else {
                split(level_of_cpu, chunk, width, &mut planes[..chunk.len()]);
                &planes[..chunk.len()]
            };
            for plane in source.chunks_exact(n) {
                if out.len() < at + 4 {
                    return Err(Error::BufferTooSmall { need: at + 4, have: out.len() });
                }
                let written = contexts.compress_plane(plane, level, &mut out[at + 4..])?;
                out[at..at + 4].copy_from_slice(&(written as u32).to_le_bytes());
                at += 4 + written;
            }
        }
        Ok(at)
    })();
    contexts.planes = planes;
    result
}

pub(crate) fn decode(payload: &[u8], width: usize, out: &mut [u8], contexts: &mut Contexts) -> Result<(), Error> {
    decode_at(Level::best(), payload, width, out, contexts)
}

/// [`decode`] merging planes on instruction set `level_of_cpu` (every one gives the same bytes).
pub(crate) fn decode_at(
    level_of_cpu: Level,
    payload: &[u8],
    width: usize,
    out: &mut [u8],
    contexts: &mut Contexts,
) -> Result<(), Error> {
    let mut planes = std::mem::take(&mut contexts.planes);
    planes.resize(CHUNK_ELEMENTS * width, 0);
    let result = (|| {
        let decompressor = contexts.decompressor()?;
        let mut rest = payload;
        for chunk in out.chunks_mut(CHUNK_ELEMENTS * width) {
            let n = chunk.len() / width;
            let target: &mut [u8] = if width == 1 { &mut *chunk } else { &mut planes[..chunk.len()] };
            for plane in target.chunks_exact_mut(n) {
                if rest.len() < 4 {
                    return Err(Error::corrupt("lossless payload truncated"));
                }
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let frame = rest.get(4..4 + len).ok_or(Error::corrupt("lossless plane longer than its payload"))?;
                let got = decompressor
                    .decompress_to_buffer(frame, plane)
                    .map_err(|_| Error::corrupt("lossless plane does not decompress"))?;
                if got != plane.len() {
                    return Err(Error::corrupt("lossless plane has the wrong length"));
                }
                rest = &rest[4 + len..];
            }
            if width > 1 {
                merge(level_of_cpu, &planes[..chunk.len()], width, chunk);
            }
        }
        if !rest.is_empty() {
            return Err(Error::corrupt("bytes after the last lossless plane"));
        }
        Ok(())
    })();
    contexts.planes = planes;
    result
}

/// Plane `p` (0 = most significant byte) gets byte `width - 1 - p` of every little-endian value.
fn split(level: Level, data: &[u8], width: usize, planes: &mut [u8]) {
    let n = data.len() / width;
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 && (width == 2 || width == 4) {
        // SAFETY: a level of kind Avx2 exists only where AVX2, FMA and F16C were detected
        // (simd.rs), the target features the functions are compiled for.
        let done = unsafe {
            if width == 2 {
                let (high, low) = planes[..2 * n].split_at_mut(n);
                avx2::split2(&data[..2 * n], high, low)
            } else {
                avx2::split4(data, n, planes)
            }
        };
        split_scalar(data, width, n, done, planes);
        return;
    }
    let _ = level;
    split_scalar(data, width, n, 0, planes);
}

/// The scalar [`split`] of values `from..n`.
fn split_scalar(data: &[u8], width: usize, n: usize, from: usize, planes: &mut [u8]) {
    if width == 2 {
        let (high, low) = planes.split_at_mut(n);
        for ((value, h), l) in data[2 * from..2 * n].chunks_exact(2).zip(&mut high[from..]).zip(&mut low[from..n]) {
            *l = value[0];
            *h = value[1];
        }
        return;
    }
    for (i, value) in data[..width * n].chunks_exact(width).enumerate().skip(from) {
        for (byte, &b) in value.iter().enumerate() {
            planes[(width - 1 - byte) * n + i] = b;
        }
    }
}

/// The inverse of [`split`].
fn merge(level: Level, planes: &[u8], width: usize, out: &mut [u8]) {
    let n = out.len() / width;
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 && (width == 2 || width == 4) {
        // SAFETY: as in `split`.
        let done = unsafe {
            if width == 2 {
                let (high, low) = planes[..2 * n].split_at(n);
                avx2::merge2(high, low, &mut out[..2 * n])
            } else {
                avx2::merge4(planes, n, out)
            }
        };
        merge_scalar(planes, width, n, done, out);
        return;
    }
    let _ = level;
    merge_scalar(planes, width, n, 0, out);
}

/// The scalar [`merge`] of values `from..n`.
fn merge_scalar(planes: &[u8], width: usize, n: usize, from: usize, out: &mut [u8]) {
    if width == 2 {
        let (high, low) = planes.split_at(n);
        for ((value, &h), &l) in out[2 * from..2 * n].chunks_exact_mut(2).zip(&high[from..]).zip(&low[from..n]) {
            value[0] = l;
            value[1] = h;
        }
        return;
    }
    for (i, value) in out[..width * n].chunks_exact_mut(width).enumerate().skip(from) {
        for (byte, b) in value.iter_mut().enumerate() {
            *b = planes[(width - 1 - byte) * n + i];
        }
    }
}

/// A zstd compression context that writes frames of literals only: every block one literals
/// section (Huffman-coded, or stored raw or as one repeated byte where that is smaller) and no
/// sequences, through zstd's `ZSTD_compressSequences` given no matches. Its output is a standard
/// frame. (zstd-safe wraps no sequence API, hence the raw context.)
struct LiteralsCoder {
    cctx: NonNull<zstd_sys::ZSTD_CCtx>,
    /// One block delimiter per block.
    sequences: Vec<zstd_sys::ZSTD_Sequence>,
    /// A frame's room when the caller's buffer is smaller than zstd's bound.
    scratch: Vec<u8>,
}

// SAFETY: the context is owned by this value alone and used only through `&mut self`; a zstd
// context has no tie to the thread that made it (zstd-safe's `CCtx` is `Send` for the same
// reason).
unsafe impl Send for LiteralsCoder {}

impl LiteralsCoder {
    fn new() -> Result<LiteralsCoder, Error> {
        // SAFETY: no preconditions; null means out of memory.
        let cctx = NonNull::new(unsafe { zstd_sys::ZSTD_createCCtx() })
            .ok_or_else(|| Error::Zstd(std::io::Error::other("cannot make a zstd context")))?;
        let coder = LiteralsCoder { cctx, sequences: Vec::new(), scratch: Vec::new() };
        use zstd_sys::ZSTD_cParameter::*;
        for (parameter, value) in [
            (ZSTD_c_compressionLevel, 1),
            // ZSTD_c_literalCompressionMode = ZSTD_ps_enable: Huffman-code literals.
            (ZSTD_c_experimentalParam5, 1),
            // ZSTD_c_blockDelimiters = ZSTD_sf_explicitBlockDelimiters: the sequences given end
            // every block.
            (ZSTD_c_experimentalParam11, 1),
        ] {
            // SAFETY: `cctx` is a live context.
            let code = unsafe { zstd_sys::ZSTD_CCtx_setParameter(coder.cctx.as_ptr(), parameter, value) };
            check(code)?;
        }
        Ok(coder)
    }

    /// Compresses `plane` into `out`, returning the frame's length.
    fn compress(&mut self, plane: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        let bound = zstd::zstd_safe::compress_bound(plane.len());
        if out.len() >= bound {
            return self.compress_within_bound(plane, out);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(bound, 0);
        let result = self.compress_within_bound(plane, &mut scratch).and_then(|len| {
            let dst = out
                .get_mut(..len)
                .ok_or_else(|| Error::Zstd(std::io::Error::other("Destination buffer is too small")))?;
            dst.copy_from_slice(&scratch[..len]);
            Ok(len)
        });
        self.scratch = scratch;
        result
    }

    /// [`LiteralsCoder::compress`] into a buffer that holds any frame of the plane.
    fn compress_within_bound(&mut self, plane: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        // zstd 1.5.7's ZSTD_compressSequences does not check that the frame header fits in a
        // small destination and then writes out of bounds; a destination of ZSTD_compressBound
        // bytes holds any frame of the plane, header and all, so nothing is written past it.
        if out.len() < zstd::zstd_safe::compress_bound(plane.len()) {
            return Err(Error::Invalid("literals-only frame given less than zstd's bound".into()));
        }
        self.sequences.clear();
        for block in plane.chunks(BLOCK_MAX) {
            // A delimiter: no match, the whole block as literals.
            self.sequences.push(zstd_sys::ZSTD_Sequence {
                offset: 0,
                litLength: block.len() as u32,
                matchLength: 0,
                rep: 0,
            });
        }
        // SAFETY: `cctx` is a live context used by this call alone (`&mut self`); `out`,
        // `sequences` and `plane` are valid for the lengths given for the whole call; `out` holds
        // ZSTD_compressBound(plane.len()) bytes (checked above), within which zstd writes.
        let code = unsafe {
            zstd_sys::ZSTD_compressSequences(
                self.cctx.as_ptr(),
                out.as_mut_ptr().cast(),
                out.len(),
                self.sequences.as_ptr(),
                self.sequences.len(),
                plane.as_ptr().cast(),
                plane.len(),
            )
        };
        check(code)
    }
}

impl Drop for LiteralsCoder {
    fn drop(&mut self) {
        // SAFETY: `cctx` came from ZSTD_createCCtx and is freed once, here.
        unsafe { zstd_sys::ZSTD_freeCCtx(self.cctx.as_ptr()) };
    }
}

/// A zstd return code as a length or an error.
fn check(code: usize) -> Result<usize, Error> {
    // SAFETY: ZSTD_isError only looks at the number.
    if unsafe { zstd_sys::ZSTD_isError(code) } != 0 {
        Err(Error::Zstd(std::io::Error::other(zstd::zstd_safe::get_error_name(code))))
    } else {
        Ok(code)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::simd::testing;

    #[test]
    fn split_and_merge_are_inverse() {
        for width in [1usize, 2, 4] {
            let data: Vec<u8> = (0..64 * width).map(|i| (i * 31 % 251) as u8).collect();
            let mut planes = vec![0; data.len()];
            split(Level::SCALAR, &data, width, &mut planes);
            let mut back = vec![0; data.len()];
            merge(Level::SCALAR, &planes, width, &mut back);
            assert_eq!(back, data);
        }
    }

    #[test]
    fn every_level_splits_and_merges_like_the_scalar_reference() {
        let levels = testing::levels("lossless plane split and merge against the scalar reference");
        let mut rng = Rng::new(0x5eed_0101);
        for width in [1usize, 2, 4, 8] {
            for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 1000, 4097] {
                let mut data = vec![0u8; n * width];
                rng.fill(&mut data);
                let mut reference = vec![0u8; data.len()];
                split(Level::SCALAR, &data, width, &mut reference);
                for &level in &levels {
                    let mut planes = vec![0xa5u8; data.len()];
                    split(level, &data, width, &mut planes);
                    assert!(planes == reference, "split differs on {}, width {width}, {n} values", level.name());
                    let mut back = vec![0x5au8; data.len()];
                    merge(level, &planes, width, &mut back);
                    assert!(back == data, "merge differs on {}, width {width}, {n} values", level.name());
                }
            }
        }
    }

    /// Blocks that exercise the entropy stage: noise, KV-like bf16, constant, mostly zeros (where
    /// matches win), and sizes that are not whole chunks or blocks.
    fn blocks(rng: &mut Rng) -> Vec<(String, Vec<u8>, usize)> {
        let mut out = Vec::new();
        for (width, n) in [(2usize, 0usize), (2, 1), (2, 1000), (2, 300_001), (1, 5000), (4, 70_000), (8, 999)] {
            let mut noise = vec![0u8; n * width];
            rng.fill(&mut noise);
            out.push((format!("noise {width}x{n}"), noise, width));
            let kv: Vec<u8> = (0..n)
                .flat_map(|_| {
                    let bits = half::bf16::from_f32(rng.normal() * 0.5).to_bits().to_le_bytes();
                    bits.into_iter().cycle().take(width).collect::<Vec<_>>()
                })
                .collect();
            out.push((format!("kv-like {width}x{n}"), kv, width));
            out.push((format!("constant {width}x{n}"), vec![0x3c; n * width], width));
            let mut sparse = vec![0u8; n * width];
            for _ in 0..n / 100 {
                let at = rng.below(sparse.len() as u64) as usize;
                sparse[at] = rng.next_u64() as u8;
            }
            out.push((format!("sparse {width}x{n}"), sparse, width));
        }
        // More than one chunk.
        let mut two_chunks = vec![0u8; 2 * CHUNK_ELEMENTS * 2 + 6];
        rng.fill(&mut two_chunks);
        out.push(("noise, two chunks and a bit".into(), two_chunks, 2));
        out
    }

    #[test]
    fn every_level_and_zstd_level_round_trips_and_writes_the_same_payload() {
        let levels = testing::levels("lossless encode and decode against the scalar reference");
        let mut rng = Rng::new(0x5eed_0102);
        let mut contexts = Contexts::new();
        for (what, data, width) in blocks(&mut rng) {
            for zstd_level in [-3, 1, 3] {
                let mut reference = vec![0u8; max_payload(data.len(), width)];
                let len = encode_at(Level::SCALAR, &data, width, zstd_level, &mut reference, &mut contexts).unwrap();
                reference.truncate(len);
                for &level in &levels {
                    let mut payload = vec![0u8; max_payload(data.len(), width)];
                    let len = encode_at(level, &data, width, zstd_level, &mut payload, &mut contexts).unwrap();
                    assert!(
                        payload[..len] == reference[..],
                        "{what}, level {zstd_level}: payload differs on {}",
                        level.name()
                    );
                    let mut back = vec![0u8; data.len()];
                    decode_at(level, &reference, width, &mut back, &mut contexts).unwrap();
                    assert!(back == data, "{what}, level {zstd_level}: does not round-trip on {}", level.name());
                }
                // Every plane is a standard zstd frame.
                let mut rest = &reference[..];
                while !rest.is_empty() {
                    let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
                    let frame = &rest[4..4 + len];
                    zstd::bulk::decompress(frame, CHUNK_ELEMENTS).unwrap();
                    rest = &rest[4 + len..];
                }
            }
        }
    }

    #[test]
    fn small_output_buffers_are_errors_not_overruns() {
        // zstd's sequence compressor writes past a destination too small for its frame header;
        // the coder must never hand it one (run under valgrind or miri to see an overrun).
        let mut rng = Rng::new(0x5eed_0104);
        let mut data = vec![0u8; 5000];
        rng.fill(&mut data);
        let mut contexts = Contexts::new();
        for len in 0..64 {
            let mut out = vec![0u8; len];
            assert!(encode(&data, 2, 1, &mut out, &mut contexts).is_err(), "{len} bytes");
        }
        let mut coder = LiteralsCoder::new().unwrap();
        let plane = vec![7u8; 100];
        for len in 0..32 {
            let mut out = vec![0u8; len];
            let result = coder.compress(&plane, &mut out);
            if let Ok(n) = result {
                assert_eq!(zstd::bulk::decompress(&out[..n], 100).unwrap(), plane);
            }
        }
    }

    #[test]
    fn literals_only_frames_are_smaller_than_matches_on_kv_planes_and_larger_on_zeros() {
        let mut rng = Rng::new(0x5eed_0103);
        let kv: Vec<u8> = (0..1 << 16).map(|_| (half::bf16::from_f32(rng.normal()).to_bits() >> 8) as u8).collect();
        let zeros = vec![0u8; 1 << 16];
        let mut coder = LiteralsCoder::new().unwrap();
        let mut out = vec![0u8; zstd::zstd_safe::compress_bound(1 << 16)];
        let literals = coder.compress(&kv, &mut out).unwrap();
        let matches = zstd::bulk::compress(&kv, 1).unwrap().len();
        assert!(literals < matches, "{literals} against {matches} with matches");
        // Zeros: the plane codes to almost nothing either way (one repeated byte a block).
        let mut contexts = Contexts::new();
        let len = contexts.compress_plane(&zeros, 1, &mut out).unwrap();
        assert!(len < 64, "{len}");
        // A plane with long repeats: matches win, and the smaller frame is kept.
        let repeats: Vec<u8> = kv[..4096].iter().copied().cycle().take(1 << 16).collect();
        let len = contexts.compress_plane(&repeats, 1, &mut out).unwrap();
        assert!(len < coder.compress(&repeats, &mut vec![0u8; 1 << 17]).unwrap() / 2, "{len}");
        assert_eq!(zstd::bulk::decompress(&out[..len], 1 << 16).unwrap(), repeats);
    }
}
