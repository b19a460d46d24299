//! An in-memory device for crash and fault-injection tests.
//!
//! It keeps two images: `written` (what reads see) and `durable` (what survives a crash). A
//! `sync` makes the written image durable. [`MemDevice::crash`] returns the device as it would be
//! after power loss: the durable image plus each unsynced write kept whole, dropped, or torn at a
//! 512-byte sector boundary, chosen by a seed. [`MemDevice::crash_at_mark`] returns it as a crash at
//! a chosen moment would, and [`MemDevice::cut_writes`] makes one that models buffered I/O,
//! where the write under way when the process is killed may leave a prefix.

use std::sync::Mutex;

use kvhoard_format::UNIT_BYTES;

use super::fault::{eio, FaultKind, Faults};
use super::{check_request, BlockDevice, Capabilities, DeviceError};

/// What happens to writes that were not synced when the device "crashes".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write reached the medium (a process crash).
    KeepAll,
    /// No unsynced write reached the medium.
    DropAll,
    /// Each unsynced write, chosen by the seed, is kept, dropped, or torn at a sector boundary.
    Random(u64),
}

#[derive(Debug, Default, Clone)]
struct Media {
    written: Vec<u8>,
    durable: Vec<u8>,
    /// (offset, len) of writes since the last sync, in order.
    unsynced: Vec<(u64, u64)>,
}

/// A moment chosen for [`MemDevice::crash_at_mark`]: a crash in the middle of an operation.
#[derive(Debug)]
enum Mark {
    /// The media are copied before the operation (write or sync) this many operations ahead.
    Armed(u64),
    /// The media as they were at that moment, and the write that was about to be made (offset
    /// and bytes), if the operation was a write.
    Taken(Box<Media>, Option<(u64, Vec<u8>)>),
}

#[derive(Debug, Default)]
struct State {
    media: Media,
    mark: Option<Mark>,
}

impl State {
    /// Counts a write (`Some((offset, bytes))`) or sync (`None`) about to change the media,
    /// copying them first if it is the marked one.
    fn count_operation(&mut self, write: Option<(u64, &[u8])>) {
        match self.mark {
            Some(Mark::Armed(0)) => {
                let write = write.map(|(offset, buf)| (offset, buf.to_vec()));
                self.mark = Some(Mark::Taken(Box::new(self.media.clone()), write));
            }
            Some(Mark::Armed(ref mut n)) => *n -= 1,
            _ => {}
        }
    }
}

/// An in-memory [`BlockDevice`] that can crash and fail on purpose.
#[derive(Debug)]
pub struct MemDevice {
    state: Mutex<State>,
    faults: Faults,
    capacity: u64,
    /// The simulated machine's boot: a power loss ([`CrashMode::DropAll`], [`CrashMode::Random`])
    /// starts a new one, a process crash ([`CrashMode::KeepAll`]) does not.
    boot: u64,
    /// [`Capabilities::whole_writes`]: false for a device made by [`MemDevice::cut_writes`].
    whole_writes: bool,
}

const SECTOR_BYTES: u64 = 512;

impl MemDevice {
    /// A zeroed device of `capacity` bytes.
    pub fn new(capacity: u64) -> MemDevice {
        Self::from_image(vec![0; capacity as usize])
    }

    /// A device holding `image`, all of it durable.
    pub fn from_image(image: Vec<u8>) -> MemDevice {
        let capacity = image.len() as u64;
        MemDevice {
            state: Mutex::new(State {
                media: Media { written: image.clone(), durable: image, unsynced: Vec::new() },
                mark: None,
            }),
            faults: Faults::default(),
            capacity,
            boot: 1,
            whole_writes: true,
        }
    }

