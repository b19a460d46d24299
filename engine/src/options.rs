//! What callers choose: durability per write, put and read options, volume geometry, store tuning.

use kvhoard_format::{BlockDesc, CompressionMeta};

use crate::error::{Result, StoreError};

/// When a write is acknowledged. Each level includes the ones before it.
///
/// | level | `put` returns after | survives a process crash | survives power loss |
/// |---|---|---|---|
/// | `Buffered` | the record is encoded in an engine buffer and queued for writing | no | no |
/// | `Written` | the record's write completed, and so did every earlier write to the log | yes | no |
/// | `Synced` | an fdatasync that covers the record returned | yes | yes |
///
/// A buffered or written record is readable by `get` as soon as `put` returns. A record that
/// does not survive a crash disappears whole: recovery never returns a partial block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledged in the write buffer.
    Buffered,
    /// Acknowledged when written to the device (the OS page cache, or the device with O_DIRECT).
    #[default]
    Written,
    /// Acknowledged after fdatasync.
    Synced,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "buffered" => Ok(Durability::Buffered),
            "written" => Ok(Durability::Written),
            "synced" => Ok(Durability::Synced),
            _ => Err(format!("unknown durability {s:?}: use buffered, written or synced")),
        }
    }
}

/// Options of one `put`.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    /// Seconds until the key expires; `None` = never.
    pub ttl_secs: Option<u32>,
    /// Group (context) the block belongs to.
    pub group: Option<u64>,
    /// Content hash of the parent block.
    pub parent: Option<[u8; 32]>,
    /// When the put is acknowledged.
    pub durability: Durability,
    /// What the bytes are; opaque by default.
    pub desc: Option<BlockDesc>,
    /// How the bytes were compressed by the caller; none by default. With a codec, `bytes` are
    /// the stored form and `raw_len`/`content_hash` come from [`PutOptions::raw`].
    pub compression: Option<CompressionMeta>,
    /// For pre-compressed bytes: the raw length and blake3 of the raw bytes.
    pub raw: Option<(u64, [u8; 32])>,
    /// Codec the store compresses the bytes with (`None`: the namespace's default;
    /// `Some(CodecSpec::RAW)`: none). The block keeps the blake3 name of the bytes given. A lossy
    /// codec is refused in a namespace whose policy denies them; a block the codec cannot take
    /// is stored as it is (counted in `Stats::codec_skipped`).
    pub codec: Option<kvhoard_kernels::CodecSpec>,
}

/// Options of one read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Also check blake3 of the bytes against the content hash (crc32c is always checked).
    pub verify_hash: bool,
}

/// Geometry of a new volume.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Bytes of the volume file; for a block device, the device's size is used when `None`.
    pub capacity_bytes: Option<u64>,
    /// Bytes per segment.
    pub segment_size_bytes: u64,
}

impl Default for CreateOptions {
    fn default() -> Self {
        let capacity = 1 << 30;
        CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: Self::default_segment_bytes(capacity) }
    }
}

impl CreateOptions {
    /// Volumes of at least this many bytes get [`CreateOptions::LARGE_SEGMENT_BYTES`] segments.
    pub const LARGE_FROM_BYTES: u64 = 32 << 30;
    /// The segment size of a volume smaller than [`CreateOptions::LARGE_FROM_BYTES`].
    pub const SMALL_SEGMENT_BYTES: u64 = 64 << 20;
    /// The segment size of a volume of [`CreateOptions::LARGE_FROM_BYTES`] or more.
    pub const LARGE_SEGMENT_BYTES: u64 = 256 << 20;

    /// The segment size a volume of `capacity_bytes` gets unless one is asked for. A record
    /// never spans segments, so the room a segment's last record did not fit in is lost: 32 MiB
    /// blocks (a 256-token chunk of an 8B model) fill a 64 MiB segment only half, a 256 MiB one
    /// seven eighths. A small volume keeps 64 MiB segments, enough of them (16 in 1 GiB) that
    /// reclaim and cleaning free a little at a time (docs/decisions/0009-segment-size-follows-capacity.md).
    pub fn default_segment_bytes(capacity_bytes: u64) -> u64 {
        if capacity_bytes >= Self::LARGE_FROM_BYTES {
            Self::LARGE_SEGMENT_BYTES
        } else {
            Self::SMALL_SEGMENT_BYTES
        }
    }
}

