//! `kvhoard bench --compare-disk`: the disk's own speed, measured by fio on the same directory
//! just before and just after the engine's run, so that a user reads the engine against the
//! disk in one command. The jobs are those of the project's disk baseline: one job, io_uring,
//! queue depth 32, O_DIRECT, requests of the benchmark's block size, as many bytes as the
//! benchmark moves; reads are random when the benchmark's gets are.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context as _};

/// fio's queue depth: what a deep-queue engine is compared against.
pub const IODEPTH: u32 = 32;

/// One fio measurement of the disk, MB/s (10^6 bytes per second).
#[derive(Debug, Clone, Copy)]
pub struct Disk {
    /// Writes without a flush: how fast the disk (and any volatile cache in front of it) takes
    /// writes; what acknowledged puts are compared with.
    pub write_mbps: f64,
    /// The same writes with one fdatasync at the end, counted in the time: the disk's durable
    /// write rate, what puts including their final sync are compared with.
    pub write_synced_mbps: f64,
    pub read_mbps: f64,
}

/// Fails with what to do when fio is not installed.
pub fn check_fio() -> anyhow::Result<()> {
    match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => bail!("--compare-disk runs fio, which is not installed here (Debian/Ubuntu: apt-get install fio)"),
    }
}

/// fio's write and then read job on a scratch file in `dir`, removed afterwards.
pub fn measure(dir: &Path, block: u64, total: u64, random: bool, direct: bool) -> anyhow::Result<Disk> {
    let file = dir.join(".kvhoard-disk-baseline");
    let result = (|| {
        let write_mbps = job(&file, "write", block, total, direct, false)?;
        let write_synced_mbps = job(&file, "write", block, total, direct, true)?;
        let read_mbps = job(&file, if random { "randread" } else { "read" }, block, total, direct, false)?;
        Ok(Disk { write_mbps, write_synced_mbps, read_mbps })
    })();
    let _ = std::fs::remove_file(&file);
    result
}

/// Runs one fio job (`synced`: with a final fdatasync in its time); its bandwidth in MB/s.
fn job(file: &Path, rw: &str, block: u64, total: u64, direct: bool, synced: bool) -> anyhow::Result<f64> {
    // Whole requests only: fio refuses a size that is not a multiple of the block size.
    let size = (total / block).max(1) * block;
    let out = Command::new("fio")
        .arg("--name=kvhoard-disk")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--size={size}"))
        .arg(format!("--bs={block}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--direct={}", u8::from(direct)))
        .arg("--ioengine=io_uring")
        .arg(format!("--iodepth={IODEPTH}"))
        .arg(format!("--end_fsync={}", u8::from(synced)))
        .args(["--numjobs=1", "--output-format=json"])
        .output()
        .context("cannot run fio")?;
    if !out.status.success() {
        bail!("fio's {rw} job failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    bandwidth(&out.stdout, rw)
}

/// The bandwidth of fio's JSON report, MB/s.
fn bandwidth(json: &[u8], rw: &str) -> anyhow::Result<f64> {
    let report: serde_json::Value = serde_json::from_slice(json).context("fio's report is not JSON")?;
    let side = if rw.contains("read") { "read" } else { "write" };
    let bytes = report
        .get("jobs")
        .and_then(|j| j.get(0))
        .and_then(|j| j.get(side))
        .and_then(|s| s.get("bw_bytes"))
        .and_then(serde_json::Value::as_f64)
        .with_context(|| format!("fio's report has no {side} bandwidth"))?;
    Ok(bytes / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bandwidth_of_a_fio_report() {
        let report = br#"{"jobs": [{"read": {"bw_bytes": 2000000000}, "write": {"bw_bytes": 1500000000}}]}"#;
        assert!((bandwidth(report, "write").unwrap() - 1500.0).abs() < 1e-9);
        assert!((bandwidth(report, "randread").unwrap() - 2000.0).abs() < 1e-9);
        assert!(bandwidth(b"{}", "read").is_err());
        assert!(bandwidth(b"not json", "read").is_err());
    }
}