    /// This device modelling buffered I/O: it reports that a write may not reach it whole when
    /// the process is killed, and [`MemDevice::crash_in_marked_write`] keeps a prefix of the
    /// write under way.
    pub fn cut_writes(mut self) -> MemDevice {
        self.whole_writes = false;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock can only come from a test assertion; the images are
        // still consistent byte arrays, so keep using them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the `n`-th next operation of `kind` fail with EIO (n = 1: the very next one).
    pub fn fail_nth(&self, kind: FaultKind, n: u64) {
        self.faults.arm(kind, n);
    }

    /// The image a crash right now would leave behind, as a new device.
    pub fn crash(&self, mode: CrashMode) -> MemDevice {
        let state = self.lock();
        self.crashed(&state.media, mode)
    }

    /// Marks the moment just before the write or sync `n` operations ahead (0: the next one), for
    /// [`MemDevice::crash_at_mark`]. The device goes on as before.
    pub fn mark_after(&self, n: u64) {
        self.lock().mark = Some(Mark::Armed(n));
    }

    /// The image a crash at the marked moment would have left behind (right now, if the device
    /// has not reached it), as a new device; the mark is cleared.
    pub fn crash_at_mark(&self, mode: CrashMode) -> MemDevice {
        self.crash_in_marked_write(mode, 0)
    }

    /// [`MemDevice::crash_at_mark`], with the process killed while the marked operation, if it
    /// is a write, had copied its first `units` units (fewer if it is shorter): on a device made
    /// by [`MemDevice::cut_writes`], that prefix is kept as a write that completed; on one that
    /// writes whole, nothing of it is.
    pub fn crash_in_marked_write(&self, mode: CrashMode, units: u64) -> MemDevice {
        let mut state = self.lock();
        match state.mark.take() {
            Some(Mark::Taken(mut media, write)) => {
                if let (false, Some((offset, bytes))) = (self.whole_writes, write) {
                    let kept = (units * UNIT_BYTES).min(bytes.len() as u64) as usize;
                    let range = offset as usize..offset as usize + kept;
                    if let (Some(dst), Some(src)) = (media.written.get_mut(range), bytes.get(..kept)) {
                        dst.copy_from_slice(src);
                        media.unsynced.push((offset, kept as u64));
                    }
                }
                self.crashed(&media, mode)
            }
            _ => self.crashed(&state.media, mode),
        }
    }

    fn crashed(&self, media: &Media, mode: CrashMode) -> MemDevice {
        let mut image = media.durable.clone();
        let mut rng = match mode {
            CrashMode::Random(seed) => seed | 1,
            _ => 1,
        };
        for &(offset, len) in &media.unsynced {
            let keep = match mode {
                CrashMode::KeepAll => len,
                CrashMode::DropAll => 0,
                CrashMode::Random(_) => match xorshift(&mut rng) % 3 {
                    0 => 0,
                    1 => len,
                    _ => (xorshift(&mut rng) % (len / SECTOR_BYTES + 1)) * SECTOR_BYTES,
                },
            };
            let (start, end) = (offset as usize, (offset + keep) as usize);
            if let (Some(dst), Some(src)) = (image.get_mut(start..end), media.written.get(start..end)) {
                dst.copy_from_slice(src);
            }
        }
        let mut crashed = MemDevice::from_image(image);
        crashed.whole_writes = self.whole_writes;
        crashed.boot = if mode == CrashMode::KeepAll { self.boot } else { self.boot + 1 };
        crashed
    }

    /// The bytes reads currently see.
    pub fn image(&self) -> Vec<u8> {
        self.lock().media.written.clone()
    }
}

/// The tear pattern of [`CrashMode::Random`]: pinned, not kvhoard's general generator
/// (`kvhoard_kernels::rng`), because recorded regression tests replay crashes by their seed and
/// must keep tearing the same writes the same way.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

impl BlockDevice for MemDevice {
    fn boot(&self) -> u64 {
        self.boot
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_request("read", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        let state = self.lock();
        if self.faults.take(FaultKind::Read) {
            return Err(eio("read", offset, buf.len() as u64));
        }
        let src = state.media.written.get(offset as usize..offset as usize + buf.len());
        buf.copy_from_slice(src.ok_or_else(|| eio("read", offset, buf.len() as u64))?);
        Ok(())
    }

    /// Memory never waits: written at once, counted and marked as any write.
    fn write_now(&self, buf: &[u8], offset: u64) -> Option<Result<(), DeviceError>> {
        Some(self.write_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_request("write", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        let mut state = self.lock();
        if self.faults.take(FaultKind::Write) {
            return Err(eio("write", offset, buf.len() as u64));
        }
        state.count_operation(Some((offset, buf)));
        let dst = state.media.written.get_mut(offset as usize..offset as usize + buf.len());
        dst.ok_or_else(|| eio("write", offset, buf.len() as u64))?.copy_from_slice(buf);
        state.media.unsynced.push((offset, buf.len() as u64));
        Ok(())
    }

    fn sync(&self) -> Result<(), DeviceError> {
        let mut state = self.lock();
        if self.faults.take(FaultKind::Sync) {
            // Like a failed fsync: what was unsynced stays unsynced and may be lost.
            return Err(eio("sync", 0, 0));
        }
        state.count_operation(None);
        let Media { written, durable, unsynced } = &mut state.media;
        for &(offset, len) in unsynced.iter() {
            let range = offset as usize..(offset + len) as usize;
            if let (Some(dst), Some(src)) = (durable.get_mut(range.clone()), written.get(range)) {
                dst.copy_from_slice(src);
            }
        }
        unsynced.clear();
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { backend: "memory", direct_io: false, whole_writes: self.whole_writes, alignment: UNIT_BYTES }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::buffer::AlignedBuf;

    #[test]
    fn passes_the_conformance_suite() {
        crate::device::conformance::run(&MemDevice::new(1 << 20));
    }

    #[test]
    fn crash_drops_unsynced_and_keeps_synced_writes() {
        let dev = MemDevice::new(1 << 16);
        let mut a = AlignedBuf::zeroed(4096);
        a.fill(1);
        dev.write_at(&a, 0).unwrap();
        dev.sync().unwrap();
        a.fill(2);
        dev.write_at(&a, 4096).unwrap();
        let after = dev.crash(CrashMode::DropAll).image();
        assert!(after[..4096].iter().all(|&b| b == 1));
        assert!(after[4096..8192].iter().all(|&b| b == 0));
        let kept = dev.crash(CrashMode::KeepAll).image();
        assert!(kept[4096..8192].iter().all(|&b| b == 2));
    }

    #[test]
    fn injected_faults_fire_once_at_the_chosen_operation() {
        let dev = MemDevice::new(1 << 16);
        let buf = AlignedBuf::zeroed(4096);
        dev.fail_nth(FaultKind::Write, 2);
        dev.write_at(&buf, 0).unwrap();
        assert!(dev.write_at(&buf, 0).is_err());
        dev.write_at(&buf, 0).unwrap();
        dev.fail_nth(FaultKind::Sync, 1);
        assert!(dev.sync().is_err());
        dev.sync().unwrap();
    }

    #[test]
    fn a_crash_at_the_mark_leaves_the_media_as_they_were_before_the_marked_operation() {
        let dev = MemDevice::new(1 << 16);
        let mut a = AlignedBuf::zeroed(4096);
        dev.mark_after(2);
        for fill in 1..=4u8 {
            a.fill(fill);
            dev.write_at(&a, u64::from(fill) * 4096).unwrap();
        }
        dev.sync().unwrap();
        let kept = dev.crash_at_mark(CrashMode::KeepAll).image();
        assert!(kept[4096..8192].iter().all(|&b| b == 1));
        assert!(kept[8192..12288].iter().all(|&b| b == 2));
        assert!(kept[12288..16384].iter().all(|&b| b == 0), "the marked write is not in the image");
        assert!(dev.crash_at_mark(CrashMode::DropAll).image()[16384..20480].iter().all(|&b| b == 4), "no mark: now");
        dev.mark_after(0);
        dev.sync().unwrap();
        assert!(dev.crash_at_mark(CrashMode::DropAll).image()[4096..8192].iter().all(|&b| b == 1));
    }

    #[test]
    fn a_crash_in_the_marked_write_keeps_its_prefix_only_where_writes_can_be_cut() {
        for cut in [false, true] {
            let dev = if cut { MemDevice::new(1 << 16).cut_writes() } else { MemDevice::new(1 << 16) };
            assert_eq!(dev.capabilities().whole_writes, !cut);
            let mut a = AlignedBuf::zeroed(4 * 4096);
            a.fill(7);
            dev.mark_after(0);
            dev.write_at(&a, 4096).unwrap();
            let image = dev.crash_in_marked_write(CrashMode::KeepAll, 3).image();
            let kept = if cut { 3 * 4096 } else { 0 };
            assert!(image[4096..4096 + kept].iter().all(|&b| b == 7), "cut {cut}");
            assert!(image[4096 + kept..5 * 4096].iter().all(|&b| b == 0), "cut {cut}");
            // A power loss may still drop what was kept of it: it was never synced.
            dev.mark_after(0);
            dev.write_at(&a, 4096).unwrap();
            let dropped = dev.crash_in_marked_write(CrashMode::DropAll, 3).image();
            assert!(dropped[4096..5 * 4096].iter().all(|&b| b == 0), "cut {cut}");
        }
    }
}