/// Tuning of an open store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Try O_DIRECT (falls back to buffered I/O where the file system refuses it).
    pub direct_io: bool,
    /// I/O backend for the volume.
    pub io_backend: crate::device::IoBackend,
    /// Rings, queue depth and chunk size of the io_uring backend.
    pub uring: crate::device::UringConfig,
    /// Bytes of unused record buffers kept for reuse (the pool never holds more).
    pub buffer_pool_bytes: usize,
    /// Write a checkpoint after this many segments were sealed (and at close).
    pub checkpoint_every_segments: u32,
    /// How the log writer keeps the device busy: bytes in flight, largest write.
    pub writer: crate::writer::WriterConfig,
    /// Source of the current time (TTLs, record timestamps).
    pub clock: crate::clock::Clock,
    /// Decides where blocks live: DRAM admission, and which segment a full volume reclaims
    /// ([`crate::placement::Fifo`] by default).
    pub placement: std::sync::Arc<dyn crate::placement::Placement>,
    /// Bytes of blocks the DRAM tier keeps in memory above the log; 0 turns it off.
    pub dram_tier_bytes: u64,
    /// Seconds a pin ([`crate::Store::pin`]) holds after it was last taken, so that a client
    /// that dies holding pins cannot keep segments from reclaim forever.
    pub pin_ttl_secs: u32,
    /// Bytes per second the background cleaner may write relocating kept blocks (it runs when
    /// placement cleans, [`crate::placement::Placement::cleans`]).
    pub clean_bytes_per_sec: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            direct_io: true,
            io_backend: crate::device::IoBackend::Auto,
            uring: crate::device::UringConfig::default(),
            buffer_pool_bytes: 256 << 20,
            checkpoint_every_segments: 8,
            writer: crate::writer::WriterConfig::default(),
            clock: crate::clock::Clock::system(),
            placement: std::sync::Arc::new(crate::placement::Fifo),
            dram_tier_bytes: 0,
            pin_ttl_secs: 600,
            clean_bytes_per_sec: 256 << 20,
        }
    }
}

impl StoreOptions {
    /// Checks the options a caller could get wrong by orders of magnitude: memory budgets past
    /// what the machine has (a DRAM tier of 16 EiB would grow until the process is killed),
    /// and rates and intervals of zero.
    pub fn validate(&self) -> Result<()> {
        let memory = physical_memory_bytes();
        let budgets = [("DRAM tier", self.dram_tier_bytes), ("buffer pool", self.buffer_pool_bytes as u64)];
        for (what, bytes) in budgets {
            if memory.is_some_and(|m| bytes > m) {
                return Err(StoreError::invalid(
                    "option",
                    format!(
                        "the {what} of {bytes} bytes is more than this machine's memory ({} bytes)",
                        memory.unwrap_or(0)
                    ),
                ));
            }
        }
        if self.checkpoint_every_segments == 0 {
            return Err(StoreError::invalid("option", "a checkpoint every 0 segments: give at least 1"));
        }
        if self.clean_bytes_per_sec == 0 {
            return Err(StoreError::invalid("option", "a cleaning rate of 0 bytes a second: give at least 1 MiB"));
        }
        Ok(())
    }
}

/// Bytes of physical memory, if the system says.
fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf takes an integer name, reads no memory of ours and only returns a value.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::log::OpenSeg;

    #[test]
    fn options_past_the_machine_or_of_zero_are_refused() {
        assert!(StoreOptions::default().validate().is_ok());
        let huge = StoreOptions { dram_tier_bytes: u64::MAX, ..StoreOptions::default() };
        assert!(huge.validate().unwrap_err().to_string().contains("more than this machine's memory"));
        let never = StoreOptions { checkpoint_every_segments: 0, ..StoreOptions::default() };
        assert!(never.validate().is_err());
        let stuck = StoreOptions { clean_bytes_per_sec: 0, ..StoreOptions::default() };
        assert!(stuck.validate().is_err());
    }

    /// How many records of a `block`-byte block (its header in a unit of its own) one segment of
    /// `segment` bytes holds.
    fn records_per_segment(block: u64, segment: u64) -> u32 {
        let unit = kvhoard_format::UNIT_BYTES;
        let units = u32::try_from(block.div_ceil(unit) + 1).unwrap();
        let header = [0u8; 300];
        let mut seg = OpenSeg::new(0, 1);
        let mut n = 0;
        while seg.fits(units, header.len(), u32::try_from(segment / unit).unwrap()) {
            seg.reserve(units, &header);
            n += 1;
        }
        n
    }

    #[test]
    fn large_volumes_get_segments_that_32_mib_blocks_fill_seven_eighths() {
        assert_eq!(CreateOptions::default_segment_bytes(1 << 30), CreateOptions::SMALL_SEGMENT_BYTES);
        assert_eq!(CreateOptions::default_segment_bytes((32 << 30) - 1), CreateOptions::SMALL_SEGMENT_BYTES);
        assert_eq!(CreateOptions::default_segment_bytes(32 << 30), CreateOptions::LARGE_SEGMENT_BYTES);
        assert_eq!(CreateOptions::default().segment_size_bytes, CreateOptions::SMALL_SEGMENT_BYTES);
        // The reason: a record never spans segments.
        assert_eq!(records_per_segment(32 << 20, CreateOptions::SMALL_SEGMENT_BYTES), 1);
        assert_eq!(records_per_segment(32 << 20, CreateOptions::LARGE_SEGMENT_BYTES), 7);
        assert_eq!(records_per_segment(2 << 20, CreateOptions::SMALL_SEGMENT_BYTES), 31);
    }
}
